//! Dtype conversion and dequantization: every dtype of the format into F32, F64, F16, BF16,
//! the 8-bit floats, F4 and F6, bit for bit as ml_dtypes' and NumPy's `astype` (the rules are in
//! `encode.rs`), and the two block-scaled layouts real checkpoints use (`dequant.rs`).
//!
//! Packing of the sub-byte types: F4 holds two elements per byte, element 0 in the low nibble
//! (PyTorch's `float4_e2m1fn_x2`, torchao, and gpt-oss's MXFP4 blocks). F6 is a little-endian
//! bit stream, four elements in three bytes, element 0 in the low six bits of byte 0 and
//! element 1 starting at bit 6: the layout of AMD's rocRoller (`getFp6` in
//! `lib/source/DataTypes/DataTypes_FP6.cpp`) and the natural continuation of F4's
//! low-nibble-first order; the safetensors format itself only fixes the size (6 bits).
//!
//! Sources decode exactly to F32 (every narrow value fits); integers and BOOL convert as
//! NumPy's `astype` (BOOL: nonzero is 1; integers round to nearest even). Targets must be
//! float dtypes: C64 sources and non-float targets are `TypeMismatch` errors, whatever the
//! pair, identity included.
//!
//! Errors are one rule for two faces: each operation into a caller's buffer first asks the
//! function that sizes its output ([`converted_len`], [`fp8_blocks_output_len`],
//! [`mxfp4_output`]), which makes every check of the inputs, and only then compares the
//! destination's length; the bindings that allocate the output size it with the same function.
//! So an input gets the same error kind whoever owns the output, and no message quotes a size
//! that does not exist: byte lengths come from the tensor byte-length rule (`byte_len.rs`).

mod decode;
mod dequant;
mod encode;
mod formats;
#[cfg(target_arch = "x86_64")]
mod simd;
mod streaming;

pub use dequant::{
    dequantize_fp8_blocks, dequantize_mxfp4, fp8_blocks_output_len, mxfp4_output,
    mxfp4_output_shape,
};

use crate::byte_len::{check_data_len, checked_numel, tensor_byte_len};
use crate::{Dtype, Error, Result, TensorView};
use decode::map;
use encode::{encode, encode_e8m0, encode_f32_fast, encode_f32_narrow, f32_to_bf16, split_f64};

/// Whether `to` can be a conversion target: every float dtype.
pub fn is_float(d: Dtype) -> bool {
    use Dtype::*;
    matches!(
        d,
        F4 | F6_E2M3
            | F6_E3M2
            | F8_E5M2
            | F8_E4M3
            | F8_E8M0
            | F8_E4M3FNUZ
            | F8_E5M2FNUZ
            | F16
            | BF16
            | F32
            | F64
    )
}

/// Checks that `from` → `to` is a conversion we do.
pub fn check_conversion(from: Dtype, to: Dtype) -> Result<()> {
    let reason = if from == Dtype::C64 {
        "a complex source has no single real value per element; convert its real and imaginary \
         parts yourself (view it as twice as many F32)"
    } else if !is_float(to) {
        "the target must be a float dtype (F64, F32, F16, BF16, F8_*, F6_*, F4)"
    } else {
        return Ok(());
    };
    Err(Error::Conversion {
        from,
        to,
        reason: reason.into(),
    })
}

/// The dtype with enumeration value `value` (as C++ passes it, a `uint8_t`, or C, an
/// `int32_t`) for a conversion ([`Error::InvalidDtypeValue`], of kind `TypeMismatch`, when
/// there is none, whatever the value's width).
pub fn dtype_to_convert(value: impl Into<i64>) -> Result<Dtype> {
    let value = value.into();
    crate::dtype::Dtype::from_value(value).ok_or(Error::InvalidDtypeValue {
        value,
        tensor: None,
    })
}

/// Number of elements of `shape`, checked.
pub(crate) fn numel(dtype: Dtype, shape: &[usize]) -> Result<usize> {
    checked_numel(shape).ok_or_else(|| Error::ValidationOverflow {
        tensor: format!("({dtype} conversion)"),
        shape: shape.to_vec(),
    })
}

