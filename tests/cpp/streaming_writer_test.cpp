// StreamingWriter, ShardedWriter and save_sharded through the public header: byte identity with
// save_file, pieces in any order from several threads, every error a piece can have (both
// faces), what a killed writer and a full disk leave behind, aligned layouts read back by every
// backend, and sharded checkpoints read back by Checkpoint.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::SaveOptions;
using safetensors::ShardedWriter;
using safetensors::StreamingWriter;
using safetensors::TensorSpec;
using safetensors::TensorView;

namespace {

namespace fs = std::filesystem;
using test::kind_of;

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Tensors of assorted dtypes and sizes (a sub-byte one, a scalar, an empty one), declared in an
/// order unrelated to the file's, with their bytes.
struct Model {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;

  Model() {
    add("layers.1.w", Dtype::BF16, {33, 7});
    add("embed", Dtype::F32, {100, 3});
    add("scale", Dtype::F64, {});
    add("mask", Dtype::BOOL, {17});
    add("q", Dtype::F4, {6, 2});
    add("none", Dtype::I32, {0, 4});
    add("big", Dtype::U8, {70000});
    add("ids", Dtype::I64, {9});
  }

  void add(std::string name, Dtype d, std::vector<std::size_t> shape) {
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    const std::size_t bytes = n * safetensors::bit_size(d) / 8;
    std::vector<std::byte> b(bytes);
    for (std::size_t i = 0; i < bytes; ++i)
      b[i] = static_cast<std::byte>((i * 131 + data.size() * 17 + i / 251) & 0xff);
    specs.push_back({std::move(name), d, std::move(shape)});
    data.push_back(std::move(b));
  }

  [[nodiscard]] std::map<std::string, TensorView> views() const {
    std::map<std::string, TensorView> out;
    for (std::size_t i = 0; i < specs.size(); ++i)
      out.emplace(specs[i].name, TensorView{specs[i].dtype, specs[i].shape, data[i], {}});
    return out;
  }

