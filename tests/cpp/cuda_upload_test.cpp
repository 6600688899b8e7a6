// The CUDA upload path's contracts with its callers, each pinned by a test that failed before its
// fix: memory outlives every Uploader (the primary context stays retained), the caller's current
// context is kept, one Uploader is safe to share, a failure mid-upload is a Cuda error and the
// uploader stays usable, pinned memory never leaks, and a caller's stream and destination are
// checked before anything is enqueued. Runs against the emulated driver (tests/cuda, two devices,
// see tests/CMakeLists.txt), whose counters and injected failures it reads with dlsym; on a real
// GPU the tests that need the emulator's controls skip.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "gpu_support.hpp"
#include "support.hpp"

using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::SafeOpen;
using safetensors::TensorView;
namespace cuda = safetensors::cuda;

namespace {

// Two emulated devices, so that cross-device checks can fire; set before the driver starts (a
// real driver ignores it).
const bool kTwoDevices = (::setenv("SAFETENSORS_FAKE_CUDA_DEVICES", "2", 0), true);

using test::Ctx;
using test::Driver;
using test::kind_of;
using test::Stream;

/// A file of assorted tensors, one spanning several 1 MiB chunks.
std::filesystem::path make_file(const test::TempDir& dir) {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<std::pair<std::string, TensorView>> tensors;
  const std::vector<std::pair<Dtype, std::vector<std::size_t>>> specs = {
      {Dtype::F32, {3, 5}}, {Dtype::BF16, {7}}, {Dtype::U8, {5, 3}}, {Dtype::F32, {1024, 1030}}};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& [d, shape] = specs[i];
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    auto& b = storage.emplace_back(n * safetensors::bit_size(d) / 8);
    for (std::size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::uint8_t>(j * 29 + i * 11);
    tensors.emplace_back("t" + std::to_string(i), TensorView{d, shape, std::as_bytes(std::span(b)), {}});
  }
  auto path = dir / "upload.safetensors";
  safetensors::save_file(path, tensors);
  return path;
}

/// Whether every tensor of `up` equals the file's bytes (read back from the device).
bool same_as_file(const SafeOpen& f, const cuda::DeviceTensors& up) {
  for (const auto& p : up.placements()) {
    auto want = f.get_tensor(p.name);
    std::vector<std::byte> got(p.byte_size);
    cuda::copy_to_host(up.data(p.name), got, up.buffer().device());
    if (got.size() != want.data.size() || std::memcmp(got.data(), want.data.data(), got.size()) != 0)
      return false;
  }
  return up.placements().size() == f.size();
}

constexpr cuda::UploadOptions kSmallRing{.staging_slots = 3, .slot_bytes = 1u << 20, .readers = 2};

/// What an engine hands `load_into`: `bytes` of device memory on device 0 and a non-blocking
/// stream of its own, made in device 0's primary context, which is current while this lives.
struct CallersDestination {
  CallersDestination(const Driver& d, std::size_t bytes) : drv(d) {
    drv.enter_primary(0);
    device = drv.alloc(bytes);
    stream = drv.stream();
  }
  ~CallersDestination() {
    if (stream) drv.destroy(stream);
    drv.free(device);
    drv.leave_primary(0);
  }
  CallersDestination(const CallersDestination&) = delete;
  CallersDestination& operator=(const CallersDestination&) = delete;

  [[nodiscard]] void* at(std::uint64_t offset = 0) const {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(device + offset));
  }
  [[nodiscard]] std::uintptr_t on() const { return reinterpret_cast<std::uintptr_t>(stream); }
  /// The caller destroys its stream now (having synchronised it), before the test ends.
  void destroy_stream() {
    drv.destroy(stream);
    stream = nullptr;
  }

  const Driver& drv;
  std::uint64_t device = 0;
  Stream stream = nullptr;
};

/// Every placement, read back from `base`, holds the file's bytes.
void expect_placed_as_file(const SafeOpen& f, const std::vector<cuda::Placement>& placed, const void* base) {
  for (const auto& p : placed) {
    auto want = f.get_tensor(p.name);
    std::vector<std::byte> got(p.byte_size);
    cuda::copy_to_host(static_cast<const std::byte*>(base) + p.offset, got);
    EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0) << p.name;
  }
}

