//! Element types, spelled exactly as in safetensors headers.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
///
/// Declared in the reference's enum order, which is also its alignment order: the writer sorts
/// tensors by this order, descending, so that large elements come first and stay aligned.
/// Variant names are the header spellings, hence not camel case.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// Boolean, one byte per element.
    BOOL = 0,
    /// 4-bit float (MXFP4), two elements per byte.
    F4,
    /// 6-bit float, 2-bit exponent and 3-bit mantissa (MXFP6).
    F6_E2M3,
    /// 6-bit float, 3-bit exponent and 2-bit mantissa (MXFP6).
    F6_E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// 8-bit float, 5-bit exponent, 2-bit mantissa.
    F8_E5M2,
    /// 8-bit float, 4-bit exponent, 3-bit mantissa.
    F8_E4M3,
    /// 8-bit power-of-two scale (MX block scale).
    F8_E8M0,
    /// 8-bit float E4M3, finite with unsigned zero.
    F8_E4M3FNUZ,
    /// 8-bit float E5M2, finite with unsigned zero.
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// Complex number made of two `F32` (real, imaginary).
    C64,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// Every dtype, in enum order.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Every header spelling, in enum order.
    pub const NAMES: [&'static str; 22] = [
        "BOOL",
        "F4",
        "F6_E2M3",
        "F6_E3M2",
        "U8",
        "I8",
        "F8_E5M2",
        "F8_E4M3",
        "F8_E8M0",
        "F8_E4M3FNUZ",
        "F8_E5M2FNUZ",
        "I16",
        "U16",
        "F16",
        "BF16",
        "I32",
        "U32",
        "F32",
        "C64",
        "F64",
        "I64",
        "U64",
    ];

    /// Bytes in the longest header spelling (`F8_E4M3FNUZ`).
    pub const LONGEST_NAME: usize = {
        let (mut i, mut most) = (0, 0);
        while i < Self::NAMES.len() {
            if Self::NAMES[i].len() > most {
                most = Self::NAMES[i].len();
            }
            i += 1;
        }
        most
    };

    /// Size of one element in bits (4 and 6 for the sub-byte float types).
    pub const fn bits(self) -> usize {
        match self {
            Dtype::F4 => 4,
            Dtype::F6_E2M3 | Dtype::F6_E3M2 => 6,
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8_E5M2
            | Dtype::F8_E4M3
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E5M2FNUZ => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }

    /// The exact header spelling, e.g. `"F32"`.
    pub const fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Parses an exact header spelling; `"f32"` is not `F32`.
    pub fn from_name(name: &str) -> Option<Dtype> {
        let found = Self::NAMES.iter().position(|&n| n == name)?;
        Some(Self::ALL[found])
    }

    /// The dtype with enum position `index` (the value of `dtype as u8`).
    pub fn from_index(index: u8) -> Option<Dtype> {
        Self::ALL.get(usize::from(index)).copied()
    }

    /// The dtype whose value is `value` as a binding passes it, in whatever integer width (C's
    /// `int32_t`, C++'s `uint8_t`): `None` for a value that names no dtype, never one wrapped
    /// into range (300 is not `300 % 256`).
    pub fn from_value(value: impl Into<i64>) -> Option<Dtype> {
        u8::try_from(value.into()).ok().and_then(Dtype::from_index)
    }

    /// Number of bytes taken by `numel` elements, or `None` when the count of bits overflows
    /// or does not end on a byte boundary.
    pub fn byte_size(self, numel: usize) -> Option<usize> {
        let bits = numel.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error returned when a string is not one of the 22 header spellings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDtype(pub String);

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown dtype `{}` (expected one of: {})",
            self.0,
            Dtype::NAMES.join(", ")
        )
    }
}

impl std::error::Error for UnknownDtype {}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::from_name(s).ok_or_else(|| UnknownDtype(s.to_owned()))
    }
}