  /// Every tensor cut into pieces of at most `piece` bytes, shuffled: (tensor, offset, length).
  [[nodiscard]] std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> pieces(std::size_t piece,
                                                                                      unsigned seed) const {
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> out;
    for (std::size_t k = 0; k < data.size(); ++k) {
      for (std::size_t at = 0; at < data[k].size(); at += piece)
        out.emplace_back(k, at, std::min(piece, data[k].size() - at));
    }
    std::mt19937 rng(seed);
    std::shuffle(out.begin(), out.end(), rng);
    return out;
  }
};

const safetensors::Metadata kMeta{{"format", "pt"}};

TEST(StreamingWriter, PiecesFromManyThreadsGiveTheBytesSaveFileGives) {
  test::TempDir dir;
  Model m;
  safetensors::save_file(dir / "whole.safetensors", m.views(), kMeta);
  const auto want = test::read_bytes(dir / "whole.safetensors");
  for (std::size_t piece : {std::size_t{1} << 20, std::size_t{4096}, std::size_t{37}}) {
    const auto target = dir / ("pieces-" + std::to_string(piece) + ".safetensors");
    StreamingWriter out(target, m.specs, kMeta);
    EXPECT_FALSE(fs::exists(target));
    const auto all = m.pieces(piece, static_cast<unsigned>(piece));
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        for (std::size_t i = t; i < all.size(); i += 6) {
          auto [k, at, len] = all[i];
          out.write(m.specs[k].name, at, std::span(m.data[k]).subspan(at, len));
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(out.files(), std::vector<std::string>{target.string()});
    out.finish();
    EXPECT_EQ(test::read_bytes(target), want) << "pieces of " << piece << " bytes";
  }
  EXPECT_EQ(listing(dir.path()).size(), 4u);
}

TEST(StreamingWriter, WholeTensorsAndTheNothrowFaceWriteTheSameFile) {
  test::TempDir dir;
  Model m;
  safetensors::save_file(dir / "whole.safetensors", m.views());
  auto out = safetensors::nothrow::make_streaming_writer(dir / "a.safetensors", m.specs);
  ASSERT_TRUE(out) << out.status().message();
  for (std::size_t k = m.specs.size(); k-- > 0;) {
    ASSERT_TRUE(safetensors::nothrow::write(*out, m.specs[k].name, m.data[k]).ok());
  }
  ASSERT_TRUE(safetensors::nothrow::finish(*out).ok());
  EXPECT_EQ(test::read_bytes(dir / "a.safetensors"), test::read_bytes(dir / "whole.safetensors"));
  // A finished writer writes nothing more.
  EXPECT_EQ(safetensors::nothrow::write(*out, "scale", m.data[2]).kind(), ErrorKind::Internal);
  EXPECT_EQ(safetensors::nothrow::finish(*out).kind(), ErrorKind::Internal);
  StreamingWriter moved = std::move(*out);
  EXPECT_EQ(safetensors::nothrow::finish(*out).kind(),
            ErrorKind::Internal);  // NOLINT(bugprone-use-after-move)
}

TEST(StreamingWriter, EveryWrongPieceIsATypedErrorOnBothFaces) {
  test::TempDir dir;
  const auto target = dir / "out.safetensors";
  std::vector<TensorSpec> specs{{"a", Dtype::F32, {4}}, {"b", Dtype::U8, {3}}};
  StreamingWriter out(target, specs);
  std::vector<std::byte> bytes(32, std::byte{1});
  auto piece = [&](std::size_t n) { return std::span(bytes).first(n); };
  struct Case {
    const char* what;
    std::function<safetensors::Status()> nothrow;
    std::function<void()> throwing;
    ErrorKind kind;
    const char* says;
  };
  const std::vector<Case> cases{
      {"unknown tensor", [&] { return safetensors::nothrow::write(out, "c", piece(4)); },
       [&] { out.write("c", piece(4)); }, ErrorKind::TensorNotFound, "`c`"},
      {"short whole tensor", [&] { return safetensors::nothrow::write(out, "a", piece(15)); },
       [&] { out.write("a", piece(15)); }, ErrorKind::TensorInvalidInfo, "15 bytes"},
      {"long whole tensor", [&] { return safetensors::nothrow::write(out, "a", piece(17)); },
       [&] { out.write("a", piece(17)); }, ErrorKind::TensorInvalidInfo, "17 bytes"},
      {"piece past the end", [&] { return safetensors::nothrow::write(out, "b", 2, piece(2)); },
       [&] { out.write("b", 2, piece(2)); }, ErrorKind::TensorInvalidInfo, "[2, 4)"},
      {"name that is not UTF-8", [&] { return safetensors::nothrow::write(out, "\xff", piece(1)); },
       [&] { out.write("\xff", piece(1)); }, ErrorKind::TensorNotFound, "out.safetensors"},
  };
  for (const auto& c : cases) {
    auto st = c.nothrow();
    EXPECT_EQ(st.kind(), c.kind) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find("out.safetensors"), std::string::npos) << st.message();
    test::expect_same(st, test::thrown(c.throwing));
  }
  out.write("a", 4, piece(8));
  auto twice = safetensors::nothrow::write(out, "a", 8, piece(8));
  EXPECT_EQ(twice.kind(), ErrorKind::InvalidOffset) << twice.message();
  EXPECT_NE(twice.message().find("already written"), std::string::npos) << twice.message();
  out.write("b", piece(3));
  auto missing = safetensors::nothrow::finish(out);
  EXPECT_EQ(missing.kind(), ErrorKind::MetadataIncompleteBuffer) << missing.message();
  EXPECT_NE(missing.message().find("`a`"), std::string::npos) << missing.message();
  test::expect_same(missing, test::thrown([&] { out.finish(); }));
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(listing(dir.path()).empty());
  // The writer is as it was: the missing bytes written, it finishes.
  out.write("a", 0, piece(4));
  out.write("a", 12, piece(4));
  out.finish();
  safetensors::SafeOpen f(target);
  EXPECT_EQ(f.get_tensor("a").data.size(), 16u);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"out.safetensors"});
}

