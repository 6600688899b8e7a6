// Element types, spelled exactly as in safetensors headers.
#pragma once

#include "safetensors/abi.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// A tensor's element type. The enumerators are in the format's order (also its alignment
/// order); their values match the Rust core's, which the bridge relies on.
enum class Dtype : std::uint8_t {
  BOOL,
  F4,
  F6_E2M3,
  F6_E3M2,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64
};

/// Number of dtypes.
inline constexpr std::size_t dtype_count = 22;

namespace detail {
inline constexpr std::array<std::string_view, dtype_count> dtype_names = {
    "BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
    "U32",     "F32",         "C64",         "F64",     "I64", "U64"};
inline constexpr std::array<std::uint8_t, dtype_count> dtype_bits = {
    8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
}  // namespace detail

/// The header spelling, e.g. `to_string(Dtype::F32) == "F32"`.
[[nodiscard]] constexpr std::string_view to_string(Dtype dtype) {
  auto i = static_cast<std::size_t>(dtype);
  return i < dtype_count ? detail::dtype_names[i] : std::string_view{};
}

/// Parses an exact header spelling: `dtype_from_string("F32") == Dtype::F32`; `"f32"` is not.
[[nodiscard]] constexpr std::optional<Dtype> dtype_from_string(std::string_view name) {
  for (std::size_t i = 0; i < dtype_count; ++i) {
    if (detail::dtype_names[i] == name) return static_cast<Dtype>(i);
  }
  return std::nullopt;
}

/// Bits per element: 4 for F4, 6 for the F6 types, 8 to 64 for the rest.
[[nodiscard]] constexpr std::size_t bit_size(Dtype dtype) {
  auto i = static_cast<std::size_t>(dtype);
  return i < dtype_count ? detail::dtype_bits[i] : 0;
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
