// An emulated CUDA driver (libcuda.so) in host memory, so that the CUDA upload path -- cudarc's
// calls, contexts, streams, events, pinned memory, asynchronous copies -- runs in every CI run,
// GPU or not, under ASan and TSan too. It behaves like the real driver where our code depends
// on it, and aborts with a message where the real driver would punish a mistake silently (a
// corrupt upload, a crash much later) instead of returning an error.
//
// Entry points. cudarc (0.19, feature cuda-12040, `dynamic-loading`) resolves each symbol
// lazily, by exact name, with dlsym on libcuda.so (then libcuda.so.1, ...), on its first call,
// and never through cuGetProcAddress. These are the names its `driver::result` and `sys`
// functions resolve (the _v2 names where cuda.h maps the plain name to a newer ABI); those
// rust/cuda calls today are marked *, the others are those it may come to call:
//   cuInit*, cuDriverGetVersion, cuGetErrorName, cuGetErrorString, cuDeviceGetCount*,
//   cuDeviceGet*, cuDeviceGetName*, cuDeviceGetAttribute, cuDeviceTotalMem_v2,
//   cuDevicePrimaryCtxRetain*, cuDevicePrimaryCtxRelease_v2*, cuDevicePrimaryCtxReset_v2,
//   cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxSetFlags_v2, cuCtxCreate_v2, cuCtxDestroy_v2,
//   cuCtxGetCurrent, cuCtxSetCurrent*, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2, cuCtxGetDevice,
//   cuCtxSynchronize, cuMemAlloc_v2*, cuMemFree_v2*, cuMemGetInfo_v2, cuMemHostAlloc*,
//   cuMemAllocHost_v2, cuMemFreeHost*, cuMemHostRegister_v2*, cuMemHostUnregister*,
//   cuPointerGetAttribute, cuMemcpyHtoD_v2,
//   cuMemcpyDtoH_v2*, cuMemcpyDtoD_v2, cuMemcpyHtoDAsync_v2*, cuMemcpyDtoHAsync_v2*,
//   cuMemcpyDtoDAsync_v2, cuMemsetD8_v2, cuMemsetD8Async, cuMemcpy, cuMemcpyAsync,
//   cuLaunchHostFunc, cuStreamCreate*,
//   cuStreamCreateWithPriority, cuStreamDestroy_v2*, cuStreamSynchronize, cuStreamQuery,
//   cuStreamGetCtx, cuStreamGetFlags, cuStreamWaitEvent, cuStreamIsCapturing,
//   cuStreamBeginCapture_v2, cuStreamEndCapture, cuGraphDestroy, cuEventCreate*,
//   cuEventDestroy_v2*, cuEventRecord*, cuEventQuery, cuEventSynchronize*, cuEventElapsedTime;
// plus the unversioned cuDevicePrimaryCtxRelease/Reset and cuMemHostRegister (same ABI) and the fakecuda_*
// controls of emulated_cuda.h. A call cudarc resolves that is missing here makes cudarc panic ("Missing
// symbol"), which rust/cuda reports as a Cuda error naming the symbol: add it here.
//
// Model (what the real driver does and our code relies on):
// - Devices: SAFETENSORS_FAKE_CUDA_DEVICES=N (default 1). With 0, cuInit fails with
//   CUDA_ERROR_NO_DEVICE, as the real driver does on a machine without a GPU.
// - Contexts: one primary context per device, reference-counted by Retain/Release; releasing
//   the last reference resets it: its streams and events die and every allocation made in it
//   (device and pinned) is freed. Later use of any of them aborts with a message saying so (the
//   real driver would return an error at best, or read freed memory). The current context is
//   per thread (a stack, as cuCtxPush/Pop expect); calls that need one fail with
//   CUDA_ERROR_INVALID_CONTEXT without it, CUDA_ERROR_CONTEXT_IS_DESTROYED when it was reset.
// - Device memory: addresses are not host addresses (outside the canonical x86-64 range, so a
//   host dereference faults), never reused, aligned to 256 bytes (what cuMemAlloc guarantees)
//   and deliberately not to 512, with gaps between allocations. The bytes live in host memory
//   and are read and written only by copies. An address in no allocation is
//   CUDA_ERROR_INVALID_VALUE; a range overrunning its allocation, or in freed memory, aborts.
// - Pinned memory: mmap'ed; freeing it (or a context reset) leaves the range mapped PROT_NONE
//   so that a later host access faults at once instead of reading recycled memory.
// - Streams: each has a worker thread that runs its operations in order, late: every copy
//   waits SAFETENSORS_FAKE_CUDA_LATENCY_US (default 100) first, and reads its source only when
//   it runs. Handle 0 and CU_STREAM_LEGACY are the context's legacy default stream, which waits
//   for every blocking stream (created without CU_STREAM_NON_BLOCKING) and is waited for by
//   them; CU_STREAM_PER_THREAD is a blocking stream per thread and context. Synchronous copies
//   run on the legacy stream and wait. Asynchronous copies from pageable memory take the source
//   at once (the real driver stages it before returning); to pageable memory they wait.
//   cuStreamDestroy returns at once and the stream's queued work still runs, as documented.
//   SAFETENSORS_FAKE_CUDA_FREE_COPIES=1 (for benchmarks of the host side only) makes a
//   host-to-device copy from pinned memory move and check nothing: the device keeps its bytes.
// - The link: with SAFETENSORS_FAKE_CUDA_H2D_GBPS (or _D2H_GBPS, or fakecuda_set_link_gbps) each
//   device has a link per direction at that bandwidth, which the copies between host and device
//   of all its streams share, one at a time, as a PCIe link and its copy engine do: on the
//   driver's clock (steady_clock, nanoseconds from cuInit), a copy starts at max(when its
//   stream's worker reaches it, when the link is free) and ends latency + bytes / bandwidth
//   later; the worker moves the bytes, then sleeps until that end. So the clock, not the host's
//   speed, says how long the link is busy, and what a test reads from the counters
//   (fakecuda_link_stats: busy time, first start, last end, copies) is the schedule the
//   program fed it: idle gaps are the program's. Without a link, copies only wait their latency,
//   every stream at once (the default, as before).
// - Registered memory (cuMemHostRegister): a range of existing host memory (heap, a file's
//   mapping) that copies then treat as pinned (checksummed, counted as pending). Flags as the
//   driver's; READ_ONLY only where the device says it supports it (attribute 113, default yes,
//   SAFETENSORS_FAKE_CUDA_READ_ONLY_REGISTER=0 for no: CUDA_ERROR_NOT_SUPPORTED); memory that is
//   not writable (a PROT_READ mapping) without READ_ONLY, or a range with an unmapped hole, is
//   CUDA_ERROR_INVALID_VALUE, as the driver's pinning of it fails; a range overlapping one
//   registered or pinned already is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; unregistering an
//   address that is not the start of a registered range is CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.
//   A cost model: SAFETENSORS_FAKE_CUDA_REGISTER_GBPS (registration sleeps bytes / bandwidth),
//   and SAFETENSORS_FAKE_CUDA_REGISTER_LOCKS=1 holds the driver's lock meanwhile, so that every
//   other call waits (a real driver was seen to: vLLM #51414). A context reset unregisters its
//   ranges. Counters: bytes and ranges registered now, the peak, registrations, unregistrations.
// - Events record a position in a stream; query/synchronize look at that stream's progress.
//   cuStreamWaitEvent may join contexts (documented as allowed); cuEventRecord may not.
//
// Checks that abort (message on stderr, then abort()), where the real driver returns an error
// our code might ignore or, worse, succeeds and corrupts: a pinned buffer modified while a copy
// from it is pending (checksum at enqueue against checksum at completion); a pinned buffer
// freed with a copy from or into it pending; registered memory unregistered with a copy from or
// into it pending, or modified while a copy from it is pending; device memory freed with copies
// pending; an event
// recorded on a stream of another context (CUDA_ERROR_INVALID_HANDLE on a real device, and the
// event would then never mark the copy done); a copy between a stream and memory of different
// contexts or devices; memory, streams or events used after their context was reset, after
// being freed or destroyed; a copy overrunning an allocation; work enqueued on a stream in
// graph capture (the real driver would record it into a graph instead of running it); a copy
// touching device bytes that a pending copy on another stream writes (or reads, when this one
// writes) with no wait ordering the two on this stream (cuStreamWaitEvent, or the legacy default
// stream's implicit waits): the real driver runs them concurrently, so the bytes depend on timing.
//
// Injected failures: SAFETENSORS_FAKE_CUDA_FAIL=<function>:<N>[:<code>][,...] makes the N-th
// call of that entry point (counted from cuInit; the name with or without its _v2) fail with
// <code>, or a plausible CUresult for that call: out of memory for allocations and creations,
// invalid value for copies, launch failed for waits, invalid handle for records, out of memory
// for registrations, unknown else.
// Tests may replace the spec at run time with fakecuda_set_failures().
//
// Concurrency: one mutex guards every table; workers copy outside it. Objects are never freed
// (handles stay unique and checkable), and the driver state is leaked at exit on purpose, as
// worker threads may still be blocked on it.
#include "emulated_cuda.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

