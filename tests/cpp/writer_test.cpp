// save_file and serialize: layout, round trips, byte identity with Python, bad input, and
// crash safety (a writer killed mid-write never damages the existing file).
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <ranges>
#include <thread>

#include "support.hpp"

using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

using test::kind_of;

std::string header_of(const std::vector<std::byte>& file) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return {reinterpret_cast<const char*>(file.data()) + 8, n};
}

std::vector<std::string> listing(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Writer, SerializesTheDocumentedExample) {
  std::vector<std::int32_t> values{1, 2, 3, 4};
  TensorView t{Dtype::I32, {2, 2}, std::as_bytes(std::span(values)), {}};
  auto bytes = safetensors::serialize({{"test", t}});
  EXPECT_EQ(header_of(bytes),
            R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" + std::string(4, ' '));
  EXPECT_EQ(bytes.size(), 8u + 64 + 16);
  EXPECT_EQ(std::memcmp(bytes.data() + 72, values.data(), 16), 0);
  auto empty = safetensors::serialize(std::map<std::string, TensorView>{});
  EXPECT_EQ(header_of(empty), "{}      ");
}

TEST(Writer, OrdersByDtypeDescendingThenNameWithMetadataFirst) {
  std::vector<std::uint8_t> b(8, 1);
  std::map<std::string, TensorView> tensors{
      {"z", {Dtype::U8, {8}, std::as_bytes(std::span(b)), {}}},
      {"a", {Dtype::U8, {8}, std::as_bytes(std::span(b)), {}}},
      {"big", {Dtype::F64, {1}, std::as_bytes(std::span(b)), {}}},
  };
  auto bytes = safetensors::serialize(tensors, {{"format", "pt"}});
  std::string want =
      R"({"__metadata__":{"format":"pt"},"big":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"U8","shape":[8],"data_offsets":[8,16]},)"
      R"("z":{"dtype":"U8","shape":[8],"data_offsets":[16,24]}})";
  EXPECT_EQ(header_of(bytes), want + std::string(want.size() % 8 ? 8 - want.size() % 8 : 0, ' '));
}

struct MyTensor {  // a user's own tensor type
  Dtype dtype;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

TEST(Writer, AcceptsAnyRangeOfNamedTensorLikes) {
  test::TempDir dir;
  std::vector<std::pair<std::string, MyTensor>> mine{{"w", {Dtype::F32, {2, 3}, {1, 2, 3, 4, 5, 6}}},
                                                     {"b", {Dtype::F32, {3}, {7, 8, 9}}}};
  safetensors::save_file(dir / "mine.safetensors", mine, {{"source", "c++"}});
  SafeOpen f(dir / "mine.safetensors");
  auto w = f.get_tensor("w");
  EXPECT_EQ(w.shape, (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(w.as<float>()[5], 6.0f);
  EXPECT_EQ(f.metadata().at("source"), "c++");
  std::vector<std::pair<std::string, MyTensor>> negative{{"n", {Dtype::F32, {-1}, {}}}};
  EXPECT_EQ(kind_of([&] { (void)safetensors::serialize(negative); }), ErrorKind::TensorInvalidInfo);
}

TEST(Writer, RoundTripsEveryDtypeAndWritesViewsFromAnotherFileStraightBack) {
  test::TempDir dir;
  std::vector<std::vector<std::uint8_t>> storage;
  std::map<std::string, TensorView> tensors;
  for (std::size_t i = 0; i < safetensors::dtype_count; ++i) {
    auto d = static_cast<Dtype>(i);
    auto& bytes = storage.emplace_back(24 * safetensors::bit_size(d) / 8);
    for (std::size_t j = 0; j < bytes.size(); ++j) bytes[j] = static_cast<std::uint8_t>(j * 7 + i);
    tensors["t." + std::string(safetensors::to_string(d))] = {d, {4, 6}, std::as_bytes(std::span(bytes)), {}};
  }
  safetensors::save_file(dir / "a.safetensors", tensors, {{"format", "pt"}});
  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    SafeOpen a(dir / "a.safetensors", {backend});
    std::map<std::string, TensorView> views;
    for (const auto& k : a.keys()) views.emplace(k, a.get_tensor(k));
    safetensors::save_file(dir / "b.safetensors", views, a.metadata());
    EXPECT_EQ(test::read_bytes(dir / "a.safetensors"), test::read_bytes(dir / "b.safetensors"));
  }
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"a.safetensors", "b.safetensors"}));
}

