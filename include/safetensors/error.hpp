// The library's one exception type, with a stable kind.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace safetensors {

/// What went wrong. The values match the Rust core's error kinds; see the README for when each
/// one happens.
enum class ErrorKind : std::uint8_t {
  HeaderTooSmall,                ///< The file is shorter than the 8-byte length prefix.
  HeaderTooLarge,                ///< The length prefix exceeds 100,000,000 bytes.
  InvalidHeaderLength,           ///< The header extends past the end of the file.
  InvalidHeader,                 ///< The header is not UTF-8.
  InvalidHeaderDeserialization,  ///< The header is not JSON of the safetensors schema.
  InvalidOffset,                 ///< Tensor offsets leave a gap, overlap, or run backwards.
  ValidationOverflow,            ///< A shape's size does not fit in 64 bits.
  MisalignedSlice,               ///< A sub-byte tensor or slice does not end on a byte boundary.
  TensorInvalidInfo,             ///< A tensor's byte length disagrees with its dtype and shape.
  MetadataIncompleteBuffer,      ///< Bytes are missing after the tensors, or left over.
  TensorNotFound,                ///< No tensor has this name.
  DuplicateKey,                  ///< A tensor name or metadata key appears twice.
  InvalidTensorName,             ///< `__metadata__` cannot be a tensor name.
  InvalidSlice,                  ///< A slice does not fit the tensor.
  Io,                            ///< The operating system refused an open, read or write.
  InvalidIndex,                  ///< A sharded checkpoint's index file is malformed.
  ShardMissing,                  ///< A shard, or a tensor the index puts in it, is missing.
  ShardMismatch,                 ///< A shard holds a tensor the index assigns elsewhere.
  InvalidShardPath,              ///< A shard path escapes the index's directory.
  Cuda,                          ///< CUDA is unavailable or a CUDA call failed.
  Internal,                      ///< A defect in this library; please report it.
  TypeMismatch,                  ///< `TensorView::as<T>()` with a `T` that does not fit.
  BudgetExceeded,                ///< A bounded stream waits on tensors the caller still holds.
};

/// Number of error kinds.
inline constexpr std::size_t error_kind_count = 23;

/// The enumerator's name, e.g. `to_string(ErrorKind::InvalidOffset) == "InvalidOffset"`.
[[nodiscard]] constexpr std::string_view to_string(ErrorKind kind) {
  constexpr std::array<std::string_view, error_kind_count> names = {"HeaderTooSmall",
                                                                    "HeaderTooLarge",
                                                                    "InvalidHeaderLength",
                                                                    "InvalidHeader",
                                                                    "InvalidHeaderDeserialization",
                                                                    "InvalidOffset",
                                                                    "ValidationOverflow",
                                                                    "MisalignedSlice",
                                                                    "TensorInvalidInfo",
                                                                    "MetadataIncompleteBuffer",
                                                                    "TensorNotFound",
                                                                    "DuplicateKey",
                                                                    "InvalidTensorName",
                                                                    "InvalidSlice",
                                                                    "Io",
                                                                    "InvalidIndex",
                                                                    "ShardMissing",
                                                                    "ShardMismatch",
                                                                    "InvalidShardPath",
                                                                    "Cuda",
                                                                    "Internal",
                                                                    "TypeMismatch",
                                                                    "BudgetExceeded"};
  auto i = static_cast<std::size_t>(kind);
  return i < error_kind_count ? names[i] : std::string_view{};
}

/// Every error the library reports. `what()` names the file, the tensor and the sizes involved,
/// with a hint where a common cause is known; `kind()` is stable for programs to test.
///
///   try { safetensors::SafeOpen f("model.safetensors"); }
///   catch (const safetensors::Error& e) { if (e.kind() == ErrorKind::Io) ...; }
class Error : public std::runtime_error {
 public:
  /// A NUL in `message` (a tensor name or path may hold one) is written `\0`: `what()` is a C
  /// string, and would otherwise end there.
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(whole(message)), kind_(kind) {}

  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }

 private:
  static std::string whole(std::string text) {
    for (auto at = text.find('\0'); at != std::string::npos; at = text.find('\0', at + 2))
      text.replace(at, 1, "\\0");
    return text;
  }

  ErrorKind kind_;
};

}  // namespace safetensors
