//! Dtype conversion and dequantization (bridge and glue): dtypes cross as their enum index (the
//! public `Dtype`'s values, which `enums_test` checks against the core's), shapes and bytes as
//! slices; everything else is `safetensors_core::convert`.

use safetensors_core::convert;
use safetensors_core::{Error, TensorView};

use crate::status::{guard, Status};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        type Status = crate::status::ffi::Status;
    }

    extern "Rust" {
        /// Converts the elements of a `from` tensor of `shape` into `to` (`dst` holds exactly
        /// numel × size(to) bytes).
        fn convert_tensor(
            from: u8,
            shape: &[usize],
            src: &[u8],
            to: u8,
            dst: &mut [u8],
            status: &mut Status,
        );
        /// Bytes a tensor `name` of `dtype` and `shape` takes (the tensor byte-length rule).
        fn tensor_byte_len(name: &[u8], dtype: u8, shape: &[usize], status: &mut Status) -> usize;
        /// DeepSeek-V3 style: a 2-D weight times its per-block scales, into `to`.
        #[allow(clippy::too_many_arguments)]
        fn dequantize_fp8_blocks(
            weight_dtype: u8,
            weight_shape: &[usize],
            weight: &[u8],
            scale_dtype: u8,
            scale_shape: &[usize],
            scale: &[u8],
            block_rows: usize,
            block_cols: usize,
            to: u8,
            dst: &mut [u8],
            status: &mut Status,
        );
        /// Shape of an MXFP4 dequantization: `[..., G, 16]` blocks give `[..., G*32]`.
        fn mxfp4_output_shape(
            blocks_shape: &[usize],
            scales_shape: &[usize],
            status: &mut Status,
        ) -> Vec<usize>;
        /// gpt-oss style MXFP4 blocks and E8M0 scales, into `to`.
        #[allow(clippy::too_many_arguments)]
        fn dequantize_mxfp4(
            blocks_dtype: u8,
            blocks_shape: &[usize],
            blocks: &[u8],
            scales_dtype: u8,
            scales_shape: &[usize],
            scales: &[u8],
            to: u8,
            dst: &mut [u8],
            status: &mut Status,
        );
    }
}

/// A tensor as it crosses the bridge: its dtype index (C++ passes `Dtype` values, but a
/// `static_cast` can make any byte), shape and bytes.
fn view<'a>(dtype_index: u8, shape: &'a [usize], data: &'a [u8]) -> Result<TensorView<'a>, Error> {
    Ok(TensorView::new(
        convert::dtype_to_convert(dtype_index)?,
        shape,
        data,
    ))
}

pub fn convert_tensor(
    from: u8,
    shape: &[usize],
    src: &[u8],
    to: u8,
    dst: &mut [u8],
    status: &mut Status,
) {
    guard(status, || {
        let (from, to) = (
            convert::dtype_to_convert(from)?,
            convert::dtype_to_convert(to)?,
        );
        convert::convert(from, shape, src, to, dst)
    })
}

/// The tensor byte-length rule for C++ (conversion outputs, DLPack exports): `name` is for
/// messages; a dtype value outside the enumeration is `TypeMismatch`.
pub fn tensor_byte_len(name: &[u8], dtype: u8, shape: &[usize], status: &mut Status) -> usize {
    guard(status, || {
        let dtype = convert::dtype_to_convert(dtype)?;
        safetensors_core::tensor_byte_len(&String::from_utf8_lossy(name), dtype, shape)
    })
}

#[allow(clippy::too_many_arguments)] // cxx bridges take no structs holding slices
pub fn dequantize_fp8_blocks(
    weight_dtype: u8,
    weight_shape: &[usize],
    weight: &[u8],
    scale_dtype: u8,
    scale_shape: &[usize],
    scale: &[u8],
    block_rows: usize,
    block_cols: usize,
    to: u8,
    dst: &mut [u8],
    status: &mut Status,
) {
    guard(status, || {
        let w = view(weight_dtype, weight_shape, weight)?;
        let s = view(scale_dtype, scale_shape, scale)?;
        let to = convert::dtype_to_convert(to)?;
        convert::dequantize_fp8_blocks(w, s, (block_rows, block_cols), to, dst)
    })
}

pub fn mxfp4_output_shape(
    blocks_shape: &[usize],
    scales_shape: &[usize],
    status: &mut Status,
) -> Vec<usize> {
    guard(status, || {
        convert::mxfp4_output_shape(blocks_shape, scales_shape)
    })
}

#[allow(clippy::too_many_arguments)] // cxx bridges take no structs holding slices
pub fn dequantize_mxfp4(
    blocks_dtype: u8,
    blocks_shape: &[usize],
    blocks: &[u8],
    scales_dtype: u8,
    scales_shape: &[usize],
    scales: &[u8],
    to: u8,
    dst: &mut [u8],
    status: &mut Status,
) {
    guard(status, || {
        let b = view(blocks_dtype, blocks_shape, blocks)?;
        let s = view(scales_dtype, scales_shape, scales)?;
        let to = convert::dtype_to_convert(to)?;
        convert::dequantize_mxfp4(b, s, to, dst)
    })
}
