// Private: output buffers that overlap what a call reads, refused before any bytes move.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {
namespace detail {

/// Whether two byte ranges share a byte (without forming an address past either range).
inline bool overlaps(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
  return a0 >= b0 ? a0 - b0 < b.size() : b0 - a0 < a.size();
}

/// `InvalidSlice` when the output `dst` of `call` overlaps `src`, the bytes the call reads.
///
/// Every call that writes into a caller's buffer checks this before the bridge sees the buffer:
/// Rust may not hold a mutable slice over bytes it also reads (undefined behaviour), and a
/// conversion in place would read bytes it has already overwritten. Overlap is refused rather
/// than handled: handling it takes a staging copy (twice the memory of the largest tensors) or
/// a loop order per dtype pair and offset, and a file in memory must not change under its
/// readers anyway. The kind is `InvalidSlice`, the kind of every unfit output buffer.
inline Status refuse_overlap(std::string_view call, std::span<const std::byte> src,
                             std::span<const std::byte> dst) {
  if (!overlaps(src, dst)) return {};
  return Status(ErrorKind::InvalidSlice,
                std::string(call) + ": the destination (" + std::to_string(dst.size()) +
                    " bytes) overlaps the bytes it reads (" + std::to_string(src.size()) +
                    " bytes); write into a separate buffer");
}

}  // namespace detail
}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
