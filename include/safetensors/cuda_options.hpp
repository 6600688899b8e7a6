// What the GPU calls take and give (safetensors/cuda.hpp): upload options, where each tensor
// lands, how a streaming upload hands tensors to its callback, and what a save from the GPU
// takes.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace cuda {

struct UploadOptions {
  /// Staging buffers (pinned host memory) and their size (0: the defaults, see cuda.hpp); at
  /// most 1024 buffers (more are clamped).
  std::size_t staging_slots = 0;
  std::size_t slot_bytes = 0;
  /// Threads reading the files into the staging buffers (0: half the cores, at most 8; any
  /// value at most 64).
  unsigned readers = 0;
  /// Every tensor starts on a multiple of this many bytes of the allocation: a power of two, or
  /// 0 for the default, 256 (the core's one rule for uploads, C's too; else `InvalidSlice`).
  std::size_t alignment = 256;
};

/// Whether `options` asks for the default ring (then one-shot calls share the device's uploader).
[[nodiscard]] inline bool default_ring(const UploadOptions& o) noexcept {
  return o.staging_slots == 0 && o.slot_bytes == 0 && o.readers == 0;
}

/// The pinned staging ring a save from the GPU copies through (`cuda::save`,
/// `cuda::write_tensors`): host memory stays at most `staging_slots` × `slot_bytes`, whatever the
/// tensors' size.
struct SaveStaging {
  /// Pinned buffers (0: 4) and their size (0: 16 MiB, less when every tensor is smaller).
  std::size_t staging_slots = 0;
  std::size_t slot_bytes = 0;
};

/// A tensor in device memory to save: its name, dtype, shape and device address (memory of the
/// device the save reads from, holding dtype × shape bytes).
struct DeviceTensorView {
  std::string name;
  Dtype dtype{};
  std::vector<std::size_t> shape;
  const void* data = nullptr;
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
  /// A `CUevent` (`cudaEvent_t`) recorded on the copy stream after its last copy (tensors that
  /// became complete together share it). It marks this tensor only until the callback returns:
  /// wait on it there, with `cuStreamWaitEvent` (which takes the event's state when called, so
  /// the wait stays right after the event is reused) or `cuEventSynchronize`. Afterwards the
  /// library records it again for later tensors, and destroys it with the `Uploader` (the
  /// one-shot calls' never): do not keep it, query it later, or destroy it.
  std::uintptr_t event = 0;
};

/// How a streaming upload hands tensors over.
struct LandingOptions {
  Deliver deliver = Deliver::Landed;
  /// A stream of the device's primary context (`cudaStreamCreate` after `cudaSetDevice`; 0 and
  /// `cudaStreamPerThread` too) that the library makes wait for each tensor's event before the
  /// callback runs, so that work the callback enqueues there sees the bytes. With `stream`'s
  /// scratch ring, the library records an event there after the callback returns and refills
  /// the tensor's region only once that event has completed. If the upload fails, a new
  /// allocation or the scratch ring is freed once the library's copies and the work enqueued
  /// on this stream by then have completed: work the callback enqueues on the tensors on any
  /// other stream must be done (or ordered before work on this stream) when it returns.
  std::optional<std::uintptr_t> consumer_stream = std::nullopt;
};

/// A landing callback. It runs on the thread that called the upload, one tensor at a time, in
/// request order; an exception it throws stops the upload and is rethrown once every copy has
/// completed.
using OnLanded = std::function<void(const Landed&)>;

}  // namespace cuda
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace nothrow {
namespace cuda {
/// A landing callback of the nothrow API: a `Status` that is not `ok()` stops the upload, which
/// then returns that status. (An exception it throws anyway stops it too, as an `Error`'s own
/// kind and message, or `Internal`.)
using OnLanded = std::function<Status(const safetensors::cuda::Landed&)>;
}  // namespace cuda
}  // namespace nothrow
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
