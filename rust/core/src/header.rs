//! Parsing and validating the header: the 8-byte length prefix and the JSON that follows it.
//!
//! The checks run in the reference implementation's order (see `FORMAT.md`), so that every file
//! gets the same verdict and the same error kind as with the reference, except where we are
//! deliberately stricter: duplicate keys are refused, and all arithmetic is checked.
//!
//! The JSON is read by a purpose-built visitor over `serde_json` rather than through a generic
//! map type: tensor names go into one string arena, shapes into one flat vector, and the name
//! index is a small open-addressing table over those. That removes the per-tensor allocations
//! and the buffering that dominate the reference's parse time on large headers.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::BuildHasher;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::canonical;
use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// Largest header the format allows, in bytes (exactly this many is allowed).
pub const MAX_HEADER_SIZE: usize = 100_000_000;

/// Size of the little-endian `u64` length prefix.
pub const N_LEN: usize = 8;

/// What a git-lfs pointer file starts with: a common "model" that is not one.
const LFS_POINTER_PREFIX: &[u8] = b"version https://git-lfs";

/// Reserved key for the free-form string map.
pub const METADATA_KEY: &str = "__metadata__";

/// One tensor's entry, as stored in [`Header`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) name_start: u32,
    pub(crate) name_len: u32,
    pub(crate) shape_start: u32,
    pub(crate) shape_len: u32,
    pub(crate) dtype: Dtype,
    pub(crate) begin: usize,
    pub(crate) end: usize,
}

/// A tensor's description from the header: no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorInfo<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: &'a [usize],
    /// `[begin, end)` byte offsets relative to the start of the data buffer.
    pub data_offsets: (usize, usize),
}

impl TensorInfo<'_> {
    /// Number of elements (1 for a scalar). Cannot overflow: the header was validated.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of data bytes.
    pub fn byte_len(&self) -> usize {
        self.data_offsets.1 - self.data_offsets.0
    }
}

/// A parsed, validated header. Owns its strings; borrows nothing.
#[derive(Clone)]
pub struct Header {
    /// All tensor names, back to back.
    names: String,
    /// Dimensions of all tensors, back to back.
    shapes: Vec<usize>,
    /// Entries in offset order (ties keep header order).
    entries: Vec<Entry>,
    index: NameIndex,
    metadata: Option<BTreeMap<String, String>>,
    header_len: usize,
    data_len: usize,
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Header")
            .field("header_len", &self.header_len)
            .field("data_len", &self.data_len)
            .field("metadata", &self.metadata)
            .field("tensors", &self.iter().collect::<Vec<_>>())
            .finish()
    }
}

/// Reads the length prefix and runs the checks that need no JSON: too small, too large,
/// past the end. `head` holds at least the first bytes of the input (all of it, or a prefix);
/// `total_len` is the length of the whole input. Returns the header length `N`.
pub fn read_header_len(head: &[u8], total_len: u64) -> Result<usize> {
    if total_len < N_LEN as u64 || head.len() < N_LEN {
        return Err(Error::HeaderTooSmall { len: total_len });
    }
    let mut prefix = [0u8; N_LEN];
    prefix.copy_from_slice(&head[..N_LEN]);
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER_SIZE as u64 {
        return Err(Error::HeaderTooLarge {
            header_len,
            lfs_pointer: head.starts_with(LFS_POINTER_PREFIX),
            writing: None,
        });
    }
    // header_len <= 1e8, so the addition cannot overflow.
    if header_len + N_LEN as u64 > total_len {
        return Err(Error::InvalidHeaderLength {
            header_len,
            len: total_len,
        });
    }
    Ok(header_len as usize)
}

impl Header {
    /// Parses and validates the header of a complete in-memory file.
    ///
    /// ```
    /// let file = safetensors_core::serialize(Vec::<(&str, safetensors_core::TensorView)>::new(), None).unwrap();
    /// let header = safetensors_core::Header::parse(&file).unwrap();
    /// assert!(header.is_empty());
    /// ```
    pub fn parse(buffer: &[u8]) -> Result<Header> {
        Header::parse_prefix(buffer, buffer.len() as u64)
    }

    /// Parses and validates a header when only the start of the file is in memory.
    ///
    /// `head` must hold at least the first `8 + N` bytes (or the whole file when shorter);
    /// `file_len` is the length of the whole file, which the last check compares against.
    pub fn parse_prefix(head: &[u8], file_len: u64) -> Result<Header> {
        parse_prefix_with(head, file_len, parse_json)
    }

