//! x86-64 kernels chosen at run time: F16 <-> F32 with the F16C instructions, and AVX2 copies
//! of the portable decode loops (the crate is compiled for baseline x86-64, whose SSE2 the
//! vectorizer would otherwise be limited to). Every kernel gives the same bits as the portable
//! path, signalling NaNs included (the in-crate tests below compare both on every F16 code and
//! on a sweep of F32 bit patterns), so results never depend on the machine. Compiled on x86-64
//! only (`mod.rs`); other targets run the portable loops.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::decode::{f16_to_f32_bits, map};
use crate::Dtype;

/// Whether the AVX2 + F16C kernels can run here (std caches the CPUID answer).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// [`super::to_f32`] compiled for AVX2, F16 through F16C.
///
/// # Safety
/// The CPU must have AVX2 and F16C ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn to_f32(from: Dtype, src: &[u8], dst: &mut [u8]) {
    match from {
        Dtype::F16 => f16_to_f32(src, dst),
        _ => super::decode::to_f32_portable(from, src, dst),
    }
}

/// How the streamed widening kernels split `dst` (F32) for `elements` source elements: the
/// count converted is what both buffers hold (the raw loads are bounded by it alone), `head`
/// elements stored plainly up to the first 64-byte line of `dst` (all of them when its elements
/// do not start on 4-byte boundaries, which never meet one), then `lines` whole lines of 16
/// streamed, then plain stores from element `body` on.
#[cfg(target_arch = "x86_64")]
fn f32_lines(elements: usize, dst: &[u8]) -> (usize, usize, usize) {
    let n = (dst.len() / 4).min(elements);
    let head = match dst.as_ptr().align_offset(64) {
        h if h % 4 == 0 => (h / 4).min(n),
        _ => n,
    };
    let lines = (n - head) / 16;
    (head, lines, head + 16 * lines)
}

/// I32 and F64 sources into F32 for an output past the last-level cache: converted in
/// registers and streamed a 64-byte line at a time. (The staged path, converting into a buffer
/// in the first-level cache and then streaming it, took 22.6 ms for 256 MiB of I32 where this
/// takes 13-14 ms, on an AMD EPYC.) The instructions are the ones the portable loops compile
/// to on x86-64 (`cvtdq2ps`, `cvtpd2ps`: round to nearest even, NaNs quieted with their top
/// payload bits), so the bits are the same.
///
/// Converts the elements both buffers hold, as the portable loops do, so that buffers of
/// different lengths (a caller's mistake) cost wrong bytes at worst, never a read past `src`.
///
/// # Safety
/// The CPU must have AVX2 and F16C ([`available`]); `from` is I32 or F64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn widen_to_f32_streamed(from: Dtype, src: &[u8], dst: &mut [u8]) {
    let width = if from == Dtype::I32 { 4 } else { 8 };
    let (head, lines, body) = f32_lines(src.len() / width, dst);
    super::decode::to_f32_portable(from, &src[..head * width], &mut dst[..head * 4]);
    for i in 0..lines {
        let at = head + 16 * i;
        // SAFETY: elements `[at, at + 16)` lie inside both buffers (`at + 16 <= body <= n`);
        // unaligned loads; `dst + 4 * at` is on a 64-byte line, so both stores are aligned.
        unsafe {
            let s = src.as_ptr().add(at * width);
            let d = dst.as_mut_ptr().add(at * 4).cast::<f32>();
            let (lo, hi) = if from == Dtype::I32 {
                (
                    _mm256_cvtepi32_ps(_mm256_loadu_si256(s.cast())),
                    _mm256_cvtepi32_ps(_mm256_loadu_si256(s.add(32).cast())),
                )
            } else {
                let q = |k: usize| _mm256_cvtpd_ps(_mm256_loadu_pd(s.add(32 * k).cast()));
                (_mm256_set_m128(q(1), q(0)), _mm256_set_m128(q(3), q(2)))
            };
            _mm256_stream_ps(d, lo);
            _mm256_stream_ps(d.add(8), hi);
        }
    }
    super::decode::to_f32_portable(from, &src[body * width..], &mut dst[body * 4..]);
    // Streaming stores are weakly ordered: the fence orders them before later stores.
    _mm_sfence();
}

