// Streaming GPU uploads: `Uploader::load`, `load_into` and `stream` with a landing callback, and
// their nothrow twins. Each tensor must be handed over once, in request order, on the calling
// thread, with its bytes in device memory (or its event covering them); an engine's stream must
// be able to order its work after the event; a scratch ring must stay within its bound and never
// be refilled under the engine's pending reads; failures (injected driver errors, callbacks that
// fail or throw) must end the upload with every copy completed, nothing leaked, the uploader
// usable. Runs against the emulated driver (two devices, slow copies), whose cross-stream check
// aborts on any device read or write not ordered after the copies it depends on.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "gpu_support.hpp"
#include "support.hpp"

using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::Request;
using safetensors::SafeOpen;
using safetensors::Status;
using safetensors::TensorView;
namespace cuda = safetensors::cuda;
namespace nc = safetensors::nothrow::cuda;

namespace {

const bool kTwoDevices = (::setenv("SAFETENSORS_FAKE_CUDA_DEVICES", "2", 0), true);

using test::Driver;
using test::kind_of;
using test::Stream;

/// 4 KiB slots: chunks hold several small tensors, and the large ones span several chunks.
constexpr cuda::UploadOptions kTiny{.staging_slots = 4, .slot_bytes = 4096, .readers = 3};

/// `n` tensors of 0 to 600 bytes in assorted dtypes, and three of 9,000-20,000 bytes.
std::filesystem::path many_tensors(const test::TempDir& dir, std::size_t n,
                                   const std::string& name = "many.safetensors") {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<std::pair<std::string, TensorView>> tensors;
  auto add = [&](std::string tensor, Dtype d, std::vector<std::size_t> shape) {
    std::size_t count = 1;
    for (auto s : shape) count *= s;
    auto& b = storage.emplace_back(count * safetensors::bit_size(d) / 8);
    for (std::size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::uint8_t>(j * 13 + storage.size() * 7);
    tensors.emplace_back(std::move(tensor), TensorView{d, std::move(shape), std::as_bytes(std::span(b)), {}});
  };
  storage.reserve(n + 3);
  for (std::size_t i = 0; i < n; ++i) {
    char tensor[32];
    std::snprintf(tensor, sizeof tensor, "t%05zu", i);
    const Dtype d[] = {Dtype::U8, Dtype::F32, Dtype::BF16};
    add(tensor, d[i % 3], {(i * 37) % 101, 1 + i % 3});
  }
  add("big0", Dtype::U8, {9000});
  add("big1", Dtype::U8, {20000});
  add("big2", Dtype::U8, {12345});
  auto path = dir / name;
  safetensors::save_file(path, tensors);
  return path;
}

/// What these tests upload for a list of requests: an empty list stands for every tensor (the
/// loops below run both), which the library spells `Requests{}`.
safetensors::Requests all_if_empty(const std::vector<Request>& requests) {
  if (requests.empty()) return {};
  return requests;
}

/// Requests of whole tensors and of slices (one non-contiguous), out of file order.
std::vector<Request> with_slices() {
  return {{"big1", {Index::range(100, 9000)}},
          {"t00010", {Index::range(5, 40), Index::range(1, 2)}},
          {"t00007", {}},
          {"big0", {}},
          {"t00002", {}}};
}

/// What a streaming upload of `requests` hands over, in order: the requests, or every tensor in
/// `keys()` order.
template <class Source>
std::vector<Request> expected_order(const Source& s, std::span<const Request> requests) {
  if (!requests.empty()) return {requests.begin(), requests.end()};
  std::vector<Request> all;
  for (auto& k : s.keys()) all.push_back({k, {}});
  return all;
}

/// The bytes request `r` must deliver, read with `get_tensor` or a slice.
template <class Source>
std::vector<std::byte> expected_bytes(const Source& s, const Request& r) {
  TensorView v = r.select.empty() ? s.get_tensor(r.name) : s.get_slice(r.name).select(r.select).read();
  return {v.data.begin(), v.data.end()};
}

std::vector<std::byte> download(const void* p, std::size_t n) {
  std::vector<std::byte> out(n);
  if (n > 0) cuda::copy_to_host(p, out);
  return out;
}

/// Device 0's primary context, retained and current while this lives (as the CUDA runtime
/// makes it for an engine); the thread's previous context comes back after.
struct OnDevice0 {
  explicit OnDevice0(const Driver& d) : drv(d), previous(d.current()) { drv.enter_primary(0); }
  ~OnDevice0() {
    EXPECT_EQ(drv.get<int (*)(int)>("cuDevicePrimaryCtxRelease_v2")(0), 0);
    drv.set_current(previous);
  }
  OnDevice0(const OnDevice0&) = delete;
  OnDevice0& operator=(const OnDevice0&) = delete;
  const Driver& drv;
  test::Ctx previous;
};

/// A caller's destination for `load_into`: device memory and a non-blocking stream of device
/// 0's primary context (current). Freed without synchronizing: a copy still pending into it
/// makes the emulated driver abort, which is the point.
struct CallersBuffer {
  CallersBuffer(const Driver& d, std::size_t bytes) : drv(d), device(d.alloc(bytes)), stream(d.stream()) {}
  ~CallersBuffer() {
    drv.destroy(stream);
    drv.free(device);
  }
  CallersBuffer(const CallersBuffer&) = delete;
  CallersBuffer& operator=(const CallersBuffer&) = delete;
  [[nodiscard]] void* at() const { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(device)); }
  [[nodiscard]] std::uintptr_t on() const { return reinterpret_cast<std::uintptr_t>(stream); }
  const Driver& drv;
  std::uint64_t device;
  Stream stream;
};

/// Slows every copy of the emulated driver for the object's life.
struct SlowCopies {
  SlowCopies(const Driver& d, unsigned us) : drv(d) {
    drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(us);
  }
  ~SlowCopies() { drv.get<void (*)(unsigned)>("fakecuda_set_latency_us")(100); }
  SlowCopies(const SlowCopies&) = delete;
  SlowCopies& operator=(const SlowCopies&) = delete;
  const Driver& drv;
};

/// An engine on device 0 (its primary context current, see `OnDevice0`): a buffer and a
/// non-blocking stream of its own. Its "transform" copies a tensor into its buffer on its
/// stream, optionally behind a host function that sleeps, so that its reads of the tensor run
/// late.
struct Engine {
  Engine(const Driver& d, std::size_t bytes) : drv(d), out(d.alloc(bytes)), stream(d.stream()) {}
  ~Engine() {
    drv.sync(stream);
    drv.destroy(stream);
    drv.free(out);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  [[nodiscard]] std::uintptr_t on() const { return reinterpret_cast<std::uintptr_t>(stream); }
  void wait(std::uintptr_t event) const {
    EXPECT_EQ(drv.get<int (*)(Stream, void*, unsigned)>("cuStreamWaitEvent")(
                  stream, reinterpret_cast<void*>(event), 0),
              0);
  }
  void transform(const cuda::Landed& t, std::size_t at, bool late = false) const {
    if (late) {
      auto sleep = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
      EXPECT_EQ(drv.get<int (*)(Stream, void (*)(void*), void*)>("cuLaunchHostFunc")(stream, sleep, nullptr),
                0);
    }
    if (t.byte_size == 0) return;
    auto src = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.data));
    EXPECT_EQ(drv.get<int (*)(std::uint64_t, std::uint64_t, std::size_t, Stream)>("cuMemcpyDtoDAsync_v2")(
                  out + at, src, t.byte_size, stream),
              0);
  }
  /// Its buffer's bytes `[at, at + n)`, once its stream is done.
  [[nodiscard]] std::vector<std::byte> bytes(std::size_t at, std::size_t n) const {
    drv.sync(stream);
    return download(reinterpret_cast<void*>(static_cast<std::uintptr_t>(out + at)), n);
  }