    /// Walks the tensors in offset order from offset 0, as the reference does: each must begin
    /// where the previous one ended, and its byte length must match dtype × shape.
    fn validate(&mut self) -> Result<()> {
        let mut start = 0usize;
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            if e.begin != start || e.end < e.begin {
                return Err(Error::InvalidOffset {
                    tensor: self.name_of(&e).to_owned(),
                    data_offsets: (e.begin as u64, e.end as u64),
                    expected_begin: start as u64,
                });
            }
            start = e.end;
            let shape = self.shape_of(&e);
            let overflow = || Error::ValidationOverflow {
                tensor: self.name_of(&e).to_owned(),
                shape: shape.to_vec(),
            };
            let numel = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(overflow)?;
            let bits = numel.checked_mul(e.dtype.bits()).ok_or_else(overflow)?;
            if bits % 8 != 0 {
                return Err(Error::MisalignedSlice {
                    tensor: self.name_of(&e).to_owned(),
                    reason: format!(
                        "{numel} elements of {} make {bits} bits, not a whole number of bytes",
                        e.dtype
                    ),
                });
            }
            if e.end - e.begin != bits / 8 {
                return Err(Error::TensorInvalidInfo {
                    tensor: self.name_of(&e).to_owned(),
                    expected: (bits / 8) as u64,
                    actual: (e.end - e.begin) as u64,
                });
            }
        }
        self.data_len = start;
        Ok(())
    }

    fn name_of(&self, e: &Entry) -> &str {
        let start = e.name_start as usize;
        &self.names[start..start + e.name_len as usize]
    }

    fn shape_of(&self, e: &Entry) -> &[usize] {
        let start = e.shape_start as usize;
        &self.shapes[start..start + e.shape_len as usize]
    }

    fn info(&self, e: &Entry) -> TensorInfo<'_> {
        TensorInfo {
            name: self.name_of(e),
            dtype: e.dtype,
            shape: self.shape_of(e),
            data_offsets: (e.begin, e.end),
        }
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The header length `N` from the prefix (JSON plus padding).
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// Where the data buffer starts in the file: `8 + N`.
    pub fn data_start(&self) -> usize {
        N_LEN + self.header_len
    }

    /// Length of the data buffer: the end offset of the last tensor.
    pub fn data_len(&self) -> usize {
        self.data_len
    }

    /// Length of the whole file: `8 + N + data_len`.
    pub fn file_len(&self) -> usize {
        self.data_start() + self.data_len
    }

    /// The `__metadata__` map, when the header has one (`null` counts as absent).
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Position of `name` in offset order.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.position_bytes(name.as_bytes())
    }

    /// [`Header::position`] for a name given as bytes (no UTF-8 check needed: bytes that are
    /// not UTF-8 match no tensor).
    pub fn position_bytes(&self, name: &[u8]) -> Option<usize> {
        self.index
            .find(name, |i| self.name_of(&self.entries[i as usize]).as_bytes())
            .map(|i| i as usize)
    }

    /// The tensor at position `i` in offset order.
    pub fn at(&self, i: usize) -> Option<TensorInfo<'_>> {
        self.entries.get(i).map(|e| self.info(e))
    }

    /// Looks up a tensor by name.
    pub fn get(&self, name: &str) -> Option<TensorInfo<'_>> {
        self.position(name).and_then(|i| self.at(i))
    }

    /// Looks up a tensor by name, failing with [`Error::TensorNotFound`].
    pub fn tensor(&self, name: &str) -> Result<TensorInfo<'_>> {
        self.get(name).ok_or_else(|| Error::TensorNotFound {
            name: name.to_owned(),
        })
    }

    /// All tensors in offset (file) order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = TensorInfo<'_>> + '_ {
        self.entries.iter().map(|e| self.info(e))
    }

    /// Every tensor's dimensions, back to back; [`Header::shape_span`] locates one tensor's.
    /// For FFI, where one shared slice beats one call per shape.
    pub fn dims(&self) -> &[usize] {
        &self.shapes
    }

    /// `(start, len)` of the shape of the tensor at position `i` within [`Header::dims`].
    pub fn shape_span(&self, i: usize) -> Option<(usize, usize)> {
        self.entries
            .get(i)
            .map(|e| (e.shape_start as usize, e.shape_len as usize))
    }

    /// Tensor names in offset (file) order.
    pub fn offset_names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.entries.iter().map(|e| self.name_of(e))
    }

    /// Positions (in offset order) of the tensors sorted by name, byte-wise.
    pub fn sorted_positions(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.entries.len() as u32).collect();
        // Stable sort on purpose: it finds existing sorted runs, and writers lay tensors out in
        // a few runs (name order within each dtype), so this is close to linear.
        order.sort_by(|&a, &b| {
            self.name_of(&self.entries[a as usize])
                .cmp(self.name_of(&self.entries[b as usize]))
        });
        order
    }

    /// Tensor names sorted byte-wise, like Python's `safe_open(...).keys()`.
    pub fn sorted_names(&self) -> Vec<&str> {
        self.sorted_positions()
            .into_iter()
            .map(|i| self.name_of(&self.entries[i as usize]))
            .collect()
    }
}