/// Checks a caller's tensor `what` (its bytes against its dtype and shape) by the tensor
/// byte-length rule.
pub(crate) fn check_input(what: &str, v: &TensorView<'_>) -> Result<()> {
    check_data_len(what, v.dtype, v.shape, v.data.len())
}

/// Bytes of an output of `to` and `shape`, by the tensor byte-length rule: an F4 or F6 output
/// whose elements end inside a byte is `MisalignedSlice` (no buffer can hold it), one whose size
/// does not fit is `ValidationOverflow`.
pub(crate) fn output_len(to: Dtype, shape: &[usize]) -> Result<usize> {
    tensor_byte_len(&format!("the {to} output"), to, shape)
}

/// Checks a caller's destination, `len` bytes, against the `expected` bytes of an output of
/// `to` and `shape` (already computed by [`output_len`], so never a size that does not exist).
pub(crate) fn check_destination(
    to: Dtype,
    shape: &[usize],
    expected: usize,
    len: usize,
) -> Result<()> {
    if len == expected {
        return Ok(());
    }
    Err(Error::TensorInvalidInfo {
        tensor: format!("the destination ({to} {shape:?})"),
        expected: expected as u64,
        actual: len as u64,
    })
}

/// Bytes that converting `src` into `to` writes, after every check [`convert`] makes of its
/// inputs, in the same order: the pair (`TypeMismatch`), the source's bytes against its dtype
/// and shape (`ValidationOverflow`, `MisalignedSlice`, `TensorInvalidInfo`), and the output's
/// size (`ValidationOverflow`, or `MisalignedSlice` for an F4/F6 count ending inside a byte).
/// Callers that allocate the output size it with this, so that they and the callers that pass
/// a buffer of their own get the same error for the same input.
///
/// ```
/// use safetensors_core::{convert::converted_len, Dtype, ErrorKind, TensorView};
/// let src = [0u8; 12];
/// assert_eq!(converted_len(TensorView::new(Dtype::F32, &[3], &src), Dtype::F16)?, 6);
/// let e = converted_len(TensorView::new(Dtype::F32, &[3], &src), Dtype::F4).unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::MisalignedSlice);
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub fn converted_len(src: TensorView<'_>, to: Dtype) -> Result<usize> {
    check_conversion(src.dtype, to)?;
    check_input("the source tensor", &src)?;
    output_len(to, src.shape)
}

/// Converts `numel` elements of `from` in `src` into `to` in `dst`, which must hold exactly
/// `numel × size(to)` bytes. Source and destination may have any alignment. Errors: those of
/// [`converted_len`], then `TensorInvalidInfo` for a `dst` of another length.
///
/// ```
/// use safetensors_core::{convert::convert, Dtype};
/// let src = [0x3C00u16.to_le_bytes(), 0xC000u16.to_le_bytes()].concat(); // F16 1.0, -2.0
/// let mut dst = [0u8; 8];
/// convert(Dtype::F16, &[2], &src, Dtype::F32, &mut dst)?;
/// assert_eq!(f32::from_le_bytes(dst[4..].try_into().unwrap()), -2.0);
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub fn convert(from: Dtype, shape: &[usize], src: &[u8], to: Dtype, dst: &mut [u8]) -> Result<()> {
    let want = converted_len(TensorView::new(from, shape, src), to)?;
    check_destination(to, shape, want, dst.len())?;
    convert_unchecked(from, src, to, dst);
    Ok(())
}

/// Outputs from this size are converted on several threads (one per core the process may run
/// on, at most eight), in pieces of [`PIECE_ELEMENTS`]. One core cannot keep memory busy: on a
/// virtual 16-core Intel Xeon, reading 256 MiB alone took one core 26-30 ms, as long as
/// memcpy's whole copy of it, so F64 -> F32 (512 MiB read) could not pass 0.5-0.6x of a memcpy
/// of its output on one thread however it stored; on 2, 4 and 8 threads it took 29, 15-17 and
/// 10-14 ms against 52-60 ms on one. Below this, a thread's start (~20 µs) is not worth it.
const PARALLEL_FROM: usize = 16 << 20;

/// Elements per piece of a conversion on several threads: 4 MiB of F32, and a multiple of 8, so
/// that every piece of a sub-byte source or target is whole bytes.
const PIECE_ELEMENTS: usize = 1 << 20;