/// [`widen_to_f32_streamed`] for an F64 source with 512-bit registers: sixteen doubles (two
/// loads, `vcvtpd2ps` each) make one 64-byte line, streamed with one store. The same
/// instruction as the AVX2 kernel and the portable loop compile to, so the same bits. F64 reads
/// twice the bytes it writes, so this conversion is bound by reading memory; one line per store
/// measured 14.6-15.0 ms against AVX2's 15.0-16.2 ms for 64 Mi elements (memcpy of the output
/// 13.2-14.3 ms; a 2-core AMD EPYC with AVX-512, interleaved). I32 gained nothing this way and
/// stays on the AVX2 kernel.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and F16C ([`avx512_available`]).
#[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
#[allow(clippy::incompatible_msrv)] // compiled only by a Rust that has them (build.rs)
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(crate) unsafe fn f64_to_f32_streamed_avx512(src: &[u8], dst: &mut [u8]) {
    let (head, lines, body) = f32_lines(src.len() / 8, dst);
    super::decode::to_f32_portable(Dtype::F64, &src[..head * 8], &mut dst[..head * 4]);
    for i in 0..lines {
        let at = head + 16 * i;
        // SAFETY: elements `[at, at + 16)` lie inside both buffers (`at + 16 <= body <= n`);
        // unaligned loads; `dst + 4 * at` is on a 64-byte line, so the store is aligned.
        unsafe {
            let s = src.as_ptr().add(at * 8).cast::<f64>();
            let lo = _mm512_cvtpd_ps(_mm512_loadu_pd(s));
            let hi = _mm512_cvtpd_ps(_mm512_loadu_pd(s.add(8)));
            let line = _mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                _mm256_castps_pd(hi),
            );
            _mm512_stream_pd(dst.as_mut_ptr().add(at * 4).cast::<f64>(), line);
        }
    }
    super::decode::to_f32_portable(Dtype::F64, &src[body * 8..], &mut dst[body * 4..]);
    // Streaming stores are weakly ordered: the fence orders them before later stores.
    _mm_sfence();
}

/// [`super::to_f64`] compiled for AVX2, F16 through F16C.
///
/// # Safety
/// The CPU must have AVX2 and F16C ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn to_f64(from: Dtype, src: &[u8], dst: &mut [u8]) {
    match from {
        Dtype::F16 => f16_to_f64(src, dst),
        _ => super::decode::to_f64_portable(from, src, dst),
    }
}

/// [`super::encode_from_f32_portable`] compiled for AVX2 (which narrows 32-bit lanes to 16 in
/// one instruction, where baseline SSE2 has none), F16 through F16C.
///
/// # Safety
/// The CPU must have AVX2 and F16C ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn encode_from_f32(src: &[u8], to: Dtype, dst: &mut [u8]) {
    super::encode_from_f32_portable(src, to, dst, true);
}

/// Whether the AVX-512 kernels can run here (on top of [`available`]'s). They are compiled in
/// by a Rust whose AVX-512 intrinsics are stable (`build.rs`).
#[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
#[inline]
pub(crate) fn avx512_available() -> bool {
    available() && is_x86_feature_detected!("avx512f")
}

/// [`to_f32`] with the 8-bit floats decoded sixteen at a time by AVX-512 permutes of their
/// table (scalar lookups cost more than the memory traffic); every other source as [`to_f32`].
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and F16C ([`avx512_available`]).
#[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
#[allow(clippy::incompatible_msrv)] // compiled only by a Rust that has them (build.rs)
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(crate) unsafe fn to_f32_avx512(from: Dtype, src: &[u8], dst: &mut [u8]) {
    use Dtype::*;
    match from {
        F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => {
            lookup8_avx512(super::formats::table_f32(from), src, dst, false)
        }
        // SAFETY: AVX2 and F16C, as the caller guarantees.
        _ => unsafe { to_f32(from, src, dst) },
    }
}