// A finish whose rename fails (a directory where the file goes) publishes nothing and leaves the
// writer usable, as the C API does: once the way is clear it finishes, leaving nothing beside.
TEST(StreamingWriter, AFinishWhoseRenameFailsCanBeFinishedAgain) {
  test::TempDir dir;
  Model m;
  const auto target = dir / "out.safetensors";
  safetensors::save_file(dir / "whole.safetensors", m.views());
  StreamingWriter out(target, m.specs);
  for (std::size_t k = 0; k < m.specs.size(); ++k) out.write(m.specs[k].name, m.data[k]);
  fs::create_directory(target);
  auto refused = safetensors::nothrow::finish(out);
  EXPECT_EQ(refused.kind(), ErrorKind::Io) << refused.message();
  EXPECT_NE(refused.message().find("finish"), std::string::npos) << refused.message();
  EXPECT_TRUE(fs::is_directory(target));
  fs::remove(target);
  out.finish();
  EXPECT_EQ(test::read_bytes(target), test::read_bytes(dir / "whole.safetensors"));
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"out.safetensors", "whole.safetensors"}));
  EXPECT_EQ(safetensors::nothrow::finish(out).kind(), ErrorKind::Internal);
}

TEST(StreamingWriter, DeclarationsThatDoNotAddUpAreRefusedAndNoFileIsMade) {
  test::TempDir dir;
  const auto target = dir / "out.safetensors";
  auto kind = [&](std::vector<TensorSpec> specs, SaveOptions options = {}) {
    auto made = safetensors::nothrow::make_streaming_writer(target, specs, {}, options);
    EXPECT_FALSE(static_cast<bool>(made));
    if (made) return ErrorKind::Internal;
    EXPECT_NE(made.status().message().find("out.safetensors"), std::string::npos) << made.status().message();
    test::expect_same(made.status(), test::thrown([&] { StreamingWriter w(target, specs, {}, options); }));
    return made.status().kind();
  };
  EXPECT_EQ(kind({{"w", Dtype::F64, {std::size_t{1} << 62, 4}}}), ErrorKind::ValidationOverflow);
  EXPECT_EQ(kind({{"w", Dtype::F4, {3}}}), ErrorKind::MisalignedSlice);
  EXPECT_EQ(kind({{"w", Dtype::U8, {1}}, {"w", Dtype::U8, {2}}}), ErrorKind::DuplicateKey);
  EXPECT_EQ(kind({{"__metadata__", Dtype::U8, {1}}}), ErrorKind::InvalidTensorName);
  EXPECT_EQ(kind({{"\xc3", Dtype::U8, {1}}}), ErrorKind::InvalidTensorName);
  EXPECT_EQ(kind({{"w", static_cast<Dtype>(99), {1}}}), ErrorKind::TypeMismatch);
  EXPECT_EQ(kind({{"w", Dtype::U8, {1}}}, {.alignment = 48}), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind({{"w", Dtype::U8, {1}}}, {.alignment = std::size_t{1} << 27}), ErrorKind::InvalidSlice);
  EXPECT_EQ(
      safetensors::nothrow::make_streaming_writer(dir / "missing-dir" / "x.safetensors", {}).status().kind(),
      ErrorKind::Io);
  EXPECT_TRUE(listing(dir.path()).empty());
}

TEST(StreamingWriter, AnUnfinishedWriterLeavesTheTargetAsItWasAndKeepsItsModeWhenDone) {
  test::TempDir dir;
  const auto target = dir / "out.safetensors";
  std::vector<std::uint8_t> old(16, 7);
  safetensors::save_file(target,
                         {{"old", TensorView{Dtype::U8, {old.size()}, std::as_bytes(std::span(old)), {}}}});
  ASSERT_EQ(::chmod(target.c_str(), 0640), 0);
  const auto before = test::read_bytes(target);
  Model m;
  {
    StreamingWriter out(target, m.specs);
    out.write("embed", m.data[1]);
  }
  EXPECT_EQ(test::read_bytes(target), before);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"out.safetensors"});
  StreamingWriter out(target, m.specs);
  for (std::size_t k = 0; k < m.specs.size(); ++k) out.write(m.specs[k].name, m.data[k]);
  out.finish();
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  safetensors::SafeOpen f(target);
  EXPECT_EQ(f.keys().size(), m.specs.size());
}