  const Driver& drv;
  std::uint64_t out;
  Stream stream;
};

/// Checks that the engine's buffer holds every request's bytes at its `plan()` offset.
template <class Source>
void expect_transformed(const Engine& e, const Source& s, std::span<const Request> requests,
                        const std::vector<cuda::Placement>& placed, const char* what) {
  auto order = expected_order(s, requests);
  ASSERT_EQ(order.size(), placed.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(e.bytes(placed[i].offset, placed[i].byte_size), expected_bytes(s, order[i]))
        << what << ": " << placed[i].name;
  }
}

TEST(CudaStream, LoadHandsEachTensorOverOnceInRequestOrderWithItsBytes) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  SlowCopies slow(drv, 300);
  test::TempDir dir;
  auto path = many_tensors(dir, 300);
  cuda::Uploader up(0, kTiny);
  const auto caller = std::this_thread::get_id();
  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    SafeOpen f(path, {backend});
    for (const auto& requests : {std::vector<Request>{}, with_slices()}) {
      auto order = expected_order(f, requests);
      auto planned = cuda::plan(f, all_if_empty(requests));
      const std::size_t bytes = planned.first;
      const auto& placed = planned.second;
      std::size_t next = 0;
      auto loaded = up.load(f, all_if_empty(requests), [&](const cuda::Landed& t) {
        ASSERT_EQ(std::this_thread::get_id(), caller) << "callbacks run on the calling thread";
        ASSERT_EQ(drv.current(), nullptr) << "the caller's (lack of) context is current in the callback";
        ASSERT_EQ(t.index, next++) << "request order";
        const auto& p = placed[t.index];
        EXPECT_EQ(t.name, p.name);
        EXPECT_EQ(t.dtype, p.dtype);
        EXPECT_TRUE(std::equal(t.shape.begin(), t.shape.end(), p.shape.begin(), p.shape.end())) << p.name;
        EXPECT_EQ(t.byte_size, p.byte_size);
        EXPECT_NE(t.event, 0u);
        // Landed: the bytes are there now (a copy still writing them would make the emulated
        // driver abort this read).
        EXPECT_EQ(download(t.data, t.byte_size), expected_bytes(f, order[t.index])) << p.name;
      });
      EXPECT_EQ(next, order.size());
      EXPECT_EQ(loaded.buffer().size(), bytes);
      for (std::size_t i = 0; i < order.size(); ++i) {
        EXPECT_EQ(download(loaded.data(placed[i].name), placed[i].byte_size), expected_bytes(f, order[i]));
      }
    }
  }
  EXPECT_EQ(drv.current(), nullptr);
}

