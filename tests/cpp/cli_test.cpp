// The `safetensors` command-line tool, run as a program: output and exit codes on good and bad
// files.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>

#include "program.hpp"

using safetensors::Dtype;
using safetensors::TensorView;

namespace {

using test::has;
using test::quote;

using test::cli;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    for (std::size_t i = 0; i < w_.size(); ++i) w_[i] = static_cast<float>(i);
    safetensors::save_file(
        good_,
        {{"layer.weight", TensorView{Dtype::F32, {2, 3}, std::as_bytes(std::span(w_)), {}}},
         {"layer.bias", TensorView{Dtype::F16, {3}, std::as_bytes(std::span(b_)), {}}}},
        {{"format", "pt"}});
    std::string bad_json = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
    test::write_bytes(bad_, test::raw_file(bad_json, 3));
    std::string lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 548105171\n";
    test::write_bytes(lfs_, std::vector<std::uint8_t>(lfs.begin(), lfs.end()));
  }
  test::TempDir dir_;
  std::filesystem::path good_ = dir_ / "good.safetensors", bad_ = dir_ / "bad.safetensors",
                        lfs_ = dir_ / "lfs.safetensors";
  std::array<float, 6> w_{};
  std::array<std::uint16_t, 3> b_{0x3c00, 0x4000, 0x4200};
};