using Clock = std::chrono::steady_clock;
using Lock = std::unique_lock<std::mutex>;

namespace {

[[noreturn]] __attribute__((format(printf, 2, 3))) void die(const char* fn, const char* fmt, ...) {
  std::fprintf(stderr, "\n*** emulated libcuda: %s: ", fn);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fprintf(stderr,
               "\n*** A real driver would fail, corrupt data or crash here; this emulation aborts "
               "(tests/cuda/emulated_driver.cpp).\n");
  std::fflush(stderr);
  std::abort();
}

enum class Life { live, destroyed, reset };

const char* life_text(Life l) {
  return l == Life::destroyed ? "after being destroyed"
                              : "after its context was reset (last primary-context "
                                "reference released, or cuCtxDestroy)";
}

std::uint64_t checksum(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

struct Op {
  enum Kind { copy, wait, marker, host_fn } kind = copy;
  const char* fn = "";
  std::uint64_t seq = 0;
  Clock::time_point at{};  // when it was enqueued
  // copy: `dst` and `src` are host addresses (device storage, pinned or pageable memory);
  // `fill` >= 0 makes it a memset.
  std::uint8_t* dst = nullptr;
  const std::uint8_t* src = nullptr;
  std::size_t n = 0;
  int fill = -1;
  std::unique_ptr<std::uint8_t[]> staged;  // a pageable source, taken at enqueue
  bool free = false;                       // SAFETENSORS_FAKE_CUDA_FREE_COPIES: nothing moved
  bool check = false;                      // a pinned source: compare checksums at completion
  std::uint64_t sum = 0;
  // Keys of the allocations whose pending counts this copy holds (0: none).
  CUdeviceptr dst_dev = 0, src_dev = 0;
  std::uintptr_t src_pin = 0, dst_pin = 0;
  // Keys of the registered ranges whose pending counts this copy holds (0: none).
  std::uintptr_t src_reg = 0, dst_reg = 0;
  // The link it crosses: its device and direction (FAKECUDA_H2D, FAKECUDA_D2H), or -1.
  int link_device = 0;
  int link_dir = -1;
  // wait: until `other` has completed `other_seq`; marker: stamps `event`.
  CUstream other = nullptr;
  std::uint64_t other_seq = 0;
  CUevent event = nullptr;
  // host_fn: called on the stream's thread, in order.
  CUhostFn host = nullptr;
  void* user = nullptr;
};

}  // namespace

struct CUctx_st {
  int device = 0;
  bool primary = false;
  int refs = 0;            // primary: references; active while > 0
  Life life = Life::live;  // non-primary
  unsigned flags = 0;
  int resets = 0;
  std::uint64_t gen = 1;  // bumped by every reset: what was made before it dies
  CUstream legacy = nullptr;
  bool alive() const { return primary ? refs > 0 : life == Life::live; }
};

struct CUstream_st {
  CUcontext ctx = nullptr;
  std::uint64_t gen = 0;
  unsigned flags = 0;
  bool blocking = true;
  bool legacy = false;
  Life life = Life::live;
  bool capturing = false;
  bool stopping = false;
  std::deque<Op> queue;  // front: running or next
  std::uint64_t enqueued = 0, completed = 0;
  // When the stream's last operation completed (a copy on a link: when the link finished it).
  Clock::time_point idle_since{};
  std::condition_variable work;
  std::thread worker;
};

struct CUevent_st {
  CUcontext ctx = nullptr;
  std::uint64_t gen = 0;
  unsigned flags = 0;
  Life life = Life::live;
  CUstream stream = nullptr;
  std::uint64_t seq = 0;
  bool recorded = false;
  Clock::time_point when{};
};

namespace {

struct DevAlloc {
  std::size_t size = 0;
  CUcontext ctx = nullptr;
  std::uint64_t gen = 0;
  std::unique_ptr<std::uint8_t[]> bytes;
  int pending = 0;  // copies from or into it, enqueued and not complete
};

struct PinAlloc {
  std::size_t size = 0, mapped = 0;
  CUcontext ctx = nullptr;
  std::uint64_t gen = 0;
  int pending = 0;
};

struct RegAlloc {
  std::size_t size = 0;
  CUcontext ctx = nullptr;
  std::uint64_t gen = 0;
  unsigned flags = 0;
  int pending = 0;
};

struct Dead {
  std::size_t size = 0;
  std::string why;
};

/// A device's link in one direction (see the header comment): its bandwidth and when it is free
/// next, on the driver's clock, and what it carried since the last reset.
struct Link {
  Clock::time_point free_at{};
  std::uint64_t busy_ns = 0, first_start_ns = 0, last_end_ns = 0, copies = 0;
};

struct Failure {
  std::string fn;
  unsigned long long nth = 0;
  int code = 0;
};

/// What the driver keeps per thread: the context stack (back(): the current context) and the
/// per-thread default streams.
struct ThreadState {
  std::vector<CUcontext> stack;
  std::unordered_map<CUcontext, CUstream> per_thread;
};

constexpr std::uint64_t kDeviceSpan = std::uint64_t{1} << 40;
constexpr std::uint64_t kDeviceBase = 0x00D0000000000000ull;  // non-canonical: not a host address
constexpr std::size_t kTotalMemory = std::size_t{80} << 30;

struct Driver {
  std::mutex mu;
  std::condition_variable progress;  // some stream completed an operation
  bool parsed = false;
  bool initialized = false;
  int devices = 1;
  unsigned latency_us = 100;
  bool free_copies = false;  // SAFETENSORS_FAKE_CUDA_FREE_COPIES=1: host-to-device copies from
                             // pinned memory move nothing and check nothing (benchmarks only)
  bool held = false;
  Clock::time_point epoch = Clock::now();     // the driver's clock starts here
  std::array<double, 2> link_gbps{0.0, 0.0};  // by direction; 0: no link
  std::vector<std::array<Link, 2>> links;     // by device, then direction
  double register_gbps = 0.0;                 // 0: registration costs nothing
  bool register_locks = false;                // registration holds the driver's lock
  bool read_only_register = true;             // attribute 113
  std::map<std::uintptr_t, RegAlloc> reg;
  std::size_t live_registered_bytes = 0, peak_registered_bytes = 0;
  unsigned long long registrations = 0, unregistrations = 0;
  std::vector<std::unique_ptr<CUctx_st>> primaries;
  std::vector<std::unique_ptr<CUctx_st>> created;
  std::unordered_set<const CUctx_st*> contexts;
  std::unordered_map<const CUstream_st*, std::unique_ptr<CUstream_st>> streams;
  std::unordered_map<const CUevent_st*, std::unique_ptr<CUevent_st>> events;
  std::map<CUdeviceptr, DevAlloc> dev;
  std::map<CUdeviceptr, Dead> dev_dead;
  std::map<std::uintptr_t, PinAlloc> pin;
  std::map<std::uintptr_t, Dead> pin_dead;
  std::vector<CUdeviceptr> next_address;
  std::vector<Failure> failures;
  std::unordered_map<std::string, unsigned long long> calls;        // since the last failure spec
  std::unordered_map<std::string, unsigned long long> total_calls;  // since start
  unsigned long long pageable_async = 0;
  unsigned long long copies_done = 0;
  std::size_t live_device_bytes = 0, peak_device_bytes = 0;
  std::size_t live_pinned_bytes = 0, peak_pinned_bytes = 0;
  std::vector<std::unique_ptr<ThreadState>> threads;  // never freed: see me()
};

Driver& drv() {
  static Driver* d = new Driver;  // leaked: workers may outlive static destruction
  return *d;
}

// The calling thread's state, through one pointer in static TLS (initial-exec): a dlopen'ed
// library's dynamic TLS is malloc'ed by glibc and freed when a thread's stack is recycled, which
// ThreadSanitizer cannot order and reports as a race. The state itself is on the heap, owned by
// the driver (a few hundred bytes per thread that ever called it).
__attribute__((tls_model("initial-exec"))) thread_local ThreadState* tls_state = nullptr;

/// The calling thread's state (lock held).
ThreadState& me() {
  if (!tls_state) {
    auto owned = std::make_unique<ThreadState>();
    tls_state = owned.get();
    drv().threads.push_back(std::move(owned));
  }
  return *tls_state;
}

std::string base_name(const std::string& fn) {
  return fn.size() > 3 && fn.compare(fn.size() - 3, 3, "_v2") == 0 ? fn.substr(0, fn.size() - 3) : fn;
}

int default_failure(const std::string& fn) {
  if (fn == "cuMemHostUnregister") return CUDA_ERROR_UNKNOWN;
  if (fn == "cuMemHostRegister") return CUDA_ERROR_OUT_OF_MEMORY;
  if (fn.find("Alloc") != std::string::npos || fn.find("Create") != std::string::npos ||
      fn.find("Retain") != std::string::npos)
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (fn.find("Memcpy") != std::string::npos || fn.find("Memset") != std::string::npos)
    return CUDA_ERROR_INVALID_VALUE;
  if (fn.find("Synchronize") != std::string::npos || fn.find("Query") != std::string::npos)
    return CUDA_ERROR_LAUNCH_FAILED;
  if (fn.find("Record") != std::string::npos || fn.find("WaitEvent") != std::string::npos)
    return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_ERROR_UNKNOWN;
}

bool parse_failures(const char* spec, std::vector<Failure>& out) {
  out.clear();
  if (!spec) return true;
  std::string s(spec);
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    std::size_t c1 = item.find(':');
    if (c1 == std::string::npos || c1 == 0) return false;
    Failure f;
    f.fn = base_name(item.substr(0, c1));
    char* rest = nullptr;
    f.nth = std::strtoull(item.c_str() + c1 + 1, &rest, 10);
    if (f.nth == 0 || rest == item.c_str() + c1 + 1) return false;
    if (*rest == ':') {
      char* tail = nullptr;
      f.code = static_cast<int>(std::strtol(rest + 1, &tail, 10));
      if (tail == rest + 1 || *tail != '\0') return false;
    } else if (*rest != '\0') {
      return false;
    } else {
      f.code = default_failure(f.fn);
    }
    out.push_back(std::move(f));
  }
  return true;
}

/// Counts a call of `fn` and returns the failure injected for it, if any (lock held).
CUresult injected(const char* fn) {
  Driver& d = drv();
  std::string name = base_name(fn);
  ++d.total_calls[name];
  if (d.failures.empty()) return CUDA_SUCCESS;
  unsigned long long n = ++d.calls[name];
  for (const auto& f : d.failures) {
    if (f.fn == name && f.nth == n) {
      std::fprintf(stderr, "emulated libcuda: injected failure: call %llu of %s returns %d\n", n, fn, f.code);
      return f.code;
    }
  }
  return CUDA_SUCCESS;
}

/// Takes the lock and checks initialisation and injected failures: every entry point's start.
CUresult enter(Lock& lk, const char* fn) {
  lk = Lock(drv().mu);
  if (!drv().initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return injected(fn);
}

CUresult current(CUcontext* out) {
  if (me().stack.empty() || !me().stack.back()) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = me().stack.back();
  if (!c->alive()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

// ---- streams ----------------------------------------------------------------------------------

std::uint64_t clock_ns(Clock::time_point t) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t - drv().epoch).count());
}

/// Books copy `op` of stream `s` on its link (lock held): it starts once it was enqueued, its
/// stream's earlier work is done and the link is free, and ends latency + bytes / bandwidth
/// later; returns that end. All three moments are the driver's clock's, never when this thread
/// happened to wake: a busy host delays the bytes, not the schedule.
Clock::time_point schedule_on_link(CUstream s, const Op& op) {
  Driver& d = drv();
  Link& link = d.links.at(static_cast<std::size_t>(op.link_device))[static_cast<std::size_t>(op.link_dir)];
  const double gbps = d.link_gbps[static_cast<std::size_t>(op.link_dir)];
  const Clock::time_point start = std::max({op.at, s->idle_since, link.free_at});
  const auto took = std::chrono::nanoseconds(static_cast<std::int64_t>(d.latency_us) * 1000 +
                                             static_cast<std::int64_t>(static_cast<double>(op.n) / gbps));
  const Clock::time_point end = start + took;
  link.free_at = end;
  if (link.copies == 0) link.first_start_ns = clock_ns(start);
  link.last_end_ns = clock_ns(end);
  link.busy_ns += static_cast<std::uint64_t>(took.count());
  link.copies++;
  return end;
}

void worker_main(CUstream s) {
  Driver& d = drv();
  Lock lk(d.mu);
  for (;;) {
    while (!(s->stopping && s->queue.empty()) && (s->queue.empty() || d.held)) s->work.wait(lk);
    if (s->queue.empty()) return;  // stopping, drained
    Op& op = s->queue.front();
    if (op.kind == Op::wait) {
      CUstream other = op.other;
      while (other->completed < op.other_seq) d.progress.wait(lk);
      s->idle_since = std::max(s->idle_since, other->idle_since);
    } else if (op.kind == Op::marker) {
      // The moment the stream reached it, as a GPU stamps it: once enqueued and once what came
      // before it had completed, however late this thread wakes.
      CUevent e = op.event;
      if (e->stream == s && e->seq == op.seq) e->when = std::max(op.at, s->idle_since);
    } else if (op.kind == Op::host_fn) {
      lk.unlock();
      op.host(op.user);
      lk.lock();
      s->idle_since = Clock::now();
    } else {
      unsigned latency = d.latency_us;
      Clock::time_point end{};
      const bool on_link = op.link_dir >= 0 && d.link_gbps[static_cast<std::size_t>(op.link_dir)] > 0;
      if (on_link) end = schedule_on_link(s, op);
      lk.unlock();
      if (!on_link && latency) std::this_thread::sleep_for(std::chrono::microseconds(latency));
      const std::uint8_t* src = op.staged ? op.staged.get() : op.src;
      if (op.free) {
        // Benchmarks of the host side: the copy takes no time and moves nothing.
      } else if (op.fill >= 0) {
        std::memset(op.dst, op.fill, op.n);
      } else {
        std::memmove(op.dst, src, op.n);
        if (op.check && checksum(src, op.n) != op.sum) {
          die(op.fn,
              "the %s buffer at %p (%zu bytes copied from it) was modified while the copy was "
              "pending: a pinned source may be reused only after the copy completes (event or stream "
              "synchronization)",
              op.src_reg ? "registered" : "pinned", static_cast<const void*>(src), op.n);
        }
      }
      if (on_link) std::this_thread::sleep_until(end);
      lk.lock();
      s->idle_since = on_link ? end : Clock::now();
      if (op.src_reg) d.reg.at(op.src_reg).pending--;
      if (op.dst_reg) d.reg.at(op.dst_reg).pending--;
      if (op.dst_dev) d.dev.at(op.dst_dev).pending--;
      if (op.src_dev && op.src_dev != op.dst_dev) d.dev.at(op.src_dev).pending--;
      if (op.src_pin) d.pin.at(op.src_pin).pending--;
      if (op.dst_pin) d.pin.at(op.dst_pin).pending--;
      d.copies_done++;
    }
    s->queue.pop_front();
    s->completed++;
    d.progress.notify_all();
  }
}

CUstream new_stream(CUcontext c, unsigned flags, bool legacy) {
  Driver& d = drv();
  auto owned = std::make_unique<CUstream_st>();
  CUstream s = owned.get();
  s->ctx = c;
  s->gen = c->gen;
  s->flags = flags;
  s->blocking = (flags & CU_STREAM_NON_BLOCKING) == 0;
  s->legacy = legacy;
  s->worker = std::thread(worker_main, s);
  d.streams.emplace(s, std::move(owned));
  return s;
}

CUstream legacy_stream(CUcontext c) {
  if (!c->legacy) c->legacy = new_stream(c, 0, true);
  return c->legacy;
}

/// Resolves a stream handle (lock held): 0 and CU_STREAM_LEGACY name the current context's
/// legacy stream, CU_STREAM_PER_THREAD this thread's; a dead handle aborts.
CUresult resolve_stream(const char* fn, CUstream h, CUstream* out) {
  if (h == nullptr || h == FAKECUDA_STREAM_LEGACY || h == FAKECUDA_STREAM_PER_THREAD) {
    CUcontext c = nullptr;
    if (CUresult r = current(&c)) return r;
    if (h == FAKECUDA_STREAM_PER_THREAD) {
      CUstream& s = me().per_thread[c];
      if (!s || s->life != Life::live) s = new_stream(c, 0, false);
      *out = s;
    } else {
      *out = legacy_stream(c);
    }
    return CUDA_SUCCESS;
  }
  auto it = drv().streams.find(h);
  if (it == drv().streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (h->life != Life::live) die(fn, "stream %p used %s", static_cast<void*>(h), life_text(h->life));
  if (!h->ctx->alive()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;  // its context is being reset
  *out = h;
  return CUDA_SUCCESS;
}

CUresult resolve_event(const char* fn, CUevent h, CUevent* out) {
  auto it = drv().events.find(h);
  if (it == drv().events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (h->life != Life::live) die(fn, "event %p used %s", static_cast<void*>(h), life_text(h->life));
  *out = h;
  return CUDA_SUCCESS;
}

void push(CUstream s, Op op) {
  op.seq = ++s->enqueued;
  op.at = Clock::now();
  s->queue.push_back(std::move(op));
  s->work.notify_one();
}

void push_wait(CUstream s, CUstream other) {
  if (other == s || other->completed >= other->enqueued) return;
  Op w;
  w.kind = Op::wait;
  w.other = other;
  w.other_seq = other->enqueued;
  push(s, std::move(w));
}

/// Whether `s` has a wait queued for `other` to complete `seq` (so what is enqueued on `s` now
/// runs after it). Direct waits only: orderings through a third stream are not followed.
bool waits_for(CUstream s, CUstream other, std::uint64_t seq) {
  for (const Op& w : s->queue) {
    if (w.kind == Op::wait && w.other == other && w.other_seq >= seq) return true;
  }
  return false;
}

bool overlap(const std::uint8_t* a, std::size_t an, const std::uint8_t* b, std::size_t bn) {
  return a && b && an && bn && a < b + bn && b < a + an;
}

/// Aborts when copy `op` on `s` touches device bytes that a pending copy on another stream
/// writes, or reads while `op` writes them, and nothing orders the two (lock held).
void check_hazards(const char* fn, CUstream s, const Op& op) {
  const std::uint8_t* writes = op.dst_dev ? op.dst : nullptr;
  const std::uint8_t* reads = op.src_dev ? op.src : nullptr;
  if (op.kind != Op::copy || (!writes && !reads)) return;
  for (auto& [key, t] : drv().streams) {
    if (t.get() == s) continue;
    for (const Op& p : t->queue) {
      if (p.kind != Op::copy) continue;
      const std::uint8_t* p_writes = p.dst_dev ? p.dst : nullptr;
      const std::uint8_t* p_reads = p.src_dev ? p.src : nullptr;
      bool p_write_clash = overlap(p_writes, p.n, writes, op.n) || overlap(p_writes, p.n, reads, op.n);
      bool clash = p_write_clash || overlap(p_reads, p.n, writes, op.n);
      if (clash && !waits_for(s, t.get(), p.seq)) {
        die(fn,
            "a copy of %zu bytes on stream %p touches device memory that a pending %s on stream %p "
            "(%zu bytes) %s, and nothing orders the two (record an event after one and "
            "cuStreamWaitEvent on it before the other, or synchronize): the real driver runs them "
            "concurrently",
            op.n, static_cast<void*>(s), p.fn, static_cast<void*>(t.get()), p.n,
            p_write_clash ? "writes" : "reads");
      }
    }
  }
}

/// Enqueues `op` with the legacy default stream's implicit ordering; returns its position.
std::uint64_t enqueue(const char* fn, CUstream s, Op op) {
  if (s->capturing) {
    die(fn,
        "work enqueued on stream %p while it is capturing a graph: the real driver would record it "
        "into the graph instead of running it",
        static_cast<void*>(s));
  }
  if (s->legacy) {
    for (auto& [key, other] : drv().streams) {
      // Destroyed streams too: their queued work still runs (push_wait skips drained ones).
      if (other->ctx == s->ctx && other->blocking && !other->legacy) push_wait(s, other.get());
    }
  } else if (s->blocking && s->ctx->legacy) {
    push_wait(s, s->ctx->legacy);
  }
  op.fn = fn;
  check_hazards(fn, s, op);
  push(s, std::move(op));
  return s->enqueued;
}

void wait_for(Lock& lk, CUstream s, std::uint64_t seq) {
  while (s->completed < seq) drv().progress.wait(lk);
}

/// Waits for everything enqueued on `s`, then stops its worker (lock released while joining).
void stop_stream(Lock& lk, CUstream s, Life why) {
  while (!s->queue.empty()) drv().progress.wait(lk);
  s->life = why;
  s->stopping = true;
  s->work.notify_all();
  std::thread t = std::move(s->worker);
  lk.unlock();
  if (t.joinable()) t.join();
  lk.lock();
}

// ---- memory -------------------------------------------------------------------------------------

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// The entry of `allocations` (address-ordered, each with a `size`) whose bytes hold address
/// `p`, or `allocations.end()`: the one lookup device and pinned memory, live or freed, share.
template <class Map>
auto holding(Map& allocations, std::uint64_t p) {
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return allocations.end();
  --it;
  return p < it->first + it->second.size ? it : allocations.end();
}

/// The live device allocation holding [p, p + n), or null when p is in none; aborts for
/// freed memory and for a range overrunning its allocation.
DevAlloc* device_range(const char* fn, CUdeviceptr p, std::size_t n, CUdeviceptr* base) {
  Driver& d = drv();
  if (auto it = holding(d.dev, p); it != d.dev.end()) {
    if (n > it->first + it->second.size - p) {
      die(fn, "%zu bytes at %s overrun the device allocation %s of %zu bytes", n, hex(p).c_str(),
          hex(it->first).c_str(), it->second.size);
    }
    *base = it->first;
    return &it->second;
  }
  if (auto dead = holding(d.dev_dead, p); dead != d.dev_dead.end()) {
    die(fn, "device address %s lies in memory that was freed (allocation %s of %zu bytes): %s",
        hex(p).c_str(), hex(dead->first).c_str(), dead->second.size, dead->second.why.c_str());
  }
  return nullptr;
}

/// The live pinned allocation holding [p, p + n), or null for pageable memory; aborts for
/// freed pinned memory and for a range overrunning its allocation.
PinAlloc* pinned_range(const char* fn, const void* ptr, std::size_t n, std::uintptr_t* base) {
  Driver& d = drv();
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (auto it = holding(d.pin, p); it != d.pin.end()) {
    if (n > it->first + it->second.size - p) {
      die(fn, "%zu bytes at %p overrun the pinned allocation %s of %zu bytes", n, ptr, hex(it->first).c_str(),
          it->second.size);
    }
    *base = it->first;
    return &it->second;
  }
  if (auto dead = holding(d.pin_dead, p); dead != d.pin_dead.end()) {
    die(fn, "host address %p lies in pinned memory that was freed: %s", ptr, dead->second.why.c_str());
  }
  return nullptr;
}

/// The registered range holding [p, p + n), or null when p is in none; aborts for a range
/// overrunning its registration (a copy the real driver would stage through pageable memory
/// for its end, or refuse).
RegAlloc* registered_range(const char* fn, const void* ptr, std::size_t n, std::uintptr_t* base) {
  Driver& d = drv();
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = holding(d.reg, p);
  if (it == d.reg.end()) return nullptr;
  if (n > it->first + it->second.size - p) {
    die(fn, "%zu bytes at %p overrun the registered range %s of %zu bytes", n, ptr, hex(it->first).c_str(),
        it->second.size);
  }
  *base = it->first;
  return &it->second;
}

void same_context(const char* fn, CUstream s, const DevAlloc& a, CUdeviceptr base) {
  if (a.ctx != s->ctx) {
    die(fn,
        "the copy uses device memory %s of device %d (context %p) on a stream of device %d (context %p): "
        "streams and memory must belong to the same context",
        hex(base).c_str(), a.ctx->device, static_cast<void*>(a.ctx), s->ctx->device,
        static_cast<void*>(s->ctx));
  }
}

void kill_pinned(std::uintptr_t base, PinAlloc& a, std::string why) {
  void* p = reinterpret_cast<void*>(base);
  drv().live_pinned_bytes -= a.size;
  // Kept reserved and inaccessible: a later host access faults instead of reading new data.
  ::madvise(p, a.mapped, MADV_DONTNEED);
  ::mprotect(p, a.mapped, PROT_NONE);
  drv().pin_dead[base] = Dead{a.size, std::move(why)};
}

/// Destroys everything made in `c` before now (lock held; released while joining workers).
void reset_context(Lock& lk, CUcontext c, const char* why) {
  Driver& d = drv();
  std::uint64_t old = c->gen++;
  c->resets++;
  if (c->legacy && c->legacy->gen == old) c->legacy = nullptr;
  std::vector<CUstream> doomed;
  std::vector<CUstream> draining;  // destroyed, with queued work that still runs
  for (auto& [key, s] : d.streams) {
    if (s->ctx == c && s->gen == old && s->life == Life::live) doomed.push_back(s.get());
    if (s->ctx == c && s->life == Life::destroyed && !s->queue.empty()) draining.push_back(s.get());
  }
  // Pending work completes first (the real driver synchronizes before tearing down).
  for (;;) {
    bool busy = false;
    for (CUstream s : doomed) busy = busy || !s->queue.empty();
    for (CUstream s : draining) busy = busy || !s->queue.empty();
    if (!busy) break;
    d.progress.wait(lk);
  }
  for (auto& [key, e] : d.events) {
    if (e->ctx == c && e->gen == old && e->life == Life::live) e->life = Life::reset;
  }
  for (auto it = d.dev.begin(); it != d.dev.end();) {
    if (it->second.ctx == c && it->second.gen == old) {
      d.dev_dead[it->first] = Dead{it->second.size, why};
      d.live_device_bytes -= it->second.size;
      it = d.dev.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = d.pin.begin(); it != d.pin.end();) {
    if (it->second.ctx == c && it->second.gen == old) {
      kill_pinned(it->first, it->second, why);
      it = d.pin.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = d.reg.begin(); it != d.reg.end();) {
    if (it->second.ctx == c && it->second.gen == old) {
      d.live_registered_bytes -= it->second.size;
      it = d.reg.erase(it);
    } else {
      ++it;
    }
  }
  for (CUstream s : doomed) s->life = Life::reset;
  for (CUstream s : doomed) stop_stream(lk, s, Life::reset);
}

/// Builds a copy between any two of device memory, pinned and pageable host memory, checking
/// contexts and ranges. `dst_host`/`src_host` are used when the device side is 0.
CUresult make_copy(const char* fn, CUstream s, bool async, CUdeviceptr dst_dev, void* dst_host,
                   CUdeviceptr src_dev, const void* src_host, std::size_t n, Op& op) {
  Driver& d = drv();
  if (dst_dev) {
    CUdeviceptr base = 0;
    DevAlloc* a = device_range(fn, dst_dev, n, &base);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    same_context(fn, s, *a, base);
    op.dst = a->bytes.get() + (dst_dev - base);
    op.dst_dev = base;
  } else {
    std::uintptr_t base = 0;
    if (pinned_range(fn, dst_host, n, &base)) {
      op.dst_pin = base;
    } else if (RegAlloc* r = registered_range(fn, dst_host, n, &base)) {
      if (r->flags & CU_MEMHOSTREGISTER_READ_ONLY)
        return CUDA_ERROR_INVALID_VALUE;  // the device may only read it
      op.dst_reg = base;
    }
    op.dst = static_cast<std::uint8_t*>(dst_host);
  }
  if (src_dev) {
    CUdeviceptr base = 0;
    DevAlloc* a = device_range(fn, src_dev, n, &base);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    same_context(fn, s, *a, base);
    op.src = a->bytes.get() + (src_dev - base);
    op.src_dev = base;
  } else if (src_host) {
    std::uintptr_t base = 0;
    op.src = static_cast<const std::uint8_t*>(src_host);
    const bool pinned = pinned_range(fn, src_host, n, &base) != nullptr;
    if (pinned) op.src_pin = base;
    if (!pinned && registered_range(fn, src_host, n, &base)) op.src_reg = base;
    if (op.src_pin || op.src_reg) {
      op.free = d.free_copies && op.dst_dev != 0;
      op.check = !op.free;
      if (op.check) op.sum = checksum(op.src, n);
    } else {
      // Legal, but the real driver then copies synchronously through its own staging buffer:
      // counted, so that tests can check an upload never does this.
      if (async && dst_dev) d.pageable_async++;
      op.staged.reset(new std::uint8_t[n]);
      std::memcpy(op.staged.get(), src_host, n);
    }
  }
  op.n = n;
  if (op.dst_dev && !src_dev) {
    op.link_device = s->ctx->device;
    op.link_dir = FAKECUDA_H2D;
  } else if (src_dev && !op.dst_dev) {
    op.link_device = s->ctx->device;
    op.link_dir = FAKECUDA_D2H;
  }
  if (op.src_reg) d.reg.at(op.src_reg).pending++;
  if (op.dst_reg) d.reg.at(op.dst_reg).pending++;
  if (op.dst_dev) d.dev.at(op.dst_dev).pending++;
  if (op.src_dev && op.src_dev != op.dst_dev) d.dev.at(op.src_dev).pending++;
  if (op.src_pin) d.pin.at(op.src_pin).pending++;
  if (op.dst_pin) d.pin.at(op.dst_pin).pending++;
  return CUDA_SUCCESS;
}

/// A copy on `stream` (synchronous ones: the legacy stream, then wait).
CUresult copy(const char* fn, CUstream stream, bool sync, CUdeviceptr dst_dev, void* dst_host,
              CUdeviceptr src_dev, const void* src_host, std::size_t n, int fill) {
  Lock lk;
  if (CUresult r = enter(lk, fn)) return r;
  if ((!dst_dev && !dst_host) || (fill < 0 && !src_dev && !src_host)) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream(fn, sync ? nullptr : stream, &s)) return r;
  if (n == 0) return CUDA_SUCCESS;
  Op op;
  op.fill = fill;
  if (CUresult r = make_copy(fn, s, !sync, dst_dev, dst_host, src_dev, src_host, n, op)) return r;
  // The real driver returns from a copy into pageable memory only once it is complete.
  bool wait = sync || (dst_host && !op.dst_pin && !op.dst_reg);
  std::uint64_t seq = enqueue(fn, s, std::move(op));
  if (wait) wait_for(lk, s, seq);
  return CUDA_SUCCESS;
}

}  // namespace

// ==== initialisation, devices, errors ==========================================================

CUresult cuInit(unsigned int flags) {
  Driver& d = drv();
  Lock lk(d.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!d.parsed) {
    d.parsed = true;
    if (const char* n = std::getenv("SAFETENSORS_FAKE_CUDA_DEVICES")) d.devices = std::atoi(n);
    if (d.devices < 0 || d.devices > 64) d.devices = 0;
    if (const char* l = std::getenv("SAFETENSORS_FAKE_CUDA_LATENCY_US"))
      d.latency_us = static_cast<unsigned>(std::strtoul(l, nullptr, 10));
    if (const char* f = std::getenv("SAFETENSORS_FAKE_CUDA_FREE_COPIES"))
      d.free_copies = std::strcmp(f, "1") == 0;
    if (const char* g = std::getenv("SAFETENSORS_FAKE_CUDA_H2D_GBPS"))
      d.link_gbps[FAKECUDA_H2D] = std::atof(g);
    if (const char* g = std::getenv("SAFETENSORS_FAKE_CUDA_D2H_GBPS"))
      d.link_gbps[FAKECUDA_D2H] = std::atof(g);
    if (const char* g = std::getenv("SAFETENSORS_FAKE_CUDA_REGISTER_GBPS")) d.register_gbps = std::atof(g);
    if (const char* l = std::getenv("SAFETENSORS_FAKE_CUDA_REGISTER_LOCKS"))
      d.register_locks = std::strcmp(l, "1") == 0;
    if (const char* r = std::getenv("SAFETENSORS_FAKE_CUDA_READ_ONLY_REGISTER"))
      d.read_only_register = std::strcmp(r, "0") != 0;
    for (double& g : d.link_gbps) g = g > 0 ? g : 0.0;
    if (!parse_failures(std::getenv("SAFETENSORS_FAKE_CUDA_FAIL"), d.failures)) {
      std::fprintf(stderr, "emulated libcuda: malformed SAFETENSORS_FAKE_CUDA_FAIL (want fn:N[:code],...)\n");
      std::abort();
    }
    for (int i = 0; i < d.devices; ++i) {
      auto c = std::make_unique<CUctx_st>();
      c->device = i;
      c->primary = true;
      d.contexts.insert(c.get());
      d.primaries.push_back(std::move(c));
      d.next_address.push_back(kDeviceBase + kDeviceSpan * static_cast<std::uint64_t>(i) + 256);
    }
    d.links.resize(static_cast<std::size_t>(d.devices));
  }
  if (d.devices == 0) return CUDA_ERROR_NO_DEVICE;
  if (CUresult r = injected("cuInit")) return r;
  d.initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 12040;
  return CUDA_SUCCESS;
}

namespace {
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
const ErrorText* error_text(CUresult e) {
  for (const auto& t : kErrors) {
    if (t.code == e) return &t;
  }
  return nullptr;
}
}  // namespace

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* t = error_text(error);
  *name = t ? t->name : nullptr;
  return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* t = error_text(error);
  *text = t ? t->text : nullptr;
  return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = 0;
  Lock lk;
  if (CUresult r = enter(lk, "cuDeviceGetCount")) return r;
  *count = drv().devices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDeviceGet")) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= drv().devices) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

namespace {
bool valid_device(CUdevice d) {
  return d >= 0 && d < drv().devices;
}
}  // namespace

CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDeviceGetName")) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "Emulated CUDA device %d (safetensors tests)", device);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDeviceGetAttribute")) return r;
  if (!value || attribute <= 0 || attribute > 150) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case 1:
      *value = 1024;
      break;  // max threads per block
    case 16:
      *value = 132;
      break;  // multiprocessors
    case 19:
      *value = 1;
      break;  // can map host memory
    case 33:
      *value = 0x10 + device;
      break;  // PCI bus id
    case 40:
      *value = 2;
      break;  // async copy engines
    case 50:
      *value = 0xfffe;
      break;  // PCI domain: one no host has, so sysfs knows no such device (no NUMA placement)
    case 41:
      *value = 1;
      break;  // unified addressing
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
      *value = 0;
      break;  // a discrete GPU (not GH200 or GB200)
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
      *value = drv().read_only_register ? 1 : 0;
      break;
    case 75:
      *value = 9;
      break;  // compute capability major
    case 76:
      *value = 0;
      break;  // minor
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDeviceTotalMem_v2")) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kTotalMemory;
  return CUDA_SUCCESS;
}

// ==== contexts =================================================================================

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDevicePrimaryCtxRetain")) return r;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext c = drv().primaries[static_cast<std::size_t>(device)].get();
  c->refs++;
  *ctx = c;
  return CUDA_SUCCESS;
}

