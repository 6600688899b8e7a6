//! A build with remote files: `open_remote` over `safetensors_remote::open`.

use std::sync::Arc;

use safetensors_core::OpenOptions;

use super::ffi::RemoteOptions;
use crate::checkpoint::Checkpoint;
use crate::file::File;
use crate::status::{guard, handed_over, Status};

pub fn remote_built() -> bool {
    true
}

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
    };
    let cache = o.cache.then(|| {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: C++ lends the path's bytes for this call (`detail::bytes`).
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(unsafe { o.cache_dir.get() }))
    });
    safetensors_remote::RemoteOptions {
        cache,
        cache_limit: o.cache_limit,
        ..millis.into()
    }
}

pub fn open_remote(
    url: &[u8],
    remote: &RemoteOptions,
    allow_trailing_bytes: bool,
    status: &mut Status,
) -> *mut File {
    guard(status, || {
        let url = safetensors_core::url_text(url)?;
        let open = OpenOptions {
            allow_trailing_bytes,
            ..OpenOptions::default()
        };
        let file = safetensors_remote::open(url, &options(remote), open)?;
        Ok(handed_over(File::wrap(Arc::new(file))))
    })
}

pub fn open_remote_checkpoint(
    url: &[u8],
    remote: &RemoteOptions,
    lenient: bool,
    allow_trailing_bytes: bool,
    status: &mut Status,
) -> *mut Checkpoint {
    guard(status, || {
        let url = safetensors_core::url_text(url)?;
        let checkpoint = safetensors_core::CheckpointOptions {
            lenient,
            allow_trailing_bytes,
            ..Default::default()
        };
        let ckpt = safetensors_remote::open_checkpoint(url, &options(remote), checkpoint)?;
        Ok(handed_over(Checkpoint::wrap(ckpt)))
    })
}
