// TensorStream through the public API: every streamed byte equals what get_tensor (or a
// slice's read) gives, for a file and for sharded checkpoints (Python's and ours), with every
// backend; items say where they came from; the in-flight bound holds (peak_inflight_bytes);
// BudgetExceeded when one thread holds too much, never with wait_for_release and another thread
// dropping; a stream dropped early returns promptly; a file that shrinks gives Io; the nothrow
// twins agree. Labelled `concurrency`: the tsan preset runs these under ThreadSanitizer.
#include <safetensors/safetensors.hpp>
#include <safetensors/stream.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <ranges>
#include <thread>

#include "support.hpp"

namespace nt = safetensors::nothrow;
using safetensors::Backend;
using safetensors::Checkpoint;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::Request;
using safetensors::SafeOpen;
using safetensors::StreamItem;
using safetensors::StreamOptions;
using safetensors::TensorStream;
using safetensors::TensorView;

static_assert(std::ranges::input_range<TensorStream>);
static_assert(!std::is_copy_constructible_v<TensorStream>);

namespace {

/// Lengths of the sample's U8 tensors t0..t7, in file order: sizes around the block size, one
/// empty, one (300,000) larger than the bounds the tests use.
constexpr std::size_t kLens[] = {1000, 70'000, 4096, 300'000, 12, 0, 50'000, 65'536};
constexpr std::size_t kCount = std::size(kLens);

std::uint8_t byte_of(std::size_t t, std::size_t i) {
  return static_cast<std::uint8_t>(i * 13 + t * 7 + i / 251);
}

/// Writes the sample (tensors named t0..t7, in this order in the file) and returns its path.
std::filesystem::path write_sample(const test::TempDir& dir, const std::string& name = "s.safetensors") {
  std::vector<std::vector<std::uint8_t>> datas(kCount);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (std::size_t t = 0; t < kCount; ++t) {
    datas[t].resize(kLens[t]);
    for (std::size_t i = 0; i < kLens[t]; ++i) datas[t][i] = byte_of(t, i);
    tensors.emplace_back("t" + std::to_string(t),
                         TensorView{Dtype::U8, {kLens[t]}, std::as_bytes(std::span(datas[t])), {}});
  }
  auto path = dir / name;
  safetensors::save_file(path, tensors);
  return path;
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

/// An item equals what a direct read gives: dtype, shape and every byte.
void expect_item_is(const StreamItem& item, const TensorView& want) {
  EXPECT_EQ(item.view.dtype, want.dtype) << item.name;
  EXPECT_EQ(item.view.shape, want.shape) << item.name;
  EXPECT_TRUE(same_bytes(item.view.data, want.data)) << item.name;
}

class Streams : public ::testing::TestWithParam<Backend> {};

TEST_P(Streams, EveryByteOfAFileEqualsGetTensorInFileOrderWithinTheBound) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {GetParam()});
  const std::uint64_t bound = 100'000;
  TensorStream stream(f, {}, {.max_inflight_bytes = bound});
  EXPECT_EQ(stream.size(), kCount);
  std::uint64_t total = 0;
  for (auto l : kLens) total += l;
  EXPECT_EQ(stream.total_bytes(), total);
  std::vector<std::string> order;
  for (StreamItem& item : stream) {
    expect_item_is(item, f.get_tensor(item.name));
    EXPECT_EQ(item.shard, 0u);
    EXPECT_EQ(item.index, order.size());
    EXPECT_EQ(item.request, order.size());
    EXPECT_EQ(item.path, path);
    EXPECT_LE(stream.inflight_bytes(), std::max<std::uint64_t>(bound, item.view.data.size()));
    order.push_back(item.name);
  }
  EXPECT_EQ(order, f.offset_keys());
  // t3 (300,000 bytes) is larger than the bound: read alone, so the peak is exactly it.
  EXPECT_EQ(stream.peak_inflight_bytes(), 300'000u);
  EXPECT_EQ(stream.inflight_bytes(), 0u);
  EXPECT_FALSE(stream.next().has_value()) << "the end stays the end";
}

TEST_P(Streams, RequestsAndSelectionsEqualSliceReadsAndSayWhichRequestTheyAre) {
  test::TempDir dir;
  std::vector<float> grid(64 * 48);
  for (std::size_t i = 0; i < grid.size(); ++i) grid[i] = static_cast<float>(i) * 0.5f;
  std::vector<std::uint8_t> small{1, 2, 3};
  auto path = dir / "g.safetensors";
  safetensors::save_file(path,
                         {{"grid", TensorView{Dtype::F32, {64, 48}, std::as_bytes(std::span(grid)), {}}},
                          {"small", TensorView{Dtype::U8, {3}, std::as_bytes(std::span(small)), {}}}});
  SafeOpen f(path, {GetParam()});
  std::vector<Request> want{{"small"},
                            {"grid", {Index::range(8, 40), Index::range(0, 48, 5)}},
                            {"grid", {Index::range(0, 16)}},
                            {"small", {}, 0},
                            {"grid", {5}}};
  TensorStream stream(f, want, {.max_inflight_bytes = 1 << 20});
  std::vector<std::size_t> requests;
  while (auto item = stream.next()) {
    const Request& r = want.at(item->request);
    EXPECT_EQ(item->name, r.name);
    expect_item_is(*item, f.get_slice(r.name).select(r.select).read());
    requests.push_back(item->request);
  }
  // File order: grid's selections (grid comes first in the file; requests of one tensor in
  // request order), then small's.
  EXPECT_EQ(f.offset_keys(), (std::vector<std::string>{"grid", "small"}));
  EXPECT_EQ(requests, (std::vector<std::size_t>{1, 2, 4, 0, 3}));
}

/// The shard index an item says against the checkpoint's own shard list.
std::size_t shard_number(const Checkpoint& ckpt, const std::string& name) {
  auto paths = ckpt.shard_paths();
  return static_cast<std::size_t>(std::find(paths.begin(), paths.end(), ckpt.shard_of(name)) - paths.begin());
}

TEST_P(Streams, APythonWrittenShardedCheckpointEqualsGetTensorShardByShard) {
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  Checkpoint ckpt(*dir / "model.safetensors.index.json", {GetParam()});
  TensorStream stream(ckpt, {}, {.max_inflight_bytes = 1024});
  std::size_t last_shard = 0, count = 0;
  for (auto& item : stream) {
    expect_item_is(item, ckpt.get_tensor(item.name));
    EXPECT_EQ(item.shard, shard_number(ckpt, item.name)) << item.name;
    EXPECT_EQ(item.path, ckpt.shard_of(item.name));
    EXPECT_GE(item.shard, last_shard) << "shard by shard";
    last_shard = item.shard;
    ++count;
  }
  EXPECT_EQ(count, ckpt.size());
  // Selections across shards, one pinned to the shard that holds it.
  const std::string emb = "model.embed_tokens.weight", up = "model.layers.3.mlp.up_proj.weight";
  std::vector<Request> want{{up, {Index::all(), Index::range(2, 6)}},
                            {emb, {Index::range(4, 12)}, shard_number(ckpt, emb)}};
  TensorStream some(ckpt, want);
  std::size_t seen = 0;
  for (auto& item : some) {
    expect_item_is(item, ckpt.get_slice(item.name).select(want[item.request].select).read());
    ++seen;
  }
  EXPECT_EQ(seen, 2u);
}

/// Three shards written with our writer, and their index; s1.big is larger than 100,000 bytes.
std::filesystem::path write_checkpoint(const test::TempDir& dir) {
  struct T {
    std::string name;
    std::vector<std::size_t> shape;
  };
  const std::vector<std::vector<T>> shards{{{"s0.w", {64, 33}}, {"s0.b", {7}}, {"s0.e", {0, 4}}},
                                           {{"s1.big", {3, 50'000}}, {"s1.x", {5, 6, 7}}},
                                           {{"s2.a", {9, 100}}, {"s2.z", {33'333}}}};
  std::string map;
  for (std::size_t k = 0; k < shards.size(); ++k) {
    std::string file = "part-" + std::to_string(k) + ".safetensors";
    std::vector<std::vector<std::uint8_t>> datas;
    std::vector<std::pair<std::string, TensorView>> tensors;
    datas.reserve(shards[k].size());
    for (const auto& t : shards[k]) {
      std::size_t n = 1;
      for (auto d : t.shape) n *= d;
      auto& d = datas.emplace_back(n);
      for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::uint8_t>(i * 3 + k + t.name.size());
      tensors.emplace_back(t.name, TensorView{Dtype::U8, t.shape, std::as_bytes(std::span(d)), {}});
      map += (map.empty() ? "" : ",") + ("\"" + t.name + "\":\"" + file + "\"");
    }
    safetensors::save_file(dir / file, tensors);
  }
  auto index = dir / "model.safetensors.index.json";
  std::ofstream(index) << R"({"metadata":{},"weight_map":{)" << map << "}}";
  return index;
}

TEST_P(Streams, OurShardedCheckpointEqualsGetTensorWithinTheBound) {
  test::TempDir dir;
  Checkpoint ckpt(write_checkpoint(dir), {GetParam()});
  TensorStream stream(ckpt, {}, {.max_inflight_bytes = 100'000});
  std::vector<std::string> names;
  for (auto& item : stream) {
    expect_item_is(item, ckpt.get_tensor(item.name));
    EXPECT_EQ(item.shard, shard_number(ckpt, item.name));
    names.push_back(item.name);
  }
  std::vector<std::string> file_order;
  for (const auto& shard : ckpt.shard_paths())
    for (const auto& name : SafeOpen(shard).offset_keys()) file_order.push_back(name);
  EXPECT_EQ(names, file_order);
  EXPECT_EQ(names.size(), 7u);
  EXPECT_EQ(stream.peak_inflight_bytes(), 150'000u) << "s1.big, read alone";
}

TEST_P(Streams, TheBoundIsNeverExceededWhileTheCallerKeepsAWindow) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {GetParam()});
  // Every tensor but t3 (300,000 bytes); keeping the last two items alive.
  std::vector<Request> want;
  for (std::size_t t = 0; t < kCount; ++t)
    if (t != 3) want.push_back({"t" + std::to_string(t)});
  const std::uint64_t bound = 140'000;
  TensorStream stream(f, want, {.max_inflight_bytes = bound});
  std::deque<StreamItem> window;
  while (auto item = stream.next()) {
    window.push_back(std::move(*item));
    if (window.size() > 2) window.pop_front();
    EXPECT_LE(stream.inflight_bytes(), bound);
  }
  EXPECT_LE(stream.peak_inflight_bytes(), bound);
  EXPECT_GE(stream.peak_inflight_bytes(), 70'000u);
  window.clear();
  EXPECT_EQ(stream.inflight_bytes(), 0u);
}

TEST_P(Streams, OneThreadHoldingTooMuchGetsBudgetExceededNotAHang) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {GetParam()});
  TensorStream stream(f, {}, {.max_inflight_bytes = 100'000});
  std::vector<StreamItem> held;
  for (int i = 0; i < 3; ++i) held.push_back(*stream.next());  // t0, t1, t2: 75,096 bytes
  try {
    (void)stream.next();
    ADD_FAILURE() << "no BudgetExceeded";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BudgetExceeded);
    std::string what = e.what();
    for (const char* part : {"t3", "75096", "100000", "300000", "max_inflight_bytes", "wait_for_release"})
      EXPECT_NE(what.find(part), std::string::npos) << part << ": " << what;
  }
  // Still holding them: the same error again, never an end.
  EXPECT_EQ(test::kind_of([&] { (void)stream.next(); }), ErrorKind::BudgetExceeded);
  EXPECT_TRUE(same_bytes(held[1].view.data, f.get_tensor("t1").data)) << "what was delivered stays valid";
  // Recoverable: dropping them and asking again goes on with t3, then the rest, skipping none.
  held.clear();
  std::vector<std::string> rest;
  while (auto t = stream.next()) {
    EXPECT_TRUE(same_bytes(t->view.data, f.get_tensor(t->name).data)) << t->name;
    rest.push_back(t->name);
  }
  EXPECT_EQ(rest, (std::vector<std::string>{"t3", "t4", "t5", "t6", "t7"}));
  EXPECT_EQ(stream.inflight_bytes(), 0u);
}

TEST_P(Streams, WaitForReleaseWaitsWhileAnotherThreadDropsTheItems) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {GetParam()});
  const std::uint64_t bound = 100'000;
  TensorStream stream(f, {}, {.max_inflight_bytes = bound, .wait_for_release = true});
  std::mutex m;
  std::condition_variable cv;
  std::deque<StreamItem> queue;
  bool done = false;
  std::vector<std::string> checked;
  std::thread worker([&] {
    for (;;) {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return done || !queue.empty(); });
      if (queue.empty()) return;
      StreamItem item = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the caller gets ahead
      expect_item_is(item, f.get_tensor(item.name));
      checked.push_back(item.name);
    }  // `item` is dropped here, on this thread
  });
  for (auto& item : stream) {
    std::lock_guard lock(m);
    queue.push_back(std::move(item));
    cv.notify_one();
  }
  {
    std::lock_guard lock(m);
    done = true;
  }
  cv.notify_one();
  worker.join();
  EXPECT_EQ(checked.size(), kCount);
  EXPECT_LE(stream.peak_inflight_bytes(), 300'000u);
  EXPECT_EQ(stream.inflight_bytes(), 0u);
}

TEST_P(Streams, ItemsOutliveTheirStreamAndFile) {
  test::TempDir dir;
  auto path = write_sample(dir);
  std::vector<StreamItem> kept;
  {
    SafeOpen f(path, {GetParam()});
    TensorStream stream(f, {}, {.max_inflight_bytes = 1 << 20});
    kept.push_back(*stream.next());
    kept.push_back(*stream.next());
  }
  SafeOpen again(path);
  for (const auto& item : kept) expect_item_is(item, again.get_tensor(item.name));
}

TEST_P(Streams, SeveralThreadsStreamOneFileAndOneCheckpointAtOnce) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {GetParam()});
  Checkpoint ckpt(write_checkpoint(dir), {GetParam()});
  std::vector<std::thread> threads;
  std::atomic<std::size_t> items{0};
  for (int k = 0; k < 6; ++k) {
    threads.emplace_back([&, k] {
      if (k % 2 == 0) {
        for (auto& item : TensorStream(f, {}, {.max_inflight_bytes = 64 << 10})) {
          expect_item_is(item, f.get_tensor(item.name));
          ++items;
        }
      } else {
        for (auto& item : TensorStream(ckpt, {}, {.max_inflight_bytes = 64 << 10})) {
          expect_item_is(item, ckpt.get_tensor(item.name));
          ++items;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(items.load(), 3 * kCount + 3 * ckpt.size());
}

INSTANTIATE_TEST_SUITE_P(Backends, Streams, ::testing::Values(Backend::Mmap, Backend::Read, Backend::Direct),
                         [](const ::testing::TestParamInfo<Backend>& p) {
                           return std::string(p.param == Backend::Mmap   ? "Mmap"
                                              : p.param == Backend::Read ? "Read"
                                                                         : "Direct");
                         });

TEST(Stream, ARangeForKeepsNothingSoItNeverExceedsTheBudget) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {Backend::Read});
  // Each tensor fits the bound alone, no two of the large ones together.
  std::size_t n = 0;
  for (auto& item : TensorStream(f, {}, {.max_inflight_bytes = 300'000})) n += item.view.data.size() > 0;
  EXPECT_EQ(n, kCount - 1);
}

TEST(Stream, AbandoningAStreamReturnsPromptlyAndKeepsWhatWasDelivered) {
  test::TempDir dir;
  // 64 tensors of 1 MiB; a bound of two of them.
  std::vector<std::uint8_t> data(1 << 20, 7);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (int i = 0; i < 64; ++i)
    tensors.emplace_back("t" + std::to_string(i),
                         TensorView{Dtype::U8, {data.size()}, std::as_bytes(std::span(data)), {}});
  auto path = dir / "big.safetensors";
  safetensors::save_file(path, tensors);
  for (bool wait : {false, true}) {
    SafeOpen f(path, {Backend::Read});
    std::optional<StreamItem> held;
    auto start = std::chrono::steady_clock::now();
    {
      TensorStream stream(f, {}, {.max_inflight_bytes = 2 << 20, .wait_for_release = wait});
      held = stream.next();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the reader waits on the budget
    }
    auto took = std::chrono::steady_clock::now() - start;
    // Generous: a hang would never end; reading the whole file would take far more than one
    // tensor's read, and only one read may be in progress.
    EXPECT_LT(took, std::chrono::seconds(5));
    ASSERT_TRUE(held.has_value());
    EXPECT_EQ(held->view.data.size(), data.size());
    EXPECT_EQ(static_cast<std::uint8_t>(held->view.data[12345]), 7);
    EXPECT_EQ(f.bytes_read(), 2u << 20) << "only what fitted the bound was read";
  }
}

TEST(Stream, AFileThatShrinksMidStreamGivesIoAndFreesEverything) {
  for (auto backend : {Backend::Read, Backend::Direct}) {
    test::TempDir dir;
    auto path = write_sample(dir);
    SafeOpen f(path, {backend});
    // A bound of 1: one tensor at a time, so nothing past t0 is read before the cut.
    TensorStream stream(f, {}, {.max_inflight_bytes = 1});
    auto first = stream.next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->name, "t0");
    std::filesystem::resize_file(path, f.data_offset() + 2000);
    first.reset();
    try {
      while (stream.next()) {
      }
      ADD_FAILURE() << "no error";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
      EXPECT_NE(std::string(e.what()).find("s.safetensors"), std::string::npos) << e.what();
    }
    // The stream failed: every later call reports that error again, never a normal end.
    const auto first_error = test::thrown([&] { (void)stream.next(); });
    EXPECT_EQ(first_error.kind(), ErrorKind::Io);
    for (int i = 0; i < 3; ++i) test::expect_same(nt::next(stream).status(), first_error);
    EXPECT_EQ(stream.inflight_bytes(), 0u);
  }
}

TEST(Stream, RequestsThatCannotBeServedAreRefusedBeforeAnythingIsRead) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {Backend::Read});
  auto refused = [&](std::vector<Request> want) { return test::kind_of([&] { TensorStream s(f, want); }); };
  EXPECT_EQ(refused({{"t0"}, {"nope"}}), ErrorKind::TensorNotFound);
  EXPECT_EQ(refused({{"t1", {Index::range(0, 70'001)}}}), ErrorKind::InvalidSlice);
  EXPECT_EQ(refused({{"t1", {Index::all(), 0}}}), ErrorKind::InvalidSlice);
  EXPECT_EQ(refused({{"t1", {SIZE_MAX}}}), ErrorKind::InvalidSlice);
  EXPECT_EQ(refused({{"t1", {}, 1}}), ErrorKind::TensorNotFound);
  EXPECT_EQ(refused({{std::string("t\xff")}}), ErrorKind::TensorNotFound);
  EXPECT_EQ(f.bytes_read(), 0u);
  test::TempDir shards;
  Checkpoint ckpt(write_checkpoint(shards));
  EXPECT_EQ(test::kind_of([&] {
              TensorStream s(ckpt, std::vector<Request>{{"s1.x", {}, 0}});
            }),
            ErrorKind::TensorNotFound);
  EXPECT_EQ(test::kind_of([&] { TensorStream s(ckpt, std::vector<Request>{{"s9"}}); }),
            ErrorKind::TensorNotFound);
  // An empty request list streams nothing.
  TensorStream none(f, std::vector<Request>{});
  EXPECT_EQ(none.size(), 0u);
  EXPECT_FALSE(none.next().has_value());
}

TEST(Stream, NothrowTwinsAgreeWithTheThrowingFaces) {
  test::TempDir dir;
  auto path = write_sample(dir);
  SafeOpen f(path, {Backend::Read});
  // Items: the same names, shapes and bytes.
  auto quiet = nt::stream(f, {}, {.max_inflight_bytes = 1 << 20});
  ASSERT_TRUE(quiet);
  TensorStream loud(f, {}, {.max_inflight_bytes = 1 << 20});
  for (;;) {
    auto a = nt::next(*quiet);
    ASSERT_TRUE(a) << a.status().message();
    auto b = loud.next();
    ASSERT_EQ(a->has_value(), b.has_value());
    if (!b) break;
    EXPECT_EQ((*a)->name, b->name);
    EXPECT_TRUE(same_bytes((*a)->view.data, b->view.data));
  }
  // Errors: requests, the budget, a moved-from stream.
  std::vector<Request> missing{{"nope"}};
  test::expect_same(nt::stream(f, missing).status(), test::thrown([&] { TensorStream s(f, missing); }));
  auto a = nt::stream(f, {}, {.max_inflight_bytes = 100'000});
  TensorStream b(f, {}, {.max_inflight_bytes = 100'000});
  std::vector<StreamItem> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(**nt::next(*a));
    held.push_back(*b.next());
  }
  auto budget = nt::next(*a);
  ASSERT_FALSE(budget);
  EXPECT_EQ(budget.status().kind(), ErrorKind::BudgetExceeded);
  test::expect_same(budget.status(), test::thrown([&] { (void)b.next(); }));
  TensorStream moved = std::move(b);
  auto gone = nt::next(b);  // NOLINT: use after move is the point
  EXPECT_EQ(gone.status().kind(), ErrorKind::Internal);
  test::expect_same(gone.status(), test::thrown([&] { (void)b.next(); }));
  EXPECT_EQ(test::kind_of([&] { (void)b.size(); }), ErrorKind::Internal);
}

}  // namespace
