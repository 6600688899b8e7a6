// Iterating over a file or a checkpoint as (name, view) pairs, and loading a tensor into a
// buffer the caller owns (`get_tensor_into`, `get_tensor_as`): their order, their bytes, and
// every careless call (wrong sizes, overlapping buffers, names not found, moved-from objects,
// a file that shrinks under the loop).
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "support.hpp"

using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::CheckpointOptions;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::NamedTensor;
using safetensors::OpenOptions;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

constexpr Backend kBackends[] = {Backend::Mmap, Backend::Read, Backend::Direct};

// JSON order, file order and name order all differ: file order is zeta, mid, alpha, half.
constexpr std::string_view kFile = R"({"alpha":{"dtype":"U8","shape":[2,3],"data_offsets":[10,16]},)"
                                   R"("zeta":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                   R"("half":{"dtype":"F16","shape":[2],"data_offsets":[16,20]},)"
                                   R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[20,20]},)"
                                   R"("mid":{"dtype":"U8","shape":[6],"data_offsets":[4,10]}})";

std::vector<std::uint8_t> sample_file() {
  auto bytes = test::raw_file(kFile, 16);  // data bytes 0, 1, 2, ... 15
  for (std::uint8_t b : {std::uint8_t{0x00}, std::uint8_t{0x3C}, std::uint8_t{0x00}, std::uint8_t{0xC0}}) {
    bytes.push_back(b);  // F16 1.0, -2.0
  }
  return bytes;
}

const std::vector<std::string> kFileOrder = {"zeta", "mid", "alpha", "half", "empty"};

class Iteration : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { test::write_bytes(path_, sample_file()); }
  [[nodiscard]] SafeOpen open() const { return SafeOpen(path_, OpenOptions{GetParam()}); }
  test::TempDir dir_;
  std::filesystem::path path_ = dir_ / "s.safetensors";
};

std::vector<std::uint8_t> bytes_of(const TensorView& v) {
  auto p = reinterpret_cast<const std::uint8_t*>(v.data.data());
  return {p, p + v.data.size()};
}

TEST_P(Iteration, RangeForGivesEveryTensorInFileOrderWithItsView) {
  SafeOpen f = open();
  EXPECT_EQ(f.offset_keys(), kFileOrder);
  std::vector<std::string> seen;
  for (const auto& [name, view] : f) {
    seen.push_back(name);
    TensorView direct = f.get_tensor(name);
    EXPECT_EQ(view.dtype, direct.dtype) << name;
    EXPECT_EQ(view.shape, direct.shape) << name;
    EXPECT_EQ(bytes_of(view), bytes_of(direct)) << name;
  }
  EXPECT_EQ(seen, kFileOrder);
  // Structured bindings by value, and a second loop that starts again.
  std::size_t n = 0;
  for (auto [name, view] : f) n += view.data.size() + (name.empty() ? 1000 : 0);
  EXPECT_EQ(n, 20u);
}

TEST_P(Iteration, TheLoopHoldsTheFileAfterTheSafeOpenIsGone) {
  std::optional<SafeOpen> f = open();
  auto it = f->begin();
  f.reset();
  std::vector<std::string> seen;
  for (; it != std::default_sentinel; ++it) seen.push_back(it->name);
  EXPECT_EQ(seen, kFileOrder);
}

TEST_P(Iteration, NothrowIterationGivesEveryTensorAsAValue) {
  SafeOpen f = open();
  std::vector<std::string> seen;
  for (const auto& item : safetensors::nothrow::tensors(f)) {
    ASSERT_TRUE(item) << item.status().message();
    seen.push_back(item->name);
  }
  EXPECT_EQ(seen, kFileOrder);
}

TEST_P(Iteration, GetTensorIntoCopiesExactlyTheTensorsBytes) {
  SafeOpen f = open();
  std::vector<std::byte> mid(6);
  f.get_tensor_into("mid", mid);
  EXPECT_EQ(mid, (std::vector<std::byte>{std::byte{4}, std::byte{5}, std::byte{6}, std::byte{7}, std::byte{8},
                                         std::byte{9}}));
  std::vector<std::byte> none;
  f.get_tensor_into("empty", none);  // no bytes, no read
  EXPECT_TRUE(safetensors::nothrow::get_tensor_into(f, "alpha", std::span(mid)).ok());
  EXPECT_EQ(mid[0], std::byte{10});
}

