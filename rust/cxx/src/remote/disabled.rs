//! A build without remote files (`-DSAFETENSORS_REMOTE=OFF`): opening a URL is an `Io` error
//! saying so, naming the URL as messages show it (no credentials).

use std::io;
use std::path::Path;

use safetensors_core::{redact_url, Error};

use super::ffi::RemoteOptions;
use crate::checkpoint::Checkpoint;
use crate::file::File;
use crate::status::{guard, Status};

pub fn remote_built() -> bool {
    false
}

pub fn open_remote(url: &[u8], _: &RemoteOptions, _: bool, status: &mut Status) -> *mut File {
    guard(status, || Err(not_built(url)))
}

pub fn open_remote_checkpoint(
    url: &[u8],
    _: &RemoteOptions,
    _: bool,
    _: bool,
    status: &mut Status,
) -> *mut Checkpoint {
    guard(status, || Err(not_built(url)))
}

/// Opening `url` in a build without remote support: an `Io` error saying so.
fn not_built(url: &[u8]) -> Error {
    let shown = redact_url(&String::from_utf8_lossy(url));
    Error::io(
        Path::new(&shown),
        "open",
        io::Error::new(
            io::ErrorKind::Unsupported,
            "this build of the safetensors library cannot open remote files (configure with \
             -DSAFETENSORS_REMOTE=ON)",
        ),
    )
}
