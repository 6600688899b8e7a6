// Whatever reads holds what it reads from: every reader (streams, prefetches, slices and
// selections, views, multi-rank plans, DLPack exports) made from every kind of source (a file
// with each backend, bytes in memory with an owner, a copy in memory, a sharded checkpoint)
// keeps its source alive, whichever object the user drops first. Each case makes the reader
// from a temporary source, so the source object is gone before the reader is used, then
// checks every byte it delivers; the bytes of memory sources are overwritten when their owner
// lets go, so a reader that outlives them delivers wrong bytes even without AddressSanitizer
// (the asan preset also runs these, where it is a heap-use-after-free).
#include <safetensors/distributed.hpp>
#include <safetensors/prefetch.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "multi_rank.hpp"
#include "support.hpp"

#if __has_include(<dlpack/dlpack.h>)
#include <safetensors/dlpack.hpp>
#define SAFETENSORS_TEST_DLPACK 1
#endif

namespace {

using namespace safetensors;

/// Tensors t0..t3 of these lengths (U8), in this order in the file.
constexpr std::size_t kLens[] = {5000, 70'000, 12, 300'000};
constexpr std::size_t kCount = std::size(kLens);

std::uint8_t byte_of(std::size_t t, std::size_t i) {
  return static_cast<std::uint8_t>(i * 31 + t * 11 + i / 253);
}

std::vector<std::uint8_t> expected(std::size_t t) {
  std::vector<std::uint8_t> out(kLens[t]);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = byte_of(t, i);
  return out;
}

bool same(std::span<const std::byte> got, const std::vector<std::uint8_t>& want) {
  return got.size() == want.size() &&
         (want.empty() || std::memcmp(got.data(), want.data(), want.size()) == 0);
}

/// The bytes of a file of tensors `first..last` (exclusive).
std::vector<std::uint8_t> file_bytes(std::size_t first, std::size_t last) {
  std::vector<std::vector<std::uint8_t>> datas;
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (std::size_t t = first; t < last; ++t) datas.push_back(expected(t));
  for (std::size_t t = first; t < last; ++t) {
    tensors.emplace_back("t" + std::to_string(t),
                         TensorView{Dtype::U8, {kLens[t]}, std::as_bytes(std::span(datas[t - first])), {}});
  }
  auto bytes = serialize(tensors);
  return {reinterpret_cast<const std::uint8_t*>(bytes.data()),
          reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size()};
}

enum class Kind { Mmap, Read, Direct, MemoryOwned, MemoryCopy, Checkpoint };

std::string name_of(Kind k) {
  switch (k) {
    case Kind::Mmap:
      return "Mmap";
    case Kind::Read:
      return "Read";
    case Kind::Direct:
      return "Direct";
    case Kind::MemoryOwned:
      return "MemoryOwned";
    case Kind::MemoryCopy:
      return "MemoryCopy";
    case Kind::Checkpoint:
      return "Checkpoint";
  }
  return "?";
}

class Lifetime : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    test::write_bytes(dir / "model.safetensors", file_bytes(0, kCount));
    test::write_bytes(dir / "model-1.safetensors", file_bytes(0, 2));
    test::write_bytes(dir / "model-2.safetensors", file_bytes(2, kCount));
    std::ofstream index(dir / "model.safetensors.index.json");
    index << R"({"metadata": {}, "weight_map": {"t0": "model-1.safetensors", "t1": "model-1.safetensors",)"
          << R"( "t2": "model-2.safetensors", "t3": "model-2.safetensors"}})";
    ASSERT_TRUE(index.good());
  }

  /// A file of the parameter's kind. Memory sources own their bytes through a `keep_alive`
  /// that overwrites them when it lets go (`released` counts that).
  SafeOpen open_file() {
    auto path = dir / "model.safetensors";
    switch (GetParam()) {
      case Kind::Mmap:
        return SafeOpen(path, {.backend = Backend::Mmap});
      case Kind::Read:
        return SafeOpen(path, {.backend = Backend::Read});
      case Kind::Direct:
        return SafeOpen(path, {.backend = Backend::Direct});
      case Kind::MemoryOwned: {
        ++opened;
        auto* bytes = new std::vector<std::uint8_t>(test::read_bytes(path));
        std::shared_ptr<const void> owner(bytes, [released = released](std::vector<std::uint8_t>* b) {
          std::memset(b->data(), 0xEE, b->size());
          delete b;
          released->fetch_add(1);
        });
        return SafeOpen::from_bytes(std::as_bytes(std::span(*bytes)), std::move(owner));
      }
      case Kind::MemoryCopy: {
        auto bytes = test::read_bytes(path);
        auto f = SafeOpen::from_bytes_copy(std::as_bytes(std::span(bytes)));
        std::memset(bytes.data(), 0xEE, bytes.size());  // the copy is the file's, not these
        return f;
      }
      case Kind::Checkpoint:
        break;
    }
    return SafeOpen(path);  // not reached: `from_temporary` opens checkpoints itself
  }

  /// `make(source)` with a temporary source of the parameter's kind: the source object is
  /// destroyed as soon as `make` returns what it made.
  template <class Make>
  auto from_temporary(Make make) {
    if (GetParam() == Kind::Checkpoint) return make(Checkpoint(dir / "model.safetensors.index.json"));
    return make(open_file());
  }

  /// After the readers are gone too, every memory source's owner has been released, once.
  void expect_owner_released() const {
    if (GetParam() == Kind::MemoryOwned) {
      EXPECT_GE(opened, 1);
      EXPECT_EQ(released->load(), opened);
    }
  }

  test::TempDir dir;
  int opened = 0;
  std::shared_ptr<std::atomic<int>> released = std::make_shared<std::atomic<int>>(0);
};

