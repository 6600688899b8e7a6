// Tests of the emulated CUDA driver itself (tests/cuda/emulated_driver.cpp): that it behaves as
// the real driver does where our code depends on it (late asynchronous copies, stream order,
// events, per-thread contexts, reference-counted primary contexts, injected failures), and that
// every check meant to abort does abort, with its message (death tests). Run by ctest with
// SAFETENSORS_FAKE_CUDA_DEVICES=2.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "emulated_cuda.h"

namespace {

#define CU_OK(call) ASSERT_EQ((call), CUDA_SUCCESS) << #call

class EmulatedDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    CU_OK(cuInit(0));
    int n = 0;
    CU_OK(cuDeviceGetCount(&n));
    ASSERT_EQ(n, 2) << "ctest runs these tests with SAFETENSORS_FAKE_CUDA_DEVICES=2";
    fakecuda_set_failures(nullptr);
    fakecuda_hold(0);
    fakecuda_set_link_gbps(FAKECUDA_H2D, 0);
    fakecuda_set_link_gbps(FAKECUDA_D2H, 0);
    fakecuda_set_register_cost(0, 0);
    fakecuda_set_read_only_register(1);
    CU_OK(cuDevicePrimaryCtxRetain(&ctx0_, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx1_, 1));
    CU_OK(cuCtxSetCurrent(ctx0_));
  }
  void TearDown() override {
    fakecuda_hold(0);
    fakecuda_set_link_gbps(FAKECUDA_H2D, 0);
    fakecuda_set_link_gbps(FAKECUDA_D2H, 0);
    fakecuda_set_latency_us(100);
    cuCtxSetCurrent(nullptr);
    cuDevicePrimaryCtxRelease_v2(1);
    cuDevicePrimaryCtxRelease_v2(0);
  }
  CUcontext ctx0_ = nullptr, ctx1_ = nullptr;
};

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(i * 31 + seed);
  return v;
}

/// What most copy tests need: `n` bytes of device memory, `n` bytes of pinned memory holding
/// `pattern(n, seed)`, and a stream made with `flags`, all freed (and checked) at the end.
struct Resources {
  Resources(std::size_t bytes, unsigned flags, std::uint8_t seed) : n(bytes), want(pattern(bytes, seed)) {
    EXPECT_EQ(cuMemAlloc_v2(&device, n), CUDA_SUCCESS);
    EXPECT_EQ(cuMemHostAlloc(&pinned, n, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamCreate(&stream, flags), CUDA_SUCCESS);
    if (pinned) std::memcpy(pinned, want.data(), n);
  }
  ~Resources() {
    EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree_v2(device), CUDA_SUCCESS);
  }
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;

  /// The device memory's bytes, copied back synchronously.
  [[nodiscard]] std::vector<std::uint8_t> device_bytes() const {
    std::vector<std::uint8_t> back(n);
    EXPECT_EQ(cuMemcpyDtoH_v2(back.data(), device, n), CUDA_SUCCESS);
    return back;
  }

  std::size_t n;
  std::vector<std::uint8_t> want;
  CUdeviceptr device = 0;
  void* pinned = nullptr;
  CUstream stream = nullptr;
};

TEST_F(EmulatedDriver, AsyncCopiesCompleteLateAndInStreamOrder) {
  Resources r(1 << 16, CU_STREAM_NON_BLOCKING, 1);
  CUevent e = nullptr;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS) << "an event never recorded is complete";
  auto second = pattern(r.n, 2);
  fakecuda_hold(1);
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, r.n, r.stream));
  auto pageable = fakecuda_pageable_async_copies();
  auto copies = fakecuda_calls("cuMemcpyHtoDAsync");
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, second.data(), r.n, r.stream));  // pageable: its bytes are taken now
  EXPECT_EQ(fakecuda_pageable_async_copies(), pageable + 1);
  EXPECT_EQ(fakecuda_calls("cuMemcpyHtoDAsync_v2"), copies + 1);
  CU_OK(cuEventRecord(e, r.stream));
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(r.stream), CUDA_ERROR_NOT_READY);
  second.assign(r.n, 0);  // allowed: a pageable source was staged before the call returned
  fakecuda_hold(0);
  CU_OK(cuEventSynchronize(e));
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(r.device_bytes(), pattern(r.n, 2)) << "the second copy ran last";
  CU_OK(cuEventDestroy_v2(e));
}

TEST_F(EmulatedDriver, NonBlockingStreamsDoNotWaitForTheLegacyStream) {
  Resources r(4096, CU_STREAM_NON_BLOCKING, 7);
  fakecuda_hold(1);
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, r.n, r.stream));
  fakecuda_hold(0);
  // A synchronous copy runs on the legacy stream, which does not wait for a non-blocking stream:
  // only after synchronizing is the data certain to be there.
  CU_OK(cuStreamSynchronize(r.stream));
  EXPECT_EQ(r.device_bytes(), r.want);
}

