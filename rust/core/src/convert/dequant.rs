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

use super::decode::to_f32;
use super::formats::table_f32;
use super::{check_conversion, check_len, convert_unchecked, numel};
use crate::{Dtype, Error, Result, TensorView};

fn refuse(from: Dtype, to: Dtype, reason: String) -> Error {
    Error::Conversion { from, to, reason }
}

/// Dequantizes a 2-D weight with per-block scales (DeepSeek-V3 style, `block` = (128, 128)):
/// `dst[i][j] = weight[i][j] × scale[i / block.0][j / block.1]`, computed in F32, then stored
/// as `to` (a float dtype of at least 8 bits). `dst` holds `M × N` elements of `to`.
pub fn dequantize_fp8_blocks(
    weight: TensorView<'_>,
    scale: TensorView<'_>,
    block: (usize, usize),
    to: Dtype,
    dst: &mut [u8],
) -> Result<()> {
    let (weight_dtype, weight_shape) = (weight.dtype, weight.shape);
    let (scale_dtype, scale_shape) = (scale.dtype, scale.shape);
    let (weight, scale) = (weight.data, scale.data);
    check_conversion(weight_dtype, to)?;
    check_conversion(scale_dtype, Dtype::F32)?;
    if weight_dtype.bits() < 8 || to.bits() < 8 || !super::is_float(weight_dtype) {
        return Err(refuse(
            weight_dtype,
            to,
            "block dequantization takes a float weight of 8 bits or more and gives a target of 8 \
             bits or more"
                .into(),
        ));
    }
    let [m, n] = *weight_shape else {
        return Err(refuse(
            weight_dtype,
            to,
            format!("the weight must be 2-D, its shape is {weight_shape:?}"),
        ));
    };
    let (br, bc) = block;
    if br == 0 || bc == 0 {
        return Err(refuse(
            weight_dtype,
            to,
            "block sizes must be at least 1".into(),
        ));
    }
    let want = [m.div_ceil(br), n.div_ceil(bc)];
    if scale_shape != want {
        return Err(refuse(
            weight_dtype,
            to,
            format!(
                "a [{m}, {n}] weight in {br}×{bc} blocks needs a scale of shape {want:?}, not \
                 {scale_shape:?}"
            ),
        ));
    }
    let total = numel(weight_dtype, weight_shape)?;
    check_len("weight", weight_dtype, total, weight.len())?;
    check_len("scale", scale_dtype, want[0] * want[1], scale.len())?;
    check_len("destination", to, total, dst.len())?;
    if total == 0 {
        return Ok(());
    }
    let mut scales = vec![0u8; want[0] * want[1] * 4];
    to_f32(scale_dtype, scale, &mut scales);
    let scales: Vec<f32> = scales
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (wrow, drow) = (n * weight_dtype.bits() / 8, n * to.bits() / 8);
    let mut row = vec![0u8; n * 4];
    for i in 0..m {
        to_f32(weight_dtype, &weight[i * wrow..(i + 1) * wrow], &mut row);
        let srow = &scales[i / br * want[1]..(i / br + 1) * want[1]];
        for (j, x) in row.chunks_exact_mut(4).enumerate() {
            let v = f32::from_le_bytes(x.try_into().unwrap()) * srow[j / bc];
            x.copy_from_slice(&v.to_le_bytes());
        }
        convert_unchecked(Dtype::F32, &row, to, &mut dst[i * drow..(i + 1) * drow]);
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

/// Dequantizes gpt-oss MXFP4: U8 `blocks` `[..., G, 16]` and U8 (or F8_E8M0) `scales`
/// `[..., G]` into `[..., G*32]` elements of `to` (a float dtype of at least 8 bits).
pub fn dequantize_mxfp4(
    blocks: TensorView<'_>,
    scales: TensorView<'_>,
    to: Dtype,
    dst: &mut [u8],
) -> Result<()> {
    let (blocks_dtype, blocks_shape) = (blocks.dtype, blocks.shape);
    let (scales_dtype, scales_shape) = (scales.dtype, scales.shape);
    let (blocks, scales) = (blocks.data, scales.data);
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
    let out_shape = mxfp4_output_shape(blocks_shape, scales_shape)?;
    let total = numel(Dtype::F32, &out_shape)?;
    let groups = total / 32;
    check_len("blocks", Dtype::U8, groups * 16, blocks.len())?;
    check_len("scales", Dtype::U8, groups, scales.len())?;
    check_len("destination", to, total, dst.len())?;
    let lut = table_f32(Dtype::F4);
    let step = 32 * to.bits() / 8;
    let mut tmp = [0u8; 32 * 4];
    for ((b, &s), d) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(dst.chunks_exact_mut(step))
    {
        let factor = super::formats::pow2(i32::from(s) - 127);
        for (k, &byte) in b.iter().enumerate() {
            let lo = (f64::from(lut[usize::from(byte & 15)]) * factor) as f32;
            let hi = (f64::from(lut[usize::from(byte >> 4)]) * factor) as f32;
            tmp[8 * k..8 * k + 4].copy_from_slice(&lo.to_le_bytes());
            tmp[8 * k + 4..8 * k + 8].copy_from_slice(&hi.to_le_bytes());
        }
        convert_unchecked(Dtype::F32, &tmp, to, d);
    }
    Ok(())
}
