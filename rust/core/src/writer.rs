//! Writing files laid out exactly as the reference writes them. This module holds the entry
//! points for tensors given at once (`serialize`, `serialize_to_file`, [`PreparedFile`]); its
//! files hold the rest:
//! - `declare.rs`: what a binding declares (names, dtype values, metadata, a shard prefix, as
//!   bytes and numbers), checked once for C and C++ ([`Declarations`]);
//! - `layout.rs`: the header and where each tensor goes, from names, dtypes, shapes and
//!   metadata alone (the reference's order, the optional alignment of the data);
//! - `atomic.rs`: replacing a file atomically (the temporary file, owner, mode, xattrs);
//! - `streaming.rs`: [`StreamWriter`], a file written tensor by tensor, in pieces, from any
//!   thread, with positioned writes; `pieces.rs`: which bytes of each tensor have arrived;
//! - `sharded.rs`: [`ShardedWriter`], a checkpoint of shards and its index, published as a set;
//!   `shards.rs`: which tensor goes to which shard, and the index file's text; `publish.rs`:
//!   the set taking the place of the checkpoint already in the directory, as a transaction
//!   (`old_index.rs`: reading and repointing that checkpoint's index); `faults.rs`: the seam
//!   through which the crate's tests fail or interrupt each step of publishing
//!   (`publish_tests.rs`);
//! - `target.rs`: [`CheckpointWriter`], one file or a sharded checkpoint behind one handle, as
//!   the C API and the C++ bridge hold them.
//!
//! The reference keeps metadata in a hash map, so with two or more keys its output order
//! varies; ours is sorted.

mod atomic;
mod declare;
mod faults;
mod layout;
mod old_index;
mod pieces;
mod publish;
#[cfg(test)]
mod publish_tests;
mod sharded;
mod shards;
mod streaming;
mod target;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::view::TensorView;
use layout::{lay_out, Entry};

pub use declare::{dtype_to_write, text_to_write, Declarations};
pub use layout::MAX_ALIGNMENT;
pub use sharded::{ShardOptions, ShardedWriter};
pub use shards::{plan_shards, ShardPlan, DEFAULT_MAX_SHARD_SIZE};
pub use streaming::{StreamWriter, TensorSpec, WriteOptions};
pub use target::CheckpointWriter;

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
        PreparedFile::aligned(tensors, metadata, 0)
    }

    /// [`PreparedFile::new`] with the data buffer starting on a multiple of `alignment` bytes
    /// (0: the reference's 8; see `writer/layout.rs`). Also refuses a bad alignment
    /// (`BadAlignment`).
    pub fn aligned<S: AsRef<str>>(
        tensors: impl IntoIterator<Item = (S, TensorView<'a>)>,
        metadata: Option<&BTreeMap<String, String>>,
        alignment: usize,
    ) -> Result<PreparedFile<'a>> {
        let items: Vec<(S, TensorView<'a>)> = tensors.into_iter().collect();
        let entries: Vec<Entry<'_>> = items
            .iter()
            .map(|(name, t)| Entry {
                name: name.as_ref(),
                dtype: t.dtype,
                shape: t.shape,
                given: Some(t.data.len()),
            })
            .collect();
        let layout = lay_out(&entries, metadata, alignment)?;
        Ok(PreparedFile {
            tensors: layout.order.iter().map(|&i| items[i].1.data).collect(),
            head: layout.head,
            data_len: layout.data_len,
        })
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
    let prepared = PreparedFile::new(tensors, metadata)?;
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
    PreparedFile::new(tensors, metadata)
        .and_then(|p| p.write_file(path))
        .map_err(|e| e.in_file(path))
}

/// `e` with `note` appended to its message, for an `Io` error (others are returned as they
/// are): what a failure means for the writer and what to do next.
pub(crate) fn noted(e: Error, note: &str) -> Error {
    match e {
        Error::Io { path, op, source } => Error::Io {
            path,
            op,
            source: io::Error::new(source.kind(), format!("{source}; {note}")).into(),
        },
        Error::InFile { path, source } => Error::InFile {
            path,
            source: Box::new(noted(*source, note)),
        },
        other => other,
    }
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
