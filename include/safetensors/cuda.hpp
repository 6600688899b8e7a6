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
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

namespace safetensors::detail {
/// A device ordinal for the bridge: a negative one is refused here, where its sign is still
/// known (as a size_t it would name device 18446744073709551615).
inline std::size_t device_ordinal(int device) {
  if (device < 0) {
    throw Error(ErrorKind::Cuda, "no CUDA device " + std::to_string(device) + ": device ordinals start at 0");
  }
  return static_cast<std::size_t>(device);
}

struct Access {
  static const Source& source(const SafeOpen& f) { return f.source(); }
  static Source source(const Checkpoint& c, std::string_view name) { return c.source_for(name); }
  static ffi::SliceIndex raw(const Index& i) { return i.raw(); }
  static const ffi::Checkpoint& checkpoint(const Checkpoint& c) { return *c.state_->ckpt; }
};
}  // namespace safetensors::detail

namespace safetensors::cuda {

struct UploadOptions {
  /// Staging buffers (pinned host memory) and their size (0: the defaults, see above).
  std::size_t staging_slots = 0;
  std::size_t slot_bytes = 0;
  /// Threads reading the files into the staging buffers (0: half the cores, at most 8).
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

}  // namespace safetensors::cuda

// Building upload jobs: private, as every `rust::` type stays out of the public API.
namespace safetensors::detail::cuda_jobs {
using Job = ::rust::Box<ffi::UploadJob>;
/// Makes `DeviceTensors` out of a finished job (defined after it).
struct Make;
using cuda::Placement;
using cuda::Request;

inline void add(Job& job, const Source& src, const Request& r) {
  if (r.select.empty()) {
    call([&] { job->add_tensor(*src.file, bytes(r.name)); });
    return;
  }
  std::vector<ffi::SliceIndex> raw;
  raw.reserve(r.select.size());
  for (const auto& i : r.select) raw.push_back(Access::raw(i));
  ::rust::Slice<const ffi::SliceIndex> s{raw.data(), raw.size()};
  call([&] { job->add_slice(*src.file, bytes(r.name), s); });
}

/// The job for `requests` (all tensors, in one bridge call, when empty) of a file or checkpoint.
template <class From>
Job job_for(const From& from, std::span<const Request> requests, std::size_t alignment) {
  auto job = ffi::new_upload_job(alignment);
  if (requests.empty()) {
    if constexpr (std::is_same_v<From, SafeOpen>) {
      call([&] { job->add_file(*Access::source(from).file); });
    } else {
      call([&] { job->add_checkpoint(Access::checkpoint(from)); });
    }
  }
  for (const auto& r : requests) {
    if constexpr (std::is_same_v<From, SafeOpen>) {
      add(job, Access::source(from), r);
    } else {
      add(job, Access::source(from, r.name), r);
    }
  }
  return job;
}

/// Every placement, in one bridge call.
inline std::vector<Placement> placements(const ffi::UploadJob& job) {
  auto raw = job.placements();
  std::vector<Placement> out;
  out.reserve(raw.size());
  for (const auto& p : raw) {
    out.push_back({std::string(p.name), static_cast<Dtype>(p.dtype),
                   std::vector<std::size_t>(p.shape.begin(), p.shape.end()),
                   static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.len)});
  }
  return out;
}
}  // namespace safetensors::detail::cuda_jobs