TEST_F(EmulatedDriver, BlockingStreamsAreOrderedWithTheLegacyStream) {
  Resources r(4096, CU_STREAM_DEFAULT, 9);
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, r.n, r.stream));
  EXPECT_EQ(r.device_bytes(), r.want);  // the synchronous copy waits for the blocking stream first
}

TEST_F(EmulatedDriver, StreamWaitEventOrdersWorkAcrossStreams) {
  Resources producer(8192, CU_STREAM_NON_BLOCKING, 3);
  void* out = nullptr;
  CUstream consumer = nullptr;
  CUevent e = nullptr;
  CU_OK(cuMemHostAlloc(&out, producer.n, 0));
  CU_OK(cuStreamCreate(&consumer, CU_STREAM_NON_BLOCKING));
  CU_OK(cuEventCreate(&e, CU_EVENT_BLOCKING_SYNC));
  fakecuda_hold(1);
  CU_OK(cuMemcpyHtoDAsync_v2(producer.device, producer.pinned, producer.n, producer.stream));
  CU_OK(cuEventRecord(e, producer.stream));
  CU_OK(cuStreamWaitEvent(consumer, e, 0));
  CU_OK(cuMemcpyDtoHAsync_v2(out, producer.device, producer.n,
                             consumer));  // pinned destination: returns at once
  EXPECT_EQ(cuStreamQuery(consumer), CUDA_ERROR_NOT_READY);
  fakecuda_hold(0);
  CU_OK(cuStreamSynchronize(consumer));
  EXPECT_EQ(std::memcmp(out, producer.want.data(), producer.n), 0)
      << "the consumer ran after the producer's copy";
  float ms = -1;
  EXPECT_EQ(cuEventElapsedTime(&ms, e, e), CUDA_SUCCESS);
  EXPECT_EQ(ms, 0.0f);
  CU_OK(cuEventDestroy_v2(e));
  CU_OK(cuStreamDestroy_v2(consumer));
  CU_OK(cuMemFreeHost(out));
}

TEST_F(EmulatedDriver, UnifiedCopiesAndHostFunctionsRunInStreamOrder) {
  Resources r(4096, CU_STREAM_NON_BLOCKING, 5);
  void* out = nullptr;
  CU_OK(cuMemHostAlloc(&out, r.n, 0));
  struct Seen {
    void* out;
    std::vector<std::uint8_t> bytes;
  } seen{out, {}};
  fakecuda_hold(1);
  CU_OK(cuMemcpyAsync(r.device, reinterpret_cast<std::uintptr_t>(r.pinned), r.n, r.stream));
  CU_OK(cuMemcpyAsync(reinterpret_cast<std::uintptr_t>(out), r.device, r.n, r.stream));
  CU_OK(cuLaunchHostFunc(
      r.stream,
      [](void* user) {
        auto* v = static_cast<Seen*>(user);
        auto* p = static_cast<const std::uint8_t*>(v->out);
        v->bytes.assign(p, p + 4096);
      },
      &seen));
  fakecuda_hold(0);
  CU_OK(cuStreamSynchronize(r.stream));
  EXPECT_EQ(seen.bytes, r.want) << "the host function ran after both copies";
  CU_OK(cuMemFreeHost(out));
}

