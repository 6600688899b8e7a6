// Device memory and the uploader (safetensors/cuda.hpp has the free functions): a device
// allocation (`DeviceBuffer`), tensors uploaded into one (`DeviceTensors`, `DeviceTensor`), and
// `Uploader`, which loads what it is asked to read from a file or a checkpoint through a pinned
// staging ring, whole or handing each tensor over as it lands.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safetensors/cuda_options.hpp"
#include "safetensors/detail/cuda.hpp"
#include "safetensors/request.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace cuda {
class DeviceTensors;
class Uploader;
}  // namespace cuda
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace nothrow {
namespace cuda {
using safetensors::cuda::DeviceTensors;
using safetensors::cuda::LandingOptions;
using safetensors::cuda::Placement;
using safetensors::cuda::Uploader;
using safetensors::cuda::UploadOptions;

/// `cuda::Uploader(device, options)` without exceptions.
///
///   auto up = safetensors::nothrow::cuda::make_uploader(0);
///   if (!up) std::puts(up.status().message().c_str());
[[nodiscard]] Expected<Uploader> make_uploader(int device = 0, UploadOptions options = {});
/// `Uploader::load` without exceptions.
template <Readable From>
[[nodiscard]] Expected<DeviceTensors> load(Uploader& uploader, const From& from, Requests requests = {});
/// `Uploader::load` with a landing callback, without exceptions.
///
///   auto up = safetensors::nothrow::cuda::make_uploader(0);
///   auto w = safetensors::nothrow::cuda::load(*up, f, {}, [](const cuda::Landed& t) {
///     return t.byte_size > 0 ? Status{} : Status(ErrorKind::Internal, "empty");   // not ok(): stop
///   });
template <Readable From>
[[nodiscard]] Expected<DeviceTensors> load(Uploader& uploader, const From& from, Requests requests,
                                           const OnLanded& on_landed, LandingOptions options = {});
/// `Uploader::load_into` without exceptions.
template <Readable From>
[[nodiscard]] Expected<std::vector<Placement>> load_into(Uploader& uploader, const From& from,
                                                         Requests requests, void* dst, std::size_t capacity,
                                                         std::uintptr_t stream);
/// `Uploader::load_into` with a landing callback, without exceptions.
template <Readable From>
[[nodiscard]] Expected<std::vector<Placement>> load_into(Uploader& uploader, const From& from,
                                                         Requests requests, void* dst, std::size_t capacity,
                                                         std::uintptr_t stream, const OnLanded& on_landed,
                                                         LandingOptions options = {});
/// `Uploader::stream` without exceptions: the scratch ring's size, or the error.
template <Readable From>
Expected<std::size_t> stream(Uploader& uploader, const From& from, Requests requests,
                             std::size_t scratch_bytes, const OnLanded& on_landed,
                             LandingOptions options = {});
/// `Uploader::synchronize` without exceptions.
Status synchronize(Uploader& uploader);
/// `DeviceTensors::data` without exceptions.
[[nodiscard]] Expected<void*> data(const DeviceTensors& tensors, std::string_view name);
/// `DeviceTensors::at` without exceptions: a copy of `name`'s placement, or `TensorNotFound`.
[[nodiscard]] Expected<Placement> at(const DeviceTensors& tensors, std::string_view name);
}  // namespace cuda
}  // namespace nothrow
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace cuda {

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
  DeviceBuffer(const DeviceBuffer&) = SAFETENSORS_DELETE("a DeviceBuffer owns its device memory: move it");
  DeviceBuffer& operator=(const DeviceBuffer&) =
      SAFETENSORS_DELETE("a DeviceBuffer owns its device memory: move it");
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

/// One tensor in a new device allocation (`cuda::to_device`).
struct DeviceTensor {
  Dtype dtype{};
  std::vector<std::size_t> shape;
  DeviceBuffer buffer;
  [[nodiscard]] void* data() const noexcept { return buffer.data(); }
  [[nodiscard]] std::size_t byte_size() const noexcept { return buffer.size(); }
};

/// Uploads to one device through a reusable pinned staging ring, allocated when it is made (from
/// the device's idle pinned memory where it fits: see `cuda::release_staging`).
/// Safe to share between threads; uploads through one `Uploader` take turns (they share one
/// link to the device, which one upload already keeps busy). Every method reads `requests` of a
/// file or a checkpoint (`{}`: every tensor, in `keys()` order; else in request order), as
/// prefetch and streams take them.
class Uploader {
 public:
  explicit Uploader(int device = 0, UploadOptions options = {})
      : Uploader(nothrow::cuda::make_uploader(device, options).value()) {}

  /// `requests` into one new allocation; done when this returns.
  template <Readable From>
  [[nodiscard]] DeviceTensors load(const From& from, Requests requests = {}) {
    return nothrow::cuda::load(*this, from, requests).value();
  }

  /// `requests` in one new allocation, each handed to `on_landed` as it lands, in request order,
  /// on this thread; the engine transforms it while the rest is still in flight. Every copy has
  /// completed on return.
  ///
  ///   cuda::Uploader up(0);
  ///   auto w = up.load(f, {}, [&](const cuda::Landed& t) { std::printf("%zu landed\n", t.index); });
  template <Readable From>
  [[nodiscard]] DeviceTensors load(const From& from, Requests requests, const OnLanded& on_landed,
                                   LandingOptions options = {}) {
    return detail::upload::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::load(*this, from, requests, cb, options);
    });
  }

  /// Uploads into `dst` (device memory of `capacity` bytes on this device, aligned to
  /// `options.alignment`, 256 for 0) with copies on the caller's `stream`, a
  /// `cudaStream_t`/`CUstream` of this device's primary context. 0 is the legacy default
  /// stream; the per-thread default stream (`cudaStreamPerThread`) and streams capturing a
  /// graph are refused, as are a stream or destination of another device (`Error` with kind
  /// `Cuda`). Returns once every copy is enqueued; completion is visible on `stream`. The
  /// staging ring is reused only once its copies are done, so the next upload, `synchronize()`
  /// or the destructor waits for them. On an error, copies already enqueued still complete on
  /// `stream`: synchronise it before freeing `dst`.
  template <Readable From>
  std::vector<Placement> load_into(const From& from, Requests requests, void* dst, std::size_t capacity,
                                   std::uintptr_t stream) {
    return nothrow::cuda::load_into(*this, from, requests, dst, capacity, stream).value();
  }

  /// `load_into` (same checks of `dst` and `stream`, copies on `stream`), handing each tensor to
  /// `on_landed` as it lands. Returns once every copy has completed, successful or not.
  template <Readable From>
  std::vector<Placement> load_into(const From& from, Requests requests, void* dst, std::size_t capacity,
                                   std::uintptr_t stream, const OnLanded& on_landed,
                                   LandingOptions options = {}) {
    return detail::upload::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::load_into(*this, from, requests, dst, capacity, stream, cb, options);
    });
  }

  /// Streams `requests` through a device scratch ring of about `scratch_bytes`, for engines that
  /// transform each tensor into their own layout and cannot hold the checkpoint: `on_landed`
  /// gets each one in the ring, and its region is refilled once the callback has returned and,
  /// with `options.consumer_stream`, once the work it enqueued there by then has completed. The
  /// ring is max(`scratch_bytes`, largest tensor) rounded up to whole chunks (the slot size, or
  /// less for a smaller ring): the only device memory the upload allocates, freed before
  /// returning. Returns its size.
  ///
  ///   cuda::Uploader up(0);
  ///   up.stream(f, {}, 64 << 20, [&](const cuda::Landed& t) { std::printf("%zu bytes\n", t.byte_size); });
  template <Readable From>
  std::size_t stream(const From& from, Requests requests, std::size_t scratch_bytes,
                     const OnLanded& on_landed, LandingOptions options = {}) {
    return detail::upload::rethrowing(on_landed, [&](const nothrow::cuda::OnLanded& cb) {
      return nothrow::cuda::stream(*this, from, requests, scratch_bytes, cb, options);
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

}  // namespace cuda
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

// The private doors and the nothrow definitions (after the classes they need).
#include "safetensors/detail/cuda_device_impl.hpp"
