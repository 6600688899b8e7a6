// Dtype conversion and dequantization: any tensor into F32, F64, F16, BF16, the 8-bit floats,
// F4 or F6, bit for bit as ml_dtypes' and NumPy's `astype`; fp8 weights with block scales
// (DeepSeek-V3) and MXFP4 blocks (gpt-oss) into plain floats. The work is done by the Rust core
// (`rust/core/src/convert/`); these wrappers size buffers and translate errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/tensor.hpp"

namespace safetensors {

/// Whether `d` is a float dtype, i.e. a target `convert` accepts (F4 to F64; not C64).
[[nodiscard]] constexpr bool is_float(Dtype d) {
  using enum Dtype;
  switch (d) {
    case F4:
    case F6_E2M3:
    case F6_E3M2:
    case F8_E5M2:
    case F8_E4M3:
    case F8_E8M0:
    case F8_E4M3FNUZ:
    case F8_E5M2FNUZ:
    case F16:
    case BF16:
    case F32:
    case F64:
      return true;
    default:
      return false;
  }
}

namespace detail {
inline ::rust::Slice<const std::uint8_t> u8s(std::span<const std::byte> s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}
inline ::rust::Slice<std::uint8_t> u8s_mut(std::span<std::byte> s) {
  return {reinterpret_cast<std::uint8_t*>(s.data()), s.size()};
}
inline ::rust::Slice<const std::size_t> dims(const std::vector<std::size_t>& shape) {
  return {shape.data(), shape.size()};
}

/// Bytes of `numel(shape)` elements of `to`, or a typed error when that overflows or ends
/// inside a byte.
inline std::size_t converted_bytes(const std::vector<std::size_t>& shape, Dtype to) {
  std::size_t n = 1;
  for (auto d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw Error(ErrorKind::ValidationOverflow, "the tensor's element count does not fit in 64 bits");
    }
  }
  std::size_t bits = 0;
  if (__builtin_mul_overflow(n, bit_size(to), &bits)) {
    throw Error(ErrorKind::ValidationOverflow,
                std::to_string(n) + " elements of " + std::string(to_string(to)) + " do not fit in memory");
  }
  if (bits % 8 != 0) {
    throw Error(ErrorKind::MisalignedSlice,
                std::to_string(n) + " elements of " + std::string(to_string(to)) +
                    " do not end on a byte boundary (F4 needs an even count, F6 a "
                    "multiple of 4)");
  }
  return bits / 8;
}

/// A new buffer of `n` bytes for a converted tensor; running out of memory is a typed error.
inline std::shared_ptr<std::byte[]> allocate_converted(std::size_t n, Dtype to) {
  return allocate_bytes(n, "a converted " + std::string(to_string(to)) + " tensor");
}
}  // namespace detail

/// Converts every element of `src` (any dtype but C64, any alignment of its data) into `to`,
/// writing exactly `numel × size(to)` bytes to `dst` (else `TensorInvalidInfo`). Rounds to
/// nearest even, with ml_dtypes' overflow and NaN rules; integers and BOOL as NumPy's `astype`.
/// A target that is not a float dtype, or a C64 source, is `TypeMismatch`.
///
///   std::vector<float> out(w.numel());
///   safetensors::convert(w, Dtype::F32, std::as_writable_bytes(std::span(out)));
inline void convert(const TensorView& src, Dtype to, std::span<std::byte> dst) {
  detail::call([&] {
    ffi::convert_tensor(static_cast<std::uint8_t>(src.dtype), detail::dims(src.shape), detail::u8s(src.data),
                        static_cast<std::uint8_t>(to), detail::u8s_mut(dst));
  });
}

/// The converted tensor, in a new 64-byte aligned buffer that the returned view owns.
///
///   safetensors::TensorView w32 = safetensors::convert(f.get_tensor("w"), Dtype::F32);
///   std::span<const float> values = w32.as<float>();
[[nodiscard]] inline TensorView convert(const TensorView& src, Dtype to) {
  if (!is_float(to) || src.dtype == Dtype::C64) {
    convert(src, to, {});  // reports the TypeMismatch with the core's message
  }
  std::size_t len = detail::converted_bytes(src.shape, to);
  auto buffer = detail::allocate_converted(len, to);
  convert(src, to, {buffer.get(), len});
  TensorView out{to, src.shape, {buffer.get(), len}, {}};
  out.owner = std::move(buffer);
  return out;
}

