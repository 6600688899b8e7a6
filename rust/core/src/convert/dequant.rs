//! Dequantization of the two block-scaled layouts that real checkpoints ship.
//!
//! **fp8 with block scales (DeepSeek-V3).** A 2-D `F8_E4M3` weight `[M, N]` comes with an F32
//! `weight_scale_inv` of shape `[ceil(M/128), ceil(N/128)]`; the last row and column of blocks
//! may be partial. DeepSeek-V3's `inference/kernel.py` (`weight_dequant_kernel`) loads each
//! 128×128 tile, converts it to float32 and multiplies by the tile's scale (`y = x * s`, despite
//! the name `scale_inv`), then stores in the default dtype; so we multiply in F32 (one rounding)
//! and then convert to the target (a second rounding only for narrow targets, as theirs).
//!
//! **MXFP4 (gpt-oss).** `*_blocks` is U8 `[..., G, 16]`: 16 bytes holding 32 F4 codes, element
//! 2k in the low nibble of byte k and 2k+1 in the high nibble; `*_scales` is U8 `[..., G]`,
//! one E8M0 exponent per group of 32. Hugging Face transformers' `convert_moe_packed_tensors`
//! (`integrations/mxfp4.py`, the path gpt-oss checkpoints take when no MXFP4 kernel is
//! available) computes `ldexp(FP4_VALUES[nibble], scale - 127)` and flattens the last two
//! dimensions to `G*32`. We compute the same product exactly (in F64, then rounded once to
//! F32), so a scale byte of 255 means 2^128 as in that code, not the E8M0 NaN. The model-specific
//! transpose transformers applies afterwards is left to the caller.

// Shapes and block sizes come from callers: arithmetic on them is checked.
#![deny(clippy::arithmetic_side_effects)]

use std::num::NonZeroUsize;

use super::formats::table_f32;
use super::{
    check_conversion, check_destination, check_input, convert_unchecked, numel, output_len, to_f32,
};
use crate::{Dtype, Error, Result, TensorView};

fn refuse(from: Dtype, to: Dtype, reason: String) -> Error {
    Error::Conversion { from, to, reason }
}

/// A block dequantization's inputs, checked: what the loops need.
struct Fp8Blocks {
    /// Columns of the weight.
    n: usize,
    /// Rows and columns of a block.
    block: (NonZeroUsize, NonZeroUsize),
    /// Columns of the scale.
    scale_cols: usize,
    /// Elements of the weight and of the scale.
    total: usize,
    scale_count: usize,
    /// Bytes of the output.
    len: usize,
}

/// Every check [`dequantize_fp8_blocks`] makes of its inputs, in order: the dtypes
/// (`TypeMismatch`), each view's bytes against its dtype and shape, the shapes against each
/// other and the blocks (`TypeMismatch`), the output's size.
fn fp8_blocks(
    weight: &TensorView<'_>,
    scale: &TensorView<'_>,
    block: (usize, usize),
    to: Dtype,
) -> Result<Fp8Blocks> {
    let (weight_dtype, weight_shape) = (weight.dtype, weight.shape);
    check_conversion(weight_dtype, to)?;
    check_conversion(scale.dtype, Dtype::F32)?;
    if weight_dtype.bits() < 8 || to.bits() < 8 || !super::is_float(weight_dtype) {
        return Err(refuse(
            weight_dtype,
            to,
            "block dequantization takes a float weight of 8 bits or more and gives a target of 8 \
             bits or more"
                .into(),
        ));
    }
    check_input("the weight", weight)?;
    check_input("the scale", scale)?;
    let [m, n] = *weight_shape else {
        return Err(refuse(
            weight_dtype,
            to,
            format!("the weight must be 2-D, its shape is {weight_shape:?}"),
        ));
    };
    let (Some(br), Some(bc)) = (NonZeroUsize::new(block.0), NonZeroUsize::new(block.1)) else {
        return Err(refuse(
            weight_dtype,
            to,
            "block sizes must be at least 1".into(),
        ));
    };
    let want = [m.div_ceil(br.get()), n.div_ceil(bc.get())];
    if scale.shape != want {
        return Err(refuse(
            weight_dtype,
            to,
            format!(
                "a [{m}, {n}] weight in {br}×{bc} blocks needs a scale of shape {want:?}, not \
                 {:?}",
                scale.shape
            ),
        ));
    }
    Ok(Fp8Blocks {
        n,
        block: (br, bc),
        scale_cols: want[1],
        // Both views were checked against their shapes, so these counts fit.
        total: numel(weight_dtype, weight_shape)?,
        scale_count: numel(scale.dtype, &want)?,
        len: output_len(to, weight_shape)?,
    })
}