TEST(CudaStream, AnEnginesStreamOrdersItsWorkAfterEachTensorsEvent) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  OnDevice0 on_device0(drv);
  SlowCopies slow(drv, 500);
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 200));
  cuda::Uploader up(0, kTiny);
  const auto requests = with_slices();
  auto planned = cuda::plan(f, requests);
  const std::size_t bytes = planned.first;
  const auto& placed = planned.second;
  // The engine waits on each event itself, then with the library making its stream wait.
  for (bool library_waits : {false, true}) {
    Engine engine(drv, bytes);
    cuda::LandingOptions options{.deliver = cuda::Deliver::Enqueued};
    if (library_waits) options.consumer_stream = engine.on();
    auto loaded = up.load(
        f, requests,
        [&](const cuda::Landed& t) {
          if (!library_waits) engine.wait(t.event);
          engine.transform(t, placed[t.index].offset);
        },
        options);
    expect_transformed(engine, f, requests, placed, library_waits ? "consumer_stream" : "own wait");
  }
  // Into the caller's destination, with copies on the caller's stream.
  {
    Engine engine(drv, bytes);
    CallersBuffer dst(drv, bytes);
    auto got = up.load_into(f, requests, dst.at(), bytes, dst.on(),
                            [&](const cuda::Landed& t) {
                              EXPECT_EQ(t.data, static_cast<std::byte*>(dst.at()) + placed[t.index].offset);
                              engine.transform(t, placed[t.index].offset);
                            },
                            {.deliver = cuda::Deliver::Enqueued, .consumer_stream = engine.on()});
    ASSERT_EQ(got.size(), placed.size());
    expect_transformed(engine, f, requests, placed, "load_into");
    // Every copy has completed on return: the destination may be freed at once (the emulated
    // driver aborts when memory is freed under a pending copy).
  }
}

