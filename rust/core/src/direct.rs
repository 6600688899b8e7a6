//! The direct backend's reads: `O_DIRECT` (bypassing the page cache) into aligned buffers, with
//! unaligned heads and tails handled, and a recorded fallback to `pread` when the filesystem
//! refuses `O_DIRECT`.
//!
//! Why optional and with a fallback: tmpfs refuses `O_DIRECT` at open (`EINVAL`), some network
//! and FUSE filesystems accept the open and refuse the first read, and llama.cpp made its direct
//! path opt-in after such failures. So the refusal is not an error: reads continue with `pread`
//! on an ordinary descriptor and [`DirectFile::fallback`] says why, so that it is never a silent
//! surprise.
//!
//! Test hook: this kernel (6.6 and later) accepts `O_DIRECT` even on tmpfs, so the fallback
//! could not be exercised. The environment variable `SAFETENSORS_TEST_REFUSE_O_DIRECT` makes
//! the backend behave as if the filesystem refused: `open` refuses the `O_DIRECT` open
//! (`EINVAL`), `read` refuses the first read through it (`EINVAL`). It is read at each open, so
//! a test may set it for the files it opens; it is a test hook, not a feature, and any other
//! value is ignored.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::OnceCell;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::open::{reopen, Identity};

/// Alignment of offsets, lengths and memory for `O_DIRECT`. 4096 covers every logical block
/// size Linux filesystems use on 4 KiB-page machines (512 and 4096); a larger alignment is
/// always valid where a smaller one is.
pub const DIRECT_ALIGN: usize = 4096;

/// Largest single `O_DIRECT` request through the bounce buffer: large enough to keep a disk's
/// queue full, small enough that a small tensor does not allocate much.
const BOUNCE_MAX: usize = 8 << 20;

/// The test hook's variable (see the module comment).
const REFUSE_HOOK: &str = "SAFETENSORS_TEST_REFUSE_O_DIRECT";

/// What the test hook asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refuse {
    Nothing,
    Open,
    Read,
}

fn refuse_hook() -> Refuse {
    match std::env::var_os(REFUSE_HOOK) {
        Some(v) if v == "open" => Refuse::Open,
        Some(v) if v == "read" => Refuse::Read,
        _ => Refuse::Nothing,
    }
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// Whether a failed `O_DIRECT` open or read is the filesystem refusing `O_DIRECT` itself
/// (`EINVAL`, or `EOPNOTSUPP` from some FUSE filesystems), which falls back to `pread`. Any
/// other failure (no descriptors left, no memory, no permission) is an error of the read: it
/// says nothing about the filesystem, and calling it a refusal would hide it.
fn is_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
    )
}

/// A file read with `O_DIRECT` where the filesystem allows it, else with `pread`.
///
/// Descriptors: a file opened on its own holds two for its life (an ordinary one, and the
/// `O_DIRECT` one); a checkpoint shard holds none between reads, and each read operation opens
/// what it needs ([`DirectFile::op`]), so that thousands of shards never exhaust descriptors.
/// Every descriptor after the first is a second open of the path, checked to be the same file
/// ([`reopen`]): a rename in between is an error, never another file's bytes.
pub struct DirectFile {
    path: PathBuf,
    id: Identity,
    /// The descriptors held for the life of the file; `None` for a shard.
    held: Option<Held>,
    /// Set once the filesystem refused `O_DIRECT` (at an open or a read): every later read uses
    /// an ordinary descriptor.
    refused: AtomicBool,
    /// The test hook's `open`: refuse every `O_DIRECT` open, as a filesystem would.
    refuse_open: bool,
    /// The test hook's `read`: refuse the next direct read, as a filesystem would.
    refuse_read: AtomicBool,
    /// Why reads do not bypass the page cache, once known.
    reason: OnceLock<String>,
}

struct Held {
    /// Ordinary descriptor: the header, the fallback, and a tail the direct read came short on.
    buffered: File,
    /// The `O_DIRECT` descriptor, unless the filesystem refused it.
    direct: Option<File>,
}

impl DirectFile {
    /// Wraps the already opened and checked `buffered` descriptor of `path` (`meta` is its
    /// `fstat`) and opens `path` again with `O_DIRECT`, checked to be the same file. `hold`
    /// keeps both descriptors for the life of the file; without it both are closed now and
    /// each read operation opens its own. A refusal of `O_DIRECT` is recorded, not returned;
    /// any other failure of the second open (the file replaced, no descriptors left) is.
    pub fn open(
        path: &Path,
        buffered: File,
        meta: &Metadata,
        hold: bool,
    ) -> io::Result<DirectFile> {
        let hook = refuse_hook();
        let mut file = DirectFile {
            path: path.to_path_buf(),
            id: Identity::of(meta),
            held: None,
            refused: AtomicBool::new(false),
            refuse_open: hook == Refuse::Open,
            refuse_read: AtomicBool::new(hook == Refuse::Read),
            reason: OnceLock::new(),
        };
        let direct = file.open_direct()?;
        if hold {
            file.held = Some(Held { buffered, direct });
        }
        Ok(file)
    }

