// Loading tensors onto NVIDIA GPUs, at the speed of the link. No CUDA header is needed: device
// pointers cross as `void*`, streams as `std::uintptr_t` (a `cudaStream_t` is a `CUstream`).
//
//   safetensors::SafeOpen f("model.safetensors");
//   safetensors::cuda::DeviceTensors w = safetensors::cuda::load(f);   // one allocation, all tensors
//   void* wte = w.data("wte.weight");
//
// The driver is loaded at run time: a machine without a driver or a GPU gets `Error` with kind
// `Cuda` saying which, and `cuda::available()` is false. Uploads go through a ring of pinned
// staging buffers (by default readers + 4 slots of 16 MiB, readers = half the cores, at most 8:
// sized to keep a PCIe Gen5 link busy), filled by several reader threads, with asynchronous
// copies on a non-blocking stream; host memory stays bounded by the ring whatever the model's
// size, and the file itself is never page-locked.
//
// Contexts: the library uses each device's primary context (the one the CUDA runtime uses),
// retains it once for the life of the process (so memory it hands you stays valid after every
// `Uploader` is gone), and restores the calling thread's current context before returning.
// One-shot calls (`cuda::load`, `to_device`) share one uploader per device, created on first
// use, whose staging grows only to what uploads need.
//
// Streaming: `Uploader::load`, `load_into` and `stream` with a callback hand each tensor over as
// it lands in device memory (or as soon as its copies are enqueued, with an event to wait on), so
// an engine can transform it on its own stream while the rest is in flight; `stream` lands them
// in a bounded device scratch ring instead of one allocation holding them all.
//
// Every call that can fail has a twin in `safetensors::nothrow::cuda` returning the error as a
// value (`nothrow::cuda::load`, `nothrow::cuda::make_uploader`, ...).
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safetensors/checkpoint.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/safe_open.hpp"
#include "safetensors/slice.hpp"

namespace safetensors::inline SAFETENSORS_ABI::cuda {

struct UploadOptions {
  /// Staging buffers (pinned host memory) and their size (0: the defaults, see above); at most
  /// 1024 buffers (more are clamped).
  std::size_t staging_slots = 0;
  std::size_t slot_bytes = 0;
  /// Threads reading the files into the staging buffers (0: half the cores, at most 8; any
  /// value at most 64).
  unsigned readers = 0;
  /// Every tensor starts on a multiple of this many bytes of the allocation.
  std::size_t alignment = 256;
};

/// What to upload: a tensor, or a selection of it (empty `select`: the whole tensor).
struct Request {
  std::string name;
  std::vector<Index> select;
};

/// Where an uploaded tensor lives, relative to the start of the destination.
struct Placement {
  std::string name;
  Dtype dtype{};
  std::vector<std::size_t> shape;
  std::size_t offset = 0;
  std::size_t byte_size = 0;
};

/// When a streaming upload hands a tensor to its callback.
enum class Deliver : std::uint8_t {
  /// Once its bytes are in device memory: read them from any stream, or synchronously.
  Landed,
  /// As soon as its last copy is enqueued: order work on it after `Landed::event` (or let
  /// `LandingOptions::consumer_stream` do it), and never read it synchronously.
  Enqueued,
};

/// A tensor handed to a landing callback. Its views and its event are valid until the callback
/// returns.
struct Landed {
  /// Its position in the request list (in `keys()` order when every tensor is uploaded).
  std::size_t index = 0;
  std::string_view name;
  Dtype dtype{};
  std::span<const std::size_t> shape;
  /// Its bytes in device memory: in the destination, or in the scratch ring.
  void* data = nullptr;
  std::size_t byte_size = 0;
  /// A `CUevent` (`cudaEvent_t`) recorded on the copy stream after its last copy: wait on it
  /// (`cuStreamWaitEvent`) before the callback returns; the library reuses it afterwards.
  std::uintptr_t event = 0;
};

/// How a streaming upload hands tensors over.
struct LandingOptions {
  Deliver deliver = Deliver::Landed;
  /// A stream of the device's primary context (`cudaStreamCreate` after `cudaSetDevice`; 0 and
  /// `cudaStreamPerThread` too) that the library makes wait for each tensor's event before the
  /// callback runs, so that work the callback enqueues there sees the bytes. With `stream`'s
  /// scratch ring, the library records an event there after the callback returns and refills
  /// the tensor's region only once that event has completed.
  std::optional<std::uintptr_t> consumer_stream = std::nullopt;
};

/// A landing callback. It runs on the thread that called the upload, one tensor at a time, in
/// request order; an exception it throws stops the upload and is rethrown once every copy has
/// completed.
using OnLanded = std::function<void(const Landed&)>;

class DeviceBuffer;
class DeviceTensors;
class Uploader;
struct DeviceTensor;

}  // namespace safetensors::inline SAFETENSORS_ABI::cuda