TEST(CudaStream, AScratchRingStaysWithinItsBoundAndWaitsForTheEngine) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  OnDevice0 on_device0(drv);
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's memory statistics";
  auto peak = drv.get<std::size_t (*)(int)>("fakecuda_peak_device_bytes");
  auto live = drv.get<std::size_t (*)()>("fakecuda_live_device_bytes");
  SlowCopies slow(drv, 200);
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 2000));
  cuda::Uploader up(0, kTiny);
  const std::vector<Request> all;  // every tensor, for the checks below
  auto planned = cuda::plan(f);
  const std::size_t bytes = planned.first;
  const auto& placed = planned.second;
  ASSERT_GT(bytes, 100u * 4096) << "far more than the ring";
  for (auto deliver : {cuda::Deliver::Landed, cuda::Deliver::Enqueued}) {
    Engine engine(drv, bytes);
    const std::size_t before = live();
    peak(1);
    std::size_t n = 0;
    // 16 KiB asked; the largest tensor (20,000 bytes) grows it to 5 chunks of 4 KiB.
    const std::size_t ring = up.stream(f, {}, 16 << 10,
                                       [&](const cuda::Landed& t) {
                                         EXPECT_GE(live(), before + 20480);
                                         // Every 50th transform is held up, so that refilling its region too
                                         // early would overwrite bytes the engine has yet to read (the
                                         // emulated driver aborts then).
                                         engine.transform(t, placed[t.index].offset, ++n % 50 == 0);
                                       },
                                       {.deliver = deliver, .consumer_stream = engine.on()});
    EXPECT_EQ(ring, 20480u);
    EXPECT_EQ(n, placed.size());
    EXPECT_LE(peak(0), before + ring) << "device memory beyond the scratch ring";
    EXPECT_EQ(live(), before) << "the scratch ring was not freed";
    expect_transformed(engine, f, all, placed, deliver == cuda::Deliver::Landed ? "landed" : "enqueued");
  }
}

TEST(CudaStream, AScratchRingWithASynchronousConsumer) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 400));
  cuda::Uploader up(0, kTiny);
  const auto requests = with_slices();
  auto order = expected_order(f, requests);
  std::size_t n = 0;
  auto ring = up.stream(f, requests, 1, [&](const cuda::Landed& t) {
    // The region is the callback's until it returns.
    EXPECT_EQ(download(t.data, t.byte_size), expected_bytes(f, order[t.index])) << t.name;
    ++n;
  });
  EXPECT_EQ(n, order.size());
  EXPECT_EQ(ring, 12288u) << "the largest request (8,900 bytes), in whole 4 KiB chunks";
  // Handed over before landing, with no stream to say when the engine is done: refused.
  int calls = 0;
  try {
    (void)up.stream(f, requests, 1 << 20, [&](const cuda::Landed&) { ++calls; },
                    {.deliver = cuda::Deliver::Enqueued});
    ADD_FAILURE() << "no error";
  } catch (const safetensors::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Cuda);
    EXPECT_NE(std::string(e.what()).find("need a consumer stream"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 0);
}

/// A checkpoint of two shards, written from the tensors of `many`.
std::filesystem::path two_shards(const test::TempDir& dir, const SafeOpen& many) {
  std::vector<std::pair<std::string, TensorView>> a, b;
  std::string map;
  for (const auto& name : many.keys()) {
    bool first = name < "t00100" || name == "big1";
    (first ? a : b).emplace_back(name, many.get_tensor(name));
    map += (map.empty() ? "" : ",") + ("\"" + name + "\":\"") + (first ? "a" : "b") + ".safetensors\"";
  }
  safetensors::save_file(dir / "a.safetensors", a);
  safetensors::save_file(dir / "b.safetensors", b);
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map":{)" << map << "}}";
  return dir / "model.safetensors.index.json";
}

