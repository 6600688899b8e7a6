//! [`StreamWriter`]: one file written tensor by tensor, for checkpoints larger than memory and
//! tensors that arrive over time (copied off a GPU, produced by a training step).
//!
//! Decisions (docs/writing.md states them for users):
//! - The tensors (name, dtype, shape) and the metadata are declared up front. They alone decide
//!   the header and where every tensor's bytes go (`layout.rs`), so the header is written
//!   first and each piece is placed with a positioned write (`pwrite`) at its offset, in any
//!   order, from any thread; the file is byte-identical to `serialize` of the same tensors.
//! - Memory: the header, and per tensor its written ranges (`pieces.rs`); the bytes go from the
//!   caller's buffers to the file with no copy, whatever the file's size.
//! - The file is the same staged temporary file as `save_file`'s (`atomic.rs`): nothing appears
//!   under the target's name before [`StreamWriter::finish`] has checked that every byte of
//!   every tensor arrived, a writer dropped or killed before that leaves nothing, and the
//!   target keeps its owner, mode and extended attributes.
//! - The whole file is reserved on the disk when the writer is made (`fallocate`, where the
//!   filesystem has it), so a disk too small fails then (`ENOSPC`), before any byte is written;
//!   where it cannot be reserved, a full disk fails the write that meets it. Either way the
//!   target is untouched and the temporary file goes with the writer.
//! - After a failed write (the disk, not the caller's piece), or a failed sync when finishing,
//!   every later call reports that first error: the file can no longer be trusted to be complete.
//! - A `finish` that fails on anything else leaves the writer as it was, to be finished again
//!   once the cause is fixed: bytes missing (write them), the rename refused (a directory at the
//!   target's name, permissions, a full directory). Nothing was published; the temporary file
//!   stays (hidden `.st-*.tmp` once a rename was tried on it, removed with the writer). After a
//!   `finish` that succeeded the writer refuses everything (`Internal`: the file is no longer
//!   its own).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::atomic::{sync_dir, Staged};
use super::faults::{step, Halt};
use super::layout::{lay_out, Entry};
use super::pieces::Pieces;
use super::{noted, Durability};
use crate::dtype::Dtype;
use crate::error::{Error, PieceProblem, Result};

/// A tensor declared to a writer before its bytes: its name, dtype and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The name.
    pub name: String,
    /// The element type.
    pub dtype: Dtype,
    /// The dimensions, outermost first (empty for a scalar).
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }
}

/// How a streaming writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOptions {
    /// Whether finishing waits for the disk.
    pub durability: Durability,
    /// The boundary the data buffer starts on in the file: 0 for the reference's layout (8), or
    /// a power of two up to [`super::MAX_ALIGNMENT`] (see `writer/layout.rs`).
    pub alignment: usize,
}

/// One declared tensor: where it goes and what has arrived.
struct Slot {
    name: String,
    /// Its first byte in the file.
    at: u64,
    len: u64,
    pieces: Mutex<Pieces>,
}

/// A safetensors file written in pieces (see the module documentation).
///
/// ```
/// use safetensors_core::{Dtype, StreamWriter, TensorSpec, WriteOptions};
/// # let dir = std::env::temp_dir().join(format!("stream-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let specs = [TensorSpec::new("w", Dtype::U8, &[4])];
/// let path = dir.join("out.safetensors");
/// let mut w = StreamWriter::create(&path, &specs, None, WriteOptions::default())?;
/// w.write_at("w", 2, &[3, 4])?;
/// w.write_at("w", 0, &[1, 2])?;
/// w.finish()?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub struct StreamWriter {
    /// The target as the caller named it.
    path: PathBuf,
    staged: Staged,
    durability: Durability,
    /// In declaration order.
    slots: Vec<Slot>,
    by_name: HashMap<String, usize>,
    /// Positions in `slots`, in file order (the order `finish` checks them in).
    file_order: Vec<usize>,
    file_len: u64,
    /// The first failed write, reported by every later call.
    failed: Mutex<Option<Error>>,
    /// Whether `finish` put the file in place.
    published: bool,
}

