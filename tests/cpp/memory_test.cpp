// Host memory: loads into one allocation (`load`, `LoadedTensors`), the mapping controls of
// `OpenOptions` (populate, huge pages), and the residency of a file's pages (`lock_pages`,
// `unlock_pages`, `release_pages`), read back from the kernel (/proc/self/smaps, mincore,
// VmLck), with the careless calls: names not found, locks refused by RLIMIT_MEMLOCK, releases of
// locked pages and of a caller's bytes, reads after a release.
#include <safetensors/memory.hpp>
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::LoadedTensors;
using safetensors::OpenOptions;
using safetensors::Populate;
using safetensors::Request;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr Backend kBackends[] = {Backend::Mmap, Backend::Read, Backend::Direct};

/// What /proc/self/smaps says of the mapping holding an address.
struct Vma {
  std::uint64_t rss = 0;
  std::uint64_t locked = 0;
  std::string flags;
};

std::optional<Vma> vma_of(const void* address) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  Vma vma;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0;
    std::uintptr_t hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      if (inside) return vma;
      inside = lo <= at && at < hi;
      continue;
    }
    if (!inside) continue;
    auto kib = [&] { return std::stoull(line.substr(line.find(':') + 1)) * 1024; };
    if (line.rfind("Rss:", 0) == 0) vma.rss = kib();
    if (line.rfind("Locked:", 0) == 0) vma.locked = kib();
    if (line.rfind("VmFlags:", 0) == 0) vma.flags = line.substr(8) + " ";
  }
  return inside ? std::optional<Vma>(vma) : std::nullopt;
}

/// Bytes of `path` in the page cache (mincore on a fresh mapping).
std::size_t cached_bytes(const std::filesystem::path& path) {
  SafeOpen probe(path);
  auto data = probe.get_tensor("a").data;
  const std::size_t page = 4096;
  auto base = reinterpret_cast<std::uintptr_t>(data.data());
  auto start = base - base % page;
  std::size_t len = base + data.size() - start;
  std::vector<unsigned char> v((len + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(start), len, v.data()), 0);
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; })) *
         page;
}

/// `a`: `len` bytes of a pattern; `b`: 4 KiB of 9s. Synced, so that its cached pages are clean.
std::vector<std::uint8_t> write_sample(const std::filesystem::path& path, std::size_t len) {
  std::vector<std::uint8_t> a(len);
  for (std::size_t i = 0; i < len; ++i) a[i] = static_cast<std::uint8_t>(i * 7 % 251);
  std::vector<std::uint8_t> b(4096, 9);
  safetensors::save_file(path, {{"a", TensorView{Dtype::U8, {len}, std::as_bytes(std::span(a))}},
                                {"b", TensorView{Dtype::U8, {4096}, std::as_bytes(std::span(b))}}});
  int fd = ::open(path.c_str(), O_RDONLY);
  ::fsync(fd);
  ::close(fd);
  return a;
}

std::vector<std::uint8_t> bytes_of(const TensorView& v) {
  auto p = reinterpret_cast<const std::uint8_t*>(v.data.data());
  return {p, p + v.data.size()};
}

// Volatile reads: an optimising build would otherwise drop a sum nobody uses, touching nothing.
std::uint64_t touch(std::span<const std::byte> data) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < data.size(); i += 4096)
    sum += static_cast<std::uint8_t>(*static_cast<const volatile std::byte*>(&data[i]));
  return sum;
}

// ---- load ------------------------------------------------------------------------------------

