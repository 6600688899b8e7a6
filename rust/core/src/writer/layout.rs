//! The layout of a file to write, made from the tensors' names, dtypes, shapes and the metadata
//! alone: the header (8-byte length, compact JSON, padding) and where each tensor's bytes go.
//! Every writer uses it (`PreparedFile`, the streaming writer, the sharded writer), which is why
//! a file written in pieces is byte-identical to the same tensors given to `serialize`.
//!
//! The reference's layout: tensors sorted by dtype, descending (8-byte elements first, then 4,
//! 2, 1 and the sub-byte formats), then by name; `__metadata__` first with its keys sorted;
//! the header padded with spaces so that the data starts 8-aligned. Sorting by falling element
//! size packs the tensors back to back, as the format demands (no gaps), with every tensor at a
//! multiple of its element size from the start of the data buffer.
//!
//! Alignment (off by default): the header is padded with more spaces, which the format allows
//! after the JSON, so that the data buffer starts on a multiple of the alignment in the file.
//! The tensors stay in the order above, so each starts at a multiple of its element size in the
//! file too; none is moved to a larger boundary, because the format forbids bytes between
//! tensors (a tensor starts on the alignment only where the sizes before it add up to it).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;

use crate::byte_len::{check_tensor_byte_len, tensor_byte_len};
use crate::dtype::Dtype;
use crate::error::{Error, HeaderContents, Result};
use crate::format::{LENGTH_PREFIX_SIZE, MAX_HEADER_SIZE, MAX_RANK, METADATA_KEY};

/// The largest alignment a writer accepts: beyond it the padding alone could pass the header's
/// 100,000,000-byte limit.
pub const MAX_ALIGNMENT: usize = 1 << 26;

/// One tensor to lay out. `given` is the length of the data handed over with it, or `None` for
/// a tensor declared now and written later (its length is then dtype × shape).
pub(crate) struct Entry<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub given: Option<usize>,
}

/// The header and the place of every tensor.
pub(crate) struct Layout {
    /// The length prefix, the JSON and its padding: the file's first bytes.
    pub head: Vec<u8>,
    /// The entries' positions in the caller's list, in file order.
    pub order: Vec<usize>,
    /// For each entry (in the caller's order), its bytes `[begin, end)` in the data buffer.
    pub offsets: Vec<(usize, usize)>,
    /// Bytes of the data buffer.
    pub data_len: usize,
}

/// The boundary the data buffer starts on for a writer's `alignment` option: 8 (the reference)
/// for 0 and for every power of two up to 8; the alignment itself above that. Anything else is
/// refused ([`Error::BadAlignment`]).
pub(crate) fn data_alignment(alignment: usize) -> Result<usize> {
    if alignment == 0 {
        return Ok(LENGTH_PREFIX_SIZE);
    }
    if !alignment.is_power_of_two() {
        return Err(Error::BadAlignment {
            alignment: alignment as u64,
            reason: "an alignment must be a power of two",
            upload: false,
        });
    }
    if alignment > MAX_ALIGNMENT {
        return Err(Error::BadAlignment {
            alignment: alignment as u64,
            reason: "the largest alignment is 2^26 bytes (64 MiB), beyond which the header's \
                     padding could pass the format's 100,000,000-byte limit",
            upload: false,
        });
    }
    Ok(alignment.max(LENGTH_PREFIX_SIZE))
}

/// A tensor's byte length: that of its data when given (checked against dtype × shape), else
/// dtype × shape. Refuses the reserved name and more than [`MAX_RANK`] dimensions.
fn checked_len(e: &Entry<'_>) -> Result<usize> {
    if e.name == METADATA_KEY {
        return Err(Error::InvalidTensorName {
            name: e.name.to_owned(),
        });
    }
    match e.given {
        Some(len) => check_tensor_byte_len(e.name, e.dtype, e.shape, len).map(|()| len),
        None if e.shape.len() > MAX_RANK => Err(Error::RankTooLarge {
            tensor: e.name.to_owned(),
        }),
        None => tensor_byte_len(e.name, e.dtype, e.shape),
    }
}

