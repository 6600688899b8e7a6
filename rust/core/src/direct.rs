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
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

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

/// A file read with `O_DIRECT` where the filesystem allows it, else with `pread`.
pub struct DirectFile {
    /// Ordinary descriptor: the header, the fallback, and a tail the direct read came short on.
    buffered: File,
    /// The `O_DIRECT` descriptor, when the open succeeded.
    direct: Option<File>,
    /// Set once a read through `direct` was refused: every later read uses `buffered`.
    refused: AtomicBool,
    /// The test hook's `read`: refuse the next direct read, as a filesystem would.
    refuse_read: AtomicBool,
    /// Why reads do not bypass the page cache, once known.
    reason: OnceLock<String>,
}

impl DirectFile {
    /// Wraps the already opened and checked `buffered` descriptor of `path`, and tries a second,
    /// `O_DIRECT` descriptor. A refusal is recorded, not returned.
    pub fn open(path: &Path, buffered: File) -> DirectFile {
        let hook = refuse_hook();
        let direct = if hook == Refuse::Open {
            Err(einval())
        } else {
            File::options()
                .read(true)
                .custom_flags(libc::O_DIRECT | libc::O_NONBLOCK)
                .open(path)
        };
        let reason = OnceLock::new();
        let direct = match direct {
            Ok(f) => Some(f),
            Err(e) => {
                let _ = reason.set(format!(
                    "the filesystem refused O_DIRECT at open ({e}); reading with pread"
                ));
                None
            }
        };
        DirectFile {
            buffered,
            direct,
            refused: AtomicBool::new(false),
            refuse_read: AtomicBool::new(hook == Refuse::Read),
            reason,
        }
    }

    /// Why reads go through the page cache (`None` while `O_DIRECT` works).
    pub fn fallback(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// Runs `read` on the `O_DIRECT` descriptor; `None` when there is none (never opened, or a
    /// read was refused before) or the filesystem refuses this read (`EINVAL`), which switches
    /// this file to `pread` for good: the caller then reads with `buffered`.
    fn direct_read<T>(&self, read: impl FnOnce(&File) -> io::Result<T>) -> io::Result<Option<T>> {
        let direct = match &self.direct {
            Some(d) if !self.refused.load(Ordering::Relaxed) => d,
            _ => return Ok(None),
        };
        let result = if self.refuse_read.swap(false, Ordering::Relaxed) {
            Err(einval())
        } else {
            read(direct)
        };
        match result {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.refused.store(true, Ordering::Relaxed);
                let _ = self.reason.set(format!(
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
            self.buffered
                .read_exact_at(&mut dst[done..], at + done as u64)?;
        }
        Ok(())
    }

    /// Reads the aligned span at `at` straight into `dst` (both aligned to [`DIRECT_ALIGN`],
    /// `dst.len()` a multiple of it) with `O_DIRECT`, no bounce buffer; returns the bytes read
    /// (fewer at end of file), or `None` when `O_DIRECT` is not in use (never opened, or
    /// refused now or before), in which case nothing useful is in `dst`.
    pub fn read_span(&self, dst: &mut [u8], at: u64) -> io::Result<Option<usize>> {
        self.direct_read(|direct| pread_some(direct, dst, at))
    }

    /// [`DirectFile::read_exact_at`] for the part of a span [`DirectFile::read_span`] did not
    /// fill: with `pread`, which tells a true end of file from a filesystem that stopped short.
    pub fn finish(&self, dst: &mut [u8], at: u64) -> io::Result<()> {
        self.buffered.read_exact_at(dst, at)
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
        let aligned_pos = pos % DIRECT_ALIGN as u64 == 0;
        let aligned_mem = (rest.as_ptr() as usize) % DIRECT_ALIGN == 0;
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
/// Buffers of [`MAPPED_MIN`] bytes or more are anonymous mappings, 2 MiB aligned and advised to
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