TEST(CudaUpload, DeviceMemoryOutlivesEveryUploader) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  cuda::DeviceTensors kept;
  {
    cuda::Uploader up(0, kSmallRing);
    kept = up.load(f);
  }
  void* released = cuda::load(f, 0, kSmallRing).release_buffer().release();
  // No Uploader is left; the primary context (and so the memory) must still be alive.
  if (drv.emulated()) {
    EXPECT_EQ(drv.ctx_resets(0), 0);
  }
  EXPECT_TRUE(same_as_file(f, kept));
  auto want = f.get_tensor("t0");
  std::vector<std::byte> got(want.data.size());
  cuda::copy_to_host(released, got);
  EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0);
  cuda::DeviceBuffer adopt(released, got.size(), 0);  // frees it
}

TEST(CudaUpload, TheCallersCurrentContextIsKept) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  // No context current: none after each call.
  ASSERT_EQ(drv.current(), nullptr);
  {
    auto loaded = cuda::load(f);
    EXPECT_EQ(drv.current(), nullptr) << "cuda::load";
    cuda::Uploader up(0, kSmallRing);
    EXPECT_EQ(drv.current(), nullptr) << "Uploader()";
    EXPECT_TRUE(same_as_file(f, up.load(f)));
    EXPECT_EQ(drv.current(), nullptr) << "Uploader::load, copy_to_host, ~DeviceBuffer";
  }
  EXPECT_EQ(drv.current(), nullptr) << "~Uploader, ~DeviceTensors";
  // The caller's own context, on another device when there is one: still current after each.
  int other = cuda::device_count() > 1 ? 1 : 0;
  Ctx mine = drv.create_context(other);
  ASSERT_EQ(drv.current(), mine);
  {
    auto loaded = cuda::load(f);
    EXPECT_EQ(drv.current(), mine) << "cuda::load";
    auto one = cuda::to_device(f, "t3");
    EXPECT_EQ(drv.current(), mine) << "to_device";
    cuda::Uploader up(0, kSmallRing);
    auto again = up.load(f);
    up.synchronize();
    EXPECT_EQ(drv.current(), mine) << "Uploader";
    EXPECT_TRUE(same_as_file(f, again));
    (void)cuda::device_name(0);
    EXPECT_EQ(drv.current(), mine) << "copy_to_host, device_name";
  }
  EXPECT_EQ(drv.current(), mine) << "destructors";
  drv.destroy_context(mine);
  drv.set_current(nullptr);
}

TEST(CudaUpload, SixteenThreadsShareOneUploader) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  auto path = make_file(dir);
  cuda::Uploader shared(0, kSmallRing);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      SafeOpen f(path, {t % 2 ? safetensors::Backend::Read : safetensors::Backend::Mmap});
      for (int round = 0; round < 2; ++round) {
        if (!same_as_file(f, shared.load(f))) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(CudaUpload, InjectedFailuresMidUploadThenReuse) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  cuda::Uploader up(0, kSmallRing);
  // The one-shot uploader exists, with its slot, before counting (other tests of this process
  // may have made it already).
  EXPECT_TRUE(same_as_file(f, cuda::load(f)));
  const int pinned = drv.counter("fakecuda_live_pinned_allocations");
  // Each spec fails one call in the middle of an upload (the file is 5 chunks of 1 MiB).
  for (const char* spec : {"cuMemcpyHtoDAsync:3", "cuEventRecord:2", "cuEventRecord:4",
                           "cuEventSynchronize:2", "cuMemAlloc:1"}) {
    drv.fail(spec);
    try {
      (void)up.load(f);
      ADD_FAILURE() << spec << ": no error";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Cuda) << spec;
    }
    drv.fail("");
    EXPECT_TRUE(same_as_file(f, up.load(f))) << "after " << spec;
    EXPECT_TRUE(same_as_file(f, cuda::load(f))) << "one-shot after " << spec;
  }
  EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), pinned) << "a failed upload's staging leaked";
  EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), 0) << "a failed upload's allocation leaked";

  // On the caller's stream, which the library does not synchronise on error: a copy whose event
  // could not be recorded is still pending (slow copies make sure), and the next upload must
  // not refill its staging buffer under it (the emulator aborts if it does).
  const std::size_t bytes = cuda::plan(f).first;
  CallersDestination dst(drv, bytes);
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(20000);
  drv.fail("cuEventRecord:1");
  EXPECT_EQ(kind_of([&] { (void)up.load_into(f, {}, dst.at(), bytes, dst.on()); }), ErrorKind::Cuda);
  drv.fail("");
  // Other bytes through the same slots (the same ones would hide a refill).
  std::vector<safetensors::Request> last{{"t3", {}}};
  auto placed = up.load_into(f, last, dst.at(), bytes, dst.on());
  ASSERT_EQ(placed.size(), 1u);
  drv.sync(dst.stream);
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(100);
  expect_placed_as_file(f, placed, dst.at());
  up.synchronize();
}

