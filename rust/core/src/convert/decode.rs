//! Element loops from every source dtype into F32 and F64: 256-entry tables for 8-bit floats
//! (pairs of entries per byte for F4, four entries per three bytes for F6), bit tricks for F16
//! and BF16, plain casts for integers and wide floats. Every loop reads and writes through
//! byte chunks, so any alignment of source and destination works, and is shaped for the
//! compiler's vectorizer.

use super::formats::table_f32;
use crate::Dtype;

/// Applies `f` to each `S`-byte source element, writing `D` bytes per element.
#[inline(always)]
pub(crate) fn map<const S: usize, const D: usize>(
    src: &[u8],
    dst: &mut [u8],
    f: impl Fn([u8; S]) -> [u8; D],
) {
    for (d, s) in dst.chunks_exact_mut(D).zip(src.chunks_exact(S)) {
        d.copy_from_slice(&f(s.try_into().unwrap()));
    }
}

/// F16 bits to F32 bits, exactly, without branches (so loops vectorize): normal values by
/// rebiasing the exponent in integer arithmetic, infinities and NaN (payload kept) by setting
/// the exponent to all ones, subnormals by one F32 subtraction on normal operands (a subnormal
/// F32 operand would cost a microcode assist on x86).
#[inline(always)]
pub(crate) fn f16_to_f32_bits(h: u16) -> u32 {
    let o = u32::from(h & 0x7FFF) << 13;
    let exp = o & 0x0F80_0000;
    let normal = o + (112 << 23); // exponent bias 15 -> 127
    let special = normal + (112 << 23); // all-ones exponent
                                        // (1.mant × 2^-14) - 2^-14 = 0.mant × 2^-14, exact.
    let sub = (f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    // Selects as masks, which the vectorizer handles where it leaves `if` chains scalar.
    let is_special = 0u32.wrapping_sub(u32::from(exp == 0x0F80_0000));
    let is_sub = 0u32.wrapping_sub(u32::from(exp == 0));
    let mag = (special & is_special) | (sub & is_sub) | (normal & !(is_special | is_sub));
    (u32::from(h & 0x8000) << 16) | mag
}

/// The F6 codes of three bytes: element 0 in the low 6 bits of byte 0, and so on, as a
/// little-endian bit stream (see `mod.rs` for where that layout comes from).
#[inline(always)]
pub(crate) fn unpack_f6(b: [u8; 3]) -> [u8; 4] {
    let w = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
    [
        (w & 63) as u8,
        (w >> 6 & 63) as u8,
        (w >> 12 & 63) as u8,
        (w >> 18 & 63) as u8,
    ]
}

/// Inverse of [`unpack_f6`] (codes must be below 64).
#[inline(always)]
pub(crate) fn pack_f6(c: [u8; 4]) -> [u8; 3] {
    let w = u32::from(c[0]) | u32::from(c[1]) << 6 | u32::from(c[2]) << 12 | u32::from(c[3]) << 18;
    [w as u8, (w >> 8) as u8, (w >> 16) as u8]
}

/// The F32 bytes of both elements of every F4 byte.
fn f4_pairs() -> &'static [[u8; 8]; 256] {
    static PAIRS: std::sync::OnceLock<[[u8; 8]; 256]> = std::sync::OnceLock::new();
    PAIRS.get_or_init(|| {
        let t = table_f32(Dtype::F4);
        let mut out = [[0u8; 8]; 256];
        for (b, pair) in out.iter_mut().enumerate() {
            pair[..4].copy_from_slice(&t[b & 15].to_le_bytes());
            pair[4..].copy_from_slice(&t[b >> 4].to_le_bytes());
        }
        out
    })
}

/// F16 to F32 in blocks of 8 elements, which the compiler turns into vector code (the
/// per-element closure of `map` does not vectorize as well for this one).
#[inline(always)]
fn f16_to_f32(src: &[u8], dst: &mut [u8]) {
    const N: usize = 8;
    let mut s = src.chunks_exact(2 * N);
    let mut d = dst.chunks_exact_mut(4 * N);
    for (s, d) in (&mut s).zip(&mut d) {
        let mut out = [0u32; N];
        for (i, o) in out.iter_mut().enumerate() {
            *o = f16_to_f32_bits(u16::from_le_bytes([s[2 * i], s[2 * i + 1]]));
        }
        for (i, o) in out.iter().enumerate() {
            d[4 * i..4 * i + 4].copy_from_slice(&o.to_le_bytes());
        }
    }
    map::<2, 4>(s.remainder(), d.into_remainder(), |b| {
        f16_to_f32_bits(u16::from_le_bytes(b)).to_le_bytes()
    });
}