/// [`to_f32_avx512`] for an 8-bit float source, whose 64-byte steps are whole cache lines:
/// streamed straight from the registers (see `streaming.rs` for why) rather than staged, which
/// measured slower than plain stores for this kernel.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and F16C ([`avx512_available`]); `from` is an 8-bit float.
#[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
#[allow(clippy::incompatible_msrv)] // compiled only by a Rust that has them (build.rs)
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(crate) unsafe fn float8_to_f32_streamed(from: Dtype, src: &[u8], dst: &mut [u8]) {
    let table = super::formats::table_f32(from);
    // Plain stores up to the first line boundary of `dst` (all of it when its elements do not
    // start on 4-byte boundaries, which never meet one).
    let head = match dst.as_ptr().align_offset(64) {
        h if h % 4 == 0 => (h / 4).min(src.len()),
        _ => src.len(),
    };
    map::<1, 4>(&src[..head], &mut dst[..4 * head], |[b]| {
        table[usize::from(b)].to_le_bytes()
    });
    let rest = &mut dst[4 * head..];
    let on_line = rest.as_ptr().align_offset(64) == 0;
    // SAFETY: the caller's guarantees; streaming only where `rest` starts on a line.
    unsafe { lookup8_avx512(table, &src[head..], rest, on_line) };
    // Streaming stores are weakly ordered: the fence orders them before later stores.
    _mm_sfence();
}

/// Each source byte's entry of `table` (its F32 bits, copied as they are: NaN payloads
/// included). The 256 entries live in sixteen registers; `vpermt2d` picks among 32 entries by
/// the index's low five bits, and bits 5 to 7 choose among the eight results. With `stream`,
/// `dst` starts on a 64-byte boundary and every whole step is a streaming store.
#[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
#[allow(clippy::incompatible_msrv)] // compiled only by a Rust that has them (build.rs)
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn lookup8_avx512(table: &[f32; 256], src: &[u8], dst: &mut [u8], stream: bool) {
    debug_assert!(!stream || dst.as_ptr().align_offset(64) == 0);
    // SAFETY: 256 entries are 16 registers of 16; unaligned loads.
    let t: [__m512i; 16] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_si512(table[16 * i..].as_ptr().cast()) });
    let mut s = src.chunks_exact(16);
    let mut d = dst.chunks_exact_mut(64);
    for (s, d) in (&mut s).zip(&mut d) {
        // SAFETY: `s` has 16 bytes and `d` 64 (chunks_exact); unaligned load and store.
        let idx = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(s.as_ptr().cast()) });
        let r: [__m512i; 8] =
            std::array::from_fn(|i| _mm512_permutex2var_epi32(t[2 * i], idx, t[2 * i + 1]));
        let bit = |b: i32| _mm512_test_epi32_mask(idx, _mm512_set1_epi32(b));
        let (m5, m6, m7) = (bit(32), bit(64), bit(128));
        let a: [__m512i; 4] =
            std::array::from_fn(|i| _mm512_mask_blend_epi32(m5, r[2 * i], r[2 * i + 1]));
        let b0 = _mm512_mask_blend_epi32(m6, a[0], a[1]);
        let b1 = _mm512_mask_blend_epi32(m6, a[2], a[3]);
        let v = _mm512_mask_blend_epi32(m7, b0, b1);
        if stream {
            // SAFETY: `d` is a whole line (`dst` starts on one and steps are 64 bytes).
            unsafe { _mm512_stream_si512(d.as_mut_ptr().cast(), v) };
        } else {
            unsafe { _mm512_storeu_si512(d.as_mut_ptr().cast(), v) };
        }
    }
    map::<1, 4>(s.remainder(), d.into_remainder(), |[b]| {
        table[usize::from(b)].to_le_bytes()
    });
}

/// Elements per F16C step.
const N: usize = 8;