TEST(CudaUpload, AnUntrackedCopyIsNeverWaitedForThroughTheCallersStreamLater) {
  // A copy is enqueued on the caller's stream, its event cannot be recorded and waiting for the
  // stream fails too. The caller then does what the header asks (synchronise the stream), and
  // destroys it: later waits on the staging buffer (synchronize, the next upload, the
  // destructor) must not use that stream's handle, by then dangling (the emulator aborts).
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  cuda::Uploader up(0, kSmallRing);
  const std::size_t bytes = cuda::plan(f).first;
  CallersDestination dst(drv, bytes);
  const auto context_waits = drv.calls("cuCtxSynchronize");
  const int pinned = drv.counter("fakecuda_live_pinned_allocations");
  drv.fail("cuEventRecord:1,cuStreamSynchronize:1");
  EXPECT_EQ(kind_of([&] { (void)up.load_into(f, {}, dst.at(), bytes, dst.on()); }), ErrorKind::Cuda);
  drv.fail("");
  drv.sync(dst.stream);
  dst.destroy_stream();
  up.synchronize();
  EXPECT_TRUE(same_as_file(f, up.load(f)));
  // Nor through the whole context, which would wait for every stream of it, the caller's too:
  // the untracked copy's buffer is abandoned (never reused or freed) and replaced.
  EXPECT_EQ(drv.calls("cuCtxSynchronize"), context_waits);
  EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), pinned + 1);
}

TEST(CudaUpload, PinnedSlotsAreFreedWhenConstructionFails) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  // Relative counts: the one-shot uploader of other tests in this process may be alive. Their
  // idle staging is unpinned first: it would serve the slots whose allocation should fail.
  (void)cuda::release_staging(0);
  const int pinned = drv.counter("fakecuda_live_pinned_allocations");
  const int events = drv.counter("fakecuda_live_events");
  const int streams = drv.counter("fakecuda_live_streams");
  for (const char* spec : {"cuMemHostAlloc:3", "cuEventCreate:3"}) {
    drv.fail(spec);
    EXPECT_EQ(kind_of([] { cuda::Uploader up(0, kSmallRing); }), ErrorKind::Cuda) << spec;
    drv.fail("");
    // The slots made before the failure wait, idle, for the next ring (the first time, two
    // slots of 1 MiB; the second, they serve the new ring, whose third fails again).
    EXPECT_EQ(cuda::release_staging(0), std::size_t{2} << 20) << spec;
    EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), pinned) << spec;
    EXPECT_EQ(drv.counter("fakecuda_live_events"), events) << spec;
    EXPECT_EQ(drv.counter("fakecuda_live_streams"), streams) << spec;
  }
}

TEST(CudaUpload, OneShotCallsShareOneUploaderAndStageOnlyWhatTheyNeed) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's counters";
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  std::vector<std::uint8_t> tiny(100, 7);
  safetensors::save_file(dir / "tiny.safetensors",
                         {{"x", TensorView{Dtype::U8, {100}, std::as_bytes(std::span(tiny)), {}}}});
  SafeOpen small(dir / "tiny.safetensors");
  // Relative counts: other tests of this process may have made the one-shot uploader, left
  // staging idle (unpinned here) or abandoned a buffer.
  (void)cuda::release_staging(0);
  const int live = drv.counter("fakecuda_live_pinned_allocations");
  const auto peak = drv.get<std::size_t (*)(int)>("fakecuda_peak_pinned_bytes");
  const std::size_t pinned_bytes = peak(1);
  auto t = cuda::to_device(small, "x");
  // A 100-byte tensor stages through one small slot, not the default ring.
  EXPECT_LE(drv.counter("fakecuda_live_pinned_allocations"), live + 1);
  EXPECT_LE(peak(0) - pinned_bytes, 4096u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_as_file(f, cuda::load(f)));
  // One stream and at most one slot per chunk, kept across calls (the small slot it grew from
  // waits idle).
  EXPECT_EQ(drv.counter("fakecuda_live_streams"), 1);
  (void)cuda::release_staging(0);
  EXPECT_LE(drv.counter("fakecuda_live_pinned_allocations"), live + 5);
  const int after = drv.counter("fakecuda_live_pinned_allocations");
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(same_as_file(f, cuda::load(f)));
  EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), after);
}

