//! A local cache of whole remote files ([`crate::RemoteOptions::cache`]): what an open does
//! with it. The open has read the object's header and pinned its version (one ranged GET, as
//! every open does); then, holding the entry's lock ([`lock`]):
//!
//! - an entry for this object and version that is whole and agrees with the bytes just fetched
//!   ([`entry::cached`]) is mapped and validated as a local file, and used;
//! - else (none, another version's, or one corrupt or truncated) a whole open fetches the
//!   object into the entry ([`entry::fill`]), maps it, and then keeps the cache within its
//!   bound ([`evict`]); an on-demand open reads on demand and writes nothing.
//!
//! Processes (and threads) opening one object at once fetch it once: the first holds the lock
//! while it fetches, the others wait for it, then find the entry whole. Objects whose server
//! gives neither an ETag nor a modification time, and objects larger than the bound, are not
//! cached (nothing would tell their versions apart; nothing could stay). Header-only opens
//! never touch the cache.

mod entry;
mod evict;
mod lock;

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use safetensors_core::{Error, OpenOptions, Result, SafeFile};

use crate::error::remote;
use crate::fetch::Object;

/// The user's cache directory for remote files: `$XDG_CACHE_HOME/safetensors`, else
/// `$HOME/.cache/safetensors` (the XDG base directory rule: a relative `XDG_CACHE_HOME` is
/// ignored); `None` when neither variable gives an absolute path. What an empty
/// [`crate::RemoteOptions::cache`] means.
///
/// ```
/// if let Some(dir) = safetensors_remote::default_cache_dir() {
///     assert!(dir.ends_with("safetensors"));
/// }
/// ```
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    var("XDG_CACHE_HOME")
        .map(|d| d.join("safetensors"))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("safetensors")))
}

/// What the cache did for an open.
pub(crate) enum Opened {
    /// The file, mapped from the cache.
    File(SafeFile),
    /// Not cached: the object, to be read as without a cache.
    Uncached(Object),
}

/// Opens `object` through the cache its options name (see the module comment).
pub(crate) fn open(object: Object, options: OpenOptions) -> Result<Opened> {
    let remote = object.options();
    let (Some(dir), Some(version)) = (remote.cache.clone(), object.version()) else {
        return Ok(Opened::Uncached(object));
    };
    let limit = remote.cache_limit;
    if remote.header_only || object.len() > limit {
        return Ok(Opened::Uncached(object));
    }
    let dir = directory(&object, &dir)?;
    let names = entry::Names::new(&dir, object.identity(), &version);
    let held = lock::lock(&names.lock, object.deadline_at())
        .map_err(|e| cache_error(&object, &dir, "cannot lock its entry", e))?;
    if let Some(map) = entry::cached(&names, &object, &version) {
        if let Ok(file) = SafeFile::from_memory(object.name(), Box::new(map), options) {
            entry::touch(&names);
            return Ok(Opened::File(file));
        }
    }
    // Whatever the entry holds is not this version whole: never used, and replaced.
    entry::remove(&names);
    if remote.on_demand {
        return Ok(Opened::Uncached(object));
    }
    // Room for the new entry first, so that a cache as large as its disk still takes it.
    evict::evict(&dir, limit.saturating_sub(object.len()), &names.key);
    let map = entry::fill(&names, &object, &version)
        .map_err(|e| cache_error(&object, &dir, "cannot write the file into it", e))??;
    drop(held);
    evict::evict(&dir, limit, &names.key);
    Ok(Opened::File(SafeFile::from_memory(
        object.name(),
        Box::new(map),
        options,
    )?))
}

/// The cache directory `dir` names (empty: the user's), made if missing (readable by its owner
/// only: it holds what the user's credentials fetched).
fn directory(object: &Object, dir: &Path) -> Result<PathBuf> {
    let dir = if dir.as_os_str().is_empty() {
        default_cache_dir().ok_or_else(|| {
            remote(
                object.name(),
                "cache",
                io::ErrorKind::NotFound,
                "no cache directory: neither XDG_CACHE_HOME nor HOME names an absolute path; \
                 name a directory for the cache, or open without one"
                    .to_owned(),
            )
        })?
    } else {
        dir.to_owned()
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| cache_error(object, &dir, "cannot make it", e))?;
    private(&dir).map_err(|e| cache_error(object, &dir, "cannot be used", e))?;
    Ok(dir)
}

/// Whether `dir` (a symbolic link followed: a cache on another disk is fine) is a directory of
/// this user's that nobody else can write into: anyone who can could plant an entry the
/// cache would map as the object (its key is a digest of the URL and the public version).
fn private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let why = if !meta.is_dir() {
        "it is not a directory".to_owned()
    } else if meta.uid() != me {
        format!("it belongs to another user (uid {})", meta.uid())
    } else if meta.mode() & 0o022 != 0 {
        format!("others can write into it (mode {:o})", meta.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{why}; a cache must be a directory of your own that only you can write (one that \
             is missing is made so)"
        ),
    ))
}

/// A failure of the cache directory itself: an `Io` error naming the URL and the directory.
fn cache_error(object: &Object, dir: &Path, what: &str, e: io::Error) -> Error {
    remote(
        object.name(),
        "cache",
        e.kind(),
        format!(
            "the cache directory {}: {what}: {e}; name another directory, or open without a \
             cache",
            dir.display()
        ),
    )
}