TEST_F(EmulatedDriver, SpecialStreamHandlesNameTheCurrentContextsStreams) {
  CUcontext owner = nullptr;
  CU_OK(cuStreamGetCtx(nullptr, &owner));
  EXPECT_EQ(owner, ctx0_);
  CU_OK(cuCtxSetCurrent(ctx1_));
  CU_OK(cuStreamGetCtx(FAKECUDA_STREAM_PER_THREAD, &owner));
  EXPECT_EQ(owner, ctx1_);
  CU_OK(cuStreamGetCtx(FAKECUDA_STREAM_LEGACY, &owner));
  EXPECT_EQ(owner, ctx1_);
  CU_OK(cuCtxSetCurrent(nullptr));
  EXPECT_EQ(cuStreamGetCtx(nullptr, &owner), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuStreamGetCtx(reinterpret_cast<CUstream>(&owner), &owner), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(EmulatedDriver, DeviceMemoryIsNotHostMemoryAndBogusPointersAreErrors) {
  CUdeviceptr d = 0;
  CU_OK(cuMemAlloc_v2(&d, 1000));
  EXPECT_EQ(d % 256, 0u);
  EXPECT_GE(d, 0x0000800000000000ull) << "outside the canonical host address range";
  std::vector<std::uint8_t> back(1000);
  CU_OK(cuMemcpyDtoH_v2(back.data(), d, 1000));
  EXPECT_EQ(back, std::vector<std::uint8_t>(1000, 0xA5)) << "never-written memory is not zero";
  EXPECT_EQ(cuMemcpyDtoH_v2(back.data(), 0x1234, 10), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH_v2(back.data(), reinterpret_cast<std::uintptr_t>(back.data()), 10),
            CUDA_ERROR_INVALID_VALUE);
  unsigned type = 0;
  int ordinal = -1;
  CUcontext owner = nullptr;
  CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 10));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
  EXPECT_EQ(ordinal, 0);
  CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d));
  EXPECT_EQ(owner, ctx0_);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0x1234), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemFree_v2(d));
  EXPECT_EQ(cuMemFree_v2(0x1234), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(EmulatedDriver, TheCurrentContextIsPerThread) {
  CUcontext here = nullptr, there = ctx0_;
  CU_OK(cuCtxSetCurrent(ctx1_));
  std::thread t([&] { cuCtxGetCurrent(&there); });
  t.join();
  EXPECT_EQ(there, nullptr) << "a new thread has no current context";
  CU_OK(cuCtxGetCurrent(&here));
  EXPECT_EQ(here, ctx1_);
  CU_OK(cuCtxPushCurrent_v2(ctx0_));
  CUdevice dev = -1;
  CU_OK(cuCtxGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  CUcontext popped = nullptr;
  CU_OK(cuCtxPopCurrent_v2(&popped));
  EXPECT_EQ(popped, ctx0_);
  CU_OK(cuCtxGetDevice(&dev));
  EXPECT_EQ(dev, 1);
  CU_OK(cuCtxSetCurrent(nullptr));
  CUdeviceptr d = 0;
  EXPECT_EQ(cuMemAlloc_v2(&d, 16), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(EmulatedDriver, ReleasingTheLastPrimaryReferenceFreesEverythingInTheContext) {
  int allocations = fakecuda_live_device_allocations(), pinned_before = fakecuda_live_pinned_allocations();
  int resets = fakecuda_primary_ctx_resets(0);
  CUcontext again = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&again, 0));
  EXPECT_EQ(again, ctx0_) << "the primary context handle is the same";
  EXPECT_EQ(fakecuda_primary_ctx_refs(0), 2);
  CUdeviceptr d = 0;
  void* pinned = nullptr;
  CU_OK(cuMemAlloc_v2(&d, 64));
  CU_OK(cuMemHostAlloc(&pinned, 64, 0));
  CU_OK(cuDevicePrimaryCtxRelease_v2(0));
  EXPECT_EQ(fakecuda_live_device_allocations(), allocations + 1) << "one reference left: nothing freed";
  CU_OK(cuDevicePrimaryCtxRelease_v2(0));
  EXPECT_EQ(fakecuda_primary_ctx_resets(0), resets + 1);
  EXPECT_EQ(fakecuda_live_device_allocations(), allocations);
  EXPECT_EQ(fakecuda_live_pinned_allocations(), pinned_before);
  CUdeviceptr other = 0;
  EXPECT_EQ(cuMemAlloc_v2(&other, 64), CUDA_ERROR_CONTEXT_IS_DESTROYED) << "the current context was reset";
  CU_OK(cuDevicePrimaryCtxRetain(&ctx0_, 0));  // for TearDown
}

TEST_F(EmulatedDriver, DestroyingAStreamReturnsAtOnceAndItsQueuedWorkStillRuns) {
  // As documented for cuStreamDestroy: it returns at once, and the stream's queued work still
  // completes. A destroy that waited would hide a caller that frees a copy's source or
  // destination right after destroying its stream.
  const std::size_t n = 4096;
  CUdeviceptr d = 0;
  void* pinned = nullptr;
  CUstream s = nullptr;
  CUevent e = nullptr;
  CU_OK(cuMemAlloc_v2(&d, n));
  CU_OK(cuMemHostAlloc(&pinned, n, 0));
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  auto want = pattern(n, 5);
  std::memcpy(pinned, want.data(), n);
  fakecuda_hold(1);
  CU_OK(cuMemcpyHtoDAsync_v2(d, pinned, n, s));
  CU_OK(cuEventRecord(e, s));
  // Lets the stream run once destroy has returned (or, should destroy wait for the stream, after
  // a while, so that this test fails instead of hanging).
  std::mutex m;
  std::condition_variable cv;
  bool returned = false;
  std::thread release([&] {
    std::unique_lock lk(m);
    cv.wait_for(lk, std::chrono::seconds(5), [&] { return returned; });
    fakecuda_hold(0);
  });
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY) << "cuStreamDestroy waited for the stream's work";
  {
    std::lock_guard lk(m);
    returned = true;
  }
  cv.notify_all();
  release.join();
  CU_OK(cuEventSynchronize(e));
  std::vector<std::uint8_t> back(n);
  CU_OK(cuMemcpyDtoH_v2(back.data(), d, n));
  EXPECT_EQ(back, want) << "the destroyed stream's copy ran";
  CU_OK(cuEventDestroy_v2(e));
  CU_OK(cuMemFreeHost(pinned));
  CU_OK(cuMemFree_v2(d));
}

TEST_F(EmulatedDriver, InjectedFailuresHitTheNthCallOnly) {
  ASSERT_EQ(fakecuda_set_failures("cuMemAlloc:2,cuEventSynchronize:1:719"), 0);
  CUdeviceptr a = 0, b = 0, c = 0;
  CU_OK(cuMemAlloc_v2(&a, 16));
  EXPECT_EQ(cuMemAlloc_v2(&b, 16), CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(cuMemAlloc_v2(&c, 16));
  CUevent e = nullptr;
  CU_OK(cuEventCreate(&e, 0));
  EXPECT_EQ(cuEventSynchronize(e), CUDA_ERROR_LAUNCH_FAILED);
  CU_OK(cuEventSynchronize(e));
  EXPECT_EQ(fakecuda_set_failures("cuMemAlloc"), -1) << "malformed";
  EXPECT_EQ(fakecuda_set_failures("cuMemAlloc:0"), -1) << "calls count from 1";
  CU_OK(cuEventDestroy_v2(e));
  CU_OK(cuMemFree_v2(a));
  CU_OK(cuMemFree_v2(c));
}

TEST_F(EmulatedDriver, StreamCaptureIsReportedAndSynchronizingItIsRefused) {
  CUstream s = nullptr;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  int status = -1;
  CU_OK(cuStreamIsCapturing(s, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(cuStreamBeginCapture_v2(s, 0));
  CU_OK(cuStreamIsCapturing(s, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph g = nullptr;
  CU_OK(cuStreamEndCapture(s, &g));
  CU_OK(cuGraphDestroy(g));
  CUcontext owner = nullptr;
  CU_OK(cuStreamGetCtx(s, &owner));
  EXPECT_EQ(owner, ctx0_);
  CU_OK(cuStreamDestroy_v2(s));
}

// ---- checks that abort ----------------------------------------------------------------------

/// A 4096-byte copy from pinned memory to device memory on a stream of its own, enqueued and
/// held pending (`fakecuda_hold(1)`): what the checks on pending copies look at.
struct PendingCopy {
  CUdeviceptr device = 0;
  void* pinned = nullptr;
  CUstream stream = nullptr;
  PendingCopy() {
    cuMemAlloc_v2(&device, 4096);
    cuMemHostAlloc(&pinned, 4096, 0);
    cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    fakecuda_hold(1);
    cuMemcpyHtoDAsync_v2(device, pinned, 4096, stream);
  }
};

/// Releases the test's reference to device 0's primary context, the last one, which resets the
/// context, and retains it again: whatever was made in it before is gone.
void reset_primary_context_0() {
  cuDevicePrimaryCtxRelease_v2(0);
  CUcontext again = nullptr;
  cuDevicePrimaryCtxRetain(&again, 0);
}

TEST_F(EmulatedDriver, DiesWhenAPinnedSourceIsModifiedBeforeItsCopyCompletes) {
  EXPECT_DEATH(
      {
        PendingCopy copy;
        static_cast<std::uint8_t*>(copy.pinned)[100] ^= 1;
        fakecuda_hold(0);
        cuStreamSynchronize(copy.stream);
      },
      "pinned buffer .* was modified while the copy was pending");
}

TEST_F(EmulatedDriver, DiesWhenAPinnedBufferIsFreedWithACopyPending) {
  EXPECT_DEATH(
      {
        PendingCopy copy;
        cuMemFreeHost(copy.pinned);
      },
      "cuMemFreeHost: pinned buffer .* freed while 1 copies from or into it are pending");
}

TEST_F(EmulatedDriver, DiesWhenDeviceMemoryIsFreedWithACopyPending) {
  EXPECT_DEATH(
      {
        PendingCopy copy;
        cuMemFree_v2(copy.device);
      },
      "cuMemFree_v2: device memory .* freed while 1 copies");
}

TEST_F(EmulatedDriver, DiesWhenAnEventIsRecordedOnAStreamOfAnotherContext) {
  EXPECT_DEATH(
      {
        CUevent e = nullptr;
        CUstream s = nullptr;
        cuEventCreate(&e, 0);  // device 0
        cuCtxSetCurrent(ctx1_);
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);  // device 1
        cuEventRecord(e, s);
      },
      "cuEventRecord: event .* of device 0 .* recorded on stream .* of device 1");
}

TEST_F(EmulatedDriver, DiesWhenACopyTargetsMemoryOfAnotherDevice) {
  EXPECT_DEATH(
      {
        CUdeviceptr d = 0;
        CUstream s = nullptr;
        std::uint8_t src[16] = {};
        cuMemAlloc_v2(&d, 16);  // device 0
        cuCtxSetCurrent(ctx1_);
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);  // device 1
        cuMemcpyHtoDAsync_v2(d, src, 16, s);
      },
      "device memory .* of device 0 .* on a stream of device 1");
}

TEST_F(EmulatedDriver, DiesWhenMemoryIsUsedAfterItsContextWasReset) {
  EXPECT_DEATH(
      {
        CUdeviceptr d = 0;
        cuMemAlloc_v2(&d, 16);
        reset_primary_context_0();
        std::uint8_t back[16];
        cuMemcpyDtoH_v2(back, d, 16);
      },
      "lies in memory that was freed .* primary context of device 0 was reset when its last reference "
      "was released");
}

TEST_F(EmulatedDriver, DiesWhenAStreamIsUsedAfterItsContextWasReset) {
  EXPECT_DEATH(
      {
        CUstream s = nullptr;
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        reset_primary_context_0();
        cuStreamDestroy_v2(s);
      },
      "cuStreamDestroy_v2: stream .* used after its context was reset");
}

TEST_F(EmulatedDriver, DiesWhenDeviceMemoryIsUsedAfterCuMemFree) {
  EXPECT_DEATH(
      {
        CUdeviceptr d = 0;
        cuMemAlloc_v2(&d, 16);
        cuMemFree_v2(d);
        std::uint8_t back[16];
        cuMemcpyDtoH_v2(back, d + 4, 16);
      },
      "lies in memory that was freed .*: freed by cuMemFree");
}

TEST_F(EmulatedDriver, DiesWhenACopyOverrunsItsAllocation) {
  EXPECT_DEATH(
      {
        CUdeviceptr d = 0;
        cuMemAlloc_v2(&d, 16);
        std::uint8_t back[32];
        cuMemcpyDtoH_v2(back, d, 32);
      },
      "32 bytes at .* overrun the device allocation");
}

TEST_F(EmulatedDriver, DiesWhenACopyReadsDeviceBytesAPendingCopyOnAnotherStreamWrites) {
  EXPECT_DEATH(
      {
        PendingCopy copy;  // writes copy.device on copy.stream, held
        CUstream other = nullptr;
        void* out = nullptr;
        cuStreamCreate(&other, CU_STREAM_NON_BLOCKING);
        cuMemHostAlloc(&out, 16, 0);
        cuMemcpyDtoHAsync_v2(out, copy.device + 100, 16, other);
      },
      "touches device memory that a pending cuMemcpyHtoDAsync_v2 on stream .* writes, and nothing "
      "orders the two");
}

TEST_F(EmulatedDriver, DiesWhenACopyOverwritesDeviceBytesAPendingCopyOnAnotherStreamReads) {
  EXPECT_DEATH(
      {
        CUdeviceptr src = 0;
        CUdeviceptr dst = 0;
        CUstream reader = nullptr;
        CUstream writer = nullptr;
        std::uint8_t bytes[64] = {};
        cuMemAlloc_v2(&src, 64);
        cuMemAlloc_v2(&dst, 64);
        cuStreamCreate(&reader, CU_STREAM_NON_BLOCKING);
        cuStreamCreate(&writer, CU_STREAM_NON_BLOCKING);
        fakecuda_hold(1);
        cuMemcpyDtoDAsync_v2(dst, src, 64, reader);
        cuMemcpyHtoDAsync_v2(src + 32, bytes, 8, writer);  // pageable source: taken at once
      },
      "a copy of 8 bytes on stream .* touches device memory that a pending cuMemcpyDtoDAsync_v2 .* "
      "reads");
}

TEST_F(EmulatedDriver, CopiesOnTwoStreamsOrderedByAnEventOrSynchronizationAreAllowed) {
  Resources r(4096, CU_STREAM_NON_BLOCKING, 11);
  CUstream other = nullptr;
  CUevent e = nullptr;
  CUdeviceptr copy = 0;
  CU_OK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CU_OK(cuEventCreate(&e, 0));
  CU_OK(cuMemAlloc_v2(&copy, r.n));
  fakecuda_hold(1);
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, r.n, r.stream));
  CU_OK(cuEventRecord(e, r.stream));
  CU_OK(cuStreamWaitEvent(other, e, 0));
  CU_OK(cuMemcpyDtoDAsync_v2(copy, r.device, r.n, other));  // ordered by the event
  fakecuda_hold(0);
  CU_OK(cuStreamSynchronize(other));
  // Nothing pending any more: overwriting from the first stream needs no ordering.
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, r.n, r.stream));
  CU_OK(cuStreamSynchronize(r.stream));
  std::vector<std::uint8_t> back(r.n);
  CU_OK(cuMemcpyDtoH_v2(back.data(), copy, r.n));
  EXPECT_EQ(back, r.want);
  CU_OK(cuMemFree_v2(copy));
  CU_OK(cuEventDestroy_v2(e));
  CU_OK(cuStreamDestroy_v2(other));
}

