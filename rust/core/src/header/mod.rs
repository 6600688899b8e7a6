//! The header: the [`Header`] type and its accessors, the order in which a file's checks run,
//! and the validation of tensor offsets and sizes.
//!
//! The checks run in the reference implementation's order, so that every file gets the same
//! verdict and the same error kind as with the reference, except where we are deliberately
//! stricter: duplicate keys are refused, and all arithmetic is checked. The order:
//! 1. at least the 8-byte length prefix (`HeaderTooSmall`);
//! 2. a header length `N` of at most 100,000,000 (`HeaderTooLarge`);
//! 3. `8 + N` within the input (`InvalidHeaderLength`);
//! 4. the header is UTF-8 (`InvalidHeader`);
//! 5. the header is JSON of the schema (`InvalidHeaderDeserialization`), without repeated keys
//!    (`DuplicateKey`, ours);
//! 6. in offset order, each tensor begins where the previous one ended (`InvalidOffset`) and
//!    its byte length is its dtype × shape (`ValidationOverflow`, `MisalignedSlice`,
//!    `TensorInvalidInfo`; the rule is `byte_len.rs`);
//! 7. the last tensor ends where the input does (`MetadataIncompleteBuffer`).
//!
//! The JSON is read into one [`Builder`] (`builder.rs`) by one of two parsers: the fast scanner
//! for the canonical layout writers produce (`canonical.rs`), or, when it gives up, the general
//! serde visitor (`general.rs`), which alone decides errors. Tensor names go into one string
//! arena, shapes into one flat vector, and the name index (`names.rs`) is a small
//! open-addressing table over those. That removes the per-tensor allocations and the buffering
//! that dominate the reference's parse time on large headers.

mod builder;
mod canonical;
mod general;
pub(crate) mod names;

use std::collections::BTreeMap;
use std::fmt;

use crate::byte_len::check_tensor_byte_len;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::format::{LENGTH_PREFIX_SIZE, LFS_POINTER_PREFIX, MAX_HEADER_SIZE};

use builder::{Builder, Entry};
use general::parse_general;
use names::NameIndex;

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

/// Where a tensor lies, without its name: [`Header::placement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Element type.
    pub dtype: Dtype,
    /// `[begin, end)` byte offsets relative to the start of the data buffer.
    pub data_offsets: (usize, usize),
    /// `(start, len)` of the shape within [`Header::dims`].
    pub shape_span: (usize, usize),
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

    /// Whether a caller's buffer of `len` bytes can take all of this tensor: exactly its bytes,
    /// else `InvalidSlice` naming the tensor, its dtype and shape, and the length to pass (the
    /// rule of every "read a tensor into my buffer", [`SafeFile::read_tensor`](crate::SafeFile::read_tensor)).
    pub fn check_destination(&self, len: usize) -> crate::error::Result<()> {
        let want = self.byte_len();
        if len == want {
            return Ok(());
        }
        Err(crate::error::Error::InvalidSlice {
            tensor: self.name.to_owned(),
            reason: format!(
                "the destination holds {len} bytes but the tensor ({} {:?}) has {want}; pass \
                 exactly {want} bytes",
                self.dtype, self.shape
            ),
        })
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
    if total_len < LENGTH_PREFIX_SIZE as u64 || head.len() < LENGTH_PREFIX_SIZE {
        return Err(Error::HeaderTooSmall { len: total_len });
    }
    let mut prefix = [0u8; LENGTH_PREFIX_SIZE];
    prefix.copy_from_slice(&head[..LENGTH_PREFIX_SIZE]);
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER_SIZE as u64 {
        return Err(Error::HeaderTooLarge {
            header_len,
            lfs_pointer: head.starts_with(LFS_POINTER_PREFIX),
            writing: None,
        });
    }
    // header_len <= 1e8, so the addition cannot overflow.
    if header_len + LENGTH_PREFIX_SIZE as u64 > total_len {
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
        for e in &self.entries {
            if e.begin != start || e.end < e.begin {
                return Err(Error::InvalidOffset {
                    tensor: self.name_of(e).to_owned(),
                    data_offsets: (e.begin as u64, e.end as u64),
                    expected_begin: start as u64,
                });
            }
            start = e.end;
            check_tensor_byte_len(self.name_of(e), e.dtype, self.shape_of(e), e.end - e.begin)?;
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
        LENGTH_PREFIX_SIZE + self.header_len
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

    /// The name of the tensor at position `i` in offset order, touching nothing else of it.
    pub fn name_at(&self, i: usize) -> Option<&str> {
        self.entries.get(i).map(|e| self.name_of(e))
    }

    /// Where the tensor at position `i` lies, without its name. (A lookup that already matched
    /// the name needs no second look at it: [`Header::at`] would read the name's bytes again.)
    ///
    /// ```
    /// use safetensors_core::{serialize, Dtype, Header, TensorView};
    /// let (a, b) = ([0u8; 24], [0u8; 2]);
    /// let file = serialize(
    ///     vec![
    ///         ("a", TensorView::new(Dtype::F32, &[2, 3], &a)),
    ///         ("b", TensorView::new(Dtype::BF16, &[], &b)),
    ///     ],
    ///     None,
    /// )
    /// .unwrap();
    /// let header = Header::parse(&file).unwrap();
    /// for i in 0..header.len() {
    ///     let t = header.at(i).unwrap();
    ///     let p = header.placement(i).unwrap();
    ///     assert_eq!((p.dtype, p.data_offsets), (t.dtype, t.data_offsets));
    ///     let (start, len) = p.shape_span;
    ///     assert_eq!(&header.dims()[start..start + len], t.shape);
    ///     assert_eq!(header.name_at(i), Some(t.name));
    /// }
    /// assert_eq!(header.placement(2), None);
    /// assert_eq!(header.name_at(2), None);
    /// ```
    pub fn placement(&self, i: usize) -> Option<Placement> {
        self.entries.get(i).map(|e| Placement {
            dtype: e.dtype,
            data_offsets: (e.begin, e.end),
            shape_span: (e.shape_start as usize, e.shape_len as usize),
        })
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
        .get(LENGTH_PREFIX_SIZE..LENGTH_PREFIX_SIZE + header_len)
        .ok_or(Error::InvalidHeaderLength {
            header_len: header_len as u64,
            len: head.len() as u64,
        })?;
    let mut header = json(bytes)?;
    header.header_len = header_len;
    header.validate()?;
    let expected =
        (header.data_len as u64).saturating_add((LENGTH_PREFIX_SIZE + header_len) as u64);
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

/// Test hooks, not API: each JSON parser on its own, so that tests and fuzz targets can check
/// that the two agree.
#[doc(hidden)]
pub mod test_hooks {
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
        let text =
            std::str::from_utf8(buffer.get(LENGTH_PREFIX_SIZE..LENGTH_PREFIX_SIZE + n)?).ok()?;
        let mut b = Builder::for_len(text.len());
        canonical::parse(text, &mut b).ok()?;
        Some(parse_with(buffer, |_| finish(b)))
    }
}
