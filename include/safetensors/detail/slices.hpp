// Private: `rust::Slice` for the bridges that still take slices (writing, streams, multi-rank
// plans, CUDA, pinned memory). The reading bridges take pointer-and-length spans instead (see
// `detail/bridge.hpp`), so that the reading headers need none of `rust/cxx.h`'s `<ranges>` and
// `<algorithm>`; only the headers of these heavier areas include this one.
#pragma once

#include "safetensors/abi.hpp"

#include <cstdint>
#include <string_view>

#include "safetensors/ffi/src/rust/cxx.h"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

// Copy out of `rust::Slice` through data() and size(), never its iterators: instantiating their
// arithmetic trips -Wsign-conversion inside cxx.h, which would break users building with
// -Wconversion -Werror.

/// Bytes of a string as a slice (no UTF-8 check), lent for the length of the call.
inline ::rust::Slice<const std::uint8_t> slice_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