/// Bytes of the writer's temporary file in `dir` as child `pid` sees it: its only descriptor on
/// a regular file in `dir` other than `target` (the unnamed file shows as `/dir/#N (deleted)`).
std::uintmax_t temp_bytes(pid_t pid, const fs::path& dir, const fs::path& target) {
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    auto to = fs::read_symlink(fd.path(), ec);
    if (ec || to.parent_path() != dir || to == target) continue;
    struct stat st {};
    if (::stat(fd.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      return static_cast<std::uintmax_t>(st.st_size);
  }
  return 0;
}

TEST(StreamingWriter, AWriterKilledMidWayLeavesTheOldFileAndNoTemporaryFile) {
  test::TempDir dir;
  const auto target = dir / "out.safetensors";
  std::vector<std::uint8_t> old(64, 3);
  safetensors::save_file(target,
                         {{"old", TensorView{Dtype::U8, {old.size()}, std::as_bytes(std::span(old)), {}}}});
  const auto before = test::read_bytes(target);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  std::cout.flush();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      std::vector<std::byte> half(8u << 20, std::byte{9});
      StreamingWriter out(target, {{"new", Dtype::U8, {16u << 20}}});
      out.write("new", 0, half);
      char c = 1;
      if (::write(ready[1], &c, 1) != 1) _exit(3);
      ::pause();
    } catch (...) {
      _exit(2);
    }
    _exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the child failed before writing";
  ::close(ready[0]);
  // The child is mid-way: half its file written, nothing under the target's name.
  EXPECT_GE(temp_bytes(child, dir.path(), target), std::uintmax_t{8} << 20);
  EXPECT_EQ(test::read_bytes(target), before);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << test::describe_status(status);
  EXPECT_EQ(test::read_bytes(target), before);
  for (const auto& name : listing(dir.path())) {
    // Where the filesystem lacks unnamed temporary files, a hidden named one may stay.
    EXPECT_TRUE(name == "out.safetensors" || name.rfind(".st-", 0) == 0) << name;
  }
}

/// Runs `body` in a child process whose directory `dir` is a filesystem of 1 MiB: a tmpfs mounted
/// in a mount namespace of its own (needs root or unprivileged user namespaces), else the same
/// directory under a file-size limit of 1 MiB (`RLIMIT_FSIZE`, writes past it fail with `EFBIG`
/// rather than `ENOSPC`, through the same paths). Returns the child's wait status; the child
/// exits 77 when neither can be had.
template <class F>
int with_a_small_disk(const fs::path& dir, bool& real_enospc, F&& body) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return -1;
  std::cout.flush();
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    char how = 'f';
    if (::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") == 0) {
      how = 'm';
    } else {
      ::signal(SIGXFSZ, SIG_IGN);
      rlimit rl{1u << 20, 1u << 20};
      if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(77);
    }
    if (::write(pipe_fds[1], &how, 1) != 1) _exit(98);
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::cerr << "unexpected exception: " << e.what() << "\n";
    }
    std::cout.flush();
    _exit(code);
  }
  ::close(pipe_fds[1]);
  char how = 0;
  if (::read(pipe_fds[0], &how, 1) == 1) real_enospc = how == 'm';
  ::close(pipe_fds[0]);
  int status = -1;
  ::waitpid(child, &status, 0);
  return status;
}

