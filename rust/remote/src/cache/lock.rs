//! One entry's lock: `flock` on `<key>.lock`, so that processes (and threads: each lock is its
//! own open file description) fetching one object fetch it once, and an entry is never removed
//! while another holds it.
//!
//! A lock file is removed with its entry (by eviction, holding the lock). Another process may
//! have opened the old file just before and then wait on it: once it has the lock it checks
//! that the path still names the file it locked, and starts over if not, so that two holders
//! of "one" lock never coexist.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A held lock; released when dropped (closing the file releases `flock`).
pub(crate) struct Held {
    _file: File,
    path: PathBuf,
}

impl Held {
    /// Removes the lock file (with its entry), still holding the lock until dropped.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Waits for the lock at `path`, until `until` when given (then a `TimedOut` error).
pub(crate) fn lock(path: &Path, until: Option<Instant>) -> io::Result<Held> {
    loop {
        let file = open(path)?;
        match until {
            None => flock(&file, libc::LOCK_EX)?,
            Some(until) => loop {
                match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() >= until {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "another process is still fetching this object into the cache \
                                 at the deadline",
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e),
                }
            },
        }
        if still_named(&file, path) {
            return Ok(Held {
                _file: file,
                path: path.to_owned(),
            });
        }
    }
}

/// The lock at `path` if no one holds it now; `None` when someone does.
pub(crate) fn try_lock(path: &Path) -> io::Result<Option<Held>> {
    let file = open(path)?;
    match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) if still_named(&file, path) => Ok(Some(Held {
            _file: file,
            path: path.to_owned(),
        })),
        Ok(()) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

fn flock(file: &File, how: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: a descriptor this function's caller owns for the call.
        if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether `path` still names the file `file` is (not removed, nor replaced, since it was
/// opened).
fn still_named(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
