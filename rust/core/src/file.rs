//! Opening files: a read-only memory map, or positioned reads on demand.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;

use crate::direct::DirectFile;
use crate::error::{Error, Result};
use crate::header::{read_header_len, Header, TensorInfo, N_LEN};
use crate::slice::{Indexer, SlicePlan};
use crate::view::{view_of, TensorView};

/// How a [`SafeFile`] reaches tensor bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Backend {
    /// Map the file read-only; views point into the mapping (zero copy). The default.
    #[default]
    Mmap = 0,
    /// Read the header at open, then read tensor bytes with `pread` when asked. For network
    /// filesystems, unified-memory machines, and files another process may truncate.
    Read = 1,
    /// Like `Read`, but with `O_DIRECT` (bypassing the page cache) into aligned buffers, for
    /// cold loads at the disk's speed; falls back to `pread` where the filesystem refuses
    /// `O_DIRECT` ([`SafeFile::direct_fallback`] says why). See `direct.rs`.
    Direct = 2,
}

enum Storage {
    Mapped(Mmap),
    Reader(File),
    Direct(DirectFile),
}

/// An open safetensors file: its validated header, plus the mapping or file handle.
///
/// ```no_run
/// use safetensors_core::{Backend, SafeFile};
/// let file = SafeFile::open("model.safetensors", Backend::Mmap)?;
/// let bytes = file.tensor_bytes("wte.weight")?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub struct SafeFile {
    path: PathBuf,
    header: Header,
    storage: Storage,
    bytes_read: AtomicU64,
}

/// How much of the file is read first: one page, which holds the length prefix and many small
/// headers whole. The rest of the header, when there is more, is read exactly.
const FIRST_READ: usize = 4096;

/// Largest header the mapped backend copies out with `pread` rather than parsing it in the
/// mapping: reading is cheaper than faulting in the mapping's first pages (measured ~10 µs of a
/// ~70 µs open), until the copy itself costs more.
const HEADER_COPY_LIMIT: usize = 256 * 1024;

impl SafeFile {
    /// Opens and validates `path`. Errors name the file.
    pub fn open(path: impl AsRef<Path>, backend: Backend) -> Result<SafeFile> {
        let path = path.as_ref();
        Self::open_inner(path, backend).map_err(|e| e.in_file(path))
    }