TEST_F(Cli, HelpVersionAndUsageErrors) {
  auto help = cli({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(has(help.out, "usage:") && has(help.out, "exit codes:")) << help.out;
  EXPECT_EQ(cli({}).code, 2);
  auto unknown = cli({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(has(unknown.err, "unknown command 'frobnicate'")) << unknown.err;
  EXPECT_EQ(cli({"inspect"}).code, 2);
  auto version = cli({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_TRUE(has(version.out, "safetensors ")) << version.out;
}

TEST_F(Cli, EveryCommandTakesHelpAndRefusesUnknownOptions) {
  for (const char* command : {"inspect", "validate", "metadata", "bench", "stats", "reshard"}) {
    auto help = cli({command, "--help"});
    EXPECT_EQ(help.code, 0) << command;
    EXPECT_TRUE(has(help.out, "usage:")) << command << ": " << help.out;
    auto unknown = cli({command, good_.string(), "--frobnicate"});
    EXPECT_EQ(unknown.code, 2) << command;
    EXPECT_TRUE(has(unknown.err, std::string(command) + ": unknown option '--frobnicate'")) << unknown.err;
  }
  // After --set, "--help" is a value, not a request for help.
  auto set = cli({"metadata", good_.string(), "--set", "--help"});
  EXPECT_EQ(set.code, 2);
  EXPECT_TRUE(has(set.err, "--set takes KEY=VALUE")) << set.err;
}

TEST_F(Cli, InspectShowsMetadataTensorsAndTotals) {
  auto r = cli({"inspect", good_.string()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "format: pt")) << r.out;
  EXPECT_TRUE(has(r.out, "tensors (2):")) << r.out;
  EXPECT_TRUE(has(r.out, "layer.weight") && has(r.out, "[2, 3]") && has(r.out, "F16")) << r.out;
  EXPECT_TRUE(has(r.out, "totals: 9 parameters, 30 bytes")) << r.out;
  EXPECT_TRUE(has(r.out, "F32         6 parameters, 24 bytes")) << r.out;
}

TEST_F(Cli, InspectJsonListsEveryTensor) {
  auto r = cli({"inspect", good_.string(), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, R"("metadata":{"format":"pt"})")) << r.out;
  EXPECT_TRUE(
      has(r.out, R"({"name":"layer.weight","dtype":"F32","shape":[2,3],"bytes":24,"data_offsets":[0,24]})"))
      << r.out;
  EXPECT_TRUE(has(r.out, R"("totals":{"tensors":2,"parameters":9,"bytes":30)")) << r.out;
}

TEST_F(Cli, InspectOfABadFileIsTheErrorWithExitCode1) {
  auto r = cli({"inspect", bad_.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "InvalidOffset") && has(r.err, "bad.safetensors")) << r.err;
}

TEST_F(Cli, ValidateReportsEachFileAndFailsIfAnyIsBad) {
  auto ok = cli({"validate", good_.string()});
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok.out, "OK   " + good_.string() + " (2 tensors")) << ok.out;
  auto mixed = cli({"validate", good_.string(), bad_.string(), lfs_.string()});
  EXPECT_EQ(mixed.code, 1);
  EXPECT_TRUE(has(mixed.out, "FAIL " + bad_.string() + ": InvalidOffset:")) << mixed.out;
  EXPECT_TRUE(has(mixed.out, "FAIL " + lfs_.string() + ": HeaderTooLarge:") &&
              has(mixed.out, "git-lfs pointer"))
      << mixed.out;
  EXPECT_TRUE(has(mixed.out, "1 of 3 files valid")) << mixed.out;
  EXPECT_EQ(cli({"validate", "--header-only", good_.string()}).code, 0);
}

TEST_F(Cli, ValidateChecksEveryShardOfAnIndex) {
  std::filesystem::copy_file(good_, dir_ / "part-1.safetensors");
  std::ofstream(dir_ / "m.index.json")
      << R"({"weight_map":{"layer.weight":"part-1.safetensors","layer.bias":"part-1.safetensors"}})";
  auto ok = cli({"validate", (dir_ / "m.index.json").string()});
  EXPECT_EQ(ok.code, 0) << ok.out;
  std::ofstream(dir_ / "m.index.json")
      << R"({"weight_map":{"layer.weight":"part-1.safetensors","gone":"part-2.safetensors"}})";
  auto bad = cli({"validate", (dir_ / "m.index.json").string()});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.out, "ShardMissing") && has(bad.out, "part-2.safetensors")) << bad.out;
  auto inspect = cli({"inspect", (dir_ / "m.index.json").string()});
  EXPECT_EQ(inspect.code, 1) << inspect.out;
}

// The library reads any `*.json` path, in any case, as an index; every command must agree with
// it rather than read `m.index.JSON` as a safetensors file (HeaderTooLarge from its `{"weig`).
TEST_F(Cli, AnIndexNamedInUpperCaseIsAnIndexForEveryCommand) {
  std::filesystem::copy_file(good_, dir_ / "part-1.safetensors");
  auto index = dir_ / "m.index.JSON";
  std::ofstream(index)
      << R"({"weight_map":{"layer.weight":"part-1.safetensors","layer.bias":"part-1.safetensors"}})";
  auto inspect = cli({"inspect", index.string()});
  EXPECT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_TRUE(has(inspect.out, "in 1 shards") && has(inspect.out, "part-1.safetensors")) << inspect.out;
  auto json = cli({"inspect", index.string(), "--json"});
  EXPECT_EQ(json.code, 0) << json.err;
  EXPECT_TRUE(has(json.out, R"("shard":"part-1.safetensors")")) << json.out;
  auto validate = cli({"validate", index.string()});
  EXPECT_EQ(validate.code, 0) << validate.out;
  EXPECT_TRUE(has(validate.out, "OK   " + index.string() + " (2 tensors")) << validate.out;
  auto edit = cli({"metadata", index.string(), "--set", "a=b"});
  EXPECT_EQ(edit.code, 2) << edit.err;
  EXPECT_TRUE(has(edit.err, "not an index")) << edit.err;
}

TEST_F(Cli, MetadataPrintsAndRewritesWithTheDataUnchanged) {
  auto printed = cli({"metadata", good_.string()});
  EXPECT_EQ(printed.code, 0);
  EXPECT_EQ(printed.out, "format: pt\n");
  auto before = safetensors::SafeOpen(good_).get_tensor("layer.weight");
  std::vector<std::byte> old_bytes(before.data.begin(), before.data.end());
  auto set =
      cli({"metadata", good_.string(), "--set", "source=cli", "--set", "note=a=b", "--delete", "format"});
  EXPECT_EQ(set.code, 0) << set.err;
  safetensors::SafeOpen after(good_);
  EXPECT_EQ(after.metadata(), (std::map<std::string, std::string>{{"note", "a=b"}, {"source", "cli"}}));
  auto w = after.get_tensor("layer.weight");
  EXPECT_TRUE(std::equal(w.data.begin(), w.data.end(), old_bytes.begin(), old_bytes.end()));
  EXPECT_EQ(after.size(), 2u);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path()))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"bad.safetensors", "good.safetensors", "lfs.safetensors"}));
  EXPECT_EQ(cli({"metadata", good_.string(), "--set", "novalue"}).code, 2);
  EXPECT_EQ(cli({"metadata", bad_.string(), "--set", "k=v"}).code, 1);
}

TEST_F(Cli, BenchPrintsFigures) {
  auto r = cli({"bench", good_.string(), "--runs", "2"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "open (keys + every view)") && has(r.out, "plain read() of the file")) << r.out;
}