/// Deserializes like a serde unit-variant enum, which is what the reference uses: the usual
/// form is a string (`"F32"`), and serde also accepts the externally tagged form `{"F32": null}`.
/// The reference reads both, so we do too.
impl<'de> serde::Deserialize<'de> for Dtype {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_enum("Dtype", &Dtype::NAMES, DtypeVisitor)
    }
}

struct DtypeVisitor;

impl<'de> serde::de::Visitor<'de> for DtypeVisitor {
    type Value = Dtype;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a dtype name such as \"F32\"")
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Dtype, A::Error> {
        use serde::de::VariantAccess;
        let (dtype, variant) = data.variant::<DtypeName>()?;
        variant.unit_variant()?;
        Ok(dtype.0)
    }
}

/// A variant identifier: the dtype name itself.
struct DtypeName(Dtype);

impl<'de> serde::Deserialize<'de> for DtypeName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(DtypeNameVisitor)
    }
}

struct DtypeNameVisitor;

impl<'de> serde::de::Visitor<'de> for DtypeNameVisitor {
    type Value = DtypeName;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a dtype name")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DtypeName, E> {
        Dtype::from_name(v)
            .map(DtypeName)
            .ok_or_else(|| E::unknown_variant(v, &Dtype::NAMES))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DtypeName, E> {
        // serde's derived identifiers also take the variant index; JSON never produces one here,
        // but keep the same behaviour for any other deserializer.
        u8::try_from(v)
            .ok()
            .and_then(Dtype::from_index)
            .map(DtypeName)
            .ok_or_else(|| {
                E::invalid_value(
                    serde::de::Unexpected::Unsigned(v),
                    &"variant index 0 <= i < 22",
                )
            })
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<DtypeName, E> {
        match std::str::from_utf8(v) {
            Ok(s) => self.visit_str(s),
            Err(_) => Err(E::unknown_variant(
                &String::from_utf8_lossy(v),
                &Dtype::NAMES,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_for_all_22() {
        assert_eq!(Dtype::ALL.len(), 22);
        for (i, d) in Dtype::ALL.iter().enumerate() {
            assert_eq!(*d as usize, i);
            assert_eq!(Dtype::from_name(d.name()), Some(*d));
            assert_eq!(d.to_string().parse::<Dtype>(), Ok(*d));
            assert_eq!(Dtype::from_index(i as u8), Some(*d));
        }
        assert_eq!(Dtype::from_index(22), None);
    }

    #[test]
    fn values_of_any_width_name_a_dtype_only_in_range() {
        assert_eq!(Dtype::from_value(17i32), Some(Dtype::F32));
        assert_eq!(Dtype::from_value(21u8), Some(Dtype::U64));
        for value in [22i64, -1, 256 + 17, i64::from(i32::MIN), i64::MAX] {
            assert_eq!(Dtype::from_value(value), None, "{value}");
        }
    }

    #[test]
    fn spelling_is_case_sensitive() {
        assert!("f32".parse::<Dtype>().is_err());
        assert!("F32 ".parse::<Dtype>().is_err());
        assert!("".parse::<Dtype>().is_err());
    }

    #[test]
    fn bit_sizes_match_the_format() {
        let expect = [
            8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64,
        ];
        for (d, bits) in Dtype::ALL.iter().zip(expect) {
            assert_eq!(d.bits(), bits, "{d}");
        }
    }

    #[test]
    fn byte_size_rejects_partial_bytes_and_overflow() {
        assert_eq!(Dtype::F4.byte_size(3), None);
        assert_eq!(Dtype::F4.byte_size(4), Some(2));
        assert_eq!(Dtype::F6_E2M3.byte_size(4), Some(3));
        assert_eq!(Dtype::F6_E2M3.byte_size(2), None);
        assert_eq!(Dtype::F32.byte_size(usize::MAX / 2), None);
        assert_eq!(Dtype::BOOL.byte_size(0), Some(0));
    }
}
