//! [`CheckpointWriter`]: one handle for what a binding writes tensor by tensor, one file
//! ([`StreamWriter`]) or a sharded checkpoint ([`ShardedWriter`]), as [`crate::Checkpoint`]
//! reads either. This module owns what the two have in common for a caller that holds either
//! (C's `st_writer`, C++'s `StreamingWriter`): made from checked [`Declarations`], pieces
//! addressed by names given as bytes (one that is not UTF-8 was never declared:
//! `TensorNotFound`, the rule of `lookup.rs`), the files it publishes named relative to the
//! target's directory, and `finish`.

use std::path::{Path, PathBuf};

use super::declare::Declarations;
use super::sharded::{ShardOptions, ShardedWriter};
use super::streaming::{StreamWriter, WriteOptions};
use crate::error::Result;
use crate::lookup::name_to_find;

/// What is being written.
enum Target {
    File(StreamWriter),
    Sharded(ShardedWriter),
}

/// A file or a sharded checkpoint written tensor by tensor (see the module documentation).
/// `write*` may be called from several threads at once; `finish` once every write returned.
///
/// ```
/// use safetensors_core::{CheckpointWriter, Declarations, WriteOptions};
/// # let dir = std::env::temp_dir().join(format!("target-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("out.safetensors");
/// let mut d = Declarations::new(Some(&path));
/// d.tensor(b"w", 4u8, &[4])?; // U8
/// let mut w = CheckpointWriter::file(&path, &d, WriteOptions::default())?;
/// w.write_at(b"w", 0, &[1, 2, 3, 4])?;
/// assert_eq!(w.files(), ["out.safetensors"]);
/// w.finish()?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub struct CheckpointWriter {
    target: Target,
    /// The file, or the checkpoint's directory, as the caller named it.
    path: PathBuf,
}

impl CheckpointWriter {
    /// Starts writing one file at `path` (see [`StreamWriter::create`]).
    pub fn file(
        path: &Path,
        declared: &Declarations,
        options: WriteOptions,
    ) -> Result<CheckpointWriter> {
        let w = StreamWriter::create(path, declared.tensors(), declared.metadata(), options)?;
        Ok(CheckpointWriter {
            target: Target::File(w),
            path: path.to_path_buf(),
        })
    }

    /// Starts writing a sharded checkpoint into the directory `dir` (see
    /// [`ShardedWriter::create`]).
    pub fn sharded(
        dir: &Path,
        declared: &Declarations,
        options: ShardOptions,
    ) -> Result<CheckpointWriter> {
        let w = ShardedWriter::create(dir, declared.tensors(), declared.metadata(), options)?;
        Ok(CheckpointWriter {
            target: Target::Sharded(w),
            path: dir.to_path_buf(),
        })
    }

    /// The file, or the checkpoint's directory, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it writes a sharded checkpoint.
    pub fn is_sharded(&self) -> bool {
        matches!(self.target, Target::Sharded(_))
    }

    /// The files `finish` publishes, by name, relative to the target's directory: the file's
    /// name, or the shards in order and then the index when there is one.
    pub fn files(&self) -> Vec<String> {
        match &self.target {
            Target::File(_) => vec![self
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()],
            Target::Sharded(w) => w.files(),
        }
    }

    /// The bytes of every tensor together (a sharded checkpoint's `total_size`).
    pub fn total_size(&self) -> u64 {
        match &self.target {
            Target::File(w) => (0..w.tensor_count()).map(|i| w.tensor_len(i)).sum(),
            Target::Sharded(w) => w.total_size(),
        }
    }

    /// Number of declared tensors.
    pub fn tensor_count(&self) -> usize {
        match &self.target {
            Target::File(w) => w.tensor_count(),
            Target::Sharded(w) => w.tensor_count(),
        }
    }

    /// The name of the declared tensor at `index` (declaration order; "" past the end).
    pub fn tensor_name(&self, index: usize) -> &str {
        match &self.target {
            Target::File(w) => w.tensor_name(index),
            Target::Sharded(w) => w.tensor_name(index),
        }
    }