namespace safetensors::inline SAFETENSORS_ABI::nothrow::cuda {
using safetensors::cuda::Deliver;
using safetensors::cuda::DeviceTensor;
using safetensors::cuda::DeviceTensors;
using safetensors::cuda::Landed;
using safetensors::cuda::LandingOptions;
using safetensors::cuda::Placement;
using safetensors::cuda::Request;
using safetensors::cuda::Uploader;
using safetensors::cuda::UploadOptions;

/// A landing callback of the nothrow API: a `Status` that is not `ok()` stops the upload, which
/// then returns that status. (An exception it throws anyway stops it too, as an `Error`'s own
/// kind and message, or `Internal`.)
using OnLanded = std::function<Status(const Landed&)>;

/// `cuda::device_count` without exceptions.
[[nodiscard]] Expected<int> device_count();
/// `cuda::device_name` without exceptions.
[[nodiscard]] Expected<std::string> device_name(int device);
/// `cuda::copy_to_host` without exceptions.
Status copy_to_host(const void* src, std::span<std::byte> dst, int device = 0);
/// `cuda::Uploader(device, options)` without exceptions.
///
///   auto up = safetensors::nothrow::cuda::make_uploader(0);
///   if (!up) std::puts(up.status().message().c_str());
[[nodiscard]] Expected<Uploader> make_uploader(int device = 0, UploadOptions options = {});
/// `Uploader::load` without exceptions (every tensor when `requests` is empty).
[[nodiscard]] Expected<DeviceTensors> load(Uploader& uploader, const SafeOpen& file,
                                           std::span<const Request> requests = {});
[[nodiscard]] Expected<DeviceTensors> load(Uploader& uploader, const Checkpoint& ckpt,
                                           std::span<const Request> requests = {});
/// `Uploader::load_into` without exceptions.
[[nodiscard]] Expected<std::vector<Placement>> load_into(Uploader& uploader, const SafeOpen& file,
                                                         std::span<const Request> requests, void* dst,
                                                         std::size_t capacity, std::uintptr_t stream);
[[nodiscard]] Expected<std::vector<Placement>> load_into(Uploader& uploader, const Checkpoint& ckpt,
                                                         std::span<const Request> requests, void* dst,
                                                         std::size_t capacity, std::uintptr_t stream);
/// `Uploader::synchronize` without exceptions.
Status synchronize(Uploader& uploader);
/// `cuda::load(file, device, options)` without exceptions.
///
///   auto w = safetensors::nothrow::cuda::load(f);
///   if (!w) std::puts(w.status().message().c_str());
[[nodiscard]] Expected<DeviceTensors> load(const SafeOpen& file, int device = 0, UploadOptions options = {});
[[nodiscard]] Expected<DeviceTensors> load(const Checkpoint& ckpt, int device = 0,
                                           UploadOptions options = {});
/// `cuda::to_device` without exceptions.
[[nodiscard]] Expected<DeviceTensor> to_device(const SafeOpen& file, std::string_view name, int device = 0,
                                               UploadOptions options = {});
/// `DeviceTensors::data` without exceptions.
[[nodiscard]] Expected<void*> data(const DeviceTensors& tensors, std::string_view name);
/// `DeviceTensors::at` without exceptions: a copy of `name`'s placement, or `TensorNotFound`.
[[nodiscard]] Expected<Placement> at(const DeviceTensors& tensors, std::string_view name);
/// `cuda::pinned_copy_seconds` without exceptions.
[[nodiscard]] Expected<double> pinned_copy_seconds(std::size_t bytes, int device = 0);
/// `Uploader::load` with a landing callback, without exceptions.
///
///   auto up = safetensors::nothrow::cuda::make_uploader(0);
///   auto w = safetensors::nothrow::cuda::load(*up, f, {}, [](const cuda::Landed& t) {
///     return t.byte_size > 0 ? Status{} : Status(ErrorKind::Internal, "empty");   // not ok(): stop
///   });
[[nodiscard]] Expected<DeviceTensors> load(Uploader& uploader, const SafeOpen& file,
                                           std::span<const Request> requests, const OnLanded& on_landed,
                                           LandingOptions options = {});
[[nodiscard]] Expected<DeviceTensors> load(Uploader& uploader, const Checkpoint& ckpt,
                                           std::span<const Request> requests, const OnLanded& on_landed,
                                           LandingOptions options = {});
/// `Uploader::load_into` with a landing callback, without exceptions.
[[nodiscard]] Expected<std::vector<Placement>> load_into(Uploader& uploader, const SafeOpen& file,
                                                         std::span<const Request> requests, void* dst,
                                                         std::size_t capacity, std::uintptr_t stream,
                                                         const OnLanded& on_landed,
                                                         LandingOptions options = {});
[[nodiscard]] Expected<std::vector<Placement>> load_into(Uploader& uploader, const Checkpoint& ckpt,
                                                         std::span<const Request> requests, void* dst,
                                                         std::size_t capacity, std::uintptr_t stream,
                                                         const OnLanded& on_landed,
                                                         LandingOptions options = {});
/// `Uploader::stream` without exceptions: the scratch ring's size, or the error.
Expected<std::size_t> stream(Uploader& uploader, const SafeOpen& file, std::span<const Request> requests,
                             std::size_t scratch_bytes, const OnLanded& on_landed,
                             LandingOptions options = {});
Expected<std::size_t> stream(Uploader& uploader, const Checkpoint& ckpt, std::span<const Request> requests,
                             std::size_t scratch_bytes, const OnLanded& on_landed,
                             LandingOptions options = {});
}  // namespace safetensors::inline SAFETENSORS_ABI::nothrow::cuda

namespace safetensors::inline SAFETENSORS_ABI::detail {
/// A device ordinal for the bridge: a negative one is refused here, where its sign is still
/// known (as a size_t it would name device 18446744073709551615).
inline Expected<std::size_t> device_ordinal(int device) {
  if (device < 0) {
    return Status(ErrorKind::Cuda,
                  "no CUDA device " + std::to_string(device) + ": device ordinals start at 0");
  }
  return static_cast<std::size_t>(device);
}
}  // namespace safetensors::inline SAFETENSORS_ABI::detail