TEST_F(EmulatedDriver, PeakDeviceBytesCountTheMostLiveAtOnce) {
  const std::size_t before = fakecuda_peak_device_bytes(1);
  CUdeviceptr a = 0, b = 0, c = 0;
  CU_OK(cuMemAlloc_v2(&a, 1000));
  CU_OK(cuMemAlloc_v2(&b, 3000));
  CU_OK(cuMemFree_v2(a));
  CU_OK(cuMemAlloc_v2(&c, 500));
  EXPECT_EQ(fakecuda_peak_device_bytes(0), before + 4000);
  CU_OK(cuMemFree_v2(b));
  CU_OK(cuMemFree_v2(c));
  EXPECT_EQ(fakecuda_peak_device_bytes(1), before);
}

TEST_F(EmulatedDriver, DiesWhenWorkIsEnqueuedOnACapturingStream) {
  EXPECT_DEATH(
      {
        CUdeviceptr d = 0;
        CUstream s = nullptr;
        std::uint8_t src[16] = {};
        cuMemAlloc_v2(&d, 16);
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        cuStreamBeginCapture_v2(s, 0);
        cuMemcpyHtoDAsync_v2(d, src, 16, s);
      },
      "while it is capturing a graph");
}

/// A link's counters (fakecuda_link_stats).
struct LinkStats {
  unsigned long long busy = 0, first = 0, last = 0, copies = 0;
};