TEST(Load, EveryTensorLandsAlignedInOneAllocationInKeysOrder) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 1000);
  for (Backend backend : kBackends) {
    SafeOpen f(dir / "m.safetensors", {.backend = backend});
    LoadedTensors w = safetensors::load(f);
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w.keys(), f.keys());
    EXPECT_EQ(bytes_of(w.get_tensor("a")), a);
    EXPECT_EQ(bytes_of(w.get_tensor("b")), std::vector<std::uint8_t>(4096, 9));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w.bytes().data()) % safetensors::load_alignment, 0u);
    std::size_t covered = 0;
    for (const auto& [name, view] : w) {
      auto info = w.info(name);
      EXPECT_EQ(info.data_offsets.first % safetensors::load_alignment, 0u) << name;
      EXPECT_EQ(view.data.data(), w.bytes().data() + info.data_offsets.first) << name;
      EXPECT_EQ(info.shape, f.info(name).shape);
      covered += info.byte_size();
    }
    // The padding between tensors is zero.
    auto all = w.bytes();
    std::size_t nonzero_padding = 0;
    const auto pa = w.info("a").data_offsets;
    const auto pb = w.info("b").data_offsets;
    for (std::size_t i = 0; i < all.size(); ++i) {
      bool in_a = i >= pa.first && i < pa.second;
      bool in_b = i >= pb.first && i < pb.second;
      if (!in_a && !in_b && all[i] != std::byte{0}) ++nonzero_padding;
    }
    EXPECT_EQ(nonzero_padding, 0u);
    EXPECT_EQ(covered, 1000u + 4096u);
  }
}

TEST(Load, ViewsOutliveTheLoadAndTheFileAndSeeWrites) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 100);
  TensorView kept;
  {
    std::optional<SafeOpen> f(std::in_place, dir / "m.safetensors");
    LoadedTensors w = safetensors::load(*f);
    f.reset();
    kept = w.get_tensor("a");
    w.mutable_bytes()[w.info("a").data_offsets.first] = std::byte{0x42};
  }
  EXPECT_EQ(kept.data[0], std::byte{0x42}) << "the program's bytes, shared by the views";
  EXPECT_EQ(bytes_of(kept).size(), a.size());
}

TEST(Load, RequestsAndSelectionsLoadOnlyWhatTheyAskInTheirOrder) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 64);
  SafeOpen f(dir / "m.safetensors");
  std::vector<Request> want{{"b", {safetensors::Index::range(4, 8)}}, {"a"}};
  LoadedTensors w = safetensors::load(f, want);
  EXPECT_EQ(w.keys(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(w.info("b").shape, (std::vector<std::size_t>{4}));
  EXPECT_EQ(w.info("b").data_offsets.first, 0u);
  EXPECT_EQ(w.info("a").data_offsets.first, safetensors::load_alignment);
  EXPECT_EQ(bytes_of(w.get_tensor("b")), std::vector<std::uint8_t>(4, 9));
  EXPECT_EQ(bytes_of(w.get_tensor("a")), a);
  EXPECT_EQ(w.bytes().size(), safetensors::load_alignment + 64);
}

TEST(Load, ACheckpointLoadsFromEveryShard) {
  test::TempDir dir;
  std::vector<std::uint8_t> one(4, 1), two(4, 2);
  safetensors::save_file(dir / "a.safetensors",
                         {{"p", TensorView{Dtype::U8, {4}, std::as_bytes(std::span(one))}}});
  safetensors::save_file(dir / "b.safetensors",
                         {{"q", TensorView{Dtype::U8, {4}, std::as_bytes(std::span(two))}}});
  std::ofstream(dir / "i.safetensors.index.json")
      << R"({"weight_map":{"p":"a.safetensors","q":"b.safetensors"}})";
  Checkpoint ckpt(dir / "i.safetensors.index.json");
  LoadedTensors w = safetensors::load(ckpt);
  EXPECT_EQ(bytes_of(w.get_tensor("p")), one);
  EXPECT_EQ(bytes_of(w.get_tensor("q")), two);
}

TEST(Load, CarelessCallsAreTypedErrors) {
  test::TempDir dir;
  write_sample(dir / "m.safetensors", 64);
  SafeOpen f(dir / "m.safetensors");
  auto st = test::thrown([&] { (void)safetensors::load(f, {{"nope"}}); });
  EXPECT_EQ(st.kind(), ErrorKind::TensorNotFound) << st.message();
  test::expect_same(safetensors::nothrow::load(f, {{"nope"}}).status(), st);
  EXPECT_EQ(test::kind_of([&] {
              (void)safetensors::load(f, {{"a", {safetensors::Index::range(0, 65)}}});
            }),
            ErrorKind::InvalidSlice);
  LoadedTensors w = safetensors::load(f, {{"a"}});
  EXPECT_EQ(test::kind_of([&] { (void)w.get_tensor("b"); }), ErrorKind::TensorNotFound);
  EXPECT_EQ(safetensors::nothrow::info(w, "b").status().kind(), ErrorKind::TensorNotFound);
  LoadedTensors empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_TRUE(empty.bytes().empty());
  EXPECT_TRUE(empty.begin() == std::default_sentinel);
  EXPECT_EQ(test::kind_of([&] { (void)empty.get_tensor("a"); }), ErrorKind::TensorNotFound);
  SafeOpen g = std::move(f);
  EXPECT_EQ(test::kind_of([&] { (void)safetensors::load(f); }), ErrorKind::Internal);  // NOLINT: moved
  EXPECT_EQ(safetensors::load(g, {}).size(), 2u);
  EXPECT_EQ(safetensors::load(g, std::vector<Request>{}).size(), 0u) << "an empty list loads nothing";
}

// ---- mapping controls --------------------------------------------------------------------------

TEST(MappingControls, PopulateAtOpenMapsEveryPageBeforeTheOpenReturns) {
  test::TempDir dir;
  write_sample(dir / "m.safetensors", 8 * kMiB);
  SafeOpen lazy(dir / "m.safetensors");
  EXPECT_LT(vma_of(lazy.get_tensor("a").data.data())->rss, kMiB);
  SafeOpen eager(dir / "m.safetensors", {.populate = Populate::AtOpen});
  EXPECT_GE(vma_of(eager.get_tensor("a").data.data())->rss, 8 * kMiB);
}

TEST(MappingControls, BackgroundPopulationFillsTheMappingWhileTheProgramGoesOn) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 8 * kMiB);
  SafeOpen f(dir / "m.safetensors", {.populate = Populate::Background});
  TensorView v = f.get_tensor("a");
  const auto start = std::chrono::steady_clock::now();
  while (vma_of(v.data.data())->rss < 8 * kMiB) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60))
        << "not populated in a minute";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(bytes_of(v), a);
}