TEST(CudaStream, CheckpointsStreamEveryWay) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  OnDevice0 on_device0(drv);
  SlowCopies slow(drv, 200);
  test::TempDir dir;
  SafeOpen many(many_tensors(dir, 300));
  safetensors::Checkpoint ckpt(two_shards(dir, many));
  cuda::Uploader up(0, kTiny);
  for (const auto& requests : {std::vector<Request>{}, with_slices()}) {
    auto order = expected_order(ckpt, requests);
    auto planned = cuda::plan(ckpt, all_if_empty(requests));
    const std::size_t bytes = planned.first;
    std::size_t next = 0;
    auto check = [&](const cuda::Landed& t) {
      ASSERT_EQ(t.index, next++);
      EXPECT_EQ(download(t.data, t.byte_size), expected_bytes(ckpt, order[t.index])) << t.name;
    };
    auto loaded = up.load(ckpt, all_if_empty(requests), check);
    EXPECT_EQ(std::exchange(next, 0), order.size());
    CallersBuffer dst(drv, bytes);
    (void)up.load_into(ckpt, all_if_empty(requests), dst.at(), bytes, dst.on(), check);
    EXPECT_EQ(std::exchange(next, 0), order.size());
    (void)up.stream(ckpt, all_if_empty(requests), 8192, check);
    EXPECT_EQ(next, order.size());
  }
}

TEST(CudaStream, TheCallersOwnContextIsCurrentInTheCallbackAndAfter) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 50));
  cuda::Uploader up(0, kTiny);
  test::Ctx mine = drv.create_context(cuda::device_count() > 1 ? 1 : 0);
  int calls = 0;
  auto check = [&](const cuda::Landed&) {
    ++calls;
    EXPECT_EQ(drv.current(), mine);
  };
  (void)up.load(f, {}, check);
  (void)up.stream(f, {}, 4096, check);
  EXPECT_EQ(drv.current(), mine);
  EXPECT_EQ(calls, 2 * static_cast<int>(f.size()));
  drv.destroy_context(mine);
  drv.set_current(nullptr);
}

/// Live device and pinned allocations (and events, with `events`), to compare before and after.
/// Pinned memory no upload holds waits idle for the next one (not a leak): both counts are
/// taken with none idle.
struct Leaks {
  Leaks(const Driver& d, bool with_events)
      : drv(d),
        device(d.counter("fakecuda_live_device_allocations")),
        pinned(idle_released(d)),
        events(with_events ? d.counter("fakecuda_live_events") : -1) {}
  static int idle_released(const Driver& d) {
    for (int device : {0, 1}) (void)cuda::release_staging(device);
    return d.counter("fakecuda_live_pinned_allocations");
  }
  void expect_none(const std::string& what) const {
    // An idle buffer keeps its event: released first.
    const int pinned_now = idle_released(drv);
    EXPECT_EQ(drv.counter("fakecuda_live_device_allocations"), device) << what;
    EXPECT_EQ(pinned_now, pinned) << what;
    if (events >= 0) {
      EXPECT_EQ(drv.counter("fakecuda_live_events"), events) << what;
    }
  }
  const Driver& drv;
  int device, pinned, events;
};