/// Checks every entry, in order: each tensor's own rules, then whether its name came before.
/// Returns each one's byte length.
pub(crate) fn check_entries(entries: &[Entry<'_>]) -> Result<Vec<usize>> {
    let mut lens = Vec::with_capacity(entries.len());
    let mut seen = HashSet::with_capacity(entries.len());
    for e in entries {
        lens.push(checked_len(e)?);
        if !seen.insert(e.name) {
            return Err(Error::DuplicateKey {
                key: e.name.to_owned(),
                in_metadata: false,
            });
        }
    }
    Ok(lens)
}

/// Checks every entry ([`check_entries`]) and lays the file out, the data buffer starting on a multiple of `alignment` (see
/// [`data_alignment`]). Errors: `InvalidTensorName`, `DuplicateKey`, `ValidationOverflow`,
/// `MisalignedSlice`, `TensorInvalidInfo`, `HeaderTooLarge`, `BadAlignment`.
pub(crate) fn lay_out(
    entries: &[Entry<'_>],
    metadata: Option<&BTreeMap<String, String>>,
    alignment: usize,
) -> Result<Layout> {
    let unit = data_alignment(alignment)?;
    let lens = check_entries(entries)?;
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&l, &r| {
        let (l, r) = (&entries[l], &entries[r]);
        r.dtype.cmp(&l.dtype).then_with(|| l.name.cmp(r.name))
    });

    let mut json = Vec::with_capacity(64 + entries.len() * 96);
    json.push(b'{');
    let mut first = true;
    // An empty map is written as the reference writes it, except in the one case where the
    // reference's own output is invalid JSON (no tensors): there we write `{}`.
    if let Some(meta) = metadata.filter(|m| !m.is_empty() || !entries.is_empty()) {
        write_json_str(&mut json, METADATA_KEY);
        json.extend_from_slice(b":{");
        write_separated(&mut json, meta, |json, (k, v)| {
            write_json_str(json, k);
            json.push(b':');
            write_json_str(json, v);
        });
        json.push(b'}');
        first = false;
    }
    let mut offset = 0usize;
    let mut offsets = vec![(0, 0); entries.len()];
    for &i in &order {
        let e = &entries[i];
        if !first {
            json.push(b',');
        }
        first = false;
        let end = offset
            .checked_add(lens[i])
            .ok_or_else(|| Error::ValidationOverflow {
                tensor: e.name.to_owned(),
                shape: e.shape.to_vec(),
            })?;
        write_json_str(&mut json, e.name);
        json.extend_from_slice(b":{\"dtype\":\"");
        json.extend_from_slice(e.dtype.name().as_bytes());
        json.extend_from_slice(b"\",\"shape\":[");
        write_separated(&mut json, e.shape, |json, d| write_usize(json, *d));
        json.extend_from_slice(b"],\"data_offsets\":[");
        write_usize(&mut json, offset);
        json.push(b',');
        write_usize(&mut json, end);
        json.extend_from_slice(b"]}");
        offsets[i] = (offset, end);
        offset = end;
    }
    json.push(b'}');
    let too_large = |header_len: usize| Error::HeaderTooLarge {
        header_len: header_len as u64,
        lfs_pointer: false,
        writing: Some(HeaderContents {
            tensors: entries.len(),
            name_bytes: entries.iter().map(|e| e.name.len()).sum(),
            metadata_bytes: metadata.map_or(0, |m| m.iter().map(|(k, v)| k.len() + v.len()).sum()),
        }),
    };
    let unaligned = json.len().next_multiple_of(LENGTH_PREFIX_SIZE);
    if unaligned > MAX_HEADER_SIZE {
        return Err(too_large(unaligned));
    }
    // The padded header ends where the data starts, on a multiple of `unit` (for the default
    // 8 this is the reference's padding of the header to a multiple of 8).
    let padded = (LENGTH_PREFIX_SIZE + json.len()).next_multiple_of(unit) - LENGTH_PREFIX_SIZE;
    if padded > MAX_HEADER_SIZE {
        return Err(Error::BadAlignment {
            alignment: unit as u64,
            reason: "the header padded to it would pass the format's 100,000,000-byte limit",
            upload: false,
        });
    }
    let mut head = Vec::with_capacity(LENGTH_PREFIX_SIZE + padded);
    head.extend_from_slice(&(padded as u64).to_le_bytes());
    head.extend_from_slice(&json);
    head.resize(LENGTH_PREFIX_SIZE + padded, b' ');
    Ok(Layout {
        head,
        order,
        offsets,
        data_len: offset,
    })
}

/// serde_json's string escaping: `"`, `\` and control characters escaped, the rest verbatim.
fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Writes `items` with `write_one`, separated by commas.
fn write_separated<T>(
    out: &mut Vec<u8>,
    items: impl IntoIterator<Item = T>,
    mut write_one: impl FnMut(&mut Vec<u8>, T),
) {
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_one(out, item);
    }
}

fn write_usize(out: &mut Vec<u8>, n: usize) {
    let _ = write!(out, "{n}");
}
