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
// Saving: `cuda::save` writes tensors that live in device memory to a file, and
// `cuda::write_tensors` fills any `StreamingWriter` (a sharded checkpoint too) from device
// memory, through a small ring of pinned buffers (device -> pinned -> file), without the caller
// staging them.
//
// Streaming: `Uploader::load`, `load_into` and `stream` with a callback hand each tensor over as
// it lands in device memory (or as soon as its copies are enqueued, with an event to wait on), so
// an engine can transform it on its own stream while the rest is in flight; `stream` lands them
// in a bounded device scratch ring instead of one allocation holding them all
// (safetensors/cuda_device.hpp).
//
// What to upload is what every reading call takes: `requests` of a `SafeOpen` or a `Checkpoint`
// (`{}`: every tensor), as `safetensors::Request`s (request.hpp). Every call that can fail has a
// twin in `safetensors::nothrow::cuda` returning the error as a value.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/cuda_device.hpp"
#include "safetensors/cuda_options.hpp"
#include "safetensors/detail/cuda.hpp"
#include "safetensors/detail/overlap.hpp"
#include "safetensors/detail/slices.hpp"
#include "safetensors/path.hpp"
#include "safetensors/request.hpp"
#include "safetensors/streaming_writer.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace nothrow {
namespace cuda {
using safetensors::cuda::DeviceTensor;
using safetensors::cuda::SaveStaging;

/// `cuda::device_count` without exceptions.
[[nodiscard]] Expected<int> device_count();
/// `cuda::device_name` without exceptions.
[[nodiscard]] Expected<std::string> device_name(int device);
/// `cuda::copy_to_host` without exceptions.
Status copy_to_host(const void* src, std::span<std::byte> dst, int device = 0);
/// `cuda::pinned_copy_seconds` without exceptions.
[[nodiscard]] Expected<double> pinned_copy_seconds(std::size_t bytes, int device = 0);
/// `cuda::release_staging` without exceptions.
Expected<std::size_t> release_staging(int device = 0);
/// `cuda::plan` without exceptions.
template <Readable From>
[[nodiscard]] Expected<std::pair<std::size_t, std::vector<Placement>>> plan(const From& from,
                                                                            Requests requests = {},
                                                                            UploadOptions options = {});
/// `cuda::load(from, device, options)` without exceptions.
///
///   auto w = safetensors::nothrow::cuda::load(f);
///   if (!w) std::puts(w.status().message().c_str());
template <Readable From>
[[nodiscard]] Expected<DeviceTensors> load(const From& from, int device = 0, UploadOptions options = {});
/// `cuda::to_device` without exceptions.
template <Readable From>
[[nodiscard]] Expected<DeviceTensor> to_device(const From& from, std::string_view name, int device = 0,
                                               UploadOptions options = {});
/// `cuda::write_tensors` without exceptions.
Status write_tensors(const StreamingWriter& writer, std::span<const void* const> data, int device = 0,
                     SaveStaging staging = {});
/// `cuda::save(path, tensors, ...)` without exceptions.
///
///   auto saved = safetensors::nothrow::cuda::save("out.safetensors", tensors);
///   if (!saved.ok()) std::puts(saved.message().c_str());
Status save(PathRef path, std::span<const safetensors::cuda::DeviceTensorView> tensors,
            const Metadata& metadata = {}, SaveOptions options = {}, int device = 0,
            SaveStaging staging = {});
/// `cuda::save(path, device_tensors, ...)` without exceptions.
Status save(PathRef path, const DeviceTensors& tensors, const Metadata& metadata = {},
            SaveOptions options = {}, SaveStaging staging = {});
}  // namespace cuda
}  // namespace nothrow
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace cuda {

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

/// Unpins the staging memory `device` keeps idle between uploads and returns its size in bytes.
/// Pinned staging is reused across calls, whatever the ring options (page-locking is slow and
/// stalls the device): a device keeps up to 16 buffers and 256 MiB idle once no uploader holds
/// them. Call this to hand that memory back, e.g. once a model is loaded; uploaders alive keep
/// their own slots.
///
///   cuda::DeviceTensors w = cuda::load(f, 0, {.staging_slots = 8});
///   cuda::release_staging(0);   // the ring's pinned memory goes back to the system
inline std::size_t release_staging(int device = 0) {
  return nothrow::cuda::release_staging(device).value();
}

/// Where each of `requests` (`{}`: every tensor) would go in one allocation, and the bytes it
/// needs. Needs no GPU: use it to size your own buffer for `Uploader::load_into`.
template <Readable From>
[[nodiscard]] std::pair<std::size_t, std::vector<Placement>> plan(const From& from, Requests requests = {},
                                                                  UploadOptions options = {}) {
  return nothrow::cuda::plan(from, requests, options).value();
}

/// Every tensor of a file or a (sharded) checkpoint on `device`, in one allocation. Uses the
/// device's shared uploader unless `options` sets a ring of its own (whose pinned slots are
/// reused by the next call: see `release_staging`).
template <Readable From>
[[nodiscard]] DeviceTensors load(const From& from, int device = 0, UploadOptions options = {}) {
  return nothrow::cuda::load(from, device, options).value();
}

/// One tensor in a new device allocation.
template <Readable From>
[[nodiscard]] DeviceTensor to_device(const From& from, std::string_view name, int device = 0,
                                     UploadOptions options = {}) {
  return nothrow::cuda::to_device(from, name, device, options).value();
}

/// Fills `writer` from device memory of `device`: `data[i]` holds the bytes of the `i`-th tensor
/// declared to the writer (declaration order), copied off the device in pieces through a small
/// pinned ring (`staging`) and written as each copy completes. The tensors must be complete
/// (synchronise the stream that made them first). The writer is not finished: call
/// `writer.finish()` (after an error, destroy it instead: nothing is published). Errors: `Cuda`
/// (an address that is not memory of `device` holding its tensor's bytes, checked before any
/// copy; a failed copy), and the writer's own (`Io`, a full disk).
///
///   std::vector<safetensors::TensorSpec> specs{{"w", safetensors::Dtype::BF16, {4096, 4096}}};
///   safetensors::ShardedWriter out("ckpt", specs, {{"format", "pt"}});
///   std::vector<const void*> data{w_device_ptr};
///   safetensors::cuda::write_tensors(out, data);
///   out.finish();
inline void write_tensors(const StreamingWriter& writer, std::span<const void* const> data, int device = 0,
                          SaveStaging staging = {}) {
  nothrow::cuda::write_tensors(writer, data, device, staging).throw_if_error();
}

/// Saves tensors that live in device memory of `device` to `path`, as `save_file` saves tensors
/// in host memory (byte-identical, atomic, `options` alike), through a pinned ring of at most
/// `staging.staging_slots` × `staging.slot_bytes` bytes (64 MiB by default): the host never
/// holds a tensor whole. On any error nothing is written under `path`.
///
///   std::vector<safetensors::cuda::DeviceTensorView> t{{"w", safetensors::Dtype::F32, {n}, dev_ptr}};
///   safetensors::cuda::save("out.safetensors", t, {{"format", "pt"}});
inline void save(PathRef path, std::span<const DeviceTensorView> tensors, const Metadata& metadata = {},
                 SaveOptions options = {}, int device = 0, SaveStaging staging = {}) {
  nothrow::cuda::save(path, tensors, metadata, options, device, staging).throw_if_error();
}

/// Saves tensors uploaded into one allocation (`cuda::load`, `Uploader::load`), from their
/// device, as `save(path, views, ...)` does.
inline void save(PathRef path, const DeviceTensors& tensors, const Metadata& metadata = {},
                 SaveOptions options = {}, SaveStaging staging = {}) {
  nothrow::cuda::save(path, tensors, metadata, options, staging).throw_if_error();
}

}  // namespace cuda
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace nothrow {
namespace cuda {

inline Expected<int> device_count() {
  auto n = detail::attempt([](ffi::Status& st) { return ffi::cuda_device_count(st); });
  if (!n) return n.status();
  return static_cast<int>(*n);
}

inline Expected<std::string> device_name(int device) {
  auto ordinal = detail::upload::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  auto name = detail::attempt([&](ffi::Status& st) { return ffi::cuda_device_name(*ordinal, st); });
  if (!name) return name.status();
  return std::string(name->data(), name->size());
}

inline Status copy_to_host(const void* src, std::span<std::byte> dst, int device) {
  auto ordinal = detail::upload::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  // Device memory the host can address (managed memory, the emulated driver) could be `dst`
  // itself: a copy onto itself is refused like every overlapping output.
  const std::span<const std::byte> from{static_cast<const std::byte*>(src), dst.size()};
  if (auto st = detail::refuse_overlap("copy_to_host", from, dst); !st.ok()) return st;
  ::rust::Slice<std::uint8_t> out{reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()};
  return detail::attempt(
      [&](ffi::Status& st) { ffi::cuda_download(*ordinal, reinterpret_cast<std::uintptr_t>(src), out, st); });
}

inline Expected<double> pinned_copy_seconds(std::size_t bytes, int device) {
  auto ordinal = detail::upload::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  return detail::attempt([&](ffi::Status& st) { return ffi::cuda_pinned_copy_seconds(*ordinal, bytes, st); });
}

inline Expected<std::size_t> release_staging(int device) {
  auto ordinal = detail::upload::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  return detail::attempt([&](ffi::Status& st) { return ffi::cuda_release_staging(*ordinal, st); });
}

template <Readable From>
Expected<std::pair<std::size_t, std::vector<Placement>>> plan(const From& from, Requests requests,
                                                              UploadOptions options) {
  auto job = detail::upload::job_for(from, requests, options.alignment);
  if (!job) return job.status();
  return std::pair{(*job)->total_bytes(), detail::upload::placements(**job)};
}

template <Readable From>
Expected<DeviceTensors> load(const From& from, int device, UploadOptions options) {
  return detail::upload::load_one_shot(from, {}, device, options);
}

template <Readable From>
Expected<DeviceTensor> to_device(const From& from, std::string_view name, int device, UploadOptions options) {
  const Request one{std::string(name)};
  auto loaded = detail::upload::load_one_shot(from, std::span<const Request>(&one, 1), device, options);
  if (!loaded) return loaded.status();
  if (loaded->placements().empty()) {
    return Status(ErrorKind::Internal,
                  "to_device(\"" + std::string(name) + "\"): the upload placed no tensor");
  }
  auto p = loaded->placements().front();
  return DeviceTensor{p.dtype, std::move(p.shape), loaded->release_buffer()};
}

inline Status write_tensors(const StreamingWriter& writer, std::span<const void* const> data, int device,
                            SaveStaging staging) {
  auto ordinal = detail::upload::device_ordinal(device);
  if (!ordinal) return ordinal.status();
  auto impl = detail::Access<StreamingWriter>::impl(writer);
  if (!impl) return impl.status();
  std::vector<std::uint64_t> ptrs;
  ptrs.reserve(data.size());
  for (const void* p : data) ptrs.push_back(reinterpret_cast<std::uintptr_t>(p));
  return detail::attempt([&](ffi::Status& st) {
    ffi::cuda_save(**impl, *ordinal, {ptrs.data(), ptrs.size()}, staging.staging_slots, staging.slot_bytes,
                   st);
  });
}

inline Status save(PathRef path, std::span<const safetensors::cuda::DeviceTensorView> tensors,
                   const Metadata& metadata, SaveOptions options, int device, SaveStaging staging) {
  std::vector<TensorSpec> specs;
  std::vector<const void*> data;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) {
    specs.push_back({t.name, t.dtype, t.shape});
    data.push_back(t.data);
  }
  auto writer = nothrow::make_streaming_writer(path, specs, metadata, options);
  if (!writer) return writer.status();
  if (auto st = nothrow::cuda::write_tensors(*writer, data, device, staging); !st.ok()) return st;
  return nothrow::finish(*writer);
}

inline Status save(PathRef path, const DeviceTensors& tensors, const Metadata& metadata, SaveOptions options,
                   SaveStaging staging) {
  const auto* base = static_cast<const std::byte*>(tensors.buffer().data());
  if (base == nullptr && !tensors.placements().empty()) {
    return Status(ErrorKind::Internal,
                  "cuda::save: this DeviceTensors holds no device memory (its buffer was released or moved "
                  "away); save from the buffer's own address with DeviceTensorView instead");
  }
  std::vector<safetensors::cuda::DeviceTensorView> views;
  views.reserve(tensors.placements().size());
  for (const auto& p : tensors.placements()) views.push_back({p.name, p.dtype, p.shape, base + p.offset});
  return nothrow::cuda::save(path, views, metadata, options, tensors.buffer().device(), staging);
}

}  // namespace cuda
}  // namespace nothrow
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
