//! A build without the remote transport (`-DSAFETENSORS_REMOTE=OFF`): the crate's opens, each
//! an `Io` error naming the URL as messages show it (no credentials) and saying so.

use std::io;
use std::path::Path;

use safetensors_core::SafeFile;
use safetensors_core::{redact_url, Checkpoint, CheckpointOptions, Error, OpenOptions, Result};

use crate::RemoteOptions;

/// As the built crate's `open`: here an `Io` error saying that this build cannot open remote
/// files.
pub fn open(url: &str, _: &RemoteOptions, _: OpenOptions) -> Result<SafeFile> {
    Err(not_built(url))
}

/// As the built crate's `open_checkpoint`: here an `Io` error saying that this build cannot
/// open remote files.
pub fn open_checkpoint(url: &str, _: &RemoteOptions, _: CheckpointOptions) -> Result<Checkpoint> {
    Err(not_built(url))
}

fn not_built(url: &str) -> Error {
    Error::io(
        Path::new(&redact_url(url)),
        "open",
        io::Error::new(
            io::ErrorKind::Unsupported,
            "this build of the safetensors library cannot open remote files (configure with \
             -DSAFETENSORS_REMOTE=ON)",
        ),
    )
}

#[cfg(test)]
mod tests {
    use safetensors_core::ErrorKind;

    use super::*;

    #[test]
    fn every_open_says_it_is_not_built_and_shows_no_credentials() {
        let url = "https://host/m.safetensors?X-Amz-Signature=secret";
        let Err(e) = open(url, &RemoteOptions::default(), OpenOptions::default()) else {
            panic!("opened without the transport");
        };
        assert_eq!(e.kind(), ErrorKind::Io);
        let text = e.to_string();
        assert!(text.contains("cannot open remote files"), "{text}");
        assert!(text.contains("https://host/m.safetensors"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        let Err(e) = open_checkpoint(url, &RemoteOptions::default(), CheckpointOptions::default())
        else {
            panic!("opened without the transport");
        };
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(!e.to_string().contains("secret"));
    }
}
