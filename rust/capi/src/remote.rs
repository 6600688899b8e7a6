//! Remote files and checkpoints: `s3://bucket/key` on any S3-compatible store and `http://` or
//! `https://` URLs, as C++'s `SafeOpen::open_remote` and `Checkpoint::open_remote` open them
//! (docs/remote.md). In a build without remote support (`-DSAFETENSORS_REMOTE=OFF`) every open
//! is `ST_ERR_IO` saying so (the remote crate's answer); `st_remote_built` tells.

use std::ffi::c_char;
use std::os::raw::c_int;
use std::path::Path;

use safetensors_core::{CheckpointOptions, OpenOptions};
use safetensors_remote::{MillisOptions, RemoteOptions};

use crate::args::Call;
use crate::checkpoint::st_checkpoint;
use crate::file::{st_file, ST_OPEN_ALLOW_TRAILING_BYTES, ST_OPEN_LENIENT};
use crate::status::{run, st_error, Res};

/// `st_remote_options.flags`: fetch and validate the header only; every read of tensor bytes
/// is `ST_ERR_IO` saying so.
pub const ST_REMOTE_HEADER_ONLY: u32 = 0x1;
/// `st_remote_options.flags`: fetch tensor bytes when they are read (each read's exact byte
/// runs, with concurrent ranged GETs of the pinned version) instead of the whole object at open.
pub const ST_REMOTE_ON_DEMAND: u32 = 0x2;
/// `st_remote_options.flags`: keep whole files in a local cache, in `cache_dir` (NULL: the user's
/// cache directory, `$XDG_CACHE_HOME/safetensors` or `~/.cache/safetensors`): a file fetched
/// whole is written there and mapped, and a later open of the same URL and version maps it after
/// one ranged GET (docs/remote.md).
pub const ST_REMOTE_CACHE: u32 = 0x4;

/// How a remote file is read. Fill it with `st_remote_options_default`, then change what you
/// need; passing NULL where one is asked for means the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_remote_options {
    /// Ranged GETs in flight at once (default 16; 0 counts as 1).
    pub concurrency: usize,
    /// Bytes one GET asks for (default 8 MiB; less than 4096 counts as 4096).
    pub part_size: usize,
    /// Bytes the first GET asks for: the header and, speculatively, the first tensors (default
    /// 1 MiB).
    pub first_read: usize,
    /// Longest one request may take, body included, before it is retried (default 30000).
    pub request_timeout_ms: u64,
    /// Longest a connection may take to open (default 5000).
    pub connect_timeout_ms: u64,
    /// Retries of a failed request (connection errors, timeouts, 5xx, 429), with backoff
    /// (default 3).
    pub max_retries: usize,
    /// Longest the open may take (with `ST_REMOTE_ON_DEMAND`: the open, then each read on its
    /// own); 0 for no limit beyond each request's timeout (the default).
    pub deadline_ms: u64,
    /// `ST_REMOTE_HEADER_ONLY`, `ST_REMOTE_ON_DEMAND`, `ST_REMOTE_CACHE` (default none: the whole
    /// object is fetched at open and held in memory).
    pub flags: u32,
    /// With `ST_REMOTE_CACHE`: the cache's directory, a NUL-terminated path lent for the call;
    /// NULL for the user's cache directory (the default).
    pub cache_dir: *const c_char,
    /// With `ST_REMOTE_CACHE`: bytes the cache may hold, the least recently used files removed
    /// past it; a file larger is not cached. 0 for the default (128 GiB).
    pub cache_limit: u64,
}

/// Fills `options` with the defaults (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn st_remote_options_default(options: *mut st_remote_options) {
    if !options.is_null() {
        // SAFETY: the caller's pointer to one st_remote_options.
        unsafe { options.write(defaults()) };
    }
}

/// The remote crate's defaults, so that C, C++ and Rust never disagree.
fn defaults() -> st_remote_options {
    let d = MillisOptions::from(&RemoteOptions::default());
    st_remote_options {
        concurrency: d.concurrency,
        part_size: d.part_size,
        first_read: d.first_read,
        request_timeout_ms: d.request_timeout_ms,
        connect_timeout_ms: d.connect_timeout_ms,
        max_retries: d.max_retries,
        deadline_ms: d.deadline_ms,
        flags: 0,
        cache_dir: std::ptr::null(),
        cache_limit: d.cache_limit,
    }
}

/// Whether this build opens remote files (configured with `SAFETENSORS_REMOTE`, the default).
#[no_mangle]
pub extern "C" fn st_remote_built() -> bool {
    safetensors_remote::BUILT
}

