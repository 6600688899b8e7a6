// Tensor descriptions and views.
#pragma once

#include "safetensors/abi.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/extent.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

namespace detail {
/// The product of `shape` (1 for a scalar): 0 when a dimension is 0, else `SIZE_MAX` when the
/// product does not fit, never a wrapped count that looks plausible.
[[nodiscard]] inline std::size_t element_count(const std::vector<std::size_t>& shape) {
  constexpr std::size_t most = std::numeric_limits<std::size_t>::max();
  std::size_t n = 1;
  for (auto d : shape) {
    if (d == 0) return 0;
    n = n > most / d ? most : n * d;
  }
  return n;
}
}  // namespace detail

/// A tensor's description from the header; reading it touches no tensor data.
struct TensorInfo {
  Dtype dtype{};
  std::vector<std::size_t> shape;
  /// `[begin, end)` byte offsets relative to the start of the data buffer.
  std::pair<std::size_t, std::size_t> data_offsets{};

  /// Number of elements (1 for a scalar).
  [[nodiscard]] std::size_t numel() const { return detail::element_count(shape); }
  /// Number of data bytes.
  [[nodiscard]] std::size_t byte_size() const { return data_offsets.second - data_offsets.first; }
};

namespace detail {
/// Whether elements of type `T` may be read from a tensor of `dtype`: the exact C++ type of the
/// dtype, raw storage of the same width for types C++ lacks (fp8 as `uint8_t`, fp16/bf16 as
/// `uint16_t`), or any other trivially copyable type of exactly the element's width.
template <class T>
constexpr bool dtype_accepts(Dtype d) {
  using enum Dtype;
  if constexpr (std::is_same_v<T, bool>)
    return d == BOOL;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return d == I8;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return d == U8 || d == BOOL || d == F8_E5M2 || d == F8_E4M3 || d == F8_E8M0 || d == F8_E4M3FNUZ ||
           d == F8_E5M2FNUZ;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return d == I16;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return d == U16 || d == F16 || d == BF16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return d == I32;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return d == U32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return d == I64;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return d == U64;
  else if constexpr (std::is_same_v<T, float>)
    return d == F32;
  else if constexpr (std::is_same_v<T, double>)
    return d == F64;
  // std::complex<float>, recognised by its members: <complex> (and the iostreams it pulls in)
  // would cost every translation unit that reads tensors.
  else if constexpr (requires(const T& t) {
                       { t.real() } -> std::same_as<float>;
                       { t.imag() } -> std::same_as<float>;
                     })
    return d == C64;
  else
    return bit_size(d) == sizeof(T) * 8;
}

template <class T>
inline constexpr bool is_raw_byte = std::is_same_v<T, std::byte> || std::is_same_v<T, char>;
}  // namespace detail

struct TensorView;

namespace nothrow {
/// `TensorView::as<T>()` without exceptions: the elements, or the `TypeMismatch` error.
///
///   auto values = safetensors::nothrow::as<float>(view);
///   if (!values) std::puts(values.status().message().c_str());
template <class T>
[[nodiscard]] Expected<std::span<const T>> as(const TensorView& view);
/// Not on a temporary view: the span would dangle (see `TensorView::as`).
template <class T>
void as(const TensorView&& view) =
    SAFETENSORS_DELETE("as<T>() of a temporary view would dangle: keep the view in a variable");
}  // namespace nothrow

/// A tensor's dtype, shape and bytes.
///
/// Views from `SafeOpen::get_tensor` point into the file's mapping (or, with the read backend,
/// into a buffer of their own), and `owner` keeps that memory alive: a view stays valid after
/// the `SafeOpen` that made it is gone. A view you build over your own memory (for example to
/// pass to `save_file`) leaves `owner` empty and borrows your bytes.
///
/// Moving a view leaves the moved-from view empty (no shape, no data, no owner), so that it can
/// never reach bytes that only the new view keeps alive: `as<float>()` on it is a
/// `TypeMismatch` error, `as<std::byte>()` an empty span, and the library's calls see a scalar
/// with no bytes (`TensorInvalidInfo`).
///
///   std::vector<float> values{1, 2, 3, 4, 5, 6};
///   safetensors::TensorView t{safetensors::Dtype::F32, {2, 3}, std::as_bytes(std::span(values))};
struct TensorView {
  Dtype dtype{};
  std::vector<std::size_t> shape;
  /// Little-endian, row-major element bytes.
  std::span<const std::byte> data;
  /// Keeps `data` alive; empty when the view borrows memory the caller owns.
  std::shared_ptr<const void> owner{};