/// The conversion loops; lengths already agree. Outputs larger than a quarter of the last-level
/// cache are written with streaming stores (`streaming.rs`), outputs from [`PARALLEL_FROM`] on
/// several threads; the bits are the same on every path.
pub(crate) fn convert_unchecked(from: Dtype, src: &[u8], to: Dtype, dst: &mut [u8]) {
    let (kernels, store) = (Kernels::detect(), streaming::Store::detect(dst.len()));
    let threads = conversion_threads(to, dst.len());
    convert_in_pieces(kernels, store, threads, PIECE_ELEMENTS, from, src, to, dst);
}

/// Threads for a conversion into `len` bytes of `to`: one below [`PARALLEL_FROM`], else one
/// per core the process may run on now, at most eight and at most one per piece.
pub(crate) fn conversion_threads(to: Dtype, len: usize) -> usize {
    crate::file::parallel::threads_now(len, PARALLEL_FROM, PIECE_ELEMENTS * to.bits() / 8)
}

/// [`convert_on`] on `threads` threads (the caller's among them; one converts in place), in
/// pieces of `piece_elements` elements (a multiple of 8).
#[allow(clippy::too_many_arguments)]
pub(crate) fn convert_in_pieces(
    kernels: Kernels,
    store: streaming::Store,
    threads: usize,
    piece_elements: usize,
    from: Dtype,
    src: &[u8],
    to: Dtype,
    dst: &mut [u8],
) {
    debug_assert!(piece_elements > 0 && piece_elements.is_multiple_of(8));
    if threads <= 1 {
        return convert_on(kernels, store, from, src, to, dst);
    }
    // Piece i of the source and of the destination hold the same elements (whole bytes each:
    // `piece_elements` is a multiple of 8; F6's groups of four elements in three bytes stay
    // whole). Every caller has checked that the lengths agree; lengths that did not would pair
    // fewer pieces and could give wrong bytes or a panic (caught at the bridge), never an access
    // outside either buffer.
    let pieces: Vec<(&[u8], std::sync::Mutex<&mut [u8]>)> = src
        .chunks(piece_elements * from.bits() / 8)
        .zip(
            dst.chunks_mut(piece_elements * to.bits() / 8)
                .map(std::sync::Mutex::new),
        )
        .collect();
    let done: std::result::Result<(), std::convert::Infallible> =
        crate::file::parallel::on_tasks(pieces.len(), threads, |i| {
            let (s, d) = &pieces[i];
            let mut d = d.lock().unwrap_or_else(|e| e.into_inner());
            convert_on(kernels, store, from, s, to, &mut d);
            Ok(())
        });
    let Ok(()) = done;
}

/// Which copy of the element loops runs: the portable one, the one compiled for AVX2 and F16C,
/// or that one with AVX-512 table lookups for the 8-bit floats (`simd.rs`). All give the same
/// bits; tests run each the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernels {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
    Avx512,
}

impl Kernels {
    /// The fastest copy this CPU runs (std caches the CPUID answer).
    #[inline]
    pub(crate) fn detect() -> Self {
        #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
        if simd::avx512_available() {
            return Kernels::Avx512;
        }
        #[cfg(target_arch = "x86_64")]
        if simd::available() {
            return Kernels::Avx2;
        }
        Kernels::Portable
    }

    /// Every copy this CPU runs (for tests that compare them).
    #[cfg(test)]
    pub(crate) fn all_here() -> Vec<Self> {
        #[allow(unused_mut)]
        let mut v = vec![Kernels::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if simd::available() {
                v.push(Kernels::Avx2);
            }
            #[cfg(avx512_intrinsics)]
            if simd::avx512_available() {
                v.push(Kernels::Avx512);
            }
        }
        v
    }
}