/// Eight F16 to eight F32, bit for bit as [`super::decode::f16_to_f32_bits`]: `vcvtph2ps`
/// quiets a signalling NaN (sets the top mantissa bit), which the portable path keeps as it is
/// (the payload shifted up, like NumPy's scalar `npy_halfbits_to_floatbits`), so that bit is
/// cleared again in the lanes whose F16 code was a signalling NaN. Random bytes read as F16 are
/// about 3% NaN, so this is done with masks rather than a scalar detour.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn cvt8(src: &[u8]) -> __m256 {
    debug_assert!(src.len() >= 2 * N);
    // SAFETY: 16 readable bytes (checked by the callers' chunking); unaligned load.
    let h = unsafe { _mm_loadu_si128(src.as_ptr().cast()) };
    let f = _mm256_cvtph_ps(h);
    // Signalling NaN: exponent all ones, quiet bit clear ((h & 0x7E00) == 0x7C00), payload
    // nonzero ((h & 0x01FF) != 0).
    let w = _mm256_cvtepu16_epi32(h);
    let top = _mm256_cmpeq_epi32(
        _mm256_and_si256(w, _mm256_set1_epi32(0x7E00)),
        _mm256_set1_epi32(0x7C00),
    );
    let no_payload = _mm256_cmpeq_epi32(
        _mm256_and_si256(w, _mm256_set1_epi32(0x01FF)),
        _mm256_setzero_si256(),
    );
    let quiet_bit = _mm256_andnot_si256(
        no_payload,
        _mm256_and_si256(top, _mm256_set1_epi32(1 << 22)),
    );
    _mm256_castsi256_ps(_mm256_andnot_si256(quiet_bit, _mm256_castps_si256(f)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_to_f32(src: &[u8], dst: &mut [u8]) {
    let mut s = src.chunks_exact(2 * N);
    let mut d = dst.chunks_exact_mut(4 * N);
    for (s, d) in (&mut s).zip(&mut d) {
        // SAFETY: `s` has 16 bytes and `d` 32 (chunks_exact); unaligned loads and stores.
        unsafe { _mm256_storeu_ps(d.as_mut_ptr().cast(), cvt8(s)) };
    }
    map::<2, 4>(s.remainder(), d.into_remainder(), |b| {
        f16_to_f32_bits(u16::from_le_bytes(b)).to_le_bytes()
    });
}

/// F16 to F64 through F32: `vcvtps2pd` quiets signalling NaNs, as the portable path's
/// `f64::from(f32)` does on x86 (the same instruction family), so no fix-up is needed beyond
/// [`cvt8`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_to_f64(src: &[u8], dst: &mut [u8]) {
    let mut s = src.chunks_exact(2 * N);
    let mut d = dst.chunks_exact_mut(8 * N);
    for (s, d) in (&mut s).zip(&mut d) {
        let f = unsafe { cvt8(s) };
        let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
        let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(f));
        // SAFETY: `d` has 64 bytes (chunks_exact); unaligned stores.
        unsafe {
            _mm256_storeu_pd(d.as_mut_ptr().cast(), lo);
            _mm256_storeu_pd(d.as_mut_ptr().add(32).cast(), hi);
        }
    }
    map::<2, 8>(s.remainder(), d.into_remainder(), |b| {
        f64::from(f32::from_bits(f16_to_f32_bits(u16::from_le_bytes(b)))).to_le_bytes()
    });
}

