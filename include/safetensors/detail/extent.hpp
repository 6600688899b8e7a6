// Private: the core's tensor byte-length rule, as every entry point that takes a caller's view
// checks it before the view's shape sizes anything.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/ffi/src/convert.rs.h"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

/// Bytes a tensor `name` of `dtype` and `shape` takes, by the core's tensor byte-length rule
/// (`ValidationOverflow` when that overflows, `MisalignedSlice` when sub-byte elements end inside
/// a byte, `TypeMismatch` for a dtype value outside `Dtype`).
inline Expected<std::size_t> byte_length(std::string_view name, Dtype dtype,
                                         const std::vector<std::size_t>& shape) {
  return attempt([&](ffi::Status& st) {
    return ffi::tensor_byte_len(bytes(name), static_cast<std::uint8_t>(dtype), sizes(shape), st);
  });
}

/// Why `bytes` bytes cannot be the data of tensor `what` of `dtype` and `shape`, if so: the
/// core's `check_data_len`, the tensor byte-length rule (`ValidationOverflow`, `MisalignedSlice`,
/// `TypeMismatch` as `byte_length` says), and `TensorInvalidInfo` when the bytes are not that many. Every
/// entry point that takes a caller's view checks it so first, before its shape sizes anything.
inline Status check_extent(std::string_view what, Dtype dtype, const std::vector<std::size_t>& shape,
                           std::size_t bytes) {
  return attempt([&](ffi::Status& st) {
    ffi::check_data_len(detail::bytes(what), static_cast<std::uint8_t>(dtype), sizes(shape), bytes, st);
  });
}

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