LinkStats link_stats(int device, int direction) {
  LinkStats s;
  EXPECT_EQ(fakecuda_link_stats(device, direction, &s.busy, &s.first, &s.last, &s.copies), 0);
  return s;
}

TEST_F(EmulatedDriver, CopiesOfEveryStreamOfADeviceTakeTurnsOnItsLinkOnTheClock) {
  // 1/64 GB/s (a power of two, so the division is exact) and no latency: a copy of n bytes
  // holds the link exactly 64 n ns (134 ms). Both copies are enqueued one after the other, so
  // the second waits for the link rather than for its stream: the schedule is the clock's,
  // whatever the host's speed. The link must be slow against enqueueing a copy (which reads
  // its pinned source once for the driver's checksum): with a fast link (1 GB/s, 32 MiB) the
  // second copy's enqueue under a sanitizer on a busy machine came after the first had ended.
  fakecuda_set_latency_us(0);
  constexpr double gbps = 1.0 / 64;
  fakecuda_set_link_gbps(FAKECUDA_H2D, gbps);
  fakecuda_link_reset();
  constexpr std::size_t n = 2 << 20;
  constexpr auto link_ns = static_cast<unsigned long long>(n / gbps);
  Resources a(n, CU_STREAM_NON_BLOCKING, 1), b(n, CU_STREAM_NON_BLOCKING, 2);
  void* back = nullptr;
  CU_OK(cuMemHostAlloc(&back, 4096, 0));
  const auto t0 = std::chrono::steady_clock::now();
  fakecuda_hold(1);
  CU_OK(cuMemcpyHtoDAsync_v2(a.device, a.pinned, n, a.stream));
  CU_OK(cuMemcpyHtoDAsync_v2(b.device, b.pinned, n, b.stream));
  CU_OK(cuMemcpyDtoHAsync_v2(back, b.device, 4096, b.stream));  // the other direction's link
  fakecuda_hold(0);
  CU_OK(cuStreamSynchronize(a.stream));
  CU_OK(cuStreamSynchronize(b.stream));
  const auto took = std::chrono::steady_clock::now() - t0;
  LinkStats h2d = link_stats(0, FAKECUDA_H2D);
  EXPECT_EQ(h2d.copies, 2u);
  EXPECT_EQ(link_ns, 64ull * n);
  EXPECT_EQ(h2d.busy, 2 * link_ns) << "n bytes at 1/64 GB/s hold the link 64 n ns";
  EXPECT_EQ(h2d.last - h2d.first, h2d.busy) << "the second copy started the moment the first ended";
  EXPECT_GE(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count(),
            static_cast<long long>(2 * link_ns))
      << "the copies were done only once the link had carried them";
  LinkStats d2h = link_stats(0, FAKECUDA_D2H);
  EXPECT_EQ(d2h.copies, 0u) << "the other direction's link has no bandwidth set: not modelled";
  EXPECT_EQ(link_stats(1, FAKECUDA_H2D).copies, 0u) << "device 1's link carried nothing";
  EXPECT_EQ(a.device_bytes(), a.want);
  EXPECT_EQ(b.device_bytes(), b.want);
  unsigned long long busy = 0;
  EXPECT_EQ(fakecuda_link_stats(2, FAKECUDA_H2D, &busy, nullptr, nullptr, nullptr), -1) << "no device 2";
  fakecuda_link_reset();
  EXPECT_EQ(link_stats(0, FAKECUDA_H2D).copies, 0u);
  CU_OK(cuMemFreeHost(back));
}