TEST_P(Iteration, GetTensorIntoRefusesABufferOfAnotherSize) {
  SafeOpen f = open();
  for (std::size_t size : {5u, 7u, 0u}) {
    std::vector<std::byte> dst(size, std::byte{0xEE});
    auto st = test::thrown([&] { f.get_tensor_into("mid", dst); });
    EXPECT_EQ(st.kind(), ErrorKind::InvalidSlice) << size;
    EXPECT_NE(st.message().find("tensor `mid`: the destination holds " + std::to_string(size) +
                                " bytes but the tensor (U8 [6]) has 6; pass exactly 6 bytes"),
              std::string::npos)
        << st.message();
    test::expect_same(safetensors::nothrow::get_tensor_into(f, "mid", dst), st);
    for (auto b : dst) EXPECT_EQ(b, std::byte{0xEE}) << "nothing written";
  }
}

TEST_P(Iteration, GetTensorIntoAndAsReportNamesNotFound) {
  SafeOpen f = open();
  std::vector<std::byte> dst(6);
  EXPECT_EQ(test::kind_of([&] { f.get_tensor_into("nope", dst); }), ErrorKind::TensorNotFound);
  EXPECT_EQ(test::kind_of([&] { f.get_tensor_as("nope", Dtype::F32, dst); }), ErrorKind::TensorNotFound);
  EXPECT_EQ(test::kind_of([&] { (void)f.get_tensor_as("nope", Dtype::F32); }), ErrorKind::TensorNotFound);
}

TEST_P(Iteration, GetTensorAsConvertsIntoTheCallersBuffer) {
  SafeOpen f = open();
  std::vector<float> out(2);
  f.get_tensor_as("half", Dtype::F32, std::as_writable_bytes(std::span(out)));
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f}));
  TensorView owned = f.get_tensor_as("zeta", Dtype::F32);
  EXPECT_EQ(owned.shape, (std::vector<std::size_t>{4}));
  auto values = owned.as<float>();
  EXPECT_EQ(std::vector<float>(values.begin(), values.end()), (std::vector<float>{0, 1, 2, 3}));
  std::vector<float> small(1);
  auto st =
      test::thrown([&] { f.get_tensor_as("half", Dtype::F32, std::as_writable_bytes(std::span(small))); });
  EXPECT_NE(st.kind(), ErrorKind::Internal) << st.message();
  EXPECT_FALSE(st.ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, Iteration, ::testing::ValuesIn(kBackends));

// ---- careless calls --------------------------------------------------------------------------

