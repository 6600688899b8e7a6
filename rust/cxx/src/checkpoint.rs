//! `Checkpoint`: a sharded checkpoint (or a single file) as C++ sees it, its bridge and glue.

use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};

use safetensors_core::{tsan, CheckpointOptions, Error};

use crate::file::{backend, populate, File, Metadata};
use crate::status::{guard, Bytes, Sizes, Status};
use crate::status::{handed_over, native_path};
use ffi::{Backend, Populate};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        include!("safetensors/ffi/src/file.rs.h");
        type Status = crate::status::ffi::Status;
        type Bytes = crate::status::ffi::Bytes;
        type Sizes = crate::status::ffi::Sizes;
        type Backend = crate::file::ffi::Backend;
        type Populate = crate::file::ffi::Populate;
        type File = crate::file::File;
        type Metadata = crate::file::Metadata;
    }

    extern "Rust" {
        /// A sharded checkpoint (an index and its shards) or a single file.
        #[derive(ExternType)]
        type Checkpoint;
        /// Opens an index (`.json`) or a single safetensors file; `populate` and `huge_pages`
        /// are each mapped shard's controls, from its open on. Null on failure.
        fn open_checkpoint(
            path: Bytes,
            backend: Backend,
            lenient: bool,
            allow_trailing_bytes: bool,
            populate: Populate,
            huge_pages: bool,
            status: &mut Status,
        ) -> *mut Checkpoint;
        /// The shard holding `name`, opened, with `ShardMissing` when (lenient) it lacks it.
        fn shard_holding(self: &Checkpoint, name: Bytes, status: &mut Status) -> usize;
        /// Tensors the index lists but their shard lacks, sorted (opens every shard). Null on
        /// failure.
        fn missing(self: &Checkpoint, status: &mut Status) -> *mut Names;
        /// Bytes after the last tensor of shard `shard` (opens it).
        fn shard_trailing_bytes(self: &Checkpoint, shard: usize, status: &mut Status) -> u64;
        /// Number of tensors the index lists.
        fn tensor_count(self: &Checkpoint) -> usize;
        /// Tensor name `i` in sorted order.
        fn name_at(self: &Checkpoint, i: usize) -> &str;
        /// Sorted position of `name`, or -1.
        fn position(self: &Checkpoint, name: Bytes) -> isize;
        /// The shard holding `name`, or `TensorNotFound`.
        fn shard_of(self: &Checkpoint, name: Bytes, status: &mut Status) -> usize;
        /// The open shard holding `name`, with the tensor's position in the shard's offset
        /// order in `entry`; null (and `entry` untouched) when the index does not list it, its
        /// shard is not open yet or (lenient) lacks it: `shard_of` and `shard_holding` say
        /// which. No status, no lock: the lookup of every tensor once its shard is open.
        fn find_open(self: &Checkpoint, name: Bytes, entry: &mut usize) -> *const File;
        /// The entries of shard `shard` (open) that the index assigns to it, ascending; empty
        /// for a shard not open yet. They live as long as the checkpoint.
        fn shard_entries(self: &Checkpoint, shard: usize) -> Sizes;
        /// Shard `shard`, opened (once) and checked against the index on first use; it lives as
        /// long as the checkpoint. Null on failure.
        fn shard_file(self: &Checkpoint, shard: usize, status: &mut Status) -> *const File;
        /// Opens every shard not open yet, several at once (the core's `open_all_shards`): for
        /// work that needs them all (iterating, `missing`, `trailing_bytes`).
        fn open_all_shards(self: &Checkpoint, status: &mut Status);
        /// Opens the shards a reader walking them in order from `first` reaches next, several
        /// at once (the core's `open_ahead`; errors are left for the reader to meet).
        fn open_ahead(self: &Checkpoint, first: usize);
        /// Number of shard files.
        fn shard_count(self: &Checkpoint) -> usize;
        /// Path of shard `shard` (raw bytes, living as long as the checkpoint).
        fn shard_path(self: &Checkpoint, shard: usize) -> Bytes;
        /// Whether shard `shard` has been opened.
        fn shard_is_open(self: &Checkpoint, shard: usize) -> bool;
        /// Shard files opened so far.
        fn shards_opened(self: &Checkpoint) -> usize;
        /// Whether the index (or single file) has metadata.
        fn has_metadata(self: &Checkpoint) -> bool;
        /// The index's metadata (or the single file's `__metadata__`).
        fn metadata(self: &Checkpoint) -> &Metadata;

        /// A list of names, walked by index.
        type Names;
        /// Number of names.
        fn len(self: &Names) -> usize;
        /// Name `i` ("" out of range).
        fn at(self: &Names, i: usize) -> &str;
    }

    impl Box<Checkpoint> {}
    impl Box<Names> {}
}

