//! `open_remote`: a remote safetensors file (`s3://`, `http://`, `https://`) as a `File` in
//! memory, filled by concurrent ranged GETs (see `rust/remote` and docs/remote.md). The remote
//! crate is called the same way in every build: without its transport (the `remote` feature
//! off) it answers every open with an `Io` error saying so, so the C++ API is the same in every
//! build.

use std::sync::Arc;

use safetensors_core::OpenOptions;

use crate::checkpoint::Checkpoint;
use crate::file::File;
use crate::status::{guard, handed_over, Bytes, Status};
use ffi::RemoteOptions;

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        include!("safetensors/ffi/src/file.rs.h");
        include!("safetensors/ffi/src/checkpoint.rs.h");
        type Status = crate::status::ffi::Status;
        type Bytes = crate::status::ffi::Bytes;
        type File = crate::file::File;
        type Checkpoint = crate::checkpoint::Checkpoint;
    }

    /// `safetensors::RemoteOptions` as it crosses: durations in milliseconds, a deadline of 0
    /// for none, the cache's directory as bytes.
    #[derive(Debug, Clone, Copy)]
    struct RemoteOptions {
        concurrency: usize,
        part_size: usize,
        first_read: usize,
        request_timeout_ms: u64,
        connect_timeout_ms: u64,
        max_retries: usize,
        deadline_ms: u64,
        header_only: bool,
        on_demand: bool,
        /// Whether whole files go through a local cache, in `cache_dir` (a path lent for the
        /// call; empty for the user's cache directory).
        cache: bool,
        cache_dir: Bytes,
        cache_limit: u64,
    }

    extern "Rust" {
        /// Whether this build opens remote files (the `remote` feature).
        fn remote_built() -> bool;
        /// Whether `s` is a URL (`s3://`, `gs://`, `az://`, `http(s)://`) rather than a local path.
        fn is_url(s: Bytes) -> bool;
        /// `url` as messages show it: no user information, query or fragment (the core's
        /// `redact_url`).
        fn redact_url(url: Bytes) -> String;
        /// Opens the object at `url`: the header (validated), then every byte into memory, or
        /// (`on_demand`) each read's bytes when it is made. `allow_trailing_bytes` as for local
        /// files. Null on failure.
        fn open_remote(
            url: Bytes,
            options: &RemoteOptions,
            allow_trailing_bytes: bool,
            status: &mut Status,
        ) -> *mut File;
        /// Opens a remote checkpoint: an index (`.json`) whose shards are objects next to it,
        /// each opened with `options` on first use, or one remote file. Null on failure.
        fn open_remote_checkpoint(
            url: Bytes,
            options: &RemoteOptions,
            lenient: bool,
            allow_trailing_bytes: bool,
            status: &mut Status,
        ) -> *mut Checkpoint;
    }
}

/// The core's rule (`safetensors_core::is_url`), the same in builds without remote support, so
/// that a URL is never opened as a local path there either.
pub fn is_url(s: Bytes) -> bool {
    // SAFETY: C++ lends the bytes for this call (`detail::bytes`).
    std::str::from_utf8(unsafe { s.get() }).is_ok_and(safetensors_core::is_url)
}

/// The core's rule (`safetensors_core::redact_url`), for what C++ prints of a URL (the CLI's
/// lines and `--json`), in every build. Bytes that are not UTF-8 are shown lossily.
pub fn redact_url(url: Bytes) -> String {
    // SAFETY: C++ lends the bytes for this call (`detail::bytes`).
    safetensors_core::redact_url(&String::from_utf8_lossy(unsafe { url.get() }))
}

/// Whether this build opens remote files (the remote crate's answer).
pub fn remote_built() -> bool {
    safetensors_remote::BUILT
}

/// `o` as the remote crate takes it (one conversion, `MillisOptions`, for C and C++).
fn options(o: &RemoteOptions) -> safetensors_remote::RemoteOptions {
    let millis = safetensors_remote::MillisOptions {
        concurrency: o.concurrency,
        part_size: o.part_size,
        first_read: o.first_read,
        request_timeout_ms: o.request_timeout_ms,
        connect_timeout_ms: o.connect_timeout_ms,
        max_retries: o.max_retries,
        deadline_ms: o.deadline_ms,
        header_only: o.header_only,
        on_demand: o.on_demand,
        cache_limit: o.cache_limit,
    };
    let cache = o.cache.then(|| {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: C++ lends the path's bytes for this call (`detail::bytes`).
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(unsafe { o.cache_dir.get() }))
    });
    safetensors_remote::RemoteOptions {
        cache,
        ..millis.into()
    }
}

pub fn open_remote(
    url: Bytes,
    remote: &RemoteOptions,
    allow_trailing_bytes: bool,
    status: &mut Status,
) -> *mut File {
    guard(status, || {
        // SAFETY: C++ lends the URL's bytes for this call (`detail::bytes`).
        let url = safetensors_core::url_text(unsafe { url.get() })?;
        let open = OpenOptions {
            allow_trailing_bytes,
            ..OpenOptions::default()
        };
        let file = safetensors_remote::open(url, &options(remote), open)?;
        Ok(handed_over(File::wrap(Arc::new(file))))
    })
}

pub fn open_remote_checkpoint(
    url: Bytes,
    remote: &RemoteOptions,
    lenient: bool,
    allow_trailing_bytes: bool,
    status: &mut Status,
) -> *mut Checkpoint {
    guard(status, || {
        // SAFETY: C++ lends the URL's bytes for this call (`detail::bytes`).
        let url = safetensors_core::url_text(unsafe { url.get() })?;
        let checkpoint = safetensors_core::CheckpointOptions {
            lenient,
            allow_trailing_bytes,
            ..Default::default()
        };
        let ckpt = safetensors_remote::open_checkpoint(url, &options(remote), checkpoint)?;
        Ok(handed_over(Checkpoint::wrap(ckpt)))
    })
}