TEST_F(Cli, BenchOfABadFileOrBadRunsIsAnErrorNotACrash) {
  auto bad = cli({"bench", bad_.string()});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.err, "InvalidOffset")) << bad.err;
  auto missing = cli({"bench", (dir_ / "missing.safetensors").string()});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(has(missing.err, "Io")) << missing.err;
  for (const char* runs : {"abc", "0", "-3", "7x"}) {
    auto r = cli({"bench", good_.string(), "--runs", runs});
    EXPECT_EQ(r.code, 2) << runs;
    EXPECT_TRUE(has(r.err, "--runs takes a number")) << r.err;
  }
  EXPECT_EQ(cli({"bench", good_.string(), "--runs"}).code, 2);
}

// ---- issue 18: metadata rewrites keep mode and owner, lock, survive signals; output escaped --

std::vector<std::string> hidden_files(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind('.', 0) == 0) out.push_back(e.path().filename().string());
  }
  return out;
}

/// Starts the tool with output discarded; returns its pid.
pid_t spawn_cli(const std::vector<std::string>& args) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    std::vector<char*> argv{const_cast<char*>(SAFETENSORS_CLI)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(SAFETENSORS_CLI, argv.data());
    ::_exit(127);
  }
  return pid;
}

/// A file big enough that a rewrite takes a while: 32 MiB of floats.
void write_big(const std::filesystem::path& path) {
  std::vector<float> big(8u << 20);
  for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<float>(i);
  safetensors::save_file(path,
                         {{"big", TensorView{Dtype::F32, {big.size()}, std::as_bytes(std::span(big)), {}}}},
                         {{"format", "pt"}}, {.sync = false});
}