TEST(CudaUpload, OneShotCallsWithRingOptionsPinTheirSlotsOnce) {
  // Ring options give each call an uploader of its own; its slots must not be pinned and
  // unpinned per call (page-locking is slow and stalls the device), whatever the options.
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's counters";
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  // Relative counts: other tests of this process may leave the one-shot uploader alive (its
  // slots count as live) and staging idle (unpinned here, so that this test pins its own).
  (void)cuda::release_staging(0);
  const int live = drv.counter("fakecuda_live_pinned_allocations");
  const auto pins_before = drv.calls("cuMemHostAlloc");
  EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, kSmallRing)));
  const auto pins = drv.calls("cuMemHostAlloc");
  const auto unpins = drv.calls("cuMemFreeHost");
  EXPECT_EQ(pins - pins_before, 3u) << "the ring's three slots";
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, kSmallRing)));
    auto t = cuda::to_device(f, "t3", 0, kSmallRing);
    std::vector<std::byte> got(t.byte_size());
    cuda::copy_to_host(t.data(), got);
    auto want = f.get_tensor("t3");
    EXPECT_EQ(std::memcmp(got.data(), want.data.data(), got.size()), 0);
  }
  // Other options, same slot size: the same idle slots serve them.
  EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, {.staging_slots = 2, .slot_bytes = 1u << 20, .readers = 1})));
  EXPECT_EQ(drv.calls("cuMemHostAlloc"), pins);
  EXPECT_EQ(drv.calls("cuMemFreeHost"), unpins);
  // Nothing is leaked: the idle slots are what release_staging unpins.
  EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), live + 3);
  EXPECT_EQ(cuda::release_staging(0), std::size_t{3} << 20);
  EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), live);
  EXPECT_EQ(cuda::release_staging(0), 0u);
  EXPECT_EQ(kind_of([] { (void)cuda::release_staging(-1); }), ErrorKind::Cuda);
}

TEST(CudaUpload, IdleStagingIsBounded) {
  // A ring of more slots than a device keeps idle: the excess is unpinned when the call returns.
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's counters";
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  const cuda::UploadOptions many{.staging_slots = 20, .slot_bytes = 4096, .readers = 2};
  // Relative counts, with no staging idle (other tests of this process may leave some).
  (void)cuda::release_staging(0);
  const int live = drv.counter("fakecuda_live_pinned_allocations");
  EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, many)));
  EXPECT_EQ(drv.counter("fakecuda_live_pinned_allocations"), live + 16);
  // The 16 kept serve the next call; 4 more are pinned (and unpinned) for it.
  const auto pins = drv.calls("cuMemHostAlloc");
  EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, many)));
  EXPECT_EQ(drv.calls("cuMemHostAlloc"), pins + 4);
  // A slot takes an idle buffer only if it fits and is at most twice the slot: 1 MiB slots pin
  // anew (and their return unpins the 3 small buffers idle the longest), and then 4 KiB slots
  // leave the 1 MiB buffers idle: 13 small ones serve, 7 are pinned.
  EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, kSmallRing)));
  EXPECT_EQ(drv.calls("cuMemHostAlloc"), pins + 4 + 3);
  EXPECT_TRUE(same_as_file(f, cuda::load(f, 0, many)));
  EXPECT_EQ(drv.calls("cuMemHostAlloc"), pins + 4 + 3 + 7);
  // Idle now: the last ring's 16 kept (the 1 MiB ones idled longest, so they went first).
  EXPECT_EQ(cuda::release_staging(0), std::size_t{16} * 4096);
}