// Building upload jobs: private, as every `rust::` type stays out of the public API.
namespace safetensors::inline SAFETENSORS_ABI::detail::cuda_jobs {
using Job = ::rust::Box<ffi::UploadJob>;
using cuda::Placement;
using cuda::Request;

inline Status add(Job& job, const Source& src, const Request& r) {
  if (r.select.empty()) {
    return attempt([&](ffi::Status& st) { job->add_tensor(*src.file, bytes(r.name), st); });
  }
  auto raw = raw_indices(std::span<const Index>(r.select.data(), r.select.size()));
  if (!raw) return raw.status();
  ::rust::Slice<const ffi::SliceIndex> s{raw->data(), raw->size()};
  return attempt([&](ffi::Status& st) { job->add_slice(*src.file, bytes(r.name), s, st); });
}

/// The job for `requests` (all tensors, in one bridge call, when empty) of a file or checkpoint.
inline Expected<Job> job_for(const SafeOpen& file, std::span<const Request> requests, std::size_t alignment) {
  auto src = Access<SafeOpen>::source(file);
  if (!src) return src.status();
  auto job = ffi::new_upload_job(alignment);
  if (requests.empty()) {
    if (auto st = attempt([&](ffi::Status& s) { job->add_file(*(*src)->file, s); }); !st.ok()) return st;
  }
  for (const auto& r : requests) {
    if (auto st = add(job, **src, r); !st.ok()) return st;
  }
  return job;
}

inline Expected<Job> job_for(const Checkpoint& ckpt, std::span<const Request> requests,
                             std::size_t alignment) {
  auto job = ffi::new_upload_job(alignment);
  if (requests.empty()) {
    auto c = Access<Checkpoint>::checkpoint(ckpt);
    if (!c) return c.status();
    // Every shard through the C++ publication path first (see `Access<Checkpoint>`).
    if (auto st = Access<Checkpoint>::open_every_shard(ckpt); !st.ok()) return st;
    if (auto st = attempt([&](ffi::Status& s) { job->add_checkpoint(**c, s); }); !st.ok()) return st;
  }
  for (const auto& r : requests) {
    auto src = Access<Checkpoint>::source_for(ckpt, r.name);
    if (!src) return src.status();
    if (auto st = add(job, *src, r); !st.ok()) return st;
  }
  return job;
}

/// Every placement, in one bridge call.
inline std::vector<Placement> placements(const ffi::UploadJob& job);
}  // namespace safetensors::inline SAFETENSORS_ABI::detail::cuda_jobs

// Streaming uploads: how the library calls a landing callback back, and how the throwing API
// passes a callback's exception through the bridge, which never throws.
namespace safetensors::inline SAFETENSORS_ABI::detail::landing {

/// What one streaming upload's callback needs, and why it stopped the upload (`ok()`: it did
/// not).
struct Sink {
  const nothrow::cuda::OnLanded* on_landed;
  const std::vector<cuda::Placement>* placements;
  Status stopped;
};

/// Calls the callback with tensor `t` (the library calls this, see `ffi::LandingSink`). Never
/// throws: an exception the callback throws is kept as the reason it stopped.
inline bool deliver(std::uintptr_t context, const ffi::LandedTensor* t) noexcept {
  auto& sink = *reinterpret_cast<Sink*>(context);
  if (t == nullptr || t->index >= sink.placements->size()) {
    sink.stopped =
        Status(ErrorKind::Internal, "a streaming upload handed over a tensor it was not asked for");
    return false;
  }
  const auto& p = (*sink.placements)[t->index];
  const cuda::Landed landed{t->index,
                            p.name,
                            p.dtype,
                            p.shape,
                            reinterpret_cast<void*>(static_cast<std::uintptr_t>(t->data)),
                            p.byte_size,
                            static_cast<std::uintptr_t>(t->event)};
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  try {
    sink.stopped = (*sink.on_landed)(landed);
  } catch (const Error& e) {
    sink.stopped = e.status();
  } catch (const std::exception& e) {
    sink.stopped = Status(ErrorKind::Internal, std::string("the landing callback threw: ") + e.what());
  } catch (...) {
    sink.stopped = Status(ErrorKind::Internal, "the landing callback threw an exception");
  }
#else
  sink.stopped = (*sink.on_landed)(landed);
#endif
  return sink.stopped.ok();
}

/// The bridge's view of `sink` and `options`.
inline ffi::LandingSink bridge_sink(Sink& sink, const cuda::LandingOptions& options) {
  return ffi::LandingSink{reinterpret_cast<std::size_t>(&deliver), reinterpret_cast<std::size_t>(&sink),
                          options.deliver == cuda::Deliver::Enqueued, options.consumer_stream.has_value(),
                          static_cast<std::uint64_t>(options.consumer_stream.value_or(0))};
}

/// The throwing face of a streaming call: runs `call` (its nothrow twin, given a nothrow
/// callback) with `on_landed`; an exception `on_landed` throws stops the upload and is rethrown
/// as it was once `call` has returned (every copy completed), else `.value()`.
template <class Call>
auto rethrowing(const cuda::OnLanded& on_landed, Call&& call) {
  // An empty callback is refused by the nothrow twin (`streaming`), before anything is copied.
  if (!on_landed) return std::forward<Call>(call)(nothrow::cuda::OnLanded{}).value();
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  std::exception_ptr thrown;
  nothrow::cuda::OnLanded guarded = [&](const cuda::Landed& t) -> Status {
    try {
      on_landed(t);
    } catch (...) {
      thrown = std::current_exception();
      return Status(ErrorKind::Internal, "the landing callback threw an exception");
    }
    return {};
  };
  auto result = std::forward<Call>(call)(guarded);
  if (thrown) std::rethrow_exception(thrown);
  return std::move(result).value();
#else
  nothrow::cuda::OnLanded plain = [&](const cuda::Landed& t) -> Status {
    on_landed(t);
    return {};
  };
  return std::forward<Call>(call)(plain).value();
#endif
}
}  // namespace safetensors::inline SAFETENSORS_ABI::detail::landing

