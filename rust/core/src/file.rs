//! Opening files: a read-only memory map, positioned reads on demand, or bytes already in
//! memory ([`SafeFile::from_memory`]). How a path is opened (once, or again) is `open.rs`.
//!
//! Every source of bytes is validated the same way: [`parse_allowing`] over the header bytes
//! and the length of the whole input (the mapping's, the file's, or the buffer's).
//!
//! Here: [`SafeFile`] and its reads. Beside it: the options (`options.rs`), the mapping's
//! lifecycle (`mapping.rs`), header reads (`head.rs`), many reads at once (`many.rs`).

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::direct::{DirectFile, DirectOp};
use crate::error::{Error, Result};
use crate::format::LENGTH_PREFIX_SIZE;
use crate::header::{read_header_len, Header, TensorInfo};
pub(crate) use crate::open::{open_regular, read_regular, zeroed};
use crate::open::{reopen, Identity};
use crate::view::{view_of, TensorView};

/// Where the bytes of a file that is neither on a local disk nor in memory come from, for
/// [`SafeFile::from_source`]: a remote object fetched on demand. Offsets are the file's own
/// (the length prefix is at 0). Errors are returned as they are (a remote source's errors
/// already name its URL and say what the server did).
pub trait RangeSource: Send + Sync {
    /// Fills each `(at, dst)` with the file's bytes `[at, at + dst.len())`. The runs never
    /// overlap (every caller sees to it: [`SafeFile::read_batch`] refuses overlapping ones) and
    /// are usually in ascending order (a slice's rows); a source may coalesce them, fetch them
    /// concurrently and write straight into them. All or nothing: on an error, what the
    /// buffers hold is unspecified.
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()>;
}

/// Most runs of a slice handed to a [`RangeSource`] in one call. A source keeps some 40 bytes
/// of bookkeeping per run (the run, its place in offset order, and what it spans), so a slice
/// of millions of one-element runs would otherwise hold many times its own size; calls of this
/// many runs (about 40 MiB of it) still each fetch plenty concurrently.
const RANGED_RUNS: usize = 1 << 20;

/// Bytes a caller holds, for [`SafeFile::from_memory`]: anything that can lend a byte slice
/// for as long as the file lives (a `Vec<u8>`, an `Arc<[u8]>`, a bridge's borrowed buffer).
pub type MemoryBytes = Box<dyn AsRef<[u8]> + Send + Sync>;

enum Storage {
    /// The mapped backend: mapped at open, or at the first access of tensor bytes
    /// ([`LazyMap`]).
    Mapped(LazyMap),
    Reader(Reader),
    Direct(DirectFile),
    /// A complete file in memory; views borrow it like the mapping.
    Memory(MemoryBytes),
    /// Only the header: the data was never fetched ([`SafeFile::header_only`]). Every read of
    /// tensor bytes is an `Io` error saying so.
    HeaderOnly,
    /// Bytes fetched from a [`RangeSource`] when read ([`SafeFile::from_source`]).
    Ranged(Box<dyn RangeSource>),
}

/// How the read backend reaches the file.
enum Reader {
    /// One descriptor, held for the life of the [`SafeFile`].
    Held(File),
    /// No descriptor between reads: each read operation opens the path again and checks that it
    /// is still the file whose header was validated ([`reopen`]). Checkpoint shards use this,
    /// so that a checkpoint of thousands of shards does not hold thousands of descriptors; a
    /// shard replaced since it was opened is an `Io` error, never other data.
    Reopen,
}