impl StreamWriter {
    /// Lays the file out from `tensors` and `metadata`, creates its temporary file beside `path`
    /// and writes the header. Errors: those of `serialize` for the declarations
    /// (`InvalidTensorName`, `DuplicateKey`, `ValidationOverflow`, `MisalignedSlice`,
    /// `TensorInvalidInfo` for more than 1024 dimensions, `HeaderTooLarge`), `BadAlignment`,
    /// and `Io` (the directory, or not enough space for the file), each naming `path`.
    pub fn create(
        path: impl AsRef<Path>,
        tensors: &[TensorSpec],
        metadata: Option<&BTreeMap<String, String>>,
        options: WriteOptions,
    ) -> Result<StreamWriter> {
        let path = path.as_ref();
        StreamWriter::create_inner(path, tensors, metadata, options).map_err(|e| e.in_file(path))
    }

    fn create_inner(
        path: &Path,
        tensors: &[TensorSpec],
        metadata: Option<&BTreeMap<String, String>>,
        options: WriteOptions,
    ) -> Result<StreamWriter> {
        let entries: Vec<Entry<'_>> = tensors
            .iter()
            .map(|t| Entry {
                name: &t.name,
                dtype: t.dtype,
                shape: &t.shape,
                given: None,
            })
            .collect();
        let layout = lay_out(&entries, metadata, options.alignment)?;
        let head_len = layout.head.len() as u64;
        let slots: Vec<Slot> = tensors
            .iter()
            .zip(&layout.offsets)
            .map(|(t, &(begin, end))| Slot {
                name: t.name.clone(),
                at: head_len + begin as u64,
                len: (end - begin) as u64,
                pieces: Mutex::new(Pieces::default()),
            })
            .collect();
        let by_name = slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let file_len = head_len + layout.data_len as u64;
        let staged = Staged::create(path)?;
        reserve(staged.file(), file_len)
            .map_err(|e| Error::io(path, "reserve disk space for the file", e))?;
        staged
            .file()
            .write_all_at(&layout.head, 0)
            .map_err(|e| Error::io(path, "write", e))?;
        Ok(StreamWriter {
            path: path.to_path_buf(),
            staged,
            durability: options.durability,
            slots,
            by_name,
            file_order: layout.order,
            file_len,
            failed: Mutex::new(None),
            published: false,
        })
    }

    /// The target's path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The length the file will have.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Number of declared tensors.
    pub fn tensor_count(&self) -> usize {
        self.slots.len()
    }

    /// The position of `name` among the declared tensors (`TensorNotFound`).
    pub fn position(&self, name: &str) -> Result<usize> {
        self.by_name.get(name).copied().ok_or_else(|| {
            Error::TensorNotFound {
                name: name.to_owned(),
            }
            .in_file(&self.path)
        })
    }

    /// Bytes of the declared tensor at `index` (declaration order); 0 past the end.
    pub fn tensor_len(&self, index: usize) -> u64 {
        self.slots.get(index).map_or(0, |s| s.len)
    }

    /// The name of the declared tensor at `index` ("" past the end).
    pub fn tensor_name(&self, index: usize) -> &str {
        self.slots.get(index).map_or("", |s| s.name.as_str())
    }

    /// Where the declared tensor at `index` starts in the file; 0 past the end.
    pub fn tensor_file_offset(&self, index: usize) -> u64 {
        self.slots.get(index).map_or(0, |s| s.at)
    }