TEST_F(EmulatedDriver, ALinkIdlesWhileNothingIsQueuedOnIt) {
  fakecuda_set_latency_us(0);
  fakecuda_set_link_gbps(FAKECUDA_H2D, 1.0);
  constexpr std::size_t n = 4 << 20;
  Resources r(n, CU_STREAM_NON_BLOCKING, 4);
  fakecuda_link_reset();
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, n, r.stream));
  CU_OK(cuStreamSynchronize(r.stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CU_OK(cuMemcpyHtoDAsync_v2(r.device, r.pinned, n, r.stream));
  CU_OK(cuStreamSynchronize(r.stream));
  LinkStats s = link_stats(0, FAKECUDA_H2D);
  EXPECT_EQ(s.busy, 2 * n);
  EXPECT_GE(s.last - s.first, s.busy + 20'000'000) << "the 20 ms with nothing queued are idle time";
  EXPECT_LE(s.first, fakecuda_clock_ns());
}

/// `pages` pages of anonymous memory with protection `prot`, unmapped at the end.
struct Pages {
  Pages(std::size_t pages, int prot) : n(pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))) {
    p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    auto* bytes = static_cast<std::uint8_t*>(p);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(i * 13 + 5);
    EXPECT_EQ(::mprotect(p, n, prot), 0);
  }
  ~Pages() { ::munmap(p, n); }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  std::size_t n;
  void* p = nullptr;
};

