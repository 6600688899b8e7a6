//! The one safe way this crate opens a file for reading ([`open_regular`], [`read_regular`]),
//! and the one rule for opening a path a second time ([`Identity`], [`reopen`]): whatever opens
//! a path again (checkpoint shards between reads, the direct backend's `O_DIRECT` descriptor,
//! prefetch threads) gets the same file it validated, or an error, never another file's bytes.
//!
//! Why device, inode, size and modification time: a path can be renamed over (another inode),
//! and a file can be rewritten in place (same inode, other size or time). A file changed in
//! place within the same nanosecond at the same size is beyond what `stat` can tell.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

/// What tells one file from another at one path: device, inode, size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl Identity {
    /// The identity of an open file, from its `fstat`.
    pub(crate) fn of(meta: &Metadata) -> Identity {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// The error for a path that no longer holds the file that was opened.
pub(crate) fn replaced() -> io::Error {
    io::Error::other(
        "the file was replaced or changed since it was opened (its device, inode, size or \
         modification time differ); open it again to read the new file",
    )
}

/// Opens `path` again with `flags` (besides read-only and `O_NONBLOCK`) and checks that it is
/// still the file `id` describes. Errors are the open's own, or [`replaced`].
pub(crate) fn reopen(path: &Path, id: &Identity, flags: libc::c_int) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | flags)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || Identity::of(&meta) != *id {
        return Err(replaced());
    }
    Ok(file)
}

/// The one URL rule (`crate::is_url`) for paths: a path whose text is a URL (`s3://`,
/// `http://`, `https://`) is refused with an `Io` error saying to open it as a remote file,
/// never opened as the local file the kernel would make of it (`http:/host/m`, its `//`
/// folded). The message shows the URL redacted (it may carry a password or a signature).
pub(crate) fn refuse_url(path: &Path) -> Result<()> {
    match path.to_str() {
        Some(text) if crate::is_url(text) => Err(Error::io(
            Path::new(&crate::redact_url(text)),
            "open",
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "a URL, not a local path: open it as a remote file (SafeOpen::open_remote, \
                 Checkpoint::open_remote, st_file_open_remote)",
            ),
        )),
        _ => Ok(()),
    }
}

/// Opens `path` for reading the one safe way: `O_NONBLOCK`, so that a FIFO cannot block the
/// open forever (it has no effect on regular files), then `fstat` on the descriptor, refusing
/// anything but a regular file (directories, FIFOs, devices such as `/dev/zero`, sockets) with
/// an `Io` error. `what` says what the file should have been, for the message.
pub(crate) fn open_regular(path: &Path, what: &str) -> Result<(File, Metadata)> {
    refuse_url(path)?;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(path, "open", e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(Error::io(
            path,
            "open",
            io::Error::new(io::ErrorKind::InvalidInput, format!("{kind}, not {what}")),
        ));
    }
    Ok((file, meta))
}

/// Reads a whole regular file of at most `cap` bytes (see [`open_regular`]). The cap holds even
/// when the file grows while it is read: at most `cap + 1` bytes are ever taken.
pub(crate) fn read_regular(path: &Path, what: &str, cap: u64) -> Result<Vec<u8>> {
    let (file, meta) = open_regular(path, what)?;
    let too_large = |len: u64| {
        Error::io(
            path,
            "read",
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{len} bytes or more, over the {cap}-byte limit for {what}"),
            ),
        )
    };
    if meta.len() > cap {
        return Err(too_large(meta.len()));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(meta.len() as usize)
        .map_err(|_| Error::io(path, "read", out_of_memory(meta.len())))?;
    file.take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::io(path, "read", e))?;
    if out.len() as u64 > cap {
        return Err(too_large(out.len() as u64));
    }
    Ok(out)
}

pub(crate) fn out_of_memory(len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("cannot allocate {len} bytes to read into"),
    )
}

/// A zeroed buffer of `len` bytes, or an error when memory is short (a plain `vec!` aborts the
/// process instead, and a hostile file can name a tensor of any size up to the file's length).
pub(crate) fn zeroed(len: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| out_of_memory(len as u64))?;
    out.resize(len, 0);
    Ok(out)
}