/// A descriptor for one read operation: borrowed when held, opened for the operation otherwise,
/// or the direct backend's reader.
enum Handle<'a> {
    Borrowed(&'a File),
    Owned(File),
    Direct(DirectOp<'a>),
    Ranged(&'a dyn RangeSource),
}

impl Handle<'_> {
    /// Reads `dst.len()` bytes at file offset `at` of `file`. A local file's I/O error is named
    /// by `file`; a ranged source's error is its own (it names its URL).
    fn read_exact_at(&self, file: &SafeFile, dst: &mut [u8], at: u64) -> Result<()> {
        let local = match self {
            Handle::Borrowed(f) => parallel::read_exact_at(f, dst, at),
            Handle::Owned(f) => parallel::read_exact_at(f, dst, at),
            Handle::Direct(d) => d.read_exact_at(dst, at),
            Handle::Ranged(r) => return r.read_runs(&mut [(at, dst)]),
        };
        local.map_err(|e| file.read_failed(e))
    }
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
    /// The identity of the file opened (`None` for bytes in memory): what every later open of
    /// `path` (a shard's reads, prefetch threads) must find again.
    identity: Option<Identity>,
    header: Header,
    storage: Storage,
    bytes_read: AtomicU64,
    trailing: u64,
}

impl SafeFile {
    /// Opens and validates `path`. Errors name the file.
    pub fn open(path: impl AsRef<Path>, backend: Backend) -> Result<SafeFile> {
        Self::open_with(
            path,
            OpenOptions {
                backend,
                ..OpenOptions::default()
            },
        )
    }

    /// [`SafeFile::open`] with every option.
    pub fn open_with(path: impl AsRef<Path>, options: OpenOptions) -> Result<SafeFile> {
        let path = path.as_ref();
        Self::open_inner(path, options, true).map_err(|e| e.in_file(path))
    }

    /// Validates a complete safetensors file held in memory; views borrow `bytes` (no copy).
    /// `name` stands for the file in error messages (e.g. `<memory>` or a URL). The checks are
    /// the ones a file on disk gets, in the same order, against `bytes.len()`.
    ///
    /// ```
    /// use safetensors_core::{serialize, Dtype, OpenOptions, SafeFile, TensorView};
    /// let bytes = serialize([("w", TensorView::new(Dtype::U8, &[2], &[1, 2]))], None)?;
    /// let file = SafeFile::from_memory("<memory>", Box::new(bytes), OpenOptions::default())?;
    /// assert_eq!(&*file.tensor_bytes("w")?, &[1, 2]);
    /// # Ok::<(), safetensors_core::Error>(())
    /// ```
    pub fn from_memory(
        name: impl AsRef<Path>,
        bytes: MemoryBytes,
        options: OpenOptions,
    ) -> Result<SafeFile> {
        let name = name.as_ref();
        let parsed = {
            let data: &[u8] = (*bytes).as_ref();
            parse_allowing(data, data.len() as u64, options.allow_trailing_bytes)
        };
        let (header, trailing) = parsed.map_err(|e| e.in_file(name))?;
        Ok(SafeFile {
            path: name.to_path_buf(),
            identity: None,
            header,
            storage: Storage::Memory(bytes),
            bytes_read: AtomicU64::new(0),
            trailing,
        })
    }

    /// Validates the first bytes of a file (at least its `8 + N` header bytes) against the
    /// file's length `len`, with every check [`SafeFile::open`] makes, in the same order; returns
    /// the header and the count of bytes after the last tensor (non-zero only when
    /// `allow_trailing_bytes`). For sources that fetch the header before the data (remote
    /// objects), so that a hostile header is refused before any data is fetched or allocated.
    pub fn validate_header(
        head: &[u8],
        len: u64,
        allow_trailing_bytes: bool,
    ) -> Result<(Header, u64)> {
        parse_allowing(head, len, allow_trailing_bytes)
    }

    /// A file of which only the first bytes are at hand (`head`: at least its `8 + N` header
    /// bytes) and whose length is `len`: the header is validated with every check
    /// [`SafeFile::open`] makes, and its tensors can be listed and described, but every read
    /// of tensor bytes is an `Io` error saying that only the header was fetched. For remote
    /// files opened for their header alone (`safetensors inspect URL`). `name` stands for the
    /// file in messages.
    ///
    /// ```
    /// use safetensors_core::{serialize, Dtype, OpenOptions, SafeFile, TensorView};
    /// let bytes = serialize([("w", TensorView::new(Dtype::U8, &[2], &[1, 2]))], None)?;
    /// let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    /// let f = SafeFile::header_only("<url>", &bytes[..8 + n], bytes.len() as u64,
    ///                               OpenOptions::default())?;
    /// assert_eq!(f.info("w")?.shape, &[2]);
    /// assert!(f.tensor_bytes("w").is_err());
    /// # Ok::<(), safetensors_core::Error>(())
    /// ```
    pub fn header_only(
        name: impl AsRef<Path>,
        head: &[u8],
        len: u64,
        options: OpenOptions,
    ) -> Result<SafeFile> {
        Self::from_head(name.as_ref(), head, len, Storage::HeaderOnly, options)
    }

    /// A file of which the header is at hand (`head`) and whose bytes `storage` reaches: the
    /// header validated against `len` with every check a local file gets.
    fn from_head(
        name: &Path,
        head: &[u8],
        len: u64,
        storage: Storage,
        options: OpenOptions,
    ) -> Result<SafeFile> {
        let (header, trailing) =
            parse_allowing(head, len, options.allow_trailing_bytes).map_err(|e| e.in_file(name))?;
        Ok(SafeFile {
            path: name.to_path_buf(),
            identity: None,
            header,
            storage,
            bytes_read: AtomicU64::new(0),
            trailing,
        })
    }

    /// A file whose header is at hand (`head`: at least its `8 + N` header bytes) and whose
    /// `len` bytes are read from `source` when asked: the header is validated with every check
    /// [`SafeFile::open`] makes, and every read of tensor bytes (a tensor, a slice's runs, a
    /// stream's pieces, an upload's) asks `source` for exactly the bytes it needs. It reports
    /// [`Backend::Read`]; nothing is mapped and nothing is prefetched (it has no local path).
    /// For remote objects read on demand. `name` stands for the file in messages.
    pub fn from_source(
        name: impl AsRef<Path>,
        head: &[u8],
        len: u64,
        source: Box<dyn RangeSource>,
        options: OpenOptions,
    ) -> Result<SafeFile> {
        Self::from_head(name.as_ref(), head, len, Storage::Ranged(source), options)
    }

    /// [`SafeFile::open`] for a checkpoint shard: with the read backend, no descriptor is kept
    /// between reads (see [`Reader::Reopen`]). `path` should be absolute, since it is opened
    /// again later.
    pub(crate) fn open_unheld(path: &Path, options: OpenOptions) -> Result<SafeFile> {
        Self::open_inner(path, options, false).map_err(|e| e.in_file(path))
    }

    fn open_inner(path: &Path, options: OpenOptions, hold: bool) -> Result<SafeFile> {
        let allow = options.allow_trailing_bytes;
        let (file, meta) = open_regular(path, "a safetensors file")?;
        let ((header, trailing), storage) = match options.backend {
            Backend::Mmap
                if hold
                    && options.populate == Populate::Lazy
                    && descriptors_to_spare(file.as_raw_fd()) =>
            {
                // Mapped at the first access of tensor bytes (see `LazyMap`), when the header
                // is small enough to be read by `pread` (see HEADER_COPY_LIMIT); validated,
                // like the read backend's, against the file's length now.
                #[cfg(test)]
                tests::before_map(path);
                let len = meta.len();
                if len < LENGTH_PREFIX_SIZE as u64 {
                    return Err(Error::HeaderTooSmall { len });
                }
                let mut head = read_head(&file, path, len)?;
                match read_header_len(&head, len) {
                    Ok(n) if LENGTH_PREFIX_SIZE + n <= HEADER_COPY_LIMIT => {
                        read_rest(&file, path, &mut head, LENGTH_PREFIX_SIZE + n)?;
                        let header = parse_allowing(&head, len, allow)?;
                        (
                            header,
                            Storage::Mapped(LazyMap::deferred(file, options.huge_pages)),
                        )
                    }
                    _ => map_and_parse(&file, path, options)?,
                }
            }
            Backend::Mmap => {
                if meta.len() < LENGTH_PREFIX_SIZE as u64 {
                    return Err(Error::HeaderTooSmall { len: meta.len() });
                }
                map_and_parse(&file, path, options)?
            }
            Backend::Read => {
                let header = read_header(&file, path, meta.len(), allow)?;
                let reader = if hold {
                    Reader::Held(file)
                } else {
                    Reader::Reopen
                };
                (header, Storage::Reader(reader))
            }
            Backend::Direct => {
                let header = read_header(&file, path, meta.len(), allow)?;
                let direct = DirectFile::open(path, file, &meta, hold)
                    .map_err(|e| Error::io(path, "open", e))?;
                (header, Storage::Direct(direct))
            }
        };
        Ok(SafeFile {
            path: path.to_path_buf(),
            identity: Some(Identity::of(&meta)),
            header,
            storage,
            bytes_read: AtomicU64::new(0),
            trailing,
        })
    }

    /// The identity (device, inode, size, modification time) of the file opened; `None` for
    /// bytes in memory. Whatever opens [`SafeFile::path`] again must find this file.
    pub(crate) fn identity(&self) -> Option<Identity> {
        self.identity
    }

    /// Bytes after the last tensor: 0 unless opened with
    /// [`OpenOptions::allow_trailing_bytes`] (without it such a file does not open).
    pub fn trailing_bytes(&self) -> u64 {
        self.trailing
    }

    /// Whether the file's bytes are a caller's memory ([`SafeFile::from_memory`]).
    pub fn is_in_memory(&self) -> bool {
        matches!(self.storage, Storage::Memory(_))
    }

    /// The file's path, as given to [`SafeFile::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Which backend this file uses. Bytes in memory report `Mmap`: views borrow them with no
    /// copy, as from a mapping ([`SafeFile::is_in_memory`] tells them apart). A header-only
    /// file ([`SafeFile::header_only`]) reports `Read`: nothing is mapped, and reads fail; so
    /// does a file whose bytes come from a [`RangeSource`] ([`SafeFile::from_source`]).
    pub fn backend(&self) -> Backend {
        match self.storage {
            Storage::Mapped(_) | Storage::Memory(_) => Backend::Mmap,
            Storage::Reader(_) | Storage::HeaderOnly | Storage::Ranged(_) => Backend::Read,
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

    /// The whole data buffer, when the file is mapped or in memory (`None` for the other
    /// backends). A file whose mapping was deferred (see [`Populate::Lazy`]) is mapped now,
    /// which can fail: `Io` when the system refuses the mapping, or when the file was
    /// truncated since it was opened.
    pub fn mapped_data(&self) -> Result<Option<&[u8]>> {
        // The header was validated against this length (the mapping's checked when it was
        // made, the buffer's at open), so the range is inside it; `get` keeps that a checked
        // fact rather than an assumption. Trailing bytes (when allowed) lie past `file_len` and
        // are never part of a view.
        Ok(self.mapped_file()?.map(|all| {
            all.get(self.header.data_start()..self.header.file_len())
                .unwrap_or(&[])
        }))
    }

    /// Every byte in memory, from the length prefix on, when the file is mapped or in memory
    /// (mapped now if deferred, as [`SafeFile::mapped_data`]): the whole mapping, with whatever
    /// followed the data when it was made, or the caller's whole buffer. What no output buffer
    /// may overlap.
    pub fn mapped_file(&self) -> Result<Option<&[u8]>> {
        Ok(Some(match &self.storage {
            Storage::Mapped(lazy) => lazy.get(&self.path, self.header.file_len() as u64)?,
            Storage::Memory(bytes) => (**bytes).as_ref(),
            Storage::Reader(_) | Storage::Direct(_) | Storage::HeaderOnly | Storage::Ranged(_) => {
                return Ok(None)
            }
        }))
    }

    /// Whether the file's bytes are mapped now (always, for bytes in memory): false for the
    /// read and direct backends, and for a mapped file before its first access of tensor bytes
    /// (see [`Populate::Lazy`]).
    pub fn is_mapped_now(&self) -> bool {
        match &self.storage {
            Storage::Mapped(lazy) => lazy.is_mapped(),
            Storage::Memory(_) => true,
            _ => false,
        }
    }

    /// A tensor's description, or [`Error::TensorNotFound`] naming this file.
    pub fn info(&self, name: &str) -> Result<TensorInfo<'_>> {
        self.header.tensor(name).map_err(|e| e.in_file(&self.path))
    }

    /// A zero-copy view of a tensor when mapped; `None` with the read backend.
    pub fn view(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let info = self.info(name)?;
        let Some(data) = self.mapped_data()? else {
            return Ok(None);
        };
        let (begin, end) = info.data_offsets;
        if data.get(begin..end).is_none() {
            return Err(self.not_in_memory(name));
        }
        Ok(Some(view_of(info, data)))
    }

    /// A tensor's bytes: borrowed from the mapping, or read into a new buffer.
    pub fn tensor_bytes(&self, name: &str) -> Result<Cow<'_, [u8]>> {
        let info = self.info(name)?;
        let (begin, end) = info.data_offsets;
        match self.mapped_data()? {
            Some(data) => data
                .get(begin..end)
                .map(Cow::Borrowed)
                .ok_or_else(|| self.not_in_memory(name)),
            None => {
                let mut out = zeroed(end - begin).map_err(|e| Error::io(&self.path, "read", e))?;
                self.read_data(begin as u64, &mut out)?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// Validation put every tensor inside the bytes in memory: one that is not is a defect.
    fn not_in_memory(&self, name: &str) -> Error {
        Error::Internal {
            message: format!(
                "tensor `{name}` of {} lies outside the bytes in memory, which its header was \
                 validated against",
                self.path.display()
            ),
        }
    }

    /// A read outside the data buffer: the caller's range is wrong (the file is not), so it is
    /// `InvalidSlice`, never `Io`.
    fn outside(&self, offset: u64, len: usize) -> Error {
        Error::InvalidSlice {
            tensor: String::new(),
            reason: format!(
                "bytes [{offset}, {offset} + {len}) lie outside the {}-byte data buffer",
                self.header.data_len()
            ),
        }
        .in_file(&self.path)
    }

    /// A descriptor for one read operation (read backend only).
    fn handle(&self) -> Result<Option<Handle<'_>>> {
        match &self.storage {
            Storage::Mapped(_) | Storage::Memory(_) => Ok(None),
            Storage::HeaderOnly => Err(Error::io(
                &self.path,
                "read",
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "only the header of this file was fetched (it was opened header-only); \
                     open it again without that option to read tensor bytes",
                ),
            )),
            Storage::Reader(Reader::Held(file)) => Ok(Some(Handle::Borrowed(file))),
            Storage::Ranged(source) => Ok(Some(Handle::Ranged(source.as_ref()))),
            Storage::Direct(d) => d
                .op()
                .map(|op| Some(Handle::Direct(op)))
                .map_err(|e| Error::io(&self.path, "open", e)),
            Storage::Reader(Reader::Reopen) => {
                let id = self.identity.as_ref().ok_or_else(|| Error::Internal {
                    message: format!("{} reopens with no identity", self.path.display()),
                })?;
                reopen(&self.path, id, 0)
                    .map(|f| Some(Handle::Owned(f)))
                    .map_err(|e| Error::io(&self.path, "open", e))
            }
        }
    }

    /// Copies all of tensor `info` (of this file) into `dst`, which holds exactly its bytes
    /// ([`TensorInfo::check_destination`]: `InvalidSlice` otherwise, before anything is read).
    pub fn read_tensor(&self, info: &TensorInfo<'_>, dst: &mut [u8]) -> Result<()> {
        info.check_destination(dst.len())?;
        self.read_data(info.data_offsets.0 as u64, dst)
    }

    /// Copies `dst.len()` bytes of the data buffer, starting at `offset`, into `dst`.
    pub fn read_data(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let handle = self.handle()?;
        self.read_with(handle.as_ref(), offset, dst)
    }

    /// [`SafeFile::read_data`] with the descriptor of the current operation.
    fn read_with(&self, handle: Option<&Handle<'_>>, offset: u64, dst: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(dst.len() as u64)
            .filter(|&end| end <= self.header.data_len() as u64)
            .ok_or_else(|| self.outside(offset, dst.len()))?;
        match handle {
            None => {
                let data = self.mapped_data()?.unwrap_or(&[]);
                let src = data
                    .get(offset as usize..end as usize)
                    .ok_or_else(|| self.outside(offset, dst.len()))?;
                dst.copy_from_slice(src);
            }
            Some(handle) => {
                let at = self.header.data_start() as u64 + offset;
                handle.read_exact_at(self, dst, at)?;
                self.bytes_read
                    .fetch_add(dst.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// A failed read of tensor bytes; an early end of file means the file shrank.
    fn read_failed(&self, e: io::Error) -> Error {
        let e = if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                e.kind(),
                "the file is shorter than its header says; was it truncated or replaced while \
                 open?",
            )
        } else {
            e
        };
        Error::io(&self.path, "read", e)
    }

    /// Data bytes fetched by the read backend so far (0 for the mapped backend, whose reads the
    /// kernel does on demand).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
}

mod aligned;
mod head;
mod many;
mod mapping;
mod options;
pub(crate) mod parallel;
mod raw_map;
mod runs;

pub(crate) use head::parse_allowing;
use head::{read_head, read_header, read_rest, HEADER_COPY_LIMIT};
pub use many::read_many;
#[cfg(test)]
use mapping::may_defer;
use mapping::{descriptors_to_spare, map_and_parse, LazyMap};
pub use options::{Backend, OpenOptions, Populate};
#[cfg(test)]
mod ranged_tests;
#[cfg(test)]
mod tests;
