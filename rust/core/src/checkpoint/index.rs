//! Reading a checkpoint index (`model.safetensors.index.json`): `{"metadata": {...},
//! "weight_map": {"tensor": "shard", ...}}`, with repeated tensor names and metadata keys kept so
//! that they can be refused, and metadata values that are not strings kept as their exact JSON
//! text.
//!
//! Read with the care a header gets, since an index of a mixture-of-experts model lists some
//! 90,000 tensors (8.6 MB): [`fast_index`] reads the index in one pass, the weight map's
//! `"name": "shard"` pairs borrowed from the text (no allocation per entry), the metadata and
//! any other member through serde_json, one value each. Anything it does not expect (an escape
//! or a control character in a weight map string, a value that is not a string, a repeated
//! member, text after the object) sends the whole index to serde's reading instead, which
//! gives the same pairs, or the error it always gave.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::{Error, Result};

/// Index files are small (a name and a file name per tensor); refuse absurd ones before reading.
pub const MAX_INDEX_SIZE: u64 = 256 * 1024 * 1024;

/// A (tensor, shard) pair of the weight map, borrowed from the index's text where it can be.
pub(super) type Pair<'a> = (Cow<'a, str>, Cow<'a, str>);

/// The index's metadata (repeated keys refused) and its weight map as (tensor, shard) pairs in
/// the file's order, repeats kept for the caller to refuse.
#[allow(clippy::type_complexity)]
pub(super) fn parse_index(
    text: &[u8],
) -> Result<(Option<BTreeMap<String, String>>, Vec<Pair<'_>>)> {
    let (metadata, weight_map) = match fast_index(text) {
        Some(parsed) => parsed,
        None => serde_index(text)?,
    };
    let metadata = metadata.map(unique_metadata).transpose()?;
    Ok((metadata, weight_map))
}

/// The index's metadata pairs and weight map.
type Parsed<'a> = (Option<Vec<(String, String)>>, Vec<Pair<'a>>);

/// The index read by serde_json alone: every text, and every error's wording.
fn serde_index(text: &[u8]) -> Result<Parsed<'_>> {
    let invalid = |e: serde_json::Error| Error::InvalidIndex {
        reason: e.to_string(),
    };
    let index: IndexFile<'_> = serde_json::from_slice(text).map_err(invalid)?;
    let raw = index.weight_map.ok_or_else(|| Error::InvalidIndex {
        reason: "no `weight_map` object".into(),
    })?;
    let weight_map = serde_json::from_str::<Pairs<'_>>(raw.get())
        .map_err(invalid)?
        .0;
    Ok((index.metadata, weight_map))
}

