// The `safetensors` command-line tool, run as a program: output and exit codes on good and bad
// files.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "support.hpp"

#ifndef SAFETENSORS_CLI
#error "SAFETENSORS_CLI must name the built tool"
#endif

using safetensors::Dtype;
using safetensors::TensorView;

namespace {

struct Run {
  int code;
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Run cli(const std::vector<std::string>& args) {
  test::TempDir tmp;
  std::string cmd = quote(SAFETENSORS_CLI);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " >" + quote((tmp / "out").string()) + " 2>" + quote((tmp / "err").string());
  int status = std::system(cmd.c_str());
  auto text = [&](const char* f) {
    auto b = test::read_bytes(tmp / f);
    return std::string(b.begin(), b.end());
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text("out"), text("err")};
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    for (std::size_t i = 0; i < w_.size(); ++i) w_[i] = static_cast<float>(i);
    safetensors::save_file(good_, {{"layer.weight", TensorView{Dtype::F32, {2, 3}, std::as_bytes(std::span(w_)), {}}},
                                   {"layer.bias", TensorView{Dtype::F16, {3}, std::as_bytes(std::span(b_)), {}}}},
                           {{"format", "pt"}});
    std::string bad_json = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
    test::write_bytes(bad_, test::raw_file(bad_json, 3));
    std::string lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 548105171\n";
    test::write_bytes(lfs_, std::vector<std::uint8_t>(lfs.begin(), lfs.end()));
  }
  test::TempDir dir_;
  std::filesystem::path good_ = dir_ / "good.safetensors", bad_ = dir_ / "bad.safetensors", lfs_ = dir_ / "lfs.safetensors";
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
  for (const char* command : {"inspect", "validate", "metadata", "bench"}) {
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
  EXPECT_TRUE(has(r.out, R"({"name":"layer.weight","dtype":"F32","shape":[2,3],"bytes":24,"data_offsets":[0,24]})")) << r.out;
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
  EXPECT_TRUE(has(mixed.out, "FAIL " + lfs_.string() + ": HeaderTooLarge:") && has(mixed.out, "git-lfs pointer"))
      << mixed.out;
  EXPECT_TRUE(has(mixed.out, "1 of 3 files valid")) << mixed.out;
  EXPECT_EQ(cli({"validate", "--header-only", good_.string()}).code, 0);
}

TEST_F(Cli, ValidateChecksEveryShardOfAnIndex) {
  std::filesystem::copy_file(good_, dir_ / "part-1.safetensors");
  std::ofstream(dir_ / "m.index.json") << R"({"weight_map":{"layer.weight":"part-1.safetensors","layer.bias":"part-1.safetensors"}})";
  auto ok = cli({"validate", (dir_ / "m.index.json").string()});
  EXPECT_EQ(ok.code, 0) << ok.out;
  std::ofstream(dir_ / "m.index.json") << R"({"weight_map":{"layer.weight":"part-1.safetensors","gone":"part-2.safetensors"}})";
  auto bad = cli({"validate", (dir_ / "m.index.json").string()});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.out, "ShardMissing") && has(bad.out, "part-2.safetensors")) << bad.out;
  auto inspect = cli({"inspect", (dir_ / "m.index.json").string()});
  EXPECT_EQ(inspect.code, 1) << inspect.out;
}

TEST_F(Cli, MetadataPrintsAndRewritesWithTheDataUnchanged) {
  auto printed = cli({"metadata", good_.string()});
  EXPECT_EQ(printed.code, 0);
  EXPECT_EQ(printed.out, "format: pt\n");
  auto before = safetensors::SafeOpen(good_).get_tensor("layer.weight");
  std::vector<std::byte> old_bytes(before.data.begin(), before.data.end());
  auto set = cli({"metadata", good_.string(), "--set", "source=cli", "--set", "note=a=b", "--delete", "format"});
  EXPECT_EQ(set.code, 0) << set.err;
  safetensors::SafeOpen after(good_);
  EXPECT_EQ(after.metadata(), (std::map<std::string, std::string>{{"note", "a=b"}, {"source", "cli"}}));
  auto w = after.get_tensor("layer.weight");
  EXPECT_TRUE(std::equal(w.data.begin(), w.data.end(), old_bytes.begin(), old_bytes.end()));
  EXPECT_EQ(after.size(), 2u);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) names.push_back(e.path().filename().string());
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

}  // namespace