TEST_P(Lifetime, AStreamReadsAfterItsSourceIsGone) {
  {
    // A bound of one tensor: the reader thread reads most tensors after the source is gone.
    auto stream =
        from_temporary([](const auto& src) { return TensorStream(src, {}, {.max_inflight_bytes = 1}); });
    std::size_t seen = 0;
    for (StreamItem& t : stream) {
      EXPECT_EQ(t.name, "t" + std::to_string(seen));
      EXPECT_TRUE(same(t.view.data, expected(seen))) << t.name;
      ++seen;
    }
    EXPECT_EQ(seen, kCount);
  }
  expect_owner_released();
}

TEST_P(Lifetime, AStreamDroppedEarlyAndItsItemsOutliveEverything) {
  std::optional<StreamItem> kept;
  {
    auto stream =
        from_temporary([](const auto& src) { return TensorStream(src, {}, {.max_inflight_bytes = 1}); });
    kept = stream.next();
    ASSERT_TRUE(kept);
  }  // the stream is dropped with tensors unread, its source long gone
  EXPECT_TRUE(same(kept->view.data, expected(0)));
  kept.reset();
  expect_owner_released();
}

TEST_P(Lifetime, APrefetchRunsAfterItsSourceIsGone) {
  {
    auto p = from_temporary([](const auto& src) { return prefetch(src); });
    p.wait();
    // Files in memory have nothing to warm; files on disk warm every tensor byte.
    const bool memory = GetParam() == Kind::MemoryOwned || GetParam() == Kind::MemoryCopy;
    std::uint64_t all = 0;
    for (auto n : kLens) all += n;
    EXPECT_EQ(p.total_bytes(), memory ? 0 : all);
    EXPECT_EQ(p.bytes_done(), p.total_bytes());
  }
  expect_owner_released();
}