namespace safetensors::inline SAFETENSORS_ABI::detail::cuda_jobs {
inline std::vector<Placement> placements(const ffi::UploadJob& job) {
  auto raw = job.placements();
  std::vector<Placement> out;
  out.reserve(raw.size());
  for (const auto& p : raw) {
    out.push_back({std::string(p.name), static_cast<Dtype>(p.dtype),
                   std::vector<std::size_t>(p.shape.data(), p.shape.data() + p.shape.size()),
                   static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.len)});
  }
  return out;
}
}  // namespace safetensors::inline SAFETENSORS_ABI::detail::cuda_jobs

namespace safetensors::inline SAFETENSORS_ABI::nothrow::cuda {
/// `cuda::plan` without exceptions.
template <class Source>
requires std::is_same_v<Source, SafeOpen> || std::is_same_v<Source, Checkpoint>
[[nodiscard]] Expected<std::pair<std::size_t, std::vector<Placement>>> plan(
    const Source& from, std::span<const Request> requests = {}, UploadOptions options = {}) {
  auto job = detail::cuda_jobs::job_for(from, requests, options.alignment);
  if (!job) return job.status();
  return std::pair{(*job)->total_bytes(), detail::cuda_jobs::placements(**job)};
}
}  // namespace safetensors::inline SAFETENSORS_ABI::nothrow::cuda

namespace safetensors::inline SAFETENSORS_ABI::cuda {

/// Where each requested tensor (every tensor when `requests` is empty) would go in one
/// allocation, and the bytes it needs. Needs no GPU: use it to size your own buffer for
/// `Uploader::load_into`.
template <class Source>
requires std::is_same_v<Source, SafeOpen> || std::is_same_v<Source, Checkpoint>
[[nodiscard]] std::pair<std::size_t, std::vector<Placement>> plan(const Source& from,
                                                                  std::span<const Request> requests = {},
                                                                  UploadOptions options = {}) {
  return nothrow::cuda::plan(from, requests, options).value();
}

/// Whether this build has the CUDA path (the `SAFETENSORS_CUDA` option).
[[nodiscard]] inline bool built() noexcept {
  return ffi::cuda_built();
}

/// Number of CUDA devices; throws `Error` (`Cuda`) when there is no driver, or no device.
[[nodiscard]] inline int device_count() {
  return nothrow::cuda::device_count().value();
}

/// Whether at least one device can be used; `why_unavailable()` says why not.
[[nodiscard]] inline bool available() noexcept {
  auto n = nothrow::cuda::device_count();
  return n && *n > 0;
}

/// Why CUDA cannot be used here ("" when it can).
[[nodiscard]] inline std::string why_unavailable() {
  auto n = nothrow::cuda::device_count();
  if (!n) return Error(n.status()).what();
  return *n > 0 ? "" : "no CUDA device";
}

[[nodiscard]] inline std::string device_name(int device) {
  return nothrow::cuda::device_name(device).value();
}

/// Copies `dst.size()` bytes of device memory at `src` to the host (synchronous).
inline void copy_to_host(const void* src, std::span<std::byte> dst, int device = 0) {
  nothrow::cuda::copy_to_host(src, dst, device).throw_if_error();
}

/// Seconds for one copy of `bytes` from pinned host memory to `device`: the link's practical
/// limit, for benchmarks.
[[nodiscard]] inline double pinned_copy_seconds(std::size_t bytes, int device = 0) {
  return nothrow::cuda::pinned_copy_seconds(bytes, device).value();
}

/// A device allocation this object owns (freed on destruction), unless released.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, std::size_t size, int device) : data_(data), size_(size), device_(device) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), device_(o.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }

  /// Gives the allocation to the caller, who frees it with `cuMemFree` (or `cudaFree`).
  [[nodiscard]] void* release() noexcept {
    size_ = 0;
    return std::exchange(data_, nullptr);
  }

 private:
  void reset() noexcept {
    if (data_ != nullptr) {
      // Nothing sensible to do with a failure in a destructor; the bridge does not throw.
      (void)detail::attempt([&](ffi::Status& st) {
        ffi::cuda_free(static_cast<std::size_t>(device_), reinterpret_cast<std::uintptr_t>(data_), st);
      });
      data_ = nullptr;
    }
  }

  void* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = 0;
};

/// Tensors uploaded into one allocation.
class DeviceTensors {
 public:
  DeviceTensors() = default;
  [[nodiscard]] const DeviceBuffer& buffer() const noexcept { return buffer_; }
  /// Gives the allocation to the caller (see `DeviceBuffer::release`).
  [[nodiscard]] DeviceBuffer release_buffer() noexcept { return std::move(buffer_); }
  [[nodiscard]] const std::vector<Placement>& placements() const noexcept { return placements_; }

  /// The placement of `name` (a hash lookup); throws `TensorNotFound`.
  [[nodiscard]] const Placement& at(std::string_view name) const {
    auto p = find(name);
    if (p == nullptr) not_uploaded(name).throw_if_error();
    return *p;
  }

  /// The device address of `name`. Throws `Internal` once the buffer was given away
  /// (`release_buffer()`, or moved from): an offset from a null base would look like a device
  /// address. `at(name).offset` still gives the offset into the released buffer.
  [[nodiscard]] void* data(std::string_view name) const { return nothrow::cuda::data(*this, name).value(); }

 private:
  friend struct detail::Access<DeviceTensors>;

  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  DeviceTensors(DeviceBuffer buffer, std::vector<Placement> placements)
      : buffer_(std::move(buffer)), placements_(std::move(placements)) {
    index_.reserve(placements_.size());
    for (std::size_t i = 0; i < placements_.size(); ++i) index_.emplace(placements_[i].name, i);
  }

  /// The placement of `name`, or null.
  [[nodiscard]] const Placement* find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &placements_[it->second];
  }

  static Status not_uploaded(std::string_view name) {
    return Status(ErrorKind::TensorNotFound, "tensor `" + std::string(name) + "` was not uploaded");
  }

  DeviceBuffer buffer_;
  std::vector<Placement> placements_;
  // Names to positions in `placements_` (a name requested twice maps to its first placement).
  std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index_;
};

}  // namespace safetensors::inline SAFETENSORS_ABI::cuda