/// [`convert_unchecked`] with the loops and the way of storing chosen by the caller (any pair
/// the CPU runs).
pub(crate) fn convert_on(
    k: Kernels,
    store: streaming::Store,
    from: Dtype,
    src: &[u8],
    to: Dtype,
    dst: &mut [u8],
) {
    if from == to {
        // memcpy already streams large copies.
        dst.copy_from_slice(src);
        return;
    }
    // F6 into F32 stores plainly at every size: its unpacking loop measured slower staged and
    // streamed than storing as it goes (23.4 against 20.6 ms for 64 Mi elements, AMD EPYC).
    let f6_to_f32 = to == Dtype::F32 && matches!(from, Dtype::F6_E2M3 | Dtype::F6_E3M2);
    if store == streaming::Store::Plain || f6_to_f32 {
        return convert_plain(k, from, src, to, dst);
    }
    #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
    if k == Kernels::Avx512 && to == Dtype::F32 && from.bits() == 8 && is_float(from) {
        // SAFETY: `Kernels::Avx512` is only chosen where the CPU has AVX-512F, AVX2 and F16C.
        return unsafe { simd::float8_to_f32_streamed(from, src, dst) };
    }
    #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
    if k == Kernels::Avx512 && to == Dtype::F32 && from == Dtype::F64 {
        // SAFETY: `Kernels::Avx512` is only chosen where the CPU has AVX-512F, AVX2 and F16C.
        return unsafe { simd::f64_to_f32_streamed_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if k != Kernels::Portable && to == Dtype::F32 && matches!(from, Dtype::I32 | Dtype::F64) {
        // SAFETY: the SIMD kernels are only chosen where the CPU has AVX2 and F16C.
        return unsafe { simd::widen_to_f32_streamed(from, src, dst) };
    }
    streaming::convert_streamed(store, from, src, to, dst, |s, d| {
        convert_plain(k, from, s, to, d)
    });
}

/// The conversion loops, storing as they go.
fn convert_plain(k: Kernels, from: Dtype, src: &[u8], to: Dtype, dst: &mut [u8]) {
    match to {
        Dtype::F32 => to_f32_on(k, from, src, dst),
        Dtype::F64 => to_f64_on(k, from, src, dst),
        _ => encode_narrow(k, from, src, to, dst),
    }
}

/// Elements converted per step when a source goes through F32 first.
const STAGE: usize = 4096;

/// Into a narrow float: from F32 bits (F64 through F32, as ml_dtypes, except for F16, which
/// NumPy rounds once from F64); other sources are first decoded to F32, exactly.
fn encode_narrow(k: Kernels, from: Dtype, src: &[u8], to: Dtype, dst: &mut [u8]) {
    match from {
        Dtype::F32 => encode_from_f32(k, src, to, dst),
        Dtype::F64 if to == Dtype::F16 => map::<8, 2>(src, dst, |b| {
            let (sign, v) = split_f64(u64::from_le_bytes(b));
            encode(&formats::F16, sign, v).to_le_bytes()
        }),
        _ => {
            // Stage through F32 in chunks that keep whole bytes of sub-byte sources and
            // targets (STAGE is a multiple of 8).
            let mut tmp = vec![0u8; STAGE * 4];
            let src_step = STAGE * from.bits() / 8;
            let dst_step = STAGE * to.bits() / 8;
            for (s, d) in src.chunks(src_step).zip(dst.chunks_mut(dst_step)) {
                let n = s.len() * 8 / from.bits();
                let t = &mut tmp[..n * 4];
                if from == Dtype::F64 {
                    map::<8, 4>(s, t, |b| (f64::from_le_bytes(b) as f32).to_le_bytes());
                } else {
                    to_f32_on(k, from, s, t);
                }
                encode_from_f32(k, t, to, d);
            }
        }
    }
}

/// Decodes any non-complex source into F32 (sizes already checked), with the x86 AVX2/F16C
/// kernels where the CPU has them (the same bits, faster; see `simd.rs`).
pub(crate) fn to_f32(from: Dtype, src: &[u8], dst: &mut [u8]) {
    to_f32_on(Kernels::detect(), from, src, dst);
}

fn to_f32_on(k: Kernels, from: Dtype, src: &[u8], dst: &mut [u8]) {
    match k {
        // SAFETY: `Kernels::Avx2` is only chosen where the CPU has AVX2 and F16C,
        // `Kernels::Avx512` where it also has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => unsafe { simd::to_f32(from, src, dst) },
        #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
        Kernels::Avx512 => unsafe { simd::to_f32_avx512(from, src, dst) },
        Kernels::Portable => decode::to_f32_portable(from, src, dst),
    }
}

fn to_f64_on(k: Kernels, from: Dtype, src: &[u8], dst: &mut [u8]) {
    match k {
        // SAFETY: the x86 copies are only chosen where the CPU has AVX2 and F16C.
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => unsafe { simd::to_f64(from, src, dst) },
        #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
        Kernels::Avx512 => unsafe { simd::to_f64(from, src, dst) },
        Kernels::Portable => decode::to_f64_portable(from, src, dst),
    }
}

/// F32 (little-endian bytes) into a narrow float, with the x86 AVX2 copy of the loops where the
/// CPU has it (the same bits; see `simd.rs`).
fn encode_from_f32(k: Kernels, src: &[u8], to: Dtype, dst: &mut [u8]) {
    match k {
        // SAFETY: the x86 copies are only chosen where the CPU has AVX2 and F16C.
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => unsafe { simd::encode_from_f32(src, to, dst) },
        #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
        Kernels::Avx512 => unsafe { simd::encode_from_f32(src, to, dst) },
        Kernels::Portable => encode_from_f32_portable(src, to, dst, false),
    }
}

/// F32 (little-endian bytes) into a narrow float, on any CPU. Inlined into
/// `simd::encode_from_f32`, so that the same loops are also vectorized for AVX2 there, which
/// passes `f16c` (F16 targets through F16C; the caller guarantees the CPU has it).
#[inline(always)]
pub(crate) fn encode_from_f32_portable(src: &[u8], to: Dtype, dst: &mut [u8], f16c: bool) {
    let bits = |b: [u8; 4]| u32::from_le_bytes(b);
    match to {
        Dtype::BF16 => map::<4, 2>(src, dst, |b| f32_to_bf16(bits(b)).to_le_bytes()),
        Dtype::F8_E8M0 => map::<4, 1>(src, dst, |b| [encode_e8m0(bits(b))]),
        Dtype::F4 => map::<8, 1>(src, dst, |b| {
            let code = |x: [u8; 4]| encode_f32_narrow(&formats::E2M1, bits(x));
            [code([b[0], b[1], b[2], b[3]]) | code([b[4], b[5], b[6], b[7]]) << 4]
        }),
        // Each arm with its format as a constant, so that every parameter folds.
        Dtype::F6_E2M3 => f32_to_f6(&formats::E2M3, src, dst),
        Dtype::F6_E3M2 => f32_to_f6(&formats::E3M2, src, dst),
        Dtype::F16 => {
            let portable = |s: &[u8], d: &mut [u8]| {
                map::<4, 2>(s, d, |b| {
                    encode_f32_fast(&formats::F16, bits(b)).to_le_bytes()
                })
            };
            #[cfg(target_arch = "x86_64")]
            if f16c {
                // SAFETY: the caller passes `f16c` only where the CPU has AVX2 and F16C.
                return unsafe { simd::f32_to_f16(src, dst, portable) };
            }
            let _ = f16c;
            portable(src, dst);
        }
        // The remaining targets are the 8-bit formats (E8M0 above), each arm with its format
        // as a constant.
        Dtype::F8_E5M2 => f32_to_f8(&formats::E5M2, src, dst),
        Dtype::F8_E4M3 => f32_to_f8(&formats::E4M3, src, dst),
        Dtype::F8_E4M3FNUZ => f32_to_f8(&formats::E4M3FNUZ, src, dst),
        Dtype::F8_E5M2FNUZ => f32_to_f8(&formats::E5M2FNUZ, src, dst),
        _ => {}
    }
}

/// F32 into an 8-bit float, branch-free (see [`encode_f32_narrow`]).
#[inline(always)]
fn f32_to_f8(f: &formats::Format, src: &[u8], dst: &mut [u8]) {
    map::<4, 1>(src, dst, |b| [encode_f32_narrow(f, u32::from_le_bytes(b))]);
}

/// F32 into an F6 format, four elements into three bytes.
#[inline(always)]
fn f32_to_f6(f: &formats::Format, src: &[u8], dst: &mut [u8]) {
    map::<16, 3>(src, dst, |b| {
        let code = |i: usize| {
            encode_f32_narrow(
                f,
                u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
            )
        };
        decode::pack_f6([code(0), code(1), code(2), code(3)])
    });
}
