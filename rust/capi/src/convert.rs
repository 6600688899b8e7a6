//! Dtype conversion and dequantization into a caller's buffer, and the tensor byte-length rule
//! to size it. Everything is `safetensors_core::convert`: results are bit for bit those of the
//! C++ API (and of ml_dtypes / NumPy).

use std::ffi::c_void;
use std::os::raw::c_int;

use safetensors_core::{convert, AddressRange, TensorView};

use crate::args::Call;
use crate::dtype::to_convert;
use crate::status::{run, st_error, Res};
use crate::tensor::{given, st_tensor, Given};

/// Bytes a tensor of `dtype` and shape (`rank` dimensions at `shape`) takes, into `*size`: the
/// one byte-length rule of the library. Errors: `ST_ERR_VALIDATION_OVERFLOW` (does not fit in
/// 64 bits), `ST_ERR_MISALIGNED_SLICE` (F4/F6 ending inside a byte), `ST_ERR_TYPE_MISMATCH`
/// (no such dtype).
#[no_mangle]
pub unsafe extern "C" fn st_tensor_byte_size(
    dtype: i32,
    shape: *const usize,
    rank: usize,
    size: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_tensor_byte_size");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (shape, out) = unsafe { (c.array(shape, rank, "shape")?, c.out(size, "size")?) };
        *out =
            safetensors_core::tensor_byte_len("(st_tensor_byte_size)", to_convert(dtype)?, shape)?;
        Ok(())
    })
}

/// A caller's tensor as the core's view (its dtype checked).
fn view<'a>(t: &Given<'a>) -> Res<TensorView<'a>> {
    Ok(TensorView::new(to_convert(t.dtype)?, t.shape, t.data))
}

/// Converts `src` (`dtype`, `shape`, `data` of `byte_size` bytes) to dtype `to` into `dst`,
/// which must hold exactly its elements in `to` (size it with `st_tensor_byte_size`). Sources:
/// every dtype but C64; targets: every float dtype. Results are those of ml_dtypes' `astype`.
///
/// Errors: `ST_ERR_TYPE_MISMATCH` (C64 source, non-float target, no such dtype);
/// `ST_ERR_TENSOR_INVALID_INFO` (bytes that disagree with dtype and shape, or a `dst` of the
/// wrong size); `ST_ERR_INVALID_SLICE` (`dst` overlaps the source: no conversion in place);
/// `ST_ERR_MISALIGNED_SLICE` (an F4/F6 count ending inside a byte).
#[no_mangle]
pub unsafe extern "C" fn st_convert(
    src: *const st_tensor,
    to: i32,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_convert");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let src = unsafe { given(c, c.handle(src, "src")?, "src")? };
        let from = view(&src)?;
        let to = to_convert(to)?;
        // SAFETY: as above.
        let dst = unsafe { c.output(&[AddressRange::of(src.data)], dst, dst_len)? };
        Ok(convert::convert(
            from.dtype, from.shape, from.data, to, dst,
        )?)
    })
}

/// Dequantizes a 2-D weight with per-block scales (DeepSeek-V3's `weight_dequant`):
/// `dst[i][j] = weight[i][j] × scale[i / block_rows][j / block_cols]` in F32, stored as `to`
/// (a float dtype of 8 bits or more). The scale is F32 of shape
/// `[ceil(M / block_rows), ceil(N / block_cols)]`; `dst` holds `M × N` elements of `to`.
#[no_mangle]
pub unsafe extern "C" fn st_dequantize_fp8_blocks(
    weight: *const st_tensor,
    scale: *const st_tensor,
    block_rows: usize,
    block_cols: usize,
    to: i32,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_dequantize_fp8_blocks");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (w, s) = unsafe {
            (
                given(c, c.handle(weight, "weight")?, "weight")?,
                given(c, c.handle(scale, "scale")?, "scale")?,
            )
        };
        let (wv, sv, to) = (view(&w)?, view(&s)?, to_convert(to)?);
        let reads = [AddressRange::of(w.data), AddressRange::of(s.data)];
        // SAFETY: as above.
        let dst = unsafe { c.output(&reads, dst, dst_len)? };
        Ok(convert::dequantize_fp8_blocks(
            wv,
            sv,
            (block_rows, block_cols),
            to,
            dst,
        )?)
    })
}

/// Dequantizes gpt-oss MXFP4 (transformers' `convert_moe_packed_tensors`): U8 `blocks`
/// `[..., G, 16]` and U8 (or F8_E8M0) `scales` `[..., G]` into `[..., G*32]` elements of `to`
/// (a float dtype of 8 bits or more) in `dst`.
#[no_mangle]
pub unsafe extern "C" fn st_dequantize_mxfp4(
    blocks: *const st_tensor,
    scales: *const st_tensor,
    to: i32,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_dequantize_mxfp4");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (b, s) = unsafe {
            (
                given(c, c.handle(blocks, "blocks")?, "blocks")?,
                given(c, c.handle(scales, "scales")?, "scales")?,
            )
        };
        let (bv, sv, to) = (view(&b)?, view(&s)?, to_convert(to)?);
        let reads = [AddressRange::of(b.data), AddressRange::of(s.data)];
        // SAFETY: as above.
        let dst = unsafe { c.output(&reads, dst, dst_len)? };
        Ok(convert::dequantize_mxfp4(bv, sv, to, dst)?)
    })
}