/// Checks 1 to 3 and 6 to 7 around `json`, which does checks 4 and 5 (UTF-8, then the JSON).
fn parse_prefix_with(
    head: &[u8],
    file_len: u64,
    json: impl FnOnce(&[u8]) -> Result<Header>,
) -> Result<Header> {
    let header_len = read_header_len(head, file_len)?;
    let bytes = head
        .get(N_LEN..N_LEN + header_len)
        .ok_or(Error::InvalidHeaderLength {
            header_len: header_len as u64,
            len: head.len() as u64,
        })?;
    let mut header = json(bytes)?;
    header.header_len = header_len;
    header.validate()?;
    let expected = (header.data_len as u64).saturating_add((N_LEN + header_len) as u64);
    if expected != file_len {
        return Err(Error::MetadataIncompleteBuffer {
            expected,
            actual: file_len,
        });
    }
    Ok(header)
}

fn parse_with(buffer: &[u8], json: impl FnOnce(&[u8]) -> Result<Header>) -> Result<Header> {
    parse_prefix_with(buffer, buffer.len() as u64, json)
}

/// Check 4: the header must be UTF-8.
fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|e| Error::InvalidHeader {
        valid_up_to: e.valid_up_to(),
    })
}

/// Checks the header is UTF-8 and parses its JSON (checks 4 and 5), then sorts into offset
/// order and indexes names. Canonical headers take the fast scanner; anything else, and every
/// JSON error, goes through the general serde visitor. (Validating UTF-8 in one pass over the
/// whole header measured faster than validating each string inside the scanner.)
fn parse_json(bytes: &[u8]) -> Result<Header> {
    let text = utf8(bytes)?;
    let mut builder = Builder::for_len(bytes.len());
    if canonical::parse(text, &mut builder).is_err() {
        builder = Builder::for_len(bytes.len());
        parse_general(text, &mut builder)?;
    }
    finish(builder)
}

/// The general path: serde_json's streaming deserializer driving our visitors.
fn parse_general(text: &str, builder: &mut Builder) -> Result<()> {
    let mut de = serde_json::Deserializer::from_str(text);
    let json_error = |e: serde_json::Error| Error::InvalidHeaderDeserialization {
        message: e.to_string(),
    };
    (&mut de)
        .deserialize_map(TopVisitor(builder))
        .map_err(json_error)?;
    de.end().map_err(json_error)
}

/// Sorts entries into offset order and indexes names. Duplicate keys are reported only here,
/// once the whole text has parsed, so that malformed JSON always yields
/// `InvalidHeaderDeserialization`, as with the reference.
fn finish(builder: Builder) -> Result<Header> {
    let Builder {
        names,
        shapes,
        mut entries,
        metadata,
        duplicate,
        ..
    } = builder;
    // Stable: tensors with equal offsets (zero-size ones) keep header order.
    if !entries
        .windows(2)
        .all(|w| (w[0].begin, w[0].end) <= (w[1].begin, w[1].end))
    {
        entries.sort_by_key(|e| (e.begin, e.end));
    }
    let mut header = Header {
        names,
        shapes,
        entries,
        index: NameIndex::default(),
        metadata,
        header_len: 0,
        data_len: 0,
    };
    let index = NameIndex::build(header.entries.len(), |i| {
        header.name_of(&header.entries[i as usize])
    });
    header.index = match (index, duplicate) {
        (_, Some(dup)) => return Err(dup),
        (Err(name), None) => {
            return Err(Error::DuplicateKey {
                key: name,
                in_metadata: false,
            })
        }
        (Ok(index), None) => index,
    };
    Ok(header)
}

/// Test hooks: each JSON path on its own, so tests and fuzzers can check that they agree.
#[doc(hidden)]
pub mod paths {
    use super::*;

    /// The general serde path, validated, for a complete in-memory file.
    pub fn parse_general_only(buffer: &[u8]) -> Result<Header> {
        parse_with(buffer, |bytes| {
            let text = utf8(bytes)?;
            let mut b = Builder::for_len(bytes.len());
            parse_general(text, &mut b)?;
            finish(b)
        })
    }