TEST(Writer, ByteIdenticalToPythonWithAtMostOneMetadataKey) {
  auto dir = test::fixture("python", "manifest.tsv");
  if (!dir) return;
  int compared = 0;
  for (const auto& [fname, want] : test::read_manifest(*dir / "manifest.tsv")) {
    if (want.metadata.size() > 1) continue;  // Python orders several keys at random
    SafeOpen f(*dir / fname);
    std::map<std::string, TensorView> views;
    for (const auto& k : f.keys()) views.emplace(k, f.get_tensor(k));
    auto ours = safetensors::serialize(views, f.metadata());
    auto theirs = test::read_bytes(*dir / fname);
    ASSERT_EQ(ours.size(), theirs.size()) << fname;
    EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), ours.size()), 0) << fname;
    ++compared;
  }
  EXPECT_GE(compared, 3);
}

TEST(Writer, BadInputIsATypedErrorAndLeavesTheTargetUntouched) {
  test::TempDir dir;
  auto target = dir / "keep.safetensors";
  std::vector<float> good{1, 2, 3, 4};
  safetensors::save_file(target, {{"w", TensorView{Dtype::F32, {4}, std::as_bytes(std::span(good)), {}}}});
  const auto before = test::read_bytes(target);
  auto expect = [&](ErrorKind kind, auto&& write) {
    EXPECT_EQ(kind_of(write), kind);
    EXPECT_EQ(test::read_bytes(target), before) << safetensors::to_string(kind);
    EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"keep.safetensors"});
  };
  auto bytes = std::as_bytes(std::span(good));
  expect(ErrorKind::TensorInvalidInfo, [&] {
    safetensors::save_file(target, {{"w", TensorView{Dtype::F32, {3}, bytes, {}}}});
  });
  expect(ErrorKind::MisalignedSlice, [&] {
    safetensors::save_file(target, {{"w", TensorView{Dtype::F4, {3}, bytes.first(2), {}}}});
  });
  expect(ErrorKind::InvalidTensorName, [&] {
    safetensors::save_file(target, {{"__metadata__", TensorView{Dtype::F32, {4}, bytes, {}}}});
  });
  expect(ErrorKind::DuplicateKey, [&] {
    TensorView v{Dtype::F32, {4}, bytes, {}};
    std::vector<std::pair<std::string, TensorView>> twice{{"w", v}, {"w", v}};
    safetensors::save_file(target, twice);
  });
  expect(ErrorKind::HeaderTooLarge, [&] {
    std::string huge(100'000'001, 'n');
    safetensors::save_file(target, {{huge, TensorView{Dtype::F32, {4}, bytes, {}}}});
  });
  // A directory that cannot exist: its parent is a regular file.
  try {
    safetensors::save_file(target / "x.safetensors", {{"w", TensorView{Dtype::F32, {4}, bytes, {}}}});
    ADD_FAILURE() << "wrote under a regular file";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("keep.safetensors/x.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::read_bytes(target), before);
}

TEST(Writer, SavingOverAMappedFileLeavesTheMappingsBytesUnchanged) {
  test::TempDir dir;
  auto path = dir / "m.safetensors";
  std::vector<float> old_values(1024, 1.5f), new_values(2048, -3.0f);
  safetensors::save_file(path,
                         {{"w", TensorView{Dtype::F32, {1024}, std::as_bytes(std::span(old_values)), {}}}});
  SafeOpen mapped(path);
  auto view = mapped.get_tensor("w");
  safetensors::save_file(path,
                         {{"w", TensorView{Dtype::F32, {2048}, std::as_bytes(std::span(new_values)), {}}}});
  auto old_span = view.as<float>();
  EXPECT_TRUE(std::all_of(old_span.begin(), old_span.end(), [](float v) { return v == 1.5f; }));
  auto fresh = SafeOpen(path).get_tensor("w");
  EXPECT_EQ(fresh.as<float>().size(), 2048u);
}

/// Bytes written so far by `child` to a file in `dir` other than `target`, or 0. Read through
/// the child's descriptors: its temporary file is unnamed (O_TMPFILE) where the filesystem
/// allows, and named (`.st-<hex>.tmp`) elsewhere.
std::uintmax_t temp_bytes(pid_t child, const std::filesystem::path& dir,
                          const std::filesystem::path& target) {
  std::error_code ec;
  const auto real_dir = std::filesystem::canonical(dir, ec);
  const auto real_target = real_dir / target.filename();
  std::filesystem::directory_iterator fds("/proc/" + std::to_string(child) + "/fd", ec);
  if (ec) return 0;
  for (const auto& fd : fds) {
    auto to = std::filesystem::read_symlink(fd.path(), ec);
    if (ec || to.parent_path() != real_dir || to == real_target) continue;
    auto size = std::filesystem::file_size(fd.path(), ec);
    if (!ec) return size;
  }
  return 0;
}

/// Whether `dir` supports unnamed temporary files, so that a killed writer leaves nothing.
bool supports_o_tmpfile(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

TEST(Writer, AWriterKilledMidWriteLeavesTheOldFileIntact) {
  test::TempDir dir;
  auto target = dir / "big.safetensors";
  std::vector<std::uint8_t> old_bytes(1 << 20, 7);
  safetensors::save_file(
      target, {{"old", TensorView{Dtype::U8, {old_bytes.size()}, std::as_bytes(std::span(old_bytes)), {}}}});
  const auto before = test::read_bytes(target);
  // 384 MiB of new data: long enough to catch the writer in the middle. Kill points: right
  // after the start, then at random amounts written (the seed is printed to replay a failure).
  std::vector<std::uint8_t> big(384u << 20, 9);
  std::random_device rd;
  auto seed = rd();
  std::mt19937_64 rng(seed);
  std::cout << "kill points seed " << seed << "\n";
  std::vector<std::uintmax_t> thresholds{0};
  for (int i = 0; i < 5; ++i) thresholds.push_back(rng() % (std::uintmax_t{360} << 20));
  for (std::uintmax_t threshold : thresholds) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        safetensors::save_file(
            target, {{"new", TensorView{Dtype::U8, {big.size()}, std::as_bytes(std::span(big)), {}}}});
      } catch (...) {
        _exit(2);
      }
      _exit(0);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (temp_bytes(child, dir.path(), target) < threshold && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::uintmax_t written = temp_bytes(child, dir.path(), target);
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    if (WIFEXITED(status)) {
      // The writer finished before the kill: the target must then be the complete new file.
      EXPECT_EQ(WEXITSTATUS(status), 0);
      EXPECT_EQ(std::filesystem::file_size(target), big.size() + 8 + 72);
      GTEST_SKIP() << "the writer finished before it could be killed at " << threshold << " bytes";
    }
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_GE(written, threshold);
    std::cout << "killed the writer after " << written << " bytes\n";
    EXPECT_EQ(test::read_bytes(target), before) << "killed after " << written << " bytes";
    // Nothing is left where the temporary file is unnamed; elsewhere only a hidden one.
    for (const auto& name : listing(dir.path())) {
      if (name == "big.safetensors") continue;
      EXPECT_FALSE(supports_o_tmpfile(dir.path())) << "left behind: " << name;
      EXPECT_EQ(name.rfind(".st-", 0), 0u) << name;
      std::filesystem::remove(dir / name);
    }
    EXPECT_NO_THROW(SafeOpen reopened(target));
  }
}

// ---- issue 18: ranges of temporaries, empty metadata, honest errors ------------------------

/// Four equal-sized tensors with different bytes: if the writer kept the address of a freed
/// temporary, the allocator hands the same block to the next one and the file shows it.
std::vector<std::pair<std::string, MyTensor>> four_tensors() {
  std::vector<std::pair<std::string, MyTensor>> out;
  for (int t = 0; t < 4; ++t) {
    MyTensor m{Dtype::F32, {64}, std::vector<float>(64)};
    for (int i = 0; i < 64; ++i) m.data[static_cast<std::size_t>(i)] = static_cast<float>(t * 1000 + i);
    out.emplace_back("t" + std::to_string(t), std::move(m));
  }
  return out;
}

/// An input range (not forward) that reuses one element: `*it` is a reference to the range's
/// own cache, overwritten by `++it`, as single-pass ranges may do.
class ReusingRange {
 public:
  explicit ReusingRange(std::vector<std::pair<std::string, MyTensor>> all) : all_(std::move(all)) {}
  class iterator {
   public:
    using value_type = std::pair<std::string, MyTensor>;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(ReusingRange* r) : r_(r) { r_->load(); }
    value_type& operator*() const { return r_->current_; }
    iterator& operator++() {
      ++r_->next_;
      r_->load();
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return r_->next_ >= r_->all_.size(); }

   private:
    ReusingRange* r_ = nullptr;
  };
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() { return {}; }

 private:
  void load() {
    if (next_ < all_.size()) {
      current_.first = all_[next_].first;
      current_.second.dtype = all_[next_].second.dtype;
      current_.second.shape = all_[next_].second.shape;
      current_.second.data.assign(all_[next_].second.data.begin(), all_[next_].second.data.end());
    }
  }
  std::vector<std::pair<std::string, MyTensor>> all_;
  std::pair<std::string, MyTensor> current_;
  std::size_t next_ = 0;
};

TEST(Writer, RangesYieldingTemporariesAreWrittenCorrectly) {
  test::TempDir dir;
  auto expected_path = dir / "expected.safetensors";
  const auto source = four_tensors();
  safetensors::save_file(expected_path, source);
  const auto expected = test::read_bytes(expected_path);

  // Views read by the read backend, each into a buffer its temporary pair alone owns.
  SafeOpen f(expected_path, {safetensors::Backend::Read});
  auto keys = f.keys();
  auto read_views = keys | std::views::transform([&](const std::string& k) {
                      return std::pair<std::string, TensorView>{k, f.get_tensor(k)};
                    });
  safetensors::save_file(dir / "views.safetensors", read_views);
  EXPECT_EQ(test::read_bytes(dir / "views.safetensors"), expected);
  auto bytes = safetensors::serialize(read_views);
  EXPECT_EQ(std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                      reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size()),
            expected);

  // A user's struct owning its vector, built on the fly.
  auto owned = std::views::iota(0, 4) |
               std::views::transform([&](int t) { return source[static_cast<std::size_t>(t)]; });
  safetensors::save_file(dir / "owned.safetensors", owned);
  EXPECT_EQ(test::read_bytes(dir / "owned.safetensors"), expected);

  // A single-pass range whose elements are references to one reused cache.
  ReusingRange reusing(source);
  static_assert(std::ranges::input_range<ReusingRange> && !std::ranges::forward_range<ReusingRange>);
  safetensors::save_file(dir / "reusing.safetensors", reusing);
  EXPECT_EQ(test::read_bytes(dir / "reusing.safetensors"), expected);

  // Elements given as rvalue references are the caller's: written without being moved from.
  auto mine = four_tensors();
  auto as_rvalues = mine | std::views::transform(
                               [](auto& p) -> std::pair<std::string, MyTensor>&& { return std::move(p); });
  safetensors::save_file(dir / "rvalues.safetensors", as_rvalues);
  EXPECT_EQ(test::read_bytes(dir / "rvalues.safetensors"), expected);
  EXPECT_EQ(mine[3].second.data.size(), 64u);
}