    /// A new `O_DIRECT` descriptor of the same file; `None` once the filesystem refused one.
    fn open_direct(&self) -> io::Result<Option<File>> {
        if self.refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let opened = if self.refuse_open {
            Err(einval())
        } else {
            reopen(&self.path, &self.id, libc::O_DIRECT)
        };
        match opened {
            Ok(f) => Ok(Some(f)),
            Err(e) if is_refusal(&e) => {
                self.refuse(format!(
                    "the filesystem refused O_DIRECT at open ({e}); reading with pread"
                ));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn refuse(&self, why: String) {
        self.refused.store(true, Ordering::Relaxed);
        let _ = self.reason.set(why);
    }

    /// Why reads go through the page cache (`None` while `O_DIRECT` works).
    pub fn fallback(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// The descriptors of one read operation: the held ones, or (for a shard) an `O_DIRECT`
    /// one opened now, with an ordinary one opened only if the operation needs it.
    pub fn op(&self) -> io::Result<DirectOp<'_>> {
        let (direct, buffered) = match &self.held {
            Some(h) => (
                h.direct.as_ref().map(Fd::Borrowed),
                OnceCell::from(Fd::Borrowed(&h.buffered)),
            ),
            None => (self.open_direct()?.map(Fd::Owned), OnceCell::new()),
        };
        Ok(DirectOp {
            file: self,
            direct,
            buffered,
        })
    }
}

/// A descriptor borrowed from a [`DirectFile`] or opened for one operation.
enum Fd<'a> {
    Borrowed(&'a File),
    Owned(File),
}

impl Fd<'_> {
    fn get(&self) -> &File {
        match self {
            Fd::Borrowed(f) => f,
            Fd::Owned(f) => f,
        }
    }
}

/// One read operation of a [`DirectFile`] (see [`DirectFile::op`]).
pub struct DirectOp<'a> {
    file: &'a DirectFile,
    direct: Option<Fd<'a>>,
    buffered: OnceCell<Fd<'a>>,
}

impl DirectOp<'_> {
    /// The ordinary descriptor, opened (and checked) on first use for a shard.
    fn buffered(&self) -> io::Result<&File> {
        if let Some(fd) = self.buffered.get() {
            return Ok(fd.get());
        }
        let f = reopen(&self.file.path, &self.file.id, 0)?;
        Ok(self.buffered.get_or_init(|| Fd::Owned(f)).get())
    }