TEST(CudaUpload, ACallersStreamAndDestinationAreChecked) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  cuda::Uploader up(0, kSmallRing);
  auto [bytes, placements] = cuda::plan(f);
  CallersDestination mine(drv, bytes + 512);
  const std::uint64_t dst = mine.device;
  Stream stream = mine.stream;
  auto as_ptr = [](std::uint64_t p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); };
  auto handle = [](Stream s) { return reinterpret_cast<std::uintptr_t>(s); };
  auto refused = [&](void* to, std::size_t capacity, std::uintptr_t on) {
    return kind_of([&] { (void)up.load_into(f, {}, to, capacity, on); });
  };
  // Misaligned for the plan's 256-byte placements.
  EXPECT_EQ(refused(as_ptr(dst + 128), bytes, handle(stream)), ErrorKind::Cuda);
  // More capacity claimed than the allocation has.
  EXPECT_EQ(refused(as_ptr(dst + 512), bytes + 512, handle(stream)), ErrorKind::Cuda);
  // The per-thread default stream: readers would each enqueue on their own.
  EXPECT_EQ(refused(as_ptr(dst), bytes, 2), ErrorKind::Cuda);
  // A stream capturing a graph.
  auto begin = drv.get<int (*)(Stream, int)>("cuStreamBeginCapture_v2");
  auto end = drv.get<int (*)(Stream, void**)>("cuStreamEndCapture");
  if (begin && end && begin(stream, 0) == 0) {
    EXPECT_EQ(refused(as_ptr(dst), bytes, handle(stream)), ErrorKind::Cuda);
    void* graph = nullptr;
    EXPECT_EQ(end(stream, &graph), 0);
    if (auto destroy = drv.get<int (*)(void*)>("cuGraphDestroy"); destroy && graph) destroy(graph);
  }
  if (cuda::device_count() > 1) {
    // A stream, or a destination, of device 1.
    drv.enter_primary(1);
    Stream other_stream = drv.stream();
    std::uint64_t other_dst = drv.alloc(bytes);
    EXPECT_EQ(refused(as_ptr(dst), bytes, handle(other_stream)), ErrorKind::Cuda);
    EXPECT_EQ(refused(as_ptr(other_dst), bytes, handle(stream)), ErrorKind::Cuda);
    EXPECT_EQ(refused(as_ptr(other_dst), bytes, 0), ErrorKind::Cuda);
    drv.destroy(other_stream);
    drv.free(other_dst);
    drv.leave_primary(1);
    drv.enter_primary(0);
  }
  // Nothing was enqueued by the refusals; the checked call works, on the stream and on 0.
  for (std::uintptr_t on : {handle(stream), std::uintptr_t{0}}) {
    auto placed = up.load_into(f, {}, as_ptr(dst + 256), bytes, on);
    ASSERT_EQ(placed.size(), placements.size());
    if (on != 0) drv.sync(stream);
    up.synchronize();
    expect_placed_as_file(f, placed, mine.at(256));
  }
}

TEST(CudaUpload, ACapacityThatWrapsTheAddressSpaceIsRefused) {
  // A caller that does not know its buffer's size passes SIZE_MAX. The destination, 256 bytes
  // into an allocation of exactly the plan's size, has 256 bytes too few: offset + capacity
  // must not wrap around 2^64 into "fits" (which would let the copies overrun the allocation).
  Driver drv;
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  cuda::Uploader up(0, kSmallRing);
  const std::size_t bytes = cuda::plan(f).first;
  CallersDestination dst(drv, bytes);
  void* to = dst.at(256);
  for (std::size_t capacity : {SIZE_MAX, SIZE_MAX - 255, bytes}) {
    try {
      (void)up.load_into(f, {}, to, capacity, 0);
      ADD_FAILURE() << capacity << ": no error";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Cuda) << capacity << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(bytes - 256) + " bytes left"), std::string::npos)
          << e.what();
    }
  }
  up.synchronize();
}