/// A destination inside the file's own memory: writing there would change the file under its
/// readers (and fault, for a read-only mapping). Refused before any byte moves.
TEST(IterationCareless, ADestinationOverlappingTheFileIsRefused) {
  test::TempDir dir;
  test::write_bytes(dir / "s.safetensors", sample_file());
  SafeOpen f(dir / "s.safetensors");
  TensorView alpha = f.get_tensor("alpha");
  std::span<std::byte> inside(const_cast<std::byte*>(alpha.data.data()), 6);
  auto st = test::thrown([&] { f.get_tensor_into("mid", inside); });
  EXPECT_EQ(st.kind(), ErrorKind::InvalidSlice);
  EXPECT_NE(st.message().find("overlaps"), std::string::npos) << st.message();
  std::span<std::byte> two(const_cast<std::byte*>(alpha.data.data()), 8);
  EXPECT_EQ(test::kind_of([&] { f.get_tensor_as("half", Dtype::F32, two); }), ErrorKind::InvalidSlice);

  // A file in memory: a destination inside the caller's buffer, the same.
  auto buf = std::make_shared<std::vector<std::byte>>();
  for (auto b : sample_file()) buf->push_back(std::byte{b});
  SafeOpen g = SafeOpen::from_bytes(*buf, buf);
  std::span<std::byte> head(buf->data() + 8, 6);
  EXPECT_EQ(test::kind_of([&] { g.get_tensor_into("mid", head); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(test::kind_of([&] { g.get_tensor_as("half", Dtype::F16, std::span(buf->data(), 4)); }),
            ErrorKind::InvalidSlice);
}

TEST(IterationCareless, AMovedFromSafeOpenIsInternalNeverACrash) {
  test::TempDir dir;
  test::write_bytes(dir / "s.safetensors", sample_file());
  SafeOpen f(dir / "s.safetensors");
  SafeOpen g = std::move(f);
  std::vector<std::byte> dst(6);
  EXPECT_EQ(test::kind_of([&] { f.get_tensor_into("mid", dst); }), ErrorKind::Internal);  // NOLINT: moved
  EXPECT_EQ(test::kind_of([&] {
              for (const auto& t : f) (void)t;  // NOLINT: moved from on purpose
            }),
            ErrorKind::Internal);
  std::size_t items = 0;
  for (const auto& item : safetensors::nothrow::tensors(f)) {  // NOLINT: moved from on purpose
    ++items;
    EXPECT_EQ(item.status().kind(), ErrorKind::Internal);
  }
  EXPECT_EQ(items, 1u) << "one error, then the end";
  EXPECT_EQ(g.offset_keys(), kFileOrder);
}

/// An iterator or a nothrow range moved from holds nothing: what it points at is `Internal`,
/// then the walk ends, even after what it was moved into, and the file, are gone. It must not
/// hand out the view it gave away, nor read through the file it no longer holds: the view's
/// bytes are read here, so handing them out would be a use after free (a crash with a mapping).
TEST(IterationCareless, AMovedFromIteratorOrRangeIsInternalNeverAUseAfterFree) {
  test::TempDir dir;
  test::write_bytes(dir / "s.safetensors", sample_file());
  const auto probe = [](auto it) {
    std::optional<decltype(it)> taken(std::move(it));
    ++*taken;
    EXPECT_EQ((*taken)->name, "mid");
    taken.reset();                             // the file, and each view the walk made, go with it
    ASSERT_TRUE(it != std::default_sentinel);  // NOLINT: moved from on purpose
    try {
      const NamedTensor& t = *it;
      ADD_FAILURE() << "a moved-from iterator gave `" << t.name << "` of " << bytes_of(t.view).size()
                    << " bytes";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Internal) << e.what();
    }
    // Then the end: walking on would read through the file it gave away, gone now.
    std::size_t more = 0;
    for (++it; it != std::default_sentinel && more < kFileOrder.size(); ++it, ++more) {
      EXPECT_EQ(bytes_of(it->view).size(), 0u) << "read a view of a file that is gone";
    }
    EXPECT_EQ(more, 0u);
  };
  // Each source is a temporary, gone before the probe starts.
  for (Backend b : kBackends) {
    auto it = SafeOpen(dir / "s.safetensors", OpenOptions{b}).begin();
    probe(std::move(it));
  }
  auto from_checkpoint = Checkpoint(dir / "s.safetensors").begin();
  probe(std::move(from_checkpoint));

  // The nothrow face: a moved-from range, and an iterator moved from by assignment, each give
  // one `Internal` error, then the end.
  const auto probe_nothrow = [](auto range) {
    std::optional<decltype(range)> kept(std::move(range));
    auto it = kept->begin();
    std::optional<decltype(it)> taken(std::in_place);
    *taken = std::move(it);
    ASSERT_TRUE(**taken);
    EXPECT_EQ((**taken)->name, "zeta");
    kept.reset();
    taken.reset();
    ASSERT_TRUE(it != std::default_sentinel);  // NOLINT: moved from on purpose
    EXPECT_EQ((*it).status().kind(), ErrorKind::Internal);
    ++it;
    EXPECT_TRUE(it == std::default_sentinel);
    std::size_t items = 0;
    for (const auto& item : range) {  // NOLINT: moved from on purpose
      ++items;
      EXPECT_EQ(item.status().kind(), ErrorKind::Internal);
      if (item) {
        EXPECT_EQ(bytes_of(item->view).size(), 0u) << "read a view of a file that is gone";
      }
    }
    EXPECT_EQ(items, 1u) << "one error, then the end";
  };
  for (Backend b : kBackends) {
    auto range = safetensors::nothrow::tensors(SafeOpen(dir / "s.safetensors", OpenOptions{b}));
    probe_nothrow(std::move(range));
  }
  auto checkpoint_range = safetensors::nothrow::tensors(Checkpoint(dir / "s.safetensors"));
  probe_nothrow(std::move(checkpoint_range));
}

/// With the read backend each view is read when the loop reaches it: a file that shrank since
/// the open is an `Io` error at the first tensor past its new end, thrown there (or given as
/// the last item by the nothrow face), never bytes that are not the file's.
TEST(IterationCareless, AFileThatShrankUnderTheLoopIsAnIoErrorWhereItIsMet) {
  test::TempDir dir;
  auto path = dir / "s.safetensors";
  test::write_bytes(path, sample_file());
  SafeOpen f(path, {.backend = Backend::Read});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);
  std::vector<std::string> before;
  auto st = test::thrown([&] {
    for (const auto& [name, view] : f) before.push_back(name);
  });
  EXPECT_EQ(st.kind(), ErrorKind::Io) << st.message();
  EXPECT_EQ(before, (std::vector<std::string>{"zeta", "mid"}));
  std::vector<std::string> names;
  std::optional<safetensors::Status> error;
  for (const auto& item : safetensors::nothrow::tensors(f)) {
    if (item) {
      names.push_back(item->name);
    } else {
      error = item.status();
    }
  }
  EXPECT_EQ(names, before);
  ASSERT_TRUE(error.has_value());
  test::expect_same(*error, st);
}

// ---- checkpoints -----------------------------------------------------------------------------

/// Two shards written by our writer, U8 [4] each named tensor, filled with its shard's number.
struct Shards {
  test::TempDir dir;
  std::filesystem::path index() const { return dir / "model.safetensors.index.json"; }
};

void build(Shards& s, const std::vector<std::pair<std::string, std::vector<std::string>>>& shards,
           const std::string& weight_map) {
  for (std::size_t k = 0; k < shards.size(); ++k) {
    std::vector<std::uint8_t> data(4, static_cast<std::uint8_t>(k + 1));
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const auto& n : shards[k].second)
      tensors.emplace_back(n, TensorView{Dtype::U8, {4}, std::as_bytes(std::span(data)), {}});
    safetensors::save_file(s.dir / shards[k].first, tensors);
  }
  std::ofstream(s.index()) << R"({"weight_map":)" << weight_map << "}";
}

