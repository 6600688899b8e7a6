//! Differential tests against the reference crate (`safetensors` 0.8.0): on generated files,
//! valid and corrupted, we accept exactly what it accepts, with the same tensors, and return the
//! same error kinds, except for the documented stricter cases (duplicate keys, checked
//! arithmetic where the reference panics). Our writer's bytes equal the reference's whenever
//! there is at most one metadata key.

mod common;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use safetensors_core::{serialize, test_hooks, Dtype, ErrorKind, Header, TensorView};

// ---- a small deterministic generator -------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const NAME_PARTS: &[&str] = &[
    "w", "b", "layer.0", "attn", "é", "a\\\"q", "x\\n", "\\u00e9", "emb",
];
const WS: &[&str] = &["", "", "", " ", "\n", "\t", "\r\n ", "  "];

struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    bytes: u64,
}

fn random_shape(rng: &mut Rng, dtype: Dtype) -> Vec<u64> {
    let rank = rng.below(4) as usize;
    let mut shape: Vec<u64> = (0..rank).map(|_| rng.below(5)).collect();
    // Mostly keep sub-byte tensors whole bytes; sometimes leave them misaligned on purpose.
    let numel: u64 = shape.iter().product();
    if !(numel * dtype.bits() as u64).is_multiple_of(8) && rng.chance(85) {
        shape.push(8 / gcd(dtype.bits() as u64, 8));
        let last = shape.len() - 1;
        if !(shape.iter().product::<u64>() * dtype.bits() as u64).is_multiple_of(8) {
            shape[last] = 8;
        }
    }
    shape
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A random valid-looking file, plus whether the generator itself introduced a duplicate name.
fn random_file(rng: &mut Rng) -> Vec<u8> {
    let count = rng.below(7) as usize;
    let mut tensors = Vec::new();
    for i in 0..count {
        let dtype = *rng.pick(&Dtype::ALL);
        let shape = random_shape(rng, dtype);
        let numel: u64 = shape.iter().product();
        let bytes = numel * dtype.bits() as u64 / 8;
        let name = if rng.chance(3) && i > 0 {
            // Duplicate an earlier name now and then.
            tensors
                .get(rng.below(i as u64) as usize)
                .map(|t: &Tensor| t.name.clone())
                .unwrap()
        } else {
            format!("{}{}", rng.pick(NAME_PARTS), i)
        };
        tensors.push(Tensor {
            name,
            dtype,
            shape,
            bytes,
        });
    }
    // Lay out data in a random order; write JSON keys in another random order.
    let mut layout: Vec<usize> = (0..count).collect();
    shuffle(rng, &mut layout);
    let mut offsets = vec![(0u64, 0u64); count];
    let mut at = 0;
    for &i in &layout {
        offsets[i] = (at, at + tensors[i].bytes);
        at += tensors[i].bytes;
    }
    let mut order: Vec<usize> = (0..count).collect();
    shuffle(rng, &mut order);

    let mut json = String::new();
    let lead: &&str = rng.pick(WS);
    json.push_str(lead);
    json.push('{');
    let mut entries = Vec::new();
    if rng.chance(40) {
        let meta = match rng.below(4) {
            0 => "null".to_string(),
            1 => "{}".to_string(),
            2 => r#"{"format":"pt"}"#.to_string(),
            _ => r#"{"b":"2","a":"1","c":"\u00e9"}"#.to_string(),
        };
        entries.push(format!("\"__metadata__\":{}{meta}", rng.pick(WS)));
    }
    for &i in &order {
        let t = &tensors[i];
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        let extra = if rng.chance(15) {
            format!(",{}:{}", json_string(rng), json_value(rng, 0))
        } else {
            String::new()
        };
        let (b, e) = offsets[i];
        let entry = if rng.chance(5) {
            format!("[\"{}\",[{}],[{b},{e}]]", t.dtype, shape.join(","))
        } else {
            format!(
                "{{\"dtype\":{ws}\"{}\",\"shape\":[{}]{extra},\"data_offsets\":[{b},{ws}{e}]}}",
                t.dtype,
                shape.join(","),
                ws = rng.pick(WS)
            )
        };
        entries.push(format!("\"{}\":{}{entry}", t.name, rng.pick(WS)));
    }
    shuffle(rng, &mut entries);
    json.push_str(&entries.join(","));
    json.push('}');
    let pad = rng.below(9) as usize;
    for _ in 0..pad {
        let ws: &&str = rng.pick(&[" ", " ", "\t", "\n", "\r"]);
        json.push_str(ws);
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend((0..at).map(|i| (i * 7 % 256) as u8));
    out
}

/// Pieces of string content: plain text, every escape, surrogates paired and lone, invalid
/// escapes, and raw control characters (which JSON forbids inside strings).
const STRING_PIECES: &[&str] = &[
    "a",
    "é",
    "中",
    "\\\"",
    "\\\\",
    "\\/",
    "\\b",
    "\\f",
    "\\n",
    "\\r",
    "\\t",
    "\\u0041",
    "\\u00e9",
    "\\u0000",
    "\\ud83d\\ude00",
    "\\ud800",
    "\\udfff",
    "\\ud800\\u0041",
    "\\x41",
    "\\u12",
    "\\u12g4",
    "\\'",
    "\\U0041",
    "\u{0}",
    "\u{1}",
    "\n",
    "\t",
    "\u{1f}",
    "\u{7f}",
];

/// A random JSON string, valid or not.
fn json_string(rng: &mut Rng) -> String {
    let mut s = String::from("\"");
    for _ in 0..rng.below(4) {
        let piece: &&str = rng.pick(STRING_PIECES);
        s.push_str(piece);
    }
    s.push('"');
    s
}

/// A random JSON value for an unknown entry field, sometimes malformed, sometimes nested past
/// serde_json's 128-level limit.
fn json_value(rng: &mut Rng, depth: usize) -> String {
    match rng.below(if depth > 3 { 5 } else { 9 }) {
        0 => (*rng.pick(&["true", "false", "null", "nul", "tru"])).to_string(),
        1 | 2 => (*rng.pick(common::json::NUMBERS)).to_string(),
        3 => match rng.below(3) {
            0 => "9".repeat(300 + rng.below(200) as usize),
            1 => format!("0.{}1", "0".repeat(300 + rng.below(200) as usize)),
            _ => format!(
                "-{}e-{}",
                "1".repeat(rng.below(30) as usize + 1),
                rng.below(500)
            ),
        },
        4 => json_string(rng),
        5 | 6 => {
            let items: Vec<String> = (0..rng.below(4))
                .map(|_| json_value(rng, depth + 1))
                .collect();
            format!("[{}]", items.join(","))
        }
        7 => {
            let items: Vec<String> = (0..rng.below(4))
                .map(|_| format!("{}:{}", json_string(rng), json_value(rng, depth + 1)))
                .collect();
            format!("{{{}}}", items.join(","))
        }
        _ => {
            // Deep nesting around the limit: the root and the entry already take two levels.
            let levels = rng.pick(&[100, 124, 125, 126, 127, 200]).to_owned();
            let (open, close) = if rng.chance(50) {
                ("[", "]")
            } else {
                ("{\"k\":", "}")
            };
            format!("{}0{}", open.repeat(levels), close.repeat(levels))
        }
    }
}

fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

/// Applies one random corruption.
fn corrupt(rng: &mut Rng, mut f: Vec<u8>) -> Vec<u8> {
    let n = u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
    let header = 8..8 + n;
    match rng.below(12) {
        0 if n > 0 => {
            let i = header.start + rng.below(n as u64) as usize;
            f[i] = rng.next() as u8;
        }
        1 => f.truncate(rng.below(f.len() as u64) as usize),
        2 => f.extend((0..1 + rng.below(9)).map(|_| rng.next() as u8)),
        3 => {
            let delta = rng.below(17) as i64 - 8;
            let new = (n as i64 + delta).max(0) as u64;
            f[..8].copy_from_slice(&new.to_le_bytes());
        }
        4 => {
            let huge = *rng.pick(&[u64::MAX, u64::MAX - 7, 100_000_001, 1 << 40]);
            f[..8].copy_from_slice(&huge.to_le_bytes());
        }
        5 => f = replace_number(rng, &f, n),
        6 => {
            let to = *rng.pick(&["\"f32\"", "\"F31\"", "3", "{\"F32\":null}", "null"]);
            f = replace_text(rng, &f, n, "\"F32\"", to);
        }
        7 => {
            let to = *rng.pick(&[
                ",18446744073709551615],\"data_offsets\"",
                ",4294967296,4294967296],\"data_offsets\"",
                ",-1],\"data_offsets\"",
            ]);
            f = replace_text(rng, &f, n, "],\"data_offsets\"", to);
        }
        8 => {
            // Duplicate the first tensor entry under its own name.
            let text = String::from_utf8_lossy(&f[header.clone()]).to_string();
            if let (Some(start), Some(end)) = (text.find("\":{\"dtype\""), text.find("]}")) {
                if let Some(q) = text[..start].rfind('"') {
                    if q < start && end > start {
                        let entry = text[q..end + 2].to_string();
                        let new = text.replacen('{', &format!("{{{entry},"), 1);
                        f = rebuild(&f, n, new.as_bytes());
                    }
                }
            }
        }
        9 => {
            let to = *rng.pick(&["[99999999999,", "[0,", "[2.0,"]);
            f = replace_text(rng, &f, n, "[", to);
        }
        10 if n > 0 => {
            let at = header.start + rng.below(n as u64) as usize;
            let junk = *rng.pick(&[&b"\0"[..], b",", b"}", b"\xff", b"\"", b"[[[[", b" "]);
            let mut h = f[header.clone()].to_vec();
            h.splice(at - 8..at - 8, junk.iter().copied());
            f = rebuild(&f, n, &h);
        }
        _ => {
            // Unbalanced nesting, deep enough to hit the JSON recursion limit.
            let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
            let mut out = (deep.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(deep.as_bytes());
            f = out;
        }
    }
    f
}

/// The same file with a new header (length prefix updated, data kept).
fn rebuild(f: &[u8], n: usize, header: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(f.get(8 + n..).unwrap_or(&[]));
    out
}

fn replace_text(rng: &mut Rng, f: &[u8], n: usize, from: &str, to: &str) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(&f[8..8 + n]) else {
        return f.to_vec();
    };
    let hits: Vec<usize> = text.match_indices(from).map(|(i, _)| i).collect();
    if hits.is_empty() {
        return f.to_vec();
    }
    let at = *rng.pick(&hits);
    let new = format!("{}{}{}", &text[..at], to, &text[at + from.len()..]);
    rebuild(f, n, new.as_bytes())
}

fn replace_number(rng: &mut Rng, f: &[u8], n: usize) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(&f[8..8 + n]) else {
        return f.to_vec();
    };
    let digits: Vec<usize> = text
        .char_indices()
        .filter(|(i, c)| c.is_ascii_digit() && !text[..*i].ends_with(|p: char| p.is_ascii_digit()))
        .map(|(i, _)| i)
        .collect();
    if digits.is_empty() {
        return f.to_vec();
    }
    let at = *rng.pick(&digits);
    let end = at
        + text[at..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len() - at);
    let value: u64 = text[at..end].parse().unwrap_or(0);
    let new_value = match rng.below(5) {
        0 => value + 1,
        1 => value.saturating_sub(1),
        2 => u64::MAX - value % 16,
        3 => 0,
        _ => value * 2,
    };
    rebuild(
        f,
        n,
        format!("{}{}{}", &text[..at], new_value, &text[end..]).as_bytes(),
    )
}

// ---- comparing verdicts -------------------------------------------------------------------

thread_local! {
    static IN_REFERENCE: Cell<bool> = const { Cell::new(false) };
}

/// Silences panic output from reference calls only, so our own assertion messages still print.
fn quiet_reference_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_REFERENCE.with(Cell::get) {
                default(info);
            }
        }));
    });
}

