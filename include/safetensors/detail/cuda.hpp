// Private: how the GPU calls reach the bridge. Upload jobs are planned from the same requests as
// prefetch and streams (`detail::reading`); streaming uploads call a C++ function back for each
// tensor, and the throwing API passes a callback's exception through the bridge, which never
// throws. No `rust::` type leaves this file's namespace.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "safetensors/cuda_options.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/ffi/src/cuda.rs.h"
#include "safetensors/request.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {
namespace upload {

/// A device ordinal for the bridge: a negative one is refused here, where its sign is still
/// known (as a size_t it would name device 18446744073709551615).
inline Expected<std::size_t> device_ordinal(int device) {
  if (device < 0) {
    return Status(ErrorKind::Cuda,
                  "no CUDA device " + std::to_string(device) + ": device ordinals start at 0");
  }
  return static_cast<std::size_t>(device);
}

using Job = ::rust::Box<ffi::UploadJob>;

/// The upload of `requests` of `from`: tensors placed in request order (every tensor: in
/// `keys()` order), each on a multiple of `alignment` bytes.
template <Readable From>
Expected<Job> job_for(const From& from, const Requests& requests, std::size_t alignment) {
  auto r = reading(from, requests);
  if (!r) return r.status();
  return adopt(
      attempt([&](ffi::Status& st) { return ffi::plan_upload(*r->source, *r->requests, alignment, st); }));
}

/// Every placement of a job, in one bridge call.
inline std::vector<safetensors::cuda::Placement> placements(const ffi::UploadJob& job) {
  auto raw = job.placements();
  std::vector<safetensors::cuda::Placement> out;
  out.reserve(raw.size());
  for (const auto& p : raw) {
    out.push_back({std::string(p.name), static_cast<Dtype>(p.dtype),
                   std::vector<std::size_t>(p.shape.data(), p.shape.data() + p.shape.size()),
                   static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.len)});
  }
  return out;
}

/// What one streaming upload's callback needs, and why it stopped the upload (`ok()`: it did
/// not).
struct Sink {
  const nothrow::cuda::OnLanded* on_landed;
  const std::vector<safetensors::cuda::Placement>* placements;
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
  const safetensors::cuda::Landed landed{t->index,
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
inline ffi::LandingSink bridge_sink(Sink& sink, const safetensors::cuda::LandingOptions& options) {
  return ffi::LandingSink{reinterpret_cast<std::size_t>(&deliver), reinterpret_cast<std::size_t>(&sink),
                          options.deliver == safetensors::cuda::Deliver::Enqueued,
                          options.consumer_stream.has_value(),
                          static_cast<std::uint64_t>(options.consumer_stream.value_or(0))};
}

/// Why a streaming upload cannot start with `on_landed`, if so.
inline Status check_callback(const nothrow::cuda::OnLanded& on_landed) {
  if (on_landed) return {};
  return Status(ErrorKind::Cuda,
                "a streaming upload needs a landing callback, and this one is empty (a default-constructed "
                "or moved-from std::function): pass one, or call load() without a callback");
}

/// The throwing face of a streaming call: runs `call` (its nothrow twin, given a nothrow
/// callback) with `on_landed`; an exception `on_landed` throws stops the upload and is rethrown
/// as it was once `call` has returned (every copy completed), else `.value()`.
template <class Call>
auto rethrowing(const safetensors::cuda::OnLanded& on_landed, Call&& call) {
  // An empty callback is refused by the nothrow twin (`check_callback`), before anything is
  // copied.
  if (!on_landed) return std::forward<Call>(call)(nothrow::cuda::OnLanded{}).value();
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  std::exception_ptr thrown;
  nothrow::cuda::OnLanded guarded = [&](const safetensors::cuda::Landed& t) -> Status {
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
  nothrow::cuda::OnLanded plain = [&](const safetensors::cuda::Landed& t) -> Status {
    on_landed(t);
    return {};
  };
  return std::forward<Call>(call)(plain).value();
#endif
}

}  // namespace upload
}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