    fn open_inner(path: &Path, backend: Backend) -> Result<SafeFile> {
        // O_NONBLOCK so that opening a FIFO by mistake fails below instead of blocking forever;
        // it has no effect on regular files.
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io(path, "open", e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
        if !meta.is_file() {
            let what = if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Err(Error::io(
                path,
                "open",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what}, not a safetensors file"),
                ),
            ));
        }
        let len = meta.len();
        let (header, storage) = match backend {
            Backend::Mmap => {
                if len < N_LEN as u64 {
                    return Err(Error::HeaderTooSmall { len });
                }
                // Small headers are read with pread and parsed from that copy; larger ones are
                // parsed straight from the mapping (see HEADER_COPY_LIMIT).
                let mut head = read_head(&file, path, len)?;
                // SAFETY: the mapping is read-only. Another process truncating the file while it
                // is mapped makes later accesses fault; that is documented, and the read backend
                // exists for files that may change.
                let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "mmap", e))?;
                let header = match read_header_len(&head, len) {
                    Ok(n) if N_LEN + n <= HEADER_COPY_LIMIT => {
                        read_rest(&file, path, &mut head, N_LEN + n)?;
                        Header::parse_prefix(&head, len)?
                    }
                    _ => Header::parse(&map)?,
                };
                (header, Storage::Mapped(map))
            }
            Backend::Read => (read_header(&file, path, len)?, Storage::Reader(file)),
            Backend::Direct => (
                read_header(&file, path, len)?,
                Storage::Direct(DirectFile::open(path, file)),
            ),
        };
        Ok(SafeFile {
            path: path.to_path_buf(),
            header,
            storage,
            bytes_read: AtomicU64::new(0),
        })
    }

    /// The file's path, as given to [`SafeFile::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Which backend this file uses.
    pub fn backend(&self) -> Backend {
        match self.storage {
            Storage::Mapped(_) => Backend::Mmap,
            Storage::Reader(_) => Backend::Read,
            Storage::Direct(_) => Backend::Direct,
        }
    }

    /// With [`Backend::Direct`], why reads go through the page cache after all (the filesystem
    /// refused `O_DIRECT`); `None` while they bypass it, and for the other backends.
    pub fn direct_fallback(&self) -> Option<&str> {
        match &self.storage {
            Storage::Direct(d) => d.fallback(),
            _ => None,
        }
    }

    /// The whole data buffer, when the file is mapped.
    pub fn mapped_data(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Mapped(map) => Some(&map[self.header.data_start()..]),
            Storage::Reader(_) | Storage::Direct(_) => None,
        }
    }

    /// A tensor's description, or [`Error::TensorNotFound`] naming this file.
    pub fn info(&self, name: &str) -> Result<TensorInfo<'_>> {
        self.header.tensor(name).map_err(|e| e.in_file(&self.path))
    }

    /// A zero-copy view of a tensor when mapped; `None` with the read backend.
    pub fn view(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let info = self.info(name)?;
        Ok(self.mapped_data().map(|data| view_of(info, data)))
    }

    /// A tensor's bytes: borrowed from the mapping, or read into a new buffer.
    pub fn tensor_bytes(&self, name: &str) -> Result<Cow<'_, [u8]>> {
        let info = self.info(name)?;
        let (begin, end) = info.data_offsets;
        match &self.storage {
            Storage::Mapped(_) => Ok(Cow::Borrowed(
                &self.mapped_data().unwrap_or(&[])[begin..end],
            )),
            Storage::Reader(_) | Storage::Direct(_) => {
                let mut out = vec![0u8; end - begin];
                self.read_data(begin as u64, &mut out)?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// Copies `dst.len()` bytes of the data buffer, starting at `offset`, into `dst`.
    pub fn read_data(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(dst.len() as u64)
            .filter(|&end| end <= self.header.data_len() as u64)
            .ok_or_else(|| {
                Error::io(
                    &self.path,
                    "read",
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "range {offset}+{} is outside the {}-byte data buffer",
                            dst.len(),
                            self.header.data_len()
                        ),
                    ),
                )
            })?;
        match &self.storage {
            Storage::Mapped(map) => {
                let start = self.header.data_start() + offset as usize;
                dst.copy_from_slice(&map[start..self.header.data_start() + end as usize]);
            }
            Storage::Reader(_) | Storage::Direct(_) => {
                let at = self.header.data_start() as u64 + offset;
                let read = match &self.storage {
                    Storage::Direct(d) => d.read_exact_at(dst, at),
                    Storage::Reader(file) => file.read_exact_at(dst, at),
                    Storage::Mapped(_) => Ok(()),
                };
                read.map_err(|e| {
                    let e = if e.kind() == io::ErrorKind::UnexpectedEof {
                        io::Error::new(
                            e.kind(),
                            "the file is shorter than its header says; was it truncated or \
                             replaced while open?",
                        )
                    } else {
                        e
                    };
                    Error::io(&self.path, "read", e)
                })?;
                self.bytes_read
                    .fetch_add(dst.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Plans a slice of tensor `name` (see [`SlicePlan`]).
    pub fn plan_slice(&self, name: &str, indexers: &[Indexer]) -> Result<SlicePlan> {
        let info = self.info(name)?;
        SlicePlan::new(&info, indexers).map_err(|e| e.in_file(&self.path))
    }

    /// Copies the bytes a slice plan selects from tensor `name` into `dst`, which must be
    /// exactly [`SlicePlan::byte_len`] long. Only the selected bytes are read.
    pub fn read_slice(&self, name: &str, plan: &SlicePlan, dst: &mut [u8]) -> Result<()> {
        let info = self.info(name)?;
        self.read_slice_of(&info, plan, dst)
    }

    /// [`SafeFile::read_slice`] for a tensor already looked up.
    pub fn read_slice_of(
        &self,
        info: &TensorInfo<'_>,
        plan: &SlicePlan,
        dst: &mut [u8],
    ) -> Result<()> {
        plan.check_fits(info, dst.len())
            .map_err(|e| e.in_file(&self.path))?;
        let base = info.data_offsets.0 as u64;
        let mut at = 0usize;
        for (offset, len) in plan.runs() {
            self.read_data(base + offset as u64, &mut dst[at..at + len])?;
            at += len;
        }
        Ok(())
    }

    /// Data bytes fetched by the read backend so far (0 for the mapped backend, whose reads the
    /// kernel does on demand).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
}

/// The first block of the file (up to 64 KiB).
fn read_head(file: &File, path: &Path, len: u64) -> Result<Vec<u8>> {
    let first = len.min(FIRST_READ as u64) as usize;
    let mut head = vec![0u8; first];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, "read", e))?;
    Ok(head)
}

/// Extends `head` (the file's first bytes) to `needed` bytes.
fn read_rest(file: &File, path: &Path, head: &mut Vec<u8>, needed: usize) -> Result<()> {
    let have = head.len();
    if needed > have {
        head.resize(needed, 0);
        file.read_exact_at(&mut head[have..], have as u64)
            .map_err(|e| Error::io(path, "read", e))?;
    }
    Ok(())
}

/// Reads and validates the header with positioned reads: first a small block, then, only once
/// the length prefix has passed its checks (so a hostile length allocates nothing), the rest.
fn read_header(file: &File, path: &Path, len: u64) -> Result<Header> {
    let mut head = read_head(file, path, len)?;
    let header_len = read_header_len(&head, len)?;
    read_rest(file, path, &mut head, N_LEN + header_len)?;
    Header::parse_prefix(&head, len)
}