    /// Writes all of tensor `name` at once: `bytes` must be exactly its dtype × shape.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let index = self.position(name)?;
        let slot = &self.slots[index];
        if bytes.len() as u64 != slot.len {
            return Err(self.piece_error(
                slot,
                PieceProblem::Long {
                    offset: 0,
                    len: bytes.len() as u64,
                    tensor_len: slot.len,
                    whole: true,
                },
            ));
        }
        self.write_index(index, 0, bytes)
    }

    /// Writes `bytes` at byte `offset` of tensor `name`. Pieces may come in any order and from
    /// any thread; each byte is written once (`InvalidOffset` for a piece overlapping bytes
    /// already written, `TensorInvalidInfo` for one ending past the tensor).
    pub fn write_at(&self, name: &str, offset: u64, bytes: &[u8]) -> Result<()> {
        self.write_index(self.position(name)?, offset, bytes)
    }

    /// [`StreamWriter::write_at`] for the declared tensor at `index` (declaration order).
    pub fn write_index(&self, index: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        self.check_open()?;
        let slot = self.slots.get(index).ok_or_else(|| Error::Internal {
            message: format!(
                "tensor position {index} of a writer of {} tensors",
                self.slots.len()
            ),
        })?;
        crate::tsan::lock(&slot.pieces)
            .reserve(offset, bytes.len() as u64, slot.len)
            .map_err(|problem| self.piece_error(slot, problem))?;
        if let Err(e) = self.staged.file().write_all_at(bytes, slot.at + offset) {
            let e = Error::io(&self.path, "write", e);
            crate::tsan::lock(&self.failed).get_or_insert_with(|| e.clone());
            return Err(e);
        }
        Ok(())
    }

    fn piece_error(&self, slot: &Slot, problem: PieceProblem) -> Error {
        Error::Piece {
            tensor: slot.name.clone(),
            problem,
        }
        .in_file(&self.path)
    }

    /// Refuses every call after a failed write or a `finish` that published.
    fn check_open(&self) -> Result<()> {
        if self.published {
            return Err(published(&self.path));
        }
        match &*crate::tsan::lock(&self.failed) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Records `e` as the writer's failure, reported by every later call.
    pub(crate) fn fail(&self, e: Error) -> Error {
        crate::tsan::lock(&self.failed)
            .get_or_insert_with(|| e)
            .clone()
    }

    /// Checks that every byte of every tensor arrived (`MetadataIncompleteBuffer` naming the
    /// first tensor, in file order, with bytes missing) and that no write failed.
    pub(crate) fn check_complete(&self) -> Result<()> {
        self.check_open()?;
        for &i in &self.file_order {
            let slot = &self.slots[i];
            let pieces = crate::tsan::lock(&slot.pieces);
            if let Some(problem) = pieces.missing(slot.len) {
                return Err(self.piece_error(slot, problem));
            }
        }
        Ok(())
    }

    /// The file, to be synced and published with others (`sharded.rs`).
    pub(crate) fn staged(&mut self) -> &mut Staged {
        &mut self.staged
    }

    /// Syncs the file to disk; a failure fails the writer (see the module documentation).
    pub(crate) fn sync(&self) -> Result<()> {
        self.staged.sync().map_err(|e| {
            self.fail(noted(
                e.in_file(&self.path),
                "the disk may not hold what was written: write the file again",
            ))
        })
    }

    /// Marks the file as published by its set (`sharded.rs`): the writer refuses writes.
    pub(crate) fn set_published(&mut self) {
        self.published = true;
    }

    /// Checks that the file is complete, then puts it in place atomically (synced unless the
    /// options said otherwise). On an error nothing is published, and unless the error was the
    /// disk's (a failed write or sync, reported again by every later call) the writer may be
    /// finished again once the cause is fixed: write the missing bytes, or clear the target's
    /// name. After success every call is refused.
    pub fn finish(&mut self) -> Result<()> {
        self.check_complete()?;
        let synced = self.durability == Durability::Synced;
        if synced {
            self.sync()?;
        }
        let target = self.staged.target();
        step("rename the file into place", || self.staged.persist_io()).map_err(|h| match h {
            Halt::Failed(e) => noted(
                Error::io(&self.path, "rename", e),
                "nothing was published: the target is as it was, and `finish` may be called \
                 again once the cause is fixed",
            ),
            Halt::Crashed => Error::Internal {
                message: "the test's simulated crash".into(),
            },
        })?;
        self.published = true;
        if synced {
            if let Some(dir) = target.parent() {
                sync_dir(dir);
            }
        }
        Ok(())
    }
}

/// The error of a call on a writer that published its file.
pub(crate) fn published(path: &Path) -> Error {
    Error::Internal {
        message: format!(
            "{}: this writer has already published its file; make a new writer to write again",
            path.display()
        ),
    }
}

/// Reserves `len` bytes for `file` on the disk, so that a disk too small is known now. A
/// filesystem without `fallocate` (or where it is refused for this file) is not an error: the
/// writes then meet a full disk themselves.
fn reserve(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let Ok(len) = libc::off_t::try_from(len) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: a plain syscall on a descriptor we own.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => Ok(()),
        _ => Err(e),
    }
}