namespace safetensors::inline SAFETENSORS_ABI::detail {
template <>
struct Access<cuda::DeviceTensors> {
  static cuda::DeviceTensors make(cuda::DeviceBuffer buffer, std::vector<cuda::Placement> placements) {
    return cuda::DeviceTensors(std::move(buffer), std::move(placements));
  }
  /// Tensors a finished job put at device address `ptr`.
  static cuda::DeviceTensors make(std::uint64_t ptr, const ffi::UploadJob& job, int device) {
    // The buffer owns the allocation before the placements are built: they allocate, and a
    // failure there must free the device memory, not leak it.
    cuda::DeviceBuffer buffer(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), job.total_bytes(),
                              device);
    return make(std::move(buffer), cuda_jobs::placements(job));
  }
  /// The placement of `name`, or `TensorNotFound`.
  static Expected<const cuda::Placement*> find(const cuda::DeviceTensors& t, std::string_view name) {
    const auto* p = t.find(name);
    if (p == nullptr) return cuda::DeviceTensors::not_uploaded(name);
    return p;
  }
  static Expected<void*> data(const cuda::DeviceTensors& t, std::string_view name) {
    if (t.buffer_.data() == nullptr) {
      return Status(ErrorKind::Internal, "DeviceTensors::data(\"" + std::string(name) +
                                             "\"): this DeviceTensors holds no device memory (its buffer was "
                                             "released or moved away); add at(name).offset to the buffer's "
                                             "data() instead");
    }
    const auto* p = t.find(name);
    if (p == nullptr) return cuda::DeviceTensors::not_uploaded(name);
    return static_cast<void*>(static_cast<std::byte*>(t.buffer_.data()) + p->offset);
  }
};
}  // namespace safetensors::inline SAFETENSORS_ABI::detail

namespace safetensors::inline SAFETENSORS_ABI::cuda {

/// Uploads to one device through a reusable pinned staging ring, allocated when it is made.
/// Safe to share between threads; uploads through one `Uploader` take turns (they share one
/// link to the device, which one upload already keeps busy).
class Uploader {
 public:
  explicit Uploader(int device = 0, UploadOptions options = {})
      : Uploader(nothrow::cuda::make_uploader(device, options).value()) {}

  /// Every tensor of a file, into one new allocation; done when this returns.
  [[nodiscard]] DeviceTensors load(const SafeOpen& file) { return nothrow::cuda::load(*this, file).value(); }
  /// Chosen tensors or slices of a file.
  [[nodiscard]] DeviceTensors load(const SafeOpen& file, std::span<const Request> requests) {
    return nothrow::cuda::load(*this, file, requests).value();
  }
  /// Every tensor of a (sharded) checkpoint.
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt) {
    return nothrow::cuda::load(*this, ckpt).value();
  }
  /// Chosen tensors or slices of a checkpoint.
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt, std::span<const Request> requests) {
    return nothrow::cuda::load(*this, ckpt, requests).value();
  }

  /// Uploads into `dst` (device memory of `capacity` bytes on this device, aligned to
  /// `options.alignment`) with copies on the caller's `stream`, a `cudaStream_t`/`CUstream` of
  /// this device's primary context. 0 is the legacy default stream; the per-thread default
  /// stream (`cudaStreamPerThread`) and streams capturing a graph are refused, as are a stream
  /// or destination of another device (`Error` with kind `Cuda`). Returns once every copy is
  /// enqueued; completion is visible on `stream`. The staging ring is reused only once its
  /// copies are done, so the next upload, `synchronize()` or the destructor waits for them. On
  /// an error, copies already enqueued still complete on `stream`: synchronise it before
  /// freeing `dst`.
  std::vector<Placement> load_into(const SafeOpen& file, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream) {
    return nothrow::cuda::load_into(*this, file, requests, dst, capacity, stream).value();
  }
  std::vector<Placement> load_into(const Checkpoint& ckpt, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream) {
    return nothrow::cuda::load_into(*this, ckpt, requests, dst, capacity, stream).value();
  }

  /// Every requested tensor (every tensor when `requests` is empty) in one new allocation, each
  /// handed to `on_landed` as it lands, in request order, on this thread; the engine transforms
  /// it while the rest is still in flight. Every copy has completed on return.
  ///
  ///   cuda::Uploader up(0);
  ///   auto w = up.load(f, {}, [&](const cuda::Landed& t) { std::printf("%zu landed\n", t.index); });
  [[nodiscard]] DeviceTensors load(const SafeOpen& file, std::span<const Request> requests,
                                   const OnLanded& on_landed, LandingOptions options = {}) {
    return detail::landing::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::load(*this, file, requests, cb, options);
    });
  }
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt, std::span<const Request> requests,
                                   const OnLanded& on_landed, LandingOptions options = {}) {
    return detail::landing::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::load(*this, ckpt, requests, cb, options);
    });
  }

  /// `load_into` (same checks of `dst` and `stream`, copies on `stream`), handing each tensor to
  /// `on_landed` as it lands. Returns once every copy has completed, successful or not.
  std::vector<Placement> load_into(const SafeOpen& file, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream, const OnLanded& on_landed,
                                   LandingOptions options = {}) {
    return detail::landing::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::load_into(*this, file, requests, dst, capacity, stream, cb, options);
    });
  }
  std::vector<Placement> load_into(const Checkpoint& ckpt, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream, const OnLanded& on_landed,
                                   LandingOptions options = {}) {
    return detail::landing::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::load_into(*this, ckpt, requests, dst, capacity, stream, cb, options);
    });
  }

  /// Streams the requested tensors through a device scratch ring of about `scratch_bytes`, for
  /// engines that transform each tensor into their own layout and cannot hold the checkpoint:
  /// `on_landed` gets each one in the ring, and its region is refilled once the callback has
  /// returned and, with `options.consumer_stream`, once the work it enqueued there by then has
  /// completed. The ring is max(`scratch_bytes`, largest tensor) rounded up to whole chunks
  /// (the slot size, or less for a smaller ring): the only device memory the upload allocates,
  /// freed before returning. Returns its size.
  ///
  ///   cuda::Uploader up(0);
  ///   up.stream(f, {}, 64 << 20, [&](const cuda::Landed& t) { std::printf("%zu bytes\n", t.byte_size); });
  std::size_t stream(const SafeOpen& file, std::span<const Request> requests, std::size_t scratch_bytes,
                     const OnLanded& on_landed, LandingOptions options = {}) {
    return detail::landing::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::stream(*this, file, requests, scratch_bytes, cb, options);
    });
  }
  std::size_t stream(const Checkpoint& ckpt, std::span<const Request> requests, std::size_t scratch_bytes,
                     const OnLanded& on_landed, LandingOptions options = {}) {
    return detail::landing::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::stream(*this, ckpt, requests, scratch_bytes, cb, options);
    });
  }

  /// Waits for every copy this uploader has enqueued.
  void synchronize() { nothrow::cuda::synchronize(*this).throw_if_error(); }

  /// Pinned host memory held by the staging ring.
  [[nodiscard]] std::size_t staging_bytes() const { return impl().staging_bytes(); }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  friend struct detail::Access<Uploader>;

  Uploader(int device, UploadOptions options, std::shared_ptr<const ffi::Uploader> impl)
      : device_(device), options_(options), impl_(std::move(impl)) {}

  /// The ring; a moved-from Uploader reports `Internal` the throwing way.
  [[nodiscard]] const ffi::Uploader& impl() const {
    if (!impl_) detail::moved_from("Uploader").throw_if_error();
    return *impl_;
  }

  int device_;
  UploadOptions options_;
  std::shared_ptr<const ffi::Uploader> impl_;
};

}  // namespace safetensors::inline SAFETENSORS_ABI::cuda

