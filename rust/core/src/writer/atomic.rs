//! Replacing a file atomically: what happens to the target's path, mode, owner and to the
//! temporary file on the way.
//!
//! Decisions (docs/writing.md states them for users):
//! - A symlink is followed to the file it names (as `open` would), and that file is replaced; the
//!   link stays a link. A dangling link creates the file it points to.
//! - A directory, FIFO, socket or device node is refused with `Io`: replacing `/dev/null` or a
//!   pipe by a regular file is never what the caller meant.
//! - An existing file keeps its owner and group where the process may set them (`fchown`; EPERM
//!   is ignored), and exactly its permission bits; setuid/setgid are dropped when the owner or
//!   group could not be kept, so that they never apply to an identity they did not apply to.
//!   A new file gets `0666` minus the umask, as `open` gives.
//! - An existing file's extended attributes are copied to the new one, ACLs among them
//!   (`system.posix_acl_access`), so that replacing a file never widens who may read it. An
//!   attribute the process may not set (`security.*` and `trusted.*` need privileges a user
//!   rarely has) is left out; failing to copy any other (an ACL, a `user.*` attribute) fails
//!   the write before anything is replaced.
//! - The data goes to an unnamed file (`O_TMPFILE`) in the target's directory, so a writer killed
//!   mid-write leaves nothing behind. Once written (and synced), it is linked under a short fixed-
//!   size hidden name and renamed over the target; a kill between those two steps, a window of
//!   two system calls, leaves that fully written temporary file. Where `O_TMPFILE` or
//!   `/proc/self/fd` is unavailable, a named temporary file is used from the start, as before.
//! - A rename that fails leaves the file under its hidden name, so that it can be put in place
//!   again (a writer's `finish` tried again); it is removed when dropped, as a named one is.
//! - Temporary names never derive from the target's name, so a target name of up to 255 bytes
//!   (NAME_MAX) can be written.

use std::ffi::CString;
use std::fs::{self, File, Metadata};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Most symlinks followed before giving up, as the kernel's own limit.
const MAX_SYMLINKS: usize = 40;

/// Runs `fill` on a temporary file beside the file `path` names, then puts it in place.
pub(super) fn replace(
    path: &Path,
    synced: bool,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    let mut staged = Staged::create(path)?;
    let written = (|| -> io::Result<()> {
        // Large writes pass straight through; small tensors are batched.
        let mut out = io::BufWriter::with_capacity(1 << 20, staged.file());
        fill(&mut out)?;
        out.flush()
    })();
    written.map_err(|e| Error::io(path, "write", e))?;
    staged.commit(synced)
}

/// A file being written in place of the one `path` names: a temporary file in the target's
/// directory that already carries the target's owner, mode and extended attributes, put in
/// place by [`Staged::commit`] (or [`Staged::sync`] then [`Staged::persist`], for a set of
/// files published together). Dropped before that, it leaves nothing behind (see the module
/// comment for the named fallback). Positioned writes (`pwrite`) from several threads may fill
/// it at once.
///
/// A failed [`Staged::persist`] leaves it as it was, so that it can be put in place again; one
/// put in place can be taken back out of the target's name ([`Staged::unplace_io`]) while a set is
/// rolled back.
pub(crate) struct Staged {
    /// The path as the caller gave it, named by errors.
    path: PathBuf,
    dir: PathBuf,
    name: CString,
    temp: Temp,
}

impl Staged {
    /// A temporary file for the file `path` names (a symlink is followed).
    pub(crate) fn create(path: &Path) -> Result<Staged> {
        // A URL is never written as the local file the kernel would make of it.
        crate::open::refuse_url(path)?;
        let target = resolve_symlinks(path).map_err(|e| Error::io(path, "resolve", e))?;
        let existing = existing_file(&target).map_err(|e| Error::io(path, "write", e))?;
        let (dir, name) = split(&target).map_err(|e| Error::io(path, "write", e))?;
        let temp = Temp::create(&dir, existing.is_some())
            .map_err(|e| Error::io(path, "create a temporary file in the target directory", e))?;
        if let Some(meta) = &existing {
            keep_owner_and_mode(&temp.file, meta)
                .and_then(|()| keep_xattrs(&target, &temp.file))
                .map_err(|e| Error::io(path, "write", e))?;
        }
        Ok(Staged {
            path: path.to_path_buf(),
            dir,
            name,
            temp,
        })
    }

    /// The temporary file.
    pub(crate) fn file(&self) -> &File {
        &self.temp.file
    }

    /// The path as the caller gave it.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file it replaces, symlinks followed: where [`Staged::persist`] puts it.
    pub(crate) fn target(&self) -> PathBuf {
        self.dir
            .join(std::ffi::OsStr::from_bytes(self.name.as_bytes()))
    }