/// Decodes any non-complex source into F32 (sizes already checked), on any CPU. Inlined into
/// `simd::to_f32`, so that the same loops are also vectorized for AVX2 there.
#[inline(always)]
pub(crate) fn to_f32_portable(from: Dtype, src: &[u8], dst: &mut [u8]) {
    use Dtype::*;
    match from {
        F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => {
            let t = table_f32(from);
            map::<1, 4>(src, dst, |[b]| t[usize::from(b)].to_le_bytes());
        }
        F4 => {
            // One lookup per byte: both elements' F32 bytes, low nibble first.
            let pairs = f4_pairs();
            map::<1, 8>(src, dst, |[b]| pairs[usize::from(b)]);
        }
        F6_E2M3 | F6_E3M2 => {
            let t = table_f32(from);
            map::<3, 16>(src, dst, |b| {
                let mut out = [0u8; 16];
                for (i, c) in unpack_f6(b).into_iter().enumerate() {
                    out[4 * i..4 * i + 4].copy_from_slice(&t[usize::from(c)].to_le_bytes());
                }
                out
            });
        }
        F16 => f16_to_f32(src, dst),
        BF16 => map::<2, 4>(src, dst, |b| {
            (u32::from(u16::from_le_bytes(b)) << 16).to_le_bytes()
        }),
        F32 => dst.copy_from_slice(src),
        F64 => map::<8, 4>(src, dst, |b| (f64::from_le_bytes(b) as f32).to_le_bytes()),
        BOOL => map::<1, 4>(src, dst, |[b]| f32::from(u8::from(b != 0)).to_le_bytes()),
        U8 => map::<1, 4>(src, dst, |[b]| f32::from(b).to_le_bytes()),
        I8 => map::<1, 4>(src, dst, |b| f32::from(i8::from_le_bytes(b)).to_le_bytes()),
        U16 => map::<2, 4>(src, dst, |b| f32::from(u16::from_le_bytes(b)).to_le_bytes()),
        I16 => map::<2, 4>(src, dst, |b| f32::from(i16::from_le_bytes(b)).to_le_bytes()),
        U32 => map::<4, 4>(src, dst, |b| (u32::from_le_bytes(b) as f32).to_le_bytes()),
        I32 => map::<4, 4>(src, dst, |b| (i32::from_le_bytes(b) as f32).to_le_bytes()),
        U64 => map::<8, 4>(src, dst, |b| (u64::from_le_bytes(b) as f32).to_le_bytes()),
        I64 => map::<8, 4>(src, dst, |b| (i64::from_le_bytes(b) as f32).to_le_bytes()),
        C64 => {} // refused by `convert` before any loop runs
    }
}

/// Decodes any non-complex source into F64 (sizes already checked), on any CPU. Narrow floats
/// go through F32, which holds each of their values exactly. Inlined into `simd::to_f64`.
#[inline(always)]
pub(crate) fn to_f64_portable(from: Dtype, src: &[u8], dst: &mut [u8]) {
    use Dtype::*;
    let widen = |x: f32| f64::from(x).to_le_bytes();
    match from {
        F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => {
            let t = table_f32(from);
            map::<1, 8>(src, dst, |[b]| widen(t[usize::from(b)]));
        }
        F4 | F6_E2M3 | F6_E3M2 => {
            // Through an F32 staging chunk: these are rare and small.
            let per_elem_bits = from.bits();
            let chunk_elems = 1024;
            let chunk_bytes = chunk_elems * per_elem_bits / 8;
            let mut tmp = vec![0u8; chunk_elems * 4];
            for (s, d) in src.chunks(chunk_bytes).zip(dst.chunks_mut(chunk_elems * 8)) {
                let n = s.len() * 8 / per_elem_bits;
                to_f32_portable(from, s, &mut tmp[..n * 4]);
                map::<4, 8>(&tmp[..n * 4], d, |b| widen(f32::from_le_bytes(b)));
            }
        }
        F16 => map::<2, 8>(src, dst, |b| {
            widen(f32::from_bits(f16_to_f32_bits(u16::from_le_bytes(b))))
        }),
        BF16 => map::<2, 8>(src, dst, |b| {
            widen(f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16))
        }),
        F32 => map::<4, 8>(src, dst, |b| widen(f32::from_le_bytes(b))),
        F64 => dst.copy_from_slice(src),
        BOOL => map::<1, 8>(src, dst, |[b]| f64::from(u8::from(b != 0)).to_le_bytes()),
        U8 => map::<1, 8>(src, dst, |[b]| f64::from(b).to_le_bytes()),
        I8 => map::<1, 8>(src, dst, |b| f64::from(i8::from_le_bytes(b)).to_le_bytes()),
        U16 => map::<2, 8>(src, dst, |b| f64::from(u16::from_le_bytes(b)).to_le_bytes()),
        I16 => map::<2, 8>(src, dst, |b| f64::from(i16::from_le_bytes(b)).to_le_bytes()),
        U32 => map::<4, 8>(src, dst, |b| f64::from(u32::from_le_bytes(b)).to_le_bytes()),
        I32 => map::<4, 8>(src, dst, |b| f64::from(i32::from_le_bytes(b)).to_le_bytes()),
        U64 => map::<8, 8>(src, dst, |b| (u64::from_le_bytes(b) as f64).to_le_bytes()),
        I64 => map::<8, 8>(src, dst, |b| (i64::from_le_bytes(b) as f64).to_le_bytes()),
        C64 => {} // refused by `convert` before any loop runs
    }
}