    /// Runs `read` on the `O_DIRECT` descriptor; `None` when there is none (refused before) or
    /// the filesystem refuses this read, which switches the file to `pread` for good: the
    /// caller then reads with the ordinary descriptor.
    fn direct_read<T>(&self, read: impl FnOnce(&File) -> io::Result<T>) -> io::Result<Option<T>> {
        let direct = match &self.direct {
            Some(d) if !self.file.refused.load(Ordering::Relaxed) => d.get(),
            _ => return Ok(None),
        };
        let result = if self.file.refuse_read.swap(false, Ordering::Relaxed) {
            Err(einval())
        } else {
            read(direct)
        };
        match result {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_refusal(&e) => {
                self.file.refuse(format!(
                    "the filesystem refused an O_DIRECT read ({e}); reading with pread"
                ));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Fills `dst` from file offset `at`, like `read_exact_at`.
    pub fn read_exact_at(&self, dst: &mut [u8], at: u64) -> io::Result<()> {
        if dst.is_empty() {
            // No read at all, so none to refuse.
            return Ok(());
        }
        let done = self
            .direct_read(|direct| read_direct(direct, dst, at))?
            .unwrap_or(0);
        // `done` bytes came through O_DIRECT; a short read means the file ended there (or the
        // filesystem stopped short): pread finishes, and reports a true end of file.
        if done < dst.len() {
            self.buffered()?
                .read_exact_at(&mut dst[done..], at + done as u64)?;
        }
        Ok(())
    }

    /// Reads the aligned span at `at` straight into `dst` (both aligned to [`DIRECT_ALIGN`],
    /// `dst.len()` a multiple of it) with `O_DIRECT`, no bounce buffer; returns the bytes read
    /// (fewer at end of file), or `None` when `O_DIRECT` is not in use (refused now or
    /// before), in which case nothing useful is in `dst`.
    pub fn read_span(&self, dst: &mut [u8], at: u64) -> io::Result<Option<usize>> {
        self.direct_read(|direct| pread_some(direct, dst, at))
    }

    /// [`DirectOp::read_exact_at`] for the part of a span [`DirectOp::read_span`] did not
    /// fill: with `pread`, which tells a true end of file from a filesystem that stopped short.
    pub fn finish(&self, dst: &mut [u8], at: u64) -> io::Result<()> {
        self.buffered()?.read_exact_at(dst, at)
    }
}

/// Reads as much of `dst` from `at` as `O_DIRECT` gives; returns the bytes filled (fewer at end
/// of file). The aligned middle goes straight into `dst` when `dst` is suitably aligned; the rest
/// goes through an aligned bounce buffer.
fn read_direct(file: &File, dst: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < dst.len() {
        let pos = at + done as u64;
        let rest = &mut dst[done..];
        let aligned_pos = pos.is_multiple_of(DIRECT_ALIGN as u64);
        let aligned_mem = (rest.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN);
        let whole = rest.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        let got = if aligned_pos && aligned_mem && whole > 0 {
            pread_some(file, &mut rest[..whole], pos)?
        } else {
            bounce(file, rest, pos)?
        };
        if got == 0 {
            break;
        }
        done += got;
    }
    Ok(done)
}

/// One aligned read around `[pos, pos + dst.len())` (at most [`BOUNCE_MAX`]) into a bounce
/// buffer; copies the wanted part into `dst` and returns how much it copied.
fn bounce(file: &File, dst: &mut [u8], pos: u64) -> io::Result<usize> {
    let head = (pos % DIRECT_ALIGN as u64) as usize;
    let start = pos - head as u64;
    let want = (head + dst.len()).min(BOUNCE_MAX);
    let span = want.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let mut buf = AlignedBuf::new(span)?;
    let got = pread_some(file, buf.as_mut_slice(), start)?;
    let useful = got.saturating_sub(head).min(dst.len()).min(want - head);
    dst[..useful].copy_from_slice(&buf.as_slice()[head..head + useful]);
    Ok(useful)
}

/// `pread` until `dst` is full or the file ends; returns the bytes read.
fn pread_some(file: &File, dst: &mut [u8], pos: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], pos + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                // A short O_DIRECT read ends at end of file (or an unaligned remainder): asking
                // again from an unaligned offset would be refused.
                if n % DIRECT_ALIGN != 0 {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Heap memory aligned to [`DIRECT_ALIGN`], freed on drop: what
/// [`crate::SafeFile::read_data_aligned`] reads into with no bounce copy.
///
/// ```
/// use safetensors_core::{AlignedBuf, DIRECT_ALIGN};
/// let buf = AlignedBuf::new(3 * DIRECT_ALIGN)?;
/// assert_eq!(buf.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// Buffers of `MAPPED_MIN` bytes or more are anonymous mappings, 2 MiB aligned and advised to
/// use transparent huge pages: the kernel hands out zeroed pages when they are first written (by
/// the disk, for a direct read), where the allocator's aligned zeroed memory would first write
/// every byte itself; and huge pages take 512 times fewer faults (measured on cold streams: the
/// faults of 4 KiB pages cost more than the copy a bounce buffer makes).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    /// The whole mapping (start, length) for a mapped buffer.
    mapping: Option<(*mut libc::c_void, usize)>,
}

/// Size from which an [`AlignedBuf`] is a mapping of its own.
const MAPPED_MIN: usize = 4 << 20;

/// A huge page, the mapping's alignment.
const HUGE: usize = 2 << 20;

// SAFETY: the buffer is plain owned memory, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Zeroed, aligned memory of `len` bytes; an `OutOfMemory` error when the allocation
    /// fails, never an abort.
    pub fn new(len: usize) -> io::Result<AlignedBuf> {
        if len >= MAPPED_MIN {
            return AlignedBuf::mapped(len);
        }
        let layout = Layout::from_size_align(len.max(1), DIRECT_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate an aligned buffer of {len} bytes"),
            ));
        }
        Ok(AlignedBuf {
            ptr,
            len,
            mapping: None,
        })
    }

    fn mapped(len: usize) -> io::Result<AlignedBuf> {
        let failed = || {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot map an aligned buffer of {len} bytes"),
            )
        };
        let total = len.checked_add(HUGE).ok_or_else(failed)?;
        // SAFETY: a fresh private anonymous mapping; no memory of ours is involved.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(failed());
        }
        let skip = (base as usize).next_multiple_of(HUGE) - base as usize;
        // SAFETY: `skip < HUGE`, so the buffer's start and its `len` bytes lie in the mapping.
        let ptr = unsafe { base.cast::<u8>().add(skip) };
        // SAFETY: `[ptr, ptr + len)` lies inside the mapping; advice only (failure is harmless).
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        Ok(AlignedBuf {
            ptr,
            len,
            mapping: Some((base, total)),
        })
    }

    /// The buffer's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` initialized (zeroed) bytes this buffer owns.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The buffer's bytes, read-only.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; shared access only reads.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a buffer of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some((base, total)) = self.mapping {
            // SAFETY: mapped in `mapped` with this start and length, and unmapped only here.
            unsafe { libc::munmap(base, total) };
            return;
        }
        // SAFETY: allocated in `new` with this very layout.
        unsafe {
            dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len.max(1), DIRECT_ALIGN),
            )
        };
    }
}
