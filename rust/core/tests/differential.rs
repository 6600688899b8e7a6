//! Differential tests against the reference crate (`safetensors` 0.8.0): on generated files,
//! valid and corrupted, we accept exactly what it accepts, with the same tensors, and return the
//! same error kinds, except for the documented stricter cases (duplicate keys, checked
//! arithmetic where the reference panics). Our writer's bytes equal the reference's whenever
//! there is at most one metadata key.

mod common;
#[path = "differential/gen.rs"]
mod gen;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use safetensors_core::{serialize, test_hooks, Dtype, ErrorKind, Header, TensorView};

use gen::*;

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