    /// Waits for the disk to hold the file's bytes.
    pub(crate) fn sync(&self) -> Result<()> {
        self.file()
            .sync_all()
            .map_err(|e| Error::io(&self.path, "sync to disk", e))
    }

    /// Puts the file in place (its directory not synced: see [`sync_dir`]). On failure nothing
    /// changed: it may be tried again.
    pub(crate) fn persist(&mut self) -> Result<()> {
        self.persist_io()
            .map_err(|e| Error::io(&self.path, "rename", e))
    }

    /// [`Staged::persist`] with the system's error.
    pub(crate) fn persist_io(&mut self) -> io::Result<()> {
        self.temp.persist(&self.dir, &self.name)
    }

    /// Takes a file [`Staged::persist`] put in place back out of the target's name, to a hidden
    /// temporary name, so that it can be put in place again later (a set rolled back).
    pub(crate) fn unplace_io(&mut self) -> io::Result<()> {
        self.temp.unplace(&self.dir, &self.name)
    }

    /// Whether the file is in place.
    pub(crate) fn is_placed(&self) -> bool {
        matches!(self.temp.state, State::Placed)
    }

    /// Syncs (when `synced`) and puts the file in place, then makes the rename durable.
    pub(crate) fn commit(&mut self, synced: bool) -> Result<()> {
        if synced {
            self.sync()?;
        }
        self.persist()?;
        if synced {
            sync_dir(&self.dir);
        }
        Ok(())
    }
}

/// Makes renames in `dir` durable. Some filesystems refuse fsync on directories; the data is
/// already safe, so that is not an error.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Follows symlinks in the last component until it names a non-link (or nothing).
pub(super) fn resolve_symlinks(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// The metadata of the regular file at `target`, `None` when there is none, or an error for
/// anything that is not a regular file.
fn existing_file(target: &Path) -> io::Result<Option<Metadata>> {
    let meta = match fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let t = meta.file_type();
    if t.is_file() {
        return Ok(Some(meta));
    }
    use std::os::unix::fs::FileTypeExt;
    let what = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device node"
    } else {
        "a symlink that changed while it was followed"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("the path is {what}, not a regular file; refusing to replace it"),
    ))
}

/// The directory to write in (`.` for a bare name) and the file name.
fn split(target: &Path) -> io::Result<(PathBuf, CString)> {
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, cstring(name.as_bytes())?))
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

/// Gives `file` the owner, group and permission bits of `meta` (see the module comment).
fn keep_owner_and_mode(file: &File, meta: &Metadata) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: plain syscalls on a descriptor we own. `uid_t::MAX` is -1: "leave unchanged".
    if unsafe { libc::fchown(fd, meta.uid(), meta.gid()) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(e);
        }
        // Not root: the group can still be kept where we are a member of it.
        let _ = unsafe { libc::fchown(fd, libc::uid_t::MAX, meta.gid()) };
    }
    let now = file.metadata()?;
    let mut mode = meta.mode() & 0o7777;
    if now.uid() != meta.uid() {
        mode &= !libc::S_ISUID;
    }
    if now.gid() != meta.gid() {
        mode &= !libc::S_ISGID;
    }
    file.set_permissions(fs::Permissions::from_mode(mode))
}

/// Copies the extended attributes of the file at `from` (not a symlink) to `to` (see the
/// module comment).
fn keep_xattrs(from: &Path, to: &File) -> io::Result<()> {
    let from = cstring(from.as_os_str().as_bytes())?;
    // SAFETY (every call below): valid NUL-terminated strings, buffers of the lengths passed,
    // and a descriptor we own.
    let names = xattr_buffer(|buf, len| unsafe { libc::llistxattr(from.as_ptr(), buf, len) })?;
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = cstring(name)?;
        let value = match xattr_buffer(|buf, len| unsafe {
            libc::lgetxattr(from.as_ptr(), name.as_ptr(), buf.cast(), len)
        }) {
            Ok(v) => v,
            // Removed since it was listed: nothing to copy.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
            Err(e) => return Err(e),
        };
        let set = unsafe {
            libc::fsetxattr(
                to.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if set != 0 {
            let e = io::Error::last_os_error();
            let privileged = [&b"security."[..], b"trusted."]
                .iter()
                .any(|p| name.as_bytes().starts_with(p));
            if privileged && matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
                continue;
            }
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot copy the extended attribute `{}` (an ACL or xattr of the file being \
                     replaced): {e}",
                    String::from_utf8_lossy(name.as_bytes())
                ),
            ));
        }
    }
    Ok(())
}

/// The bytes an xattr call (`call(buf, len)`, returning the length or -1) gives, sized by
/// asking first; empty where the filesystem has no extended attributes.
fn xattr_buffer(call: impl Fn(*mut libc::c_char, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let len = call(std::ptr::null_mut(), 0);
        if len < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOTSUP) => Ok(Vec::new()),
                _ => Err(e),
            };
        }
        let mut buf = vec![0u8; len as usize];
        let got = call(buf.as_mut_ptr().cast(), buf.len());
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        // Grown between the two calls: ask again.
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

