// The `safetensors` tool on sharded checkpoints: each shard opened once (a path opened twice
// may be two files, one put there in between), and shards named as the index names them.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <string>
#include <vector>

#include "program.hpp"

using safetensors::Dtype;
using safetensors::TensorView;

namespace {

using test::cli;
using test::has;

/// Runs the tool with `args` and tests/cpp/open_hook.cpp preloaded, given `hook_env`
/// (SAFETENSORS_OPEN_SWAP=...). Returns the paths it opened, in order.
std::vector<std::string> run_hooked(const std::vector<std::string>& args, test::Run* result,
                                    const std::string& hook_env = "SAFETENSORS_OPEN_SWAP=") {
  test::TempDir tmp;
  auto log = tmp / "opens";
  // ASan insists on coming first among the libraries; the hook neither allocates nor frees.
  std::vector<std::string> command{"env",
                                   std::string("LD_PRELOAD=") + SAFETENSORS_OPEN_HOOK_LIBRARY,
                                   "SAFETENSORS_OPEN_LOG=" + log.string(),
                                   hook_env,
                                   "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0",
                                   SAFETENSORS_CLI};
  command.insert(command.end(), args.begin(), args.end());
  *result = test::run(command);
  std::ifstream in(log);
  std::vector<std::string> opened;
  for (std::string line; std::getline(in, line);) opened.push_back(line);
  return opened;
}

std::size_t count_ending(const std::vector<std::string>& paths, const std::string& suffix) {
  return static_cast<std::size_t>(std::count_if(paths.begin(), paths.end(), [&](const std::string& p) {
    return p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0;
  }));
}

class CliIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two shards of one name in two folders, as some exports lay them out.
    for (const char* part : {"a", "b"}) {
      std::filesystem::create_directories(dir_ / part);
      std::array<float, 2> w{1, 2};
      safetensors::save_file(
          dir_ / part / "model.safetensors",
          {{std::string("w_") + part, TensorView{Dtype::F32, {2}, std::as_bytes(std::span(w)), {}}}});
    }
    std::ofstream(index_) << R"({"weight_map":{"w_a":"a/model.safetensors","w_b":"b/model.safetensors"}})";
  }
  test::TempDir dir_;
  std::filesystem::path index_ = dir_ / "model.safetensors.index.json";
};

// Through an index, a command that reads only headers opens each shard exactly as often as it
// opens that file given alone: through the checkpoint, never a second time of its own.
TEST_F(CliIndex, ReadingHeadersOpensEachShardAsOftenAsTheFileAlone) {
  const std::string shard_a = (dir_ / "a" / "model.safetensors").string();
  for (const auto& args : std::vector<std::vector<std::string>>{{"validate", "--header-only"},
                                                                {"validate", "--header-only", "--lenient"},
                                                                {"inspect"},
                                                                {"stats"}}) {
    auto with = [&](const std::string& path) {
      auto a = args;
      a.push_back(path);
      return a;
    };
    test::Run alone, indexed;
    std::size_t opens_alone = count_ending(run_hooked(with(shard_a), &alone), "/a/model.safetensors");
    ASSERT_EQ(alone.code, 0) << args[0] << ": " << alone.out << alone.err;
    ASSERT_GE(opens_alone, 1u) << "the open hook saw nothing: " << alone.err;
    auto opened = run_hooked(with(index_.string()), &indexed);
    ASSERT_EQ(indexed.code, 0) << args[0] << ": " << indexed.out << indexed.err;
    EXPECT_EQ(count_ending(opened, "/a/model.safetensors"), opens_alone) << args[0] << " " << args.back();
    EXPECT_EQ(count_ending(opened, "/b/model.safetensors"), opens_alone) << args[0] << " " << args.back();
  }
}

// validate reads the data of the very shard it checked against the index: a shard replaced
// after the check (here, renamed over just before the shard's second open) is an error, never
// "OK" for bytes of a file the index check never saw.
TEST_F(CliIndex, ValidateNeverReadsAShardOtherThanTheOneItChecked) {
  // The replacement is a valid file holding the same tensor name, with other contents.
  std::array<std::uint8_t, 8> other{};
  auto replacement = dir_ / "replacement.safetensors";
  safetensors::save_file(replacement,
                         {{"w_a", TensorView{Dtype::U8, {8}, std::as_bytes(std::span(other)), {}}}});
  for (const char* mode : {"--strict", "--lenient"}) {
    std::filesystem::copy_file(replacement, dir_ / "r.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    std::vector<std::string> args{"validate", index_.string()};
    if (std::string(mode) == "--lenient") args.insert(args.begin() + 1, mode);
    test::Run r;
    auto opened = run_hooked(
        args, &r, "SAFETENSORS_OPEN_SWAP=/a/model.safetensors|2|" + (dir_ / "r.safetensors").string());
    ASSERT_FALSE(std::filesystem::exists(dir_ / "r.safetensors"))
        << "the swap did not happen: " << opened.size() << " opens";
    EXPECT_EQ(r.code, 1) << mode << ": " << r.out << r.err;
    EXPECT_TRUE(has(r.out, "FAIL " + index_.string() + ": Io: ") && has(r.out, "replaced"))
        << mode << ": " << r.out;
    // Put the shard back for the next round.
    std::array<float, 2> w{1, 2};
    safetensors::save_file(dir_ / "a" / "model.safetensors",
                           {{"w_a", TensorView{Dtype::F32, {2}, std::as_bytes(std::span(w)), {}}}});
  }
}

TEST_F(CliIndex, ValidateReadsEveryShardItChecked) {
  auto r = cli({"validate", index_.string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  auto a = std::filesystem::file_size(dir_ / "a" / "model.safetensors");
  auto b = std::filesystem::file_size(dir_ / "b" / "model.safetensors");
  EXPECT_TRUE(has(r.out, "(2 tensors, " + std::to_string(a + b) + " bytes)")) << r.out;
  // A shard whose data is cut short fails, as a single file would.
  auto bytes = test::read_bytes(dir_ / "b" / "model.safetensors");
  bytes.pop_back();
  test::write_bytes(dir_ / "b" / "model.safetensors", bytes);
  auto cut = cli({"validate", index_.string()});
  EXPECT_EQ(cut.code, 1) << cut.out;
  EXPECT_TRUE(has(cut.out, "FAIL ")) << cut.out;
}

TEST_F(CliIndex, InspectNamesShardsRelativeToTheIndex) {
  auto r = cli({"inspect", index_.string()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "  a/model.safetensors\n") && has(r.out, "  b/model.safetensors\n")) << r.out;
  auto json = cli({"inspect", index_.string(), "--json"});
  EXPECT_TRUE(has(json.out, R"("shard":"a/model.safetensors")") &&
              has(json.out, R"("shard":"b/model.safetensors")"))
      << json.out;
  // The same from another working directory, with the index named relatively.
  auto relative = test::run({"sh", "-c",
                             "cd " + test::quote(dir_.path().string()) + " && " +
                                 test::quote(SAFETENSORS_CLI) + " inspect model.safetensors.index.json"});
  EXPECT_EQ(relative.code, 0) << relative.err;
  EXPECT_TRUE(has(relative.out, "  a/model.safetensors\n")) << relative.out;
}

}  // namespace
