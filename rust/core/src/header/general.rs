//! The general JSON path: serde_json's streaming deserializer driving purpose-built visitors
//! that fill a [`Builder`]. Every header the canonical scanner gives up on comes here, and so
//! does every JSON error: this path alone decides what is refused and how.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::builder::{arena_u32, grow_dims, Builder, Entry};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::format::{MAX_RANK, METADATA_KEY};

/// The general path: serde_json's streaming deserializer driving our visitors.
pub(super) fn parse_general(text: &str, builder: &mut Builder) -> Result<()> {
    let mut de = serde_json::Deserializer::from_str(text);
    let json_error = |e: serde_json::Error| Error::InvalidHeaderDeserialization {
        message: e.to_string(),
    };
    (&mut de)
        .deserialize_map(TopVisitor(builder))
        .map_err(json_error)?;
    de.end().map_err(json_error)
}

/// The root object: `__metadata__` plus one entry per tensor.
struct TopVisitor<'b>(&'b mut Builder);

impl<'de> Visitor<'de> for TopVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object mapping tensor names to {dtype, shape, data_offsets}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let b = self.0;
        while let Some(key) = map.next_key_seed(KeySeed(&mut b.names))? {
            match key {
                Key::Metadata => {
                    if b.metadata_seen {
                        b.note_duplicate(METADATA_KEY.to_owned(), false);
                    }
                    b.metadata_seen = true;
                    let mut dup = None;
                    b.metadata = map.next_value_seed(MetadataSeed(&mut dup))?;
                    if let Some(key) = dup {
                        b.note_duplicate(key, true);
                    }
                }
                Key::Tensor { start, len } => {
                    let (dtype, (shape_start, shape_len), (begin, end)) =
                        map.next_value_seed(EntrySeed(&mut b.shapes, b.max_dims))?;
                    b.entries.push(Entry {
                        name_start: start,
                        name_len: len,
                        shape_start,
                        shape_len,
                        dtype,
                        begin,
                        end,
                    });
                }
            }
        }
        Ok(())
    }
}

enum Key {
    Metadata,
    Tensor { start: u32, len: u32 },
}

/// Reads a top-level key; tensor names are appended to the name arena.
struct KeySeed<'b>(&'b mut String);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Key, E> {
        if v == METADATA_KEY {
            return Ok(Key::Metadata);
        }
        let start = arena_u32(self.0.len())?;
        let len = arena_u32(v.len())?;
        self.0.push_str(v);
        Ok(Key::Tensor { start, len })
    }
}

/// `__metadata__`: `null`, or an object of string values. Records the first repeated key.
struct MetadataSeed<'b>(&'b mut Option<String>);

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Option<BTreeMap<String, String>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = Option<BTreeMap<String, String>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null or an object of string values")
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(MetadataMap(self.0)).map(Some)
    }
}

struct MetadataMap<'b>(&'b mut Option<String>);

impl<'de> Visitor<'de> for MetadataMap<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of string values")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some((k, v)) = map.next_entry::<String, String>()? {
            if out.contains_key(&k) {
                if self.0.is_none() {
                    *self.0 = Some(k.clone());
                }
                continue;
            }
            out.insert(k, v);
        }
        Ok(out)
    }
}

type ParsedEntry = (Dtype, (u32, u32), (usize, usize));

/// One tensor entry. Like a derived struct deserializer, it takes the object form (unknown
/// fields ignored, repeated or missing fields refused) and the 3-element array form.
struct EntrySeed<'b>(&'b mut Vec<usize>, usize);