/// F32 to F16 with `vcvtps2ph`, rounding to nearest even (the immediate, not MXCSR's mode),
/// which is IEEE's correctly rounded conversion, as NumPy's and [`super::encode::encode`]:
/// subnormal results, overflow to infinity and ties all agree. NaNs differ (the instruction
/// quiets them; NumPy keeps the payload's top bits), so a step of eight holding a NaN takes
/// the portable encoder; real F32 data rarely holds one.
///
/// # Safety
/// The CPU must have AVX2 and F16C ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn f32_to_f16(src: &[u8], dst: &mut [u8], portable: impl Fn(&[u8], &mut [u8])) {
    let mut s = src.chunks_exact(4 * N);
    let mut d = dst.chunks_exact_mut(2 * N);
    for (s, d) in (&mut s).zip(&mut d) {
        // SAFETY: `s` has 32 bytes and `d` 16 (chunks_exact); unaligned loads and stores.
        let x = unsafe { _mm256_loadu_ps(s.as_ptr().cast()) };
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x)) != 0 {
            portable(s, d);
            continue;
        }
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), h) };
    }
    portable(s.remainder(), d.into_remainder());
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::convert::decode::{to_f32_portable, to_f64_portable};

    /// Every F16 code, twice over and shifted by one byte (unaligned, and a tail shorter than
    /// a step).
    fn all_f16_codes() -> Vec<u8> {
        let mut v = vec![0u8];
        for c in 0..=u16::MAX {
            v.extend_from_slice(&c.to_le_bytes());
        }
        v.extend_from_slice(&[0x01, 0x7C, 0x00, 0xFE, 0x00, 0x7E]); // sNaN, -qNaN, +qNaN
        v
    }

    #[test]
    fn f16c_decode_equals_the_portable_path_on_every_code_nans_included() {
        if !available() {
            eprintln!("SKIPPED: no AVX2/F16C on this CPU");
            return;
        }
        let src = all_f16_codes();
        let src = &src[1..];
        let n = src.len() / 2;
        let (mut want, mut got) = (vec![0u8; 4 * n], vec![0u8; 4 * n]);
        to_f32_portable(Dtype::F16, src, &mut want);
        unsafe { to_f32(Dtype::F16, src, &mut got) };
        let first_bad = (0..n).find(|&i| want[4 * i..4 * i + 4] != got[4 * i..4 * i + 4]);
        assert_eq!(first_bad, None, "F16 -> F32 differs from the portable path");
        // The signalling NaN 0x7C01 keeps its quiet bit clear.
        assert_eq!(&got[4 * 0x7C01..4 * 0x7C02], &0x7F80_2000u32.to_le_bytes());

        let (mut want, mut got) = (vec![0u8; 8 * n], vec![0u8; 8 * n]);
        to_f64_portable(Dtype::F16, src, &mut want);
        unsafe { to_f64(Dtype::F16, src, &mut got) };
        let first_bad = (0..n).find(|&i| want[8 * i..8 * i + 8] != got[8 * i..8 * i + 8]);
        assert_eq!(first_bad, None, "F16 -> F64 differs from the portable path");
    }

    #[test]
    fn widening_into_a_streamed_destination_reads_only_the_source() {
        if !available() {
            eprintln!("SKIPPED: no AVX2/F16C on this CPU");
            return;
        }
        use crate::convert::{convert_on, streaming::Store, Kernels};
        // The source is the front of a larger buffer whose bytes past it would convert to
        // something else; the destination starts on a line and spans many lines. Whatever the
        // lengths, the kernel converts the elements both hold, as the portable loops do.
        for from in [Dtype::I32, Dtype::F64] {
            let width = from.bits() / 8;
            let backing: Vec<u8> = (0u64..64 * 1024)
                .map(|i| ((i * 2_654_435_761) >> 13) as u8)
                .collect();
            for (src_elems, dst_elems) in [(16usize, 1024usize), (100, 1024), (1024, 100)] {
                let src = &backing[..src_elems * width];
                let mut buf = vec![0xA5u8; 4 * dst_elems + 64];
                let line = buf.as_ptr().align_offset(64);
                let mut want = buf.clone();
                convert_on(
                    Kernels::Portable,
                    Store::Plain,
                    from,
                    src,
                    Dtype::F32,
                    &mut want[line..line + 4 * dst_elems],
                );
                let dst = &mut buf[line..line + 4 * dst_elems];
                convert_on(Kernels::Avx2, Store::Avx2Stream, from, src, Dtype::F32, dst);
                let bad = (0..buf.len()).find(|&i| buf[i] != want[i]);
                assert_eq!(
                    bad, None,
                    "{from}: {src_elems} source, {dst_elems} destination elements"
                );
            }
        }
    }

    #[test]
    fn avx2_decode_loops_equal_the_portable_path_for_every_source() {
        if !available() {
            eprintln!("SKIPPED: no AVX2/F16C on this CPU");
            return;
        }
        // Bytes of a hash read as each dtype: 24 × 1367 bytes hold whole elements of every
        // dtype (F6 included) and leave a tail after the last full step of eight.
        let src: Vec<u8> = (0u64..24 * 1367)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect();
        for from in Dtype::ALL {
            if from == Dtype::C64 {
                continue; // refused before any loop runs
            }
            let n = src.len() * 8 / from.bits();
            let (mut want, mut got) = (vec![0u8; 4 * n], vec![0u8; 4 * n]);
            to_f32_portable(from, &src, &mut want);
            unsafe { to_f32(from, &src, &mut got) };
            assert!(want == got, "{from} -> F32 differs");
            let (mut want, mut got) = (vec![0u8; 8 * n], vec![0u8; 8 * n]);
            to_f64_portable(from, &src, &mut want);
            unsafe { to_f64(from, &src, &mut got) };
            assert!(want == got, "{from} -> F64 differs");
        }
    }

    #[test]
    fn avx2_encode_loops_equal_the_portable_path_for_every_target() {
        if !available() {
            eprintln!("SKIPPED: no AVX2/F16C on this CPU");
            return;
        }
        // Hash bytes read as F32: every exponent, NaNs and infinities among them; 4 × 3 × 1367
        // elements leave a tail after the last step of eight and fill whole F4/F6 bytes.
        let src: Vec<u8> = (0u64..16 * 3 * 1367)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect();
        let n = src.len() / 4;
        for to in Dtype::ALL {
            if !crate::convert::is_float(to) || to == Dtype::F32 || to == Dtype::F64 {
                continue;
            }
            let len = to.byte_size(n).unwrap();
            let (mut want, mut got) = (vec![0u8; len], vec![0u8; len]);
            crate::convert::encode_from_f32_portable(&src, to, &mut want, false);
            unsafe { encode_from_f32(&src, to, &mut got) };
            assert!(want == got, "F32 -> {to} differs");
        }
    }

    #[test]
    fn f16c_encode_equals_the_portable_encoder_on_a_sweep_of_f32_bit_patterns() {
        if !available() {
            eprintln!("SKIPPED: no AVX2/F16C on this CPU");
            return;
        }
        // Every 4099th pattern (all exponents, both signs, NaNs among them), plus each F16
        // boundary: the midpoints between adjacent F16 values and their neighbours (ties and
        // the ulps around them), in blocks that mix NaN-free and NaN-holding steps.
        let mut xs: Vec<u32> = (0..=u32::MAX).step_by(4099).collect();
        for c in 0..0x7C00u16 {
            let lo = f64::from(f32::from_bits(f16_to_f32_bits(c)));
            // Above the largest finite F16 (65504), the next step would be 65536.
            let hi = if c == 0x7BFF {
                65536.0
            } else {
                f64::from(f32::from_bits(f16_to_f32_bits(c + 1)))
            };
            let mid = ((lo + hi) / 2.0) as f32; // exact: F16 midpoints fit in F32
            for b in [mid.to_bits() - 1, mid.to_bits(), mid.to_bits() + 1] {
                xs.push(b);
                xs.push(b | 1 << 31);
            }
        }
        let src: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let portable = |s: &[u8], d: &mut [u8]| {
            crate::convert::decode::map::<4, 2>(s, d, |b| {
                super::super::encode::encode_f32_fast(
                    &super::super::formats::F16,
                    u32::from_le_bytes(b),
                )
                .to_le_bytes()
            })
        };
        let (mut want, mut got) = (vec![0u8; src.len() / 2], vec![0u8; src.len() / 2]);
        portable(&src, &mut want);
        unsafe { f32_to_f16(&src, &mut got, portable) };
        let first_bad = (0..xs.len()).find(|&i| want[2 * i..2 * i + 2] != got[2 * i..2 * i + 2]);
        assert_eq!(first_bad.map(|i| format!("{:#010x}", xs[i])), None);
    }
}
