//! Dtype conversion and dequantization on arbitrary bytes, shapes (of any magnitude: element
//! counts that overflow, or that the bytes cannot hold) and dtype pairs: never panics (this
//! target runs with overflow checks), errors whenever the sizes disagree, and when it succeeds,
//! the result is consistent: converting to F32 and to F64 agree, and narrow results are fixed
//! points (converting the value back from F64 gives the same bytes; NaN as NaN).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use safetensors_core::convert::{convert, dequantize_fp8_blocks, dequantize_mxfp4};
use safetensors_core::{Dtype, TensorView};

/// A dimension: small, or of any magnitude up to 2^64 - 1.
#[derive(Arbitrary, Debug)]
enum Dim {
    Small(u16),
    Huge(u64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    from: u8,
    to: u8,
    shape: Vec<Dim>,
    /// Skew the data start to make it unaligned.
    skew: u8,
    /// Make the destination one byte off to exercise the size check.
    dst_delta: i8,
    block: (u8, u8),
    data: Vec<u8>,
}

fn f64s(d: Dtype, n: usize, bytes: &[u8]) -> Vec<f64> {
    let mut out = vec![0u8; n * 8];
    convert(d, &[n], bytes, Dtype::F64, &mut out).expect("a valid result converts to F64");
    out.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fuzz_target!(|input: Input| {
    let from = Dtype::ALL[usize::from(input.from) % 22];
    let to = Dtype::ALL[usize::from(input.to) % 22];
    let shape: Vec<usize> = input
        .shape
        .iter()
        .take(4)
        .map(|d| match *d {
            Dim::Small(v) => usize::from(v % 512),
            Dim::Huge(v) => v as usize,
        })
        .collect();
    let skew = usize::from(input.skew % 8).min(input.data.len());
    let src = &input.data[skew..];
    let counted = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let want = counted.and_then(|n| to.byte_size(n)).unwrap_or(0);
    let len = want.saturating_add_signed(isize::from(input.dst_delta % 2));
    let mut dst = vec![0u8; len.min(1 << 22)];
    let ok = convert(from, &shape, src, to, &mut dst).is_ok();
    let sizes_fit = counted.is_some_and(|n| {
        from.byte_size(n) == Some(src.len()) && to.byte_size(n) == Some(dst.len())
    });
    let pair_fits = from != Dtype::C64 && safetensors_core::convert::is_float(to);
    assert_eq!(ok, sizes_fit && pair_fits, "{from} -> {to} {shape:?}");
    let numel = counted.unwrap_or(0);
    if ok && numel > 0 {
        // F32 and F64 results agree (every F32 value widens exactly).
        let as64 = f64s(to, numel, &dst);
        let mut f32b = vec![0u8; numel * 4];
        convert(to, &[numel], &dst, Dtype::F32, &mut f32b).unwrap();
        for (i, c) in f32b.chunks_exact(4).enumerate() {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            if to != Dtype::F64 {
                assert!(same(f64::from(x), as64[i]), "{to} element {i}");
            }
        }
        // A narrow result converts back to itself from its own F64 value.
        if to != Dtype::F64 && to != Dtype::F32 {
            let wide: Vec<u8> = as64.iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut again = vec![0u8; dst.len()];
            convert(Dtype::F64, &[numel], &wide, to, &mut again).unwrap();
            let back = f64s(to, numel, &again);
            for i in 0..numel {
                assert!(same(back[i], as64[i]), "{to} element {i} not a fixed point");
            }
        }
    }
    // Dequantizers on the same bytes: never panic, sizes checked.
    // Outputs sized as the shapes say when that is small, else small and wrong: a huge shape
    // over few bytes must be refused, never sized.
    let out_len = |elements: Option<usize>, bytes_each: usize| {
        elements
            .and_then(|n| n.checked_mul(bytes_each))
            .filter(|&n| n <= 1 << 22)
            .unwrap_or(16)
    };
    if shape.len() == 2 {
        let (br, bc) = (
            usize::from(input.block.0 % 8),
            usize::from(input.block.1 % 8),
        );
        let s_shape = [shape[0].div_ceil(br.max(1)), shape[1].div_ceil(bc.max(1))];
        let s_len = s_shape[0]
            .saturating_mul(s_shape[1])
            .saturating_mul(4)
            .min(src.len());
        let (s, w) = src.split_at(s_len);
        let mut out = vec![0u8; out_len(counted, to.bits() / 8)];
        let done = dequantize_fp8_blocks(
            TensorView::new(from, &shape, w),
            TensorView::new(Dtype::F32, &s_shape, s),
            (br, bc),
            to,
            &mut out,
        );
        if done.is_ok() {
            assert_eq!(counted.and_then(|n| from.byte_size(n)), Some(w.len()));
            assert_eq!(counted.and_then(|n| to.byte_size(n)), Some(out.len()));
        }
    }
    if let [a, b, 16] = shape[..] {
        let groups = a.checked_mul(b);
        let g = groups.unwrap_or(usize::MAX).min(src.len());
        let (s, blocks) = src.split_at(g);
        let mut out = vec![0u8; out_len(groups.and_then(|g| g.checked_mul(32)), to.bits() / 8)];
        let done = dequantize_mxfp4(
            TensorView::new(Dtype::U8, &shape, blocks),
            TensorView::new(Dtype::U8, &[a, b], s),
            to,
            &mut out,
        );
        if done.is_ok() {
            assert_eq!(groups, Some(s.len()));
            assert_eq!(groups.map(|g| g * 16), Some(blocks.len()));
        }
    }
});
