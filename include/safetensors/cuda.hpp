// Loading tensors onto NVIDIA GPUs, at the speed of the link. No CUDA header is needed: device
// pointers cross as `void*`, streams as `std::uintptr_t` (a `cudaStream_t` is a `CUstream`).
//
//   safetensors::SafeOpen f("model.safetensors");
//   safetensors::cuda::DeviceTensors w = safetensors::cuda::load(f);   // one allocation, all tensors
//   void* wte = w.data("wte.weight");
//
// The driver is loaded at run time: a machine without a driver or a GPU gets `Error` with kind
// `Cuda` saying which, and `cuda::available()` is false. Uploads go through a small ring of
// pinned staging buffers (4 x 32 MiB by default), filled by several reader threads, with
// asynchronous copies on a non-blocking stream; host memory stays bounded by the ring whatever
// the model's size, and the file itself is never page-locked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/checkpoint.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/safe_open.hpp"
#include "safetensors/slice.hpp"

namespace safetensors::detail {
struct Access {
  static const Source& source(const SafeOpen& f) { return f.source(); }
  static Source source(const Checkpoint& c, std::string_view name) { return c.source_for(name); }
  static ffi::SliceIndex raw(const Index& i) { return i.raw(); }
};
}  // namespace safetensors::detail

namespace safetensors::cuda {

struct UploadOptions {
  /// Staging buffers (pinned host memory) and their size.
  std::size_t staging_slots = 4;
  std::size_t slot_bytes = std::size_t{32} << 20;
  /// Threads reading the files into the staging buffers (0: up to 4).
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

namespace jobs {
using Job = ::rust::Box<ffi::UploadJob>;

inline void add(Job& job, const safetensors::detail::Source& src, const Request& r) {
  using safetensors::detail::call;
  if (r.select.empty()) {
    call([&] { job->add_tensor(*src.file, safetensors::detail::bytes(r.name)); });
    return;
  }
  std::vector<ffi::SliceIndex> raw;
  for (const auto& i : r.select) raw.push_back(safetensors::detail::Access::raw(i));
  ::rust::Slice<const ffi::SliceIndex> s{raw.data(), raw.size()};
  call([&] { job->add_slice(*src.file, safetensors::detail::bytes(r.name), s); });
}

/// The job for `requests` (all tensors when empty) of a file or checkpoint.
template <class Source>
Job job_for(const Source& from, std::span<const Request> requests, std::size_t alignment) {
  using safetensors::detail::Access;
  auto job = ffi::new_upload_job(alignment);
  auto source_of = [&](const std::string& name) {
    if constexpr (std::is_same_v<Source, SafeOpen>) {
      return Access::source(from);
    } else {
      return Access::source(from, name);
    }
  };
  if (requests.empty()) {
    for (const auto& k : from.keys()) add(job, source_of(k), Request{k, {}});
  }
  for (const auto& r : requests) add(job, source_of(r.name), r);
  return job;
}

inline std::vector<Placement> placements(const ffi::UploadJob& job) {
  std::vector<Placement> out;
  out.reserve(job.placement_count());
  for (std::size_t i = 0; i < job.placement_count(); ++i) {
    auto p = job.placement(i);
    auto shape = job.placement_shape(i);
    out.push_back({std::string(safetensors::detail::view(job.placement_name(i))), static_cast<Dtype>(p.dtype),
                   {shape.data(), shape.data() + shape.size()}, static_cast<std::size_t>(p.offset),
                   static_cast<std::size_t>(p.len)});
  }
  return out;
}
}  // namespace jobs

/// Where each requested tensor (every tensor when `requests` is empty) would go in one
/// allocation, and the bytes it needs. Needs no GPU: use it to size your own buffer for
/// `Uploader::load_into`.
template <class Source>
  requires std::is_same_v<Source, SafeOpen> || std::is_same_v<Source, Checkpoint>
[[nodiscard]] std::pair<std::size_t, std::vector<Placement>> plan(const Source& from,
                                                                  std::span<const Request> requests = {},
                                                                  UploadOptions options = {}) {
  auto job = jobs::job_for(from, requests, options.alignment);
  return {job->total_bytes(), jobs::placements(*job)};
}

/// Whether this build has the CUDA path (the `SAFETENSORS_CUDA` option).
[[nodiscard]] inline bool built() noexcept { return ffi::cuda_built(); }

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
  auto name = detail::call([&] { return ffi::cuda_device_name(static_cast<std::size_t>(device)); });
  return std::string(name);
}

/// Copies `dst.size()` bytes of device memory at `src` to the host (synchronous).
inline void copy_to_host(const void* src, std::span<std::byte> dst, int device = 0) {
  ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()};
  detail::call([&] {
    ffi::cuda_download(static_cast<std::size_t>(device), reinterpret_cast<std::uintptr_t>(src), out);
  });
}