TEST_F(EmulatedDriver, RegisteredMemoryIsCopiedAsPinnedAndCounted) {
  int attr = 0;
  CU_OK(cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0));
  EXPECT_EQ(attr, 1);
  CU_OK(cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0));
  EXPECT_EQ(attr, 1);
  Pages ro(16, PROT_READ);
  const std::size_t peak = fakecuda_peak_registered_bytes(1);
  unsigned long long reg0 = 0, unreg0 = 0;
  fakecuda_registrations(&reg0, &unreg0);
  CU_OK(cuMemHostRegister_v2(ro.p, ro.n, CU_MEMHOSTREGISTER_READ_ONLY));
  EXPECT_EQ(fakecuda_registered_bytes(), ro.n);
  EXPECT_EQ(fakecuda_live_registrations(), 1);
  CUdeviceptr d = 0;
  CUstream s = nullptr;
  CU_OK(cuMemAlloc_v2(&d, ro.n));
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const auto pageable = fakecuda_pageable_async_copies();
  CU_OK(cuMemcpyHtoDAsync_v2(d, static_cast<std::uint8_t*>(ro.p) + 100, ro.n - 100, s));
  EXPECT_EQ(fakecuda_pageable_async_copies(), pageable) << "registered memory is not pageable";
  CU_OK(cuStreamSynchronize(s));
  std::vector<std::uint8_t> back(ro.n - 100);
  CU_OK(cuMemcpyDtoH_v2(back.data(), d, back.size()));
  EXPECT_EQ(std::memcmp(back.data(), static_cast<std::uint8_t*>(ro.p) + 100, back.size()), 0);
  // The device may not write read-only registered memory.
  EXPECT_EQ(cuMemcpyDtoHAsync_v2(ro.p, d, 64, s), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemHostUnregister(ro.p));
  EXPECT_EQ(cuMemHostUnregister(ro.p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) << "only once";
  EXPECT_EQ(fakecuda_registered_bytes(), 0u);
  EXPECT_EQ(fakecuda_peak_registered_bytes(0), peak + ro.n);
  unsigned long long reg1 = 0, unreg1 = 0;
  fakecuda_registrations(&reg1, &unreg1);
  EXPECT_EQ(reg1, reg0 + 1);
  EXPECT_EQ(unreg1, unreg0 + 1);
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuMemFree_v2(d));
}

