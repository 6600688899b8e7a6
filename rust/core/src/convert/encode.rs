//! Encoding F32 and F64 values into the narrow float formats, bit for bit as ml_dtypes' (and,
//! for F16, NumPy's) `astype`: round to nearest, ties to even; subnormals kept; and per format
//! the same overflow, infinity and NaN rules:
//! - IEEE formats (F16, BF16, F8_E5M2): overflow gives infinity; NaN stays NaN (F16 keeps the
//!   top mantissa bits of the payload as NumPy does, BF16 and F8_E5M2 give ml_dtypes' one quiet
//!   NaN, sign kept);
//! - F8_E4M3 (no infinity): overflow and infinity give NaN with the input's sign;
//! - the FNUZ types: overflow, infinity and NaN give 0x80, and -0 becomes +0;
//! - F4 and F6 (no infinity, no NaN): overflow and infinity saturate to the largest finite
//!   value; NaN gives the zero of the opposite sign (what ml_dtypes 0.6 produces);
//! - F8_E8M0: rounds to the nearest power of two with ties away from zero, below 2^-127 gives
//!   2^-127 (and F32 subnormals above 2^-127 give 2^-126, as ml_dtypes 0.6), and zero, negatives, infinity and NaN give NaN (0xFF), as ml_dtypes.
//!
//! ml_dtypes converts F64 to its types through F32 (two roundings); NumPy's F16 rounds once.

use super::formats::{Format, Specials};

/// A finite, nonzero magnitude `sig × 2^e2` (with `sig > 0`).
#[derive(Clone, Copy)]
pub(crate) struct Mag {
    sig: u64,
    e2: i32,
}

impl Mag {
    /// floor(log2(value)).
    fn exponent(self) -> i32 {
        63 - self.sig.leading_zeros() as i32 + self.e2
    }
}

/// The magnitude code of `m` in `fmt`, rounded to nearest even, before overflow handling (it
/// may exceed the format's largest code).
fn round_magnitude(fmt: &Format, m: Mag) -> u64 {
    let e = m.exponent().max(fmt.emin());
    // Value = n × 2^q with n the code's significand (hidden bit included for normals).
    let q = e - fmt.mbits as i32;
    let shift = q - m.e2;
    let base = ((e - fmt.emin()) as u64) << fmt.mbits;
    if shift <= 0 {
        // Exact: the format has at least as much precision here (never for narrow targets,
        // kept for completeness).
        return base + (m.sig << (-shift).min(63));
    }
    if shift > 64 {
        return base; // far below half of the smallest step: rounds to zero
    }
    let trunc = if shift == 64 { 0 } else { m.sig >> shift };
    let rem = if shift == 64 {
        m.sig
    } else {
        m.sig & ((1u64 << shift) - 1)
    };
    let half = 1u64 << (shift - 1);
    // Normal: code = (biased exponent << mbits) + (n - 2^mbits) = base + n; subnormal: base 0.
    // A carry out of the mantissa lands on the next exponent's first code, as it should.
    let code = base + trunc;
    let up = rem > half || (rem == half && code & 1 == 1);
    code + u64::from(up)
}

/// An IEEE binary value split for encoding.
#[derive(Clone, Copy)]
pub(crate) enum Split {
    Zero,
    Inf,
    /// NaN, with its payload's top bits left-aligned in a u64 (for F16's payload rule).
    Nan(u64),
    Finite(Mag),
}

pub(crate) fn split_f32(bits: u32) -> (bool, Split) {
    let sign = bits >> 31 != 0;
    let exp = (bits >> 23) & 0xFF;
    let mant = u64::from(bits & 0x7F_FFFF);
    let s = match (exp, mant) {
        (0, 0) => Split::Zero,
        (0, m) => Split::Finite(Mag { sig: m, e2: -149 }),
        (0xFF, 0) => Split::Inf,
        (0xFF, m) => Split::Nan(m << 41),
        (e, m) => Split::Finite(Mag {
            sig: m | 1 << 23,
            e2: e as i32 - 150,
        }),
    };
    (sign, s)
}