namespace safetensors::inline SAFETENSORS_ABI::detail {
template <>
struct Access<cuda::Uploader> {
  static Expected<cuda::Uploader> make(int device, cuda::UploadOptions options) {
    auto ordinal = device_ordinal(device);
    if (!ordinal) return ordinal.status();
    auto impl = adopt(attempt([&](ffi::Status& st) {
      return ffi::new_uploader(*ordinal, options.staging_slots, options.slot_bytes, options.readers, st);
    }));
    if (!impl) return impl.status();
    return cuda::Uploader(device, options, share(std::move(*impl)));
  }

  /// Every tensor (empty `requests`) or the requested ones of a file or checkpoint, into a new
  /// allocation, complete on return.
  template <class From>
  static Expected<cuda::DeviceTensors> load(cuda::Uploader& up, const From& from,
                                            std::span<const cuda::Request> requests) {
    if (!up.impl_) return moved_from("Uploader");
    auto job = cuda_jobs::job_for(from, requests, up.options_.alignment);
    if (!job) return job.status();
    auto ptr = attempt([&](ffi::Status& st) { return up.impl_->upload(**job, st); });
    if (!ptr) return ptr.status();
    return Access<cuda::DeviceTensors>::make(*ptr, **job, up.device_);
  }

  template <class From>
  static Expected<std::vector<cuda::Placement>> load_into(cuda::Uploader& up, const From& from,
                                                          std::span<const cuda::Request> requests, void* dst,
                                                          std::size_t capacity, std::uintptr_t stream) {
    if (!up.impl_) return moved_from("Uploader");
    auto job = cuda_jobs::job_for(from, requests, up.options_.alignment);
    if (!job) return job.status();
    auto st = attempt([&](ffi::Status& s) {
      up.impl_->upload_into(**job, reinterpret_cast<std::uintptr_t>(dst), capacity, stream, s);
    });
    if (!st.ok()) return st;
    return cuda_jobs::placements(**job);
  }

  static Status synchronize(cuda::Uploader& up) {
    if (!up.impl_) return moved_from("Uploader");
    return attempt([&](ffi::Status& st) { up.impl_->synchronize(st); });
  }

  /// A streaming upload of `requests` of `from`: `run(impl, job, sink)` makes the bridge call.
  /// Returns the job's placements and `run`'s result, or why the callback stopped the upload.
  template <class From, class Run>
  static auto streaming(cuda::Uploader& up, const From& from, std::span<const cuda::Request> requests,
                        const nothrow::cuda::OnLanded& on_landed, const cuda::LandingOptions& options,
                        Run&& run) -> Expected<std::pair<std::vector<cuda::Placement>, std::uint64_t>> {
    // Kept alive here: the callback may destroy `up`.
    std::shared_ptr<const ffi::Uploader> impl = up.impl_;
    if (!impl) return moved_from("Uploader");
    if (!on_landed) {
      return Status(
          ErrorKind::Cuda,
          "a streaming upload needs a landing callback, and this one is empty (a default-constructed "
          "or moved-from std::function): pass one, or call load() without a callback");
    }
    auto job = cuda_jobs::job_for(from, requests, up.options_.alignment);
    if (!job) return job.status();
    auto placements = cuda_jobs::placements(**job);
    landing::Sink sink{&on_landed, &placements, {}};
    const auto bridge = landing::bridge_sink(sink, options);
    auto out = attempt([&](ffi::Status& st) -> std::uint64_t { return run(*impl, **job, bridge, st); });
    if (!sink.stopped.ok()) return sink.stopped;
    if (!out) return out.status();
    return std::pair{std::move(placements), *out};
  }