    /// Bytes of the declared tensor at `index` (declaration order; 0 past the end).
    pub fn tensor_len(&self, index: usize) -> u64 {
        match &self.target {
            Target::File(w) => w.tensor_len(index),
            Target::Sharded(w) => w.tensor_len(index),
        }
    }

    /// Writes all of tensor `name` (see [`StreamWriter::write`]).
    pub fn write(&self, name: &[u8], bytes: &[u8]) -> Result<()> {
        let name = name_to_find(name, &self.path)?;
        match &self.target {
            Target::File(w) => w.write(name, bytes),
            Target::Sharded(w) => w.write(name, bytes),
        }
    }

    /// Writes `bytes` at byte `offset` of tensor `name` (see [`StreamWriter::write_at`]).
    pub fn write_at(&self, name: &[u8], offset: u64, bytes: &[u8]) -> Result<()> {
        let name = name_to_find(name, &self.path)?;
        match &self.target {
            Target::File(w) => w.write_at(name, offset, bytes),
            Target::Sharded(w) => w.write_at(name, offset, bytes),
        }
    }

    /// Writes `bytes` at byte `offset` of the declared tensor at `index` (declaration order).
    pub fn write_index(&self, index: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        match &self.target {
            Target::File(w) => w.write_index(index, offset, bytes),
            Target::Sharded(w) => w.write_index(index, offset, bytes),
        }
    }

    /// Checks that every byte arrived and publishes (see [`StreamWriter::finish`] and
    /// [`ShardedWriter::finish`]); a failed finish keeps the writer, to be finished again.
    pub fn finish(&mut self) -> Result<()> {
        match &mut self.target {
            Target::File(w) => w.finish(),
            Target::Sharded(w) => w.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "st-target-{name}-{}-{}",
            std::process::id(),
            super::super::atomic::unique_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn two_u8(target: &Path) -> Declarations {
        let mut d = Declarations::new(Some(target));
        d.tensor(b"a", 4u8, &[4]).unwrap();
        d.tensor(b"b", 4u8, &[4]).unwrap();
        d
    }

    #[test]
    fn a_file_is_named_by_its_file_name_and_written_by_byte_names() {
        let dir = scratch("file");
        let path = dir.join("one.safetensors");
        let mut w = CheckpointWriter::file(&path, &two_u8(&path), WriteOptions::default()).unwrap();
        assert!(!w.is_sharded());
        assert_eq!(w.files(), ["one.safetensors"]);
        assert_eq!((w.tensor_count(), w.total_size()), (2, 8));
        assert_eq!((w.tensor_name(1), w.tensor_len(1)), ("b", 4));
        w.write(b"a", &[1; 4]).unwrap();
        w.write_at(b"b", 2, &[2; 2]).unwrap();
        w.write_index(1, 0, &[2; 2]).unwrap();
        w.finish().unwrap();
        let f = crate::SafeFile::open(&path, crate::Backend::Read).unwrap();
        assert_eq!(f.tensor_bytes("b").unwrap().as_ref(), [2; 4]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_name_that_is_not_utf8_was_never_declared() {
        let dir = scratch("utf8");
        let path = dir.join("x.safetensors");
        let w = CheckpointWriter::file(&path, &two_u8(&path), WriteOptions::default()).unwrap();
        for e in [
            w.write(b"a\xff", &[0; 4]).unwrap_err(),
            w.write_at(b"\xff", 0, &[0]).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::TensorNotFound);
            assert_eq!(e.path(), Some(path.as_path()));
        }
        drop(w);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_sharded_checkpoint_lists_shards_then_index_and_finishes_once_complete() {
        let dir = scratch("sharded");
        let options = ShardOptions {
            max_shard_size: 4,
            ..ShardOptions::default()
        };
        let mut w = CheckpointWriter::sharded(&dir, &two_u8(&dir), options).unwrap();
        assert!(w.is_sharded());
        assert_eq!(
            w.files(),
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json"
            ]
        );
        w.write(b"a", &[1; 4]).unwrap();
        let e = w.finish().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer);
        w.write(b"b", &[2; 4]).unwrap();
        w.finish().unwrap();
        assert!(dir.join("model.safetensors.index.json").is_file());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
