//! Writing files laid out exactly as the reference writes them: the check of every tensor
//! (name, byte length), the header layout ([`PreparedFile`]), the entry points `serialize` and
//! `serialize_to_file`, and the checks of bytes and dtype values handed over by C++. Replacing
//! the file on disk is `writer/atomic.rs`.
//!
//! Tensors are sorted by dtype, descending (so that large elements come first and stay aligned),
//! then by name; the header is compact JSON with `__metadata__` first and its keys sorted; the
//! header is padded with spaces to a multiple of 8. The reference keeps metadata in a hash map,
//! so with two or more keys its output order varies; ours does not.

mod atomic;

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Write};
use std::path::Path;

use crate::byte_len::check_tensor_byte_len;
use crate::dtype::Dtype;
use crate::error::{Error, HeaderContents, Result, TextField};
use crate::format::{LENGTH_PREFIX_SIZE, MAX_HEADER_SIZE, METADATA_KEY};
use crate::view::TensorView;

/// A file ready to be written: every tensor checked, the header laid out, the data borrowed.
///
/// [`serialize`] and [`serialize_to_file`] are built on it; use it directly to size a buffer
/// first (`len`) and fill it (`write_into`), as the C++ API does.
pub struct PreparedFile<'a> {
    head: Vec<u8>,
    tensors: Vec<&'a [u8]>,
    data_len: usize,
}

impl<'a> PreparedFile<'a> {
    /// Checks every tensor and lays out the header. Errors: `InvalidTensorName`,
    /// `DuplicateKey`, `ValidationOverflow`, `MisalignedSlice`, `TensorInvalidInfo`,
    /// `HeaderTooLarge`.
    pub fn new<S: AsRef<str>>(
        tensors: impl IntoIterator<Item = (S, TensorView<'a>)>,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<PreparedFile<'a>> {
        layout(tensors, metadata)
    }

    /// Length of the whole file in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.data_len
    }

    /// Always `false`: even an empty file has a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the file into `dst`, which must be exactly [`PreparedFile::len`] bytes.
    pub fn write_into(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.len() {
            return Err(Error::WrongBufferLength {
                buffer: "the buffer to serialize into",
                expected: self.len() as u64,
                actual: dst.len() as u64,
            });
        }
        let (head, mut rest) = dst.split_at_mut(self.head.len());
        head.copy_from_slice(&self.head);
        for t in &self.tensors {
            let (this, tail) = rest.split_at_mut(t.len());
            this.copy_from_slice(t);
            rest = tail;
        }
        Ok(())
    }

    /// Writes the file atomically at `path` (see [`serialize_to_file`]), synced to disk.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        self.write_file_with(path, Durability::Synced)
    }

    /// [`PreparedFile::write_file`] with a choice of durability.
    pub fn write_file_with(&self, path: &Path, durability: Durability) -> Result<()> {
        write_atomically_with(path, durability, |out| {
            out.write_all(&self.head)?;
            for t in &self.tensors {
                out.write_all(t)?;
            }
            Ok(())
        })
    }
}

