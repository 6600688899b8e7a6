// Private: how every call into the Rust core reports (the status bridge) and the helpers that keep
// the generated types out of the public API. Each area's header includes its own bridge header
// (`safetensors/ffi/src/<area>.rs.h`) beside this one.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
// Not `rust/cxx.h`: each generated header defines the bridge types its signatures use, and the
// reading bridges (status, file, checkpoint, convert, remote) use none of `rust::Slice` and
// `rust::Vec`, whose `<ranges>` and `<algorithm>` every translation unit would compile. The
// file bridge is included for `rust::Box`, which every area hands objects over in.
#include "safetensors/ffi/src/file.rs.h"
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
/// nothing). Lent for the length of the call.
inline ffi::Bytes bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// Bytes as the bridge takes them, to read (lent for the length of the call). Not an overload
/// of `bytes`: a string argument would make the compiler check every `std::span` constructor's
/// range constraints against `std::string` in each translation unit.
inline ffi::Bytes data_bytes(std::span<const std::byte> s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// Bytes as the bridge takes them, to write (lent for the length of the call).
inline ffi::BytesMut bytes_mut(std::span<std::byte> s) {
  return {reinterpret_cast<std::uint8_t*>(s.data()), s.size()};
}

/// A shape as the bridge takes it (lent for the length of the call). From the vector itself, not
/// a `std::span` of it, whose range constructor's constraints would be checked for it.
inline ffi::Sizes sizes(const std::vector<std::size_t>& shape) {
  return {shape.data(), shape.size()};
}

/// Bytes the bridge returned (living as long as the object that returned them).
inline std::span<const std::byte> span_of(ffi::Bytes b) {
  return {reinterpret_cast<const std::byte*>(b.data), b.len};
}

inline std::string_view view(::rust::Str s) {
  return {s.data(), s.size()};
}

/// Shared ownership of a Rust object, so the C++ value types holding it stay copyable.
template <class T>
std::shared_ptr<const T> share(::rust::Box<T> box) {
  return std::shared_ptr<const T>(box.into_raw(),
                                  [](const T* p) { ::rust::Box<T>::from_raw(const_cast<T*>(p)); });
}

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
