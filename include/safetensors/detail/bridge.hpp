// Private: the generated bridge and the helpers that keep its types out of the public API.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/detail/overlap.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/ffi/lib.rs.h"
#include "safetensors/ffi/rust/cxx.h"
#include "safetensors/version.hpp"

namespace safetensors::inline SAFETENSORS_ABI::detail {

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
/// a call needs, with or without exceptions.
template <class F>
auto attempt(F&& call) {
  ffi::Status st{};
  using R = std::invoke_result_t<F, ffi::Status&>;
  if constexpr (std::is_void_v<R>) {
    std::forward<F>(call)(st);
    return status_of(st);
  } else {
    R result = std::forward<F>(call)(st);
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

/// Bytes a tensor `name` of `dtype` and `shape` takes, by the core's tensor byte-length rule
/// (`ValidationOverflow` when that overflows, `MisalignedSlice` when sub-byte elements end inside
/// a byte, `TypeMismatch` for a dtype value outside `Dtype`).
inline Expected<std::size_t> byte_length(std::string_view name, Dtype dtype,
                                         const std::vector<std::size_t>& shape) {
  ::rust::Slice<const std::size_t> dims{shape.data(), shape.size()};
  return attempt([&](ffi::Status& st) {
    return ffi::tensor_byte_len(bytes(name), static_cast<std::uint8_t>(dtype), dims, st);
  });
}

/// Why `bytes` bytes cannot be the data of tensor `what` of `dtype` and `shape`, if so: the
/// core's tensor byte-length rule (`ValidationOverflow`, `MisalignedSlice`, `TypeMismatch` as
/// `byte_length` says), and `TensorInvalidInfo` when the bytes are not that many. Every entry
/// point that takes a caller's view checks it so first, before its shape sizes anything.
inline Status check_extent(std::string_view what, Dtype dtype, const std::vector<std::size_t>& shape,
                           std::size_t bytes) {
  auto want = byte_length(what, dtype, shape);
  if (!want) return want.status();
  if (*want == bytes) return {};
  return Status(ErrorKind::TensorInvalidInfo, std::string(what) + " holds " + std::to_string(bytes) +
                                                  " bytes but its dtype and shape (" +
                                                  std::string(to_string(dtype)) + " " + shape_text(shape) +
                                                  ") make " + std::to_string(*want));
}

// Copy out of `rust::Slice` through data() and size(), never its iterators: instantiating their
// arithmetic trips -Wsign-conversion inside cxx.h, which would break users building with
// -Wconversion -Werror.

/// A bridge metadata map (of a file or a checkpoint) as a `std::map`.
inline std::map<std::string, std::string> metadata_of(const ffi::Metadata& m) {
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i < m.len(); ++i) out.emplace(view(m.key(i)), view(m.value(i)));
  return out;
}

/// An open file, shared by every copy of a `SafeOpen` and every view taken from it.
struct FileHandle {
  ::rust::Box<ffi::File> file;
  std::string path;
};

/// Shared ownership of a Rust object, so the C++ value types holding it stay copyable.
template <class T>
std::shared_ptr<const T> share(::rust::Box<T> box) {
  return std::shared_ptr<const T>(box.into_raw(),
                                  [](const T* p) { ::rust::Box<T>::from_raw(const_cast<T*>(p)); });
}

}  // namespace safetensors::inline SAFETENSORS_ABI::detail