pub(crate) fn split_f64(bits: u64) -> (bool, Split) {
    let sign = bits >> 63 != 0;
    let exp = (bits >> 52) & 0x7FF;
    let mant = bits & 0xF_FFFF_FFFF_FFFF;
    let s = match (exp, mant) {
        (0, 0) => Split::Zero,
        (0, m) => Split::Finite(Mag { sig: m, e2: -1074 }),
        (0x7FF, 0) => Split::Inf,
        (0x7FF, m) => Split::Nan(m << 12),
        (e, m) => Split::Finite(Mag {
            sig: m | 1 << 52,
            e2: e as i32 - 1075,
        }),
    };
    (sign, s)
}

/// Encodes a split value into `fmt` (not E8M0), following the rules in the module comment.
pub(crate) fn encode(fmt: &Format, sign: bool, v: Split) -> u16 {
    let sign_bit = if sign { fmt.sign_bit() as u16 } else { 0 };
    let max = fmt.max_finite() as u16;
    let exp_ones = ((1u16 << fmt.ebits) - 1) << fmt.mbits;
    let overflow = || -> u16 {
        match fmt.specials {
            Specials::Ieee => sign_bit | exp_ones,
            Specials::FiniteNanOnes => sign_bit | (max + 1),
            Specials::FiniteNanNegZero => fmt.sign_bit() as u16,
            Specials::FiniteOnly => sign_bit | max,
        }
    };
    match v {
        Split::Zero => match fmt.specials {
            Specials::FiniteNanNegZero => 0,
            _ => sign_bit,
        },
        Split::Inf => overflow(),
        Split::Nan(payload) => match fmt.specials {
            Specials::Ieee if fmt.mbits == 10 => {
                // NumPy's half: the payload's top bits, made nonzero so it stays a NaN.
                let top = (payload >> 54) as u16;
                sign_bit | exp_ones | top.max(1)
            }
            Specials::Ieee => sign_bit | exp_ones | (1 << (fmt.mbits - 1)),
            Specials::FiniteNanOnes => sign_bit | (max + 1),
            Specials::FiniteNanNegZero => fmt.sign_bit() as u16,
            Specials::FiniteOnly => {
                if sign {
                    0
                } else {
                    fmt.sign_bit() as u16
                }
            }
        },
        Split::Finite(m) => {
            let code = round_magnitude(fmt, m);
            if code > u64::from(max) {
                overflow()
            } else if code == 0 && fmt.specials == Specials::FiniteNanNegZero {
                0
            } else {
                sign_bit | code as u16
            }
        }
    }
}

/// Encodes an F32 value as F8_E8M0 (see the module comment).
pub(crate) fn encode_e8m0(bits: u32) -> u8 {
    let (sign, v) = split_f32(bits);
    match v {
        Split::Finite(m) if !sign => {
            let e = m.exponent();
            if e < -127 {
                return 0;
            }
            if e == -127 {
                // An F32 subnormal: ml_dtypes gives 2^-126 for anything above 2^-127.
                return u8::from(m.sig != 1 << 22);
            }
            // The bit just below the leading one decides: ties (exactly 1.5 × 2^e) go up.
            let lead = 63 - m.sig.leading_zeros();
            let up = lead > 0 && (m.sig >> (lead - 1)) & 1 == 1;
            let code = e + 127 + i32::from(up);
            if code > 254 {
                0xFF
            } else {
                code as u8
            }
        }
        _ => 0xFF,
    }
}