/// The index in one pass (see the module comment), or `None` for serde to read it.
fn fast_index(text: &[u8]) -> Option<Parsed<'_>> {
    let text = std::str::from_utf8(text).ok()?;
    let b = text.as_bytes();
    let mut at = skip_ws(b, 0);
    if b.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_ws(b, at + 1);
    let (mut metadata, mut seen_metadata, mut weight_map) = (None, false, None);
    loop {
        let (key, next) = plain_string(text, at)?;
        at = skip_ws(b, next);
        if b.get(at) != Some(&b':') {
            return None;
        }
        at = skip_ws(b, at + 1);
        match key {
            "weight_map" if weight_map.is_none() => {
                let (pairs, next) = scan_pairs(text, at)?;
                weight_map = Some(pairs);
                at = next;
            }
            "metadata" if !seen_metadata => {
                seen_metadata = true;
                let (value, used) = one_value::<Option<MetadataPairs>>(&text[at..])?;
                metadata = value.map(|m| m.0);
                at += used;
            }
            "weight_map" | "metadata" => return None,
            _ => at += one_value::<IgnoredAny>(&text[at..])?.1,
        }
        at = skip_ws(b, at);
        match b.get(at) {
            Some(b',') => at = skip_ws(b, at + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    if skip_ws(b, at + 1) != b.len() {
        return None;
    }
    Some((metadata, weight_map?))
}

/// One JSON value at the start of `text`, read by serde_json, and the bytes it took.
fn one_value<'a, T: serde::Deserialize<'a>>(text: &'a str) -> Option<(T, usize)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, values.byte_offset()))
}

/// The pairs of the JSON object at `at` whose values are all strings without escapes: each
/// name and value borrowed, in the text's order, and the position after the object. `None` at
/// anything else: serde reads those.
fn scan_pairs(text: &str, at: usize) -> Option<(Vec<Pair<'_>>, usize)> {
    let b = text.as_bytes();
    let mut at = at;
    if b.get(at) != Some(&b'{') {
        return None;
    }
    // Index entries run ~100 bytes; a reservation that rarely grows and never balloons.
    let mut out = Vec::with_capacity((b.len() - at) / 64);
    at = skip_ws(b, at + 1);
    if b.get(at) == Some(&b'}') {
        return Some((out, at + 1));
    }
    loop {
        let (name, next) = plain_string(text, at)?;
        at = skip_ws(b, next);
        if b.get(at) != Some(&b':') {
            return None;
        }
        let (shard, next) = plain_string(text, skip_ws(b, at + 1))?;
        out.push((Cow::Borrowed(name), Cow::Borrowed(shard)));
        at = skip_ws(b, next);
        match b.get(at) {
            Some(b',') => at = skip_ws(b, at + 1),
            Some(b'}') => return Some((out, at + 1)),
            _ => return None,
        }
    }
}

/// The position of the first `"`, `\\` or control character in `b`: eight bytes at a time (a
/// byte loop was an eighth of opening a 90,000-tensor checkpoint).
fn special(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte of `x` that is zero (exact for the lowest such byte, which is
    // the one wanted: a borrow only runs upward).
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut chunks = b.chunks_exact(8);
    let mut at = 0;
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or_default());
        let hits = zero(w ^ (ONES * u64::from(b'"')))
            | zero(w ^ (ONES * u64::from(b'\\')))
            // Bytes below 0x20: their high three bits are zero.
            | zero(w & (ONES * 0xe0));
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|i| at + i)
}

fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while matches!(b.get(at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        at += 1;
    }
    at
}

/// The string starting at `at` (its opening quote) when it holds no escape and no control
/// character (which JSON forbids in a string), and the position after its closing quote.
fn plain_string(text: &str, at: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let end = start + special(&b[start..])?;
    if b[end] != b'"' {
        return None;
    }
    // Quotes are ASCII, so both ends are character boundaries.
    Some((text.get(start..end)?, end + 1))
}

/// The index's metadata as a map, refusing a repeated key (readers disagree on which copy wins).
fn unique_metadata(pairs: Vec<(String, String)>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (key, value) in pairs {
        if out.contains_key(&key) {
            return Err(Error::DuplicateKey {
                key,
                in_metadata: true,
            });
        }
        out.insert(key, value);
    }
    Ok(out)
}

/// The parts of an index file we use: the metadata's pairs (repeats kept so they can be
/// refused), and the weight map's validated text.
struct IndexFile<'a> {
    metadata: Option<Vec<(String, String)>>,
    weight_map: Option<&'a RawValue>,
}

impl<'de> serde::Deserialize<'de> for IndexFile<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(IndexVisitor)
    }
}

struct IndexVisitor;

