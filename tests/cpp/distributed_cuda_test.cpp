// The device half of multi-rank loading (`cuda::load(plan, collective)`), with W threads as ranks
// over an in-process collective against the emulated CUDA driver (tests/cuda): every rank's tensors,
// read back from its one device allocation, equal a single-process slice; placements are aligned;
// the reads of all ranks cover the union of the needed bytes exactly once; shared reads cross
// either the host broadcast (then an upload from pinned memory) or the device broadcast; host
// copies come only from pinned memory; failures are typed and leak nothing. On a real GPU the
// same tests run (the emulator's counters are then skipped); NCCL itself is not exercised here.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <safetensors/cuda.hpp>
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

#include "gpu_support.hpp"
#include "multi_rank.hpp"

namespace {

using namespace safetensors;
using test::kind_of;

using test::Driver;

/// The host group with a device path, as NcclCollective has: the root's bytes, once its stream
/// has them, are copied into every other rank's buffer after that rank's stream has finished
/// with it, as NCCL's broadcast would on one device.
class DeviceGroup : public test::LocalGroup {
 public:
  explicit DeviceGroup(std::size_t world) : test::LocalGroup(world) {
    int dev = 0;
    drv_.get<int (*)(int*, int)>("cuDeviceGet")(&dev, 0);
    drv_.get<int (*)(void**, int)>("cuDevicePrimaryCtxRetain")(&ctx_, dev);
  }

  class DeviceMember final : public Member {
   public:
    DeviceMember(DeviceGroup& g, std::size_t rank) : Member(g, rank), group_(g) {}
    void broadcast_device(void* bytes, std::size_t len, std::size_t root, void* stream) override {
      const auto& d = group_.drv_;
      // EXPECT, not ASSERT: a rank that left early would leave the others at the barrier.
      EXPECT_EQ(d.get<int (*)(void*)>("cuCtxSetCurrent")(group_.ctx_), 0);
      EXPECT_EQ(d.get<int (*)(void*)>("cuStreamSynchronize")(stream), 0);
      if (rank_ == root) group_.slots_[root] = static_cast<std::byte*>(bytes);
      group_.sync_.arrive_and_wait();
      if (rank_ != root && len > 0) {
        auto copy = d.get<int (*)(std::uint64_t, std::uint64_t, std::size_t)>("cuMemcpyDtoD_v2");
        EXPECT_EQ(copy(reinterpret_cast<std::uintptr_t>(bytes),
                       reinterpret_cast<std::uintptr_t>(group_.slots_[root]), len),
                  0);
        // A device-to-device cuMemcpy does not wait for the host: wait for it (the legacy
        // stream) before the barrier that lets the root reuse its buffer.
        EXPECT_EQ(d.get<int (*)(void*)>("cuStreamSynchronize")(nullptr), 0);
      }
      group_.sync_.arrive_and_wait();
      device_broadcasts++;
    }
    std::size_t device_broadcasts = 0;

   private:
    DeviceGroup& group_;
  };

