/* The C interface of the emulated CUDA driver (tests/cuda/emulated_driver.cpp): the subset of
 * the CUDA driver API it implements, with the driver's own names, types and ABI (so that cudarc,
 * which dlsyms these names from libcuda.so, cannot tell it from the real library), plus a few
 * `fakecuda_*` controls and statistics for the driver's self-tests and for GPU tests that look
 * them up with dlsym. Error codes and constants carry the values of NVIDIA's cuda.h (CUDA 12.4),
 * restated here so that no CUDA header is needed. */
#ifndef SAFETENSORS_TESTS_EMULATED_CUDA_H
#define SAFETENSORS_TESTS_EMULATED_CUDA_H

#include <stddef.h>

#define FAKECUDA_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUgraph_st* CUgraph;
typedef void (*CUhostFn)(void* user);

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
  CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_UNKNOWN = 999
};

/* Special stream handles (cuda.h's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD); 0 is the legacy
 * default stream too. */
#define FAKECUDA_STREAM_LEGACY ((CUstream)0x1)
#define FAKECUDA_STREAM_PER_THREAD ((CUstream)0x2)

enum { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DEFAULT = 0, CU_EVENT_BLOCKING_SYNC = 1, CU_EVENT_DISABLE_TIMING = 2 };
enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
};
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
enum {
  CU_MEMHOSTREGISTER_PORTABLE = 1,
  CU_MEMHOSTREGISTER_DEVICEMAP = 2,
  CU_MEMHOSTREGISTER_IOMEMORY = 4,
  CU_MEMHOSTREGISTER_READ_ONLY = 8
};
enum {
  CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
  CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100,
  CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113
};
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 };

/* ---- initialisation, devices, errors ---- */
FAKECUDA_API CUresult cuInit(unsigned int flags);
FAKECUDA_API CUresult cuDriverGetVersion(int* version);
FAKECUDA_API CUresult cuGetErrorName(CUresult error, const char** name);
FAKECUDA_API CUresult cuGetErrorString(CUresult error, const char** text);
FAKECUDA_API CUresult cuDeviceGetCount(int* count);
FAKECUDA_API CUresult cuDeviceGet(CUdevice* device, int ordinal);
FAKECUDA_API CUresult cuDeviceGetName(char* name, int len, CUdevice device);
FAKECUDA_API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device);
FAKECUDA_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device);

/* ---- contexts ---- */
FAKECUDA_API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device);
FAKECUDA_API CUresult cuDevicePrimaryCtxRelease(CUdevice device);
FAKECUDA_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device);
FAKECUDA_API CUresult cuDevicePrimaryCtxReset(CUdevice device);
FAKECUDA_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice device);
FAKECUDA_API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active);
FAKECUDA_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags);
FAKECUDA_API CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice device);
FAKECUDA_API CUresult cuCtxDestroy_v2(CUcontext ctx);
FAKECUDA_API CUresult cuCtxGetCurrent(CUcontext* ctx);
FAKECUDA_API CUresult cuCtxSetCurrent(CUcontext ctx);
FAKECUDA_API CUresult cuCtxPushCurrent_v2(CUcontext ctx);
FAKECUDA_API CUresult cuCtxPopCurrent_v2(CUcontext* ctx);
FAKECUDA_API CUresult cuCtxGetDevice(CUdevice* device);
FAKECUDA_API CUresult cuCtxSynchronize(void);

/* ---- memory ---- */
FAKECUDA_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes);
FAKECUDA_API CUresult cuMemFree_v2(CUdeviceptr dptr);
FAKECUDA_API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes);
FAKECUDA_API CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags);
FAKECUDA_API CUresult cuMemAllocHost_v2(void** pp, size_t bytes);
FAKECUDA_API CUresult cuMemFreeHost(void* p);
/* Page-locks (registers) existing host memory: copies from it are then DMA, as from pinned
 * memory. With READ_ONLY the memory may be a read-only mapping (the driver only reads it). */
FAKECUDA_API CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags);
FAKECUDA_API CUresult cuMemHostRegister(void* p, size_t bytes, unsigned int flags);
FAKECUDA_API CUresult cuMemHostUnregister(void* p);
FAKECUDA_API CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr);
FAKECUDA_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes);
FAKECUDA_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes);
FAKECUDA_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
FAKECUDA_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);
FAKECUDA_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream);
FAKECUDA_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
FAKECUDA_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes);
FAKECUDA_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream);
/* Unified addressing: either side may be device or host memory. */
FAKECUDA_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
FAKECUDA_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);

/* ---- streams ---- */
FAKECUDA_API CUresult cuStreamCreate(CUstream* stream, unsigned int flags);
FAKECUDA_API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority);
FAKECUDA_API CUresult cuStreamDestroy_v2(CUstream stream);
FAKECUDA_API CUresult cuStreamSynchronize(CUstream stream);
FAKECUDA_API CUresult cuStreamQuery(CUstream stream);
FAKECUDA_API CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx);
FAKECUDA_API CUresult cuStreamGetFlags(CUstream stream, unsigned int* flags);
FAKECUDA_API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
FAKECUDA_API CUresult cuStreamIsCapturing(CUstream stream, int* status);
FAKECUDA_API CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
FAKECUDA_API CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph);
FAKECUDA_API CUresult cuGraphDestroy(CUgraph graph);
/* Calls fn(user) on a driver thread once the stream's earlier work is done. */
FAKECUDA_API CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user);