/// Whether `s` names a remote file rather than a local path: it starts with `s3://`, `gs://`,
/// `az://`, `http://` or `https://` (the scheme in any case). NULL is not a URL.
#[no_mangle]
pub unsafe extern "C" fn st_is_url(s: *const c_char) -> bool {
    if s.is_null() {
        return false;
    }
    // SAFETY: the caller's NUL-terminated string.
    let bytes = unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes();
    std::str::from_utf8(bytes).is_ok_and(safetensors_core::is_url)
}

/// The options `p` points to, or the defaults for NULL.
unsafe fn options_or_default(c: Call, p: *const st_remote_options) -> Res<st_remote_options> {
    if p.is_null() {
        return Ok(defaults());
    }
    // SAFETY: the caller's pointer to one st_remote_options.
    let o = unsafe { *p };
    c.flags(
        o.flags,
        ST_REMOTE_HEADER_ONLY | ST_REMOTE_ON_DEMAND | ST_REMOTE_CACHE,
    )?;
    Ok(o)
}

/// Opens the remote file at `url`: its header with one ranged GET (validated with every rule a
/// local file gets), its version pinned (ETag), then, as `options` say, every byte into memory,
/// nothing more (`ST_REMOTE_HEADER_ONLY`), or each read's bytes when it is made
/// (`ST_REMOTE_ON_DEMAND`). `options` may be NULL (the defaults). `flags`:
/// `ST_OPEN_ALLOW_TRAILING_BYTES`. Credentials come from the environment (`AWS_*`), never from
/// the URL: a URL with user information is refused; an `http(s)://` URL's query (a pre-signed
/// URL's signature) is sent with every request of that object and never shown.
///
/// Errors: `ST_ERR_IO` naming the URL and what the server did (no such object, access denied,
/// the object changed while read, a wrong answer, a timeout), and a header's own errors.
#[no_mangle]
pub unsafe extern "C" fn st_file_open_remote(
    url: *const c_char,
    options: *const st_remote_options,
    flags: u32,
    out: *mut *mut st_file,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_open_remote");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (url, out) = unsafe { (c.path(url, "url")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let remote = unsafe { options_or_default(c, options)? };
        c.flags(flags, ST_OPEN_ALLOW_TRAILING_BYTES)?;
        let open = OpenOptions {
            allow_trailing_bytes: flags & ST_OPEN_ALLOW_TRAILING_BYTES != 0,
            ..OpenOptions::default()
        };
        // SAFETY: the options the caller passed to this call.
        let file = safetensors_remote::open(url_text(url)?, &unsafe { to_remote(&remote) }, open)?;
        *out = Box::into_raw(Box::new(st_file::new(file)));
        Ok(())
    })
}

/// Opens a remote checkpoint: an index (a URL whose path ends in `.json`) fetched whole and
/// checked as a local one, whose shards are the objects next to it, each opened with `options`
/// on first use and checked against the index; or one remote file as a checkpoint of one
/// shard. `options` may be NULL. `flags`: `ST_OPEN_LENIENT`, `ST_OPEN_ALLOW_TRAILING_BYTES`. A
/// shard the server lacks is `ST_ERR_SHARD_MISSING` when first used.
///
/// Errors: as `st_checkpoint_open`, and `st_file_open_remote`'s.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_open_remote(
    url: *const c_char,
    options: *const st_remote_options,
    flags: u32,
    out: *mut *mut st_checkpoint,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_open_remote");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (url, out) = unsafe { (c.path(url, "url")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let remote = unsafe { options_or_default(c, options)? };
        c.flags(flags, ST_OPEN_ALLOW_TRAILING_BYTES | ST_OPEN_LENIENT)?;
        let options = CheckpointOptions {
            lenient: flags & ST_OPEN_LENIENT != 0,
            allow_trailing_bytes: flags & ST_OPEN_ALLOW_TRAILING_BYTES != 0,
            ..CheckpointOptions::default()
        };
        // SAFETY: the options the caller passed to this call.
        let remote = unsafe { to_remote(&remote) };
        let inner = safetensors_remote::open_checkpoint(url_text(url)?, &remote, options)?;
        *out = Box::into_raw(Box::new(st_checkpoint::new(inner)));
        Ok(())
    })
}

/// The URL as text: URLs are UTF-8 (one that is not is refused as an invalid URL, shown
/// lossily), never read lossily as another object's.
fn url_text(url: &Path) -> Res<&str> {
    use std::os::unix::ffi::OsStrExt;
    Ok(safetensors_core::url_text(url.as_os_str().as_bytes())?)
}

