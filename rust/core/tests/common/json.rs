//! JSON text the differential tests feed both parsers and the reference: number literals in
//! every form, in and out of the `u64`, `i64` and `f64` ranges, some malformed.

/// Numbers as JSON text. The reference parses every value of an unknown field in full, so each
/// of these decides a verdict there (`grammar.rs`), and the random files of `differential.rs`
/// put them in such fields.
pub const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "7",
    "-7",
    "1.5",
    "-1.5e-7",
    "-2.25e-3",
    "1E+2",
    "1e-0",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "1e308",
    "1.7976931348623157e308",
    "1e309",
    "-1e309",
    "1e400",
    "1e-400",
    "-1e-400",
    "4.9e-324",
    "2.5e-324",
    // Malformed either way.
    "01",
    "1.",
    ".5",
    "+1",
    "1e",
    "-",
    "0x10",
    "NaN",
    "Infinity",
];