TEST(StreamingWriter, AFullDiskLeavesTheTargetUntouchedAndNoTemporaryFile) {
  test::TempDir dir;
  bool real_enospc = false;
  const int status = with_a_small_disk(dir.path(), real_enospc, [&]() -> int {
    const auto target = dir / "out.safetensors";
    std::vector<std::uint8_t> old(1000, 5);
    safetensors::save_file(target,
                           {{"old", TensorView{Dtype::U8, {old.size()}, std::as_bytes(std::span(old)), {}}}});
    const auto before = test::read_bytes(target);
    auto intact = [&](const char* after) {
      if (test::read_bytes(target) != before) {
        std::cerr << "the target changed after " << after << "\n";
        return false;
      }
      if (listing(dir.path()) != std::vector<std::string>{"out.safetensors"}) {
        std::cerr << "files left after " << after << ":";
        for (const auto& n : listing(dir.path())) std::cerr << " " << n;
        std::cerr << "\n";
        return false;
      }
      return true;
    };
    // Too large to start: refused when the file's space is reserved, before any byte is written.
    auto big = safetensors::nothrow::make_streaming_writer(target, {{"w", Dtype::U8, {4u << 20}}});
    if (big || big.status().kind() != ErrorKind::Io) {
      std::cerr << "a 4 MiB writer on a 1 MiB disk: " << (big ? "made" : big.status().message()) << "\n";
      return 1;
    }
    std::cerr << "as expected: " << big.status().message() << "\n";
    if (!intact("the refused writer")) return 2;
    // save_file meets the full disk while writing.
    std::vector<std::byte> bytes(4u << 20, std::byte{1});
    auto saved =
        safetensors::nothrow::save_file(target, {{"w", TensorView{Dtype::U8, {bytes.size()}, bytes, {}}}});
    if (saved.kind() != ErrorKind::Io) return 3;
    if (!intact("the failed save_file")) return 4;
    // A write that fails once the writer is under way (the limit lowered after the space was
    // reserved) fails every later call, and the writer leaves nothing.
    {
      StreamingWriter out(target, {{"w", Dtype::U8, {512u << 10}}});
      rlimit rl{64u << 10, 64u << 10};
      ::signal(SIGXFSZ, SIG_IGN);
      if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return 5;
      auto first = safetensors::nothrow::write(out, "w", 0, std::span(bytes).first(512u << 10));
      if (first.kind() != ErrorKind::Io) return 6;
      auto later = safetensors::nothrow::write(out, "w", 0, std::span(bytes).first(1));
      auto finished = safetensors::nothrow::finish(out);
      if (later.message() != first.message() || finished.message() != first.message()) {
        std::cerr << first.message() << " | " << later.message() << " | " << finished.message() << "\n";
        return 7;
      }
    }
    return intact("the failed writes") ? 0 : 8;
  });
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
    GTEST_SKIP() << "neither a tmpfs mount nor RLIMIT_FSIZE";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::describe_status(status);
  std::cout << (real_enospc ? "ran on a 1 MiB tmpfs (ENOSPC)" : "ran under RLIMIT_FSIZE (EFBIG)") << "\n";
}

