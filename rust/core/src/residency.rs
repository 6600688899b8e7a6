//! Where a file's bytes stay: locking the pages of a mapped file in memory (`mlock`), unlocking
//! them, and releasing them once a program has copied what it needs (an upload, a load into its
//! own buffers): from this process (`MADV_DONTNEED` on the mapping) and from the page cache
//! (`POSIX_FADV_DONTNEED`), so that neither this process's resident set nor the machine's cache
//! keeps a second copy of the weights (huggingface/safetensors #542).
//!
//! Each takes the ranges a [`Plan`] covers, the plan of prefetch and advice, so a request means
//! the same bytes to all of them. Ranges are widened to whole pages: a page shared with a
//! neighbouring tensor is locked or released with it (released pages of a file are read again
//! on the next access, so that costs a read, never data).

use std::fs::File;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::open::reopen;
use crate::prefetch::Plan;

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// The plan's ranges of `file`, relative to its data buffer (none when the plan does not
/// cover it).
fn ranges_of(file: &SafeFile, plan: &Plan) -> Vec<(u64, u64)> {
    (0..plan.file_count())
        .find(|&i| plan.file_path(i) == Some(file.path()))
        .map(|i| plan.file_ranges(i))
        .unwrap_or_default()
}

/// Each range of the mapping, widened to whole pages, as an address and a length. The mapping
/// starts on a page, so the widened range stays inside it; its last page may run past the
/// file's end, where the mapping still covers the rest of that page.
fn mapped_pages<'a>(
    data: &[u8],
    ranges: &'a [(u64, u64)],
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let page = page_size();
    let base = data.as_ptr() as usize;
    ranges
        .iter()
        .filter(|r| r.1 > 0)
        .map(move |&(offset, len)| {
            let start = base + offset as usize;
            let aligned = start - start % page;
            let end = (start + len as usize).next_multiple_of(page);
            (aligned, end - aligned)
        })
}