/// Bytes [`dequantize_fp8_blocks`] writes for these inputs, after every check it makes of them
/// (its errors but the destination's): what a caller that allocates the output sizes it with.
pub fn fp8_blocks_output_len(
    weight: TensorView<'_>,
    scale: TensorView<'_>,
    block: (usize, usize),
    to: Dtype,
) -> Result<usize> {
    Ok(fp8_blocks(&weight, &scale, block, to)?.len)
}

/// Dequantizes a 2-D weight with per-block scales (DeepSeek-V3 style, `block` = (128, 128)):
/// `dst[i][j] = weight[i][j] × scale[i / block.0][j / block.1]`, computed in F32, then stored
/// as `to` (a float dtype of at least 8 bits). `dst` holds `M × N` elements of `to`. Errors:
/// those of [`fp8_blocks_output_len`], then `TensorInvalidInfo` for a `dst` of another length.
pub fn dequantize_fp8_blocks(
    weight: TensorView<'_>,
    scale: TensorView<'_>,
    block: (usize, usize),
    to: Dtype,
    dst: &mut [u8],
) -> Result<()> {
    let plan = fp8_blocks(&weight, &scale, block, to)?;
    check_destination(to, weight.shape, plan.len, dst.len())?;
    let (weight_dtype, scale_dtype) = (weight.dtype, scale.dtype);
    let (weight, scale) = (weight.data, scale.data);
    let (n, (br, bc)) = (plan.n, plan.block);
    if plan.total == 0 {
        return Ok(());
    }
    // The scales as F32 (4 bytes each: at most four times the scale's own bytes).
    let mut scales = vec![0u8; plan.scale_count.saturating_mul(4)];
    to_f32(scale_dtype, scale, &mut scales);
    let scales: Vec<f32> = scales
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let scale_rows: Vec<&[f32]> = scales.chunks_exact(plan.scale_cols).collect();
    // Rows in bytes: the lengths above were checked, so these divide the buffers exactly, and
    // both are at least one byte (n ≥ 1, 8 bits or more).
    let (Some(wrow), Some(drow)) = (weight_dtype.byte_size(n), to.byte_size(n)) else {
        return Err(refuse(weight_dtype, to, "a row is not whole bytes".into()));
    };
    let mut row = vec![0u8; n.saturating_mul(4)];
    let rows = weight.chunks_exact(wrow).zip(dst.chunks_exact_mut(drow));
    for (i, (w, d)) in rows.enumerate() {
        to_f32(weight_dtype, w, &mut row);
        let srow = scale_rows[i / br];
        for (j, x) in row.chunks_exact_mut(4).enumerate() {
            let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]) * srow[j / bc];
            x.copy_from_slice(&v.to_le_bytes());
        }
        convert_unchecked(Dtype::F32, &row, to, d);
    }
    Ok(())
}

