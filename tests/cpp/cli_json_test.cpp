// The `safetensors` tool's contract with scripts: --json on every command, one JSON document on
// stdout whatever happens (an error included), a wrong command line answered with that
// command's own usage, and each failure on one line.
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

/// Whether `text` is exactly one JSON document, as Python's json module reads it.
::testing::AssertionResult is_one_json_document(const std::string& text) {
  test::TempDir tmp;
  std::ofstream(tmp / "doc.json") << text;
  auto r = test::run({SAFETENSORS_TEST_PYTHON3, "-c", "import json, sys; json.load(open(sys.argv[1]))",
                      (tmp / "doc.json").string()});
  if (r.code == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "not one JSON document (" << r.err << "):\n" << text;
}

std::size_t lines_in(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

class CliJson : public ::testing::Test {
 protected:
  void SetUp() override {
    std::array<float, 4> w{1, 2, 3, 4};
    safetensors::save_file(good_, {{"w", TensorView{Dtype::F32, {2, 2}, std::as_bytes(std::span(w)), {}}}},
                           {{"format", "pt"}});
    test::write_bytes(bad_, test::raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3));
  }
  test::TempDir dir_;
  std::filesystem::path good_ = dir_ / "good.safetensors", bad_ = dir_ / "bad.safetensors";
};

const std::vector<std::string> kCommands = {"inspect", "validate", "metadata", "bench", "stats", "reshard"};

/// `command` run on `file` with `more` arguments (reshard also takes an output directory).
std::vector<std::string> on(const std::string& command, const std::filesystem::path& file,
                            const std::filesystem::path& dir, std::vector<std::string> more) {
  std::vector<std::string> args{command, file.string()};
  if (command == "reshard") args.push_back((dir / "resharded").string());
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST_F(CliJson, EveryCommandPrintsOneJsonDocument) {
  for (const auto& command : kCommands) {
    std::vector<std::string> args = on(command, good_, dir_.path(), {"--json"});
    if (command == "bench") args.insert(args.end(), {"--runs", "1"});
    auto r = cli(args);
    EXPECT_EQ(r.code, 0) << command << ": " << r.err;
    EXPECT_TRUE(is_one_json_document(r.out)) << command;
  }
  EXPECT_TRUE(has(cli({"validate", good_.string(), "--json"}).out,
                  R"({"path": ")" + good_.string() + R"(", "valid": true, "tensors": 1, "bytes": )"));
  EXPECT_TRUE(has(cli({"metadata", good_.string(), "--json"}).out, R"("metadata":{"format":"pt"})"));
  auto bench = cli({"bench", good_.string(), "--json", "--runs", "1"});
  EXPECT_TRUE(has(bench.out, R"({"item":"load","median_s":)") && has(bench.out, R"("runs":1,)")) << bench.out;
  auto reshard = cli(on("reshard", good_, dir_.path(), {"--json"}));
  EXPECT_TRUE(has(reshard.out, R"("shards": 1, "tensors": 1, "total_size": 16})")) << reshard.out;
}

TEST_F(CliJson, MetadataEditsReportWhatTheFileNowHolds) {
  auto r = cli({"metadata", good_.string(), "--set", "k=v", "--delete", "format", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(is_one_json_document(r.out));
  EXPECT_TRUE(has(r.out, R"("updated":true,"tensors":1,"metadata":{"k":"v"})")) << r.out;
  // --json after --set is the key's value, not the flag.
  auto value = cli({"metadata", good_.string(), "--set", "--json=1"});
  EXPECT_EQ(value.code, 0) << value.err;
  EXPECT_TRUE(has(value.out, "updated")) << value.out;
}

TEST_F(CliJson, ValidateListsEveryFileValidOrNot) {
  auto r = cli({"validate", good_.string(), bad_.string(), "--json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(is_one_json_document(r.out));
  EXPECT_TRUE(has(r.out, R"("valid": false, "error": {"kind": "InvalidOffset", "message": ")")) << r.out;
  EXPECT_TRUE(has(r.out, R"("valid": 1, "total": 2})")) << r.out;
  EXPECT_EQ(lines_in(r.out), 4u) << "one line per file, then the totals: " << r.out;
}

TEST_F(CliJson, AFailureIsOneJsonDocumentAndOneLineOnStderr) {
  for (const auto& command : kCommands) {
    if (command == "validate") continue;  // lists failures per file (above)
    auto r = cli(on(command, bad_, dir_.path(), {"--json"}));
    EXPECT_EQ(r.code, 1) << command;
    EXPECT_TRUE(is_one_json_document(r.out)) << command;
    EXPECT_TRUE(has(r.out, R"({"error":{"kind":"InvalidOffset","message":")")) << command << ": " << r.out;
    EXPECT_EQ(lines_in(r.err), 1u) << command << ": " << r.err;
    EXPECT_TRUE(has(r.err, "safetensors: InvalidOffset: ")) << r.err;
    auto text = cli(on(command, bad_, dir_.path(), {}));
    EXPECT_EQ(text.code, 1) << command;
    EXPECT_EQ(lines_in(text.err), 1u) << command << ": " << text.err;
  }
  auto missing = cli({"stats", (dir_ / "absent.safetensors").string(), "--json"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(is_one_json_document(missing.out));
  EXPECT_TRUE(has(missing.out, R"({"error":{"kind":"Io",)")) << missing.out;
}

TEST_F(CliJson, AWrongCommandLineGetsThatCommandsOwnUsage) {
  for (const auto& command : kCommands) {
    auto r = cli({command, good_.string(), "--frobnicate"});
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_TRUE(has(r.err, command + ": unknown option '--frobnicate'")) << r.err;
    EXPECT_TRUE(has(r.err, "usage:\n  safetensors " + command + " ")) << r.err;
    for (const auto& other : kCommands) {
      if (other == command) continue;
      EXPECT_FALSE(has(r.err, "safetensors " + other + " ")) << command << ": " << r.err;
    }
    EXPECT_LE(lines_in(r.err), 12u) << r.err;
    auto help = cli({command, "--help"});
    EXPECT_EQ(help.code, 0);
    EXPECT_TRUE(has(help.out, "usage:\n  safetensors " + command + " ")) << help.out;
    auto json = cli({command, "--frobnicate", "--json"});
    EXPECT_EQ(json.code, 2);
    EXPECT_TRUE(is_one_json_document(json.out)) << command;
    EXPECT_TRUE(has(json.out, R"({"error":{"kind":"Usage","message":")")) << json.out;
  }
  auto unknown = cli({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(lines_in(unknown.err), 1u) << unknown.err;
  EXPECT_TRUE(has(unknown.err, "commands: inspect, validate, metadata, bench, stats")) << unknown.err;
  auto all = cli({"--help"});
  for (const auto& command : kCommands)
    EXPECT_TRUE(has(all.out, "  safetensors " + command + " ")) << all.out;
}

}  // namespace
