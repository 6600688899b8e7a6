//! One entry of the cache: `<key>.safetensors`, the object's bytes, and `<key>.meta`, what they
//! are (the object's identity, its version and length) and which file was written (device,
//! inode, change time). The key is a SHA-256 of the identity and the version, so a new version
//! of an object is another entry, and no name holds a query or user information.
//!
//! An entry is trusted only when all of it agrees: the meta file describes this object, version
//! and length, the data file is the one written (a file changed since, by a write or a
//! truncation, has another change time, which no user can set), it is as long as the object,
//! and its first bytes are the ones fetched at this open (the header and what followed it).
//! Then it is validated as a local file is. Anything else is refetched.
//!
//! Written atomically: the bytes into a temporary file in the same directory (space reserved
//! first with `posix_fallocate`, so that a full disk is an error rather than a `SIGBUS` in a
//! mapping), synced, renamed into place; then the meta file the same way. A reader never sees
//! a partial file: before the rename there is no data file, and before the meta file's there
//! is no entry.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, MmapMut};
use safetensors_core::Result;

use crate::fetch::Object;

/// The first line of every meta file: the format of the entry.
const FORMAT: &str = "safetensors-cache 1";

/// Meta files larger than this are not read (an entry's is a few hundred bytes).
const MAX_META: u64 = 64 << 10;

/// The paths of one entry.
pub(crate) struct Names {
    pub(crate) key: String,
    pub(crate) data: PathBuf,
    pub(crate) meta: PathBuf,
    pub(crate) lock: PathBuf,
    dir: PathBuf,
}

impl Names {
    pub(crate) fn new(dir: &Path, identity: &str, version: &str) -> Names {
        let digest = ring::digest::digest(
            &ring::digest::SHA256,
            format!("{FORMAT}\n{identity}\n{version}").as_bytes(),
        );
        let key: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        Names {
            data: dir.join(format!("{key}.safetensors")),
            meta: dir.join(format!("{key}.meta")),
            lock: dir.join(format!("{key}.lock")),
            dir: dir.to_owned(),
            key,
        }
    }

    /// A temporary file's name for this entry: `<key>.<pid>-<n>.tmp`, unique in the process and
    /// across processes, and telling eviction whose it is.
    fn temporary(&self) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{}.{}-{n}.tmp", self.key, std::process::id()))
    }
}

/// What a meta file says before the data file's identity: what the entry of this object,
/// version and length must say.
fn described(identity: &str, version: &str, len: u64) -> String {
    format!("{FORMAT}\nobject {identity}\nversion {version}\nlength {len}\n")
}

/// The data file's identity as the meta file records it.
fn written(meta: &std::fs::Metadata) -> String {
    format!(
        "file {} {} {} {}\n",
        meta.dev(),
        meta.ino(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// The entry's bytes, mapped, when the entry is whole and is `object` at `version` (see the
/// module comment); `None` otherwise.
pub(crate) fn cached(names: &Names, object: &Object, version: &str) -> Option<Mmap> {
    let text = read_small(&names.meta)?;
    let recorded = text.strip_prefix(&described(object.identity(), version, object.len()))?;
    let file = open_no_follow(&names.data).ok()?;
    let meta = file.metadata().ok()?;
    if !ours(&meta) || meta.len() != object.len() || recorded != written(&meta) {
        return None;
    }
    // SAFETY: a file of the cache, which this library only ever replaces by renaming (never
    // writes in place); like any mapped local file, it must not be truncated while mapped.
    let map = unsafe { Mmap::map(&file) }.ok()?;
    let head = object.head();
    (map.len() as u64 == object.len() && map.get(..head.len()) == Some(head)).then_some(map)
}

/// Fetches `object` whole into the entry (see the module comment) and returns its bytes,
/// mapped. A temporary file left by a failure is removed.
pub(crate) fn fill(names: &Names, object: &Object, version: &str) -> io::Result<Result<Mmap>> {
    let temporary = names.temporary();
    let filled = fill_at(&temporary, names, object, version);
    if !matches!(filled, Ok(Ok(_))) {
        let _ = std::fs::remove_file(&temporary);
    }
    filled
}

fn fill_at(
    temporary: &Path,
    names: &Names,
    object: &Object,
    version: &str,
) -> io::Result<Result<Mmap>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(temporary)?;
    let len = i64::try_from(object.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the object is too large"))?;
    // SAFETY: our own descriptor.
    let reserved = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if reserved != 0 {
        return Err(io::Error::from_raw_os_error(reserved));
    }
    // SAFETY: a file this process just made under a name no one else uses, its length reserved.
    let map = unsafe { MmapMut::map_mut(&file) }?;
    let map = match object.fetch_into(map) {
        Ok(map) => map,
        Err(e) => return Ok(Err(e)),
    };
    map.flush()?;
    file.sync_all()?;
    std::fs::rename(temporary, &names.data)?;
    // The change time after the rename (which sets it): what a later open must find.
    let data = file.metadata()?;
    let text = described(object.identity(), version, object.len()) + &written(&data);
    let meta_temporary = names.temporary();
    let wrote = write_synced(&meta_temporary, text.as_bytes())
        .and_then(|()| std::fs::rename(&meta_temporary, &names.meta));
    if let Err(e) = wrote {
        let _ = std::fs::remove_file(&meta_temporary);
        let _ = std::fs::remove_file(&names.data);
        return Err(e);
    }
    // The renames themselves made durable.
    if let Ok(dir) = File::open(&names.dir) {
        let _ = dir.sync_all();
    }
    Ok(Ok(map.make_read_only()?))
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Removes the entry: the meta file first, so that the data file is never trusted alone.
pub(crate) fn remove(names: &Names) {
    let _ = std::fs::remove_file(&names.meta);
    let _ = std::fs::remove_file(&names.data);
}

/// Marks the entry used now (its meta file's modification time: what eviction orders by).
pub(crate) fn touch(names: &Names) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(names.meta.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a NUL-terminated path; a null `times` sets both times to now; a symbolic link
    // is not followed (it would touch another file).
    unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            std::ptr::null(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
}

/// Opens an entry's file for reading: never through a symbolic link, and without waiting on
/// something that is no regular file (a FIFO would block the open).
fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Whether an entry's file is a regular file of this user's (the directory is private, see
/// `cache::private`; this holds even when another user made a file in it before).
fn ours(meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    meta.is_file() && meta.uid() == unsafe { libc::geteuid() }
}

fn read_small(path: &Path) -> Option<String> {
    let file = open_no_follow(path).ok()?;
    if !ours(&file.metadata().ok()?) {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_META).read_to_string(&mut text).ok()?;
    Some(text)
}