TEST_F(EmulatedDriver, RegistrationRefusesWhatTheDriverRefuses) {
  Pages rw(8, PROT_READ | PROT_WRITE), ro(8, PROT_READ);
  auto* base = static_cast<std::uint8_t*>(rw.p);
  EXPECT_EQ(cuMemHostRegister_v2(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister_v2(rw.p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister_v2(rw.p, 4096, 0x10), CUDA_ERROR_INVALID_VALUE) << "unknown flag";
  EXPECT_EQ(cuMemHostRegister_v2(ro.p, ro.n, 0), CUDA_ERROR_INVALID_VALUE)
      << "a read-only mapping needs CU_MEMHOSTREGISTER_READ_ONLY";
  fakecuda_set_read_only_register(0);
  EXPECT_EQ(cuMemHostRegister_v2(ro.p, ro.n, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_ERROR_NOT_SUPPORTED);
  fakecuda_set_read_only_register(1);
  CU_OK(cuMemHostRegister_v2(base + 4096, 8192, 0));
  EXPECT_EQ(cuMemHostRegister_v2(base, 8192, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister_v2(base + 8192, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CU_OK(cuMemHostRegister_v2(base, 4096, 0)) << "adjacent, not overlapping";
  EXPECT_EQ(cuMemHostUnregister(base + 8192), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) << "not a range's start";
  ASSERT_EQ(fakecuda_set_failures("cuMemHostRegister:1,cuMemHostUnregister:1"), 0);
  EXPECT_EQ(cuMemHostRegister_v2(base + 3 * 4096, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemHostUnregister(base), CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(fakecuda_live_registrations(), 2) << "an injected failure changes nothing";
  CU_OK(cuMemHostUnregister(base));
  CU_OK(cuMemHostUnregister(base + 4096));
  EXPECT_EQ(fakecuda_live_registrations(), 0);
  void* pinned = nullptr;
  CU_OK(cuMemHostAlloc(&pinned, 4096, 0));
  EXPECT_EQ(cuMemHostRegister_v2(pinned, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
      << "pinned memory is page-locked already";
  CU_OK(cuMemFreeHost(pinned));
}

TEST_F(EmulatedDriver, ARegistrationCostsItsTimeAndCanHoldEveryOtherCall) {
  Pages rw(256, PROT_READ | PROT_WRITE);  // 1 MiB with 4 KiB pages
  fakecuda_set_register_cost(0.05, 1);    // 20 ms per MiB, holding the driver's lock
  std::atomic<bool> registering{false};
  std::chrono::steady_clock::duration waited{};
  std::thread other([&] {
    while (!registering) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto t0 = std::chrono::steady_clock::now();
    int n = 0;
    cuDeviceGetCount(&n);
    waited = std::chrono::steady_clock::now() - t0;
  });
  const auto t0 = std::chrono::steady_clock::now();
  registering = true;
  CU_OK(cuMemHostRegister_v2(rw.p, rw.n, 0));
  const auto took = std::chrono::steady_clock::now() - t0;
  other.join();
  EXPECT_GE(took, std::chrono::nanoseconds(static_cast<long long>(static_cast<double>(rw.n) / 0.05)));
  EXPECT_GE(waited, std::chrono::milliseconds(5)) << "another call waited for the registration";
  fakecuda_set_register_cost(0, 0);
  CU_OK(cuMemHostUnregister(rw.p));
}

TEST_F(EmulatedDriver, DiesWhenRegisteredMemoryIsUnregisteredWithACopyPending) {
  EXPECT_DEATH(
      {
        Pages rw(4, PROT_READ | PROT_WRITE);
        CUdeviceptr d = 0;
        CUstream s = nullptr;
        cuMemAlloc_v2(&d, rw.n);
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        cuMemHostRegister_v2(rw.p, rw.n, 0);
        fakecuda_hold(1);
        cuMemcpyHtoDAsync_v2(d, rw.p, rw.n, s);
        cuMemHostUnregister(rw.p);
      },
      "cuMemHostUnregister: registered range .* unregistered while 1 copies");
}

TEST_F(EmulatedDriver, DiesWhenRegisteredMemoryIsModifiedBeforeItsCopyCompletes) {
  EXPECT_DEATH(
      {
        Pages rw(4, PROT_READ | PROT_WRITE);
        CUdeviceptr d = 0;
        CUstream s = nullptr;
        cuMemAlloc_v2(&d, rw.n);
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        cuMemHostRegister_v2(rw.p, rw.n, 0);
        fakecuda_hold(1);
        cuMemcpyHtoDAsync_v2(d, rw.p, rw.n, s);
        static_cast<std::uint8_t*>(rw.p)[7] ^= 1;
        fakecuda_hold(0);
        cuStreamSynchronize(s);
      },
      "was modified while the copy was pending");
}

}  // namespace
