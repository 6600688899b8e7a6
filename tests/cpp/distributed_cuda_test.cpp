// The device half of multi-rank loading (`cuda::load(plan, collective)`), with W threads as ranks
// over an in-process collective against the emulated CUDA driver (tests/cuda): every rank's tensors,
// read back from its one device allocation, equal a single-process slice; placements are aligned;
// the reads of all ranks cover the union of the needed bytes exactly once; shared reads cross
// either the host broadcast (then an upload from pinned memory) or the device broadcast; host
// copies come only from pinned memory; failures are typed and leak nothing. On a real GPU the
// same tests run (the emulator's counters are then skipped); NCCL itself is not exercised here.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <safetensors/distributed.hpp>
#include <safetensors/distributed_cuda.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <barrier>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <numeric>
#include <thread>

#include "support.hpp"

namespace {

using namespace safetensors;
using test::kind_of;

/// The emulated driver's entry points the tests call (absent on a real driver).
struct Driver {
  Driver() : lib(::dlopen("libcuda.so.1", RTLD_NOW)) {
    if (!lib) lib = ::dlopen("libcuda.so", RTLD_NOW);
  }
  template <class F>
  F get(const char* name) const {
    return lib ? reinterpret_cast<F>(::dlsym(lib, name)) : nullptr;
  }
  [[nodiscard]] bool emulated() const { return get<void*>("fakecuda_hold") != nullptr; }
  [[nodiscard]] int counter(const char* name) const { return get<int (*)()>(name)(); }
  [[nodiscard]] unsigned long long pageable_copies() const {
    return get<unsigned long long (*)()>("fakecuda_pageable_async_copies")();
  }
  void fail(const char* spec) const {
    ASSERT_EQ(get<int (*)(const char*)>("fakecuda_set_failures")(spec), 0);
  }
  void* lib;
};

/// Skips (reporting why) unless a GPU, real or emulated, is usable; under the emulated driver
/// (ctest puts it on the library path) an unusable GPU is a failure, never a skip.
bool gpu() {
  if (cuda::available()) return true;
  const char* path = std::getenv("LD_LIBRARY_PATH");
  if (path && std::string_view(path).find(SAFETENSORS_TEST_EMULATED_DRIVER) != std::string_view::npos) {
    ADD_FAILURE() << "the emulated CUDA driver is on the library path, yet: " << cuda::why_unavailable();
    return false;
  }
  std::cout << "[  SKIPPED ] no usable GPU: " << cuda::why_unavailable() << "\n";
  return false;
}

/// W threads' meeting point. Host broadcasts copy through published pointers; device broadcasts
/// do what NCCL's would on one device: the root's bytes, once its stream has them, are copied
/// into every other rank's buffer after that rank's stream has finished with it.
class LocalGroup {
 public:
  explicit LocalGroup(std::size_t world)
      : world_(world), sync_(static_cast<std::ptrdiff_t>(world)), slots_(world) {
    int dev = 0;
    drv_.get<int (*)(int*, int)>("cuDeviceGet")(&dev, 0);
    drv_.get<int (*)(void**, int)>("cuDevicePrimaryCtxRetain")(&ctx_, dev);
  }

  class Member : public Collective {
   public:
    Member(LocalGroup& g, std::size_t rank) : g_(g), rank_(rank) {}
    [[nodiscard]] std::size_t rank() const override { return rank_; }
    [[nodiscard]] std::size_t size() const override { return g_.world_; }
    void broadcast(std::span<std::byte> bytes, std::size_t root) override {
      if (rank_ == root) g_.slots_[root] = bytes.data();
      g_.sync_.arrive_and_wait();
      if (rank_ != root && !bytes.empty()) std::memcpy(bytes.data(), g_.slots_[root], bytes.size());
      g_.sync_.arrive_and_wait();
      host_broadcasts++;
    }
    void all_gather(std::span<const std::byte>, std::span<std::byte>) override {
      FAIL() << "not used by load";
    }

   protected:
    LocalGroup& g_;
    std::size_t rank_;

   public:
    std::size_t host_broadcasts = 0;
  };

