//! The mapped backend's mapping: made at open or deferred to the first access of tensor bytes
//! (and then checked against the length the header describes), mapped with the options' huge
//! pages and population, populated in the background when asked.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use memmap2::{Mmap, MmapOptions};

use crate::error::{Error, Result};
use crate::format::LENGTH_PREFIX_SIZE;
use crate::header::{read_header_len, Header};

use super::head::{parse_allowing, read_head, read_rest, HEADER_COPY_LIMIT};
use super::options::{OpenOptions, Populate};
use super::{raw_map, Storage};

/// The mapped backend's mapping. A file opened on its own (`SafeFile::open`) with lazy
/// population and a header read by `pread` is mapped at the first access of tensor bytes, not
/// at open: an open that only reads the header (keys, shapes, metadata, slice plans) then pays
/// no `mmap` and `munmap`, which were ~8 µs of a ~48 µs open of gpt2 (548 MB) with every
/// tensor's shape. Until then the file stays open (one descriptor, as the read backend keeps
/// one), so that what is mapped is the very file whose header was validated even if its path
/// is replaced or removed meanwhile; the descriptor is closed once the file is mapped, and a
/// process with many descriptors in use maps at open instead (`descriptors_to_spare`). A
/// mapping shorter than the header's data (the file was truncated since the open) is an `Io`
/// error, never a view past its end. Populated opens, headers parsed in the mapping and
/// checkpoint shards (which hold no descriptor between reads) map at open, as before.
pub(super) struct LazyMap {
    map: OnceLock<Mapping>,
    /// The file, until it is mapped.
    file: Mutex<Option<File>>,
    huge_pages: bool,
}

/// A mapped file's memory: memmap2's when mapped at open (shared with a background population
/// thread, which holds it weakly: see `populate_in_background`), or the system call's when the
/// mapping was deferred (see `file/raw_map.rs` for why).
pub(super) enum Mapping {
    AtOpen(Arc<Mmap>),
    Deferred(raw_map::RawMap),
}

impl std::ops::Deref for Mapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Mapping::AtOpen(map) => map,
            Mapping::Deferred(map) => map,
        }
    }
}

impl LazyMap {
    /// Whether the file is mapped now (at open, or since its first access).
    pub(super) fn is_mapped(&self) -> bool {
        self.map.get().is_some()
    }

    pub(super) fn mapped(map: Arc<Mmap>) -> LazyMap {
        LazyMap {
            map: OnceLock::from(Mapping::AtOpen(map)),
            file: Mutex::new(None),
            huge_pages: false,
        }
    }

    pub(super) fn deferred(file: File, huge_pages: bool) -> LazyMap {
        LazyMap {
            map: OnceLock::new(),
            file: Mutex::new(Some(file)),
            huge_pages,
        }
    }

    /// The mapping, made now if it was deferred; `need` is the file length the header was
    /// validated against (the end of its data).
    pub(super) fn get(&self, path: &Path, need: u64) -> Result<&[u8]> {
        if let Some(map) = self.map.get() {
            return Ok(map);
        }
        // Every deferred mapping is made under this lock, so two threads' first accesses map
        // the file once.
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(map) = self.map.get() {
            return Ok(map);
        }
        let f = file.as_ref().ok_or_else(|| Error::Internal {
            message: format!("{} has neither a mapping nor its file", path.display()),
        })?;
        let map =
            raw_map::RawMap::map(f, self.huge_pages).map_err(|e| Error::io(path, "mmap", e))?;
        if (map.len() as u64) < need {
            return Err(Error::io(
                path,
                "mmap",
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file became shorter since it was opened ({} bytes, its header \
                         describes {need}); was it truncated meanwhile?",
                        map.len()
                    ),
                ),
            ));
        }
        *file = None;
        Ok(self.map.get_or_init(|| Mapping::Deferred(map)))
    }
}

/// Whether a file opened as descriptor `fd` may stay open until its first access of tensor
/// bytes (see `LazyMap`). Descriptors are numbered lowest first, so `fd` counts those in use:
/// only while it is below a quarter of the process's limit (`RLIMIT_NOFILE`) and below
/// [`DEFERRED_FD_CEILING`]. A program that holds many files open, mapped, never runs out of
/// descriptors because of the deferral, nor sees its own descriptors numbered past what
/// `select()` takes (1024) because of it: past that point files are mapped at open and hold
/// none, as before.
pub(super) fn descriptors_to_spare(fd: std::os::fd::RawFd) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return false;
    }
    may_defer(fd, limit.rlim_cur)
}

