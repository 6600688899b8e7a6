//! Glue for `Checkpoint`: a sharded checkpoint (or a single file) as C++ sees it.

use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

use safetensors_core::{CheckpointOptions, Error};

use crate::file::{backend, File};
use crate::{guard, native_path, BridgeError, Metadata};

pub struct Checkpoint {
    inner: safetensors_core::Checkpoint,
    /// Bridge wrappers of the shards, made when a shard is first opened.
    files: Vec<OnceLock<File>>,
    metadata: Metadata,
}

pub fn open_checkpoint(path: &[u8], backend_code: u8) -> Result<Box<Checkpoint>, BridgeError> {
    open_checkpoint_with(path, backend_code, false, false)
}

pub fn open_checkpoint_with(
    path: &[u8],
    backend_code: u8,
    lenient: bool,
    allow_trailing_bytes: bool,
) -> Result<Box<Checkpoint>, BridgeError> {
    guard(|| {
        let options = CheckpointOptions {
            backend: backend(backend_code),
            lenient,
            allow_trailing_bytes,
        };
        let inner = safetensors_core::Checkpoint::open_with(native_path(path), options)?;
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

    /// Names are compared as bytes: a name that is not UTF-8 matches no tensor (a lossy
    /// conversion could turn it into the name of another one).
    pub fn shard_of(&self, name: &[u8]) -> Result<usize, BridgeError> {
        guard(|| match std::str::from_utf8(name) {
            Ok(name) => self.inner.shard_of(name),
            Err(_) => Err(Error::TensorNotFound {
                name: String::from_utf8_lossy(name).into_owned(),
            }
            .in_file(self.inner.path())),
        })
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

    /// [`Checkpoint::shard_of`], then the shard opened and (lenient mode) checked to hold it.
    pub fn shard_holding(&self, name: &[u8]) -> Result<usize, BridgeError> {
        guard(|| match std::str::from_utf8(name) {
            Ok(name) => self.inner.shard_holding(name),
            Err(_) => Err(Error::TensorNotFound {
                name: String::from_utf8_lossy(name).into_owned(),
            }
            .in_file(self.inner.path())),
        })
    }

    pub fn missing(&self) -> Result<Vec<String>, BridgeError> {
        guard(|| Ok(self.inner.missing()?.into_iter().map(|(n, _)| n).collect()))
    }

    pub fn shard_trailing_bytes(&self, shard: usize) -> Result<u64, BridgeError> {
        guard(|| Ok(self.inner.shard(shard)?.trailing_bytes()))
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

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;

    use safetensors_core::{serialize_to_file, Dtype, TensorView};

    use super::open_checkpoint;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("st-cxx-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_name_that_is_not_utf8_matches_no_tensor() {
        let dir = scratch("lossy_name");
        let path = dir.join("a.safetensors");
        // U+FFFD is what a lossy conversion makes of the byte 0xFF.
        let views = [
            ("w\u{FFFD}", TensorView::new(Dtype::U8, &[1], &[1])),
            ("x", TensorView::new(Dtype::U8, &[1], &[2])),
        ];
        serialize_to_file(views, None, &path).unwrap();
        let ckpt = open_checkpoint(path.as_os_str().as_bytes(), 0).unwrap();
        let err = ckpt.shard_of(b"w\xff").err().unwrap().to_string();
        assert!(err.starts_with("10:"), "{err}");
        assert_eq!(ckpt.position(b"w\xff"), -1);
        assert_eq!(ckpt.shard_of("w\u{FFFD}".as_bytes()).unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn latin1_paths_cross_the_bridge_byte_for_byte() {
        let dir = scratch("latin1_path");
        let mut raw = dir.as_os_str().as_bytes().to_vec();
        raw.extend_from_slice(b"/caf\xe9-\xe0\xe8.safetensors");
        let mut writer = crate::new_writer();
        writer
            .add_tensor(b"w", Dtype::U8 as u8, &[2], &[5, 6])
            .unwrap();
        // SAFETY: the tensor bytes are a static array that outlives the writer.
        unsafe { writer.write_file(&raw, false) }.unwrap();
        let names: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        assert_eq!(names, [b"caf\xe9-\xe0\xe8.safetensors".to_vec()]);
        let file = crate::open_file(&raw, 1).unwrap();
        assert_eq!(file.tensor_count(), 1);
        let ckpt = open_checkpoint(&raw, 0).unwrap();
        assert_eq!(ckpt.shard_path(0), raw.as_slice());
        assert_eq!(OsStr::from_bytes(ckpt.shard_path(0)).len(), raw.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