TEST(CudaUpload, DeviceOrdinalsOutOfRangeAreCudaErrorsNamingTheDevice) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  const int count = cuda::device_count();
  std::vector<std::byte> host(16), source(16);  // apart: an overlapping copy is refused first
  for (int device : {-1, count, INT_MIN}) {
    const std::string named = "no CUDA device " + std::to_string(device);
    auto expect_refused = [&](const char* what, auto&& f_) {
      try {
        f_();
        ADD_FAILURE() << what << "(" << device << "): no error";
      } catch (const safetensors::Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Cuda) << what;
        EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << what << ": " << e.what();
      }
    };
    expect_refused("Uploader", [&] { cuda::Uploader up(device); });
    expect_refused("load", [&] { (void)cuda::load(f, device); });
    expect_refused("load with options", [&] { (void)cuda::load(f, device, kSmallRing); });
    expect_refused("to_device", [&] { (void)cuda::to_device(f, "t0", device); });
    expect_refused("device_name", [&] { (void)cuda::device_name(device); });
    expect_refused("copy_to_host", [&] { cuda::copy_to_host(source.data(), host, device); });
  }
}

TEST(CudaUpload, DeviceTensorsFindsEveryNameAndRefusesOthers) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_file(dir));
  auto loaded = cuda::load(f);
  for (const auto& p : loaded.placements()) {
    EXPECT_EQ(&loaded.at(p.name), &p);
    EXPECT_EQ(loaded.data(p.name), static_cast<std::byte*>(loaded.buffer().data()) + p.offset);
  }
  EXPECT_EQ(kind_of([&] { (void)loaded.data("nope"); }), ErrorKind::TensorNotFound);
  // Once the buffer is given away, no address is made up from a null base; offsets remain.
  auto buffer = loaded.release_buffer();
  EXPECT_EQ(kind_of([&] { (void)loaded.data("t1"); }), ErrorKind::Internal);
  EXPECT_EQ(static_cast<std::byte*>(buffer.data()) + loaded.at("t1").offset,
            static_cast<std::byte*>(buffer.data()) + loaded.placements()[1].offset);
  auto again = cuda::load(f);
  cuda::DeviceTensors moved = std::move(again);
  EXPECT_EQ(kind_of([&] { (void)again.data("t1"); }), ErrorKind::Internal);  // moved from
  EXPECT_EQ(moved.data("t1"), static_cast<std::byte*>(moved.buffer().data()) + moved.at("t1").offset);
}

// ---- the pipeline at the link (docs/gpu.md): striped readers, zero-copy spans, traces --------

/// An environment variable set for a scope, as it was restored after (uploaders read theirs when
/// they are made).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// A model of about `mib` MiB: tensors of 1.5 MiB and odd small ones between them (so that
/// padding falls inside chunks and spans), in one file.
std::filesystem::path make_model(const test::TempDir& dir, std::size_t mib) {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<std::pair<std::string, TensorView>> tensors;
  const std::size_t large = 3u << 19;
  std::size_t total = 0;
  for (std::size_t i = 0; total < (mib << 20); ++i) {
    const std::size_t n = i % 3 == 2 ? 1000 + i : large;
    auto& b = storage.emplace_back(n);
    for (std::size_t j = 0; j < n; ++j) b[j] = static_cast<std::uint8_t>(j * 31 + i * 7);
    char name[32];
    std::snprintf(name, sizeof name, "layer%03zu", i);
    tensors.emplace_back(name, TensorView{Dtype::U8, {n}, std::as_bytes(std::span(b)), {}});
    total += n;
  }
  auto path = dir / "model.safetensors";
  safetensors::save_file(path, tensors);
  return path;
}