TEST(Writer, AnEmptyMetadataObjectIsWrittenOnRequestAsPythonWritesIt) {
  std::array<float, 2> w{1, 2};
  TensorView v{Dtype::F32, {2}, std::as_bytes(std::span(w)), {}};
  // Python: safetensors.numpy.save({"w": np.array([1, 2], np.float32)}, metadata={})
  const std::string python = std::string("H\0\0\0\0\0\0\0", 8) +
                             R"({"__metadata__":{},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" +
                             std::string("\0\0\x80?\0\0\0@", 8);
  auto ours = safetensors::serialize({{"w", v}}, {}, {.empty_metadata = true});
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ours.data()), ours.size()), python);
  // Without the option an empty map still means "no metadata".
  EXPECT_EQ(header_of(safetensors::serialize({{"w", v}})).find("__metadata__"), std::string::npos);

  test::TempDir dir;
  safetensors::save_file(dir / "e.safetensors", {{"w", v}}, {}, {.sync = false, .empty_metadata = true});
  SafeOpen f(dir / "e.safetensors");
  EXPECT_TRUE(f.has_metadata());
  EXPECT_TRUE(f.metadata().empty());
  auto bytes = test::read_bytes(dir / "e.safetensors");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), python);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const safetensors::Error& e) {
    return std::string(safetensors::to_string(e.kind())) + ": " + e.what();
  }
  return "no error";
}

