// Private: the definitions behind safetensors/cuda_device.hpp (which includes this at its end,
// after the classes these need): the doors of `DeviceTensors` and `Uploader`, and the nothrow
// face of the uploader, each operation written once for a file and a checkpoint alike.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/cuda_device.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

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
    return make(std::move(buffer), upload::placements(job));
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

template <>
struct Access<cuda::Uploader> {
  static Expected<cuda::Uploader> make(int device, cuda::UploadOptions options) {
    auto ordinal = upload::device_ordinal(device);
    if (!ordinal) return ordinal.status();
    auto impl = adopt(attempt([&](ffi::Status& st) {
      return ffi::new_uploader(*ordinal, options.staging_slots, options.slot_bytes, options.readers, st);
    }));
    if (!impl) return impl.status();
    return cuda::Uploader(device, options, share(std::move(*impl)));
  }

  /// The uploader's ring (kept alive by the caller: a landing callback may destroy `up`), or
  /// `Internal` for a moved-from Uploader.
  static Expected<std::shared_ptr<const ffi::Uploader>> impl(const cuda::Uploader& up) {
    if (!up.impl_) return moved_from("Uploader");
    return up.impl_;
  }
  static std::size_t alignment(const cuda::Uploader& up) { return up.options_.alignment; }
  static int device(const cuda::Uploader& up) { return up.device_; }
};