/// The emulated driver's link and registration controls, reset on the way out.
struct Link {
  explicit Link(const Driver& d) : drv(d) {}
  ~Link() {
    drv.get<void (*)(int, double)>("fakecuda_set_link_gbps")(0, 0.0);
    drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(100);
    drv.get<void (*)(double, int)>("fakecuda_set_register_cost")(0.0, 0);
    drv.get<void (*)(int)>("fakecuda_set_read_only_register")(1);
    drv.fail("");
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  void set_h2d(double gbps) const { drv.get<void (*)(int, double)>("fakecuda_set_link_gbps")(0, gbps); }
  void reset() const { drv.get<void (*)()>("fakecuda_link_reset")(); }
  struct Stats {
    unsigned long long busy = 0, first = 0, last = 0, copies = 0;
    [[nodiscard]] double utilisation() const {
      return last > first ? static_cast<double>(busy) / static_cast<double>(last - first) : 0.0;
    }
  };
  [[nodiscard]] Stats h2d() const {
    Stats s;
    using F =
        int (*)(int, int, unsigned long long*, unsigned long long*, unsigned long long*, unsigned long long*);
    EXPECT_EQ(drv.get<F>("fakecuda_link_stats")(0, 0, &s.busy, &s.first, &s.last, &s.copies), 0);
    return s;
  }
  [[nodiscard]] std::pair<unsigned long long, unsigned long long> registrations() const {
    unsigned long long r = 0, u = 0;
    drv.get<void (*)(unsigned long long*, unsigned long long*)>("fakecuda_registrations")(&r, &u);
    return {r, u};
  }
  [[nodiscard]] int live_registrations() const { return drv.counter("fakecuda_live_registrations"); }
  [[nodiscard]] std::size_t peak_registered(int reset) const {
    return drv.get<std::size_t (*)(int)>("fakecuda_peak_registered_bytes")(reset);
  }
  const Driver& drv;
};

TEST(CudaUploadLink, StripedReadersKeepASlowLinkBusyFromItsFirstCopyToItsLast) {
  // The emulated link at 0.02 GB/s (~100 ms a 2 MiB chunk, with five chunks filled ahead), far
  // slower than the readers and the emulator's own checks even under a sanitizer on two cores
  // that other work keeps busy (at 0.1 GB/s a ThreadSanitizer run beside a benchmark once saw
  // 89% busy): once the first copy starts, the link never waits for a chunk until the last one
  // is done.
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's link";
  Link link(drv);
  test::TempDir dir;
  SafeOpen f(make_model(dir, 16));
  ScopedEnv stripe("SAFETENSORS_UPLOAD_STRIPE", "512K");
  cuda::Uploader up(0, {.staging_slots = 6, .slot_bytes = 2u << 20, .readers = 4});
  EXPECT_TRUE(same_as_file(f, up.load(f)));  // reader threads started, pages warm
  link.set_h2d(0.02);
  drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(0);
  link.reset();
  auto t = up.load(f);
  const Link::Stats s = link.h2d();
  EXPECT_EQ(s.copies, (cuda::plan(f).first + (2u << 20) - 1) / (2u << 20)) << "one copy per 2 MiB chunk";
  EXPECT_GE(s.utilisation(), 0.9) << "the link idled between its first copy and its last";
  EXPECT_TRUE(same_as_file(f, t));
}

TEST(CudaUploadZeroCopy, SpansOfTheMappingLandEveryByteAndAreReleasedAfterTheirCopies) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_model(dir, 24));
  ScopedEnv on("SAFETENSORS_ZERO_COPY", "1");
  ScopedEnv window("SAFETENSORS_ZERO_COPY_WINDOW", "6M");
  ScopedEnv span("SAFETENSORS_ZERO_COPY_SPAN", "4M");
  ScopedEnv stripe("SAFETENSORS_UPLOAD_STRIPE", "512K");
  cuda::Uploader up(0, {.staging_slots = 4, .slot_bytes = 2u << 20, .readers = 3});
  if (!drv.emulated()) {
    // On a real GPU: the bytes, whichever path each span took.
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_as_file(f, up.load(f)));
    return;
  }
  Link link(drv);
  const auto [reg0, unreg0] = link.registrations();
  (void)link.peak_registered(1);
  const auto pageable = drv.pageable_copies();
  EXPECT_TRUE(same_as_file(f, up.load(f)));
  const auto host_allocs = drv.calls("cuMemHostAlloc");
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(same_as_file(f, up.load(f)));
    EXPECT_EQ(link.live_registrations(), 0) << "a span stayed registered after its upload";
  }
  const auto [reg1, unreg1] = link.registrations();
  EXPECT_GT(reg1, reg0) << "no span was registered";
  EXPECT_EQ(reg1 - reg0, unreg1 - unreg0) << "every registered span is unregistered exactly once";
  EXPECT_LE(link.peak_registered(0), std::size_t{6} << 20) << "more than the window registered at once";
  EXPECT_EQ(drv.pageable_copies(), pageable) << "a copy read memory that was neither pinned nor registered";
  EXPECT_EQ(drv.calls("cuMemHostAlloc"), host_allocs) << "a repeated load pinned memory";
  // A file that is not mapped is staged: nothing registered.
  SafeOpen read(dir / "model.safetensors", {safetensors::Backend::Read});
  EXPECT_TRUE(same_as_file(read, up.load(read)));
  EXPECT_EQ(link.registrations().first, reg1);
}