/// Locks the pages of the plan's ranges of `file`'s mapping in memory (`mlock`): read in now,
/// and never paged out until unlocked or unmapped. Locks do not nest: one [`unlock`] undoes
/// every lock of the same pages. Nothing for the read and direct backends and for bytes in
/// memory, which map no file (their views own, or borrow, memory of their own).
///
/// A refusal is `Io`, saying why: above all `RLIMIT_MEMLOCK`, the most an unprivileged process
/// may lock (often 64 KiB or 8 MiB), with its value and how to raise it.
pub fn lock(file: &SafeFile, plan: &Plan) -> Result<()> {
    let Some(data) = mapping(file, true)? else {
        return Ok(());
    };
    for (at, len) in mapped_pages(data, &ranges_of(file, plan)) {
        // SAFETY: the range lies inside this file's live mapping; locking changes no byte.
        if unsafe { libc::mlock(at as *const libc::c_void, len) } != 0 {
            return Err(lock_refused(file.path(), len, io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Unlocks the pages [`lock`] locked (`munlock`); pages never locked are left as they are.
/// Nothing where [`lock`] does nothing.
pub fn unlock(file: &SafeFile, plan: &Plan) -> Result<()> {
    let Some(data) = mapping(file, false)? else {
        return Ok(());
    };
    for (at, len) in mapped_pages(data, &ranges_of(file, plan)) {
        // SAFETY: as in `lock`.
        if unsafe { libc::munlock(at as *const libc::c_void, len) } != 0 {
            return Err(Error::io(
                file.path(),
                "munlock",
                io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// Releases the plan's ranges of `file` after a load: drops them from this process's mapping
/// (`MADV_DONTNEED`: its resident set shrinks; a later access reads them again, correctly), then
/// asks the kernel to drop them from the page cache (`POSIX_FADV_DONTNEED`: only pages no other
/// process maps, and clean, go). With the read and direct backends there is no mapping, and
/// only the page cache is released; bytes in memory (a caller's buffer) are never touched.
///
/// Views already taken stay valid and correct (their next access reads the file again); pages
/// locked with [`lock`] cannot be released (`Io`, saying to unlock them first).
///
/// A file renamed over or removed since it was opened (a new version published by an atomic
/// rename, as every safe writer publishes) is released too, never an error: its mapping's
/// pages need no path, and the page cache is reached through the path only while the path
/// still names this file (checked by identity), so the file there now is never touched. The
/// replaced file's cached pages that this process mapped are reclaimed with the mapping
/// (`MADV_PAGEOUT`, Linux 5.4 and later); the rest go when the last descriptor and mapping of
/// it close, as the pages of every removed file do.
pub fn release(file: &SafeFile, plan: &Plan) -> Result<()> {
    if file.is_in_memory() {
        // MADV_DONTNEED on a caller's anonymous memory would zero it.
        return Ok(());
    }
    let ranges = ranges_of(file, plan);
    if ranges.is_empty() {
        return Ok(());
    }
    // First, whether the path still reaches this file's page cache: a file no path reaches has
    // its cached pages reclaimed through the mapping, before the mapping lets go of them.
    let cache = cache_handle(file)?;
    if let Some(data) = mapping(file, false)? {
        for (at, len) in mapped_pages(data, &ranges) {
            if cache.is_none() {
                // SAFETY: as below; reclaiming clean file pages changes no byte a later access
                // reads. Best effort: kernels before 5.4 refuse the advice (EINVAL), and the
                // pages then go when the file is closed.
                unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_PAGEOUT) };
            }
            // SAFETY: the range lies inside this file's live, read-only, file-backed mapping:
            // dropping its pages changes no byte a later access reads (they come from the file).
            if unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::EINVAL) => Error::io(
                        file.path(),
                        "release",
                        io::Error::new(
                            e.kind(),
                            format!(
                                "{e}: the pages are locked (safetensors::lock); unlock them \
                                 first"
                            ),
                        ),
                    ),
                    _ => Error::io(file.path(), "madvise", e),
                });
            }
        }
    }
    match cache {
        Some(f) => drop_cached(file, &f, &ranges),
        None => Ok(()),
    }
}

/// A descriptor of `file` for dropping its page cache: its path opened again and checked to be
/// the same file ([`reopen`]). `None` when the path no longer names it (renamed over, removed):
/// then no path reaches its pages, and nothing reached through the path may be touched. Any
/// other failure to open is `Io`.
fn cache_handle(file: &SafeFile) -> Result<Option<File>> {
    let path = file.path();
    let Some(id) = file.identity() else {
        return Ok(None);
    };
    match reopen(path, &id, 0) {
        Ok(f) => Ok(Some(f)),
        // `reopen`'s own finding (another file at the path) carries no OS error code.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error().is_none() => Ok(None),
        Err(e) => Err(Error::io(path, "open", e)),
    }
}

/// The page cache's copy of `ranges` of `file`, dropped through `f`, a descriptor of it.
fn drop_cached(file: &SafeFile, f: &File, ranges: &[(u64, u64)]) -> Result<()> {
    let path = file.path();
    let page = page_size() as u64;
    let data_start = file.header().data_start() as u64;
    for &(offset, len) in ranges {
        let start = data_start + offset;
        let aligned = start - start % page;
        let end = (start + len).next_multiple_of(page);
        let rc = {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain system call on a descriptor we own; it only drops clean cached
            // pages, which the file still holds.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    aligned as libc::off_t,
                    (end - aligned) as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            }
        };
        if rc != 0 {
            return Err(Error::io(
                path,
                "posix_fadvise",
                io::Error::from_raw_os_error(rc),
            ));
        }
    }
    Ok(())
}

/// The whole mapping of a mapped file (`None` for the other backends and bytes in memory).
/// A file not mapped yet (see [`crate::Populate::Lazy`]) is mapped now when `map_now`, else
/// `None`: nothing of it is mapped to unlock or to drop.
fn mapping(file: &SafeFile, map_now: bool) -> Result<Option<&[u8]>> {
    if file.is_in_memory() || (!map_now && !file.is_mapped_now()) {
        return Ok(None);
    }
    Ok(file.mapped_data()?.filter(|d| !d.is_empty()))
}

/// A refused `mlock` of `len` bytes, as an `Io` error saying what limits it and how to lift it.
fn lock_refused(path: &Path, len: usize, e: io::Error) -> Error {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    let limit = match known {
        true if limit.rlim_cur == libc::RLIM_INFINITY => "unlimited".to_owned(),
        true => format!("{} bytes", limit.rlim_cur),
        false => "unknown".to_owned(),
    };
    let why = match e.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::EPERM) => format!(
            "{e}: locking {len} more bytes would pass this process's RLIMIT_MEMLOCK ({limit}; \
             `ulimit -l` shows it in KiB), the most an unprivileged process may lock. Raise it \
             (`ulimit -l`, LimitMEMLOCK= in a systemd unit, memlock in \
             /etc/security/limits.conf, --ulimit memlock in a container) or run with \
             CAP_IPC_LOCK; or lock fewer tensors"
        ),
        _ => format!("{e} (RLIMIT_MEMLOCK: {limit})"),
    };
    Error::io(path, "mlock", io::Error::new(e.kind(), why))
}