  template <class From>
  static Expected<cuda::DeviceTensors> load(cuda::Uploader& up, const From& from,
                                            std::span<const cuda::Request> requests,
                                            const nothrow::cuda::OnLanded& on_landed,
                                            const cuda::LandingOptions& options) {
    const int device = up.device_;
    std::size_t total = 0;
    auto done = streaming(up, from, requests, on_landed, options,
                          [&](const ffi::Uploader& impl, const ffi::UploadJob& job,
                              const ffi::LandingSink& sink, ffi::Status& st) {
                            total = job.total_bytes();
                            return impl.upload_landing(job, sink, st);
                          });
    if (!done) return done.status();
    auto* ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(done->second));
    return Access<cuda::DeviceTensors>::make(cuda::DeviceBuffer(ptr, total, device), std::move(done->first));
  }

  template <class From>
  static Expected<std::vector<cuda::Placement>> load_into(cuda::Uploader& up, const From& from,
                                                          std::span<const cuda::Request> requests, void* dst,
                                                          std::size_t capacity, std::uintptr_t stream,
                                                          const nothrow::cuda::OnLanded& on_landed,
                                                          const cuda::LandingOptions& options) {
    auto done = streaming(up, from, requests, on_landed, options,
                          [&](const ffi::Uploader& impl, const ffi::UploadJob& job,
                              const ffi::LandingSink& sink, ffi::Status& st) {
                            impl.upload_into_landing(job, reinterpret_cast<std::uintptr_t>(dst), capacity,
                                                     stream, sink, st);
                            return std::uint64_t{0};
                          });
    if (!done) return done.status();
    return std::move(done->first);
  }

  template <class From>
  static Expected<std::size_t> stream(cuda::Uploader& up, const From& from,
                                      std::span<const cuda::Request> requests, std::size_t scratch_bytes,
                                      const nothrow::cuda::OnLanded& on_landed,
                                      const cuda::LandingOptions& options) {
    auto done =
        streaming(up, from, requests, on_landed, options,
                  [&](const ffi::Uploader& impl, const ffi::UploadJob& job, const ffi::LandingSink& sink,
                      ffi::Status& st) { return impl.upload_scratch(job, scratch_bytes, sink, st); });
    if (!done) return done.status();
    return static_cast<std::size_t>(done->second);
  }
};

namespace cuda_jobs {
/// Uploads every tensor (empty `requests`) or the requested ones through the process's uploader
/// for `device` (see the file comment).
template <class From>
Expected<cuda::DeviceTensors> load_shared(int device, const From& from, std::span<const Request> requests,
                                          std::size_t alignment) {
  auto ordinal = device_ordinal(device);
  if (!ordinal) return ordinal.status();
  auto job = job_for(from, requests, alignment);
  if (!job) return job.status();
  auto ptr = attempt([&](ffi::Status& st) { return ffi::cuda_shared_upload(*ordinal, **job, st); });
  if (!ptr) return ptr.status();
  return Access<cuda::DeviceTensors>::make(*ptr, **job, device);
}
}  // namespace cuda_jobs
}  // namespace safetensors::inline SAFETENSORS_ABI::detail

namespace safetensors::inline SAFETENSORS_ABI::cuda {

/// Whether `options` asks for the default ring (then one-shot calls share the device's uploader).
[[nodiscard]] inline bool default_ring(const UploadOptions& o) noexcept {
  return o.staging_slots == 0 && o.slot_bytes == 0 && o.readers == 0;
}

/// Every tensor of `file` on `device`, in one allocation. Uses the device's shared uploader
/// unless `options` sets a ring of its own.
[[nodiscard]] inline DeviceTensors load(const SafeOpen& file, int device = 0, UploadOptions options = {}) {
  return nothrow::cuda::load(file, device, options).value();
}

/// Every tensor of a (sharded) checkpoint on `device`, in one allocation.
[[nodiscard]] inline DeviceTensors load(const Checkpoint& ckpt, int device = 0, UploadOptions options = {}) {
  return nothrow::cuda::load(ckpt, device, options).value();
}

/// One tensor in a new device allocation.
struct DeviceTensor {
  Dtype dtype{};
  std::vector<std::size_t> shape;
  DeviceBuffer buffer;
  [[nodiscard]] void* data() const noexcept { return buffer.data(); }
  [[nodiscard]] std::size_t byte_size() const noexcept { return buffer.size(); }
};

[[nodiscard]] inline DeviceTensor to_device(const SafeOpen& file, std::string_view name, int device = 0,
                                            UploadOptions options = {}) {
  return nothrow::cuda::to_device(file, name, device, options).value();
}

}  // namespace safetensors::inline SAFETENSORS_ABI::cuda

namespace safetensors::inline SAFETENSORS_ABI::nothrow::cuda {

inline Expected<int> device_count() {
  auto n = detail::attempt([](ffi::Status& st) { return ffi::cuda_device_count(st); });
  if (!n) return n.status();
  return static_cast<int>(*n);
}

inline Expected<std::string> device_name(int device) {
  auto ordinal = detail::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  auto name = detail::attempt([&](ffi::Status& st) { return ffi::cuda_device_name(*ordinal, st); });
  if (!name) return name.status();
  return std::string(name->data(), name->size());
}

inline Status copy_to_host(const void* src, std::span<std::byte> dst, int device) {
  auto ordinal = detail::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  // Device memory the host can address (managed memory, the emulated driver) could be `dst`
  // itself: a copy onto itself is refused like every overlapping output.
  const std::span<const std::byte> from{static_cast<const std::byte*>(src), dst.size()};
  if (auto st = detail::refuse_overlap("copy_to_host", from, dst); !st.ok()) return st;
  ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()};
  return detail::attempt(
      [&](ffi::Status& st) { ffi::cuda_download(*ordinal, reinterpret_cast<std::uintptr_t>(src), out, st); });
}

