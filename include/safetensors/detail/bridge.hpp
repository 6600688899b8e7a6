// Private: how every call into the Rust core reports (the status bridge) and the helpers that keep
// the generated types out of the public API. Each area's header includes its own bridge header
// (`safetensors/ffi/src/<area>.rs.h`) beside this one.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/ffi/src/rust/cxx.h"
#include "safetensors/ffi/src/status.rs.h"
#include "safetensors/version.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

/// The outcome a bridge call reported through its `ffi::Status`.
inline Status status_of(const ffi::Status& s) {
  if (s.ok) return {};
  std::string message(s.message.data(), s.message.size());
  if (s.kind >= error_kind_count || message.empty()) {
    return Status(ErrorKind::Internal, "the safetensors core reported an unexpected outcome (kind " +
                                           std::to_string(static_cast<unsigned>(s.kind)) + "): " + message);
  }
  return Status(static_cast<ErrorKind>(s.kind), std::move(message));
}

/// Runs a bridge call that reports through the `ffi::Status&` it is given (a lambda taking it
/// and passing it on as the call's last argument): a `Status` for a call without a result,
/// else an `Expected` of its result. The bridge never throws, so this is all the error handling
/// a call needs, with or without exceptions. Every header makes some twenty of these calls, so
/// the template stays plain: `decltype` rather than `std::invoke_result_t`, and the lambda
/// called as it is (no `std::forward` instantiated per lambda).
template <class F>
auto attempt(F&& call) {
  ffi::Status st{};
  using R = decltype(call(st));
  if constexpr (std::is_void_v<R>) {
    call(st);
    return status_of(st);
  } else {
    R result = call(st);
    if (!st.ok) return Expected<R>(status_of(st));
    return Expected<R>(std::move(result));
  }
}

/// Adopts a Rust object a bridge call handed over by address (null when it failed).
template <class T>
Expected<::rust::Box<T>> adopt(Expected<T*> made) {
  if (!made) return made.status();
  if (*made == nullptr) return Status(ErrorKind::Internal, "the safetensors core returned no object");
  return ::rust::Box<T>::from_raw(*made);
}

/// `[2, 3]`, for messages.
inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Bytes of a string, as the bridge takes them (no UTF-8 check: invalid names simply match
/// nothing).
inline ::rust::Slice<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

inline std::string_view view(::rust::Str s) {
  return {s.data(), s.size()};
}

// Copy out of `rust::Slice` through data() and size(), never its iterators: instantiating their
// arithmetic trips -Wsign-conversion inside cxx.h, which would break users building with
// -Wconversion -Werror.

/// Shared ownership of a Rust object, so the C++ value types holding it stay copyable.
template <class T>
std::shared_ptr<const T> share(::rust::Box<T> box) {
  return std::shared_ptr<const T>(box.into_raw(),
                                  [](const T* p) { ::rust::Box<T>::from_raw(const_cast<T*>(p)); });
}

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