namespace {
CUresult primary_release(const char* fn, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, fn)) return r;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext c = drv().primaries[static_cast<std::size_t>(device)].get();
  if (c->refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c->refs == 0) {
    std::string why = "the primary context of device " + std::to_string(device) +
                      " was reset when its last reference was released (cuDevicePrimaryCtxRelease)";
    reset_context(lk, c, why.c_str());
  }
  return CUDA_SUCCESS;
}

CUresult primary_reset(const char* fn, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, fn)) return r;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext c = drv().primaries[static_cast<std::size_t>(device)].get();
  c->refs = 0;
  std::string why =
      "the primary context of device " + std::to_string(device) + " was reset (cuDevicePrimaryCtxReset)";
  reset_context(lk, c, why.c_str());
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return primary_release("cuDevicePrimaryCtxRelease", device);
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  return primary_release("cuDevicePrimaryCtxRelease_v2", device);
}
CUresult cuDevicePrimaryCtxReset(CUdevice device) {
  return primary_reset("cuDevicePrimaryCtxReset", device);
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  return primary_reset("cuDevicePrimaryCtxReset_v2", device);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDevicePrimaryCtxGetState")) return r;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext c = drv().primaries[static_cast<std::size_t>(device)].get();
  *flags = c->flags;
  *active = c->refs > 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags) {
  Lock lk;
  if (CUresult r = enter(lk, "cuDevicePrimaryCtxSetFlags_v2")) return r;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  drv().primaries[static_cast<std::size_t>(device)]->flags = flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice device) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxCreate_v2")) return r;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  auto c = std::make_unique<CUctx_st>();
  c->device = device;
  c->flags = flags;
  *ctx = c.get();
  drv().contexts.insert(c.get());
  drv().created.push_back(std::move(c));
  me().stack.push_back(*ctx);  // the new context becomes current, as the real driver does
  return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxDestroy_v2")) return r;
  if (!drv().contexts.count(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx->life != Life::live) die("cuCtxDestroy_v2", "context %p destroyed twice", static_cast<void*>(ctx));
  ctx->life = Life::destroyed;
  reset_context(lk, ctx, "its context was destroyed (cuCtxDestroy)");
  if (!me().stack.empty() && me().stack.back() == ctx) me().stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxGetCurrent")) return r;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = me().stack.empty() ? nullptr : me().stack.back();
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxSetCurrent")) return r;
  if (!ctx) {  // documented: pops the top of the stack, if any
    if (!me().stack.empty()) me().stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!drv().contexts.count(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (me().stack.empty()) {
    me().stack.push_back(ctx);
  } else {
    me().stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxPushCurrent_v2")) return r;
  if (!ctx || !drv().contexts.count(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  me().stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxPopCurrent_v2")) return r;
  if (me().stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = me().stack.back();
  me().stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxGetDevice")) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  *device = c->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  Lock lk;
  if (CUresult r = enter(lk, "cuCtxSynchronize")) return r;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  std::vector<std::pair<CUstream, std::uint64_t>> marks;
  for (auto& [key, s] : drv().streams) {
    if (s->ctx == c && s->completed < s->enqueued) marks.emplace_back(s.get(), s->enqueued);
  }
  for (auto& [s, seq] : marks) wait_for(lk, s, seq);
  return CUDA_SUCCESS;
}

// ==== memory ===================================================================================

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytes) {
  Lock lk;
  if (CUresult r = enter(lk, "cuMemAlloc_v2")) return r;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  Driver& d = drv();
  std::size_t live = 0;
  for (const auto& [base, a] : d.dev) live += a.ctx->device == c->device ? a.size : 0;
  if (bytes > kTotalMemory - live) return CUDA_ERROR_OUT_OF_MEMORY;
  DevAlloc a;
  a.bytes.reset(new (std::nothrow) std::uint8_t[bytes]);
  if (!a.bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(a.bytes.get(), 0xA5, bytes);  // never-written device memory is not zero
  a.size = bytes;
  a.ctx = c;
  a.gen = c->gen;
  // 256-aligned as documented, never 512-aligned, with a gap: see the header comment.
  CUdeviceptr& next = d.next_address[static_cast<std::size_t>(c->device)];
  CUdeviceptr p = next;
  next = ((p + bytes + 4096 + 511) & ~CUdeviceptr{511}) + 256;
  d.dev.emplace(p, std::move(a));
  d.live_device_bytes += bytes;
  d.peak_device_bytes = std::max(d.peak_device_bytes, d.live_device_bytes);
  *dptr = p;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  Lock lk;
  if (CUresult r = enter(lk, "cuMemFree_v2")) return r;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  Driver& d = drv();
  auto it = d.dev.find(dptr);
  if (it == d.dev.end()) {
    CUdeviceptr base = 0;
    device_range("cuMemFree_v2", dptr, 1, &base);  // aborts for freed memory
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (it->second.pending) {
    die("cuMemFree_v2", "device memory %s (%zu bytes) freed while %d copies from or into it are pending",
        hex(dptr).c_str(), it->second.size, it->second.pending);
  }
  d.dev_dead[dptr] = Dead{it->second.size, "freed by cuMemFree"};
  d.live_device_bytes -= it->second.size;
  d.dev.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(std::size_t* free_bytes, std::size_t* total_bytes) {
  Lock lk;
  if (CUresult r = enter(lk, "cuMemGetInfo_v2")) return r;
  if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  std::size_t live = 0;
  for (const auto& [base, a] : drv().dev) live += a.ctx->device == c->device ? a.size : 0;
  *total_bytes = kTotalMemory;
  *free_bytes = kTotalMemory - live;
  return CUDA_SUCCESS;
}

namespace {
CUresult host_alloc(const char* fn, void** pp, std::size_t bytes) {
  Lock lk;
  if (CUresult r = enter(lk, fn)) return r;
  if (!pp || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t mapped = (bytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  PinAlloc a;
  a.size = bytes;
  a.mapped = mapped;
  a.ctx = c;
  a.gen = c->gen;
  drv().pin.emplace(reinterpret_cast<std::uintptr_t>(p), a);
  drv().live_pinned_bytes += bytes;
  drv().peak_pinned_bytes = std::max(drv().peak_pinned_bytes, drv().live_pinned_bytes);
  *pp = p;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuMemHostAlloc(void** pp, std::size_t bytes, unsigned int flags) {
  if (flags & ~0x7u) return CUDA_ERROR_INVALID_VALUE;  // PORTABLE, DEVICEMAP, WRITECOMBINED
  return host_alloc("cuMemHostAlloc", pp, bytes);
}

CUresult cuMemAllocHost_v2(void** pp, std::size_t bytes) {
  return host_alloc("cuMemAllocHost_v2", pp, bytes);
}

CUresult cuMemFreeHost(void* p) {
  Lock lk;
  if (CUresult r = enter(lk, "cuMemFreeHost")) return r;
  Driver& d = drv();
  auto key = reinterpret_cast<std::uintptr_t>(p);
  auto it = d.pin.find(key);
  if (it == d.pin.end()) {
    std::uintptr_t base = 0;
    pinned_range("cuMemFreeHost", p, 1, &base);  // aborts for freed memory
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (it->second.pending) {
    die("cuMemFreeHost", "pinned buffer %p (%zu bytes) freed while %d copies from or into it are pending", p,
        it->second.size, it->second.pending);
  }
  kill_pinned(key, it->second, "freed by cuMemFreeHost");
  d.pin.erase(it);
  return CUDA_SUCCESS;
}

namespace {
/// Whether every page of [p, p + n) is mapped with `want` (r or w) permission, from
/// /proc/self/maps: what the driver's pinning of the pages needs.
bool mapped_with(std::uintptr_t p, std::size_t n, char want) {
  std::ifstream maps("/proc/self/maps");
  std::uintptr_t at = p;
  const std::uintptr_t end = p + n;
  for (std::string line; at < end && std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms;
    fields >> range >> perms;
    std::size_t dash = range.find('-');
    if (dash == std::string::npos || perms.size() < 2) continue;
    std::uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    std::uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (hi <= at) continue;
    if (lo > at) return false;  // a hole
    if (perms[want == 'w' ? 1 : 0] != want) return false;
    at = hi;
  }
  return at >= end;
}

bool overlaps_any(std::uintptr_t p, std::size_t n) {
  Driver& d = drv();
  auto hits = [&](const auto& allocations) {
    auto it = allocations.lower_bound(p + n);
    if (it == allocations.begin()) return false;
    --it;
    return it->first + it->second.size > p;
  };
  return hits(d.reg) || hits(d.pin);
}

CUresult host_register(const char* fn, void* ptr, std::size_t bytes, unsigned flags) {
  Driver& d = drv();
  Lock lk;
  if (CUresult r = enter(lk, fn)) return r;
  if (!ptr || bytes == 0 || (flags & ~0xFu)) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  const bool read_only = (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0;
  if (read_only && !d.read_only_register) return CUDA_ERROR_NOT_SUPPORTED;
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (overlaps_any(p, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  // The driver pins the pages for the device to read (and, without READ_ONLY, write).
  if (!mapped_with(p, bytes, read_only ? 'r' : 'w')) return CUDA_ERROR_INVALID_VALUE;
  if (d.register_gbps > 0) {
    auto took =
        std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(bytes) / d.register_gbps));
    if (d.register_locks) {
      std::this_thread::sleep_for(took);  // every other call waits for the lock meanwhile
    } else {
      lk.unlock();
      std::this_thread::sleep_for(took);
      lk.lock();
      if (overlaps_any(p, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  }
  RegAlloc a;
  a.size = bytes;
  a.ctx = c;
  a.gen = c->gen;
  a.flags = flags;
  d.reg.emplace(p, a);
  d.live_registered_bytes += bytes;
  d.peak_registered_bytes = std::max(d.peak_registered_bytes, d.live_registered_bytes);
  d.registrations++;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuMemHostRegister_v2(void* p, std::size_t bytes, unsigned int flags) {
  return host_register("cuMemHostRegister_v2", p, bytes, flags);
}

CUresult cuMemHostRegister(void* p, std::size_t bytes, unsigned int flags) {
  return host_register("cuMemHostRegister", p, bytes, flags);
}

CUresult cuMemHostUnregister(void* p) {
  Lock lk;
  if (CUresult r = enter(lk, "cuMemHostUnregister")) return r;
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  auto it = d.reg.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == d.reg.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  if (it->second.pending) {
    die("cuMemHostUnregister",
        "registered range %p (%zu bytes) unregistered while %d copies from or into it are pending: the "
        "driver would unpin pages the copy engine still reads",
        p, it->second.size, it->second.pending);
  }
  d.live_registered_bytes -= it->second.size;
  d.reg.erase(it);
  d.unregistrations++;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  Lock lk;
  if (CUresult r = enter(lk, "cuPointerGetAttribute")) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  CUcontext ctx = nullptr;
  std::uint64_t base = 0;
  std::size_t size = 0;
  bool device = false;
  auto it = d.dev.upper_bound(ptr);
  if (it != d.dev.begin() && ptr < std::prev(it)->first + std::prev(it)->second.size) {
    --it;
    ctx = it->second.ctx;
    base = it->first;
    size = it->second.size;
    device = true;
  } else {
    auto pit = d.pin.upper_bound(static_cast<std::uintptr_t>(ptr));
    if (pit == d.pin.begin() || ptr >= std::prev(pit)->first + std::prev(pit)->second.size)
      return CUDA_ERROR_INVALID_VALUE;  // not memory this driver knows (pageable, or freed)
    --pit;
    ctx = pit->second.ctx;
    base = pit->first;
    size = pit->second.size;
  }
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = ctx;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (device) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<bool*>(data) = false;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = ctx->device;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = base;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(data) = size;
      break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes) {
  return copy("cuMemcpyHtoD_v2", nullptr, true, dst, nullptr, 0, src, bytes, -1);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes) {
  return copy("cuMemcpyDtoH_v2", nullptr, true, 0, dst, src, nullptr, bytes, -1);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  return copy("cuMemcpyDtoD_v2", nullptr, true, dst, nullptr, src, nullptr, bytes, -1);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream stream) {
  return copy("cuMemcpyHtoDAsync_v2", stream, false, dst, nullptr, 0, src, bytes, -1);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  return copy("cuMemcpyDtoHAsync_v2", stream, false, 0, dst, src, nullptr, bytes, -1);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  return copy("cuMemcpyDtoDAsync_v2", stream, false, dst, nullptr, src, nullptr, bytes, -1);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t bytes) {
  return copy("cuMemsetD8_v2", nullptr, true, dst, nullptr, 0, nullptr, bytes, value);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t bytes, CUstream stream) {
  return copy("cuMemsetD8Async", stream, false, dst, nullptr, 0, nullptr, bytes, value);
}

namespace {
/// Device addresses are where no host address can be (see kDeviceBase): that is how the
/// unified-addressing copies below tell the two apart, as the real driver does by range.
bool is_device_address(CUdeviceptr p) {
  return p >= kDeviceBase;
}
}  // namespace

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  bool dd = is_device_address(dst), sd = is_device_address(src);
  return copy("cuMemcpy", nullptr, true, dd ? dst : 0, dd ? nullptr : reinterpret_cast<void*>(dst),
              sd ? src : 0, sd ? nullptr : reinterpret_cast<const void*>(src), bytes, -1);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  bool dd = is_device_address(dst), sd = is_device_address(src);
  return copy("cuMemcpyAsync", stream, false, dd ? dst : 0, dd ? nullptr : reinterpret_cast<void*>(dst),
              sd ? src : 0, sd ? nullptr : reinterpret_cast<const void*>(src), bytes, -1);
}

// ==== streams ==================================================================================

CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user) {
  Lock lk;
  if (CUresult r = enter(lk, "cuLaunchHostFunc")) return r;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuLaunchHostFunc", stream, &s)) return r;
  Op op;
  op.kind = Op::host_fn;
  op.host = fn;
  op.user = user;
  enqueue("cuLaunchHostFunc", s, std::move(op));
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamCreate")) return r;
  if (!stream || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  *stream = new_stream(c, flags, false);
  return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  (void)priority;
  return cuStreamCreate(stream, flags);
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamDestroy_v2")) return r;
  if (!stream || stream == FAKECUDA_STREAM_LEGACY || stream == FAKECUDA_STREAM_PER_THREAD)
    return CUDA_ERROR_INVALID_HANDLE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamDestroy_v2", stream, &s)) return r;
  // As the real call does: return at once; the queued work still runs (the worker drains the
  // queue, then exits). Waiting here would hide a caller that frees a copy's source or
  // destination right after destroying its stream, which the pending counts then catch.
  s->life = Life::destroyed;
  s->stopping = true;
  s->work.notify_all();
  s->worker.detach();
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamSynchronize")) return r;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamSynchronize", stream, &s)) return r;
  if (s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  wait_for(lk, s, s->enqueued);
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream stream) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamQuery")) return r;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamQuery", stream, &s)) return r;
  return s->completed >= s->enqueued ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamGetCtx")) return r;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamGetCtx", stream, &s)) return r;
  *ctx = s->ctx;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream stream, unsigned int* flags) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamGetFlags")) return r;
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamGetFlags", stream, &s)) return r;
  *flags = s->flags;
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamWaitEvent")) return r;
  if (flags & ~1u) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  CUevent e = nullptr;
  if (CUresult r = resolve_stream("cuStreamWaitEvent", stream, &s)) return r;
  if (CUresult r = resolve_event("cuStreamWaitEvent", event, &e)) return r;
  // Waiting on an event of another context or device is documented as allowed.
  if (e->recorded && e->stream->completed < e->seq) {
    Op w;
    w.kind = Op::wait;
    w.other = e->stream;
    w.other_seq = e->seq;
    enqueue("cuStreamWaitEvent", s, std::move(w));
  }
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream stream, int* status) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamIsCapturing")) return r;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamIsCapturing", stream, &s)) return r;
  *status = s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  (void)mode;
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamBeginCapture_v2")) return r;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamBeginCapture_v2", stream, &s)) return r;
  if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->capturing) return CUDA_ERROR_INVALID_VALUE;
  s->capturing = true;
  return CUDA_SUCCESS;
}

namespace {
struct CUgraph_token {
  int unused;
} graph_token;
}  // namespace

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  Lock lk;
  if (CUresult r = enter(lk, "cuStreamEndCapture")) return r;
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  if (CUresult r = resolve_stream("cuStreamEndCapture", stream, &s)) return r;
  if (!s->capturing) return CUDA_ERROR_INVALID_VALUE;
  s->capturing = false;
  *graph = reinterpret_cast<CUgraph>(&graph_token);  // an empty graph: nothing was captured
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
  return graph == reinterpret_cast<CUgraph>(&graph_token) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ==== events ===================================================================================

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  Lock lk;
  if (CUresult r = enter(lk, "cuEventCreate")) return r;
  if (!event || (flags & ~0xFu)) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = current(&c)) return r;
  auto e = std::make_unique<CUevent_st>();
  e->ctx = c;
  e->gen = c->gen;
  e->flags = flags;
  *event = e.get();
  drv().events.emplace(e.get(), std::move(e));
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent event) {
  Lock lk;
  if (CUresult r = enter(lk, "cuEventDestroy_v2")) return r;
  CUevent e = nullptr;
  if (CUresult r = resolve_event("cuEventDestroy_v2", event, &e)) return r;
  e->life = Life::destroyed;  // a pending record still completes, harmlessly
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  Lock lk;
  if (CUresult r = enter(lk, "cuEventRecord")) return r;
  CUevent e = nullptr;
  CUstream s = nullptr;
  if (CUresult r = resolve_event("cuEventRecord", event, &e)) return r;
  if (CUresult r = resolve_stream("cuEventRecord", stream, &s)) return r;
  if (e->ctx != s->ctx) {
    die("cuEventRecord",
        "event %p of device %d (context %p) recorded on stream %p of device %d (context %p): an event "
        "and the stream it is recorded on must share a context",
        static_cast<void*>(e), e->ctx->device, static_cast<void*>(e->ctx), static_cast<void*>(s),
        s->ctx->device, static_cast<void*>(s->ctx));
  }
  Op m;
  m.kind = Op::marker;
  m.event = e;
  std::uint64_t seq = enqueue("cuEventRecord", s, std::move(m));
  e->stream = s;
  e->seq = seq;
  e->recorded = true;
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent event) {
  Lock lk;
  if (CUresult r = enter(lk, "cuEventQuery")) return r;
  CUevent e = nullptr;
  if (CUresult r = resolve_event("cuEventQuery", event, &e)) return r;
  return !e->recorded || e->stream->completed >= e->seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent event) {
  Lock lk;
  if (CUresult r = enter(lk, "cuEventSynchronize")) return r;
  CUevent e = nullptr;
  if (CUresult r = resolve_event("cuEventSynchronize", event, &e)) return r;
  if (e->recorded) wait_for(lk, e->stream, e->seq);
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  Lock lk;
  if (CUresult r = enter(lk, "cuEventElapsedTime")) return r;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  CUevent a = nullptr, b = nullptr;
  if (CUresult r = resolve_event("cuEventElapsedTime", start, &a)) return r;
  if (CUresult r = resolve_event("cuEventElapsedTime", end, &b)) return r;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (a->stream->completed < a->seq || b->stream->completed < b->seq) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return CUDA_SUCCESS;
}

// ==== controls and statistics ===================================================================

int fakecuda_live_device_allocations(void) {
  Lock lk(drv().mu);
  return static_cast<int>(drv().dev.size());
}

std::size_t fakecuda_live_device_bytes(void) {
  Lock lk(drv().mu);
  std::size_t n = 0;
  for (const auto& [base, a] : drv().dev) n += a.size;
  return n;
}

int fakecuda_live_pinned_allocations(void) {
  Lock lk(drv().mu);
  return static_cast<int>(drv().pin.size());
}

int fakecuda_live_streams(void) {
  Lock lk(drv().mu);
  int n = 0;
  for (const auto& [key, s] : drv().streams) n += s->life == Life::live && !s->legacy;
  return n;
}

int fakecuda_live_events(void) {
  Lock lk(drv().mu);
  int n = 0;
  for (const auto& [key, e] : drv().events) n += e->life == Life::live;
  return n;
}

int fakecuda_primary_ctx_refs(int device) {
  Lock lk(drv().mu);
  return valid_device(device) && device < static_cast<int>(drv().primaries.size())
             ? drv().primaries[static_cast<std::size_t>(device)]->refs
             : -1;
}

int fakecuda_primary_ctx_resets(int device) {
  Lock lk(drv().mu);
  return valid_device(device) && device < static_cast<int>(drv().primaries.size())
             ? drv().primaries[static_cast<std::size_t>(device)]->resets
             : -1;
}

std::size_t fakecuda_peak_device_bytes(int reset) {
  Lock lk(drv().mu);
  if (reset) drv().peak_device_bytes = drv().live_device_bytes;
  return drv().peak_device_bytes;
}

std::size_t fakecuda_peak_pinned_bytes(int reset) {
  Lock lk(drv().mu);
  if (reset) drv().peak_pinned_bytes = drv().live_pinned_bytes;
  return drv().peak_pinned_bytes;
}

unsigned long long fakecuda_copies_completed(void) {
  Lock lk(drv().mu);
  return drv().copies_done;
}

unsigned long long fakecuda_calls(const char* fn) {
  Lock lk(drv().mu);
  if (!fn) return 0;
  auto it = drv().total_calls.find(base_name(fn));
  return it == drv().total_calls.end() ? 0 : it->second;
}

unsigned long long fakecuda_pageable_async_copies(void) {
  Lock lk(drv().mu);
  return drv().pageable_async;
}

int fakecuda_set_failures(const char* spec) {
  Lock lk(drv().mu);
  std::vector<Failure> parsed;
  if (!parse_failures(spec, parsed)) return -1;
  drv().failures = std::move(parsed);
  drv().calls.clear();
  return 0;
}

void fakecuda_set_latency_us(unsigned int us) {
  Lock lk(drv().mu);
  drv().latency_us = us;
}

void fakecuda_hold(int held) {
  Lock lk(drv().mu);
  drv().held = held != 0;
  if (!drv().held) {
    for (auto& [key, s] : drv().streams) s->work.notify_all();
  }
}

void fakecuda_set_link_gbps(int direction, double gbps) {
  Lock lk(drv().mu);
  if (direction == FAKECUDA_H2D || direction == FAKECUDA_D2H)
    drv().link_gbps[static_cast<std::size_t>(direction)] = gbps > 0 ? gbps : 0.0;
}

unsigned long long fakecuda_clock_ns(void) {
  return clock_ns(Clock::now());
}

int fakecuda_link_stats(int device, int direction, unsigned long long* busy_ns,
                        unsigned long long* first_start_ns, unsigned long long* last_end_ns,
                        unsigned long long* copies) {
  Lock lk(drv().mu);
  if (device < 0 || static_cast<std::size_t>(device) >= drv().links.size() ||
      (direction != FAKECUDA_H2D && direction != FAKECUDA_D2H))
    return -1;
  const Link& l = drv().links[static_cast<std::size_t>(device)][static_cast<std::size_t>(direction)];
  if (busy_ns) *busy_ns = l.busy_ns;
  if (first_start_ns) *first_start_ns = l.first_start_ns;
  if (last_end_ns) *last_end_ns = l.last_end_ns;
  if (copies) *copies = l.copies;
  return 0;
}

void fakecuda_link_reset(void) {
  Lock lk(drv().mu);
  for (auto& device : drv().links) {
    for (Link& l : device) {
      Clock::time_point free_at = l.free_at;  // copies booked already still hold the link
      l = Link{};
      l.free_at = free_at;
    }
  }
}

std::size_t fakecuda_registered_bytes(void) {
  Lock lk(drv().mu);
  return drv().live_registered_bytes;
}

int fakecuda_live_registrations(void) {
  Lock lk(drv().mu);
  return static_cast<int>(drv().reg.size());
}

std::size_t fakecuda_peak_registered_bytes(int reset) {
  Lock lk(drv().mu);
  if (reset) drv().peak_registered_bytes = drv().live_registered_bytes;
  return drv().peak_registered_bytes;
}

void fakecuda_registrations(unsigned long long* registered, unsigned long long* unregistered) {
  Lock lk(drv().mu);
  if (registered) *registered = drv().registrations;
  if (unregistered) *unregistered = drv().unregistrations;
}

void fakecuda_set_register_cost(double gbps, int hold_api_lock) {
  Lock lk(drv().mu);
  drv().register_gbps = gbps > 0 ? gbps : 0.0;
  drv().register_locks = hold_api_lock != 0;
}

void fakecuda_set_read_only_register(int supported) {
  Lock lk(drv().mu);
  drv().read_only_register = supported != 0;
}