 private:
  Driver drv_;
  void* ctx_ = nullptr;
};

using test::layer_wants;
using test::Want;
using test::whole;

/// The layer file of multi_rank.hpp, loaded by W threads onto device 0.
class DeviceLayer : public test::LayerFile {
 protected:
  /// Runs a world of `world` threads loading `wants` onto device 0 via `via`, each checking its
  /// allocation against single-process slices; then checks that the bytes read across ranks
  /// are the union of the needed bytes.
  void run_world(std::size_t world, const std::vector<Want>& wants, cuda::Via via,
                 std::size_t step_bytes = 64) {
    DeviceGroup group(world);
    std::vector<std::uint64_t> read_by(world);
    std::vector<std::size_t> host_bc(world), device_bc(world);
    std::vector<std::exception_ptr> errors(world);
    std::vector<std::thread> threads;
    for (std::size_t rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          SafeOpen f(path());  // each rank opens the file itself, as a process would
          auto needs = test::needs_of(f, wants, world);
          // By default small steps: many reads and broadcasts per tensor.
          LoadPlan plan(needs, {step_bytes});
          DeviceGroup::DeviceMember me(group, rank);
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
    auto needs = test::needs_of(f, wants, world);
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

  /// Four ranks load the layer; under the emulated driver, no copy came from pageable memory
  /// and no device memory is left (scratch freed, results freed by the test).
  void run_four_ranks_copying_only_from_pinned_memory(cuda::Via via) {
    Driver drv;
    const auto pageable = drv.emulated() ? drv.pageable_copies() : 0;
    run_world(4, layer_wants(), via);
    if (drv.emulated()) {
      EXPECT_EQ(drv.pageable_copies(), pageable) << "an async copy from pageable memory";
      EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), 0) << "scratch or a result leaked";
    }
  }
};

TEST_F(DeviceLayer, HostCollectiveFourRanks) {
  if (test::gpu_or_skip()) run_four_ranks_copying_only_from_pinned_memory(cuda::Via::Host);
}

TEST_F(DeviceLayer, DeviceCollectiveFourRanks) {
  if (test::gpu_or_skip()) run_four_ranks_copying_only_from_pinned_memory(cuda::Via::Device);
}

TEST_F(DeviceLayer, WorldLargerThanKvHeadsBothPaths) {
  if (!test::gpu_or_skip()) return;
  // 8 ranks, 2 KV heads: ranks 0-3 share KV head 0, ranks 4-7 KV head 1.
  run_world(8, layer_wants(), cuda::Via::Device);
  run_world(8, layer_wants(), cuda::Via::Host);
}

TEST_F(DeviceLayer, UnevenEmptyAndSingleRankShares) {
  if (!test::gpu_or_skip()) return;
  auto uneven = [](const Slice& s, std::size_t r, std::size_t w) { return shard(s, 0, r, w, Split::Uneven); };
  // 10 rows over 16 ranks: 6 ranks get nothing (a zero-byte placement), yet take part.
  run_world(16, {{"odd", uneven}, {"norm.weight", whole}}, cuda::Via::Device);
  run_world(1, layer_wants(), cuda::Via::Host);
}

TEST_F(DeviceLayer, HostOnlyCollectiveRefusesDeviceBroadcastAndLeaksNothing) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  const int live = drv.emulated() ? drv.counter("fakecuda_live_device_allocations") : 0;
  // Two ranks both need the norm: the first shared read asks for a device broadcast, which a
  // host-only collective refuses on every rank (before any rank waits on another).
  test::LocalGroup group(2);
  std::vector<ErrorKind> kinds(2);
  std::vector<std::thread> threads;
  for (std::size_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      SafeOpen f(path());
      LoadPlan plan(test::needs_of(f, {{"norm.weight", whole}}, 2));
      test::LocalGroup::Member me(group, rank);
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
  if (!test::gpu_or_skip()) return;
  SafeOpen f(path());
  LoadPlan plan(test::needs_of(f, layer_wants(), 2));
  DeviceGroup group(3);
  DeviceGroup::DeviceMember me(group, 0);
  EXPECT_EQ(kind_of([&] { (void)cuda::load(plan, me); }), ErrorKind::InvalidSlice);
  LoadPlan one(test::needs_of(f, layer_wants(), 1));
  DeviceGroup solo(1);
  DeviceGroup::DeviceMember only(solo, 0);
  auto odd = test::thrown([&] { (void)cuda::load(one, only, {.alignment = 100}); });
  EXPECT_EQ(odd.kind(), ErrorKind::InvalidSlice);
  EXPECT_NE(odd.message().find("power of two"), std::string::npos) << odd.message();
  // 0 is the default, 256: the one rule of every upload (the core's), not a refusal.
  auto by_default = cuda::load(one, only, {.alignment = 0});
  ASSERT_FALSE(by_default.placements().empty());
  for (const auto& p : by_default.placements()) EXPECT_EQ(p.offset % 256, 0u) << p.name;
  EXPECT_EQ(kind_of([&] { (void)cuda::load(one, only, {.device = 7}); }), ErrorKind::Cuda);
  // A power of two so large that padding to it passes 2^64 blames the alignment, before any
  // device memory is taken.
  auto huge = test::thrown([&] { (void)cuda::load(one, only, {.alignment = std::size_t{1} << 63}); });
  EXPECT_EQ(huge.kind(), ErrorKind::ValidationOverflow) << huge.message();
  EXPECT_NE(huge.message().find("alignment, 9223372036854775808 bytes"), std::string::npos) << huge.message();
  // A custom alignment is honoured.
  auto mine = cuda::load(one, only, {.alignment = 4096});
  for (const auto& p : mine.placements()) EXPECT_EQ(p.offset % 4096, 0u) << p.name;
}

TEST_F(DeviceLayer, InjectedDriverFailuresAreCudaErrorsAndLeakNothing) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  SafeOpen f(path());
  LoadPlan plan(test::needs_of(f, layer_wants(), 1), {64});
  DeviceGroup solo(1);
  DeviceGroup::DeviceMember me(solo, 0);
  const int live = drv.counter("fakecuda_live_device_allocations");
  // Pinned memory no load holds waits idle for the next one: not a leak, unpinned on request.
  (void)cuda::release_staging(0);
  const int pinned = drv.counter("fakecuda_live_pinned_allocations");
  for (const char* spec :
       {"cuMemAlloc:1", "cuMemHostAlloc:1", "cuMemcpyHtoDAsync:3", "cuStreamSynchronize:1"}) {
    drv.fail(spec);
    EXPECT_EQ(kind_of([&] { (void)cuda::load(plan, me); }), ErrorKind::Cuda) << spec;
    drv.fail("");
    (void)cuda::release_staging(0);
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
  if (!test::gpu_or_skip()) return;
  Driver drv;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's slow copies";
  // Slow copies: refilling the pinned buffer before its copies finish would change bytes a
  // pending copy still reads (the emulator aborts on that) and land wrong bytes on the device.
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(2000);
  run_world(2, layer_wants(), cuda::Via::Host);
  run_world(2, layer_wants(), cuda::Via::Device);
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(0);
}

/// The rows file of multi_rank.hpp: each rank's rows of six weights, steps of different
/// lengths it reads for itself alone, and a shared vector.
class DeviceRows : public DeviceLayer {
 protected:
  void SetUp() override { test::write_rows_file(path()); }
};

TEST_F(DeviceRows, ARanksOwnStepsReadTogetherLandWhereTheyBelong) {
  // The default step size: each rank's rows of the weights before the shared vector are read
  // together into one staging buffer, the vector alone, the rows after it together again; the
  // two staging buffers take turns, and with slow copies under the emulated driver a buffer
  // refilled before the copies out of it were done would be caught.
  if (!test::gpu_or_skip()) return;
  Driver drv;
  if (drv.emulated()) drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(2000);
  for (auto via : {cuda::Via::Host, cuda::Via::Device}) {
    for (std::size_t world : {2, 4}) run_world(world, test::rows_wants(), via, LoadOptions{}.max_step_bytes);
    // Turns of two or three steps of different lengths (two ranks: 1024, 1536, ... 3584 bytes
    // each), and steps of 100 bytes, many to a turn.
    run_world(2, test::rows_wants(), via, 4000);
    run_world(4, test::rows_wants(), via, 100);
  }
  if (drv.emulated()) drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(0);
}

TEST_F(DeviceLayer, ARefillWaitsForTheCopiesOutOfTheBufferNotTheStream) {
  // The staging buffer is refilled once the copies out of it are done (its event), not once
  // the whole stream is (broadcasts and device copies queued behind them): a load of many small
  // steps synchronises the stream no more often than a load of one step.
  if (!test::gpu_or_skip()) return;
  Driver drv;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's call counts";
  SafeOpen f(path());
  const auto needs = test::needs_of(f, layer_wants(), 1);
  DeviceGroup solo(1);
  DeviceGroup::DeviceMember me(solo, 0);
  auto stream_waits = [&](std::size_t step_bytes, std::size_t& steps) {
    LoadPlan plan(needs, {step_bytes});
    const auto before = drv.calls("cuStreamSynchronize");
    (void)cuda::load(plan, me);
    const auto waits = drv.calls("cuStreamSynchronize") - before;
    steps = plan.reads_here().size();  // one rank: it reads every step
    return waits;
  };
  std::size_t one = 0, many = 0;
  const auto waits_one = stream_waits(std::size_t{1} << 30, one);
  const auto waits_many = stream_waits(64, many);
  ASSERT_EQ(one, 1u);
  ASSERT_GT(many, 10u);
  EXPECT_EQ(waits_many, waits_one) << many << " steps";
}

TEST(DeviceStage, ACopyComesOnlyFromTheBytesOfTheLastTurn) {
  // The two staging buffers take turns and keep their size: a buffer reused for a shorter turn
  // still holds an earlier, longer turn's bytes after the new ones. A copy past what the turn
  // staged is the plan and the staging disagreeing: refused (a Cuda error), not stale bytes
  // copied. Driven through the bridge, as the device load drives it.
  if (!test::gpu_or_skip()) return;
  using detail::adopt;
  using detail::attempt;
  auto stage = adopt(attempt([&](ffi::Status& st) { return ffi::new_device_stage(0, 1024, st); })).value();
  auto fill = [&](std::size_t len, std::uint8_t value) {
    auto host = attempt([&](ffi::Status& st) { return stage->host(len, st); }).value();
    ASSERT_EQ(host.size(), len);
    std::fill(host.begin(), host.end(), value);
  };
  auto copy = [&](std::size_t from, std::size_t len, std::size_t to) {
    return attempt([&](ffi::Status& st) { stage->host_to_destination(from, len, to, st); });
  };
  fill(512, 1);  // the first buffer, 512 bytes
  EXPECT_TRUE(copy(0, 512, 0).ok());
  fill(100, 2);  // the second buffer
  EXPECT_TRUE(copy(0, 100, 512).ok());
  fill(300, 3);  // the first again: 300 bytes staged in a buffer of 512
  EXPECT_TRUE(copy(0, 300, 0).ok());
  const Status past = copy(200, 200, 0);
  EXPECT_EQ(past.kind(), ErrorKind::Cuda);
  EXPECT_NE(past.message().find("staging buffer"), std::string::npos) << past.message();
  EXPECT_NE(past.message().find("(300 bytes)"), std::string::npos) << past.message();
  // What did land is the last turns' bytes.
  const std::uint64_t dst = attempt([&](ffi::Status& st) { return stage->finish(st); }).value();
  std::vector<std::byte> got(612);
  cuda::copy_to_host(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(dst)), got);
  EXPECT_EQ(got[0], std::byte{3});
  EXPECT_EQ(got[299], std::byte{3});
  EXPECT_EQ(got[300], std::byte{1});
  EXPECT_EQ(got[512], std::byte{2});
  EXPECT_EQ(got[611], std::byte{2});
  Driver drv;
  drv.get<int (*)(std::uint64_t)>("cuMemFree_v2")(dst);
}