TEST(MappingControls, HugePagesAreAdvisedOnTheMapping) {
  test::TempDir dir;
  write_sample(dir / "m.safetensors", 4 * kMiB);
  SafeOpen plain(dir / "m.safetensors");
  EXPECT_EQ(vma_of(plain.get_tensor("a").data.data())->flags.find(" hg "), std::string::npos);
  SafeOpen huge(dir / "m.safetensors", {.huge_pages = true});
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) GTEST_SKIP() << "no THP here";
  EXPECT_NE(vma_of(huge.get_tensor("a").data.data())->flags.find(" hg "), std::string::npos);
  Checkpoint ckpt(dir / "m.safetensors", {.populate = Populate::AtOpen, .huge_pages = true});
  TensorView c = ckpt.get_tensor("a");
  EXPECT_NE(vma_of(c.data.data())->flags.find(" hg "), std::string::npos);
  EXPECT_GE(vma_of(c.data.data())->rss, 4 * kMiB) << "each shard populated at its open";
}

/// Decided: the controls are about a mapping, so without one (read and direct backends, bytes
/// in memory) they are ignored, as `advise` is; a program may switch backends with one flag.
TEST(MappingControls, AreIgnoredWithoutAMapping) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", kMiB);
  for (Backend backend : {Backend::Read, Backend::Direct}) {
    for (Populate p : {Populate::AtOpen, Populate::Background}) {
      SafeOpen f(dir / "m.safetensors", {.backend = backend, .populate = p, .huge_pages = true});
      EXPECT_EQ(bytes_of(f.get_tensor("a")), a);
      EXPECT_EQ(f.backend(), backend);
    }
  }
  auto bytes = test::read_bytes(dir / "m.safetensors");
  auto g = SafeOpen::from_bytes_copy(std::as_bytes(std::span(bytes)), {.populate = Populate::Background});
  EXPECT_EQ(bytes_of(g.get_tensor("a")), a);
  // A value of no enumerator (a static_cast of any byte) is refused, never guessed.
  auto bad = safetensors::nothrow::open(dir / "m.safetensors", {.populate = static_cast<Populate>(7)});
  EXPECT_EQ(bad.status().kind(), ErrorKind::InvalidSlice);
  EXPECT_NE(bad.status().message().find("populate value 7"), std::string::npos) << bad.status().message();
}