type RefTensors = BTreeMap<String, (String, Vec<usize>, (usize, usize))>;

enum Reference {
    Accepted(usize, RefTensors, Option<BTreeMap<String, String>>),
    Rejected(ErrorKind),
    Panicked,
}

fn reference(bytes: &[u8]) -> Reference {
    use safetensors::SafeTensorError as E;
    IN_REFERENCE.with(|f| f.set(true));
    let result = catch_unwind(AssertUnwindSafe(|| {
        safetensors::SafeTensors::read_metadata(bytes)
    }));
    IN_REFERENCE.with(|f| f.set(false));
    match result {
        Err(_) => Reference::Panicked,
        Ok(Ok((n, meta))) => {
            let tensors = meta
                .tensors()
                .into_iter()
                .map(|(name, info)| {
                    (
                        name,
                        (
                            format!("{:?}", info.dtype),
                            info.shape.clone(),
                            info.data_offsets,
                        ),
                    )
                })
                .collect();
            let metadata = meta
                .metadata()
                .clone()
                .map(|m: HashMap<String, String>| m.into_iter().collect());
            Reference::Accepted(n, tensors, metadata)
        }
        Ok(Err(e)) => Reference::Rejected(match e {
            E::InvalidHeader(_) => ErrorKind::InvalidHeader,
            E::InvalidHeaderDeserialization(_) => ErrorKind::InvalidHeaderDeserialization,
            E::HeaderTooLarge => ErrorKind::HeaderTooLarge,
            E::HeaderTooSmall => ErrorKind::HeaderTooSmall,
            E::InvalidHeaderLength => ErrorKind::InvalidHeaderLength,
            E::TensorInvalidInfo => ErrorKind::TensorInvalidInfo,
            E::InvalidOffset(_) => ErrorKind::InvalidOffset,
            E::MetadataIncompleteBuffer => ErrorKind::MetadataIncompleteBuffer,
            E::ValidationOverflow => ErrorKind::ValidationOverflow,
            E::MisalignedSlice => ErrorKind::MisalignedSlice,
            other => panic!("unexpected reference error {other:?}"),
        }),
    }
}