  /// A member with a device path, as NcclCollective has.
  class DeviceMember final : public Member {
   public:
    using Member::Member;
    void broadcast_device(void* bytes, std::size_t len, std::size_t root, void* stream) override {
      const auto& d = g_.drv_;
      // EXPECT, not ASSERT: a rank that left early would leave the others at the barrier.
      EXPECT_EQ(d.get<int (*)(void*)>("cuCtxSetCurrent")(g_.ctx_), 0);
      EXPECT_EQ(d.get<int (*)(void*)>("cuStreamSynchronize")(stream), 0);
      if (rank_ == root) g_.slots_[root] = static_cast<std::byte*>(bytes);
      g_.sync_.arrive_and_wait();
      if (rank_ != root && len > 0) {
        auto copy = d.get<int (*)(std::uint64_t, std::uint64_t, std::size_t)>("cuMemcpyDtoD_v2");
        EXPECT_EQ(copy(reinterpret_cast<std::uintptr_t>(bytes),
                       reinterpret_cast<std::uintptr_t>(g_.slots_[root]), len),
                  0);
      }
      g_.sync_.arrive_and_wait();
      device_broadcasts++;
    }
    std::size_t device_broadcasts = 0;
  };

 private:
  Driver drv_;
  void* ctx_ = nullptr;
  std::size_t world_;
  std::barrier<> sync_;
  std::vector<std::byte*> slots_;
};

using Select = std::function<Selection(const Slice&, std::size_t, std::size_t)>;
struct Want {
  std::string name;
  Select select;
};

Selection whole(const Slice& s, std::size_t, std::size_t) {
  return s.select({});
}

std::vector<std::byte> iota_bytes(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  return v;
}

/// One transformer layer's tensors (as in distributed_test.cpp): column- and row-parallel
/// weights, a replicated norm, a fused QKV with 8 heads and 2 KV heads, an odd-sized tensor.
class DeviceLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    col_ = iota_bytes(8 * 6 * 4, 1);
    row_ = iota_bytes(6 * 8 * 4, 2);
    norm_ = iota_bytes(6 * 2, 3);
    qkv_ = iota_bytes(24 * 6 * 4, 4);
    odd_ = iota_bytes(10 * 3, 5);
    save_file(path(), {{"col.weight", TensorView{Dtype::F32, {8, 6}, col_, {}}},
                       {"row.weight", TensorView{Dtype::F32, {6, 8}, row_, {}}},
                       {"norm.weight", TensorView{Dtype::F16, {6}, norm_, {}}},
                       {"attn.qkv.weight", TensorView{Dtype::F32, {24, 6}, qkv_, {}}},
                       {"odd", TensorView{Dtype::U8, {10, 3}, odd_, {}}}});
  }
  [[nodiscard]] std::filesystem::path path() const { return dir_ / "layer.safetensors"; }

  /// Every rank's selections of `wants`, from one open file.
  static std::vector<std::vector<Selection>> needs_of(const SafeOpen& f, const std::vector<Want>& wants,
                                                      std::size_t world) {
    std::vector<std::vector<Selection>> needs(world);
    for (std::size_t r = 0; r < world; ++r) {
      for (const auto& w : wants) needs[r].push_back(w.select(f.get_slice(w.name), r, world));
    }
    return needs;
  }

  /// Runs a world of `world` threads loading `wants` onto device 0 via `via`, each checking its
  /// allocation against single-process slices; then checks that the bytes read across ranks
  /// are the union of the needed bytes.
  void run_world(std::size_t world, const std::vector<Want>& wants, cuda::Via via) {
    LocalGroup group(world);
    std::vector<std::uint64_t> read_by(world);
    std::vector<std::size_t> host_bc(world), device_bc(world);
    std::vector<std::exception_ptr> errors(world);
    std::vector<std::thread> threads;
    for (std::size_t rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          SafeOpen f(path());  // each rank opens the file itself, as a process would
          auto needs = needs_of(f, wants, world);
          LoadPlan plan(needs, {64});  // small steps: many reads and broadcasts per tensor
          LocalGroup::DeviceMember me(group, rank);
          auto mine = cuda::load(plan, me, {.device = 0, .via = via});
          const auto& placed = mine.placements();
          ASSERT_EQ(placed.size(), wants.size());
          std::size_t end = 0;
          for (std::size_t i = 0; i < placed.size(); ++i) {
            const auto& p = placed[i];
            auto want = needs[rank][i].read();
            EXPECT_EQ(p.name, wants[i].name);
            EXPECT_EQ(p.shape, want.shape) << p.name;
            EXPECT_EQ(p.dtype, want.dtype) << p.name;
            EXPECT_EQ(p.offset % 256, 0u) << p.name;
            EXPECT_GE(p.offset, end) << p.name << " overlaps the tensor before it";
            end = p.offset + p.byte_size;
            ASSERT_EQ(p.byte_size, want.data.size()) << p.name;
            std::vector<std::byte> got(p.byte_size);
            cuda::copy_to_host(static_cast<std::byte*>(mine.buffer().data()) + p.offset, got);
            EXPECT_TRUE(std::ranges::equal(got, want.data))
                << "rank " << rank << " differs from a single-process slice of " << p.name;
          }
          EXPECT_LE(end, mine.buffer().size());
          read_by[rank] = plan.bytes_read_here();
          host_bc[rank] = me.host_broadcasts;
          device_bc[rank] = me.device_broadcasts;
        } catch (...) {
          errors[rank] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    // The union of every rank's needed bytes, from the selections' runs (one file).
    SafeOpen f(path());
    auto needs = needs_of(f, wants, world);
    std::vector<char> mask;
    for (const auto& rank_needs : needs) {
      for (const auto& sel : rank_needs) {
        for (const auto& run : sel.runs()) {
          if (mask.size() < run.offset + run.length) mask.resize(run.offset + run.length);
          std::fill_n(mask.begin() + static_cast<std::ptrdiff_t>(run.offset), run.length, char{1});
        }
      }
    }
    const auto union_bytes = static_cast<std::uint64_t>(std::count(mask.begin(), mask.end(), char{1}));
    EXPECT_EQ(std::accumulate(read_by.begin(), read_by.end(), std::uint64_t{0}), union_bytes)
        << "bytes read across ranks differ from the union of the needed bytes";
    // Shared reads went through the collective path asked for, and only that one.
    const std::size_t shared = via == cuda::Via::Host ? host_bc[0] : device_bc[0];
    EXPECT_EQ(via == cuda::Via::Host ? device_bc[0] : host_bc[0], 0u);
    if (world > 1) {
      EXPECT_GT(shared, 0u) << "the replicated norm is a shared read";
    }
  }

  test::TempDir dir_;
  std::vector<std::byte> col_, row_, norm_, qkv_, odd_;
};