/// The shape MXFP4 dequantization produces: `blocks` `[..., G, 16]` gives `[..., G*32]`.
pub fn mxfp4_output_shape(blocks_shape: &[usize], scales_shape: &[usize]) -> Result<Vec<usize>> {
    let bad = |why: String| refuse(Dtype::U8, Dtype::F32, why);
    let Some((&16, lead)) = blocks_shape.split_last() else {
        return Err(bad(format!(
            "MXFP4 blocks must have shape [..., G, 16] (16 bytes = 32 F4 values per group), not \
             {blocks_shape:?}"
        )));
    };
    if lead.is_empty() || scales_shape != lead {
        return Err(bad(format!(
            "MXFP4 scales must have the blocks' shape without its last dimension ({lead:?}), not \
             {scales_shape:?}"
        )));
    }
    let mut out = lead.to_vec();
    let g = out.pop().unwrap_or(0);
    let cols = g.checked_mul(32).ok_or_else(|| Error::ValidationOverflow {
        tensor: "(MXFP4 dequantization)".into(),
        shape: blocks_shape.to_vec(),
    })?;
    out.push(cols);
    numel(Dtype::F32, &out)?;
    Ok(out)
}

/// The shape and bytes [`dequantize_mxfp4`] writes for these inputs, after every check it
/// makes of them, in order (its errors but the destination's): the dtypes (`TypeMismatch`),
/// each view's bytes against its dtype and shape, the shapes against each other
/// (`TypeMismatch`), the output's size. What a caller that allocates the output sizes it with.
pub fn mxfp4_output(
    blocks: TensorView<'_>,
    scales: TensorView<'_>,
    to: Dtype,
) -> Result<(Vec<usize>, usize)> {
    let (blocks_dtype, scales_dtype) = (blocks.dtype, scales.dtype);
    if blocks_dtype != Dtype::U8 || !matches!(scales_dtype, Dtype::U8 | Dtype::F8_E8M0) {
        return Err(refuse(
            blocks_dtype,
            to,
            format!(
                "MXFP4 takes U8 blocks and U8 or F8_E8M0 scales, not {blocks_dtype} and \
                 {scales_dtype}"
            ),
        ));
    }
    check_conversion(Dtype::F32, to)?;
    if to.bits() < 8 {
        return Err(refuse(
            blocks_dtype,
            to,
            "the target must be 8 bits or more".into(),
        ));
    }
    check_input("the MXFP4 blocks", &blocks)?;
    check_input("the MXFP4 scales", &scales)?;
    let shape = mxfp4_output_shape(blocks.shape, scales.shape)?;
    let len = output_len(to, &shape)?;
    Ok((shape, len))
}

/// Dequantizes gpt-oss MXFP4: U8 `blocks` `[..., G, 16]` and U8 (or F8_E8M0) `scales`
/// `[..., G]` into `[..., G*32]` elements of `to` (a float dtype of at least 8 bits). Errors:
/// those of [`mxfp4_output`], then `TensorInvalidInfo` for a `dst` of another length.
pub fn dequantize_mxfp4(
    blocks: TensorView<'_>,
    scales: TensorView<'_>,
    to: Dtype,
    dst: &mut [u8],
) -> Result<()> {
    let (out_shape, len) = mxfp4_output(blocks, scales, to)?;
    check_destination(to, &out_shape, len, dst.len())?;
    let blocks_dtype = blocks.dtype;
    // Both views were checked against their shapes, and the scales' shape is the blocks'
    // without its last dimension (16): `blocks` holds 16 bytes per scale.
    let (blocks, scales) = (blocks.data, scales.data);
    let lut = table_f32(Dtype::F4);
    let Some(step) = to.byte_size(32) else {
        return Err(refuse(
            blocks_dtype,
            to,
            "the target must be 8 bits or more".into(),
        ));
    };
    let mut tmp = [0u8; 32 * 4];
    for ((b, &s), d) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(dst.chunks_exact_mut(step))
    {
        // E8M0: 2^(s - 127), s a byte, so the exponent is in [-127, 128].
        let factor = super::formats::pow2(i32::from(s).wrapping_sub(127));
        for (&byte, out) in b.iter().zip(tmp.chunks_exact_mut(8)) {
            let lo = (f64::from(lut[usize::from(byte & 15)]) * factor) as f32;
            let hi = (f64::from(lut[usize::from(byte >> 4)]) * factor) as f32;
            out[..4].copy_from_slice(&lo.to_le_bytes());
            out[4..].copy_from_slice(&hi.to_le_bytes());
        }
        convert_unchecked(Dtype::F32, &tmp, to, d);
    }
    Ok(())
}