/// Independent check that a header has a repeated top-level or metadata key.
fn has_duplicate_keys(bytes: &[u8]) -> bool {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let Ok(value) = serde_json::from_slice::<KeyLists>(&bytes[8..8 + n]) else {
        return false;
    };
    let dup = |keys: &[String]| {
        let mut k = keys.to_vec();
        k.sort();
        k.windows(2).any(|w| w[0] == w[1])
    };
    dup(&value.top) || value.meta.iter().any(|m| dup(m))
}

/// Top-level keys and each `__metadata__` object's keys, in order, repeats kept.
struct KeyLists {
    top: Vec<String>,
    meta: Vec<Vec<String>>,
}

impl<'de> serde::Deserialize<'de> for KeyLists {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = KeyLists;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<KeyLists, A::Error> {
                let mut out = KeyLists {
                    top: vec![],
                    meta: vec![],
                };
                while let Some(k) = m.next_key::<String>()? {
                    if k == "__metadata__" {
                        let keys: Option<KeysOnly> = m.next_value()?;
                        out.meta.push(keys.map(|k| k.0).unwrap_or_default());
                    } else {
                        m.next_value::<serde::de::IgnoredAny>()?;
                    }
                    out.top.push(k);
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

struct KeysOnly(Vec<String>);

impl<'de> serde::Deserialize<'de> for KeysOnly {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = KeysOnly;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<KeysOnly, A::Error> {
                let mut keys = vec![];
                while let Some((k, _)) = m.next_entry::<String, serde::de::IgnoredAny>()? {
                    keys.push(k);
                }
                Ok(KeysOnly(keys))
            }
        }
        d.deserialize_map(V)
    }
}

/// Whether two tensors share `(begin, end)`: the reference then walks them in hash order, so
/// which of them an error names, and hence sometimes the error kind, is not deterministic.
fn has_tied_offsets(bytes: &[u8]) -> bool {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let text = String::from_utf8_lossy(&bytes[8..8 + n.min(bytes.len() - 8)]);
    let mut pairs: Vec<&str> = text
        .match_indices("\"data_offsets\":[")
        .map(|(i, _)| {
            let rest = &text[i + 16..];
            &rest[..rest.find(']').unwrap_or(rest.len())]
        })
        .collect();
    pairs.iter_mut().for_each(|p| *p = p.trim());
    let mut normalized: Vec<String> = pairs
        .iter()
        .map(|p| p.replace([' ', '\n', '\t', '\r'], ""))
        .collect();
    normalized.sort();
    normalized.windows(2).any(|w| w[0] == w[1]) || text.contains("[[")
}

#[derive(Default, Debug)]
struct Tally {
    accepted: usize,
    canonical: usize,
    rejected: BTreeMap<&'static str, usize>,
    stricter_duplicates: usize,
    reference_panics: usize,
    tie_differences: usize,
}

type Summary = (
    usize,
    Vec<(String, Dtype, Vec<usize>, (usize, usize))>,
    Option<BTreeMap<String, String>>,
);

fn summary(h: &Header) -> Summary {
    let tensors = h
        .iter()
        .map(|t| (t.name.to_owned(), t.dtype, t.shape.to_vec(), t.data_offsets))
        .collect();
    (h.header_len(), tensors, h.metadata().cloned())
}

fn same_verdict(
    a: &safetensors_core::Result<Header>,
    b: &safetensors_core::Result<Header>,
) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => summary(a) == summary(b),
        (Err(a), Err(b)) => a.kind() == b.kind(),
        _ => false,
    }
}

