// The library's errors: a stable kind and a message, in two faces over one code path.
//
// The throwing API reports an error as the exception `Error`. The non-throwing API
// (`safetensors::nothrow::`, for code built with -fno-exceptions) returns it as a value: a
// `Status`, or an `Expected<T>` holding either a `T` or the `Status`. Each throwing call is
// `nothrow::<the same call>(...).value()`, so both faces give the same kind and message for the
// same input. In a program built without exceptions the throwing API still compiles; an error it
// would throw is printed and ends the process (`std::abort`), as cxx and the standard library do
// there: use the nothrow functions in such programs.
#pragma once

#include "safetensors/abi.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace safetensors {
inline namespace SAFETENSORS_ABI {

/// What went wrong. The values match the Rust core's error kinds; see docs/errors.md for when each
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
  TypeMismatch,                  ///< A type that does not fit (`as<T>()`, a conversion, a dtype value).
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

/// An outcome as a value: success (`ok()`), or an error's kind and message. What the
/// `nothrow::` functions return when there is no other result, and what an `Expected<T>` holds
/// when it holds no `T`.
///
///   if (auto st = safetensors::nothrow::save_file("out.safetensors", {{"w", view}}); !st.ok())
///     std::fprintf(stderr, "%s\n", st.message().c_str());
class [[nodiscard]] Status {
 public:
  /// Success.
  Status() = default;
  /// An error of `kind`. A NUL in `message` (a tensor name or path may hold one) is written as
  /// the two characters `\0`, so that the message is whole as a C string too (`c_str()`,
  /// `Error::what()`), and both faces of an error carry the same text.
  Status(ErrorKind kind, std::string message)
      : failed_(true), kind_(kind), message_(without_nul(std::move(message))) {}

  [[nodiscard]] bool ok() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return ok(); }
  /// The error's kind (`Internal` when `ok()`: there is none).
  [[nodiscard]] ErrorKind kind() const noexcept { return failed_ ? kind_ : ErrorKind::Internal; }
  /// What went wrong, naming the file, the tensor and the sizes involved ("" when `ok()`).
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

  /// Throws the error as an `Error` (without exceptions: prints it and aborts); nothing when
  /// `ok()`. This is how the throwing API reports what the nothrow API returns.
  void throw_if_error() const;

 private:
  // A plain loop: GCC 12 at -O2 and above warns (maybe-uninitialized, a false positive) about
  // `std::string::find` inlined here, which breaks builds with -Werror.
  static std::string without_nul(std::string text) {
    std::size_t nuls = 0;
    for (char c : text) nuls += c == '\0' ? 1 : 0;
    if (nuls == 0) return text;
    std::string out;
    out.reserve(text.size() + nuls);
    for (char c : text) {
      if (c == '\0') {
        out += "\\0";
      } else {
        out += c;
      }
    }
    return out;
  }

  bool failed_ = false;
  ErrorKind kind_ = ErrorKind::Internal;
  std::string message_;
};

/// Every error the library reports. `what()` names the file, the tensor and the sizes involved,
/// with a hint where a common cause is known; `kind()` is stable for programs to test.
///
///   try { safetensors::SafeOpen f("model.safetensors"); }
///   catch (const safetensors::Error& e) { if (e.kind() == ErrorKind::Io) ...; }
class Error : public std::runtime_error {
 public:
  /// A NUL in `message` (a tensor name or path may hold one) is written `\0`, as `Status` writes
  /// it: `what()` is a C string, and would otherwise end there.
  Error(ErrorKind kind, const std::string& message) : Error(Status(kind, message)) {}
  /// The exception for an error `Status` (one that is not `ok()`).
  explicit Error(const Status& status) : std::runtime_error(status.message()), kind_(status.kind()) {}

  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }
  /// The same error as a value.
  [[nodiscard]] Status status() const { return Status(kind_, what()); }

 private:
  ErrorKind kind_;
};

namespace detail {
/// Reports an error the throwing way: throws `Error`, or in a program built without exceptions
/// prints it and aborts (the nothrow API never gets here).
[[noreturn]] inline void raise(const Status& status) {
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  throw Error(status);
#else
  const auto kind = to_string(status.kind());
  std::fprintf(stderr,
               "safetensors: %.*s error in a program built without exceptions (use the "
               "safetensors::nothrow API there): %.*s\n",
               static_cast<int>(kind.size()), kind.data(), static_cast<int>(status.message().size()),
               status.message().data());
  std::abort();
#endif
}

/// `raise(Status(kind, message))`.
[[noreturn]] inline void raise(ErrorKind kind, std::string message) {
  raise(Status(kind, std::move(message)));
}

/// The error an operation on a moved-from `SafeOpen`, `Checkpoint`, `Slice`, `Selection`, `Uploader`,
/// tensor iterator or range reports: a caller's mistake, as `Internal` (no kind fits better, and a
/// new one would change the stable set).
inline Status moved_from(std::string_view type) {
  return Status(ErrorKind::Internal, "this " + std::string(type) +
                                         " was moved from and holds nothing; use the " + std::string(type) +
                                         " it was moved into");
}
}  // namespace detail