impl<'de> Visitor<'de> for IndexVisitor {
    type Value = IndexFile<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with `weight_map`")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<IndexFile<'de>, A::Error> {
        let mut out = IndexFile {
            metadata: None,
            weight_map: None,
        };
        let mut seen_metadata = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" if seen_metadata => return Err(de::Error::duplicate_field("metadata")),
                "metadata" => {
                    // `null` is no metadata, as a file's `"__metadata__": null` is.
                    seen_metadata = true;
                    let raw: Option<MetadataPairs> = map.next_value()?;
                    out.metadata = raw.map(|m| m.0);
                }
                "weight_map" if out.weight_map.is_some() => {
                    return Err(de::Error::duplicate_field("weight_map"))
                }
                "weight_map" => out.weight_map = Some(map.next_value::<&'de RawValue>()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// The index's `metadata` object as pairs, repeats kept: strings as their value, anything else
/// as its exact JSON text (`1e3` stays `1e3`, not `1000.0`).
struct MetadataPairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for MetadataPairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MetadataPairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a `metadata` object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<MetadataPairs, A::Error> {
                let mut out = Vec::new();
                while let Some((key, raw)) = map.next_entry::<String, Box<RawValue>>()? {
                    let text = raw.get();
                    let value = if text.starts_with('"') {
                        serde_json::from_str::<String>(text).map_err(de::Error::custom)?
                    } else {
                        text.to_owned()
                    };
                    out.push((key, value));
                }
                Ok(MetadataPairs(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A JSON object of strings as a list of pairs, repeats kept (so they can be refused), each
/// string borrowed where it holds no escape.
struct Pairs<'a>(Vec<Pair<'a>>);

impl<'de> serde::Deserialize<'de> for Pairs<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Pairs<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some((name, shard)) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    out.push((name.0, shard.0));
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A JSON string, borrowed from the text when it holds no escape.
struct Text<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                v: &'de str,
            ) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scanned_weight_map_is_what_serde_reads() {
        for text in [
            r#"{"weight_map": {"a": "s1.safetensors", "b":"s2.safetensors" ,"c" : "s1.safetensors"}}"#,
            "{\"weight_map\":\n {\n  \"a\": \"x\",\n  \"a\": \"y\"\n }\n}",
            r#"{"weight_map": {}}"#,
            r#"{"metadata": {"total_size": 10}, "weight_map": {"\u0061": "s\"1", "b": "s"}}"#,
            r#"{"weight_map": {"é": "ü.safetensors"}}"#,
        ] {
            let (_, fast) = parse_index(text.as_bytes()).unwrap();
            let (_, slow) = serde_index(text.as_bytes()).unwrap();
            assert_eq!(fast, slow, "{text}");
        }
        // The one pass reads the common form, and gives what serde gives.
        let text = br#"{"metadata": {"total_size": 1e3, "x": "y"}, "extra": [1, {"a": null}], "weight_map": {"b": "s1", "a": "s2"}}"#;
        let fast = fast_index(text).expect("read in one pass");
        assert_eq!(fast, serde_index(text).unwrap());
        // What it leaves to serde: repeats, trailing text, escapes, other values.
        for text in [
            r#"{"weight_map": {"a": "s"}, "weight_map": {}}"#,
            r#"{"metadata": null, "metadata": null, "weight_map": {}}"#,
            r#"{"weight_map": {"a": "s"}} x"#,
            r#"{"weight_map": {"a\u0062": "s"}}"#,
            r#"{"weight_map": {"a": 1}}"#,
            "{\"weight_map\": {\"a\tb\": \"s\"}}",
            r#"{"metadata": {}}"#,
        ] {
            assert!(fast_index(text.as_bytes()).is_none(), "{text}");
        }
        // The word-wise search finds the first special byte wherever it is.
        for len in 0..40 {
            for at in 0..len {
                for c in [b'"', b'\\', 0x00, 0x1f] {
                    let mut v = vec![b'a'; len];
                    v[at] = c;
                    if at + 1 < len {
                        v[len - 1] = b'"';
                    }
                    assert_eq!(special(&v), Some(at), "{v:?}");
                }
            }
            assert_eq!(special(&vec![0xffu8; len]), None);
            assert_eq!(special(&vec![0x20u8; len]), None);
        }
        // A value that is not a string is serde's error, as before.
        let e = parse_index(br#"{"weight_map": {"a": 1}}"#).unwrap_err();
        assert!(e.to_string().contains("expected a string"), "{e}");
        // Escapes are read by serde: the pair's strings unescaped.
        let (_, pairs) = parse_index(br#"{"weight_map": {"\u0061\n": "s\"1"}}"#).unwrap();
        assert_eq!(pairs, [(Cow::from("a\n"), Cow::from("s\"1"))]);
    }
}