TEST(CudaStream, InjectedFailuresEndTheUploadCleanly) {
  Driver drv;
  if (!test::gpu_or_skip()) return;
  if (!drv.emulated()) GTEST_SKIP() << "needs the emulated driver's injected failures";
  OnDevice0 on_device0(drv);
  SlowCopies slow(drv, 1500);
  auto calls = [&](const char* fn) {
    return drv.get<unsigned long long (*)(const char*)>("fakecuda_calls")(fn);
  };
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 120));
  const auto requests = with_slices();
  auto planned = cuda::plan(f, requests);
  const std::size_t bytes = planned.first;
  const auto& placed = planned.second;
  Engine engine(drv, bytes);
  const cuda::LandingOptions options{.deliver = cuda::Deliver::Enqueued, .consumer_stream = engine.on()};
  enum Mode { load, into, scratch };
  const char* fns[] = {"cuMemAlloc",    "cuEventCreate",      "cuMemcpyHtoDAsync",
                       "cuEventRecord", "cuEventSynchronize", "cuStreamWaitEvent"};
  using Counts = std::vector<unsigned long long>;
  // One upload of `mode` through a fresh uploader (so that it creates its events afresh), with
  // the failures of `spec` injected; `made` gets how often it called each of `fns`. The engine's
  // work on it is done on return.
  auto upload = [&](Mode mode, const std::string& spec, std::size_t& delivered, Counts& made) -> Status {
    cuda::Uploader up(0, kTiny);
    CallersBuffer dst(drv, bytes);
    const nc::OnLanded consume = [&](const cuda::Landed& t) {
      ++delivered;
      engine.transform(t, placed[t.index].offset);
      return Status{};
    };
    Counts was;
    for (const char* fn : fns) was.push_back(calls(fn));
    std::optional<cuda::DeviceTensors> kept;
    Status st;
    drv.fail(spec.c_str());
    if (mode == load) {
      auto loaded = nc::load(up, f, requests, consume, options);
      st = loaded.status();
      if (loaded) kept = std::move(*loaded);
    }
    if (mode == into)
      st = nc::load_into(up, f, requests, dst.at(), bytes, dst.on(), consume, options).status();
    if (mode == scratch) st = nc::stream(up, f, requests, 4096, consume, options).status();
    drv.fail("");
    made.clear();
    for (std::size_t i = 0; i < std::size(fns); ++i) made.push_back(calls(fns[i]) - was[i]);
    drv.sync(engine.stream);
    // Every copy of the upload has completed, even a failed one: `dst` is freed now without
    // synchronizing (the emulated driver aborts under a pending copy).
    return st;
  };
  int fired = 0;
  // A failed upload waits for its own stream and the consumer's, never for the whole context
  // (every stream of it, the caller's others too: a deadlock when one of them waits for work
  // the caller enqueues after the call returns).
  const auto context_waits = calls("cuCtxSynchronize");
  for (Mode mode : {load, into, scratch}) {
    Counts clean, made;
    std::size_t delivered = 0;
    ASSERT_TRUE(upload(mode, "", delivered, clean).ok());
    for (std::size_t i = 0; i < std::size(fns); ++i) {
      // At the first, the middle and the last call a clean upload makes (an upload's count
      // varies with how the readers race: a failure that did not fire is checked as a success).
      std::set<unsigned long long> at;
      if (clean[i] > 0) at = {1, (clean[i] + 1) / 2, clean[i]};
      for (unsigned long long n : at) {
        const std::string spec = std::string(fns[i]) + ":" + std::to_string(n);
        const std::string what = spec + " in mode " + std::to_string(mode);
        Leaks before(drv, true);
        delivered = 0;
        Status st = upload(mode, spec, delivered, made);
        if (made[i] >= n) {
          ++fired;
          EXPECT_EQ(st.kind(), ErrorKind::Cuda) << what << ": " << st.message();
          EXPECT_LE(delivered, requests.size()) << what;
        } else {
          EXPECT_TRUE(st.ok()) << what << ": " << st.message();
        }
        before.expect_none(what);
        EXPECT_EQ(calls("cuCtxSynchronize"), context_waits) << what;
        // The next upload works.
        delivered = 0;
        EXPECT_TRUE(upload(mode, "", delivered, made).ok()) << what;
        EXPECT_EQ(delivered, requests.size()) << what;
        expect_transformed(engine, f, requests, placed, what.c_str());
      }
    }
  }
  EXPECT_GT(fired, 30);
}

struct EngineFault {
  int code;
};

