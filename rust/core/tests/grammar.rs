//! The JSON grammar inside unknown fields of a tensor entry, checked against the reference crate
//! (`safetensors` 0.8.0) as the oracle.
//!
//! The reference reads the header through a `#[serde(flatten)]` map, so every value, including
//! the ones it then ignores, is first parsed in full by `serde_json`: numbers must be in `f64`
//! range, strings must decode (no lone surrogates, no raw control characters, no invalid
//! escapes), and nesting is limited to 128 levels. A skip that merely scans the text accepts
//! more. These cases pin each difference, in both of our parse paths.

mod common;

use common::raw_file;
use safetensors_core::{test_hooks, ErrorKind, Header};

/// A one-tensor file whose entry carries `"extra": <value>` (raw JSON text).
fn with_unknown_field(value: &str) -> Vec<u8> {
    raw_file(
        &format!(r#"{{"t":{{"dtype":"U8","shape":[2],"extra":{value},"data_offsets":[0,2]}}}}"#),
        2,
    )
}

/// Our verdict (both paths) must be the reference's, with the same kind when both refuse.
fn assert_same_verdict(file: &[u8], what: &str) {
    let theirs = safetensors::SafeTensors::deserialize(file);
    for (path, ours) in [
        ("default", Header::parse(file)),
        ("general", test_hooks::parse_general_only(file)),
    ] {
        match (&ours, &theirs) {
            (Ok(_), Ok(_)) => {}
            (Err(e), Err(safetensors::SafeTensorError::InvalidHeaderDeserialization(_))) => {
                assert_eq!(
                    e.kind(),
                    ErrorKind::InvalidHeaderDeserialization,
                    "{path} path, {what}: {e}"
                );
            }
            (Ok(_), Err(r)) => panic!("{path} path accepts {what}; the reference says {r:?}"),
            (Err(e), Ok(_)) => panic!("{path} path refuses {what} ({e}); the reference accepts"),
            (Err(e), Err(r)) => panic!("{path} path, {what}: we say {e}, the reference {r:?}"),
        }
    }
}

/// Values nested `depth` arrays/objects deep, alternating.
fn nested(depth: usize) -> String {
    let mut s = String::from("0");
    for i in 0..depth {
        s = if i % 2 == 0 {
            format!("[{s}]")
        } else {
            format!("{{\"k\":{s}}}")
        };
    }
    s
}

#[test]
fn unknown_field_numbers_follow_the_reference() {
    // Digits only an f64 can hold, and too many even for that.
    let long = [
        "9".repeat(300),
        "9".repeat(400),
        format!("0.{}1", "0".repeat(400)),
        format!("1{}e-400", "0".repeat(100)),
    ];
    let cases = common::json::NUMBERS
        .iter()
        .copied()
        .chain(long.iter().map(String::as_str));
    for value in cases {
        assert_same_verdict(&with_unknown_field(value), &format!("number {value:.40}"));
    }
}

#[test]
fn unknown_field_strings_follow_the_reference() {
    let cases = [
        r#""plain""#,
        r#""\" \\ \/ \b \f \n \r \t""#,
        r#""\u00e9\u4e2d""#,
        r#""\ud83d\ude00""#,
        // Lone or misordered surrogates.
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800x""#,
        r#""\ud800\u0041""#,
        r#""\ude00\ud83d""#,
        // Invalid escapes.
        r#""\x41""#,
        r#""\u12""#,
        r#""\u12g4""#,
        r#""\'""#,
        r#""\U0041""#,
        "\"\\\"",
        // Raw control characters and DEL.
        "\"a\u{1}b\"",
        "\"a\nb\"",
        "\"a\tb\"",
        "\"\u{1f}\"",
        "\"\u{7f}\"",
    ];
    for value in cases {
        assert_same_verdict(&with_unknown_field(value), &format!("string {value:?}"));
        // The same strings as keys and elements deeper inside the unknown value.
        assert_same_verdict(
            &with_unknown_field(&format!("{{{value}:[{value}]}}")),
            &format!("nested string {value:?}"),
        );
    }
}

#[test]
fn unknown_field_nesting_is_limited_like_the_reference() {
    // serde_json refuses a 128th open level; the root object and the entry take two, so the
    // unknown value may nest 125 deep. The boundary is checked on both sides, for arrays and
    // objects.
    for depth in [1, 64, 124, 125, 126, 127, 128, 129, 200, 5000] {
        assert_same_verdict(
            &with_unknown_field(&nested(depth)),
            &format!("depth {depth}"),
        );
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_same_verdict(&with_unknown_field(&arrays), &format!("{depth} arrays"));
        let objects = format!("{}0{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        assert_same_verdict(&with_unknown_field(&objects), &format!("{depth} objects"));
    }
}

#[test]
fn unknown_field_literals_and_structure_follow_the_reference() {
    let cases = [
        "true",
        "false",
        "null",
        "[]",
        "{}",
        "[1,[2,{\"a\":null}]]",
        "{\"a\":1,\"a\":2}",
        "tru",
        "nul",
        "[1,]",
        "{\"a\":1,}",
        "{1:2}",
        "[1 2]",
        "{\"a\" 1}",
        "{\"a\":}",
    ];
    for value in cases {
        assert_same_verdict(&with_unknown_field(value), &format!("value {value}"));
    }
}

#[test]
fn refuses_what_the_reference_refuses_in_unknown_fields() {
    // The findings of the review, pinned by verdict as well as by agreement.
    for value in [
        "1e400",
        r#""\ud800""#,
        &format!("{}{}", "[".repeat(126), "]".repeat(126)),
    ] {
        let file = with_unknown_field(value);
        assert_eq!(
            Header::parse(&file).unwrap_err().kind(),
            ErrorKind::InvalidHeaderDeserialization,
            "{value:.40}"
        );
    }
    // Just inside the limit, and values the reference takes, are still accepted.
    for value in [
        "1e-400",
        r#""\ud83d\ude00""#,
        &format!("{}{}", "[".repeat(125), "]".repeat(125)),
    ] {
        Header::parse(&with_unknown_field(value)).unwrap();
    }
}