/// The highest descriptor number a deferred mapping may hold.
pub(super) const DEFERRED_FD_CEILING: u64 = 256;

/// `fd < min(limit / 4, DEFERRED_FD_CEILING)` (`RLIM_INFINITY` is the largest value).
pub(super) fn may_defer(fd: std::os::fd::RawFd, limit: libc::rlim_t) -> bool {
    u64::try_from(fd).is_ok_and(|fd| fd < (limit / 4).min(DEFERRED_FD_CEILING))
}

/// Maps `file` read-only as `options` ask: populated at open, with huge pages advised.
pub(super) fn map_file(file: &File, path: &Path, options: OpenOptions) -> Result<Arc<Mmap>> {
    let mut how = MmapOptions::new();
    if options.populate == Populate::AtOpen {
        how.populate();
    }
    // SAFETY: the mapping is read-only. Another process truncating the file while it is
    // mapped makes later accesses fault; that is documented, and the read backend exists for
    // files that may change.
    let map = unsafe { how.map(file) }.map_err(|e| Error::io(path, "mmap", e))?;
    if options.huge_pages && !map.is_empty() {
        // Advice only: a kernel without transparent huge pages refuses it (EINVAL), and the
        // mapping works the same either way.
        // SAFETY: the whole of this live mapping; the advice does not change its contents.
        unsafe {
            libc::madvise(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                libc::MADV_HUGEPAGE,
            )
        };
    }
    Ok(Arc::new(map))
}

/// Bytes the background population asks the kernel for at a time: small enough that closing
/// the file waits at most for one such step, large enough that the calls cost nothing.
pub(super) const POPULATE_STEP: usize = 64 << 20;

/// Starts a thread that populates `map` step by step, holding it only during each step, so
/// that the file closes (and unmaps) when its owners let go, whatever the thread is doing.
pub(super) fn populate_in_background(map: &Arc<Mmap>, path: &Path) -> Result<()> {
    let weak: Weak<Mmap> = Arc::downgrade(map);
    let len = map.len();
    std::thread::Builder::new()
        .name("st-populate".into())
        .spawn(move || {
            let mut advice = libc::MADV_POPULATE_READ;
            let mut at = 0usize;
            while at < len {
                let Some(map) = weak.upgrade() else {
                    return;
                };
                let n = (len - at).min(POPULATE_STEP);
                // SAFETY: `[at, at + n)` lies inside the live mapping `map` holds; neither
                // piece of advice changes its contents.
                let rc =
                    unsafe { libc::madvise(map.as_ptr().add(at) as *mut libc::c_void, n, advice) };
                if rc != 0 {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => continue,
                        // Before Linux 5.14: read the pages in ahead, without mapping them.
                        Some(libc::EINVAL) if advice == libc::MADV_POPULATE_READ => {
                            advice = libc::MADV_WILLNEED;
                            continue;
                        }
                        // A file truncated meanwhile (EFAULT), no memory: the accesses that
                        // follow meet the same condition and report it.
                        _ => return,
                    }
                }
                at += n;
            }
        })
        .map(drop)
        .map_err(|e| Error::io(path, "start a populate thread", e))
}

/// The mapped backend's open when the file is mapped at once: map first, then validate
/// against the mapping's own length. The file may change size between any two measurements,
/// and only the mapping's length bounds what a view may touch; a header checked against an
/// earlier `fstat` could describe bytes past the end of the mapping.
pub(super) fn map_and_parse(
    file: &File,
    path: &Path,
    options: OpenOptions,
) -> Result<((Header, u64), Storage)> {
    #[cfg(test)]
    super::tests::before_map(path);
    let map = map_file(file, path, options)?;
    let len = map.len() as u64;
    if len < LENGTH_PREFIX_SIZE as u64 {
        return Err(Error::HeaderTooSmall { len });
    }
    // Small headers are read with pread and parsed from that copy; larger ones are parsed
    // straight from the mapping (see HEADER_COPY_LIMIT). Either way every check is against
    // `len`, the mapping's length.
    let mut head = read_head(file, path, len)?;
    let header = match read_header_len(&head, len) {
        Ok(n) if LENGTH_PREFIX_SIZE + n <= HEADER_COPY_LIMIT => {
            read_rest(file, path, &mut head, LENGTH_PREFIX_SIZE + n)?;
            parse_allowing(&head, len, options.allow_trailing_bytes)?
        }
        _ => parse_allowing(&map, len, options.allow_trailing_bytes)?,
    };
    if options.populate == Populate::Background {
        populate_in_background(&map, path)?;
    }
    Ok((header, Storage::Mapped(LazyMap::mapped(map))))
}