namespace upload {
/// A streaming upload of `requests` of `from` through `up`: `run(impl, job, sink, status)` makes
/// the bridge call. The job's placements and `run`'s result, or why the callback stopped it.
template <Readable From, class Run>
Expected<std::pair<std::vector<cuda::Placement>, std::uint64_t>> streaming(
    cuda::Uploader& up, const From& from, const Requests& requests, const nothrow::cuda::OnLanded& on_landed,
    const cuda::LandingOptions& options, Run&& run) {
  auto impl = Access<cuda::Uploader>::impl(up);
  if (!impl) return impl.status();
  if (auto st = check_callback(on_landed); !st.ok()) return st;
  auto job = job_for(from, requests, Access<cuda::Uploader>::alignment(up));
  if (!job) return job.status();
  auto places = placements(**job);
  Sink sink{&on_landed, &places, {}};
  const auto bridge = bridge_sink(sink, options);
  auto out = attempt([&](ffi::Status& st) -> std::uint64_t { return run(**impl, **job, bridge, st); });
  if (!sink.stopped.ok()) return sink.stopped;
  if (!out) return out.status();
  return std::pair{std::move(places), *out};
}

/// `requests` of `from` through the process's uploader for `device` (see cuda.hpp), into a new
/// allocation, complete on return.
template <Readable From>
Expected<cuda::DeviceTensors> load_shared(int device, const From& from, const Requests& requests,
                                          std::size_t alignment) {
  auto ordinal = device_ordinal(device);
  if (!ordinal) return ordinal.status();
  auto job = job_for(from, requests, alignment);
  if (!job) return job.status();
  auto ptr = attempt([&](ffi::Status& st) { return ffi::cuda_shared_upload(*ordinal, **job, st); });
  if (!ptr) return ptr.status();
  return Access<cuda::DeviceTensors>::make(*ptr, **job, device);
}
/// `requests` of `from` on `device`: through the device's shared uploader for the default ring,
/// else through an uploader of `options`' own, made for this call.
template <Readable From>
Expected<cuda::DeviceTensors> load_one_shot(const From& from, const Requests& requests, int device,
                                            const cuda::UploadOptions& options) {
  if (cuda::default_ring(options)) {
    return load_shared(device, from, requests, options.alignment);
  }
  auto up = nothrow::cuda::make_uploader(device, options);
  if (!up) return up.status();
  return nothrow::cuda::load(*up, from, requests);
}

}  // namespace upload

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace nothrow {
namespace cuda {

inline Expected<Uploader> make_uploader(int device, UploadOptions options) {
  return detail::Access<Uploader>::make(device, options);
}

template <Readable From>
Expected<DeviceTensors> load(Uploader& uploader, const From& from, Requests requests) {
  using Door = detail::Access<Uploader>;
  auto impl = Door::impl(uploader);
  if (!impl) return impl.status();
  auto job = detail::upload::job_for(from, requests, Door::alignment(uploader));
  if (!job) return job.status();
  auto ptr = detail::attempt([&](ffi::Status& st) { return (*impl)->upload(**job, st); });
  if (!ptr) return ptr.status();
  return detail::Access<DeviceTensors>::make(*ptr, **job, Door::device(uploader));
}

template <Readable From>
Expected<DeviceTensors> load(Uploader& uploader, const From& from, Requests requests,
                             const OnLanded& on_landed, LandingOptions options) {
  const int device = detail::Access<Uploader>::device(uploader);
  std::size_t total = 0;
  auto done = detail::upload::streaming(uploader, from, requests, on_landed, options,
                                        [&](const ffi::Uploader& impl, const ffi::UploadJob& job,
                                            const ffi::LandingSink& sink, ffi::Status& st) {
                                          total = job.total_bytes();
                                          return impl.upload_landing(job, sink, st);
                                        });
  if (!done) return done.status();
  auto* ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(done->second));
  return detail::Access<DeviceTensors>::make(safetensors::cuda::DeviceBuffer(ptr, total, device),
                                             std::move(done->first));
}

template <Readable From>
Expected<std::vector<Placement>> load_into(Uploader& uploader, const From& from, Requests requests, void* dst,
                                           std::size_t capacity, std::uintptr_t stream) {
  using Door = detail::Access<Uploader>;
  auto impl = Door::impl(uploader);
  if (!impl) return impl.status();
  auto job = detail::upload::job_for(from, requests, Door::alignment(uploader));
  if (!job) return job.status();
  auto st = detail::attempt([&](ffi::Status& s) {
    (*impl)->upload_into(**job, reinterpret_cast<std::uintptr_t>(dst), capacity, stream, s);
  });
  if (!st.ok()) return st;
  return detail::upload::placements(**job);
}

template <Readable From>
Expected<std::vector<Placement>> load_into(Uploader& uploader, const From& from, Requests requests, void* dst,
                                           std::size_t capacity, std::uintptr_t stream,
                                           const OnLanded& on_landed, LandingOptions options) {
  auto done = detail::upload::streaming(uploader, from, requests, on_landed, options,
                                        [&](const ffi::Uploader& impl, const ffi::UploadJob& job,
                                            const ffi::LandingSink& sink, ffi::Status& st) {
                                          impl.upload_into_landing(job, reinterpret_cast<std::uintptr_t>(dst),
                                                                   capacity, stream, sink, st);
                                          return std::uint64_t{0};
                                        });
  if (!done) return done.status();
  return std::move(done->first);
}

template <Readable From>
Expected<std::size_t> stream(Uploader& uploader, const From& from, Requests requests,
                             std::size_t scratch_bytes, const OnLanded& on_landed, LandingOptions options) {
  auto done = detail::upload::streaming(
      uploader, from, requests, on_landed, options,
      [&](const ffi::Uploader& impl, const ffi::UploadJob& job, const ffi::LandingSink& sink,
          ffi::Status& st) { return impl.upload_scratch(job, scratch_bytes, sink, st); });
  if (!done) return done.status();
  return static_cast<std::size_t>(done->second);
}

inline Status synchronize(Uploader& uploader) {
  auto impl = detail::Access<Uploader>::impl(uploader);
  if (!impl) return impl.status();
  return detail::attempt([&](ffi::Status& st) { (*impl)->synchronize(st); });
}

inline Expected<void*> data(const DeviceTensors& tensors, std::string_view name) {
  return detail::Access<DeviceTensors>::data(tensors, name);
}

inline Expected<Placement> at(const DeviceTensors& tensors, std::string_view name) {
  auto p = detail::Access<DeviceTensors>::find(tensors, name);
  if (!p) return p.status();
  return **p;
}

}  // namespace cuda
}  // namespace nothrow
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
