//! The direct backend's reads: `O_DIRECT` (bypassing the page cache) into aligned buffers, with
//! unaligned heads and tails handled, and a recorded fallback to `pread` when the filesystem
//! refuses `O_DIRECT`.
//!
//! Why optional and with a fallback: tmpfs refuses `O_DIRECT` at open (`EINVAL`), some network
//! and FUSE filesystems accept the open and refuse the first read, and llama.cpp made its direct
//! path opt-in after such failures. So the refusal is not an error: reads continue with `pread`
//! on an ordinary descriptor and [`DirectFile::fallback`] says why, so that it is never a silent
//! surprise.

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

/// A file read with `O_DIRECT` where the filesystem allows it, else with `pread`.
pub struct DirectFile {
    /// Ordinary descriptor: the header, the fallback, and a tail the direct read came short on.
    buffered: File,
    /// The `O_DIRECT` descriptor, when the open succeeded.
    direct: Option<File>,
    /// Set once a read through `direct` was refused: every later read uses `buffered`.
    refused: AtomicBool,
    /// Why reads do not bypass the page cache, once known.
    reason: OnceLock<String>,
}

impl DirectFile {
    /// Wraps the already opened and checked `buffered` descriptor of `path`, and tries a second,
    /// `O_DIRECT` descriptor. A refusal is recorded, not returned.
    pub fn open(path: &Path, buffered: File) -> DirectFile {
        let direct = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECT | libc::O_NONBLOCK)
            .open(path);
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
            reason,
        }
    }

    /// Why reads go through the page cache (`None` while `O_DIRECT` works).
    pub fn fallback(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// Fills `dst` from file offset `at`, like `read_exact_at`.
    pub fn read_exact_at(&self, dst: &mut [u8], at: u64) -> io::Result<()> {
        let direct = match &self.direct {
            Some(d) if !self.refused.load(Ordering::Relaxed) => d,
            _ => return self.buffered.read_exact_at(dst, at),
        };
        match read_direct(direct, dst, at) {
            // `done` bytes came through O_DIRECT; a short read means the file ended there (or the
            // filesystem stopped short): pread finishes, and reports a true end of file.
            Ok(done) if done == dst.len() => Ok(()),
            Ok(done) => self
                .buffered
                .read_exact_at(&mut dst[done..], at + done as u64),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.refused.store(true, Ordering::Relaxed);
                let _ = self.reason.set(format!(
                    "the filesystem refused an O_DIRECT read ({e}); reading with pread"
                ));
                self.buffered.read_exact_at(dst, at)
            }
            Err(e) => Err(e),
        }
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
    let got = pread_some(file, buf.as_mut(), start)?;
    let useful = got.saturating_sub(head).min(dst.len()).min(want - head);
    dst[..useful].copy_from_slice(&buf.as_mut()[head..head + useful]);
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

/// Heap memory aligned to [`DIRECT_ALIGN`], freed on drop.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain owned memory, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Zeroed, aligned memory of `len` bytes (`len` > 0); an `OutOfMemory` error when the
    /// allocation fails, never an abort.
    pub fn new(len: usize) -> io::Result<AlignedBuf> {
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
        Ok(AlignedBuf { ptr, len })
    }

    /// The buffer's bytes.
    pub fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` initialized (zeroed) bytes this buffer owns.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe {
            dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len.max(1), DIRECT_ALIGN),
            )
        };
    }
}
