// Sharded checkpoints: a Python-written Hugging Face layout read through Checkpoint, lazily,
// and every inconsistency as a typed error.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <array>
#include <functional>

#include "support.hpp"

using safetensors::Checkpoint;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::TensorView;

namespace {

using test::kind_of;

TEST(Checkpoint, ReadsAPythonWrittenShardedCheckpoint) {
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  auto manifest = test::read_manifest(*dir / "manifest.tsv");
  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    Checkpoint ckpt(*dir / "model.safetensors.index.json", {backend});
    EXPECT_EQ(ckpt.shard_count(), 3u);
    EXPECT_EQ(ckpt.shards_opened(), 0u);
    std::vector<std::string> all;
    std::size_t total = 0;
    for (const auto& [fname, file] : manifest) {
      for (const auto& [name, t] : file.tensors) {
        all.push_back(name);
        total += t.end - t.begin;
        EXPECT_EQ(std::filesystem::path(ckpt.shard_of(name)).filename(), fname);
        auto view = ckpt.get_tensor(name);
        EXPECT_EQ(test::sha256_hex(view.data), t.sha256) << name;
        EXPECT_EQ(safetensors::to_string(ckpt.info(name).dtype), t.dtype);
      }
    }
    std::sort(all.begin(), all.end());
    EXPECT_EQ(ckpt.keys(), all);
    EXPECT_EQ(ckpt.size(), all.size());
    EXPECT_EQ(ckpt.metadata().at("total_size"), std::to_string(total));
    EXPECT_EQ(ckpt.shards_opened(), 3u);
    auto part = ckpt.get_slice("model.embed_tokens.weight").select({Index::range(0, 4)}).read();
    EXPECT_EQ(part.shape, (std::vector<std::size_t>{4, 8}));
  }
}

