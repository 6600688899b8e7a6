//! Glue for dtype conversion and dequantization: dtypes cross as their enum index, shapes and
//! bytes as slices; everything else is `safetensors_core::convert`.

use safetensors_core::convert;
use safetensors_core::{Dtype, TensorView};

use crate::{guard, BridgeError};

/// The dtype with index `d` (C++ passes `Dtype` values, but a `static_cast` can make any byte).
fn dtype(d: u8) -> Result<Dtype, BridgeError> {
    guard(|| convert::dtype_to_convert(d))
}

pub fn convert_tensor(
    from: u8,
    shape: &[usize],
    src: &[u8],
    to: u8,
    dst: &mut [u8],
) -> Result<(), BridgeError> {
    let (from, to) = (dtype(from)?, dtype(to)?);
    guard(|| convert::convert(from, shape, src, to, dst))
}

/// A tensor as it crosses the bridge: its dtype index, shape and bytes.
fn view<'a>(
    dtype_index: u8,
    shape: &'a [usize],
    data: &'a [u8],
) -> Result<TensorView<'a>, BridgeError> {
    Ok(TensorView::new(dtype(dtype_index)?, shape, data))
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
) -> Result<(), BridgeError> {
    let w = view(weight_dtype, weight_shape, weight)?;
    let s = view(scale_dtype, scale_shape, scale)?;
    let to = dtype(to)?;
    guard(|| convert::dequantize_fp8_blocks(w, s, (block_rows, block_cols), to, dst))
}

pub fn mxfp4_output_shape(
    blocks_shape: &[usize],
    scales_shape: &[usize],
) -> Result<Vec<usize>, BridgeError> {
    guard(|| convert::mxfp4_output_shape(blocks_shape, scales_shape))
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
) -> Result<(), BridgeError> {
    let b = view(blocks_dtype, blocks_shape, blocks)?;
    let s = view(scales_dtype, scales_shape, scales)?;
    let to = dtype(to)?;
    guard(|| convert::dequantize_mxfp4(b, s, to, dst))
}