const ENTRY_FIELDS: &[&str] = &["dtype", "shape", "data_offsets"];

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = ParsedEntry;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<ParsedEntry, D::Error> {
        d.deserialize_struct("TensorInfo", ENTRY_FIELDS, self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = ParsedEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct TensorInfo")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<ParsedEntry, A::Error> {
        let mut dtype = None;
        let mut shape = None;
        let mut offsets = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Dtype if dtype.is_some() => return Err(de::Error::duplicate_field("dtype")),
                Field::Dtype => dtype = Some(map.next_value::<Dtype>()?),
                Field::Shape if shape.is_some() => return Err(de::Error::duplicate_field("shape")),
                Field::Shape => shape = Some(map.next_value_seed(ShapeSeed(&mut *self.0, self.1))?),
                Field::DataOffsets if offsets.is_some() => {
                    return Err(de::Error::duplicate_field("data_offsets"))
                }
                Field::DataOffsets => offsets = Some(map.next_value::<(usize, usize)>()?),
                Field::Other => {
                    map.next_value::<UnknownValue>()?;
                }
            }
        }
        let dtype = dtype.ok_or_else(|| de::Error::missing_field("dtype"))?;
        let shape = shape.ok_or_else(|| de::Error::missing_field("shape"))?;
        let offsets = offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?;
        Ok((dtype, shape, offsets))
    }

    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<ParsedEntry, A::Error> {
        let expected = &"struct TensorInfo with 3 elements";
        let dtype = seq
            .next_element::<Dtype>()?
            .ok_or_else(|| de::Error::invalid_length(0, expected))?;
        let shape = seq
            .next_element_seed(ShapeSeed(&mut *self.0, self.1))?
            .ok_or_else(|| de::Error::invalid_length(1, expected))?;
        let offsets = seq
            .next_element::<(usize, usize)>()?
            .ok_or_else(|| de::Error::invalid_length(2, expected))?;
        Ok((dtype, shape, offsets))
    }
}

/// The value of an unknown entry field, parsed in full and dropped.
///
/// Not `IgnoredAny`: serde_json skips that by scanning the text, which takes numbers out of
/// `f64` range, lone surrogates and invalid escapes, and nesting past its 128-level limit. The
/// reference reads the header through a flattened map, so serde_json first parses every value
/// with `deserialize_any`; asking for the same here applies exactly its grammar. Nothing is
/// kept, and recursion is bounded by serde_json's depth limit.
struct UnknownValue;

impl<'de> de::Deserialize<'de> for UnknownValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(UnknownValue)
    }
}

impl<'de> Visitor<'de> for UnknownValue {
    type Value = UnknownValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Self, E> {
        Ok(self)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Self, E> {
        Ok(self)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Self, E> {
        Ok(self)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Self, E> {
        Ok(self)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Self, E> {
        Ok(self)
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Self, E> {
        Ok(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self, A::Error> {
        while seq.next_element::<UnknownValue>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self, A::Error> {
        while map.next_entry::<UnknownValue, UnknownValue>()?.is_some() {}
        Ok(self)
    }
}

enum Field {
    Dtype,
    Shape,
    DataOffsets,
    Other,
}

impl<'de> de::Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Field, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Field, E> {
                Ok(match v {
                    "dtype" => Field::Dtype,
                    "shape" => Field::Shape,
                    "data_offsets" => Field::DataOffsets,
                    _ => Field::Other,
                })
            }
        }
        d.deserialize_identifier(FieldVisitor)
    }
}

/// A shape: an array of non-negative integers, appended to the shared dimension arena, whose
/// capacity never grows past the second field (see [`grow_dims`]).
struct ShapeSeed<'b>(&'b mut Vec<usize>, usize);

impl<'de> DeserializeSeed<'de> for ShapeSeed<'_> {
    type Value = (u32, u32);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(u32, u32), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ShapeSeed<'_> {
    type Value = (u32, u32);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(u32, u32), A::Error> {
        let start = self.0.len();
        while let Some(dim) = seq.next_element::<usize>()? {
            // Past the rank limit the dimensions are read but not kept: one more than the
            // limit is enough for validation to refuse the tensor by name.
            if self.0.len() - start > MAX_RANK {
                continue;
            }
            grow_dims(self.0, self.1);
            self.0.push(dim);
        }
        Ok((arena_u32(start)?, arena_u32(self.0.len() - start)?))
    }
}