/// F32 to BF16 with ties to even: the usual bit trick (exact for subnormals and overflow,
/// which BF16 shares with F32), NaN as ml_dtypes' quiet NaN.
#[inline(always)]
pub(crate) fn f32_to_bf16(bits: u32) -> u16 {
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((bits >> 16) as u16 & 0x8000) | 0x7FC0;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// F32 into `fmt` (not E8M0) with F32 arithmetic, for speed: the same results as [`encode`].
/// Normal results round by adding half a step (minus one, plus the kept bit for ties to even)
/// to the rebiased bits; subnormal results by one F32 addition of a constant whose unit in the
/// last place is the target's smallest step, which the FPU rounds to nearest even. Infinities
/// and NaN take [`encode`].
#[inline(always)]
pub(crate) fn encode_f32_fast(fmt: &Format, bits: u32) -> u16 {
    let abs = bits & 0x7FFF_FFFF;
    if abs >= 0x7F80_0000 {
        let (sign, v) = split_f32(bits);
        return encode(fmt, sign, v);
    }
    let sign_bit = if bits >> 31 != 0 { fmt.sign_bit() } else { 0 };
    let shift = 23 - fmt.mbits;
    let min_normal = ((fmt.emin() + 127) as u32) << 23;
    let code = if abs < min_normal {
        // 2^(emin - mbits + 23): its F32 ulp is the target's subnormal step.
        let magic = ((fmt.emin() - fmt.mbits as i32 + 23 + 127) as u32) << 23;
        (f32::from_bits(abs) + f32::from_bits(magic)).to_bits() - magic
    } else {
        let r = abs - (((127 - fmt.bias) as u32) << 23);
        (r + (1 << (shift - 1)) - 1 + ((r >> shift) & 1)) >> shift
    };
    if code > fmt.max_finite() {
        let (sign, _) = split_f32(bits);
        return encode(fmt, sign, Split::Inf);
    }
    if code == 0 && fmt.specials == Specials::FiniteNanNegZero {
        return 0;
    }
    (sign_bit | code) as u16
}

/// [`encode_f32_fast`] without branches, for the formats of at most 8 bits (F8, F6, F4; not
/// E8M0): every case is computed and the result selected, so that the element loops vectorize
/// (the branchy form ran one element at a time, ~3.8 ns each). The arithmetic is the same as
/// [`encode_f32_fast`]'s, hence the same bits; only the order of evaluation differs. Meant to
/// be inlined with `fmt` a constant, which folds every format parameter.
#[inline(always)]
pub(crate) fn encode_f32_narrow(fmt: &Format, bits: u32) -> u8 {
    debug_assert!(fmt.bits() <= 8);
    let abs = bits & 0x7FFF_FFFF;
    let negative = bits >> 31 != 0;
    let sign_bit = if negative { fmt.sign_bit() } else { 0 };
    let shift = 23 - fmt.mbits;
    let min_normal = ((fmt.emin() + 127) as u32) << 23;
    // Subnormal results: one F32 addition whose unit in the last place is the target's
    // smallest step (as in `encode_f32_fast`). For infinities and NaN it gives garbage that the
    // selection below never takes.
    let magic = ((fmt.emin() - fmt.mbits as i32 + 23 + 127) as u32) << 23;
    let sub = (f32::from_bits(abs) + f32::from_bits(magic))
        .to_bits()
        .wrapping_sub(magic);
    // Normal results: rebias, then add half a step less one plus the kept bit (ties to even).
    let r = abs.wrapping_sub(((127 - fmt.bias) as u32) << 23);
    let normal = r.wrapping_add((1 << (shift - 1)) - 1 + ((r >> shift) & 1)) >> shift;
    let code = if abs < min_normal { sub } else { normal };
    let max = fmt.max_finite();
    let exp_ones = ((1u32 << fmt.ebits) - 1) << fmt.mbits;
    // What NaN, an overflow (infinity included: its code exceeds `max`) and zero give.
    let (nan, over, zero) = match fmt.specials {
        Specials::Ieee => (
            sign_bit | exp_ones | (1 << (fmt.mbits - 1)),
            sign_bit | exp_ones,
            sign_bit,
        ),
        Specials::FiniteNanOnes => (sign_bit | (max + 1), sign_bit | (max + 1), sign_bit),
        Specials::FiniteNanNegZero => (fmt.sign_bit(), fmt.sign_bit(), 0),
        Specials::FiniteOnly => (
            if negative { 0 } else { fmt.sign_bit() },
            sign_bit | max,
            sign_bit,
        ),
    };
    let out = if abs > 0x7F80_0000 {
        nan
    } else if code > max {
        over
    } else if code == 0 {
        zero
    } else {
        sign_bit | code
    };
    out as u8
}