/// The elements as a `std::vector<float>` (any dtype but C64).
[[nodiscard]] inline std::vector<float> as_f32(const TensorView& src) {
  std::vector<float> out(detail::converted_bytes(src.shape, Dtype::F32) / sizeof(float));
  convert(src, Dtype::F32, std::as_writable_bytes(std::span(out)));
  return out;
}

/// The elements as a `std::vector<double>` (any dtype but C64).
[[nodiscard]] inline std::vector<double> as_f64(const TensorView& src) {
  std::vector<double> out(detail::converted_bytes(src.shape, Dtype::F64) / sizeof(double));
  convert(src, Dtype::F64, std::as_writable_bytes(std::span(out)));
  return out;
}

/// DeepSeek-V3 style fp8 dequantization: a 2-D `weight` (F8_E4M3, or any float of 8 bits or
/// more) times `scale_inv` (F32, shape `[ceil(rows/128), ceil(cols/128)]`), block by block,
/// computed in F32 and stored as `to` (8 bits or more). Edge blocks may be partial.
///
///   auto w = safetensors::dequantize_fp8_blocks(f.get_tensor("q_proj.weight"),
///                                               f.get_tensor("q_proj.weight_scale_inv"), Dtype::BF16);
[[nodiscard]] inline TensorView dequantize_fp8_blocks(const TensorView& weight, const TensorView& scale_inv,
                                                      Dtype to = Dtype::F32, std::size_t block_rows = 128,
                                                      std::size_t block_cols = 128) {
  if (!is_float(to)) convert(weight, to, {});  // TypeMismatch, named by the core
  std::size_t len = detail::converted_bytes(weight.shape, to);
  auto buffer = detail::allocate_converted(len, to);
  detail::call([&] {
    ffi::dequantize_fp8_blocks(static_cast<std::uint8_t>(weight.dtype), detail::dims(weight.shape),
                               detail::u8s(weight.data), static_cast<std::uint8_t>(scale_inv.dtype),
                               detail::dims(scale_inv.shape), detail::u8s(scale_inv.data), block_rows,
                               block_cols, static_cast<std::uint8_t>(to),
                               detail::u8s_mut({buffer.get(), len}));
  });
  TensorView out{to, weight.shape, {buffer.get(), len}, {}};
  out.owner = std::move(buffer);
  return out;
}

/// gpt-oss style MXFP4 dequantization: U8 `blocks` `[..., G, 16]` (32 F4 values per group, low
/// nibble first) and U8 `scales` `[..., G]` (E8M0 exponents) give `[..., G*32]` values of `to`
/// (8 bits or more). As Hugging Face transformers' `convert_moe_packed_tensors`, without its
/// final transpose.
[[nodiscard]] inline TensorView dequantize_mxfp4(const TensorView& blocks, const TensorView& scales,
                                                 Dtype to = Dtype::F32) {
  auto raw_shape = detail::call(
      [&] { return ffi::mxfp4_output_shape(detail::dims(blocks.shape), detail::dims(scales.shape)); });
  std::vector<std::size_t> shape(raw_shape.data(), raw_shape.data() + raw_shape.size());
  if (!is_float(to)) convert(blocks, to, {});
  std::size_t len = detail::converted_bytes(shape, to);
  auto buffer = detail::allocate_converted(len, to);
  detail::call([&] {
    ffi::dequantize_mxfp4(static_cast<std::uint8_t>(blocks.dtype), detail::dims(blocks.shape),
                          detail::u8s(blocks.data), static_cast<std::uint8_t>(scales.dtype),
                          detail::dims(scales.shape), detail::u8s(scales.data), static_cast<std::uint8_t>(to),
                          detail::u8s_mut({buffer.get(), len}));
  });
  TensorView out{to, std::move(shape), {buffer.get(), len}, {}};
  out.owner = std::move(buffer);
  return out;
}

}  // namespace safetensors