// ---- residency ---------------------------------------------------------------------------------

std::uint64_t locked_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

/// Why `mlock` locks nothing in this process, if it does not: the sanitizers' runtimes
/// (AddressSanitizer, ThreadSanitizer) intercept it and return success without locking, so
/// VmLck, which the lock tests read, never moves. Probed with one page of our own.
std::optional<std::string> mlock_ignored() {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return std::nullopt;
  static_cast<volatile char*>(p)[0] = 1;
  const auto before = locked_kib();
  const bool locked = ::mlock(p, page) == 0;
  const auto after = locked_kib();
  if (locked) ::munlock(p, page);
  ::munmap(p, page);
  if (locked && after == before)
    return "mlock succeeds here without locking (a sanitizer's runtime intercepts it): VmLck cannot show a "
           "lock";
  return std::nullopt;
}

TEST(Residency, LockedPagesStayLockedUntilUnlocked) {
  if (auto why = mlock_ignored()) GTEST_SKIP() << *why;
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", kMiB);
  SafeOpen f(dir / "m.safetensors");
  const auto before = locked_kib();
  safetensors::lock_pages(f, {{"a"}});
  const auto during = locked_kib() - before;
  EXPECT_GE(during, 1024u);
  EXPECT_LE(during, 1024u + 8u) << "the tensor's pages, and at most one more at each end";
  EXPECT_EQ(bytes_of(f.get_tensor("a")), a);
  safetensors::unlock_pages(f, {{"a"}});
  EXPECT_EQ(locked_kib(), before);
  EXPECT_EQ(test::kind_of([&] { safetensors::lock_pages(f, {{"nope"}}); }), ErrorKind::TensorNotFound);
}

TEST(Residency, ReleaseDropsThePagesAndLaterReadsAreStillRight) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 8 * kMiB);
  SafeOpen f(dir / "m.safetensors");
  TensorView v = f.get_tensor("a");
  touch(v.data);
  EXPECT_GE(vma_of(v.data.data())->rss, 8 * kMiB);
  EXPECT_GE(cached_bytes(dir / "m.safetensors"), 8 * kMiB);
  safetensors::release_pages(f);
  EXPECT_LT(vma_of(v.data.data())->rss, 64 * 1024u);
  EXPECT_LT(cached_bytes(dir / "m.safetensors"), kMiB);
  EXPECT_EQ(bytes_of(v), a) << "the same view, read again from the disk";
  EXPECT_EQ(bytes_of(f.get_tensor("b")), std::vector<std::uint8_t>(4096, 9));
}

TEST(Residency, ReleaseAfterALoadKeepsOnlyTheProgramsCopy) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 8 * kMiB);
  for (Backend backend : kBackends) {
    Checkpoint ckpt(dir / "m.safetensors", {.backend = backend});
    LoadedTensors w = safetensors::load(ckpt);
    safetensors::release_pages(ckpt);
    EXPECT_LT(cached_bytes(dir / "m.safetensors"), kMiB) << static_cast<int>(backend);
    EXPECT_EQ(bytes_of(w.get_tensor("a")), a);
    EXPECT_EQ(bytes_of(ckpt.get_tensor("a")), a);
  }
}

/// A new version of `path` published by an atomic rename, as writers publish (`a`: `len`
/// bytes of 0x5A), cached; a program holding the old file open must be able to release it.
void publish_over(const std::filesystem::path& path, std::size_t len) {
  const auto staged = path.string() + ".staged";
  std::vector<std::uint8_t> a(len, 0x5A);
  safetensors::save_file(staged, {{"a", TensorView{Dtype::U8, {len}, std::as_bytes(std::span(a))}}});
  int fd = ::open(staged.c_str(), O_RDONLY);
  ::fsync(fd);
  ::close(fd);
  std::filesystem::rename(staged, path);
}

