//! Reading a checkpoint index (`model.safetensors.index.json`): `{"metadata": {...},
//! "weight_map": {"tensor": "shard", ...}}`, with repeated tensor names and metadata keys kept so
//! that they can be refused, and metadata values that are not strings kept as their exact JSON
//! text.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::{Error, Result};

/// Index files are small (a name and a file name per tensor); refuse absurd ones before reading.
pub const MAX_INDEX_SIZE: u64 = 256 * 1024 * 1024;

/// The index's metadata (repeated keys refused) and its weight map as (tensor, shard) pairs in
/// the file's order, repeats kept for the caller to refuse.
#[allow(clippy::type_complexity)]
pub(super) fn parse_index(
    text: &[u8],
) -> Result<(Option<BTreeMap<String, String>>, Vec<(String, String)>)> {
    let index: IndexFile = serde_json::from_slice(text).map_err(|e| Error::InvalidIndex {
        reason: e.to_string(),
    })?;
    let weight_map = index.weight_map.ok_or_else(|| Error::InvalidIndex {
        reason: "no `weight_map` object".into(),
    })?;
    let metadata = index.metadata.map(unique_metadata).transpose()?;
    Ok((metadata, weight_map))
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

/// The parts of an index file we use; both maps keep repeats so they can be refused.
struct IndexFile {
    metadata: Option<Vec<(String, String)>>,
    weight_map: Option<Vec<(String, String)>>,
}

impl<'de> serde::Deserialize<'de> for IndexFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(IndexVisitor)
    }
}

struct IndexVisitor;

impl<'de> Visitor<'de> for IndexVisitor {
    type Value = IndexFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with `weight_map`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<IndexFile, A::Error> {
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
                "weight_map" => out.weight_map = Some(map.next_value::<Pairs>()?.0),
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

/// A JSON object of strings as a list of pairs, repeats kept (so they can be refused).
struct Pairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Pairs, A::Error> {
                let mut out = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    out.push(pair);
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V)
    }
}