TEST(StreamingWriter, AlignedFilesStartTheirDataOnTheBoundaryAndReadBackEverywhere) {
  test::TempDir dir;
  Model m;
  safetensors::save_file(dir / "plain.safetensors", m.views(), kMeta);
  const auto plain = test::read_bytes(dir / "plain.safetensors");
  for (std::size_t alignment : {64u, 4096u}) {
    const auto a = dir / ("a" + std::to_string(alignment) + ".safetensors");
    safetensors::save_file(a, m.views(), kMeta, {.alignment = alignment});
    const auto s = dir / ("s" + std::to_string(alignment) + ".safetensors");
    StreamingWriter out(s, m.specs, kMeta, {.alignment = alignment});
    for (std::size_t k = 0; k < m.specs.size(); ++k) out.write(m.specs[k].name, m.data[k]);
    out.finish();
    const auto bytes = test::read_bytes(a);
    EXPECT_EQ(test::read_bytes(s), bytes);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % alignment, 0u);
    std::uint64_t plain_n = 0;
    std::memcpy(&plain_n, plain.data(), 8);
    // The same data after more spaces.
    EXPECT_TRUE(std::equal(bytes.begin() + static_cast<std::ptrdiff_t>(8 + n), bytes.end(),
                           plain.begin() + static_cast<std::ptrdiff_t>(8 + plain_n), plain.end()));
    for (auto backend :
         {safetensors::Backend::Mmap, safetensors::Backend::Read, safetensors::Backend::Direct}) {
      safetensors::SafeOpen f(a, {.backend = backend});
      EXPECT_EQ(f.metadata(), kMeta);
      for (std::size_t k = 0; k < m.specs.size(); ++k) {
        auto t = f.get_tensor(m.specs[k].name);
        EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), m.data[k].begin(), m.data[k].end()))
            << m.specs[k].name << " alignment " << alignment;
        const std::size_t element = std::max<std::size_t>(safetensors::bit_size(m.specs[k].dtype) / 8, 1);
        EXPECT_EQ((8 + n + f.info(m.specs[k].name).data_offsets.first) % element, 0u) << m.specs[k].name;
      }
    }
  }
  // serialize takes the option too.
  EXPECT_EQ(safetensors::serialize(m.views(), kMeta, {.alignment = 4096}).size(),
            fs::file_size(dir / "a4096.safetensors"));
}

// files() joins the directory as given with each file's name: one separator whether or not the
// directory ends in one, and the names are the ones finish() publishes.
TEST(ShardedWriter, FilesJoinTheDirectoryAsGivenWithOneSeparator) {
  test::TempDir dir;
  Model m;
  const std::string plain = dir.path().string();
  for (const std::string& given : {plain, plain + "/"}) {
    ShardedWriter out(given, m.specs, kMeta, {.max_shard_size = 2000});
    const auto files = out.files();
    ASSERT_GE(files.size(), 3u);
    EXPECT_EQ(files.back(), plain + "/model.safetensors.index.json") << given;
    for (const auto& f : files) {
      EXPECT_EQ(f.rfind(plain + "/", 0), 0u) << f;
      EXPECT_EQ(f.find("//"), std::string::npos) << f;
      EXPECT_EQ(f.find('/', plain.size() + 1), std::string::npos) << f;
    }
    for (std::size_t k = 0; k < m.specs.size(); ++k) out.write(m.specs[k].name, m.data[k]);
    out.finish();
    for (const auto& f : files) EXPECT_TRUE(fs::exists(f)) << f;
  }
}

TEST(ShardedWriter, SplitsAsHuggingFaceHubAndReadsBackAsACheckpoint) {
  test::TempDir dir;
  Model m;
  // 70000 bytes alone; the rest in shards of at most 2000 bytes.
  ShardedWriter out(dir.path(), m.specs, kMeta, {.max_shard_size = 2000});
  const auto files = out.files();
  ASSERT_GE(files.size(), 3u);
  EXPECT_EQ(files.back(), dir / "model.safetensors.index.json");
  EXPECT_EQ(fs::path(files.front()).filename().string().substr(0, 14), "model-00001-of");
  EXPECT_EQ(out.total_size(), [&] {
    std::uint64_t n = 0;
    for (const auto& d : m.data) n += d.size();
    return n;
  }());
  for (auto [k, at, len] : m.pieces(500, 1))
    out.write(m.specs[k].name, at, std::span(m.data[k]).subspan(at, len));
  EXPECT_TRUE(listing(dir.path()).empty());
  out.finish();
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(fs::path(f).filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(listing(dir.path()), names);
  safetensors::Checkpoint ckpt(dir / "model.safetensors.index.json");
  EXPECT_EQ(ckpt.metadata().at("total_size"), std::to_string(out.total_size()));
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  EXPECT_EQ(ckpt.shard_count(), files.size() - 1);
  for (std::size_t k = 0; k < m.specs.size(); ++k) {
    auto t = ckpt.get_tensor(m.specs[k].name);
    EXPECT_EQ(t.shape, m.specs[k].shape);
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), m.data[k].begin(), m.data[k].end()))
        << m.specs[k].name;
  }
  EXPECT_EQ(fs::path(ckpt.shard_of("big")).filename().string(), fs::path(files.front()).filename().string())
      << "a tensor over the maximum gets a shard of its own, in the place it comes";
}