TEST(CheckpointIteration, GoesShardByShardInFileOrderAndSkipsWhatTheIndexAssignsElsewhere) {
  // `unlisted` is in no index entry, so in no shard's share; lenient, shard b also holds a
  // stray copy of `x` that the index assigns to shard a (strict refuses such a shard).
  for (bool lenient : {false, true}) {
    Shards s;
    std::vector<std::string> b = {"y", "unlisted"};
    if (lenient) b.push_back("x");
    build(s, {{"a.safetensors", {"z", "x"}}, {"b.safetensors", b}},
          R"({"z":"a.safetensors","x":"a.safetensors","y":"b.safetensors"})");
    Checkpoint ckpt(s.index(), {.lenient = lenient});
    std::vector<std::pair<std::string, int>> seen;
    for (const auto& [name, view] : ckpt) seen.emplace_back(name, static_cast<int>(view.data[0]));
    // Shard a in file order: our writer lays tensors out sorted by name (x, z).
    const std::vector<std::pair<std::string, int>> want = {{"x", 1}, {"z", 1}, {"y", 2}};
    EXPECT_EQ(seen, want) << "lenient " << lenient;
    EXPECT_EQ(ckpt.keys(), (std::vector<std::string>{"x", "y", "z"})) << "keys() stays sorted";
  }
}

