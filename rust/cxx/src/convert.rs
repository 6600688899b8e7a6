//! Dtype conversion and dequantization (bridge and glue): dtypes cross as their enum index (the
//! public `Dtype`'s values, which `enums_test` checks against the core's), shapes and bytes as
//! spans (pointer and length); everything else is `safetensors_core::convert`.

use safetensors_core::convert;
use safetensors_core::{Error, TensorView};

use crate::status::{guard, Bytes, BytesMut, Sizes, SizesMut, Status};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        type Status = crate::status::ffi::Status;
        type Bytes = crate::status::ffi::Bytes;
        type BytesMut = crate::status::ffi::BytesMut;
        type Sizes = crate::status::ffi::Sizes;
        type SizesMut = crate::status::ffi::SizesMut;
    }

    // Every span is lent by C++ for the length of the call (see `Bytes` in the status bridge).
    extern "Rust" {
        /// Converts the elements of a `from` tensor of `shape` into `to` (`dst` holds exactly
        /// numel × size(to) bytes).
        fn convert_tensor(
            from: u8,
            shape: Sizes,
            src: Bytes,
            to: u8,
            dst: BytesMut,
            status: &mut Status,
        );
        /// Bytes `convert_tensor` writes for this source and target, after every check it
        /// makes of them: what C++ allocates for a conversion's output.
        fn converted_len(from: u8, shape: Sizes, src: Bytes, to: u8, status: &mut Status) -> usize;
        /// Bytes a tensor `name` of `dtype` and `shape` takes (the tensor byte-length rule).
        fn tensor_byte_len(name: Bytes, dtype: u8, shape: Sizes, status: &mut Status) -> usize;
        /// Whether `actual` bytes are the data of a tensor `name` of `dtype` and `shape`.
        fn check_data_len(name: Bytes, dtype: u8, shape: Sizes, actual: usize, status: &mut Status);
        /// Bytes `dequantize_fp8_blocks` writes for these inputs, after every check it makes
        /// of them.
        #[allow(clippy::too_many_arguments)]
        fn fp8_blocks_output_len(
            weight_dtype: u8,
            weight_shape: Sizes,
            weight: Bytes,
            scale_dtype: u8,
            scale_shape: Sizes,
            scale: Bytes,
            block_rows: usize,
            block_cols: usize,
            to: u8,
            status: &mut Status,
        ) -> usize;
        /// DeepSeek-V3 style: a 2-D weight times its per-block scales, into `to`.
        #[allow(clippy::too_many_arguments)]
        fn dequantize_fp8_blocks(
            weight_dtype: u8,
            weight_shape: Sizes,
            weight: Bytes,
            scale_dtype: u8,
            scale_shape: Sizes,
            scale: Bytes,
            block_rows: usize,
            block_cols: usize,
            to: u8,
            dst: BytesMut,
            status: &mut Status,
        );
        /// What `dequantize_mxfp4` writes for these inputs, after every check it makes of
        /// them: its shape (`[..., G, 16]` blocks give `[..., G*32]`, one dimension fewer),
        /// written into `shape` (room for at least that many), whose length is returned, and
        /// its bytes, into `len`.
        #[allow(clippy::too_many_arguments)]
        fn mxfp4_output(
            blocks_dtype: u8,
            blocks_shape: Sizes,
            blocks: Bytes,
            scales_dtype: u8,
            scales_shape: Sizes,
            scales: Bytes,
            to: u8,
            shape: SizesMut,
            len: &mut usize,
            status: &mut Status,
        ) -> usize;
        /// gpt-oss style MXFP4 blocks and E8M0 scales, into `to`.
        #[allow(clippy::too_many_arguments)]
        fn dequantize_mxfp4(
            blocks_dtype: u8,
            blocks_shape: Sizes,
            blocks: Bytes,
            scales_dtype: u8,
            scales_shape: Sizes,
            scales: Bytes,
            to: u8,
            dst: BytesMut,
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
    shape: Sizes,
    src: Bytes,
    to: u8,
    mut dst: BytesMut,
    status: &mut Status,
) {
    // SAFETY: C++ lends each span for this call (`detail::sizes`, `data_bytes`, `bytes_mut`), the
    // output outside the source.
    let (shape, src, dst) = unsafe { (shape.get(), src.get(), dst.get()) };
    guard(status, || {
        let (from, to) = (
            convert::dtype_to_convert(from)?,
            convert::dtype_to_convert(to)?,
        );
        convert::convert(from, shape, src, to, dst)
    })
}

pub fn converted_len(from: u8, shape: Sizes, src: Bytes, to: u8, status: &mut Status) -> usize {
    // SAFETY: C++ lends both spans for this call.
    let (shape, src) = unsafe { (shape.get(), src.get()) };
    guard(status, || {
        let to = convert::dtype_to_convert(to)?;
        convert::converted_len(view(from, shape, src)?, to)
    })
}

/// The tensor byte-length rule for C++ (conversion outputs, DLPack exports): `name` is for
/// messages; a dtype value outside the enumeration is `TypeMismatch`.
pub fn check_data_len(name: Bytes, dtype: u8, shape: Sizes, actual: usize, status: &mut Status) {
    // SAFETY: C++ lends both spans for this call.
    let (name, shape) = unsafe { (name.get(), shape.get()) };
    guard(status, || {
        let dtype = convert::dtype_to_convert(dtype)?;
        safetensors_core::check_data_len(&String::from_utf8_lossy(name), dtype, shape, actual)
    })
}

pub fn tensor_byte_len(name: Bytes, dtype: u8, shape: Sizes, status: &mut Status) -> usize {
    // SAFETY: C++ lends both spans for this call.
    let (name, shape) = unsafe { (name.get(), shape.get()) };
    guard(status, || {
        let dtype = convert::dtype_to_convert(dtype)?;
        safetensors_core::tensor_byte_len(&String::from_utf8_lossy(name), dtype, shape)
    })
}

#[allow(clippy::too_many_arguments)] // cxx bridges take no structs holding slices
pub fn dequantize_fp8_blocks(
    weight_dtype: u8,
    weight_shape: Sizes,
    weight: Bytes,
    scale_dtype: u8,
    scale_shape: Sizes,
    scale: Bytes,
    block_rows: usize,
    block_cols: usize,
    to: u8,
    mut dst: BytesMut,
    status: &mut Status,
) {
    // SAFETY: C++ lends each span for this call, the output outside the sources.
    let (weight_shape, weight, scale_shape, scale, dst) = unsafe {
        (
            weight_shape.get(),
            weight.get(),
            scale_shape.get(),
            scale.get(),
            dst.get(),
        )
    };
    guard(status, || {
        let w = view(weight_dtype, weight_shape, weight)?;
        let s = view(scale_dtype, scale_shape, scale)?;
        let to = convert::dtype_to_convert(to)?;
        convert::dequantize_fp8_blocks(w, s, (block_rows, block_cols), to, dst)
    })
}

#[allow(clippy::too_many_arguments)] // cxx bridges take no structs holding slices
pub fn fp8_blocks_output_len(
    weight_dtype: u8,
    weight_shape: Sizes,
    weight: Bytes,
    scale_dtype: u8,
    scale_shape: Sizes,
    scale: Bytes,
    block_rows: usize,
    block_cols: usize,
    to: u8,
    status: &mut Status,
) -> usize {
    // SAFETY: C++ lends each span for this call.
    let (weight_shape, weight, scale_shape, scale) = unsafe {
        (
            weight_shape.get(),
            weight.get(),
            scale_shape.get(),
            scale.get(),
        )
    };
    guard(status, || {
        let w = view(weight_dtype, weight_shape, weight)?;
        let s = view(scale_dtype, scale_shape, scale)?;
        let to = convert::dtype_to_convert(to)?;
        convert::fp8_blocks_output_len(w, s, (block_rows, block_cols), to)
    })
}

#[allow(clippy::too_many_arguments)] // cxx bridges take no structs holding slices
pub fn mxfp4_output(
    blocks_dtype: u8,
    blocks_shape: Sizes,
    blocks: Bytes,
    scales_dtype: u8,
    scales_shape: Sizes,
    scales: Bytes,
    to: u8,
    mut shape: SizesMut,
    len: &mut usize,
    status: &mut Status,
) -> usize {
    // SAFETY: C++ lends each span for this call.
    let (blocks_shape, blocks, scales_shape, scales, out) = unsafe {
        (
            blocks_shape.get(),
            blocks.get(),
            scales_shape.get(),
            scales.get(),
            shape.get(),
        )
    };
    guard(status, || {
        let b = view(blocks_dtype, blocks_shape, blocks)?;
        let s = view(scales_dtype, scales_shape, scales)?;
        let to = convert::dtype_to_convert(to)?;
        let (shape, bytes) = convert::mxfp4_output(b, s, to)?;
        let room = out.len();
        let slots = out.get_mut(..shape.len()).ok_or_else(|| Error::Internal {
            message: format!(
                "room for {room} dimensions, but the MXFP4 output shape has {}",
                shape.len()
            ),
        })?;
        slots.copy_from_slice(&shape);
        *len = bytes;
        Ok(shape.len())
    })
}

#[allow(clippy::too_many_arguments)] // cxx bridges take no structs holding slices
pub fn dequantize_mxfp4(
    blocks_dtype: u8,
    blocks_shape: Sizes,
    blocks: Bytes,
    scales_dtype: u8,
    scales_shape: Sizes,
    scales: Bytes,
    to: u8,
    mut dst: BytesMut,
    status: &mut Status,
) {
    // SAFETY: C++ lends each span for this call, the output outside the sources.
    let (blocks_shape, blocks, scales_shape, scales, dst) = unsafe {
        (
            blocks_shape.get(),
            blocks.get(),
            scales_shape.get(),
            scales.get(),
            dst.get(),
        )
    };
    guard(status, || {
        let b = view(blocks_dtype, blocks_shape, blocks)?;
        let s = view(scales_dtype, scales_shape, scales)?;
        let to = convert::dtype_to_convert(to)?;
        convert::dequantize_mxfp4(b, s, to, dst)
    })
}