pub struct Checkpoint {
    /// Shared with the sources made from it (`stream.rs`), for the call they are made for.
    inner: Arc<safetensors_core::Checkpoint>,
    /// Bridge wrappers of the shards, made when a shard is first opened.
    files: Vec<OnceLock<File>>,
    metadata: Metadata,
}

/// A list of names (`Checkpoint::missing`'s).
pub struct Names(Vec<String>);

impl Names {
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn at(&self, i: usize) -> &str {
        self.0.get(i).map_or("", String::as_str)
    }
}

pub fn open_checkpoint(
    path: Bytes,
    backend: Backend,
    lenient: bool,
    allow_trailing_bytes: bool,
    populate: Populate,
    huge_pages: bool,
    status: &mut Status,
) -> *mut Checkpoint {
    // SAFETY: C++ lends the path's bytes for this call (`detail::bytes`).
    let path = unsafe { path.get() };
    guard(status, || {
        let options = CheckpointOptions {
            backend: self::backend(backend)?,
            lenient,
            allow_trailing_bytes,
            populate: self::populate(populate)?,
            huge_pages,
        };
        let inner = safetensors_core::Checkpoint::open_with(native_path(path), options)?;
        Ok(handed_over(Checkpoint::wrap(inner)))
    })
}

impl Checkpoint {
    /// A core checkpoint as the bridge hands it over (local or remote).
    pub(crate) fn wrap(inner: safetensors_core::Checkpoint) -> Checkpoint {
        let files = (0..inner.shard_count()).map(|_| OnceLock::new()).collect();
        let metadata = Metadata::new(inner.metadata());
        Checkpoint {
            inner: Arc::new(inner),
            files,
            metadata,
        }
    }

    pub fn tensor_count(&self) -> usize {
        self.inner.len()
    }

    pub fn name_at(&self, i: usize) -> &str {
        self.inner.names().get(i).unwrap_or("")
    }

    pub fn position(&self, name: Bytes) -> isize {
        // SAFETY: C++ lends the name for this call (`detail::bytes`).
        let name = unsafe { name.get() };
        // Bytes that are not UTF-8 are no name of the index (whose names are all UTF-8).
        self.inner.position_bytes(name).map_or(-1, |i| i as isize)
    }

    /// Names are compared as bytes: a name that is not UTF-8 matches no tensor (a lossy
    /// conversion could turn it into the name of another one).
    pub fn shard_of(&self, name: Bytes, status: &mut Status) -> usize {
        // SAFETY: C++ lends the name for this call (`detail::bytes`).
        let name = unsafe { name.get() };
        guard(status, || {
            self.inner
                .shard_of(safetensors_core::name_to_find(name, self.inner.path())?)
        })
    }

    pub fn find_open(&self, name: Bytes, entry: &mut usize) -> *const File {
        // SAFETY: C++ lends the name for this call (`detail::bytes`).
        let name = unsafe { name.get() };
        let Some(safetensors_core::Found::At { shard, entry: at }) = self.inner.find(name) else {
            return std::ptr::null();
        };
        // Null when the core opened the shard (several at once) but no caller has asked for it
        // here yet: the caller asks `shard_file`, which makes its wrapper.
        match self.opened(shard) {
            Some(file) => {
                *entry = at;
                file
            }
            None => std::ptr::null(),
        }
    }

    pub fn open_all_shards(&self, status: &mut Status) {
        guard(status, || self.inner.open_all_shards())
    }

    pub fn open_ahead(&self, first: usize) {
        self.inner.open_ahead(first);
    }

    pub fn shard_entries(&self, shard: usize) -> Sizes {
        match self.inner.shard_is_open(shard) {
            true => Sizes::of(self.inner.shard_entries(shard).unwrap_or(&[])),
            false => Sizes::of(&[]),
        }
    }

    /// Shard `shard`, opened on first use; it lives as long as `self` (null on failure).
    pub fn shard_file(&self, shard: usize, status: &mut Status) -> *const File {
        guard(status, || self.shard(shard).map(|f| f as *const File))
    }

    /// The core checkpoint, shared.
    pub(crate) fn shared(&self) -> Arc<safetensors_core::Checkpoint> {
        self.inner.clone()
    }

