// Files in memory (SafeOpen::from_bytes) and checkpoints as they exist in the wild: lenient
// checkpoints (missing tensors, copies in other shards) and trailing bytes. Strict is the
// default, and each test checks that face too.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support.hpp"

using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::CheckpointOptions;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

using test::kind_of;

/// A file of U8 [4] tensors filled with `fill`.
std::vector<std::byte> file_of(const std::vector<std::string>& names, std::uint8_t fill) {
  std::array<std::uint8_t, 4> data{};
  data.fill(fill);
  std::map<std::string, TensorView> tensors;
  for (const auto& n : names)
    tensors.emplace(n, TensorView{Dtype::U8, {4}, std::as_bytes(std::span(data)), {}});
  return safetensors::serialize(tensors);
}

/// Byte `i` of a view (kept in a variable: `as()` on a temporary does not compile).
std::uint8_t byte_at(const TensorView& v, std::size_t i) {
  return v.as<std::uint8_t>()[i];
}

void write(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(InMemory, ViewsBorrowTheCallersBytesAndKeepTheOwnerAlive) {
  auto owner = std::make_shared<std::vector<std::byte>>(file_of({"a", "b"}, 7));
  std::weak_ptr<std::vector<std::byte>> watch = owner;
  const std::byte* begin = owner->data();
  const std::byte* end = begin + owner->size();
  TensorView v;
  {
    auto f = SafeOpen::from_bytes(*owner, owner);
    owner.reset();
    EXPECT_EQ(f.keys(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(f.backend(), Backend::Mmap);
    v = f.get_tensor("b");
    EXPECT_TRUE(v.data.data() >= begin && v.data.data() + 4 <= end) << "zero copy";
  }
  EXPECT_FALSE(watch.expired()) << "the view holds the owner";
  EXPECT_EQ(v.as<std::uint8_t>()[3], 7);
  v = {};
  EXPECT_TRUE(watch.expired()) << "nothing else holds it";
}

TEST(InMemory, AnOutputBufferInsideTheFileIsRefusedAndTheFileUnchanged) {
  // A caller's buffer is both the file and (carelessly) the destination of a read: every call
  // writing into a caller's span refuses a span that overlaps the bytes it reads, before the
  // core sees it (it would hold a mutable slice over the bytes it reads from).
  std::vector<std::byte> bytes = file_of({"a", "b"}, 7);
  const std::vector<std::byte> before = bytes;
  auto f = SafeOpen::from_bytes(bytes);
  auto inside = std::span<std::byte>(bytes).last(4);  // tensor `b`'s own bytes
  auto header = std::span<std::byte>(bytes).first(4);
  for (auto dst : {inside, header}) {
    EXPECT_EQ(kind_of([&] { f.read_data(0, dst); }), ErrorKind::InvalidSlice);
    auto sel = f.get_slice("a").select({});
    EXPECT_EQ(kind_of([&] { sel.read_into(dst); }), ErrorKind::InvalidSlice);
    EXPECT_EQ(kind_of([&] { sel.read_as(Dtype::F8_E4M3, dst); }), ErrorKind::InvalidSlice);
    auto st = safetensors::nothrow::read_into(sel, dst);
    EXPECT_NE(st.message().find("read_into: the destination (4 bytes) overlaps"), std::string::npos)
        << st.message();
  }
  auto b = f.get_tensor("b");  // zero copy: its bytes are `inside`
  EXPECT_EQ(kind_of([&] { safetensors::convert(b, Dtype::F8_E5M2, inside); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(bytes, before) << "nothing was written";
  // A buffer of its own is fine.
  std::vector<std::byte> mine(4);
  f.read_data(0, mine);
  EXPECT_EQ(mine[0], std::byte{7});
}

TEST(InMemory, ACopyOutlivesTheCallersBuffer) {
  std::optional<SafeOpen> f;
  {
    auto bytes = file_of({"w"}, 5);
    f.emplace(SafeOpen::from_bytes_copy(bytes));
    std::fill(bytes.begin(), bytes.end(), std::byte{0});
  }
  auto v = f->get_tensor("w");
  EXPECT_EQ(v.as<std::uint8_t>()[0], 5);
  EXPECT_EQ(f->get_slice("w").select({safetensors::Index::range(1, 3)}).read().data.size(), 2u);
}

TEST(InMemory, BadBytesAreTheFilesErrorsNamingTheBuffer) {
  auto bytes = file_of({"w"}, 1);
  std::span<const std::byte> all(bytes);
  try {
    (void)SafeOpen::from_bytes(all.first(all.size() - 1), {}, {}, "https://example.org/m.safetensors");
    ADD_FAILURE() << "a truncated buffer opened";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::MetadataIncompleteBuffer);
    EXPECT_NE(std::string(e.what()).find("https://example.org/m.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kind_of([&] { (void)SafeOpen::from_bytes(all.first(3)); }), ErrorKind::HeaderTooSmall);
  EXPECT_EQ(kind_of([&] { (void)SafeOpen::from_bytes({}); }), ErrorKind::HeaderTooSmall);
}

TEST(TrailingBytes, RefusedByDefaultCountedWhenAllowedOnEverySource) {
  test::TempDir dir;
  auto bytes = file_of({"w"}, 3);
  for (char c : std::string("tail!")) bytes.push_back(static_cast<std::byte>(c));
  write(dir / "t.safetensors", bytes);
  for (auto backend : {Backend::Mmap, Backend::Read}) {
    EXPECT_EQ(kind_of([&] { SafeOpen f(dir / "t.safetensors", {backend}); }),
              ErrorKind::MetadataIncompleteBuffer);
    SafeOpen f(dir / "t.safetensors", {.backend = backend, .allow_trailing_bytes = true});
    EXPECT_EQ(f.trailing_bytes(), 5u);
    EXPECT_EQ(f.data_size(), 4u);
    EXPECT_EQ(byte_at(f.get_tensor("w"), 3), 3);
  }
  EXPECT_EQ(kind_of([&] { (void)SafeOpen::from_bytes(bytes); }), ErrorKind::MetadataIncompleteBuffer);
  auto f = SafeOpen::from_bytes(bytes, {}, {.allow_trailing_bytes = true});
  EXPECT_EQ(f.trailing_bytes(), 5u);
  EXPECT_EQ(SafeOpen::from_bytes_copy(file_of({"w"}, 3)).trailing_bytes(), 0u);
}

TEST(LenientCheckpoint, AListedTensorItsShardLacksIsAnErrorOnlyWhenAsked) {
  test::TempDir dir;
  write(dir / "a.safetensors", file_of({"w0"}, 1));
  write(dir / "b.safetensors", file_of({"w2"}, 2));
  write_text(dir / "model.safetensors.index.json",
             R"({"weight_map":{"w0":"a.safetensors","w1":"a.safetensors","w2":"b.safetensors"}})");
  Checkpoint strict(dir / "model.safetensors.index.json");
  EXPECT_EQ(kind_of([&] { (void)strict.get_tensor("w0"); }), ErrorKind::ShardMissing);
  for (auto backend : {Backend::Mmap, Backend::Read}) {
    Checkpoint c(dir / "model.safetensors.index.json", {.backend = backend, .lenient = true});
    EXPECT_EQ(c.keys(), (std::vector<std::string>{"w0", "w1", "w2"}));
    EXPECT_EQ(byte_at(c.get_tensor("w0"), 0), 1);
    EXPECT_EQ(kind_of([&] { (void)c.get_tensor("w1"); }), ErrorKind::ShardMissing);
    EXPECT_EQ(kind_of([&] { (void)c.info("w1"); }), ErrorKind::ShardMissing);
    EXPECT_EQ(c.missing(), (std::vector<std::string>{"w1"}));
  }
  EXPECT_TRUE(Checkpoint(dir / "a.safetensors").missing().empty());
}

TEST(LenientCheckpoint, CopiesInShardsTheIndexDoesNotAssignAreIgnored) {
  test::TempDir dir;
  write(dir / "a.safetensors", file_of({"w0"}, 1));
  write(dir / "b.safetensors", file_of({"w0", "w2"}, 9));
  write_text(dir / "model.safetensors.index.json",
             R"({"weight_map":{"w0":"a.safetensors","w2":"b.safetensors"}})");
  Checkpoint strict(dir / "model.safetensors.index.json");
  EXPECT_EQ(kind_of([&] { (void)strict.get_tensor("w2"); }), ErrorKind::ShardMismatch);
  Checkpoint c(dir / "model.safetensors.index.json", {.lenient = true});
  EXPECT_EQ(byte_at(c.get_tensor("w2"), 0), 9);
  EXPECT_EQ(byte_at(c.get_tensor("w0"), 0), 1) << "the index's shard wins";
  EXPECT_TRUE(c.missing().empty());
}

TEST(TrailingBytes, CheckpointShardsReportThem) {
  test::TempDir dir;
  auto a = file_of({"w0"}, 1);
  a.resize(a.size() + 6);
  write(dir / "a.safetensors", a);
  write(dir / "b.safetensors", file_of({"w1"}, 2));
  write_text(dir / "model.safetensors.index.json",
             R"({"weight_map":{"w0":"a.safetensors","w1":"b.safetensors"}})");
  Checkpoint strict(dir / "model.safetensors.index.json");
  EXPECT_EQ(kind_of([&] { (void)strict.get_tensor("w0"); }), ErrorKind::MetadataIncompleteBuffer);
  Checkpoint c(dir / "model.safetensors.index.json", {.allow_trailing_bytes = true});
  auto t = c.trailing_bytes();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(std::filesystem::path(t[0].first).filename(), "a.safetensors");
  EXPECT_EQ(t[0].second, 6u);
  EXPECT_EQ(byte_at(c.get_tensor("w0"), 0), 1);
}

}  // namespace