TEST(ShardedWriter, SaveShardedWritesOneFileWhenEverythingFitsAndReplacesAnEarlierSet) {
  test::TempDir dir;
  Model m;
  safetensors::save_sharded(dir.path(), m.views(), kMeta, {.max_shard_size = 1000});
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  safetensors::save_sharded(dir.path(), m.views(), kMeta);
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"model.safetensors"});
  safetensors::save_file(dir / "single.safetensors", m.views(), kMeta);
  EXPECT_EQ(test::read_bytes(dir / "model.safetensors"), test::read_bytes(dir / "single.safetensors"));
  // Errors come back through both faces, and nothing is written.
  std::vector<std::uint8_t> three(3);
  auto bad = safetensors::nothrow::save_sharded(
      dir.path(), {{"w", TensorView{Dtype::F32, {1}, std::as_bytes(std::span(three)), {}}}});
  EXPECT_EQ(bad.kind(), ErrorKind::TensorInvalidInfo) << bad.message();
  EXPECT_EQ(kind_of([&] {
              safetensors::save_sharded(dir.path(), m.views(), {}, {.max_shard_size = 10, .prefix = "../x"});
            }),
            ErrorKind::InvalidShardPath);
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"model.safetensors", "single.safetensors"}));
}

/// Every tensor of the checkpoint `index` names, with its bytes.
std::map<std::string, std::vector<std::byte>> contents(const fs::path& index) {
  safetensors::Checkpoint ckpt(index);
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& name : ckpt.keys()) {
    auto t = ckpt.get_tensor(name);
    out.emplace(name, std::vector<std::byte>(t.data.begin(), t.data.end()));
  }
  return out;
}

/// `m`'s tensors with every byte changed: a later generation of the same checkpoint.
Model next_generation(Model m) {
  for (auto& d : m.data)
    for (auto& b : d) b = static_cast<std::byte>(static_cast<unsigned>(b) ^ 0x5a);
  return m;
}

// A save over a checkpoint whose shard count is the same reuses every shard name: the new bytes
// are read back through the index, and no backup of the old shards is left.
TEST(ShardedWriter, ReplacingTheSameShardNamesLeavesTheNewCheckpointAndNoBackup) {
  test::TempDir dir;
  Model old;
  const Model fresh = next_generation(old);
  const safetensors::ShardOptions shards{.max_shard_size = 2000};
  safetensors::save_sharded(dir.path(), old.views(), kMeta, shards);
  const auto names = listing(dir.path());
  safetensors::save_sharded(dir.path(), fresh.views(), kMeta, shards);
  EXPECT_EQ(listing(dir.path()), names);
  const auto got = contents(dir / "model.safetensors.index.json");
  for (std::size_t k = 0; k < fresh.specs.size(); ++k) {
    EXPECT_EQ(got.at(fresh.specs[k].name), fresh.data[k]) << fresh.specs[k].name;
  }
}