/// A short hidden name of fixed length, unique within this process: `.st-<16 hex>.tmp`.
pub(crate) fn temp_name() -> CString {
    CString::new(format!(".st-{:016x}.tmp", unique_id())).unwrap_or_default()
}

/// A number no other call in any running process gets: the process id, then a counter.
pub(crate) fn unique_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
    (u64::from(std::process::id()) << 32) | n
}

/// The file being written and where it is.
struct Temp {
    file: File,
    state: State,
}

/// Where a staged file is: unnamed until it is complete, or named where that is unsupported;
/// then in place, or back under a hidden name after a set was rolled back.
enum State {
    /// An `O_TMPFILE` file, linked into `dir_fd`'s directory when put in place.
    Unnamed { dir_fd: File },
    /// A hidden temporary file at `path`, removed when dropped.
    Named { path: PathBuf },
    /// Under the target's name.
    Placed,
}

impl Temp {
    /// For an existing target the file starts private (0600) and gets the target's mode before
    /// any byte is written; a new file starts at 0666 minus the umask.
    fn create(dir: &Path, private: bool) -> io::Result<Temp> {
        let mode = if private { 0o600 } else { 0o666 };
        match Temp::unnamed(dir, mode) {
            Ok(Some(t)) => return Ok(t),
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        Temp::named(dir, mode)
    }

    /// `Ok(None)` where the filesystem or kernel lacks `O_TMPFILE`, or `/proc` is not mounted
    /// (the file could then never be given a name).
    fn unnamed(dir: &Path, mode: u32) -> io::Result<Option<Temp>> {
        let file = match File::options()
            .write(true)
            .mode(mode)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(dir)
        {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if fs::metadata(proc_fd(&file)).is_err() {
            return Ok(None);
        }
        let dir_fd = File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        Ok(Some(Temp {
            file,
            state: State::Unnamed { dir_fd },
        }))
    }

    fn named(dir: &Path, mode: u32) -> io::Result<Temp> {
        loop {
            let name = temp_name();
            let path = dir.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
            match File::options()
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(Temp {
                        file,
                        state: State::Named { path },
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Puts the complete file at `dir/name`, replacing what is there. On failure the file is
    /// where it was.
    fn persist(&mut self, dir: &Path, name: &CString) -> io::Result<()> {
        let to = dir.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        match &self.state {
            State::Placed => Ok(()),
            State::Named { path } => {
                fs::rename(path, to)?;
                self.state = State::Placed;
                Ok(())
            }
            State::Unnamed { dir_fd } => {
                let from = cstring(proc_fd(&self.file).as_os_str().as_bytes())?;
                let d = dir_fd.as_raw_fd();
                loop {
                    let temp = temp_name();
                    // SAFETY: valid NUL-terminated strings and descriptors we own.
                    let linked = unsafe {
                        libc::linkat(
                            libc::AT_FDCWD,
                            from.as_ptr(),
                            d,
                            temp.as_ptr(),
                            libc::AT_SYMLINK_FOLLOW,
                        )
                    };
                    if linked != 0 {
                        let e = io::Error::last_os_error();
                        if e.kind() == io::ErrorKind::AlreadyExists {
                            continue;
                        }
                        return Err(e);
                    }
                    // The window a kill leaves a (complete) temporary file in: from here to the
                    // end of `renameat`.
                    // SAFETY: as above.
                    if unsafe { libc::renameat(d, temp.as_ptr(), d, name.as_ptr()) } != 0 {
                        let e = io::Error::last_os_error();
                        // The file is named now, so it can no longer be linked from its
                        // descriptor: it stays under the hidden name, to be tried again.
                        self.state = State::Named {
                            path: dir.join(std::ffi::OsStr::from_bytes(temp.as_bytes())),
                        };
                        return Err(e);
                    }
                    self.state = State::Placed;
                    return Ok(());
                }
            }
        }
    }

    /// Moves a file put in place at `dir/name` back to a hidden name (see [`Staged::unplace_io`]).
    fn unplace(&mut self, dir: &Path, name: &CString) -> io::Result<()> {
        if !matches!(self.state, State::Placed) {
            return Ok(());
        }
        let from = dir.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let to = dir.join(std::ffi::OsStr::from_bytes(temp_name().as_bytes()));
        fs::rename(from, &to)?;
        self.state = State::Named { path: to };
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        // An unnamed file vanishes with its descriptor; a named one must be removed.
        if let State::Named { path } = &self.state {
            let _ = fs::remove_file(path);
        }
    }
}

fn proc_fd(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}