/// Our two JSON paths must agree with each other on every input.
fn check_paths(bytes: &[u8], ours: &safetensors_core::Result<Header>, tally: &mut Tally) {
    let show = || String::from_utf8_lossy(&bytes[..bytes.len().min(600)]).to_string();
    let general = test_hooks::parse_general_only(bytes);
    assert!(
        same_verdict(ours, &general),
        "paths disagree: {ours:?} vs {general:?}: {}",
        show()
    );
    if let Some(fast) = test_hooks::parse_canonical_only(bytes) {
        tally.canonical += 1;
        assert!(
            same_verdict(&fast, &general),
            "canonical {fast:?} vs general {general:?}: {}",
            show()
        );
    }
}

fn check(bytes: &[u8], tally: &mut Tally) {
    let ours = Header::parse(bytes);
    check_paths(bytes, &ours, tally);
    let theirs = reference(bytes);
    let show = || String::from_utf8_lossy(&bytes[..bytes.len().min(600)]).to_string();
    match (ours, theirs) {
        (Ok(h), Reference::Accepted(n, tensors, meta)) => {
            tally.accepted += 1;
            assert_eq!(h.header_len(), n, "{}", show());
            let ours: RefTensors = h
                .iter()
                .map(|t| {
                    (
                        t.name.to_owned(),
                        (t.dtype.to_string(), t.shape.to_vec(), t.data_offsets),
                    )
                })
                .collect();
            assert_eq!(ours, tensors, "{}", show());
            assert_eq!(h.metadata().cloned(), meta, "{}", show());
        }
        (Err(e), Reference::Accepted(..)) => {
            assert_eq!(
                e.kind(),
                ErrorKind::DuplicateKey,
                "we reject, reference accepts: {e}\n{}",
                show()
            );
            assert!(
                has_duplicate_keys(bytes),
                "DuplicateKey without a duplicate: {}",
                show()
            );
            tally.stricter_duplicates += 1;
        }
        (Ok(_), Reference::Rejected(k)) => panic!("we accept, reference says {k}: {}", show()),
        (Ok(_), Reference::Panicked) => {
            panic!("we accept what makes the reference panic: {}", show())
        }
        (Err(_), Reference::Panicked) => tally.reference_panics += 1,
        (Err(e), Reference::Rejected(k)) => {
            *tally.rejected.entry(e.kind().name()).or_default() += 1;
            if e.kind() == k {
                return;
            }
            if e.kind() == ErrorKind::DuplicateKey && has_duplicate_keys(bytes) {
                tally.stricter_duplicates += 1;
                return;
            }
            assert!(
                has_tied_offsets(bytes),
                "we say {} ({e}), reference says {k}: {}",
                e.kind(),
                show()
            );
            tally.tie_differences += 1;
        }
    }
}