TEST_P(Lifetime, SlicesSelectionsAndViewsReadAfterTheirSourceIsGone) {
  {
    auto slice = from_temporary([](const auto& src) { return src.get_slice("t3"); });
    auto selection = from_temporary(
        [](const auto& src) { return src.get_slice("t1").select({Index::range(1000, 61'000, 3)}); });
    auto view = from_temporary([](const auto& src) { return src.get_tensor("t1"); });
    EXPECT_TRUE(same(slice.select({Index::all()}).read().data, expected(3)));
    auto got = selection.read();
    auto all = expected(1);
    ASSERT_EQ(got.data.size(), 20'000u);
    for (std::size_t i = 0; i < got.data.size(); ++i) {
      ASSERT_EQ(static_cast<std::uint8_t>(got.data[i]), all[1000 + 3 * i]) << i;
    }
    EXPECT_TRUE(same(view.data, all));
  }
  expect_owner_released();
}

TEST_P(Lifetime, IteratorsAndRangesReadAfterTheirSourceIsGone) {
  // An iterator, a nothrow range, and a copy of an iterator taken mid-walk, each from a source
  // that is gone; the copy walks on by itself after the original is dropped.
  const auto walk = [](auto it, auto range) {
    ASSERT_NE(it, std::default_sentinel);
    EXPECT_EQ(it->name, "t0");
    ++it;
    std::optional<decltype(it)> copy(it);
    it = {};
    std::size_t seen = 1;
    for (; *copy != std::default_sentinel; ++*copy, ++seen) {
      EXPECT_EQ((*copy)->name, "t" + std::to_string(seen));
      EXPECT_TRUE(same((*copy)->view.data, expected(seen))) << seen;
    }
    copy.reset();
    EXPECT_EQ(seen, kCount);
    seen = 0;
    for (const auto& item : range) {
      ASSERT_TRUE(item) << item.status().message();
      EXPECT_TRUE(same(item->view.data, expected(seen))) << seen;
      ++seen;
    }
    EXPECT_EQ(seen, kCount);
  };
  if (GetParam() == Kind::Checkpoint) {
    auto it = Checkpoint(dir / "model.safetensors.index.json").begin();
    auto range = nothrow::tensors(Checkpoint(dir / "model.safetensors.index.json"));
    walk(std::move(it), std::move(range));
  } else {
    auto it = open_file().begin();
    auto range = nothrow::tensors(open_file());
    walk(std::move(it), std::move(range));
  }
  expect_owner_released();
}

TEST_P(Lifetime, AMultiRankPlanLoadsAfterItsSourceIsGone) {
  {
    auto plan = from_temporary([](const auto& src) {
      std::vector<std::vector<Selection>> needs(1);
      for (std::size_t t = 0; t < kCount; ++t)
        needs[0].push_back(src.get_slice("t" + std::to_string(t)).select({}));
      return LoadPlan(needs, {.max_step_bytes = 4096});
    });
    test::LocalGroup group(1);
    test::LocalGroup::Member me(group, 0);
    auto views = plan.load(me);
    ASSERT_EQ(views.size(), kCount);
    for (std::size_t t = 0; t < kCount; ++t) EXPECT_TRUE(same(views[t].data, expected(t))) << t;
  }
  expect_owner_released();
}

#if defined(SAFETENSORS_TEST_DLPACK)
TEST_P(Lifetime, ADLPackExportOutlivesItsViewAndSource) {
  {
    auto exported = from_temporary([](const auto& src) { return to_dlpack(src.get_tensor("t3")); });
    const auto& t = exported->dl_tensor;
    ASSERT_EQ(t.shape[0], static_cast<std::int64_t>(kLens[3]));
    std::span<const std::byte> bytes(static_cast<const std::byte*>(t.data) + t.byte_offset, kLens[3]);
    EXPECT_TRUE(same(bytes, expected(3)));
  }
  expect_owner_released();
}
#endif

INSTANTIATE_TEST_SUITE_P(EverySource, Lifetime,
                         ::testing::Values(Kind::Mmap, Kind::Read, Kind::Direct, Kind::MemoryOwned,
                                           Kind::MemoryCopy, Kind::Checkpoint),
                         [](const auto& p) { return name_of(p.param); });

}  // namespace