TEST(CudaUploadZeroCopy, ARefusedRegistrationStagesItsSpanAndTheBytesStayExact) {
  // Unregistering a span with a copy out of it pending, or freeing what a copy reads, aborts the
  // emulator; here each registration or unregistration is refused in turn, at its first, second
  // and third use, and every load still lands every byte.
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  Link link(drv);
  test::TempDir dir;
  SafeOpen f(make_model(dir, 12));
  ScopedEnv on("SAFETENSORS_ZERO_COPY", "1");
  ScopedEnv window("SAFETENSORS_ZERO_COPY_WINDOW", "4M");
  ScopedEnv span("SAFETENSORS_ZERO_COPY_SPAN", "2M");
  // One reader, the feeder itself: it takes every span, so that each failure below meets a
  // registration, an unregistration, a copy or a zeroed gap of a span where it is asked for.
  const cuda::UploadOptions ring{.staging_slots = 4, .slot_bytes = 1u << 20, .readers = 1};
  for (const char* spec :
       {"cuMemHostRegister:1", "cuMemHostRegister:2", "cuMemHostRegister:3:712", "cuMemHostRegister:2:801",
        "cuMemcpyHtoDAsync:2", "cuMemsetD8Async:1", "cuMemHostUnregister:1", "cuMemHostUnregister:3"}) {
    cuda::Uploader up(0, ring);
    const int live = link.live_registrations();
    drv.fail(spec);
    try {
      EXPECT_TRUE(same_as_file(f, up.load(f))) << spec;
    } catch (const safetensors::Error& e) {
      // Only a failed copy fails the load (a refused registration stages, a refused
      // unregistration is counted): as with staging, a Cuda error, then the uploader is reused.
      EXPECT_EQ(e.kind(), ErrorKind::Cuda) << spec;
      EXPECT_TRUE(std::string(spec).rfind("cuMem", 0) == 0 &&
                  std::string(spec).find("Register") == std::string::npos)
          << spec << ": " << e.what();
    }
    drv.fail("");
    EXPECT_TRUE(same_as_file(f, up.load(f))) << "after " << spec;
    // A refused unregistration leaves its span registered (the driver kept it); nothing else does.
    const bool refused_unregister = std::string(spec).find("Unregister") != std::string::npos;
    EXPECT_LE(link.live_registrations(), live + (refused_unregister ? 1 : 0)) << spec;
  }
  // A device without read-only registration: zero-copy stays off, nothing is registered.
  drv.get<void (*)(int)>("fakecuda_set_read_only_register")(0);
  const auto before = drv.calls("cuMemHostRegister");
  cuda::Uploader off(0, ring);
  EXPECT_TRUE(same_as_file(f, off.load(f)));
  EXPECT_EQ(drv.calls("cuMemHostRegister"), before);
  drv.get<void (*)(int)>("fakecuda_set_read_only_register")(1);
  // A registration that holds the driver's lock while it runs (as one real driver does) slows
  // the load but neither deadlocks nor changes a byte.
  drv.get<void (*)(double, int)>("fakecuda_set_register_cost")(2.0, 1);
  cuda::Uploader locking(0, ring);
  EXPECT_TRUE(same_as_file(f, locking.load(f)));
}

TEST(CudaUploadTrace, ATracedLoadWritesItsTimelineWithTheDevicesCopyTimes) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(make_model(dir, 8));
  const auto trace = dir / "trace.jsonl";
  ScopedEnv on("SAFETENSORS_UPLOAD_TRACE", trace.c_str());
  cuda::Uploader up(0, {.staging_slots = 4, .slot_bytes = 1u << 20, .readers = 2});
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(same_as_file(f, up.load(f)));
  std::ifstream in(trace);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << "one line per load";
  for (const auto& line : lines) {
    EXPECT_NE(line.find("\"link_busy\":"), std::string::npos) << line.substr(0, 200);
    EXPECT_NE(line.find("\"device_times\":true"), std::string::npos) << line.substr(0, 200);
    EXPECT_NE(line.find("\"alloc_ns\":["), std::string::npos) << line.substr(0, 200);
    EXPECT_NE(line.find("\"chunks\":[["), std::string::npos) << line.substr(0, 200);
  }
}

}  // namespace