    /// The canonical scanner alone; `None` when it gives up.
    pub fn parse_canonical_only(buffer: &[u8]) -> Option<Result<Header>> {
        let n = read_header_len(buffer, buffer.len() as u64).ok()?;
        let text = std::str::from_utf8(buffer.get(N_LEN..N_LEN + n)?).ok()?;
        let mut b = Builder::for_len(text.len());
        canonical::parse(text, &mut b).ok()?;
        Some(parse_with(buffer, |_| finish(b)))
    }
}

pub(crate) struct Builder {
    pub(crate) names: String,
    pub(crate) shapes: Vec<usize>,
    pub(crate) entries: Vec<Entry>,
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    pub(crate) metadata_seen: bool,
    /// First duplicate found inside `__metadata__`, or `__metadata__` itself repeated.
    pub(crate) duplicate: Option<Error>,
    /// Most dimensions the whole header can hold: each takes a digit and a separator.
    pub(crate) max_dims: usize,
}

impl Builder {
    fn for_len(len: usize) -> Builder {
        Builder {
            names: String::with_capacity(len / 3),
            shapes: Vec::with_capacity(len / 48),
            entries: Vec::with_capacity(len / 96),
            metadata: None,
            metadata_seen: false,
            duplicate: None,
            max_dims: len / 2 + 1,
        }
    }

    fn note_duplicate(&mut self, key: String, in_metadata: bool) {
        if self.duplicate.is_none() {
            self.duplicate = Some(Error::DuplicateKey { key, in_metadata });
        }
    }
}

/// Makes room for one more dimension. Like `Vec`'s doubling, but never past `max`, the most
/// the header can hold: for a header that is one huge shape (rank ~5e7 in 100 MB) the arena ends
/// at its exact size instead of at the next power of two, keeping the peak near 4 bytes of
/// arena per header byte (8 per dimension of at least 2 bytes of text).
pub(crate) fn grow_dims(dims: &mut Vec<usize>, max: usize) {
    if dims.len() == dims.capacity() {
        let want = (dims.capacity() * 2).clamp(dims.len() + 1, max.max(dims.len() + 1));
        dims.reserve_exact(want - dims.len());
    }
}

/// Arena offsets are stored as `u32`: the header is at most 1e8 bytes, so every name and
/// every dimension count fits.
fn arena_u32<E: de::Error>(n: usize) -> std::result::Result<u32, E> {
    u32::try_from(n).map_err(|_| E::custom("header too large to index"))
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
            grow_dims(self.0, self.1);
            self.0.push(dim);
        }
        Ok((arena_u32(start)?, arena_u32(self.0.len() - start)?))
    }
}

/// Name → position table: open addressing with linear probing.
///
/// Names are hashed with a fast keyed multiply-fold hash. Keys are random per table, but such a
/// hash is not proven collision-resistant, so the table watches itself: if any probe sequence
/// grows long while building (a crafted header, or plain bad luck), it is rebuilt with keyed
/// SipHash (std's `RandomState`), which a hostile header cannot steer. Lookups stay O(1) either
/// way; ordinary headers never pay for SipHash, which cost ~10% of opening a large header.
#[derive(Clone, Default)]
struct NameIndex {
    /// Positions plus one; 0 marks an empty slot.
    slots: Vec<u32>,
    hasher: NameHasher,
}

#[derive(Clone)]
enum NameHasher {
    Fast(u64, u64),
    Sip(std::collections::hash_map::RandomState),
}

impl Default for NameHasher {
    fn default() -> Self {
        NameHasher::fresh_fast()
    }
}

/// Longest probe sequence tolerated with the fast hash before switching to SipHash.
const MAX_FAST_PROBE: usize = 48;

impl NameHasher {
    fn fresh_fast() -> NameHasher {
        // Two random keys from std's per-process randomness.
        let rs = std::collections::hash_map::RandomState::new();
        NameHasher::Fast(rs.hash_one(0x5afe_u64) | 1, rs.hash_one(0x7e45_u64))
    }

    fn hash(&self, name: &[u8]) -> u64 {
        match self {
            NameHasher::Fast(k0, k1) => fold_hash(*k0, *k1, name),
            NameHasher::Sip(rs) => rs.hash_one(name),
        }
    }
}

/// Multiplies as 128 bits and folds the halves together: a fast, well-mixing step.
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