TEST(CudaStream, ACallbackThatFailsOrThrowsStopsTheUpload) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  OnDevice0 on_device0(drv);
  SlowCopies slow(drv, 300);
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 300));
  cuda::Uploader up(0, kTiny);
  auto planned = cuda::plan(f);
  const std::size_t bytes = planned.first;
  CallersBuffer dst(drv, bytes);
  Leaks before(drv, false);
  for (std::size_t stop_at : {std::size_t{0}, std::size_t{7}, std::size_t{250}}) {
    // nothrow: the callback's own status comes back, and no callback runs after it.
    auto stop = [&](std::size_t& calls) {
      return nc::OnLanded([&calls, stop_at](const cuda::Landed& t) -> Status {
        ++calls;
        if (t.index == stop_at)
          return Status(ErrorKind::Io, "engine out of memory at " + std::string(t.name));
        return {};
      });
    };
    const std::string message = "engine out of memory at " + f.keys()[stop_at];
    std::size_t calls = 0;
    auto a = nc::load(up, f, {}, stop(calls));
    EXPECT_EQ(a.status().kind(), ErrorKind::Io);
    EXPECT_EQ(a.status().message(), message);
    EXPECT_EQ(std::exchange(calls, 0), stop_at + 1);
    auto b = nc::load_into(up, f, {}, dst.at(), bytes, dst.on(), stop(calls));
    EXPECT_EQ(b.status().message(), message);
    EXPECT_EQ(std::exchange(calls, 0), stop_at + 1);
    auto c = nc::stream(up, f, {}, 8192, stop(calls), {.consumer_stream = 0});
    EXPECT_EQ(c.status().message(), message);
    EXPECT_EQ(std::exchange(calls, 0), stop_at + 1);

    // Throwing: the very exception comes back, once the upload has stopped.
    auto thrower = [stop_at](const cuda::Landed& t) {
      if (t.index == stop_at) throw EngineFault{static_cast<int>(stop_at)};
    };
    try {
      (void)up.load(f, {}, thrower);
      ADD_FAILURE() << "no exception";
    } catch (const EngineFault& e) {
      EXPECT_EQ(e.code, static_cast<int>(stop_at));
    }
    EXPECT_THROW((void)up.load_into(f, {}, dst.at(), bytes, dst.on(), thrower), EngineFault);
    EXPECT_THROW((void)up.stream(f, {}, 8192, thrower), EngineFault);
  }
  // A safetensors::Error thrown by a callback keeps its kind; anything else thrown into the
  // nothrow API is an Internal error naming it.
  EXPECT_EQ(kind_of([&] {
              (void)up.load(
                  f, {}, [](const cuda::Landed&) { throw safetensors::Error(ErrorKind::TypeMismatch, "x"); });
            }),
            ErrorKind::TypeMismatch);
  auto odd = nc::load(up, f, {}, [](const cuda::Landed&) -> Status { throw std::runtime_error("odd"); });
  EXPECT_EQ(odd.status().kind(), ErrorKind::Internal);
  EXPECT_NE(odd.status().message().find("odd"), std::string::npos);
  up.synchronize();
  before.expect_none("after callbacks that failed");
  EXPECT_EQ(up.load(f).placements().size(), f.size());
}

TEST(CudaStream, ACallbackMayCallTheLibraryButNotItsOwnUploader) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 30));
  SafeOpen other(many_tensors(dir, 5, "other.safetensors"));
  cuda::Uploader up(0, kTiny);
  cuda::Uploader second(0, kTiny);
  int calls = 0;
  auto loaded = up.load(f, {}, [&](const cuda::Landed& t) {
    if (calls++ != 3) return;
    EXPECT_EQ(download(t.data, t.byte_size).size(), t.byte_size);
    EXPECT_EQ(cuda::load(other).placements().size(), other.size());      // the shared uploader
    EXPECT_EQ(second.load(other).placements().size(), other.size());     // another uploader
    EXPECT_EQ(kind_of([&] { (void)up.load(other); }), ErrorKind::Cuda);  // its own: refused,
    EXPECT_EQ(kind_of([&] { up.synchronize(); }), ErrorKind::Cuda);      // not a deadlock
    EXPECT_EQ(nc::load(up, other).status().kind(), ErrorKind::Cuda);
    EXPECT_EQ(nc::stream(up, other, {}, 1, [](const cuda::Landed&) { return Status{}; }).status().kind(),
              ErrorKind::Cuda);
    // Further out in a chain of callbacks counts too: `up`'s callback runs `second`'s upload,
    // whose callback calls back into `up` (a deadlock if only the innermost were refused).
    int inner = 0;
    auto nested = second.load(other, {}, [&](const cuda::Landed&) {
      ++inner;
      EXPECT_EQ(kind_of([&] { up.synchronize(); }), ErrorKind::Cuda);
      EXPECT_EQ(kind_of([&] { (void)up.load(other); }), ErrorKind::Cuda);
      EXPECT_EQ(kind_of([&] { (void)second.load(other); }), ErrorKind::Cuda);
    });
    EXPECT_EQ(inner, static_cast<int>(other.size()));
    EXPECT_EQ(nested.placements().size(), other.size());
  });
  EXPECT_EQ(calls, static_cast<int>(f.size()));
  up.synchronize();  // fine again once the upload is over
  second.synchronize();
}