const Gqa gqa{8, 2, 2};

std::vector<Want> layer_wants() {
  return {
      {"col.weight", [](const Slice& s, std::size_t r, std::size_t w) { return column_parallel(s, r, w); }},
      {"row.weight", [](const Slice& s, std::size_t r, std::size_t w) { return row_parallel(s, r, w); }},
      {"norm.weight", whole},
      {"attn.qkv.weight",
       [](const Slice& s, std::size_t r, std::size_t w) { return qkv_shard(s, gqa, r, w).q; }},
      {"attn.qkv.weight",
       [](const Slice& s, std::size_t r, std::size_t w) { return qkv_shard(s, gqa, r, w).k; }},
      {"attn.qkv.weight",
       [](const Slice& s, std::size_t r, std::size_t w) { return qkv_shard(s, gqa, r, w).v; }}};
}

TEST_F(DeviceLayer, HostCollectiveFourRanks) {
  if (!gpu()) return;
  Driver drv;
  const auto pageable = drv.emulated() ? drv.pageable_copies() : 0;
  run_world(4, layer_wants(), cuda::Via::Host);
  if (drv.emulated()) {
    EXPECT_EQ(drv.pageable_copies(), pageable) << "an async copy from pageable memory";
    EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), 0) << "scratch or a result leaked";
  }
}

TEST_F(DeviceLayer, DeviceCollectiveFourRanks) {
  if (!gpu()) return;
  Driver drv;
  const auto pageable = drv.emulated() ? drv.pageable_copies() : 0;
  run_world(4, layer_wants(), cuda::Via::Device);
  if (drv.emulated()) {
    EXPECT_EQ(drv.pageable_copies(), pageable) << "an async copy from pageable memory";
    EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), 0) << "scratch or a result leaked";
  }
}

TEST_F(DeviceLayer, WorldLargerThanKvHeadsBothPaths) {
  if (!gpu()) return;
  // 8 ranks, 2 KV heads: ranks 0-3 share KV head 0, ranks 4-7 KV head 1.
  run_world(8, layer_wants(), cuda::Via::Device);
  run_world(8, layer_wants(), cuda::Via::Host);
}