TEST(Writer, NonUtf8NamesAndInvalidDtypesGetHonestErrors) {
  std::array<float, 2> w{1, 2};
  TensorView v{Dtype::F32, {2}, std::as_bytes(std::span(w)), {}};
  auto name = message_of([&] { (void)safetensors::serialize({{"bad\xff", v}}); });
  EXPECT_EQ(name.rfind("InvalidTensorName: ", 0), 0u) << name;
  EXPECT_NE(name.find("not valid UTF-8"), std::string::npos) << name;
  EXPECT_EQ(name.find("reserved"), std::string::npos) << name;

  auto key = message_of([&] { (void)safetensors::serialize({{"w", v}}, {{"k\xc3", "v"}}); });
  EXPECT_EQ(key.rfind("InvalidHeader: ", 0), 0u) << key;
  EXPECT_NE(key.find("metadata key"), std::string::npos) << key;
  auto value = message_of([&] { (void)safetensors::serialize({{"w", v}}, {{"k", "\x80"}}); });
  EXPECT_EQ(value.rfind("InvalidHeader: ", 0), 0u) << value;
  EXPECT_NE(value.find("metadata value"), std::string::npos) << value;
  EXPECT_EQ(value.find("reserved"), std::string::npos) << value;

  TensorView bad_dtype{static_cast<Dtype>(99), {2}, std::as_bytes(std::span(w)), {}};
  auto dtype = message_of([&] { (void)safetensors::serialize({{"w", bad_dtype}}); });
  EXPECT_EQ(dtype.rfind("TypeMismatch: ", 0), 0u) << dtype;
  EXPECT_NE(dtype.find("invalid dtype value 99"), std::string::npos) << dtype;

  // Messages built on the C++ side are C strings too (`what()`): a NUL in the name must not
  // cut off what follows it.
  using namespace std::string_literals;
  auto nul = message_of([&] { (void)safetensors::serialize({{"a\0b"s, bad_dtype}}); });
  EXPECT_NE(nul.find("`a\\0b` has an invalid dtype value 99"), std::string::npos) << nul;
}