inline Expected<Uploader> make_uploader(int device, UploadOptions options) {
  return detail::Access<Uploader>::make(device, options);
}

inline Expected<DeviceTensors> load(Uploader& uploader, const SafeOpen& file,
                                    std::span<const Request> requests) {
  return detail::Access<Uploader>::load(uploader, file, requests);
}

inline Expected<DeviceTensors> load(Uploader& uploader, const Checkpoint& ckpt,
                                    std::span<const Request> requests) {
  return detail::Access<Uploader>::load(uploader, ckpt, requests);
}

inline Expected<std::vector<Placement>> load_into(Uploader& uploader, const SafeOpen& file,
                                                  std::span<const Request> requests, void* dst,
                                                  std::size_t capacity, std::uintptr_t stream) {
  return detail::Access<Uploader>::load_into(uploader, file, requests, dst, capacity, stream);
}

inline Expected<std::vector<Placement>> load_into(Uploader& uploader, const Checkpoint& ckpt,
                                                  std::span<const Request> requests, void* dst,
                                                  std::size_t capacity, std::uintptr_t stream) {
  return detail::Access<Uploader>::load_into(uploader, ckpt, requests, dst, capacity, stream);
}

inline Status synchronize(Uploader& uploader) {
  return detail::Access<Uploader>::synchronize(uploader);
}

inline Expected<DeviceTensors> load(const SafeOpen& file, int device, UploadOptions options) {
  if (!safetensors::cuda::default_ring(options)) {
    auto up = make_uploader(device, options);
    if (!up) return up.status();
    return load(*up, file);
  }
  return detail::cuda_jobs::load_shared(device, file, {}, options.alignment);
}

inline Expected<DeviceTensors> load(const Checkpoint& ckpt, int device, UploadOptions options) {
  if (!safetensors::cuda::default_ring(options)) {
    auto up = make_uploader(device, options);
    if (!up) return up.status();
    return load(*up, ckpt);
  }
  return detail::cuda_jobs::load_shared(device, ckpt, {}, options.alignment);
}

inline Expected<DeviceTensor> to_device(const SafeOpen& file, std::string_view name, int device,
                                        UploadOptions options) {
  Request r{std::string(name), {}};
  std::span<const Request> one(&r, 1);
  auto loaded = [&]() -> Expected<DeviceTensors> {
    if (safetensors::cuda::default_ring(options)) {
      return detail::cuda_jobs::load_shared(device, file, one, options.alignment);
    }
    auto up = make_uploader(device, options);
    if (!up) return up.status();
    return load(*up, file, one);
  }();
  if (!loaded) return loaded.status();
  if (loaded->placements().empty()) {
    return Status(ErrorKind::Internal,
                  "to_device(\"" + std::string(name) + "\"): the upload placed no tensor");
  }
  auto p = loaded->placements().front();
  return DeviceTensor{p.dtype, std::move(p.shape), loaded->release_buffer()};
}

inline Expected<void*> data(const DeviceTensors& tensors, std::string_view name) {
  return detail::Access<DeviceTensors>::data(tensors, name);
}

inline Expected<Placement> at(const DeviceTensors& tensors, std::string_view name) {
  auto p = detail::Access<DeviceTensors>::find(tensors, name);
  if (!p) return p.status();
  return **p;
}

inline Expected<double> pinned_copy_seconds(std::size_t bytes, int device) {
  auto ordinal = detail::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  return detail::attempt([&](ffi::Status& st) { return ffi::cuda_pinned_copy_seconds(*ordinal, bytes, st); });
}

inline Expected<DeviceTensors> load(Uploader& uploader, const SafeOpen& file,
                                    std::span<const Request> requests, const OnLanded& on_landed,
                                    LandingOptions options) {
  return detail::Access<Uploader>::load(uploader, file, requests, on_landed, options);
}

inline Expected<DeviceTensors> load(Uploader& uploader, const Checkpoint& ckpt,
                                    std::span<const Request> requests, const OnLanded& on_landed,
                                    LandingOptions options) {
  return detail::Access<Uploader>::load(uploader, ckpt, requests, on_landed, options);
}

inline Expected<std::vector<Placement>> load_into(Uploader& uploader, const SafeOpen& file,
                                                  std::span<const Request> requests, void* dst,
                                                  std::size_t capacity, std::uintptr_t stream,
                                                  const OnLanded& on_landed, LandingOptions options) {
  return detail::Access<Uploader>::load_into(uploader, file, requests, dst, capacity, stream, on_landed,
                                             options);
}

inline Expected<std::vector<Placement>> load_into(Uploader& uploader, const Checkpoint& ckpt,
                                                  std::span<const Request> requests, void* dst,
                                                  std::size_t capacity, std::uintptr_t stream,
                                                  const OnLanded& on_landed, LandingOptions options) {
  return detail::Access<Uploader>::load_into(uploader, ckpt, requests, dst, capacity, stream, on_landed,
                                             options);
}

inline Expected<std::size_t> stream(Uploader& uploader, const SafeOpen& file,
                                    std::span<const Request> requests, std::size_t scratch_bytes,
                                    const OnLanded& on_landed, LandingOptions options) {
  return detail::Access<Uploader>::stream(uploader, file, requests, scratch_bytes, on_landed, options);
}

inline Expected<std::size_t> stream(Uploader& uploader, const Checkpoint& ckpt,
                                    std::span<const Request> requests, std::size_t scratch_bytes,
                                    const OnLanded& on_landed, LandingOptions options) {
  return detail::Access<Uploader>::stream(uploader, ckpt, requests, scratch_bytes, on_landed, options);
}

}  // namespace safetensors::inline SAFETENSORS_ABI::nothrow::cuda
