// The library's version: macros for the preprocessor, `safetensors::version()` for the library a
// program actually linked.
//
// This header is the one place the version is written: CMake reads these three macros for
// `project(VERSION ...)`, the pkg-config file and the package version file, and the Rust build
// script refuses to build when Cargo.toml's version disagrees.
//
// Headers and library must come from the same release (the headers call into the library's
// bridge, whose functions change between releases). Every program that includes these headers
// references a symbol named after the headers' version, `safetensors_library_v<MAJOR>_<MINOR>_<PATCH>`,
// which only the library of that exact version defines: mixing versions fails at link time with
// "undefined reference to `safetensors_library_v0_1_0'" instead of misbehaving at run time.
#pragma once

#include "safetensors/abi.hpp"

#include <cstdint>
#include <string>

#define SAFETENSORS_VERSION_MAJOR 0
#define SAFETENSORS_VERSION_MINOR 1
#define SAFETENSORS_VERSION_PATCH 0

#define SAFETENSORS_DETAIL_STR_(x) #x
#define SAFETENSORS_DETAIL_STR(x) SAFETENSORS_DETAIL_STR_(x)
/// "MAJOR.MINOR.PATCH" of these headers.
#define SAFETENSORS_VERSION_STRING                  \
  SAFETENSORS_DETAIL_STR(SAFETENSORS_VERSION_MAJOR) \
  "." SAFETENSORS_DETAIL_STR(SAFETENSORS_VERSION_MINOR) "." SAFETENSORS_DETAIL_STR(SAFETENSORS_VERSION_PATCH)

#define SAFETENSORS_DETAIL_LIBRARY_SYMBOL_(a, b, c) safetensors_library_v##a##_##b##_##c
#define SAFETENSORS_DETAIL_LIBRARY_SYMBOL(a, b, c) SAFETENSORS_DETAIL_LIBRARY_SYMBOL_(a, b, c)
#define SAFETENSORS_DETAIL_LIBRARY_VERSION                                                \
  SAFETENSORS_DETAIL_LIBRARY_SYMBOL(SAFETENSORS_VERSION_MAJOR, SAFETENSORS_VERSION_MINOR, \
                                    SAFETENSORS_VERSION_PATCH)

/// Defined by the library (rust/cxx): its version packed as `major << 16 | minor << 8 | patch`.
extern "C" std::uint32_t SAFETENSORS_DETAIL_LIBRARY_VERSION();

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// A release number.
struct Version {
  std::uint32_t major;
  std::uint32_t minor;
  std::uint32_t patch;

  friend constexpr bool operator==(const Version&, const Version&) = default;
  /// "MAJOR.MINOR.PATCH"
  [[nodiscard]] std::string to_string() const {
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  }
};

/// The version of these headers.
inline constexpr Version header_version{SAFETENSORS_VERSION_MAJOR, SAFETENSORS_VERSION_MINOR,
                                        SAFETENSORS_VERSION_PATCH};

/// The version of the library this program linked (equal to `header_version`: a mismatch does
/// not link).
///
///   std::printf("safetensors %s\n", safetensors::version().to_string().c_str());
[[nodiscard]] inline Version version() noexcept {
  std::uint32_t v = SAFETENSORS_DETAIL_LIBRARY_VERSION();
  return {v >> 16, (v >> 8) & 0xffu, v & 0xffu};
}

namespace detail {
// Initialised in every translation unit that includes the headers, so that every program using
// them references the versioned symbol and a header/library mismatch cannot link.
inline const std::uint32_t linked_library_version = SAFETENSORS_DETAIL_LIBRARY_VERSION();
}  // namespace detail

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