TEST(Residency, ReleaseAfterTheFileIsRenamedOverDropsItsPagesAndLeavesTheNewFileAlone) {
  test::TempDir dir;
  const auto path = dir / "m.safetensors";
  auto a = write_sample(path, 8 * kMiB);
  SafeOpen f(path);
  TensorView v = f.get_tensor("a");
  touch(v.data);
  publish_over(path, 8 * kMiB);
  ASSERT_GE(cached_bytes(path), 8 * kMiB) << "the new file is cached";
  safetensors::release_pages(f);
  EXPECT_LT(vma_of(v.data.data())->rss, 64 * 1024u);
  EXPECT_GE(cached_bytes(path), 8 * kMiB) << "the new file's pages are not the old file's to drop";
  EXPECT_EQ(bytes_of(v), a) << "the old file, read again from the file that was opened";
  // A load, then a release, with every backend: the release never fails for the new version.
  for (Backend backend : kBackends) {
    write_sample(path, 8 * kMiB);
    Checkpoint ckpt(path, {.backend = backend});
    LoadedTensors w = safetensors::load(ckpt);
    publish_over(path, 8 * kMiB);
    auto st = safetensors::nothrow::release_pages(ckpt);
    EXPECT_TRUE(st.ok()) << static_cast<int>(backend) << ": " << st.message();
    EXPECT_EQ(bytes_of(w.get_tensor("a")), a);
    EXPECT_GE(cached_bytes(path), 8 * kMiB) << static_cast<int>(backend);
  }
}

/// A file in memory is the caller's anonymous memory, which MADV_DONTNEED would zero: a
/// release leaves it exactly as it was, and so do lock and unlock.
TEST(Residency, BytesInMemoryAreNeverReleased) {
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", 8 * kMiB);
  auto buf = std::make_shared<std::vector<std::uint8_t>>(test::read_bytes(dir / "m.safetensors"));
  SafeOpen f = SafeOpen::from_bytes(std::as_bytes(std::span(*buf)), buf);
  safetensors::lock_pages(f);
  safetensors::release_pages(f);
  safetensors::unlock_pages(f);
  EXPECT_EQ(bytes_of(f.get_tensor("a")), a);
}

TEST(Residency, LockedPagesCannotBeReleasedUntilUnlocked) {
  if (auto why = mlock_ignored()) GTEST_SKIP() << *why;
  test::TempDir dir;
  auto a = write_sample(dir / "m.safetensors", kMiB);
  SafeOpen f(dir / "m.safetensors");
  safetensors::lock_pages(f);
  auto st = test::thrown([&] { safetensors::release_pages(f); });
  EXPECT_EQ(st.kind(), ErrorKind::Io);
  EXPECT_NE(st.message().find("unlock them first"), std::string::npos) << st.message();
  test::expect_same(safetensors::nothrow::release_pages(f), st);
  safetensors::unlock_pages(f);
  safetensors::release_pages(f);
  EXPECT_EQ(bytes_of(f.get_tensor("a")), a);
}

/// In a child whose RLIMIT_MEMLOCK is 64 KiB (and which, as root, drops its privileges: root
/// may lock past the limit), locking a 1 MiB tensor is `Io` naming the limit and the way out;
/// a 4 KiB tensor still locks.
TEST(Residency, ALockPastRlimitMemlockIsIoNamingTheLimit) {
  if (auto why = mlock_ignored()) GTEST_SKIP() << *why;
  test::TempDir dir;
  write_sample(dir / "m.safetensors", kMiB);
  SafeOpen f(dir / "m.safetensors");
  std::cout.flush();
  pid_t child = ::fork();
  if (child == 0) {
    rlimit rl{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(90);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) _exit(77);
    auto st = safetensors::nothrow::lock_pages(f, {{"a"}});
    if (st.ok()) _exit(91);
    if (st.kind() != ErrorKind::Io) _exit(92);
    for (const char* part :
         {"m.safetensors", "mlock", "RLIMIT_MEMLOCK (65536 bytes", "ulimit -l", "CAP_IPC_LOCK"}) {
      if (st.message().find(part) == std::string::npos) {
        std::fprintf(stderr, "no `%s` in: %s\n", part, st.message().c_str());
        _exit(93);
      }
    }
    if (!safetensors::nothrow::lock_pages(f, {{"b"}}).ok()) _exit(94);
    _exit(0);
  }
  int status = -1;
  ASSERT_GT(child, 0);
  ::waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot drop root's privileges here";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::describe_status(status);
}

}  // namespace