namespace safetensors::cuda {

/// Where each requested tensor (every tensor when `requests` is empty) would go in one
/// allocation, and the bytes it needs. Needs no GPU: use it to size your own buffer for
/// `Uploader::load_into`.
template <class Source>
requires std::is_same_v<Source, SafeOpen> || std::is_same_v<Source, Checkpoint>
[[nodiscard]] std::pair<std::size_t, std::vector<Placement>> plan(const Source& from,
                                                                  std::span<const Request> requests = {},
                                                                  UploadOptions options = {}) {
  auto job = detail::cuda_jobs::job_for(from, requests, options.alignment);
  return {job->total_bytes(), detail::cuda_jobs::placements(*job)};
}

/// Whether this build has the CUDA path (the `SAFETENSORS_CUDA` option).
[[nodiscard]] inline bool built() noexcept {
  return ffi::cuda_built();
}

/// Number of CUDA devices; throws `Error` (`Cuda`) when there is no driver, or no device.
[[nodiscard]] inline int device_count() {
  return static_cast<int>(detail::call([] { return ffi::cuda_device_count(); }));
}

/// Whether at least one device can be used; `why_unavailable()` says why not.
[[nodiscard]] inline bool available() noexcept {
  try {
    return device_count() > 0;
  } catch (...) {
    return false;
  }
}

/// Why CUDA cannot be used here ("" when it can).
[[nodiscard]] inline std::string why_unavailable() {
  try {
    return device_count() > 0 ? "" : "no CUDA device";
  } catch (const Error& e) {
    return e.what();
  }
}

[[nodiscard]] inline std::string device_name(int device) {
  auto name = detail::call([&] { return ffi::cuda_device_name(detail::device_ordinal(device)); });
  return std::string(name);
}

/// Copies `dst.size()` bytes of device memory at `src` to the host (synchronous).
inline void copy_to_host(const void* src, std::span<std::byte> dst, int device = 0) {
  ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()};
  detail::call([&] {
    ffi::cuda_download(detail::device_ordinal(device), reinterpret_cast<std::uintptr_t>(src), out);
  });
}

/// Seconds for one copy of `bytes` from pinned host memory to `device`: the link's practical
/// limit, for benchmarks.
[[nodiscard]] inline double pinned_copy_seconds(std::size_t bytes, int device = 0) {
  return detail::call([&] { return ffi::cuda_pinned_copy_seconds(detail::device_ordinal(device), bytes); });
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
      try {
        detail::call([&] {
          ffi::cuda_free(static_cast<std::size_t>(device_), reinterpret_cast<std::uintptr_t>(data_));
        });
      } catch (...) {  // nothing sensible to do in a destructor
      }
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
    auto it = index_.find(name);
    if (it == index_.end()) {
      throw Error(ErrorKind::TensorNotFound, "tensor `" + std::string(name) + "` was not uploaded");
    }
    return placements_[it->second];
  }

  /// The device address of `name`. Throws `Internal` once the buffer was given away
  /// (`release_buffer()`, or moved from): an offset from a null base would look like a device
  /// address. `at(name).offset` still gives the offset into the released buffer.
  [[nodiscard]] void* data(std::string_view name) const {
    if (buffer_.data() == nullptr) {
      throw Error(ErrorKind::Internal, "DeviceTensors::data(\"" + std::string(name) +
                                           "\"): this DeviceTensors holds no device memory (its buffer was "
                                           "released or moved away); add at(name).offset to the buffer's "
                                           "data() instead");
    }
    return static_cast<std::byte*>(buffer_.data()) + at(name).offset;
  }

 private:
  friend class Uploader;
  friend struct detail::cuda_jobs::Make;

  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  DeviceTensors(DeviceBuffer buffer, std::vector<Placement> placements)
      : buffer_(std::move(buffer)), placements_(std::move(placements)) {
    index_.reserve(placements_.size());
    for (std::size_t i = 0; i < placements_.size(); ++i) index_.emplace(placements_[i].name, i);
  }

  DeviceBuffer buffer_;
  std::vector<Placement> placements_;
  // Names to positions in `placements_` (a name requested twice maps to its first placement).
  std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index_;
};

/// Uploads to one device through a reusable pinned staging ring, allocated when it is made.
/// Safe to share between threads; uploads through one `Uploader` take turns (they share one
/// link to the device, which one upload already keeps busy).
class Uploader {
 public:
  explicit Uploader(int device = 0, UploadOptions options = {})
      : device_(device), options_(options), impl_(safetensors::detail::share(safetensors::detail::call([&] {
          return ffi::new_uploader(safetensors::detail::device_ordinal(device), options.staging_slots,
                                   options.slot_bytes, options.readers);
        }))) {}

