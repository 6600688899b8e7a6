// Prefetch and advice through the public API: after posix_fadvise(DONTNEED) a file is not cached
// (mincore); after prefetching some of its tensors (or a checkpoint's), their pages are
// resident and the rest mostly is not; progress adds up; errors (a file gone, a request that
// does not fit) are typed, and the nothrow twins agree with the throwing faces.
#include <safetensors/prefetch.hpp>
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "support.hpp"

namespace nt = safetensors::nothrow;
using safetensors::Advice;
using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::Prefetch;
using safetensors::Request;
using safetensors::SafeOpen;
using safetensors::TensorView;

static_assert(!std::is_copy_constructible_v<Prefetch>);

namespace {

constexpr std::size_t kMiB = 1 << 20;

/// Six U8 tensors t0..t5 of 4 MiB, in this order; written and synced to the disk.
void write_sample(const std::filesystem::path& path) {
  std::vector<std::vector<std::uint8_t>> datas;
  std::vector<std::pair<std::string, TensorView>> tensors;
  datas.reserve(6);
  for (int t = 0; t < 6; ++t) {
    auto& d = datas.emplace_back(4 * kMiB, static_cast<std::uint8_t>(t + 1));
    tensors.emplace_back("t" + std::to_string(t),
                         TensorView{Dtype::U8, {d.size()}, std::as_bytes(std::span(d)), {}});
  }
  safetensors::save_file(path, tensors);
}

/// Drops `path` from the page cache, as far as the kernel agrees.
void evict(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// Per page of `path`, whether it is in the page cache (mincore on a fresh mapping, which does
/// not fault pages in).
std::vector<bool> resident(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  auto len = static_cast<std::size_t>(std::filesystem::file_size(path));
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  EXPECT_NE(p, MAP_FAILED);
  auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((len + page - 1) / page);
  EXPECT_EQ(::mincore(p, len, v.data()), 0);
  ::munmap(p, len);
  std::vector<bool> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = (v[i] & 1) != 0;
  return out;
}

/// Fraction of the whole pages of file bytes `[begin, end)` that are resident.
double fraction(const std::vector<bool>& res, std::size_t begin, std::size_t end) {
  const std::size_t page = 4096, first = (begin + page - 1) / page, last = end / page;
  std::size_t n = 0;
  for (std::size_t i = first; i < last; ++i) n += res[i];
  return static_cast<double>(n) / static_cast<double>(last - first);
}

/// Where tensor `name` lies in the file, as file offsets.
std::pair<std::size_t, std::size_t> in_file(const SafeOpen& f, const std::string& name) {
  auto [b, e] = f.info(name).data_offsets;
  return {f.data_offset() + b, f.data_offset() + e};
}

/// Whether this kernel drops the file from the cache when asked (it may not, on tmpfs or an
/// overlay): the residency tests are skipped, saying so, where it does not.
bool evictable(const std::filesystem::path& path) {
  evict(path);
  for (bool r : resident(path))
    if (r) return false;
  return true;
}

TEST(Prefetch, PutsARequestPlanInThePageCacheAndLittleElse) {
  test::TempDir dir;
  auto path = dir / "p.safetensors";
  write_sample(path);
  if (!evictable(path)) GTEST_SKIP() << "the kernel keeps " << path << " cached after POSIX_FADV_DONTNEED";
  for (auto backend : {Backend::Mmap, Backend::Read, Backend::Direct}) {
    evict(path);
    SafeOpen f(path, {backend});
    // t1 and t4 whole, and the first half of t3 through a selection.
    std::vector<Request> want{{"t1"}, {"t4"}, {"t3", {Index::range(0, static_cast<std::int64_t>(2 * kMiB))}}};
    auto p = safetensors::prefetch(f, want, {.threads = 3, .request_bytes = kMiB});
    EXPECT_EQ(p.total_bytes(), 10 * kMiB);
    p.wait();
    EXPECT_EQ(p.bytes_done(), p.total_bytes());
    auto res = resident(path);
    for (const char* name : {"t1", "t4"}) {
      auto [b, e] = in_file(f, name);
      EXPECT_EQ(fraction(res, b, e), 1.0) << name;
    }
    auto [b3, e3] = in_file(f, "t3");
    EXPECT_EQ(fraction(res, b3, b3 + 2 * kMiB), 1.0) << "t3's selection";
    // Outside the plan, only what readahead drags in (well under half).
    for (const char* name : {"t0", "t5"}) {
      auto [b, e] = in_file(f, name);
      EXPECT_LT(fraction(res, b, e), 0.5) << name;
    }
    EXPECT_LT(fraction(res, b3 + 3 * kMiB, e3), 0.5);
    EXPECT_EQ(f.bytes_read(), 0u) << "a prefetch reads through its own descriptors";
  }
}

TEST(Prefetch, WarmsEveryShardOfACheckpointOrOnlyTheRequestedOnes) {
  test::TempDir dir;
  std::string map;
  for (int k = 0; k < 3; ++k) {
    auto shard = dir / ("part-" + std::to_string(k) + ".safetensors");
    std::vector<std::uint8_t> d(3 * kMiB, static_cast<std::uint8_t>(k));
    safetensors::save_file(shard, {{"w" + std::to_string(k),
                                    TensorView{Dtype::U8, {d.size()}, std::as_bytes(std::span(d)), {}}}});
    map += std::string(k ? "," : "") + "\"w" + std::to_string(k) + "\":\"" + shard.filename().string() + "\"";
  }
  auto index = dir / "model.safetensors.index.json";
  std::ofstream(index) << R"({"weight_map":{)" << map << "}}";
  bool can = true;
  for (int k = 0; k < 3; ++k) can = can && evictable(dir / ("part-" + std::to_string(k) + ".safetensors"));
  if (!can) GTEST_SKIP() << "the kernel keeps the shards cached after POSIX_FADV_DONTNEED";
  auto shard_fraction = [&](int k) {
    auto path = dir / ("part-" + std::to_string(k) + ".safetensors");
    SafeOpen f(path);
    auto [b, e] = in_file(f, "w" + std::to_string(k));
    return fraction(resident(path), b, e);
  };
  {
    Checkpoint ckpt(index);
    std::vector<Request> want{{"w2"}};
    auto p = safetensors::prefetch(ckpt, want);
    EXPECT_EQ(p.total_bytes(), 3 * kMiB);
    p.wait();
    EXPECT_EQ(shard_fraction(2), 1.0);
    EXPECT_LT(shard_fraction(0), 0.5);
    EXPECT_LT(shard_fraction(1), 0.5);
  }
  Checkpoint ckpt(index, {Backend::Direct});
  auto p = safetensors::prefetch(ckpt);
  EXPECT_EQ(p.total_bytes(), 9 * kMiB);
  p.wait();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(shard_fraction(k), 1.0) << k;
}

TEST(Prefetch, APythonWrittenCheckpointIsCoveredWhole) {
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  Checkpoint ckpt(*dir / "model.safetensors.index.json");
  auto p = safetensors::prefetch(ckpt, {}, {.threads = 2});
  p.wait();
  std::uint64_t total = 0;
  for (const auto& name : ckpt.keys()) total += ckpt.info(name).byte_size();
  EXPECT_EQ(p.total_bytes(), total);
  EXPECT_EQ(p.bytes_done(), total);
}

TEST(Prefetch, AFileGoneIsIoFromWaitEveryTimeAndFromEveryThread) {
  test::TempDir dir;
  auto path = dir / "gone.safetensors";
  write_sample(path);
  SafeOpen f(path, {Backend::Read});
  std::filesystem::remove(path);
  auto p = safetensors::prefetch(f);
  std::vector<std::thread> waiters;
  std::atomic<int> io{0};
  for (int i = 0; i < 3; ++i) waiters.emplace_back([&] { io += nt::wait(p).kind() == ErrorKind::Io; });
  for (auto& t : waiters) t.join();
  EXPECT_EQ(io.load(), 3);
  auto again = nt::wait(p);
  EXPECT_EQ(again.kind(), ErrorKind::Io);
  EXPECT_NE(again.message().find("gone.safetensors"), std::string::npos) << again.message();
  EXPECT_EQ(test::kind_of([&] { p.wait(); }), ErrorKind::Io);
}

TEST(Prefetch, DestroyingItEarlyCancelsAndReturns) {
  test::TempDir dir;
  auto path = dir / "p.safetensors";
  write_sample(path);
  SafeOpen f(path);
  auto start = std::chrono::steady_clock::now();
  { auto p = safetensors::prefetch(f, {}, {.threads = 1, .request_bytes = 64 << 10}); }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Prefetch, AFileInMemoryHasNothingToWarm) {
  auto bytes = test::raw_file(R"({"a":{"dtype":"U8","shape":[100],"data_offsets":[0,100]}})", 100);
  auto f = SafeOpen::from_bytes_copy(std::as_bytes(std::span(bytes)));
  auto p = safetensors::prefetch(f);
  EXPECT_EQ(p.total_bytes(), 0u);
  p.wait();
}

TEST(Advise, HintsTheMappingAndIsANoOpWithoutOne) {
  test::TempDir dir;
  auto path = dir / "p.safetensors";
  write_sample(path);
  for (auto backend : {Backend::Mmap, Backend::Read, Backend::Direct}) {
    SafeOpen f(path, {backend});
    for (auto advice : {Advice::WillNeed, Advice::Sequential, Advice::Random}) {
      safetensors::advise(f, advice);
      safetensors::advise(f, advice, std::vector<Request>{{"t2", {Index::range(1, 100)}}});
    }
    EXPECT_EQ(test::kind_of([&] { safetensors::advise(f, Advice::Random, std::vector<Request>{{"nope"}}); }),
              ErrorKind::TensorNotFound);
  }
}

TEST(Prefetch, AStridedSelectionIsWarmedAndAdvisedInMemoryInProportionToItsPages) {
  if (!test::address_space_limits_work)
    GTEST_SKIP() << "the sanitizers cannot run under an address-space limit";
  test::TempDir dir;
  const std::size_t n = 16 * kMiB;
  auto path = dir / "wide.safetensors";
  test::write_bytes(
      path, test::raw_file(R"({"t":{"dtype":"U8","shape":[16777216],"data_offsets":[0,16777216]}})", n));
  // Every other byte: 8 Mi one-byte runs, which a plan used to hold one by one (+470 MB for a
  // prefetch, +400 MB for advice, an abort under the limit below). The pages they touch are one
  // range, and its one-byte gaps are warmed with it.
  const std::vector<Request> every_other{{"t", {Index::range(0, static_cast<std::int64_t>(n), 2)}}};
  const int warmed = test::with_address_space(std::uint64_t{256} << 20, [&] {
    SafeOpen f(path);
    auto warming = safetensors::prefetch(f, every_other, {.threads = 1});
    warming.wait();
    return warming.total_bytes() == n - 1 && warming.bytes_done() == n - 1 ? 0 : 1;
  });
  EXPECT_TRUE(WIFEXITED(warmed) && WEXITSTATUS(warmed) == 0) << "prefetch " << test::describe_status(warmed);
  const int advised = test::with_address_space(std::uint64_t{256} << 20, [&] {
    safetensors::advise(SafeOpen(path), Advice::WillNeed, every_other);
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(advised) && WEXITSTATUS(advised) == 0) << "advise " << test::describe_status(advised);
}

TEST(Prefetch, NothrowTwinsAgreeWithTheThrowingFaces) {
  test::TempDir dir;
  auto path = dir / "p.safetensors";
  write_sample(path);
  SafeOpen f(path);
  std::vector<std::vector<Request>> cases{
      {{"nope"}}, {{"t1", {Index::range(0, 5 * kMiB)}}}, {{"t1", {SIZE_MAX}}}};
  for (const auto& want : cases) {
    auto quiet = nt::prefetch(f, want);
    ASSERT_FALSE(quiet);
    test::expect_same(quiet.status(), test::thrown([&] { (void)safetensors::prefetch(f, want); }));
    test::expect_same(nt::advise(f, Advice::WillNeed, want),
                      test::thrown([&] { safetensors::advise(f, Advice::WillNeed, want); }));
  }
  test::TempDir shards;
  std::ofstream(shards / "model.safetensors.index.json") << R"({"weight_map":{"a":"a.safetensors"}})";
  std::vector<std::uint8_t> one{1};
  safetensors::save_file(shards / "a.safetensors",
                         {{"a", TensorView{Dtype::U8, {1}, std::as_bytes(std::span(one)), {}}}});
  Checkpoint ckpt(shards / "model.safetensors.index.json");
  std::vector<Request> wrong{{"a", {}, 3}};
  test::expect_same(nt::prefetch(ckpt, wrong).status(),
                    test::thrown([&] { (void)safetensors::prefetch(ckpt, wrong); }));
  auto ok = nt::prefetch(ckpt);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(nt::wait(*ok).ok());
  Prefetch moved = std::move(*ok);
  test::expect_same(nt::wait(*ok), test::thrown([&] { ok->wait(); }));
  EXPECT_EQ(nt::wait(*ok).kind(), ErrorKind::Internal);
  EXPECT_EQ(test::kind_of([&] { (void)ok->bytes_done(); }), ErrorKind::Internal);
  EXPECT_EQ(moved.bytes_done(), 1u);
  // A moved-from SafeOpen is Internal too.
  SafeOpen g(path);
  SafeOpen h = std::move(g);
  test::expect_same(nt::prefetch(g).status(), test::thrown([&] { (void)safetensors::prefetch(g); }));
  EXPECT_EQ(nt::advise(g, Advice::Random).kind(), ErrorKind::Internal);
}

}  // namespace