#[test]
fn accepts_and_rejects_exactly_what_the_reference_does() {
    quiet_reference_panics();
    let mut rng = Rng(0x5AFE_7E45);
    let mut tally = Tally::default();
    for i in 0..30_000 {
        let file = random_file(&mut rng);
        let file = if i % 3 == 0 {
            file
        } else {
            corrupt(&mut rng, file)
        };
        check(&file, &mut tally);
    }
    println!("{tally:#?}");
    // The generator must exercise both verdicts and most error kinds, or this test proves little.
    assert!(tally.accepted > 5_000, "{tally:?}");
    assert!(
        tally.canonical > 5_000,
        "the canonical scanner is rarely exercised: {tally:?}"
    );
    assert!(tally.stricter_duplicates > 50, "{tally:?}");
    for kind in [
        "HeaderTooSmall",
        "HeaderTooLarge",
        "InvalidHeaderLength",
        "InvalidHeader",
        "InvalidHeaderDeserialization",
        "InvalidOffset",
        "ValidationOverflow",
        "MisalignedSlice",
        "TensorInvalidInfo",
        "MetadataIncompleteBuffer",
    ] {
        assert!(
            tally.rejected.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never produced: {tally:?}"
        );
    }
}

#[test]
fn accepts_every_byte_prefix_exactly_like_the_reference() {
    // Truncation at every byte of a small file covers every region boundary.
    quiet_reference_panics();
    let mut tally = Tally::default();
    let d = [7u8; 24];
    let meta: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let file = serialize(
        [
            ("a", TensorView::new(Dtype::F32, &[2, 2], &d[..16])),
            ("b", TensorView::new(Dtype::F4, &[4], &d[16..18])),
            ("c", TensorView::new(Dtype::U8, &[0], &[])),
            ("d", TensorView::new(Dtype::I16, &[3], &d[18..24])),
        ],
        Some(&meta),
    )
    .unwrap();
    for len in 0..=file.len() + 3 {
        let mut f = file.clone();
        f.resize(len, 0);
        check(&f, &mut tally);
    }
    assert_eq!(tally.accepted, 1);
}