  TensorView() = default;
  /// Not an aggregate (a moved-from view must be emptied), so this constructor takes the
  /// members in their order: `TensorView{dtype, shape, data, owner}` as before.
  TensorView(Dtype element_type, std::vector<std::size_t> dims, std::span<const std::byte> bytes = {},
             std::shared_ptr<const void> keep_alive = {})
      : dtype(element_type), shape(std::move(dims)), data(bytes), owner(std::move(keep_alive)) {}
  TensorView(const TensorView&) = default;
  TensorView& operator=(const TensorView&) = default;
  TensorView(TensorView&& other) noexcept
      : dtype(other.dtype),
        shape(std::exchange(other.shape, {})),
        data(std::exchange(other.data, {})),
        owner(std::exchange(other.owner, {})) {}
  TensorView& operator=(TensorView&& other) noexcept {
    if (this != &other) {
      dtype = other.dtype;
      shape = std::exchange(other.shape, {});
      data = std::exchange(other.data, {});
      owner = std::exchange(other.owner, {});
    }
    return *this;
  }
  ~TensorView() = default;

  /// Number of elements (1 for a scalar; `SIZE_MAX` for a shape whose product does not fit,
  /// which no view can hold).
  [[nodiscard]] std::size_t numel() const { return detail::element_count(shape); }

  /// The elements as `T`: `view.as<float>()` for an F32 tensor, `as<std::byte>()` for the raw
  /// bytes of any dtype. Throws `Error` (`TypeMismatch`) when `T` does not fit the dtype, the
  /// byte count (checked by the tensor byte-length rule, so a shape whose size overflows never
  /// matches), or the data's alignment (files written with an unpadded header can leave data
  /// unaligned; copy the bytes then).
  ///
  /// BOOL data: `as<bool>()` checks every byte first and throws `TypeMismatch` when one is not
  /// 0 or 1 (the format, and Python's reader, accept any byte; reading such a byte as `bool` is
  /// undefined behaviour in C++). `as<std::uint8_t>()` reads BOOL bytes as they are.
  ///
  /// Only on a view held in a variable: the span borrows the view's `owner`, so calling it on a
  /// temporary (`f.get_tensor("w").as<float>()`) would dangle with the read backend and does not
  /// compile.
  template <class T>
  [[nodiscard]] std::span<const T> as() const& {
    return nothrow::as<T>(*this).value();
  }
  template <class T>
  std::span<const T> as() const&& =
      SAFETENSORS_DELETE("as<T>() of a temporary view would dangle: keep the view in a variable");
};

/// A tensor and its name: what iterating over a `SafeOpen`, a `Checkpoint` or `LoadedTensors`
/// gives, one at a time.
///
///   for (const auto& [name, view] : f) std::printf("%s: %zu bytes\n", name.c_str(), view.data.size());
struct NamedTensor {
  std::string name;
  TensorView view;
};

namespace detail {
/// Why a BOOL tensor's bytes cannot be read as C++ `bool` (one is neither 0 nor 1), if so.
inline Status check_bool_bytes(std::span<const std::byte> data) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    auto b = static_cast<unsigned>(data[i]);
    if (b > 1) {
      return Status(ErrorKind::TypeMismatch, "BOOL element " + std::to_string(i) + " holds the byte " +
                                                 std::to_string(b) +
                                                 ", which is not a C++ bool (0 or 1); read the bytes with "
                                                 "as<std::uint8_t>() and treat nonzero as true");
    }
  }
  return {};
}
}  // namespace detail

template <class T>
Expected<std::span<const T>> nothrow::as(const TensorView& view) {
  static_assert(std::is_trivially_copyable_v<T>, "as<T>() needs a trivially copyable T");
  const auto& data = view.data;
  if constexpr (detail::is_raw_byte<T>) {
    return std::span<const T>{reinterpret_cast<const T*>(data.data()), data.size()};
  } else {
    if (!detail::dtype_accepts<T>(view.dtype)) {
      return Status(ErrorKind::TypeMismatch, "cannot view a " + std::string(to_string(view.dtype)) +
                                                 " tensor as elements of " + std::to_string(sizeof(T)) +
                                                 " bytes of a different type");
    }
    // The byte-length rule, not `numel() * sizeof(T)`: a shape whose product wraps must not
    // match a short buffer.
    if (auto bad = detail::check_extent("the view", view.dtype, view.shape, data.size()); !bad.ok()) {
      return Status(ErrorKind::TypeMismatch, bad.message());
    }
    if (data.empty()) return std::span<const T>{};
    if constexpr (std::is_same_v<T, bool>) {
      if (auto bad = detail::check_bool_bytes(data); !bad.ok()) return bad;
    }
    if (reinterpret_cast<std::uintptr_t>(data.data()) % alignof(T) != 0) {
      return Status(ErrorKind::TypeMismatch,
                    "the tensor's data is not aligned to " + std::to_string(alignof(T)) +
                        " bytes (its file has an unpadded header); copy the bytes first");
    }
    return std::span<const T>{reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