fn fold_hash(k0: u64, k1: u64, bytes: &[u8]) -> u64 {
    const M: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = k0 ^ (bytes.len() as u64).wrapping_mul(M);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or_default());
        h = fold_mul(h ^ w, k1 ^ M);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        h = fold_mul(h ^ u64::from_le_bytes(tail), k1.rotate_left(29) ^ M);
    }
    fold_mul(h, k0 ^ M)
}

impl NameIndex {
    /// Indexes `count` names; on a repeated name returns it as the error.
    fn build<'a>(
        count: usize,
        name: impl Fn(u32) -> &'a str,
    ) -> std::result::Result<NameIndex, String> {
        match Self::build_with(count, &name, NameHasher::fresh_fast(), Some(MAX_FAST_PROBE))? {
            Some(index) => Ok(index),
            None => {
                let sip = NameHasher::Sip(Default::default());
                Ok(Self::build_with(count, &name, sip, None)?.unwrap_or_default())
            }
        }
    }

    /// `Ok(None)` when a probe sequence exceeds `max_probe`.
    fn build_with<'a>(
        count: usize,
        name: &impl Fn(u32) -> &'a str,
        hasher: NameHasher,
        max_probe: Option<usize>,
    ) -> std::result::Result<Option<NameIndex>, String> {
        let capacity = (count.max(4) * 2).next_power_of_two();
        let mut slots = vec![0u32; capacity];
        let mask = capacity - 1;
        for i in 0..count as u32 {
            let n = name(i);
            let mut slot = hasher.hash(n.as_bytes()) as usize & mask;
            let mut probes = 0;
            loop {
                match slots[slot] {
                    0 => {
                        slots[slot] = i + 1;
                        break;
                    }
                    other if name(other - 1) == n => return Err(n.to_owned()),
                    _ => {
                        probes += 1;
                        if max_probe.is_some_and(|m| probes > m) {
                            return Ok(None);
                        }
                        slot = (slot + 1) & mask;
                    }
                }
            }
        }
        Ok(Some(NameIndex { slots, hasher }))
    }

    fn find<'a>(&self, n: &[u8], name: impl Fn(u32) -> &'a [u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut slot = self.hasher.hash(n) as usize & mask;
        loop {
            match self.slots[slot] {
                0 => return None,
                other if name(other - 1) == n => return Some(other - 1),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Whether the index fell back to SipHash (for tests).
    #[cfg(test)]
    fn uses_siphash(&self) -> bool {
        matches!(self.hasher, NameHasher::Sip(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_finds_every_name_and_reports_repeats() {
        let names: Vec<String> = (0..5000)
            .map(|i| format!("model.layers.{i}.weight"))
            .collect();
        let index = NameIndex::build(names.len(), |i| names[i as usize].as_str()).unwrap();
        assert!(!index.uses_siphash());
        for (i, n) in names.iter().enumerate() {
            assert_eq!(
                index.find(n.as_bytes(), |j| names[j as usize].as_bytes()),
                Some(i as u32)
            );
        }
        assert_eq!(
            index.find(b"absent", |j| names[j as usize].as_bytes()),
            None
        );
        let mut dup = names.clone();
        dup.push(names[17].clone());
        assert_eq!(
            NameIndex::build(dup.len(), |i| dup[i as usize].as_str()).err(),
            Some(names[17].clone())
        );
    }

    #[test]
    fn long_probe_sequences_switch_to_siphash() {
        // Force the fallback by building with a probe limit of zero, as a flood would.
        let names: Vec<String> = (0..64).map(|i| format!("t{i}")).collect();
        let name = |i: u32| names[i as usize].as_str();
        assert!(
            NameIndex::build_with(64, &name, NameHasher::fresh_fast(), Some(0))
                .unwrap()
                .is_none()
        );
        let sip = NameIndex::build_with(64, &name, NameHasher::Sip(Default::default()), None)
            .unwrap()
            .unwrap();
        assert!(sip.uses_siphash());
        assert_eq!(sip.find(b"t63", |i| names[i as usize].as_bytes()), Some(63));
    }

    #[test]
    fn fold_hash_depends_on_every_byte_and_the_keys() {
        let base = fold_hash(1, 2, b"model.layers.0.mlp.up_proj.weight");
        assert_ne!(base, fold_hash(1, 2, b"model.layers.0.mlp.up_proj.weighu"));
        assert_ne!(base, fold_hash(1, 2, b"model.layers.1.mlp.up_proj.weight"));
        assert_ne!(base, fold_hash(3, 2, b"model.layers.0.mlp.up_proj.weight"));
        assert_ne!(fold_hash(1, 2, b""), fold_hash(1, 2, b"\0"));
    }
}
