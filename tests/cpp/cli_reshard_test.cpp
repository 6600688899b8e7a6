// `safetensors reshard`, run as a program: a file into shards and back, in place, sizes read as
// huggingface_hub reads them, aligned shards, and what a wrong input or output leaves behind.
// (tests/python/sharded_interop.py checks the split and the index against huggingface_hub's own.)
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "program.hpp"

using safetensors::Dtype;
using safetensors::TensorView;

namespace {

using test::cli;
using test::has;

namespace fs = std::filesystem;

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class Reshard : public ::testing::Test {
 protected:
  void SetUp() override {
    // Ten F32 tensors of 0 to 36,000 bytes and an empty I8 one: 180,000 bytes of tensors.
    for (std::size_t i = 0; i < 10; ++i) {
      auto& v = values_.emplace_back(i * 1000);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(i * 7 + j);
      tensors_.emplace_back("layers." + std::to_string(i) + ".w",
                            TensorView{Dtype::F32, {v.size()}, std::as_bytes(std::span(v)), {}});
    }
    tensors_.emplace_back("e", TensorView{Dtype::I8, {0}, {}, {}});
    safetensors::save_file(in_, tensors_, {{"format", "pt"}});
  }

  /// Every tensor of `path` (a file or an index) equals the input's.
  void expect_same_tensors(const fs::path& path) {
    safetensors::Checkpoint ckpt(path);
    ASSERT_EQ(ckpt.size(), tensors_.size());
    for (const auto& [name, t] : tensors_) {
      auto got = ckpt.get_tensor(name);
      EXPECT_EQ(got.shape, t.shape) << name;
      EXPECT_TRUE(std::equal(got.data.begin(), got.data.end(), t.data.begin(), t.data.end())) << name;
    }
  }

  test::TempDir dir_;
  fs::path in_ = dir_ / "in.safetensors", out_ = dir_ / "out";
  std::vector<std::vector<float>> values_ = [] {
    std::vector<std::vector<float>> v;
    v.reserve(10);
    return v;
  }();
  std::vector<std::pair<std::string, TensorView>> tensors_;
};

TEST_F(Reshard, AFileIntoShardsAndBackIntoOneFile) {
  auto r = cli({"reshard", in_.string(), out_.string(), "--max-shard-size", "50KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  // 0+4+8+12+16 = 40 KB; 20+24 = 44; 28; 32; 36+0 (the empty one last in the file).
  EXPECT_EQ(listing(out_),
            (std::vector<std::string>{"model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                                      "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                                      "model-00005-of-00005.safetensors", "model.safetensors.index.json"}));
  EXPECT_TRUE(has(r.out, "wrote " + (out_ / "model.safetensors.index.json").string())) << r.out;
  EXPECT_TRUE(has(r.out, "5 shards, 11 tensors, 180,000 bytes of tensors")) << r.out;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "progress only on a terminal";
  expect_same_tensors(out_ / "model.safetensors.index.json");
  safetensors::Checkpoint ckpt(out_ / "model.safetensors.index.json");
  EXPECT_EQ(ckpt.metadata().at("total_size"), "180000");
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  EXPECT_EQ(safetensors::SafeOpen(out_ / "model-00001-of-00005.safetensors").metadata().at("format"), "pt");
  // In place, back to one file: the shards and the index make way for model.safetensors, the
  // same bytes as save_file of the same tensors.
  auto back = cli({"reshard", (out_ / "model.safetensors.index.json").string(), out_.string(), "--json"});
  ASSERT_EQ(back.code, 0) << back.err;
  EXPECT_TRUE(has(back.out, R"("index": null, "shards": 1, "tensors": 11, "total_size": 180000})"))
      << back.out;
  EXPECT_EQ(listing(out_), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(test::read_bytes(out_ / "model.safetensors"), test::read_bytes(in_));
}

TEST_F(Reshard, SizesReadAsHuggingFaceHubReadsThem) {
  for (const char* size : {"50KB", "50kb", "0.05MB", "50000", "48.828125KiB"}) {
    auto dir = dir_ / ("s" + std::string(size));
    auto r = cli({"reshard", in_.string(), dir.string(), "--max-shard-size", size});
    ASSERT_EQ(r.code, 0) << size << ": " << r.err;
    EXPECT_EQ(listing(dir).size(), 6u) << size;
  }
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "1e30", "5 G"}) {
    auto r = cli({"reshard", in_.string(), out_.string(), "--max-shard-size", bad});
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_TRUE(has(r.err, "is not a shard size")) << bad << ": " << r.err;
  }
  EXPECT_EQ(cli({"reshard", in_.string(), out_.string(), "--max-shard-size"}).code, 2);
  EXPECT_EQ(cli({"reshard", in_.string()}).code, 2);
  EXPECT_FALSE(fs::exists(out_));
}

TEST_F(Reshard, AlignedShardsStartTheirDataOnTheBoundary) {
  auto r = cli({"reshard", in_.string(), out_.string(), "--max-shard-size", "100KB", "--align", "4096",
                "--prefix", "weights", "--no-sync"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out_ / "weights.safetensors.index.json"));
  for (const auto& name : listing(out_)) {
    if (name.ends_with(".json")) continue;
    auto bytes = test::read_bytes(out_ / name);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 4096, 0u) << name;
  }
  expect_same_tensors(out_ / "weights.safetensors.index.json");
  auto bad = cli({"reshard", in_.string(), (dir_ / "x").string(), "--align", "3", "--json"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.out, R"("kind":"InvalidSlice")")) << bad.out;
  EXPECT_TRUE(listing(dir_ / "x").empty());
}

TEST_F(Reshard, ABadInputOrOutputIsAnErrorAndChangesNothing) {
  std::string bad_json = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  test::write_bytes(dir_ / "bad.safetensors", test::raw_file(bad_json, 3));
  auto r = cli({"reshard", (dir_ / "bad.safetensors").string(), out_.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "InvalidOffset")) << r.err;
  EXPECT_FALSE(fs::exists(out_));
  test::write_bytes(out_, std::vector<std::uint8_t>{1, 2, 3});
  auto file = cli({"reshard", in_.string(), out_.string()});
  EXPECT_EQ(file.code, 1);
  EXPECT_TRUE(has(file.err, "Io")) << file.err;
  EXPECT_EQ(test::read_bytes(out_), (std::vector<std::uint8_t>{1, 2, 3}));
  auto missing = cli({"reshard", in_.string(), (dir_ / "no" / "such").string()});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(has(missing.err, "Io")) << missing.err;
}

}  // namespace