// ---- writer: byte-identical output --------------------------------------------------------

fn reference_dtype(d: Dtype) -> safetensors::Dtype {
    serde_json::from_str(&format!("\"{d}\"")).unwrap()
}

#[test]
fn serializes_byte_identically_to_the_reference() {
    let mut rng = Rng(0x000B_17E5);
    let mut compared = 0;
    for _ in 0..3_000 {
        let count = rng.below(8) as usize;
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        let mut dtypes = Vec::new();
        for i in 0..count {
            let dtype = *rng.pick(&Dtype::ALL);
            let mut shape: Vec<usize> = random_shape(&mut rng, dtype)
                .into_iter()
                .map(|d| d as usize)
                .collect();
            if dtype.byte_size(shape.iter().product()).is_none() {
                shape = vec![8];
            }
            let mut name = String::new();
            let _ = write!(
                name,
                "{}{}",
                ["w", "é", "a\"b", "x\ny", "\u{1}", "/"][i % 6],
                rng.below(1000)
            );
            if names.contains(&name) {
                continue;
            }
            names.push(name);
            shapes.push(shape);
            dtypes.push(dtype);
        }
        let datas: Vec<Vec<u8>> = shapes
            .iter()
            .zip(&dtypes)
            .map(|(s, d)| {
                (0..d.byte_size(s.iter().product()).unwrap())
                    .map(|_| rng.next() as u8)
                    .collect()
            })
            .collect();
        let meta: Option<BTreeMap<String, String>> = match rng.below(3) {
            0 => None,
            1 if count > 0 => Some(BTreeMap::new()),
            _ => Some([("k\u{e9}\"".to_string(), "v\n".to_string())].into()),
        };
        let ours = serialize(
            names
                .iter()
                .zip(&shapes)
                .zip(&dtypes)
                .zip(&datas)
                .map(|(((n, s), d), data)| (n.as_str(), TensorView::new(*d, s, data))),
            meta.as_ref(),
        )
        .unwrap();
        let views: Vec<(String, safetensors::tensor::TensorView)> = names
            .iter()
            .zip(&shapes)
            .zip(&dtypes)
            .zip(&datas)
            .map(|(((n, s), d), data)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(reference_dtype(*d), s.clone(), data)
                        .unwrap(),
                )
            })
            .collect();
        let theirs = safetensors::serialize(views, meta.map(|m| m.into_iter().collect())).unwrap();
        assert_eq!(ours, theirs, "names {names:?}");
        compared += 1;
    }
    assert!(compared > 2_500);
}