  /// Every tensor of a file, into one new allocation; done when this returns.
  [[nodiscard]] DeviceTensors load(const SafeOpen& file) {
    return run(detail::cuda_jobs::job_for(file, {}, options_.alignment));
  }
  /// Chosen tensors or slices of a file.
  [[nodiscard]] DeviceTensors load(const SafeOpen& file, std::span<const Request> requests) {
    return run(detail::cuda_jobs::job_for(file, requests, options_.alignment));
  }
  /// Every tensor of a (sharded) checkpoint.
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt) {
    return run(detail::cuda_jobs::job_for(ckpt, {}, options_.alignment));
  }
  /// Chosen tensors or slices of a checkpoint.
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt, std::span<const Request> requests) {
    return run(detail::cuda_jobs::job_for(ckpt, requests, options_.alignment));
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
    return enqueue(detail::cuda_jobs::job_for(file, requests, options_.alignment), dst, capacity, stream);
  }
  std::vector<Placement> load_into(const Checkpoint& ckpt, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream) {
    return enqueue(detail::cuda_jobs::job_for(ckpt, requests, options_.alignment), dst, capacity, stream);
  }

  /// Waits for every copy this uploader has enqueued.
  void synchronize() {
    safetensors::detail::call([&] { impl_->synchronize(); });
  }

  /// Pinned host memory held by the staging ring.
  [[nodiscard]] std::size_t staging_bytes() const { return impl_->staging_bytes(); }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  using Job = detail::cuda_jobs::Job;

  [[nodiscard]] DeviceTensors run(const Job& job) {
    std::uint64_t ptr = safetensors::detail::call([&] { return impl_->upload(*job); });
    return DeviceTensors(
        DeviceBuffer(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), job->total_bytes(), device_),
        detail::cuda_jobs::placements(*job));
  }

  std::vector<Placement> enqueue(const Job& job, void* dst, std::size_t capacity, std::uintptr_t stream) {
    safetensors::detail::call(
        [&] { impl_->upload_into(*job, reinterpret_cast<std::uintptr_t>(dst), capacity, stream); });
    return detail::cuda_jobs::placements(*job);
  }

  int device_;
  UploadOptions options_;
  std::shared_ptr<const ffi::Uploader> impl_;
};

}  // namespace safetensors::cuda

namespace safetensors::detail::cuda_jobs {
struct Make {
  static cuda::DeviceTensors tensors(cuda::DeviceBuffer buffer, std::vector<Placement> placements) {
    return cuda::DeviceTensors(std::move(buffer), std::move(placements));
  }
  static cuda::DeviceTensors tensors(std::uint64_t ptr, const ffi::UploadJob& job, int device) {
    return cuda::DeviceTensors(cuda::DeviceBuffer(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)),
                                                  job.total_bytes(), device),
                               placements(job));
  }
};

/// Uploads `job` through the process's uploader for `device` (see the file comment).
inline cuda::DeviceTensors load_shared(int device, const Job& job) {
  std::uint64_t ptr = call([&] { return ffi::cuda_shared_upload(device_ordinal(device), *job); });
  return Make::tensors(ptr, *job, device);
}
}  // namespace safetensors::detail::cuda_jobs

namespace safetensors::cuda {

/// Whether `options` asks for the default ring (then one-shot calls share the device's uploader).
[[nodiscard]] inline bool default_ring(const UploadOptions& o) noexcept {
  return o.staging_slots == 0 && o.slot_bytes == 0 && o.readers == 0;
}

/// Every tensor of `file` on `device`, in one allocation. Uses the device's shared uploader
/// unless `options` sets a ring of its own.
[[nodiscard]] inline DeviceTensors load(const SafeOpen& file, int device = 0, UploadOptions options = {}) {
  if (!default_ring(options)) return Uploader(device, options).load(file);
  return detail::cuda_jobs::load_shared(device, detail::cuda_jobs::job_for(file, {}, options.alignment));
}

/// Every tensor of a (sharded) checkpoint on `device`, in one allocation.
[[nodiscard]] inline DeviceTensors load(const Checkpoint& ckpt, int device = 0, UploadOptions options = {}) {
  if (!default_ring(options)) return Uploader(device, options).load(ckpt);
  return detail::cuda_jobs::load_shared(device, detail::cuda_jobs::job_for(ckpt, {}, options.alignment));
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
  Request r{std::string(name), {}};
  std::span<const Request> one(&r, 1);
  auto loaded = default_ring(options) ? detail::cuda_jobs::load_shared(
                                            device, detail::cuda_jobs::job_for(file, one, options.alignment))
                                      : Uploader(device, options).load(file, one);
  auto p = loaded.placements().at(0);
  return {p.dtype, std::move(p.shape), loaded.release_buffer()};
}

}  // namespace safetensors::cuda