inline void Status::throw_if_error() const {
  if (failed_) detail::raise(*this);
}

/// A `T`, or the error (`Status`) that kept the call from making one: what the `nothrow::`
/// functions return. `value()` gives the `T`, or reports the error the throwing way.
///
///   auto opened = safetensors::nothrow::open("model.safetensors");
///   if (!opened) std::puts(opened.status().message().c_str());
///   else auto w = safetensors::nothrow::get_tensor(*opened, "wte.weight");
template <class T>
class [[nodiscard]] Expected {
  static_assert(!std::is_reference_v<T> && !std::is_same_v<std::remove_cv_t<T>, Status>);

 public:
  using value_type = T;

  Expected(T value) : value_(std::move(value)), has_value_(true) {}  // NOLINT: implicit, like std::expected
  /// An error. An `ok()` status here (a defect) is turned into an `Internal` error, so that an
  /// `Expected` always holds one or the other.
  Expected(Status error)  // NOLINT: implicit, so that functions can `return status;`
      : status_(error.ok()
                    ? Status(ErrorKind::Internal, "an Expected was made from a success without a value")
                    : std::move(error)) {}

  // The value lives in a union rather than a `std::optional`: every header instantiates
  // `Expected` for some twenty types, and `std::optional`'s layers of traits cost each
  // translation unit about as much as the rest of `Expected` together. Copies and moves keep
  // `std::optional`'s meaning: a moved-from `Expected` still holds its (moved-from) value.
  Expected(const Expected& other) requires std::is_copy_constructible_v<T> : has_value_(other.has_value_),
                                                                             status_(other.status_) {
    if (has_value_) ::new (static_cast<void*>(&value_)) T(other.value_);
  }
  Expected(Expected&& other) noexcept(std::is_nothrow_move_constructible_v<T>)
      : has_value_(other.has_value_), status_(std::move(other.status_)) {
    if (has_value_) ::new (static_cast<void*>(&value_)) T(std::move(other.value_));
  }
  Expected& operator=(const Expected& other) requires(
      std::is_copy_constructible_v<T>&& std::is_copy_assignable_v<T>) {
    if (this != &other) {
      if (other.has_value_) {
        emplace(other.value_);
      } else {
        reset();
      }
      status_ = other.status_;
    }
    return *this;
  }
  Expected& operator=(Expected&& other) noexcept(
      std::is_nothrow_move_constructible_v<T>&& std::is_nothrow_move_assignable_v<T>) requires
      std::is_move_assignable_v<T> {
    if (this != &other) {
      if (other.has_value_) {
        emplace(std::move(other.value_));
      } else {
        reset();
      }
      status_ = std::move(other.status_);
    }
    return *this;
  }
  ~Expected() { reset(); }

  [[nodiscard]] bool has_value() const noexcept { return has_value_; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The outcome: `ok()` when there is a value, else the error.
  [[nodiscard]] const Status& status() const noexcept { return status_; }

  /// The value; without one, reports the error the throwing way (throws `Error`).
  [[nodiscard]] T& value() & {
    check();
    return value_;
  }
  [[nodiscard]] const T& value() const& {
    check();
    return value_;
  }
  /// On a temporary: the value moved out, by value (a reference would dangle in `for (auto& x :
  /// *nothrow::keys(f))`).
  [[nodiscard]] T value() && {
    check();
    return std::move(value_);
  }
  /// The value, or `fallback` when there is none.
  template <class U>
  [[nodiscard]] T value_or(U&& fallback) const& {
    return has_value_ ? value_ : static_cast<T>(std::forward<U>(fallback));
  }
  template <class U>
  [[nodiscard]] T value_or(U&& fallback) && {
    return has_value_ ? std::move(value_) : static_cast<T>(std::forward<U>(fallback));
  }

  /// The value; like `value()`, it never hands out a missing one.
  [[nodiscard]] T& operator*() & { return value(); }
  [[nodiscard]] const T& operator*() const& { return value(); }
  [[nodiscard]] T operator*() && { return std::move(*this).value(); }
  [[nodiscard]] T* operator->() { return &value(); }
  [[nodiscard]] const T* operator->() const { return &value(); }

 private:
  void check() const {
    if (!has_value_) detail::raise(status_);
  }

  void reset() noexcept {
    if (has_value_) {
      value_.~T();
      has_value_ = false;
    }
  }

  /// `value` assigned over the value held, or constructed in place when there is none.
  template <class V>
  void emplace(V&& value) {
    if (has_value_) {
      value_ = std::forward<V>(value);
    } else {
      ::new (static_cast<void*>(&value_)) T(std::forward<V>(value));
      has_value_ = true;
    }
  }

  union {
    T value_;
  };
  bool has_value_ = false;
  Status status_;
};

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
