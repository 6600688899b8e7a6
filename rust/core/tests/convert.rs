//! Dtype conversion and dequantization against the oracle: `tests/python/convert_oracle.py`
//! computes every expected result with ml_dtypes (NumPy for F16, F32, F64 and integers) and
//! NumPy references of DeepSeek-V3's and gpt-oss's dequantization.
//!
//! Needs a Python with numpy and ml_dtypes (`SAFETENSORS_PYTHON`, default `python3`); without
//! one the oracle tests print why they skip, unless `SAFETENSORS_REQUIRE_PYTHON=1`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::scratch_dir;
use safetensors_core::convert::{
    convert, dequantize_fp8_blocks, dequantize_mxfp4, mxfp4_output_shape,
};
use safetensors_core::{Dtype, ErrorKind, TensorView};
use serde_json::Value;

/// Runs the oracle once per test binary; `None` when Python or its packages are missing.
fn oracle() -> Option<&'static (PathBuf, Value)> {
    static DIR: OnceLock<Option<(PathBuf, Value)>> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = std::env::var("SAFETENSORS_PYTHON").unwrap_or_else(|_| "python3".into());
        let dir = scratch_dir("convert_oracle");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/convert_oracle.py");
        let out = Command::new(&py).arg(script).arg(&dir).output();
        let required = std::env::var("SAFETENSORS_REQUIRE_PYTHON").as_deref() == Ok("1");
        match out {
            Ok(o) if o.status.success() => {
                let manifest = std::fs::read(dir.join("manifest.json")).unwrap();
                Some((dir, serde_json::from_slice(&manifest).unwrap()))
            }
            Ok(o) => {
                let why = format!(
                    "{py} convert_oracle.py failed ({}): {}{}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                assert!(!required && o.status.code() == Some(77), "{why}");
                eprintln!("SKIPPED: {why}");
                None
            }
            Err(e) => {
                assert!(
                    !required,
                    "SAFETENSORS_REQUIRE_PYTHON=1 but cannot run {py}: {e}"
                );
                eprintln!("SKIPPED: cannot run {py}: {e}");
                None
            }
        }
    })
    .as_ref()
}

fn blob(dir: &Path, v: &Value) -> Vec<u8> {
    std::fs::read(dir.join(v.as_str().unwrap())).unwrap()
}

fn dtype(v: &Value) -> Dtype {
    v.as_str().unwrap().parse().unwrap()
}

fn shape(v: &Value) -> Vec<usize> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Each element as F64 bits, NaN canonical, so that results compare bit for bit except that
/// any NaN equals any NaN.
fn as_f64_bits(d: Dtype, numel: usize, bytes: &[u8]) -> Vec<u64> {
    let mut out = vec![0u8; numel * 8];
    convert(d, &[numel], bytes, Dtype::F64, &mut out).unwrap();
    out.chunks_exact(8)
        .map(|c| {
            let x = f64::from_le_bytes(c.try_into().unwrap());
            if x.is_nan() {
                u64::MAX
            } else {
                x.to_bits()
            }
        })
        .collect()
}

/// Compares results bit for bit, NaN as NaN; returns the number of elements that differ.
fn mismatches(name: &str, to: Dtype, numel: usize, got: &[u8], want: &[u8]) -> usize {
    if got == want {
        return 0;
    }
    let (g, w) = (as_f64_bits(to, numel, got), as_f64_bits(to, numel, want));
    let bad: Vec<usize> = (0..numel).filter(|&i| g[i] != w[i]).collect();
    for &i in bad.iter().take(5) {
        eprintln!(
            "{name}: element {i}: got {} want {}",
            f64::from_bits(g[i]),
            f64::from_bits(w[i])
        );
    }
    bad.len()
}

fn run_cases(filter: impl Fn(&str) -> bool) -> usize {
    let Some((dir, manifest)) = oracle() else {
        return 0;
    };
    let mut checked = 0;
    let mut failed = Vec::new();
    for case in manifest["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        if !filter(name) {
            continue;
        }
        let (from, to) = (dtype(&case["from"]), dtype(&case["to"]));
        let numel = case["numel"].as_u64().unwrap() as usize;
        let input = blob(dir, &case["input"]);
        let want = blob(dir, &case["expected"]);
        // One byte of offset: the source and destination are deliberately unaligned.
        let mut src = vec![0u8; input.len() + 1];
        src[1..].copy_from_slice(&input);
        let mut dst = vec![0u8; want.len() + 1];
        convert(from, &[numel], &src[1..], to, &mut dst[1..])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let bad = mismatches(name, to, numel, &dst[1..], &want);
        if bad > 0 {
            failed.push(format!("{name}: {bad} of {numel} elements differ"));
        }
        checked += numel;
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    checked
}

