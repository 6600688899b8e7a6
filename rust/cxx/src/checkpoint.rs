//! Glue for `Checkpoint`: a sharded checkpoint (or a single file) as C++ sees it.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::file::{backend, File};
use crate::{guard, BridgeError, Metadata};

pub struct Checkpoint {
    inner: safetensors_core::Checkpoint,
    /// Bridge wrappers of the shards, made when a shard is first opened.
    files: Vec<OnceLock<File>>,
    metadata: Metadata,
}

pub fn open_checkpoint(path: &[u8], backend_code: u8) -> Result<Box<Checkpoint>, BridgeError> {
    guard(|| {
        let inner = safetensors_core::Checkpoint::open(
            Path::new(OsStr::from_bytes(path)),
            backend(backend_code),
        )?;
        let files = (0..inner.shard_count()).map(|_| OnceLock::new()).collect();
        let metadata = Metadata::new(inner.metadata());
        Ok(Box::new(Checkpoint {
            inner,
            files,
            metadata,
        }))
    })
}

impl Checkpoint {
    pub fn tensor_count(&self) -> usize {
        self.inner.len()
    }

    pub fn name_at(&self, i: usize) -> &str {
        self.inner.names().get(i).map_or("", String::as_str)
    }

    pub fn position(&self, name: &[u8]) -> isize {
        std::str::from_utf8(name)
            .ok()
            .and_then(|n| self.inner.position(n))
            .map_or(-1, |i| i as isize)
    }

    pub fn shard_of(&self, name: &[u8]) -> Result<usize, BridgeError> {
        guard(|| self.inner.shard_of(&String::from_utf8_lossy(name)))
    }

    /// # Safety
    /// None: the bridge needs `unsafe` to name the lifetime tying the shard to `self`.
    #[allow(clippy::needless_lifetimes)]
    pub unsafe fn shard_file<'a>(&'a self, shard: usize) -> Result<&'a File, BridgeError> {
        guard(|| {
            let file = self.inner.shard(shard)?;
            Ok(self.files[shard].get_or_init(|| File::wrap(file.clone())))
        })
    }

    pub fn shard_count(&self) -> usize {
        self.inner.shard_count()
    }

    pub fn shard_path(&self, shard: usize) -> &[u8] {
        self.inner
            .shard_path(shard)
            .map_or(&[], |p| p.as_os_str().as_bytes())
    }

    pub fn shard_is_open(&self, shard: usize) -> bool {
        self.inner.shard_is_open(shard)
    }

    pub fn shards_opened(&self) -> usize {
        self.inner.shards_opened()
    }

    pub fn has_metadata(&self) -> bool {
        self.inner.metadata().is_some()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
}