// A publish that fails half way (a directory where the third new shard goes; the earlier
// checkpoint's shards have other names) puts the directory back: the earlier checkpoint opens
// with its bytes, and the writer finishes once the way is clear, as the C API's does.
TEST(ShardedWriter, AFailedPublishKeepsTheEarlierCheckpointAndTheWriter) {
  test::TempDir dir;
  Model old;
  const Model fresh = next_generation(old);
  safetensors::save_sharded(dir.path(), old.views(), kMeta, {.max_shard_size = 70000});
  const auto index = dir / "model.safetensors.index.json";
  const auto before = listing(dir.path());
  const auto old_contents = contents(index);
  ShardedWriter out(dir.path(), fresh.specs, kMeta, {.max_shard_size = 500});
  for (std::size_t k = 0; k < fresh.specs.size(); ++k) out.write(fresh.specs[k].name, fresh.data[k]);
  const auto files = out.files();
  ASSERT_GE(files.size(), 4u);
  ASSERT_EQ(std::count(before.begin(), before.end(), fs::path(files[2]).filename().string()), 0);
  fs::create_directory(files[2]);
  auto failed = safetensors::nothrow::finish(out);
  EXPECT_EQ(failed.kind(), ErrorKind::Io) << failed.message();
  EXPECT_NE(failed.message().find("nothing was published"), std::string::npos) << failed.message();
  fs::remove(files[2]);
  std::vector<std::string> now;
  for (const auto& n : listing(dir.path()))
    if (n.rfind(".st-", 0) != 0) now.push_back(n);  // the new shards, staged
  EXPECT_EQ(now, before);
  EXPECT_EQ(contents(index), old_contents);
  out.finish();
  const auto got = contents(index);
  for (std::size_t k = 0; k < fresh.specs.size(); ++k) {
    EXPECT_EQ(got.at(fresh.specs[k].name), fresh.data[k]) << fresh.specs[k].name;
  }
  std::vector<std::string> published;
  for (const auto& f : files) published.push_back(fs::path(f).filename().string());
  std::sort(published.begin(), published.end());
  EXPECT_EQ(listing(dir.path()), published);
}

// A braced list of tensors is written by a loop of its own rather than the range templates
// (which every file including the header would otherwise instantiate for the list's type): the
// same shards, index and bytes as the same tensors as a range, through both faces.
TEST(ShardedWriter, SaveShardedOfABracedListWritesWhatTheRangeWrites) {
  Model m;
  const auto v = m.views();  // sorted by name: the braced lists below keep that order
  test::TempDir from_range, from_list, from_nothrow;
  const safetensors::ShardOptions shards{.max_shard_size = 1000};
  safetensors::save_sharded(from_range.path(), v, kMeta, shards);
  safetensors::save_sharded(from_list.path(),
                            {{"big", v.at("big")},
                             {"embed", v.at("embed")},
                             {"ids", v.at("ids")},
                             {"layers.1.w", v.at("layers.1.w")},
                             {"mask", v.at("mask")},
                             {"none", v.at("none")},
                             {"q", v.at("q")},
                             {"scale", v.at("scale")}},
                            kMeta, shards);
  auto st = safetensors::nothrow::save_sharded(from_nothrow.path(),
                                               {{"big", v.at("big")},
                                                {"embed", v.at("embed")},
                                                {"ids", v.at("ids")},
                                                {"layers.1.w", v.at("layers.1.w")},
                                                {"mask", v.at("mask")},
                                                {"none", v.at("none")},
                                                {"q", v.at("q")},
                                                {"scale", v.at("scale")}},
                                               kMeta, shards);
  ASSERT_TRUE(st.ok()) << st.message();
  const auto files = listing(from_range.path());
  ASSERT_GE(files.size(), 3u);  // shards and the index
  EXPECT_EQ(listing(from_list.path()), files);
  EXPECT_EQ(listing(from_nothrow.path()), files);
  for (const auto& f : files) {
    EXPECT_EQ(test::read_bytes(from_list / f), test::read_bytes(from_range / f)) << f;
    EXPECT_EQ(test::read_bytes(from_nothrow / f), test::read_bytes(from_range / f)) << f;
  }
  // And a list's error names its tensor as the range's does.
  std::vector<std::uint8_t> three(3);
  const TensorView bad{Dtype::F32, {1}, std::as_bytes(std::span(three)), {}};
  auto listed = safetensors::nothrow::save_sharded(from_list.path(), {{"w", bad}});
  auto ranged =
      safetensors::nothrow::save_sharded(from_list.path(), std::map<std::string, TensorView>{{"w", bad}});
  EXPECT_EQ(listed.kind(), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(listed.message(), ranged.message());
}

}  // namespace