TEST(CheckpointIteration, OpensShardsAsTheLoopNearsThemAndNoFurther) {
  // 20 shards: the loop opens the shards it reaches, a few ahead at once (one per core, at
  // most 8, their headers parsed in parallel), never the whole checkpoint up front.
  Shards s;
  std::vector<std::pair<std::string, std::vector<std::string>>> shards;
  std::string index = "{";
  for (int k = 0; k < 20; ++k) {
    const std::string file = "s" + std::to_string(k) + ".safetensors", name = "t" + std::to_string(100 + k);
    shards.push_back({file, {name}});
    index += (k ? ",\"" : "\"") + name + "\":\"" + file + "\"";
  }
  build(s, shards, index + "}");
  Checkpoint ckpt(s.index());
  auto it = ckpt.begin();
  EXPECT_EQ(it->name, "t100");
  const std::size_t first = ckpt.shards_opened();
  EXPECT_GE(first, 1u);
  EXPECT_LE(first, 8u);
  for (int k = 1; k < 20; ++k) {
    ++it;
    EXPECT_EQ(it->name, "t" + std::to_string(100 + k));
    EXPECT_GE(ckpt.shards_opened(), static_cast<std::size_t>(k + 1));
    EXPECT_LE(ckpt.shards_opened(), static_cast<std::size_t>(k + 8));
  }
  ++it;
  EXPECT_TRUE(it == std::default_sentinel);
  EXPECT_EQ(ckpt.shards_opened(), 20u);
}

TEST(CheckpointIteration, LenientSkipsTensorsItsShardLacksAndStrictReportsTheShard) {
  Shards s;
  build(s, {{"a.safetensors", {"p"}}, {"b.safetensors", {"q"}}},
        R"({"p":"a.safetensors","q":"b.safetensors","gone":"b.safetensors"})");
  Checkpoint lenient(s.index(), {.lenient = true});
  std::vector<std::string> names;
  for (const auto& t : lenient) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(lenient.missing(), (std::vector<std::string>{"gone"}));

  Checkpoint strict(s.index());
  names.clear();
  auto st = test::thrown([&] {
    for (const auto& t : strict) names.push_back(t.name);
  });
  EXPECT_EQ(st.kind(), ErrorKind::ShardMissing) << st.message();
  EXPECT_EQ(names, (std::vector<std::string>{"p"}));
  std::size_t errors = 0;
  for (const auto& item : safetensors::nothrow::tensors(strict)) errors += item ? 0 : 1;
  EXPECT_EQ(errors, 1u);
}

TEST(CheckpointIteration, GetTensorIntoAndAsReadFromTheRightShard) {
  Shards s;
  build(s, {{"a.safetensors", {"p"}}, {"b.safetensors", {"q"}}},
        R"({"p":"a.safetensors","q":"b.safetensors"})");
  for (Backend backend : kBackends) {
    Checkpoint ckpt(s.index(), {.backend = backend});
    std::vector<std::byte> q(4);
    ckpt.get_tensor_into("q", q);
    EXPECT_EQ(q, std::vector<std::byte>(4, std::byte{2}));
    std::vector<float> p(4);
    ckpt.get_tensor_as("p", Dtype::F32, std::as_writable_bytes(std::span(p)));
    EXPECT_EQ(p, std::vector<float>(4, 1.0f));
    TensorView q64 = ckpt.get_tensor_as("q", Dtype::F64);
    EXPECT_EQ(q64.as<double>()[3], 2.0);
    std::vector<std::byte> wrong(3);
    EXPECT_EQ(test::kind_of([&] { ckpt.get_tensor_into("q", wrong); }), ErrorKind::InvalidSlice);
    EXPECT_EQ(test::kind_of([&] { ckpt.get_tensor_into("nope", q); }), ErrorKind::TensorNotFound);
    test::expect_same(safetensors::nothrow::get_tensor_into(ckpt, "q", wrong),
                      test::thrown([&] { ckpt.get_tensor_into("q", wrong); }));
  }
  Checkpoint ckpt(s.index());
  Checkpoint moved = std::move(ckpt);
  std::vector<std::byte> q(4);
  EXPECT_EQ(test::kind_of([&] { ckpt.get_tensor_into("q", q); }), ErrorKind::Internal);  // NOLINT: moved
  EXPECT_EQ(test::kind_of([&] {
              for (const auto& t : ckpt) (void)t;  // NOLINT: moved from on purpose
            }),
            ErrorKind::Internal);
}

}  // namespace
