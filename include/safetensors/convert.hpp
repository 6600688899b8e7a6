// Dtype conversion and dequantization: any tensor into F32, F64, F16, BF16, the 8-bit floats,
// F4 or F6, bit for bit as ml_dtypes' and NumPy's `astype`; fp8 weights with block scales
// (DeepSeek-V3) and MXFP4 blocks (gpt-oss) into plain floats. The work is done by the Rust core
// (`rust/core/src/convert/`); these wrappers size buffers and translate errors.
#pragma once

#include "safetensors/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/detail/allocate.hpp"
#include "safetensors/detail/bridge.hpp"
#include "safetensors/detail/overlap.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/error.hpp"
#include "safetensors/ffi/src/convert.rs.h"
#include "safetensors/tensor.hpp"

namespace safetensors {
inline namespace SAFETENSORS_ABI {

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

/// A new `to` tensor of `shape`, in a buffer of `len` bytes the view owns, filled by `fill` (a
/// bridge call writing into the span it is given). `len` comes from the core's sizing of the
/// operation (`ffi::converted_len`, ...), which makes every check the operation makes of its
/// inputs first: so an allocating call reports what the same call into a caller's buffer
/// reports, and nothing is sized from a shape before the shape is checked against its bytes.
template <class Fill>
Expected<TensorView> converted(Dtype to, std::vector<std::size_t> shape, std::size_t len, Fill&& fill) {
  auto buffer = allocate_bytes(len, "a converted " + std::string(to_string(to)) + " tensor");
  if (!buffer) return buffer.status();
  if (auto st = std::forward<Fill>(fill)(std::span<std::byte>{buffer->get(), len}); !st.ok()) return st;
  TensorView out{to, std::move(shape), {buffer->get(), len}, {}};
  out.owner = std::move(*buffer);
  return out;
}

/// Bytes `src` converted to `to` takes, after every check the conversion makes (the core's
/// `converted_len`).
inline Expected<std::size_t> converted_len(const TensorView& src, Dtype to) {
  return attempt([&](ffi::Status& st) {
    return ffi::converted_len(static_cast<std::uint8_t>(src.dtype), sizes(src.shape), data_bytes(src.data),
                              static_cast<std::uint8_t>(to), st);
  });
}

/// `n` elements of `T` converted from `src`, in a vector.
template <class T>
Expected<std::vector<T>> converted_vector(const TensorView& src, Dtype to);
}  // namespace detail

namespace nothrow {

/// `safetensors::convert(src, to, dst)` without exceptions.
inline Status convert(const TensorView& src, Dtype to, std::span<std::byte> dst) {
  if (auto st = detail::refuse_overlap("convert", src.data, dst); !st.ok()) return st;
  return detail::attempt([&](ffi::Status& st) {
    ffi::convert_tensor(static_cast<std::uint8_t>(src.dtype), detail::sizes(src.shape),
                        detail::data_bytes(src.data), static_cast<std::uint8_t>(to), detail::bytes_mut(dst),
                        st);
  });
}

/// `safetensors::convert(src, to)` without exceptions.
[[nodiscard]] inline Expected<TensorView> convert(const TensorView& src, Dtype to) {
  auto len = detail::converted_len(src, to);
  if (!len) return len.status();
  return detail::converted(to, src.shape, *len,
                           [&](std::span<std::byte> dst) { return nothrow::convert(src, to, dst); });
}

/// `safetensors::as_f32` without exceptions.
[[nodiscard]] inline Expected<std::vector<float>> as_f32(const TensorView& src) {
  return detail::converted_vector<float>(src, Dtype::F32);
}

/// `safetensors::as_f64` without exceptions.
[[nodiscard]] inline Expected<std::vector<double>> as_f64(const TensorView& src) {
  return detail::converted_vector<double>(src, Dtype::F64);
}

/// `safetensors::dequantize_fp8_blocks` without exceptions.
[[nodiscard]] inline Expected<TensorView> dequantize_fp8_blocks(const TensorView& weight,
                                                                const TensorView& scale_inv,
                                                                Dtype to = Dtype::F32,
                                                                std::size_t block_rows = 128,
                                                                std::size_t block_cols = 128) {
  auto len = detail::attempt([&](ffi::Status& st) {
    return ffi::fp8_blocks_output_len(
        static_cast<std::uint8_t>(weight.dtype), detail::sizes(weight.shape), detail::data_bytes(weight.data),
        static_cast<std::uint8_t>(scale_inv.dtype), detail::sizes(scale_inv.shape),
        detail::data_bytes(scale_inv.data), block_rows, block_cols, static_cast<std::uint8_t>(to), st);
  });
  if (!len) return len.status();
  return detail::converted(to, weight.shape, *len, [&](std::span<std::byte> dst) {
    return detail::attempt([&](ffi::Status& st) {
      ffi::dequantize_fp8_blocks(static_cast<std::uint8_t>(weight.dtype), detail::sizes(weight.shape),
                                 detail::data_bytes(weight.data), static_cast<std::uint8_t>(scale_inv.dtype),
                                 detail::sizes(scale_inv.shape), detail::data_bytes(scale_inv.data),
                                 block_rows, block_cols, static_cast<std::uint8_t>(to),
                                 detail::bytes_mut(dst), st);
    });
  });
}

/// `safetensors::dequantize_mxfp4` without exceptions.
[[nodiscard]] inline Expected<TensorView> dequantize_mxfp4(const TensorView& blocks, const TensorView& scales,
                                                           Dtype to = Dtype::F32) {
  // The output has one dimension fewer than the blocks (the core checks the shapes first): the
  // core writes it over a copy of the blocks' shape, which is then cut to its length.
  std::vector<std::size_t> shape = blocks.shape;
  std::size_t len = 0;
  auto rank = detail::attempt([&](ffi::Status& st) {
    return ffi::mxfp4_output(
        static_cast<std::uint8_t>(blocks.dtype), detail::sizes(blocks.shape), detail::data_bytes(blocks.data),
        static_cast<std::uint8_t>(scales.dtype), detail::sizes(scales.shape), detail::data_bytes(scales.data),
        static_cast<std::uint8_t>(to), ffi::SizesMut{shape.data(), shape.size()}, len, st);
  });
  if (!rank) return rank.status();
  while (shape.size() > *rank) shape.pop_back();
  return detail::converted(to, std::move(shape), len, [&](std::span<std::byte> dst) {
    return detail::attempt([&](ffi::Status& st) {
      ffi::dequantize_mxfp4(static_cast<std::uint8_t>(blocks.dtype), detail::sizes(blocks.shape),
                            detail::data_bytes(blocks.data), static_cast<std::uint8_t>(scales.dtype),
                            detail::sizes(scales.shape), detail::data_bytes(scales.data),
                            static_cast<std::uint8_t>(to), detail::bytes_mut(dst), st);
    });
  });
}

}  // namespace nothrow

template <class T>
Expected<std::vector<T>> detail::converted_vector(const TensorView& src, Dtype to) {
  auto len = converted_len(src, to);
  if (!len) return len.status();
  auto out = checked_vector<T>(*len / sizeof(T), "a converted " + std::string(to_string(to)) + " tensor",
                               "convert into a buffer of your own, in pieces");
  if (!out) return out.status();
  // A span from pointer and size: one built from the vector itself would instantiate the
  // ranges machinery for each element type. Its size is the vector's own bytes, not `*len`: a
  // `T` that is not `to`'s element leaves the vector shorter than `*len`, and the core then
  // refuses the destination instead of writing past the vector.
  const std::span<std::byte> dst{reinterpret_cast<std::byte*>(out->data()), out->size() * sizeof(T)};
  if (auto st = nothrow::convert(src, to, dst); !st.ok()) return st;
  return out;
}

/// Converts every element of `src` (any dtype but C64, any alignment of its data) into `to`,
/// writing exactly `numel × size(to)` bytes to `dst` (else `TensorInvalidInfo`). Rounds to
/// nearest even, with ml_dtypes' overflow and NaN rules; integers and BOOL as NumPy's `astype`.
/// A target that is not a float dtype, or a C64 source, is `TypeMismatch`; an F4 or F6 count
/// that ends inside a byte, of the source or of the target, is `MisalignedSlice`. Every error
/// but the destination's is the one the allocating `convert(src, to)` gives.
///
///   std::vector<float> out(w.numel());
///   safetensors::convert(w, Dtype::F32, std::as_writable_bytes(std::span(out)));
inline void convert(const TensorView& src, Dtype to, std::span<std::byte> dst) {
  nothrow::convert(src, to, dst).throw_if_error();
}

/// The converted tensor, in a new 64-byte aligned buffer that the returned view owns.
///
///   safetensors::TensorView w32 = safetensors::convert(f.get_tensor("w"), Dtype::F32);
///   std::span<const float> values = w32.as<float>();
[[nodiscard]] inline TensorView convert(const TensorView& src, Dtype to) {
  return nothrow::convert(src, to).value();
}

/// The elements as a `std::vector<float>` (any dtype but C64).
[[nodiscard]] inline std::vector<float> as_f32(const TensorView& src) {
  return nothrow::as_f32(src).value();
}

/// The elements as a `std::vector<double>` (any dtype but C64).
[[nodiscard]] inline std::vector<double> as_f64(const TensorView& src) {
  return nothrow::as_f64(src).value();
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
  return nothrow::dequantize_fp8_blocks(weight, scale_inv, to, block_rows, block_cols).value();
}

/// gpt-oss style MXFP4 dequantization: U8 `blocks` `[..., G, 16]` (32 F4 values per group, low
/// nibble first) and U8 `scales` `[..., G]` (E8M0 exponents) give `[..., G*32]` values of `to`
/// (8 bits or more). As Hugging Face transformers' `convert_moe_packed_tensors`, without its
/// final transpose.
[[nodiscard]] inline TensorView dequantize_mxfp4(const TensorView& blocks, const TensorView& scales,
                                                 Dtype to = Dtype::F32) {
  return nothrow::dequantize_mxfp4(blocks, scales, to).value();
}

}  // namespace SAFETENSORS_ABI
}  // namespace safetensors