TEST(Writer, EveryErrorOfSaveFileNamesTheFileBeingWritten) {
  test::TempDir dir;
  const auto path = dir / "out.safetensors";
  std::array<float, 2> w{1, 2};
  TensorView v{Dtype::F32, {2}, std::as_bytes(std::span(w)), {}};
  TensorView bad_dtype{static_cast<Dtype>(99), {2}, std::as_bytes(std::span(w)), {}};
  struct Negative {
    Dtype dtype = Dtype::F32;
    std::vector<long> shape{-2};
    std::span<const std::byte> data;
  };
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"InvalidTensorName",
       [&] {
         safetensors::save_file(path, {{"bad\xff", v}});
       }},
      {"InvalidHeader",
       [&] {
         safetensors::save_file(path, {{"w", v}}, {{"k\xc3", "v"}});
       }},
      {"InvalidHeader",
       [&] {
         safetensors::save_file(path, {{"w", v}}, {{"k", "\x80"}});
       }},
      {"TypeMismatch",
       [&] {
         safetensors::save_file(path, {{"w", bad_dtype}});
       }},
      {"InvalidTensorName",
       [&] {
         safetensors::save_file(path, {{"__metadata__", v}});
       }},
      {"TensorInvalidInfo",
       [&] {
         std::vector<std::pair<std::string, Negative>> neg{{"n", Negative{}}};
         safetensors::save_file(path, neg);
       }},
  };
  for (const auto& [kind, call] : cases) {
    auto message = message_of(call);
    EXPECT_EQ(message.rfind(kind + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_FALSE(std::filesystem::exists(path)) << message;
  }
  // serialize writes no file, so its errors name none.
  auto name = message_of([&] { (void)safetensors::serialize({{"bad\xff", v}}); });
  EXPECT_EQ(name.find(dir.path().string()), std::string::npos) << name;
}

}  // namespace