    /// Shard `shard`, opened on first use (and checked against the index), as the bridge wraps
    /// it.
    ///
    /// The core announces its own hand-over of an opened shard to a ThreadSanitizer build of
    /// the caller (`safetensors_core::tsan`); the wrapper made here (its metadata list, which
    /// C++ reads in place) is announced the same way: the thread that publishes it releases
    /// the slot, every thread that gets it acquires it, the one that made it included.
    pub(crate) fn shard(&self, shard: usize) -> Result<&File, Error> {
        let slot = self.files.get(shard).ok_or_else(|| Error::InvalidIndex {
            reason: format!("no shard {shard}; the index names {}", self.files.len()),
        })?;
        if let Some(file) = self.opened(shard) {
            return Ok(file);
        }
        let made = File::wrap(self.inner.shard(shard)?.clone());
        tsan::release(slot);
        let file = slot.get_or_init(|| made);
        tsan::acquire(slot);
        Ok(file)
    }

    /// The bridge wrapper of shard `shard` when made, announced to a sanitized caller (see
    /// `shard`).
    fn opened(&self, shard: usize) -> Option<&File> {
        let slot = self.files.get(shard)?;
        let file = slot.get();
        if file.is_some() {
            tsan::acquire(slot);
        }
        file
    }

    /// [`Checkpoint::shard_of`], then the shard opened and (lenient mode) checked to hold it.
    pub fn shard_holding(&self, name: Bytes, status: &mut Status) -> usize {
        // SAFETY: C++ lends the name for this call (`detail::bytes`).
        let name = unsafe { name.get() };
        guard(status, || {
            self.inner
                .shard_holding(safetensors_core::name_to_find(name, self.inner.path())?)
        })
    }

    pub fn missing(&self, status: &mut Status) -> *mut Names {
        guard(status, || {
            let names = self.inner.missing()?.into_iter().map(|(n, _)| n).collect();
            Ok(handed_over(Names(names)))
        })
    }

    pub fn shard_trailing_bytes(&self, shard: usize, status: &mut Status) -> u64 {
        guard(status, || Ok(self.inner.shard(shard)?.trailing_bytes()))
    }

    pub fn shard_count(&self) -> usize {
        self.inner.shard_count()
    }

    pub fn shard_path(&self, shard: usize) -> Bytes {
        Bytes::of(
            self.inner
                .shard_path(shard)
                .map_or(&[], |p| p.as_os_str().as_bytes()),
        )
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

    use super::{open_checkpoint, Backend, Populate};
    use crate::status::{adopt, outcome, Bytes};

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
        let ckpt = adopt(
            outcome(|s| {
                open_checkpoint(
                    Bytes::of(path.as_os_str().as_bytes()),
                    Backend::Mmap,
                    false,
                    false,
                    Populate::Lazy,
                    false,
                    s,
                )
            })
            .unwrap(),
        );
        let err = outcome(|s| ckpt.shard_of(Bytes::of(b"w\xff"), s)).unwrap_err();
        assert_eq!(err.kind, 10, "{}", err.message);
        assert_eq!(ckpt.position(Bytes::of(b"w\xff")), -1);
        assert_eq!(
            outcome(|s| ckpt.shard_of(Bytes::of("w\u{FFFD}".as_bytes()), s)).unwrap(),
            0
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn latin1_paths_cross_the_bridge_byte_for_byte() {
        let dir = scratch("latin1_path");
        let mut raw = dir.as_os_str().as_bytes().to_vec();
        raw.extend_from_slice(b"/caf\xe9-\xe0\xe8.safetensors");
        let mut writer = crate::writer::new_writer(&raw);
        outcome(|s| writer.add_tensor(b"w", Dtype::U8 as u8, &[2], &[5, 6], s)).unwrap();
        // SAFETY: the tensor bytes are a static array that outlives the writer.
        outcome(|s| unsafe { writer.write_file(&raw, false, 0, s) }).unwrap();
        let names: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        assert_eq!(names, [b"caf\xe9-\xe0\xe8.safetensors".to_vec()]);
        let file = adopt(
            outcome(|s| {
                crate::file::open_file(
                    Bytes::of(&raw),
                    Backend::Read,
                    false,
                    Populate::Lazy,
                    false,
                    s,
                )
            })
            .unwrap(),
        );
        assert_eq!(file.tensor_count(), 1);
        let ckpt = adopt(
            outcome(|s| {
                open_checkpoint(
                    Bytes::of(&raw),
                    Backend::Mmap,
                    false,
                    false,
                    Populate::Lazy,
                    false,
                    s,
                )
            })
            .unwrap(),
        );
        let shard_path = ckpt.shard_path(0);
        // SAFETY: the path lives as long as the checkpoint.
        let shard_path = unsafe { shard_path.get() };
        assert_eq!(shard_path, raw.as_slice());
        assert_eq!(OsStr::from_bytes(shard_path).len(), raw.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