#[test]
fn every_code_of_every_narrow_float_decodes_as_ml_dtypes() {
    let n = run_cases(|name| name.starts_with("codes "));
    if oracle().is_some() {
        // 8 sub-16-bit types × 256/64/16 codes and 2 × 65,536, into 12 targets each (minus self).
        assert!(n > 2 * 65_536 * 11, "only {n} elements checked");
    }
}

#[test]
fn f32_and_f64_round_into_narrow_floats_as_ml_dtypes_on_boundaries() {
    let n = run_cases(|name| name.starts_with("boundaries "));
    if oracle().is_some() {
        assert!(n > 200_000, "only {n} elements checked");
    }
}

#[test]
fn f32_and_f64_round_into_narrow_floats_as_ml_dtypes_on_random_inputs() {
    let n = run_cases(|name| name.starts_with("random "));
    if oracle().is_some() {
        assert!(n >= 20_000_000, "only {n} elements checked");
    }
}

#[test]
fn integers_and_bool_convert_as_numpy_astype() {
    let n = run_cases(|name| name.starts_with("ints "));
    if oracle().is_some() {
        assert!(n > 800_000, "only {n} elements checked");
    }
}

#[test]
fn fp8_block_dequantization_equals_the_numpy_reference() {
    let Some((dir, manifest)) = oracle() else {
        return;
    };
    for t in manifest["fp8_blocks"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let (ws, ss) = (shape(&t["weight_shape"]), shape(&t["scale_shape"]));
        let (w, s) = (blob(dir, &t["weight"]), blob(dir, &t["scale"]));
        let numel = ws[0] * ws[1];
        for (to, key) in [(Dtype::F32, "expected"), (Dtype::BF16, "expected_bf16")] {
            let want = blob(dir, &t[key]);
            let mut dst = vec![0u8; want.len()];
            let (w_unaligned, s_unaligned) = ([&[0u8][..], &w].concat(), [&[0u8][..], &s].concat());
            dequantize_fp8_blocks(
                TensorView::new(Dtype::F8_E4M3, &ws, &w_unaligned[1..]),
                TensorView::new(Dtype::F32, &ss, &s_unaligned[1..]),
                (128, 128),
                to,
                &mut dst,
            )
            .unwrap();
            assert_eq!(
                mismatches(name, to, numel, &dst, &want),
                0,
                "{name} -> {to}"
            );
        }
    }
}

#[test]
fn mxfp4_dequantization_equals_the_numpy_reference() {
    let Some((dir, manifest)) = oracle() else {
        return;
    };
    for t in manifest["mxfp4"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let (bs, ss) = (shape(&t["blocks_shape"]), shape(&t["scales_shape"]));
        let (b, s) = (blob(dir, &t["blocks"]), blob(dir, &t["scales"]));
        let want = blob(dir, &t["expected"]);
        let out_shape = mxfp4_output_shape(&bs, &ss).unwrap();
        assert_eq!(out_shape.last(), Some(&(bs[bs.len() - 2] * 32)));
        let numel: usize = out_shape.iter().product();
        let mut dst = vec![0u8; numel * 4];
        dequantize_mxfp4(
            TensorView::new(Dtype::U8, &bs, &b),
            TensorView::new(Dtype::U8, &ss, &s),
            Dtype::F32,
            &mut dst,
        )
        .unwrap();
        assert_eq!(
            mismatches(name, Dtype::F32, numel, &dst, &want),
            0,
            "{name}"
        );
    }
}

// ---- without the oracle ---------------------------------------------------------------------

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn f4_packs_element_zero_in_the_low_nibble() {
    // 0x21: low nibble 1 (0.5) is element 0, high nibble 2 (1.0) is element 1.
    let mut dst = [0u8; 16];
    convert(Dtype::F4, &[4], &[0x21, 0xF7], Dtype::F32, &mut dst).unwrap();
    assert_eq!(f32s(&dst), [0.5, 1.0, 6.0, -6.0]);
    let mut back = [0u8; 2];
    convert(Dtype::F32, &[4], &dst, Dtype::F4, &mut back).unwrap();
    assert_eq!(back, [0x21, 0xF7]);
}

