//! The narrow float formats: their parameters, exact decoding, and the 256-entry decode tables.
//!
//! Parameters follow ml_dtypes (the JAX team's implementation, our test oracle) and the OCP
//! Microscaling (MX) v1.0 spec: `F8_E4M3` is ml_dtypes' `float8_e4m3fn` (no infinity, NaN is
//! S.1111.111), `F8_E5M2` is IEEE-like, the `FNUZ` variants have bias 8 and 16 and a single NaN
//! at 0x80 (no negative zero), `F8_E8M0` is `float8_e8m0fnu` (2^(code-127), 0xFF is NaN, no
//! zero, no sign), `F4` is `float4_e2m1fn` and the F6 types `float6_e2m3fn` / `float6_e3m2fn`
//! (no infinity, no NaN).

use std::sync::OnceLock;

use crate::Dtype;

/// How a format spends its top codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Specials {
    /// IEEE: all-ones exponent is infinity (mantissa 0) or NaN.
    Ieee,
    /// Only the all-ones code (per sign) is NaN; no infinity ("fn").
    FiniteNanOnes,
    /// The negative-zero code 0x80 is the one NaN; no infinity, no -0 ("fnuz").
    FiniteNanNegZero,
    /// No infinity and no NaN ("fn" 4- and 6-bit types).
    FiniteOnly,
}

/// A sign-exponent-mantissa format of at most 16 bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Format {
    pub ebits: u32,
    pub mbits: u32,
    pub bias: i32,
    pub specials: Specials,
}

impl Format {
    const fn new(ebits: u32, mbits: u32, bias: i32, specials: Specials) -> Format {
        Format {
            ebits,
            mbits,
            bias,
            specials,
        }
    }

    /// Total bits, sign included.
    pub const fn bits(&self) -> u32 {
        1 + self.ebits + self.mbits
    }
    /// The smallest normal exponent.
    pub const fn emin(&self) -> i32 {
        1 - self.bias
    }
    /// The sign bit of a code.
    pub const fn sign_bit(&self) -> u32 {
        1 << (self.ebits + self.mbits)
    }
    /// The largest finite magnitude code.
    pub const fn max_finite(&self) -> u32 {
        let all = self.sign_bit() - 1;
        match self.specials {
            // The code below infinity.
            Specials::Ieee => (((1 << self.ebits) - 1) << self.mbits) - 1,
            Specials::FiniteNanOnes => all - 1,
            Specials::FiniteNanNegZero | Specials::FiniteOnly => all,
        }
    }
}

// Exponent bits, mantissa bits, bias, special codes.
pub(crate) const F16: Format = Format::new(5, 10, 15, Specials::Ieee);
pub(crate) const BF16: Format = Format::new(8, 7, 127, Specials::Ieee);
pub(crate) const E5M2: Format = Format::new(5, 2, 15, Specials::Ieee);
pub(crate) const E4M3: Format = Format::new(4, 3, 7, Specials::FiniteNanOnes);
pub(crate) const E4M3FNUZ: Format = Format::new(4, 3, 8, Specials::FiniteNanNegZero);
pub(crate) const E5M2FNUZ: Format = Format::new(5, 2, 16, Specials::FiniteNanNegZero);
pub(crate) const E2M1: Format = Format::new(2, 1, 1, Specials::FiniteOnly);
pub(crate) const E2M3: Format = Format::new(2, 3, 1, Specials::FiniteOnly);
pub(crate) const E3M2: Format = Format::new(3, 2, 3, Specials::FiniteOnly);

/// The sign-exponent-mantissa format of a dtype (`F8_E8M0` has none: it is handled apart).
pub(crate) fn format_of(dtype: Dtype) -> Option<Format> {
    Some(match dtype {
        Dtype::F16 => F16,
        Dtype::BF16 => BF16,
        Dtype::F8_E5M2 => E5M2,
        Dtype::F8_E4M3 => E4M3,
        Dtype::F8_E4M3FNUZ => E4M3FNUZ,
        Dtype::F8_E5M2FNUZ => E5M2FNUZ,
        Dtype::F4 => E2M1,
        Dtype::F6_E2M3 => E2M3,
        Dtype::F6_E3M2 => E3M2,
        _ => return None,
    })
}

/// The exact value of `code` in `fmt` (every such value is exact in f64, and in f32 too).
pub(crate) fn decode(fmt: &Format, code: u32) -> f64 {
    let sign = if code & fmt.sign_bit() != 0 {
        -1.0
    } else {
        1.0
    };
    let mag = code & (fmt.sign_bit() - 1);
    let exp = (mag >> fmt.mbits) as i32;
    let mant = f64::from(mag & ((1 << fmt.mbits) - 1));
    let all_ones = (1 << fmt.ebits) - 1;
    match fmt.specials {
        Specials::Ieee if exp == all_ones => {
            return if mant == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN.copysign(sign)
            };
        }
        Specials::FiniteNanOnes if mag == fmt.sign_bit() - 1 => return f64::NAN.copysign(sign),
        // The NaN sits on the negative-zero code, so it decodes as a negative NaN (as
        // ml_dtypes does; it matters where that NaN is converted on, to F4 or F6).
        Specials::FiniteNanNegZero if code == fmt.sign_bit() => return -f64::NAN,
        _ => {}
    }
    let scale = 1u64 << fmt.mbits;
    let value = if exp == 0 {
        mant / scale as f64 * pow2(fmt.emin())
    } else {
        (1.0 + mant / scale as f64) * pow2(exp - fmt.bias)
    };
    sign * value
}

/// The value of an `F8_E8M0` code: 2^(code - 127), 0xFF is NaN.
pub(crate) fn decode_e8m0(code: u8) -> f64 {
    if code == 0xFF {
        f64::NAN
    } else {
        pow2(i32::from(code) - 127)
    }
}

/// 2^e, exact for the range the formats use.
pub(crate) fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// The 256-entry F32 decode table of an 8-bit float dtype (F4 and F6 use their first 16 or 64
/// entries).
pub(crate) fn table_f32(dtype: Dtype) -> &'static [f32; 256] {
    static TABLES: OnceLock<Vec<[f32; 256]>> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        Dtype::ALL
            .iter()
            .map(|&d| {
                let mut t = [0f32; 256];
                for (code, slot) in t.iter_mut().enumerate() {
                    *slot = if d == Dtype::F8_E8M0 {
                        decode_e8m0(code as u8) as f32
                    } else if let Some(fmt) = format_of(d).filter(|f| f.bits() <= 8) {
                        let c = code as u32 & ((1 << fmt.bits()) - 1);
                        decode(&fmt, c) as f32
                    } else {
                        0.0
                    };
                }
                t
            })
            .collect()
    });
    &tables[dtype as usize]
}