/// Checks every tensor and lays out the header.
fn layout<'a, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, TensorView<'a>)>,
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<PreparedFile<'a>> {
    let mut items: Vec<(S, TensorView<'a>)> = tensors.into_iter().collect();
    let mut seen = HashSet::with_capacity(items.len());
    for (name, t) in &items {
        check_tensor(name.as_ref(), t)?;
        if !seen.insert(name.as_ref()) {
            return Err(Error::DuplicateKey {
                key: name.as_ref().to_owned(),
                in_metadata: false,
            });
        }
    }
    drop(seen);
    items.sort_by(|(ln, lt), (rn, rt)| {
        rt.dtype
            .cmp(&lt.dtype)
            .then_with(|| ln.as_ref().cmp(rn.as_ref()))
    });

    let mut json = Vec::with_capacity(64 + items.len() * 96);
    json.push(b'{');
    let mut first = true;
    // An empty map is written as the reference writes it, except in the one case where the
    // reference's own output is invalid JSON (no tensors): there we write `{}`.
    if let Some(meta) = metadata.filter(|m| !m.is_empty() || !items.is_empty()) {
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
    let mut data = Vec::with_capacity(items.len());
    for (name, t) in &items {
        if !first {
            json.push(b',');
        }
        first = false;
        let end = offset
            .checked_add(t.data.len())
            .ok_or_else(|| Error::ValidationOverflow {
                tensor: name.as_ref().to_owned(),
                shape: t.shape.to_vec(),
            })?;
        write_json_str(&mut json, name.as_ref());
        json.extend_from_slice(b":{\"dtype\":\"");
        json.extend_from_slice(t.dtype.name().as_bytes());
        json.extend_from_slice(b"\",\"shape\":[");
        write_separated(&mut json, t.shape, |json, d| write_usize(json, *d));
        json.extend_from_slice(b"],\"data_offsets\":[");
        write_usize(&mut json, offset);
        json.push(b',');
        write_usize(&mut json, end);
        json.extend_from_slice(b"]}");
        offset = end;
        data.push(t.data);
    }
    json.push(b'}');
    let padded = json.len().next_multiple_of(LENGTH_PREFIX_SIZE);
    if padded > MAX_HEADER_SIZE {
        return Err(Error::HeaderTooLarge {
            header_len: padded as u64,
            lfs_pointer: false,
            writing: Some(HeaderContents {
                tensors: items.len(),
                name_bytes: items.iter().map(|(n, _)| n.as_ref().len()).sum(),
                metadata_bytes: metadata
                    .map_or(0, |m| m.iter().map(|(k, v)| k.len() + v.len()).sum()),
            }),
        });
    }
    let mut head = Vec::with_capacity(LENGTH_PREFIX_SIZE + padded);
    head.extend_from_slice(&(padded as u64).to_le_bytes());
    head.extend_from_slice(&json);
    head.resize(LENGTH_PREFIX_SIZE + padded, b' ');
    Ok(PreparedFile {
        head,
        tensors: data,
        data_len: offset,
    })
}

/// Refuses a reserved name and data whose length disagrees with dtype × shape.
fn check_tensor(name: &str, t: &TensorView<'_>) -> Result<()> {
    if name == METADATA_KEY {
        return Err(Error::InvalidTensorName {
            name: name.to_owned(),
        });
    }
    check_tensor_byte_len(name, t.dtype, t.shape, t.data.len())
}

/// Header text handed over as bytes (a tensor name, a metadata key or value, from C++), as
/// UTF-8: the header is UTF-8 JSON, so other bytes cannot be written ([`Error::NotUtf8`]).
pub fn text_to_write(bytes: &[u8], field: TextField) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        Error::NotUtf8 {
            field,
            lossy: String::from_utf8_lossy(bytes).into_owned(),
            offset,
            byte: bytes[offset],
        }
    })
}

/// The dtype with enumeration value `value` (as C++ passes it) of tensor `tensor`, to be
/// written ([`Error::InvalidDtypeValue`] when there is none).
pub fn dtype_to_write(tensor: &str, value: u8) -> Result<Dtype> {
    Dtype::from_index(value).ok_or_else(|| Error::InvalidDtypeValue {
        value,
        tensor: Some(tensor.to_owned()),
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

/// Serializes tensors and optional metadata into the bytes of a safetensors file.
///
/// ```
/// use safetensors_core::{serialize, Dtype, TensorView};
/// let data = [0u8; 16];
/// let bytes = serialize([("test", TensorView::new(Dtype::I32, &[2, 2], &data))], None).unwrap();
/// assert_eq!(&bytes[8..72], br#"{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}    "#);
/// ```
pub fn serialize<'a, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, TensorView<'a>)>,
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>> {
    let prepared = layout(tensors, metadata)?;
    let mut out = vec![0u8; prepared.len()];
    prepared.write_into(&mut out)?;
    Ok(out)
}

/// Writes a safetensors file atomically: the bytes go to a temporary file in the target's
/// directory, which is synced and then renamed over `path`. A crash or an error never leaves a
/// partial file under `path`, an existing file there is untouched on error, and a process that
/// has the old file mapped keeps reading the old bytes. An existing file's permissions are kept.
pub fn serialize_to_file<'a, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, TensorView<'a>)>,
    metadata: Option<&BTreeMap<String, String>>,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    layout(tensors, metadata)
        .and_then(|p| p.write_file(path))
        .map_err(|e| e.in_file(path))
}

/// Whether a write waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `fsync` the new file before renaming it, and the directory after: the file survives a
    /// power loss once the call returns. The default.
    #[default]
    Synced,
    /// Rename without waiting for the disk. Still atomic for readers and against a crash of the
    /// process; a power loss soon after may leave the old file, or an empty one, under the name.
    /// (Python's `save_file` behaves like this.)
    Unsynced,
}

/// Runs `fill` on a fresh temporary file beside `path`, syncs it, and renames it over `path`.
/// On any failure the temporary file is removed and `path` is left as it was.
pub fn write_atomically(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    write_atomically_with(path, Durability::Synced, fill)
}

/// [`write_atomically`] with a choice of durability.
///
/// `path` may be a symlink: the file it points to is replaced and the link kept. A directory,
/// FIFO, socket or device node at `path` is refused with `Io`. An existing file keeps its
/// permission bits, and its owner and group where the process may set them. See
/// `writer/atomic.rs` for the temporary file's life.
pub fn write_atomically_with(
    path: &Path,
    durability: Durability,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    atomic::replace(path, durability == Durability::Synced, fill)
}