#[test]
fn f6_is_a_little_endian_bit_stream() {
    // E2M3 codes 8 (1.0), 1 (0.125), 63 (-7.5), 32 (-0.0) packed from bit 0 up.
    let w: u32 = 8 | 1 << 6 | 63 << 12 | 32 << 18;
    let src = [w as u8, (w >> 8) as u8, (w >> 16) as u8];
    let mut dst = [0u8; 16];
    convert(Dtype::F6_E2M3, &[4], &src, Dtype::F32, &mut dst).unwrap();
    let got = f32s(&dst);
    assert_eq!(got[..3], [1.0, 0.125, -7.5]);
    assert!(got[3] == 0.0 && got[3].is_sign_negative());
    let mut back = [0u8; 3];
    convert(Dtype::F32, &[4], &dst, Dtype::F6_E2M3, &mut back).unwrap();
    assert_eq!(back, src);
}

#[test]
fn nonsensical_conversions_are_type_mismatches() {
    let mut dst = [0u8; 16];
    for (from, to, len) in [
        (Dtype::C64, Dtype::F16, 8),
        (Dtype::C64, Dtype::C64, 8),
        (Dtype::F32, Dtype::BOOL, 4),
        (Dtype::BOOL, Dtype::BOOL, 1),
        (Dtype::F32, Dtype::I32, 4),
        (Dtype::F16, Dtype::U8, 2),
    ] {
        let src = vec![0u8; len];
        let e = convert(from, &[1], &src, to, &mut dst[..to.bits() / 8]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TypeMismatch, "{from} -> {to}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("cannot convert {from} to {to}")),
            "{e}"
        );
    }
}

#[test]
fn wrong_buffer_sizes_are_typed_errors() {
    let src = [0u8; 8];
    let mut dst = [0u8; 12];
    let e = convert(Dtype::F32, &[2], &src, Dtype::F64, &mut dst).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TensorInvalidInfo);
    assert!(e.to_string().contains("destination"), "{e}");
    let e = convert(Dtype::F32, &[3], &src, Dtype::F16, &mut dst[..6]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TensorInvalidInfo);
    assert!(e.to_string().contains("source"), "{e}");
    let e = convert(Dtype::F4, &[3], &src[..2], Dtype::F32, &mut dst).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MisalignedSlice);
    let e = convert(Dtype::F32, &[usize::MAX, 4], &src, Dtype::F64, &mut dst).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ValidationOverflow);
}

#[test]
fn dequantization_refuses_mismatched_scales() {
    let w = [0u8; 200 * 3];
    let s = [0u8; 4 * 2];
    let mut dst = vec![0u8; 200 * 3 * 4];
    // A [200, 3] weight in 128×128 blocks needs a [2, 1] scale.
    let e = dequantize_fp8_blocks(
        TensorView::new(Dtype::F8_E4M3, &[200, 3], &w),
        TensorView::new(Dtype::F32, &[1, 2], &s),
        (128, 128),
        Dtype::F32,
        &mut dst,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TypeMismatch);
    assert!(e.to_string().contains("[2, 1]"), "{e}");
    let e = mxfp4_output_shape(&[2, 3, 15], &[2, 3]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TypeMismatch);
    let e = mxfp4_output_shape(&[2, 3, 16], &[2, 4]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TypeMismatch);
    assert_eq!(mxfp4_output_shape(&[2, 3, 16], &[2, 3]).unwrap(), [2, 96]);
}

#[test]
fn any_nonzero_bool_byte_is_one() {
    let mut dst = [0u8; 12];
    convert(Dtype::BOOL, &[3], &[0, 1, 0x80], Dtype::F32, &mut dst).unwrap();
    assert_eq!(f32s(&dst), [0.0, 1.0, 1.0]);
    let mut bf = [0u8; 6];
    convert(Dtype::BOOL, &[3], &[0, 1, 0x80], Dtype::BF16, &mut bf).unwrap();
    assert_eq!(bf, [0, 0, 0x80, 0x3F, 0x80, 0x3F]);
}