TEST(CudaStream, AnEmptyCallbackIsRefusedBeforeAnythingIsUploaded) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 3));
  cuda::Uploader up(0, kTiny);
  std::function<void(const cuda::Landed&)> none;
  auto refused = test::thrown([&] { (void)up.load(f, {}, none); });
  EXPECT_EQ(refused.kind(), ErrorKind::Cuda) << refused.message();
  EXPECT_NE(refused.message().find("callback"), std::string::npos) << refused.message();
  nc::OnLanded none_nothrow;
  EXPECT_EQ(nc::load(up, f, {}, none_nothrow).status().kind(), ErrorKind::Cuda);
  EXPECT_EQ(nc::stream(up, f, {}, 1 << 20, none_nothrow).status().kind(), ErrorKind::Cuda);
  EXPECT_EQ(up.load(f).placements().size(), f.size());  // the uploader still works
}

TEST(CudaStream, ThreadsStreamThroughOneUploaderAtOnce) {
  if (!test::gpu_or_skip()) return;
  test::TempDir dir;
  auto path = many_tensors(dir, 150);
  cuda::Uploader shared(0, kTiny);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      SafeOpen f(path, {i % 2 ? safetensors::Backend::Read : safetensors::Backend::Mmap});
      auto order = expected_order(f, {});
      auto check = [&](const cuda::Landed& t) {
        if (download(t.data, t.byte_size) != expected_bytes(f, order[t.index])) ++bad;
      };
      if (i % 3 == 0) (void)shared.load(f, {}, check);
      if (i % 3 == 1) (void)shared.stream(f, {}, 8192, check);
      if (i % 3 == 2) (void)shared.load(f, {}, check, {.consumer_stream = 0});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(CudaStream, NothrowTwinsMatchTheThrowingFaces) {
  if (!test::gpu_or_skip()) return;
  Driver drv;
  OnDevice0 on_device0(drv);
  test::TempDir dir;
  SafeOpen f(many_tensors(dir, 20));
  cuda::Uploader up(0, kTiny);
  auto planned = cuda::plan(f);
  const std::size_t bytes = planned.first;
  CallersBuffer dst(drv, bytes + 256);
  const nc::OnLanded quiet = [](const cuda::Landed&) { return Status{}; };
  const cuda::OnLanded loud = [](const cuda::Landed&) {};
  auto same = [](const Status& st, auto&& throwing, const char* what) {
    try {
      throwing();
      ADD_FAILURE() << what << ": no error";
    } catch (const safetensors::Error& e) {
      EXPECT_EQ(st.kind(), e.kind()) << what;
      EXPECT_EQ(st.message(), e.what()) << what;
    }
  };
  const std::vector<Request> missing{{"nope", {}}};
  const std::vector<Request> bad_slice{{"t00004", {Index::range(0, 1000)}}};
  for (const auto* requests : {&missing, &bad_slice}) {
    same(
        nc::load(up, f, *requests, quiet).status(), [&] { (void)up.load(f, *requests, loud); }, "load");
    same(
        nc::stream(up, f, *requests, 1, quiet).status(), [&] { (void)up.stream(f, *requests, 1, loud); },
        "stream");
  }
  EXPECT_EQ(nc::load(up, f, missing, quiet).status().kind(), ErrorKind::TensorNotFound);
  auto* misaligned = static_cast<std::byte*>(dst.at()) + 128;
  same(
      nc::load_into(up, f, {}, misaligned, bytes, dst.on(), quiet).status(),
      [&] { (void)up.load_into(f, {}, misaligned, bytes, dst.on(), loud); }, "load_into");
  same(
      nc::stream(up, f, {}, 1, quiet, {.deliver = cuda::Deliver::Enqueued}).status(),
      [&] { (void)up.stream(f, {}, 1, loud, {.deliver = cuda::Deliver::Enqueued}); },
      "stream without consumer");
  auto moved = std::move(up);
  EXPECT_EQ(nc::load(up, f, {}, quiet).status().kind(), ErrorKind::Internal);  // NOLINT: use after move
  EXPECT_EQ(kind_of([&] { (void)up.stream(f, {}, 1, loud); }), ErrorKind::Internal);  // NOLINT
  auto ok = nc::load(moved, f, {}, quiet, {.deliver = cuda::Deliver::Enqueued});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->placements().size(), f.size());
  auto ring = nc::stream(moved, f, {}, 0, quiet);
  ASSERT_TRUE(ring);
  EXPECT_GT(*ring, 0u);
}

}  // namespace
