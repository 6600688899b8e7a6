//! A deferred mapping's memory: a read-only shared mapping of a whole file, made with the
//! `mmap` system call itself rather than through libc.
//!
//! Sanitizers intercept libc's `mmap`, and ThreadSanitizer records the new mapping as written
//! by the thread that made it. A deferred mapping is made by whichever thread first reads the
//! file, ordered before every other thread's reads by the core's own lock, which TSan cannot
//! see in an uninstrumented library: through libc, every other thread's read of the mapping
//! would be reported as a race with that "write" in the C++ engines that link us under TSan.
//! The bytes are the kernel's, written by no thread, so the system call tells the truth. A
//! mapping made at open needs none of this (the engine's own hand-off of the open file orders
//! it) and stays memmap2's.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// A whole file mapped read-only (`MAP_SHARED`), unmapped when dropped. Empty for an empty
/// file, which no system call maps.
pub(super) struct RawMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; sharing `&[u8]` views of it
// across threads is what a memmap2 `Mmap` allows too.
unsafe impl Send for RawMap {}
// SAFETY: as above: nothing writes through it.
unsafe impl Sync for RawMap {}

impl RawMap {
    /// Maps all of `file` as it is now (its length from `fstat`), advising huge pages when
    /// asked (advice only: refused where unsupported, never an error).
    pub(super) fn map(file: &File, huge_pages: bool) -> io::Result<RawMap> {
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, "the file is too large to map")
        })?;
        if len == 0 {
            return Ok(RawMap {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a fresh read-only shared mapping of a descriptor we hold; nothing else is
        // touched. `syscall` returns -1 and sets errno on failure, as libc's `mmap` does.
        let at = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                std::ptr::null_mut::<libc::c_void>(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0 as libc::off_t,
            )
        };
        if at == -1 {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(at as *mut u8)
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        let map = RawMap { ptr, len };
        if huge_pages {
            // SAFETY: the whole of this live mapping; the advice does not change its contents.
            unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        }
        Ok(map)
    }
}

impl std::ops::Deref for RawMap {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` are mapped readable for as long as `self` lives (a
        // dangling pointer with length 0 for an empty file, which `from_raw_parts` allows).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RawMap {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping this value made and owns; no view of it outlives `self`
            // (views borrow the file that owns it). An error leaves it mapped, which only
            // costs address space.
            unsafe { libc::syscall(libc::SYS_munmap, self.ptr.as_ptr(), self.len) };
        }
    }
}