TEST(DeviceStrided, AStepOfManyPiecesLandsWhole) {
  if (!test::gpu_or_skip()) return;
  // Every other byte of 8200 (rank 0 the even ones, rank 1 the odd ones): one step of 4100
  // one-byte pieces per rank, more than one bounded batch of them crossing the bridge.
  test::TempDir dir;
  auto path = dir / "wide.safetensors";
  test::write_bytes(path,
                    test::raw_file(R"({"t":{"dtype":"U8","shape":[8200],"data_offsets":[0,8200]}})", 8200));
  for (auto via : {cuda::Via::Host, cuda::Via::Device}) {
    for (std::size_t world : {1, 2}) {
      DeviceGroup group(world);
      std::vector<std::exception_ptr> errors(world);
      std::vector<std::thread> threads;
      for (std::size_t rank = 0; rank < world; ++rank) {
        threads.emplace_back([&, rank] {
          try {
            SafeOpen f(path);
            std::vector<std::vector<Selection>> needs(world);
            for (std::size_t r = 0; r < world; ++r) {
              needs[r] = {f.get_slice("t").select({Index::range(static_cast<std::int64_t>(r), {}, 2)})};
            }
            LoadPlan plan(needs);
            EXPECT_EQ(plan.bytes_read(), 8200u - (world == 1 ? 1 : 0));
            DeviceGroup::DeviceMember me(group, rank);
            auto mine = cuda::load(plan, me, {.device = 0, .via = via});
            const auto& p = mine.placements().at(0);
            auto want = needs[rank][0].read();
            std::vector<std::byte> got(p.byte_size);
            cuda::copy_to_host(static_cast<std::byte*>(mine.buffer().data()) + p.offset, got);
            EXPECT_TRUE(std::ranges::equal(got, want.data)) << "rank " << rank << " of " << world;
          } catch (...) {
            errors[rank] = std::current_exception();
          }
        });
      }
      for (auto& t : threads) t.join();
      for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
      }
    }
  }
}

}  // namespace