/// `o` as the remote crate takes it (one conversion, `MillisOptions`, for C and C++).
///
/// SAFETY: `o.cache_dir` is NULL or the caller's NUL-terminated path, lent for the call.
unsafe fn to_remote(o: &st_remote_options) -> RemoteOptions {
    let millis = MillisOptions {
        concurrency: o.concurrency,
        part_size: o.part_size,
        first_read: o.first_read,
        request_timeout_ms: o.request_timeout_ms,
        connect_timeout_ms: o.connect_timeout_ms,
        max_retries: o.max_retries,
        deadline_ms: o.deadline_ms,
        header_only: o.flags & ST_REMOTE_HEADER_ONLY != 0,
        on_demand: o.flags & ST_REMOTE_ON_DEMAND != 0,
        cache_limit: o.cache_limit,
    };
    // NULL (or empty) is the user's cache directory: an empty path, to the remote crate.
    let cache = (o.flags & ST_REMOTE_CACHE != 0).then(|| match o.cache_dir.is_null() {
        true => std::path::PathBuf::new(),
        // SAFETY: the caller's NUL-terminated path (see above).
        false => {
            use std::os::unix::ffi::OsStrExt;
            let bytes = unsafe { std::ffi::CStr::from_ptr(o.cache_dir) }.to_bytes();
            std::ffi::OsStr::from_bytes(bytes).into()
        }
    });
    RemoteOptions {
        cache,
        ..millis.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::ST_ERR_IO;

    #[test]
    fn a_url_that_is_not_utf8_is_refused_never_read_as_another() {
        // Nothing listens on port 1: read lossily (`\xff` as U+FFFD), the URL would be tried
        // as another object's and fail on the connection instead.
        let urls: [&[u8]; 2] = [
            b"http://127.0.0.1:1/m\xff.safetensors\0",
            b"http://127.0.0.1:1/m\xff.index.json\0",
        ];
        for (k, url) in urls.into_iter().enumerate() {
            let mut err = st_error {
                kind: -1,
                message: std::ptr::null_mut(),
                message_len: 0,
            };
            // SAFETY: a NUL-terminated URL, NULL options (the defaults), valid out-pointers.
            let rc = unsafe {
                if k == 0 {
                    let mut out = std::ptr::null_mut();
                    st_file_open_remote(
                        url.as_ptr().cast(),
                        std::ptr::null(),
                        0,
                        &mut out,
                        &mut err,
                    )
                } else {
                    let mut out = std::ptr::null_mut();
                    st_checkpoint_open_remote(
                        url.as_ptr().cast(),
                        std::ptr::null(),
                        0,
                        &mut out,
                        &mut err,
                    )
                }
            };
            assert_eq!(rc, crate::status::ST_FAILED);
            assert_eq!(err.kind, ST_ERR_IO);
            // SAFETY: the message the library wrote, `message_len` bytes.
            let text = unsafe {
                std::slice::from_raw_parts(err.message.cast::<u8>(), err.message_len).to_vec()
            };
            let text = String::from_utf8_lossy(&text);
            assert!(text.contains("UTF-8"), "{text}");
            assert!(text.contains("http://127.0.0.1:1/m"), "{text}");
            // SAFETY: the error the call filled.
            unsafe { crate::status::st_error_clear(&mut err) };
        }
    }

    /// The one answer of a build without remote files comes from the remote crate (run with
    /// the feature off by the `cargo_test_not_built` test); a build with them tries the server.
    #[test]
    fn a_build_without_remote_files_says_so_and_one_with_them_tries() {
        let url = b"http://127.0.0.1:1/m.safetensors?X-Amz-Signature=hidden\0";
        let mut err = st_error {
            kind: -1,
            message: std::ptr::null_mut(),
            message_len: 0,
        };
        let mut out = std::ptr::null_mut();
        // SAFETY: a NUL-terminated URL, NULL options (the defaults), valid out-pointers.
        let rc = unsafe {
            st_file_open_remote(url.as_ptr().cast(), std::ptr::null(), 0, &mut out, &mut err)
        };
        assert_eq!(rc, crate::status::ST_FAILED);
        assert!(out.is_null());
        assert_eq!(err.kind, ST_ERR_IO);
        // SAFETY: the message the library wrote, `message_len` bytes.
        let text = unsafe {
            std::slice::from_raw_parts(err.message.cast::<u8>(), err.message_len).to_vec()
        };
        let text = String::from_utf8_lossy(&text);
        assert_eq!(
            text.contains("cannot open remote files"),
            !safetensors_remote::BUILT,
            "{text}"
        );
        assert_eq!(st_remote_built(), safetensors_remote::BUILT);
        assert!(text.contains("http://127.0.0.1:1/m.safetensors"), "{text}");
        assert!(!text.contains("hidden"), "{text}");
        // SAFETY: the error the call filled.
        unsafe { crate::status::st_error_clear(&mut err) };
    }
}