TEST_F(DeviceLayer, UnevenEmptyAndSingleRankShares) {
  if (!gpu()) return;
  auto uneven = [](const Slice& s, std::size_t r, std::size_t w) { return shard(s, 0, r, w, Split::Uneven); };
  // 10 rows over 16 ranks: 6 ranks get nothing (a zero-byte placement), yet take part.
  run_world(16, {{"odd", uneven}, {"norm.weight", whole}}, cuda::Via::Device);
  run_world(1, layer_wants(), cuda::Via::Host);
}

TEST_F(DeviceLayer, HostOnlyCollectiveRefusesDeviceBroadcastAndLeaksNothing) {
  if (!gpu()) return;
  Driver drv;
  const int live = drv.emulated() ? drv.counter("fakecuda_live_device_allocations") : 0;
  // Two ranks both need the norm: the first shared read asks for a device broadcast, which a
  // host-only collective refuses on every rank (before any rank waits on another).
  LocalGroup group(2);
  std::vector<ErrorKind> kinds(2);
  std::vector<std::thread> threads;
  for (std::size_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      SafeOpen f(path());
      LoadPlan plan(needs_of(f, {{"norm.weight", whole}}, 2));
      LocalGroup::Member me(group, rank);
      kinds[rank] = kind_of([&] { (void)cuda::load(plan, me, {.via = cuda::Via::Device}); });
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(kinds, (std::vector<ErrorKind>{ErrorKind::Cuda, ErrorKind::Cuda}));
  if (drv.emulated()) {
    EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), live);
  }
}

TEST_F(DeviceLayer, PlanAndCollectiveOfDifferentWorldsOrBadOptionsAreRefused) {
  if (!gpu()) return;
  SafeOpen f(path());
  LoadPlan plan(needs_of(f, layer_wants(), 2));
  LocalGroup group(3);
  LocalGroup::DeviceMember me(group, 0);
  EXPECT_EQ(kind_of([&] { (void)cuda::load(plan, me); }), ErrorKind::InvalidSlice);
  LoadPlan one(needs_of(f, layer_wants(), 1));
  LocalGroup solo(1);
  LocalGroup::DeviceMember only(solo, 0);
  EXPECT_EQ(kind_of([&] { (void)cuda::load(one, only, {.alignment = 100}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)cuda::load(one, only, {.device = 7}); }), ErrorKind::Cuda);
  // A custom alignment is honoured.
  auto mine = cuda::load(one, only, {.alignment = 4096});
  for (const auto& p : mine.placements()) EXPECT_EQ(p.offset % 4096, 0u) << p.name;
}

TEST_F(DeviceLayer, InjectedDriverFailuresAreCudaErrorsAndLeakNothing) {
  if (!gpu()) return;
  Driver drv;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  SafeOpen f(path());
  LoadPlan plan(needs_of(f, layer_wants(), 1), {64});
  LocalGroup solo(1);
  LocalGroup::DeviceMember me(solo, 0);
  const int live = drv.counter("fakecuda_live_device_allocations");
  const int pinned = drv.counter("fakecuda_live_pinned_allocations");
  for (const char* spec :
       {"cuMemAlloc:1", "cuMemHostAlloc:1", "cuMemcpyHtoDAsync:3", "cuStreamSynchronize:1"}) {
    drv.fail(spec);
    EXPECT_EQ(kind_of([&] { (void)cuda::load(plan, me); }), ErrorKind::Cuda) << spec;
    drv.fail("");
    EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), live) << spec;
    EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), pinned) << spec;
  }
  // And the next load works.
  auto mine = cuda::load(plan, me);
  auto want = f.get_tensor("norm.weight");
  const auto& p = mine.placements().at(2);
  std::vector<std::byte> got(p.byte_size);
  cuda::copy_to_host(mine.data("norm.weight"), got);
  EXPECT_TRUE(std::ranges::equal(got, want.data));
}

TEST_F(DeviceLayer, StagingIsNotRefilledUnderAPendingCopy) {
  if (!gpu()) return;
  Driver drv;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's slow copies";
  // Slow copies: refilling the pinned buffer before its copies finish would change bytes a
  // pending copy still reads (the emulator aborts on that) and land wrong bytes on the device.
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(2000);
  run_world(2, layer_wants(), cuda::Via::Host);
  run_world(2, layer_wants(), cuda::Via::Device);
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(0);
}

}  // namespace