/* ---- events ---- */
FAKECUDA_API CUresult cuEventCreate(CUevent* event, unsigned int flags);
FAKECUDA_API CUresult cuEventDestroy_v2(CUevent event);
FAKECUDA_API CUresult cuEventRecord(CUevent event, CUstream stream);
FAKECUDA_API CUresult cuEventQuery(CUevent event);
FAKECUDA_API CUresult cuEventSynchronize(CUevent event);
FAKECUDA_API CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end);

/* ---- controls and statistics of the emulation (not CUDA) ---- */
/* Live device allocations (all devices) and their bytes; live pinned host allocations. */
FAKECUDA_API int fakecuda_live_device_allocations(void);
FAKECUDA_API size_t fakecuda_live_device_bytes(void);
FAKECUDA_API int fakecuda_live_pinned_allocations(void);
/* The most device bytes (all devices) live at once since the last reset; a non-zero `reset`
 * first restarts the count from the bytes live now. */
FAKECUDA_API size_t fakecuda_peak_device_bytes(int reset);
/* The most pinned host bytes live at once since the last reset; a non-zero `reset` first
 * restarts the count from the bytes live now. */
FAKECUDA_API size_t fakecuda_peak_pinned_bytes(int reset);
/* Live streams (created by cuStreamCreate, not destroyed) and events. */
FAKECUDA_API int fakecuda_live_streams(void);
FAKECUDA_API int fakecuda_live_events(void);
/* References held on a device's primary context, and how often it was reset. */
FAKECUDA_API int fakecuda_primary_ctx_refs(int device);
FAKECUDA_API int fakecuda_primary_ctx_resets(int device);
/* Copies completed since start. */
FAKECUDA_API unsigned long long fakecuda_copies_completed(void);
/* Calls of an entry point since cuInit (name with or without its _v2), e.g. to check that a
 * second load allocates no new pinned memory: fakecuda_calls("cuMemHostAlloc"). */
FAKECUDA_API unsigned long long fakecuda_calls(const char* fn);
/* Asynchronous host-to-device copies whose source was pageable (not pinned) memory: legal, but
 * the real driver then stages them synchronously, so an upload should make none. */
FAKECUDA_API unsigned long long fakecuda_pageable_async_copies(void);
/* Replaces the injected failures (SAFETENSORS_FAKE_CUDA_FAIL syntax, NULL or "" for none) and
 * restarts the call counts; returns 0, or -1 for a malformed spec. */
FAKECUDA_API int fakecuda_set_failures(const char* spec);
/* Sets the latency of every copy in microseconds (SAFETENSORS_FAKE_CUDA_LATENCY_US). */
FAKECUDA_API void fakecuda_set_latency_us(unsigned int us);
/* While held (non-zero), no stream makes progress: tests see copies pending, deterministically. */
FAKECUDA_API void fakecuda_hold(int held);

/* The link between host and device: one per device and direction, at `gbps` (10^9 bytes per
 * second; 0, the default, for none: copies then only wait their latency, every stream at once).
 * With a link, the copies of every stream of a device in that direction take turns on it, on the
 * driver's clock: each starts at max(when its stream reaches it, when the link is free) and ends
 * latency + bytes / bandwidth later (SAFETENSORS_FAKE_CUDA_H2D_GBPS, _D2H_GBPS). */
enum { FAKECUDA_H2D = 0, FAKECUDA_D2H = 1 };
FAKECUDA_API void fakecuda_set_link_gbps(int direction, double gbps);
/* The driver's clock now, in nanoseconds: the epoch of the link statistics. */
FAKECUDA_API unsigned long long fakecuda_clock_ns(void);
/* A link's statistics since the last reset: the time it carried copies, the start of its first
 * copy and the end of its last (clock nanoseconds; 0 and 0 with no copy), and its copies.
 * Returns 0, or -1 for a device or direction that does not exist. */
FAKECUDA_API int fakecuda_link_stats(int device, int direction, unsigned long long* busy_ns,
                                     unsigned long long* first_start_ns, unsigned long long* last_end_ns,
                                     unsigned long long* copies);
/* Restarts every link's statistics. */
FAKECUDA_API void fakecuda_link_reset(void);

/* Registered host memory (cuMemHostRegister): bytes and ranges registered now, the most bytes
 * registered at once since the last reset (a non-zero `reset` first restarts it from now), and
 * the successful registrations and unregistrations since start. */
FAKECUDA_API size_t fakecuda_registered_bytes(void);
FAKECUDA_API int fakecuda_live_registrations(void);
FAKECUDA_API size_t fakecuda_peak_registered_bytes(int reset);
FAKECUDA_API void fakecuda_registrations(unsigned long long* registered, unsigned long long* unregistered);
/* What a registration costs: `gbps` (0: nothing; SAFETENSORS_FAKE_CUDA_REGISTER_GBPS), and
 * with a non-zero `hold_api_lock` every other driver call waits for it to finish, as one real
 * driver was seen to do (SAFETENSORS_FAKE_CUDA_REGISTER_LOCKS=1). */
FAKECUDA_API void fakecuda_set_register_cost(double gbps, int hold_api_lock);
/* Whether the devices say they can register read-only memory (attribute 113; default 1,
 * SAFETENSORS_FAKE_CUDA_READ_ONLY_REGISTER=0 for no); without, READ_ONLY registrations fail
 * with CUDA_ERROR_NOT_SUPPORTED. */
FAKECUDA_API void fakecuda_set_read_only_register(int supported);

#ifdef __cplusplus
}
#endif

#endif