TEST(Checkpoint, OpensEachShardLazilyAndOnce) {
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  Checkpoint ckpt(*dir / "model.safetensors.index.json");
  EXPECT_EQ(ckpt.shards_opened(), 0u);
  EXPECT_TRUE(ckpt.contains("model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(ckpt.shards_opened(), 0u) << "contains() reads only the index";
  for (int i = 0; i < 5; ++i) (void)ckpt.get_tensor("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(ckpt.shards_opened(), 1u);
  Checkpoint copy = ckpt;
  (void)copy.info("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(ckpt.shards_opened(), 1u) << "copies share the open shards";
}

/// Writes shards with our writer (U8 [4] each) and an index with the given weight_map body.
struct Built {
  test::TempDir dir;
  std::filesystem::path index() const { return dir / "model.safetensors.index.json"; }
};

void build(Built& b, const std::vector<std::pair<std::string, std::vector<std::string>>>& shards,
           const std::string& weight_map_json) {
  std::vector<std::uint8_t> data(4, 1);
  for (const auto& [file, names] : shards) {
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const auto& n : names)
      tensors.emplace_back(n, TensorView{Dtype::U8, {4}, std::as_bytes(std::span(data)), {}});
    safetensors::save_file(b.dir / file, tensors);
  }
  std::ofstream(b.index()) << R"({"metadata":{"total_size":8},"weight_map":)" << weight_map_json << "}";
}

TEST(Checkpoint, AMissingShardFileIsReportedAtOpen) {
  Built b;
  build(b, {{"a.safetensors", {"w0"}}}, R"({"w0":"a.safetensors","w1":"gone.safetensors"})");
  try {
    Checkpoint ckpt(b.index());
    ADD_FAILURE() << "opened";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ShardMissing);
    EXPECT_NE(std::string(e.what()).find("gone.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ATensorListedButAbsentFromItsShardIsReported) {
  Built b;
  build(b, {{"a.safetensors", {"w0"}}}, R"({"w0":"a.safetensors","ghost":"a.safetensors"})");
  Checkpoint ckpt(b.index());
  EXPECT_EQ(kind_of([&] { (void)ckpt.get_tensor("w0"); }), ErrorKind::ShardMissing);
}

TEST(Checkpoint, ATensorClaimedByAnotherShardIsReported) {
  Built b;
  build(b, {{"a.safetensors", {"w0", "w1"}}, {"b.safetensors", {"w2"}}},
        R"({"w0":"a.safetensors","w1":"b.safetensors","w2":"b.safetensors"})");
  Checkpoint ckpt(b.index());
  EXPECT_EQ(kind_of([&] { (void)ckpt.get_tensor("w0"); }), ErrorKind::ShardMismatch);
  // The other shard is fine on its own... until w1 is looked up where the index says it is.
  EXPECT_EQ(kind_of([&] { (void)ckpt.get_tensor("w1"); }), ErrorKind::ShardMissing);
}

TEST(Checkpoint, ShardPathsMayNotLeaveTheIndexDirectory) {
  for (const char* bad : {"../a.safetensors", "/etc/hosts", "x/../../a.safetensors"}) {
    Built b;
    build(b, {{"a.safetensors", {"w0"}}}, std::string(R"({"w0":")") + bad + R"("})");
    EXPECT_EQ(kind_of([&] { Checkpoint c(b.index()); }), ErrorKind::InvalidShardPath) << bad;
  }
}

TEST(Checkpoint, MalformedIndexesAreRefused) {
  Built b;
  build(b, {{"a.safetensors", {"w0"}}}, R"({"w0":3})");
  EXPECT_EQ(kind_of([&] { Checkpoint c(b.index()); }), ErrorKind::InvalidIndex);
  std::ofstream(b.index()) << R"({"metadata":{}})";
  EXPECT_EQ(kind_of([&] { Checkpoint c(b.index()); }), ErrorKind::InvalidIndex);
}

TEST(Checkpoint, ASingleFileOpensAsACheckpointOfOneShard) {
  Built b;
  build(b, {{"a.safetensors", {"w0", "w1"}}}, R"({})");
  Checkpoint ckpt(b.dir / "a.safetensors");
  EXPECT_EQ(ckpt.keys(), (std::vector<std::string>{"w0", "w1"}));
  EXPECT_EQ(ckpt.shard_count(), 1u);
  EXPECT_EQ(ckpt.get_tensor("w1").data.size(), 4u);
  EXPECT_EQ(kind_of([&] { (void)ckpt.get_tensor("w9"); }), ErrorKind::TensorNotFound);
}

TEST(Checkpoint, ViewsOutliveTheCheckpoint) {
  Built b;
  build(b, {{"a.safetensors", {"w0"}}}, R"({"w0":"a.safetensors"})");
  TensorView v;
  {
    Checkpoint ckpt(b.index());
    v = ckpt.get_tensor("w0");
  }
  EXPECT_EQ(v.as<std::uint8_t>()[3], 1);
}

// Issue 18: names and paths through the bridge.
TEST(Checkpoint, ANameThatIsNotUtf8MatchesNoTensor) {
  Built b;
  // U+FFFD is what a lossy conversion makes of the byte 0xFF.
  build(b, {{"a.safetensors", {"w\xEF\xBF\xBD"}}}, R"({"w\ufffd":"a.safetensors"})");
  Checkpoint ckpt(b.index());
  EXPECT_EQ(std::filesystem::path(ckpt.shard_of("w\xEF\xBF\xBD")).filename(), "a.safetensors");
  EXPECT_EQ(kind_of([&] { (void)ckpt.shard_of("w\xFF"); }), ErrorKind::TensorNotFound);
  EXPECT_EQ(kind_of([&] { (void)ckpt.get_tensor("w\xFF"); }), ErrorKind::TensorNotFound);
}

TEST(Checkpoint, ARelativeIndexPathKeepsItsShardsAfterAChdir) {
  Built b;
  build(b, {{"a.safetensors", {"w0"}}}, R"({"w0":"./a.safetensors"})");
  const auto before = std::filesystem::current_path();
  std::filesystem::current_path(b.dir.path());
  Checkpoint ckpt("model.safetensors.index.json", {safetensors::Backend::Read});
  std::filesystem::current_path(std::filesystem::temp_directory_path());
  auto v = ckpt.get_tensor("w0");
  std::filesystem::current_path(before);
  EXPECT_EQ(v.as<std::uint8_t>()[3], 1);
  EXPECT_TRUE(std::filesystem::path(ckpt.shard_of("w0")).is_absolute());
}

TEST(Checkpoint, AMovedFromCheckpointThrowsInsteadOfCrashing) {
  test::TempDir dir;
  std::array<float, 2> w{1, 2};
  safetensors::save_file(dir / "one.safetensors",
                         {{"w", TensorView{Dtype::F32, {2}, std::as_bytes(std::span(w)), {}}}});
  Checkpoint c(dir / "one.safetensors");
  Checkpoint d = std::move(c);
  // NOLINTBEGIN(bugprone-use-after-move): the point of the test
  for (const auto& use : std::vector<std::function<void()>>{
           [&] { (void)c.keys(); }, [&] { (void)c.metadata(); }, [&] { (void)c.has_metadata(); },
           [&] { (void)c.contains("w"); }, [&] { (void)c.size(); }, [&] { (void)c.info("w"); },
           [&] { (void)c.get_tensor("w"); }, [&] { (void)c.get_slice("w"); }, [&] { (void)c.shard_count(); },
           [&] { (void)c.shard_paths(); }, [&] { (void)c.shard_of("w"); }, [&] { (void)c.shards_opened(); },
           [&] { (void)c.shard_sizes(0); },
           [&] {
             std::array<std::byte, 1> b{};
             c.read_shard_data(0, 0, b);
           }}) {
    try {
      use();
      ADD_FAILURE() << "no error from a moved-from Checkpoint";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Internal);
      EXPECT_NE(std::string(e.what()).find("Checkpoint was moved from"), std::string::npos) << e.what();
    }
  }
  // NOLINTEND(bugprone-use-after-move)
  EXPECT_EQ(d.get_tensor("w").data.size(), 8u);
}

// A shard read whole through its checkpoint (as `safetensors validate` does): its lengths as
// validated and its data bytes, from the one open the index check used; a shard number past
// the last is ShardMissing, a range past the data an error, as for a file.
TEST(Checkpoint, ReadsAShardsDataThroughTheCheckpoint) {
  Built b;
  build(b, {{"a.safetensors", {"x"}}, {"b.safetensors", {"y", "z"}}},
        R"({"x":"a.safetensors","y":"b.safetensors","z":"b.safetensors"})");
  Checkpoint ckpt(b.index());
  ASSERT_EQ(ckpt.shard_count(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    auto path = ckpt.shard_paths()[s];
    safetensors::SafeOpen alone(path);
    auto sizes = ckpt.shard_sizes(s);
    EXPECT_EQ(sizes.header, alone.data_offset());
    EXPECT_EQ(sizes.data, alone.data_size());
    EXPECT_EQ(sizes.trailing, 0u);
    EXPECT_EQ(sizes.file(), std::filesystem::file_size(path));
    std::vector<std::byte> bytes(sizes.data), expected(sizes.data);
    ckpt.read_shard_data(s, 0, bytes);
    alone.read_data(0, expected);
    EXPECT_EQ(bytes, expected);
  }
  EXPECT_EQ(ckpt.shards_opened(), 2u);
  EXPECT_EQ(kind_of([&] { (void)ckpt.shard_sizes(2); }), ErrorKind::ShardMissing);
  std::array<std::byte, 4> four{};
  EXPECT_EQ(kind_of([&] { ckpt.read_shard_data(2, 0, four); }), ErrorKind::ShardMissing);
  EXPECT_FALSE(test::thrown([&] { ckpt.read_shard_data(0, 2, four); }).ok()) << "a range past the data";
  auto status = safetensors::nothrow::read_shard_data(ckpt, 7, 0, four);
  EXPECT_EQ(status.kind(), ErrorKind::ShardMissing);
  EXPECT_NE(status.message().find("the checkpoint has 2 shards"), std::string::npos) << status.message();
  EXPECT_EQ(safetensors::nothrow::shard_sizes(ckpt, 1).value().data, 8u);

  // A destination inside the shard's own (read-only) mapping, taken from a view of it, is
  // refused as every other read into a caller's buffer refuses it, before the core sees it;
  // unrefused, the copy wrote into the read-only mapping and the process died.
  auto y = ckpt.get_tensor("y");
  ASSERT_EQ(y.data.size(), 4u);
  const std::span<std::byte> inside(const_cast<std::byte*>(y.data.data()), y.data.size());
  auto refused = safetensors::nothrow::read_shard_data(ckpt, 1, 4, inside);
  EXPECT_EQ(refused.kind(), ErrorKind::InvalidSlice) << refused.message();
  EXPECT_NE(refused.message().find("read_data: the destination (4 bytes) overlaps"), std::string::npos)
      << refused.message();
}

}  // namespace