#[test]
fn writes_valid_json_where_the_reference_does_not() {
    // No tensors and an empty metadata map: the reference emits invalid JSON; we write `{}`.
    let ours = serialize(Vec::<(&str, TensorView)>::new(), Some(&BTreeMap::new())).unwrap();
    assert_eq!(&ours[8..], b"{}      ");
    assert_eq!(u64::from_le_bytes(ours[..8].try_into().unwrap()), 8);
    let theirs = safetensors::serialize(
        Vec::<(String, safetensors::tensor::TensorView)>::new(),
        Some(HashMap::new()),
    )
    .unwrap();
    assert!(safetensors::SafeTensors::deserialize(&theirs).is_err());
    assert!(Header::parse(&ours).unwrap().is_empty());
}

#[test]
fn rejects_end_offsets_near_2_64_where_the_reference_panics_or_wraps() {
    // Eight U8 tensors of 2^61 - 1 bytes end at 2^64 - 8; `end + 8 + N` then overflows, which
    // panics the reference where overflow checks are on (debug builds) and wraps where they are
    // off (release). Which one happens depends on the profile the tests run in, so either is
    // accepted from the reference; it must never accept the file. We report the size mismatch.
    quiet_reference_panics();
    let size = (1u64 << 61) - 1;
    let entries: Vec<String> = (0..8u64)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"U8","shape":[{size}],"data_offsets":[{},{}]}}"#,
                i * size,
                (i + 1) * size
            )
        })
        .collect();
    let json = format!("{{{}}}", entries.join(","));
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    match reference(&file) {
        Reference::Panicked | Reference::Rejected(_) => {}
        Reference::Accepted(..) => panic!("the reference accepts a file whose size wraps"),
    }
    let mut tally = Tally::default();
    check_paths(&file, &Header::parse(&file), &mut tally);
    let err = Header::parse(&file).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MetadataIncompleteBuffer, "{err}");
    assert!(
        err.to_string().contains(&(u64::MAX).to_string()),
        "the expected length saturates instead of wrapping: {err}"
    );
}