TEST_F(Cli, MetadataRewriteKeepsTheFilesModeAndOwner) {
  for (auto mode :
       {std::filesystem::perms(0600), std::filesystem::perms(0444), std::filesystem::perms(0640)}) {
    std::filesystem::permissions(good_, mode);
    bool chowned = ::geteuid() == 0 && ::chown(good_.c_str(), 4242, 4343) == 0;
    auto r = cli({"metadata", good_.string(), "--set", "k=v"});
    EXPECT_EQ(r.code, 0) << r.err;
    struct stat st {};
    ASSERT_EQ(::stat(good_.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, static_cast<unsigned>(mode)) << std::oct << static_cast<unsigned>(mode);
    if (chowned) {
      EXPECT_EQ(st.st_uid, 4242u);
      EXPECT_EQ(st.st_gid, 4343u);
    }
    EXPECT_EQ(safetensors::SafeOpen(good_).metadata().at("k"), "v");
    EXPECT_TRUE(hidden_files(dir_.path()).empty());
  }
}

// A user who may not keep the file's owner (or group) gets the rewrite as their own file: its
// setuid (setgid) bit must then go, not make the rewrite set-id to that user.
TEST_F(Cli, MetadataRewriteByAnotherUserDropsSetIdBits) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  std::filesystem::permissions(dir_.path(), std::filesystem::perms(0777));
  ASSERT_EQ(::chown(good_.c_str(), 4242, 4242), 0);
  ASSERT_EQ(::chmod(good_.c_str(), 06644), 0);
  // The other user runs a copy of the tool inside the test's world-readable directory: the build
  // tree may sit in a directory only root can enter (a 0700 mktemp directory, say).
  auto tool = dir_ / "safetensors-tool-copy";
  std::filesystem::copy_file(SAFETENSORS_CLI, tool);
  std::filesystem::permissions(tool, std::filesystem::perms(0755));
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    if (::setgroups(0, nullptr) != 0 || ::setgid(4343) != 0 || ::setuid(4343) != 0) ::_exit(126);
    ::execl(tool.c_str(), tool.c_str(), "metadata", good_.c_str(), "--set", "k=v", nullptr);
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  struct stat st {};
  ASSERT_EQ(::stat(good_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4343u);
  EXPECT_EQ(st.st_mode & 07777, 0644u) << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(safetensors::SafeOpen(good_).metadata().at("k"), "v");
}

// A file whose ACL gives its group nothing while the mask allows rw (its mode then reads 0660)
// must keep that ACL through a rewrite: the mode alone would give the group rw. Other extended
// attributes stay too, as the library's writer keeps them.
TEST_F(Cli, MetadataRewriteKeepsTheFilesAclAndExtendedAttributes) {
  std::filesystem::permissions(good_, std::filesystem::perms(0640));
  struct Entry {
    std::uint16_t tag, perm;
    std::uint32_t id;
  };
  // user:: rw-, user:4242 rw-, group:: ---, mask:: rw-, other:: --- (the kernel's xattr layout).
  const Entry entries[] = {{0x01, 6, 0xffffffff},
                           {0x02, 6, 4242},
                           {0x04, 0, 0xffffffff},
                           {0x10, 6, 0xffffffff},
                           {0x20, 0, 0xffffffff}};
  std::string acl(4, '\0');
  acl[0] = 2;  // version
  for (const auto& e : entries) acl.append(reinterpret_cast<const char*>(&e), sizeof e);
  if (::setxattr(good_.c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0) != 0 ||
      ::setxattr(good_.c_str(), "user.origin", "kept", 4, 0) != 0) {
    GTEST_SKIP() << "no ACLs or user xattrs here: " << std::strerror(errno);
  }
  auto read_xattr = [&](const char* name) {
    std::string out(256, '\0');
    const ssize_t n = ::getxattr(good_.c_str(), name, out.data(), out.size());
    out.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return out;
  };
  const std::string before = read_xattr("system.posix_acl_access");
  auto r = cli({"metadata", good_.string(), "--set", "k=v"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(safetensors::SafeOpen(good_).metadata().at("k"), "v");
  EXPECT_EQ(read_xattr("system.posix_acl_access"), before)
      << "the ACL was lost: the group gets the mask's rw";
  EXPECT_EQ(read_xattr("user.origin"), "kept");
  EXPECT_TRUE(hidden_files(dir_.path()).empty());
}

TEST_F(Cli, MetadataThroughASymlinkEditsTheTargetAndKeepsTheLink) {
  auto link = dir_ / "link.safetensors";
  std::filesystem::create_symlink(good_, link);
  auto r = cli({"metadata", link.string(), "--set", "via=link"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(safetensors::SafeOpen(good_).metadata().at("via"), "link");
}

// The staged file's name is predictable (`.<name>.metadata-<pid>`): something already there,
// a symlink planted by another user of the directory or a stale file, must not be written
// through (the writer follows links) nor replaced; the rewrite stages under another name.
TEST_F(Cli, MetadataRewriteNeverWritesThroughWhatSitsAtTheStagedName) {
  auto victim = dir_ / "victim.txt";
  std::ofstream(victim) << "precious";
  std::filesystem::permissions(victim, std::filesystem::perms(0600));
  std::filesystem::permissions(good_, std::filesystem::perms(0644));
  // `exec` keeps the shell's pid, so `$$` is the pid the tool stages under.
  std::string cmd = "cd " + quote(dir_.path().string()) +
                    " && ln -s victim.txt .good.safetensors.metadata-$$ && exec " + quote(SAFETENSORS_CLI) +
                    " metadata good.safetensors --set k=v >/dev/null 2>&1";
  int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(test::read_bytes(victim).size(), 8u) << "the link's target was overwritten";
  struct stat st {};
  ASSERT_EQ(::stat(victim.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "the link's target had its mode changed";
  EXPECT_FALSE(std::filesystem::is_symlink(good_)) << "the link was renamed over the file";
  EXPECT_EQ(safetensors::SafeOpen(good_).metadata().at("k"), "v");
  auto left = hidden_files(dir_.path());
  ASSERT_EQ(left.size(), 1u);  // the planted link, untouched
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / left[0])) << left[0];
}

/// `swap.safetensors` in `dir`, replaced again and again by a small file (a copy of `good`) and a
/// 32 MiB one, each time through a fresh link and a rename (as every safetensors writer
/// replaces a file), while `runs` runs the tool on it.
std::vector<test::Run> run_while_replaced(
    const test::TempDir& dir, const std::filesystem::path& good,
    const std::function<std::vector<test::Run>(const std::filesystem::path&)>& runs) {
  auto small = dir / "small.safetensors", big = dir / "big.safetensors", path = dir / "swap.safetensors";
  std::filesystem::copy_file(good, small);
  write_big(big);
  std::filesystem::copy_file(small, path);
  pid_t swapper = ::fork();
  if (swapper == 0) {
    auto next = dir / "next.safetensors";
    for (unsigned i = 0;; ++i) {
      ::link((i % 2 ? small : big).c_str(), next.c_str());
      ::rename(next.c_str(), path.c_str());
    }
  }
  auto out = runs(path);
  ::kill(swapper, SIGKILL);
  ::waitpid(swapper, nullptr, 0);
  return out;
}

// `bench` sized its read() buffer once and let each read measure the file again: a file that
// another process replaced by a larger one meanwhile (as every safetensors writer does) was read
// past the buffer's end, into whatever memory followed (or failed as `Internal`). Each run now
// reads exactly the validated length, and a file that changed is an `Io` error.
TEST_F(Cli, BenchOfAFileReplacedMeanwhileNeverReadsPastItsBuffer) {
  auto runs = run_while_replaced(dir_, good_, [](const std::filesystem::path& path) {
    std::vector<test::Run> out;
    for (int attempt = 0; attempt < 20; ++attempt)
      out.push_back(cli({"bench", path.string(), "--runs", "20"}));
    return out;
  });
  bool changed = false;
  for (const auto& r : runs) {
    EXPECT_TRUE(r.code == 0 || r.code == 1) << r.code << " " << r.err;
    if (r.code == 1) {
      EXPECT_TRUE(has(r.err, "safetensors: Io:")) << r.err;
      changed = true;
    }
  }
  if (!changed) GTEST_SKIP() << "no run saw the file change";
}

// `validate` printed the size of whatever the path named after the check, not of the file it
// checked: with the file replaced meanwhile, an OK line paired one file's tensor count with the
// other's size (or the path's removal turned a valid file into FAIL).
TEST_F(Cli, ValidateReportsTheSizeOfTheFileItChecked) {
  auto runs = run_while_replaced(dir_, good_, [](const std::filesystem::path& path) {
    std::vector<test::Run> out;
    for (int attempt = 0; attempt < 40; ++attempt) out.push_back(cli({"validate", path.string()}));
    return out;
  });
  auto small_line =
      "(2 tensors, " + std::to_string(std::filesystem::file_size(dir_ / "small.safetensors")) + " bytes)";
  auto big_size = std::to_string(std::filesystem::file_size(dir_ / "big.safetensors"));
  std::string big_line = "(1 tensors, ";
  for (int i = static_cast<int>(big_size.size()) - 3; i > 0; i -= 3)
    big_size.insert(static_cast<std::size_t>(i), ",");
  big_line += big_size + " bytes)";
  for (const auto& r : runs) {
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_TRUE(has(r.out, small_line) || has(r.out, big_line)) << r.out;
  }
}

TEST_F(Cli, ConcurrentMetadataSetsAllLand) {
  auto big = dir_ / "big.safetensors";
  write_big(big);
  constexpr int kRuns = 6;
  std::vector<pid_t> pids;
  for (int i = 0; i < kRuns; ++i) {
    pids.push_back(
        spawn_cli({"metadata", big.string(), "--set", "k" + std::to_string(i) + "=" + std::to_string(i)}));
  }
  for (auto pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  auto meta = safetensors::SafeOpen(big).metadata();
  for (int i = 0; i < kRuns; ++i)
    EXPECT_EQ(meta.count("k" + std::to_string(i)), 1u) << "update " << i << " was lost";
  EXPECT_TRUE(hidden_files(dir_.path()).empty());
}

TEST_F(Cli, ASignalMidRewriteLeavesNoTemporaryFile) {
  auto big = dir_ / "big.safetensors";
  write_big(big);
  bool interrupted = false;
  for (int sig : {SIGTERM, SIGINT}) {
    pid_t pid = spawn_cli({"metadata", big.string(), "--set", "k=v"});
    bool seen = false;
    for (int i = 0; i < 200000 && !seen; ++i) {
      seen = !hidden_files(dir_.path()).empty();
      if (!seen) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) break;  // finished before we saw it
      }
    }
    if (seen) {
      ::kill(pid, sig);
      interrupted = true;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_EQ(hidden_files(dir_.path()), std::vector<std::string>{}) << "signal " << sig;
    safetensors::SafeOpen f(big);  // whole: the old file or the rewrite
    EXPECT_EQ(f.get_tensor("big").data.size(), 32u << 20);
    if (seen && WIFSIGNALED(status)) {
      EXPECT_EQ(WTERMSIG(status), sig) << "the signal still ends the process";
    }
  }
  if (!interrupted) GTEST_SKIP() << "every rewrite finished before it could be interrupted";
}

TEST_F(Cli, AFailedRenameIsAnIoErrorAndLeavesNothingBehind) {
  if (std::system(("chattr +i " + quote(good_.string()) + " 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "chattr +i is not available here";
  }
  auto r = cli({"metadata", good_.string(), "--set", "k=v"});
  std::system(("chattr -i " + quote(good_.string())).c_str());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "safetensors: Io: cannot replace")) << r.err;
  EXPECT_TRUE(hidden_files(dir_.path()).empty());
  EXPECT_EQ(safetensors::SafeOpen(good_).metadata().count("k"), 0u);
}

TEST_F(Cli, NamesMetadataAndPathsArePrintedEscaped) {
  // Names that try to erase the line and forge an OK, a right-to-left override, a carriage
  // return in metadata.
  std::string json = R"({"__metadata__":{"k\r":"v\u001b[31m"},)"
                     R"("a\u001b[2K\rOK   forged":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                     R"("b\u202e\u007f":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  auto evil = dir_ / "evil\x1b[1m\n.safetensors";
  test::write_bytes(evil, test::raw_file(json, 2));
  std::string bad_json = R"({"x\u001b]0;title\u0007":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  auto bad = dir_ / "bad2.safetensors";
  test::write_bytes(bad, test::raw_file(bad_json, 3));
  auto clean = [](const std::string& text) {
    for (char c : text) {
      if ((c >= 0 && c < 0x20 && c != '\n') || c == 0x7f) return false;
    }
    return text.find("\u202e") == std::string::npos;
  };
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"inspect", evil.string()},
                                             {"inspect", evil.string(), "--json"},
                                             {"validate", evil.string(), bad.string()},
                                             {"metadata", evil.string()},
                                             {"inspect", bad.string()},
                                             {"metadata", bad.string(), "--set", "a\x1b=b"},
                                             {"bench", evil.string(), "--runs", "1"},
                                             {"bench", bad.string()},
                                             {"inspect", evil.string(), "--frob\rnicate"}}) {
    auto r = cli(args);
    EXPECT_TRUE(clean(r.out)) << args[0] << ": " << r.out;
    EXPECT_TRUE(clean(r.err)) << args[0] << ": " << r.err;
  }
  auto inspect = cli({"inspect", evil.string()});
  EXPECT_TRUE(has(inspect.out, "a\\x1b[2K\\rOK   forged")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "b\\u{202e}\\x7f")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "k\\r: v\\x1b[31m")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "evil\\x1b[1m\\n.safetensors")) << inspect.out;
  auto json_out = cli({"inspect", evil.string(), "--json"});
  EXPECT_TRUE(has(json_out.out, R"("name":"a\u001b[2K\rOK   forged")")) << json_out.out;
  EXPECT_TRUE(has(json_out.out, R"("name":"b\u202e\u007f")")) << json_out.out;
  auto validate = cli({"validate", bad.string()});
  EXPECT_TRUE(has(validate.out, "x\\x1b]0;title\\x07")) << validate.out;
}

TEST_F(Cli, InspectJsonWritesEachByteOfAPathThatIsNotUtf8AsAReplacementCharacter) {
  // A path may hold any bytes; JSON cannot. Each byte that is not UTF-8 becomes `\ufffd`, and
  // the valid text around it (a real U+00E9 and a control) stays as it was.
  auto path = dir_ / std::filesystem::path("caf\xc3\xa9-\xe2\x82-\xff\x1f.safetensors");
  std::filesystem::copy_file(good_, path);
  auto r = cli({"inspect", path.string(), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "caf\xc3\xa9-\\ufffd\\ufffd-\\ufffd\\u001f.safetensors\"")) << r.out;
}

TEST_F(Cli, InspectCapsColumnWidthsForHugeNames) {
  std::string json =
      "{\"" + std::string(100'000, 'n') + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}";
  for (int i = 0; i < 100; ++i) {
    json += ",\"t" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" +
            std::to_string(i + 1) + "," + std::to_string(i + 2) + "]}";
  }
  json += "}";
  auto path = dir_ / "wide.safetensors";
  test::write_bytes(path, test::raw_file(json, 101));
  auto r = cli({"inspect", path.string()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_LT(r.out.size(), 100'000u + 100 * 200 + 2'000) << "rows are padded to the longest name";
  EXPECT_TRUE(has(r.out, std::string(100'000, 'n'))) << "the long name is still printed whole";
}

TEST_F(Cli, AFailedWriteToStdoutIsAnIoErrorWithExitCode1) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  test::TempDir tmp;
  for (const auto& args :
       std::vector<std::string>{"inspect " + quote(good_.string()), "inspect --json " + quote(good_.string()),
                                "validate " + quote(good_.string()), "metadata " + quote(good_.string())}) {
    std::string cmd = quote(SAFETENSORS_CLI) + " " + args + " >/dev/full 2>" + quote((tmp / "err").string());
    int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << args;
    auto err = test::read_bytes(tmp / "err");
    EXPECT_TRUE(has(std::string(err.begin(), err.end()), "safetensors: Io: cannot write to standard output"))
        << args;
  }
}

// Issue 16: checkpoints as they exist in the wild, reported by validate only when asked for.
TEST(CliQuirks, ValidateReportsMissingTensorsAndTrailingBytesOnlyWhenAllowed) {
  test::TempDir dir;
  auto a = test::raw_file(R"({"w0":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2);
  a.push_back(0);
  a.push_back(0);
  a.push_back(0);
  test::write_bytes(dir / "a.safetensors", a);
  test::write_bytes(dir / "b.safetensors",
                    test::raw_file(R"({"w2":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2));
  std::ofstream(dir / "m.index.json")
      << R"({"weight_map":{"w0":"a.safetensors","w1":"a.safetensors","w2":"b.safetensors"}})";
  const auto index = (dir / "m.index.json").string();
  auto strict = cli({"validate", index});
  EXPECT_EQ(strict.code, 1) << strict.out;
  auto only_lenient = cli({"validate", "--lenient", index});
  EXPECT_EQ(only_lenient.code, 1) << "trailing bytes still refused: " << only_lenient.out;
  EXPECT_TRUE(has(only_lenient.out + only_lenient.err, "MetadataIncompleteBuffer")) << only_lenient.out;
  auto both = cli({"validate", "--lenient", "--allow-trailing-bytes", index});
  EXPECT_EQ(both.code, 0) << both.out << both.err;
  EXPECT_TRUE(has(both.out, "(2 tensors,")) << both.out;
  EXPECT_TRUE(has(both.out, "missing: tensor `w1`")) << both.out;
  EXPECT_TRUE(has(both.out, "a.safetensors has 3 bytes after its last tensor")) << both.out;
  auto file = cli({"validate", "--allow-trailing-bytes", (dir / "a.safetensors").string()});
  EXPECT_EQ(file.code, 0) << file.out << file.err;
  EXPECT_TRUE(has(file.out, "3 bytes after its last tensor")) << file.out;
  EXPECT_EQ(cli({"validate", (dir / "a.safetensors").string()}).code, 1);
}

// ---- one URL rule for every command ----------------------------------------------------------

/// A directory holding `http:/127.0.0.1:9/m.safetensors`: the local file the URL
/// `http://127.0.0.1:9/m.safetensors` names once its `//` is folded (std::filesystem's normal
/// form, or the kernel's path lookup). Every command runs in that directory, so that a URL
/// mistaken for a path would reach the look-alike.
class CliUrl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(lookalike_.parent_path());
    std::array<float, 2> v{1, 2};
    safetensors::save_file(
        lookalike_, {{"lookalike_tensor", TensorView{Dtype::F32, {2}, std::as_bytes(std::span(v)), {}}}},
        {{"lookalike_key", "lookalike_value"}});
    before_ = test::read_bytes(lookalike_);
  }

  /// The tool with `args`, run in the directory.
  test::Run here(const std::vector<std::string>& args) {
    std::vector<std::string> command{"sh", "-c", "cd \"$0\" && exec \"$@\"", dir_.path().string(),
                                     SAFETENSORS_CLI};
    command.insert(command.end(), args.begin(), args.end());
    return test::run(command);
  }

  /// The look-alike file, and the folder it is in, exactly as they were.
  void expect_untouched(const std::string& what) {
    EXPECT_EQ(test::read_bytes(lookalike_), before_) << what << ": the look-alike was rewritten";
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(lookalike_.parent_path()))
      names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"m.safetensors"}) << what << ": something was made beside it";
  }

  /// Whether `r` shows anything of the look-alike (it was read).
  static bool read_lookalike(const test::Run& r) {
    return has(r.out + r.err, "lookalike_tensor") || has(r.out + r.err, "lookalike_value");
  }

  test::TempDir dir_;
  std::filesystem::path lookalike_ = dir_ / "http:" / "127.0.0.1:9" / "m.safetensors";
  std::vector<std::uint8_t> before_;
  const std::string url_ = "http://127.0.0.1:9/m.safetensors";
};

TEST_F(CliUrl, CommandsThatActOnLocalFilesRefuseAUrlAndTouchNothing) {
  for (const std::string& url : {url_, std::string("HTTP://127.0.0.1:9/m.safetensors")}) {
    const std::vector<std::vector<std::string>> calls{
        {"metadata", url, "--set", "k=v"},
        {"metadata", url, "--delete", "lookalike_key"},
        {"metadata", url, "--set", "k=v", "--json"},
        {"bench", url, "--runs", "1"},
        {"reshard", url, "out"},
        {"reshard", "http:/127.0.0.1:9/m.safetensors", "http://127.0.0.1:9/out"},
    };
    for (const auto& args : calls) {
      auto r = here(args);
      const std::string what = args[0] + " " + args[1] + " " + args[2];
      EXPECT_EQ(r.code, 2) << what << ": " << r.out << r.err;
      EXPECT_TRUE(has(r.err, "'http://...' is a URL")) << what << ": " << r.err;
      EXPECT_FALSE(has(r.err, "127.0.0.1")) << what << ": the URL is not repeated: " << r.err;
      EXPECT_FALSE(read_lookalike(r)) << what << ": " << r.out << r.err;
      expect_untouched(what);
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out")) << "reshard made its output before refusing";
  auto json = here({"metadata", url_, "--set", "k=v", "--json"});
  EXPECT_TRUE(has(json.out, R"("kind":"Usage")")) << json.out;
  auto s3 = here({"metadata", "s3://bucket/m.safetensors", "--set", "k=v"});
  EXPECT_EQ(s3.code, 2) << s3.err;
  EXPECT_TRUE(has(s3.err, "'s3://...' is a URL")) << s3.err;
}

TEST_F(CliUrl, CommandsThatReadOpenAUrlRemotelyNeverTheLocalLookalike) {
  // Nothing listens on port 9 (and builds without remote support say so): every command fails
  // with Io, and shows nothing of the look-alike.
  const std::vector<std::vector<std::string>> calls{
      {"inspect", url_},
      {"inspect", url_, "--json"},
      {"validate", url_},
      {"validate", "--header-only", url_},
      {"stats", url_},
      {"metadata", url_},
      {"metadata", url_, "--json"},
  };
  for (const auto& args : calls) {
    auto r = here(args);
    const std::string what = args[0] + " " + args[1];
    EXPECT_EQ(r.code, 1) << what << ": " << r.out << r.err;
    EXPECT_TRUE(has(r.out + r.err, "Io")) << what << ": " << r.out << r.err;
    EXPECT_FALSE(read_lookalike(r)) << what << " read the local look-alike: " << r.out << r.err;
    expect_untouched(what);
  }
}

TEST_F(CliUrl, APathThatOnlyLooksLikeAUrlIsALocalPath) {
  // The rule reads the argument as typed: one slash after the scheme is a path, and so is
  // `./http://...` (a folder `http:` and an empty segment), which the kernel folds to the same
  // file.
  for (const std::string& path :
       {std::string("http:/127.0.0.1:9/m.safetensors"), std::string("./http://127.0.0.1:9/m.safetensors")}) {
    auto r = here({"inspect", path});
    EXPECT_EQ(r.code, 0) << path << ": " << r.err;
    EXPECT_TRUE(has(r.out, "lookalike_tensor")) << r.out;
    auto printed = here({"metadata", path});
    EXPECT_EQ(printed.code, 0) << printed.err;
    EXPECT_EQ(printed.out, "lookalike_key: lookalike_value\n");
  }
  auto set = here({"metadata", "http:/127.0.0.1:9/m.safetensors", "--set", "k=v"});
  EXPECT_EQ(set.code, 0) << set.err;
  EXPECT_EQ(safetensors::SafeOpen(lookalike_).metadata(),
            (std::map<std::string, std::string>{{"k", "v"}, {"lookalike_key", "lookalike_value"}}));
  auto bench = here({"bench", "./http://127.0.0.1:9/m.safetensors", "--runs", "1"});
  EXPECT_EQ(bench.code, 0) << bench.err;
}

TEST_F(CliUrl, AnIndexIsToldByTheTextsLastSegmentForPathsAndUrls) {
  auto r = here({"metadata", "http://127.0.0.1:9/model.INDEX.json", "--set", "k=v"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "not an index")) << r.err;
  auto dotfile = here({"metadata", "http:/127.0.0.1:9/.json"});
  EXPECT_EQ(dotfile.code, 1) << "a file named .json has no extension, so it is no index: " << dotfile.err;
  EXPECT_FALSE(has(dotfile.err, "not an index")) << dotfile.err;
}

}  // namespace