/// Seconds for one copy of `bytes` from pinned host memory to `device`: the link's practical
/// limit, for benchmarks.
[[nodiscard]] inline double pinned_copy_seconds(std::size_t bytes, int device = 0) {
  return detail::call([&] { return ffi::cuda_pinned_copy_seconds(static_cast<std::size_t>(device), bytes); });
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
  [[nodiscard]] const DeviceBuffer& buffer() const noexcept { return buffer_; }
  /// Gives the allocation to the caller (see `DeviceBuffer::release`).
  [[nodiscard]] DeviceBuffer release_buffer() noexcept { return std::move(buffer_); }
  [[nodiscard]] const std::vector<Placement>& placements() const noexcept { return placements_; }

  /// The placement of `name`; throws `TensorNotFound`.
  [[nodiscard]] const Placement& at(std::string_view name) const {
    for (const auto& p : placements_) {
      if (p.name == name) return p;
    }
    throw Error(ErrorKind::TensorNotFound, "tensor `" + std::string(name) + "` was not uploaded");
  }

  /// The device address of `name`.
  [[nodiscard]] void* data(std::string_view name) const {
    return static_cast<std::byte*>(buffer_.data()) + at(name).offset;
  }

 private:
  friend class Uploader;
  DeviceBuffer buffer_;
  std::vector<Placement> placements_;
};

/// Uploads to one device through a reusable pinned staging ring. Thread-safe to share, but
/// uploads through one `Uploader` take turns; use one per thread to load in parallel.
class Uploader {
 public:
  explicit Uploader(int device = 0, UploadOptions options = {})
      : device_(device),
        options_(options),
        impl_(safetensors::detail::share(safetensors::detail::call([&] {
          return ffi::new_uploader(static_cast<std::size_t>(device), options.staging_slots, options.slot_bytes,
                                   options.readers);
        }))) {}

  /// Every tensor of a file, into one new allocation; done when this returns.
  [[nodiscard]] DeviceTensors load(const SafeOpen& file) { return run(jobs::job_for(file, {}, options_.alignment)); }
  /// Chosen tensors or slices of a file.
  [[nodiscard]] DeviceTensors load(const SafeOpen& file, std::span<const Request> requests) {
    return run(jobs::job_for(file, requests, options_.alignment));
  }
  /// Every tensor of a (sharded) checkpoint.
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt) { return run(jobs::job_for(ckpt, {}, options_.alignment)); }
  /// Chosen tensors or slices of a checkpoint.
  [[nodiscard]] DeviceTensors load(const Checkpoint& ckpt, std::span<const Request> requests) {
    return run(jobs::job_for(ckpt, requests, options_.alignment));
  }

  /// Uploads into `dst` (device memory of `capacity` bytes on this device) with copies on the
  /// caller's `stream`. Returns once every copy is enqueued; completion is visible on `stream`.
  /// The staging ring is reused only once its copies are done, so the next upload,
  /// `synchronize()` or the destructor waits for them.
  std::vector<Placement> load_into(const SafeOpen& file, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream) {
    return enqueue(jobs::job_for(file, requests, options_.alignment), dst, capacity, stream);
  }
  std::vector<Placement> load_into(const Checkpoint& ckpt, std::span<const Request> requests, void* dst,
                                   std::size_t capacity, std::uintptr_t stream) {
    return enqueue(jobs::job_for(ckpt, requests, options_.alignment), dst, capacity, stream);
  }

  /// Waits for every copy this uploader has enqueued.
  void synchronize() {
    safetensors::detail::call([&] { impl_->synchronize(); });
  }

  /// Pinned host memory held by the staging ring.
  [[nodiscard]] std::size_t staging_bytes() const { return impl_->staging_bytes(); }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  using Job = jobs::Job;

  [[nodiscard]] DeviceTensors run(const Job& job) {
    std::uint64_t ptr = safetensors::detail::call([&] { return impl_->upload(*job); });
    DeviceTensors out;
    out.buffer_ = DeviceBuffer(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), job->total_bytes(), device_);
    out.placements_ = jobs::placements(*job);
    return out;
  }

  std::vector<Placement> enqueue(const Job& job, void* dst, std::size_t capacity, std::uintptr_t stream) {
    safetensors::detail::call(
        [&] { impl_->upload_into(*job, reinterpret_cast<std::uintptr_t>(dst), capacity, stream); });
    return jobs::placements(*job);
  }

  int device_;
  UploadOptions options_;
  std::shared_ptr<const ffi::Uploader> impl_;
};

/// Every tensor of `file` on `device`, in one allocation.
[[nodiscard]] inline DeviceTensors load(const SafeOpen& file, int device = 0, UploadOptions options = {}) {
  return Uploader(device, options).load(file);
}

/// Every tensor of a (sharded) checkpoint on `device`, in one allocation.
[[nodiscard]] inline DeviceTensors load(const Checkpoint& ckpt, int device = 0, UploadOptions options = {}) {
  return Uploader(device, options).load(ckpt);
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
  auto loaded = Uploader(device, options).load(file, std::span<const Request>(&r, 1));
  auto p = loaded.placements().at(0);
  return {p.dtype, std::move(p.shape), loaded.release_buffer()};
}

}  // namespace safetensors::cuda
