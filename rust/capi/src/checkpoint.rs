//! [`st_checkpoint`]: a sharded checkpoint (`model.safetensors.index.json` and its shards, or a
//! single file), strict or lenient.

use std::ffi::{c_char, c_void};
use std::os::raw::c_int;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};

use safetensors_core::{
    name_to_find, Checkpoint, CheckpointOptions, MetadataList, SafeFile, TensorInfo,
};

use crate::args::{st_str, Call};
use crate::ffi::{free_box, hand_out};
use crate::file::{
    backend, read_tensor, BACKEND_BITS, ST_OPEN_ALLOW_TRAILING_BYTES, ST_OPEN_LENIENT,
};
use crate::status::{run, st_error, Res};
use crate::tensor::st_tensor;

/// Tensors the index lists but their shard lacks, each with its shard.
type Missing = Arc<Vec<(String, usize)>>;

/// An open checkpoint. Safe to use from several threads at once (shards open lazily, each
/// once); free it with `st_checkpoint_free`. Pointers it hands out (names, shapes, zero-copy
/// bytes of its shards) are valid while it lives.
pub struct st_checkpoint {
    pub(crate) inner: Checkpoint,
    metadata: MetadataList,
    /// `missing()`, once it has succeeded (it opens every shard); kept so that the names
    /// handed out stay valid while the checkpoint lives.
    missing: Mutex<Option<Missing>>,
}

impl st_checkpoint {
    /// A checkpoint as the C API hands it out.
    pub(crate) fn new(inner: Checkpoint) -> st_checkpoint {
        st_checkpoint {
            metadata: MetadataList::of(inner.metadata()),
            inner,
            missing: Mutex::new(None),
        }
    }

    /// The shard file holding `name` (any bytes) and its description.
    pub(crate) fn locate(&self, name: &[u8]) -> Res<(&SafeFile, TensorInfo<'_>)> {
        Ok(self.inner.locate(name_to_find(name, self.inner.path())?)?)
    }

    fn missing(&self) -> Res<Missing> {
        // Announced to a sanitized caller's ThreadSanitizer: the list is made on whichever
        // thread asks first and read (its names copied out) on every other.
        let mut slot = safetensors_core::tsan::lock(&self.missing);
        if let Some(list) = slot.as_ref() {
            return Ok(list.clone());
        }
        let list = Arc::new(self.inner.missing()?);
        *slot = Some(list.clone());
        Ok(list)
    }
}

/// Opens a checkpoint: an index (a path ending in `.json`, in any case) and its shards, or a
/// single safetensors file. `flags`: a backend (`ST_BACKEND_*`), `ST_OPEN_LENIENT`,
/// `ST_OPEN_ALLOW_TRAILING_BYTES`. The index and the existence of every shard are checked now;
/// shards are opened (and checked against the index) on first use.
///
/// Errors: `ST_ERR_INVALID_INDEX`, `ST_ERR_DUPLICATE_KEY`, `ST_ERR_INVALID_SHARD_PATH`,
/// `ST_ERR_SHARD_MISSING`, `ST_ERR_IO`, and a single file's own errors.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_open(
    path: *const c_char,
    flags: u32,
    out: *mut *mut st_checkpoint,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_open");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (path, out) = unsafe { (c.path(path, "path")?, c.out(out, "out")?) };
        c.flags(
            flags,
            BACKEND_BITS | ST_OPEN_ALLOW_TRAILING_BYTES | ST_OPEN_LENIENT,
        )?;
        let options = CheckpointOptions {
            backend: backend(c, flags)?,
            lenient: flags & ST_OPEN_LENIENT != 0,
            allow_trailing_bytes: flags & ST_OPEN_ALLOW_TRAILING_BYTES != 0,
            ..CheckpointOptions::default()
        };
        let inner = Checkpoint::open_with(path, options)?;
        *out = hand_out(st_checkpoint::new(inner));
        Ok(())
    })
}

/// Frees a checkpoint (NULL is ignored). Slices and streams made from it keep their shards.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_free(checkpoint: *mut st_checkpoint) {
    // SAFETY: NULL or a checkpoint from `st_checkpoint_open`, freed once (the header's
    // contract).
    unsafe { free_box(checkpoint) }
}

/// What `st_checkpoint_describe` reports about a checkpoint.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_checkpoint_desc {
    /// Number of tensors the index lists.
    pub tensor_count: usize,
    /// Number of shard files.
    pub shard_count: usize,
    /// How many shards have been opened so far.
    pub shards_opened: usize,
    /// Whether it was opened with `ST_OPEN_LENIENT`.
    pub lenient: bool,
    /// Whether the index has a `metadata` object (a single file: a `__metadata__` map).
    pub has_metadata: bool,
    /// Number of metadata entries (for `st_checkpoint_metadata`).
    pub metadata_count: usize,
    /// The path given to `st_checkpoint_open`; valid while the checkpoint lives.
    pub path: st_str,
}

/// Describes `checkpoint` into `*out`.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_describe(
    checkpoint: *const st_checkpoint,
    out: *mut st_checkpoint_desc,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_describe");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(out, "out")?) };
        let inner = &ckpt.inner;
        *out = st_checkpoint_desc {
            tensor_count: inner.len(),
            shard_count: inner.shard_count(),
            shards_opened: inner.shards_opened(),
            lenient: inner.is_lenient(),
            has_metadata: inner.metadata().is_some(),
            metadata_count: inner.metadata().map_or(0, |m| m.len()),
            path: st_str::of(inner.path().as_os_str().as_bytes()),
        };
        Ok(())
    })
}

/// The name of tensor `i` (below `tensor_count`), sorted byte-wise, as the index lists them.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_key(
    checkpoint: *const st_checkpoint,
    i: usize,
    name: *mut st_str,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_key");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(name, "name")?) };
        let names = ckpt.inner.names();
        *out =
            st_str::of(names[c.index(i, names.len(), "the checkpoint's tensor list")?].as_bytes());
        Ok(())
    })
}

/// Describes tensor `name` as `st_file_info` does, from its shard (opened now if it was not).
/// Valid while the checkpoint lives. Errors: `ST_ERR_TENSOR_NOT_FOUND`,
/// `ST_ERR_SHARD_MISSING`, `ST_ERR_SHARD_MISMATCH`, and the shard's own errors.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_info(
    checkpoint: *const st_checkpoint,
    name: *const c_char,
    name_len: usize,
    out: *mut st_tensor,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_info");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, name, out) = unsafe {
            (
                c.handle(checkpoint, "checkpoint")?,
                c.name(name, name_len, "name")?,
                c.out(out, "out")?,
            )
        };
        let (file, info) = ckpt.locate(name)?;
        *out = st_tensor::of(file, &info)?;
        Ok(())
    })
}

/// Copies tensor `name` into `dst` of exactly its size, as `st_file_read` does.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_read(
    checkpoint: *const st_checkpoint,
    name: *const c_char,
    name_len: usize,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_read");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, name) = unsafe {
            (
                c.handle(checkpoint, "checkpoint")?,
                c.name(name, name_len, "name")?,
            )
        };
        let (file, info) = ckpt.locate(name)?;
        // SAFETY: as above.
        unsafe { read_tensor(c, file, &info, dst, dst_len) }
    })
}

/// Metadata entry `i` (below `metadata_count`), keys sorted; values that are not strings in the
/// index (like `total_size`) are given as their exact JSON text. Valid while the checkpoint
/// lives.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_metadata(
    checkpoint: *const st_checkpoint,
    i: usize,
    key: *mut st_str,
    value: *mut st_str,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_metadata");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, key, value) = unsafe {
            (
                c.handle(checkpoint, "checkpoint")?,
                c.out(key, "key")?,
                c.out(value, "value")?,
            )
        };
        let list = &ckpt.metadata;
        let (k, v) = list
            .get(c.index(i, list.len(), "the metadata")?)
            .unwrap_or_default();
        *key = st_str::of(k.as_bytes());
        *value = st_str::of(v.as_bytes());
        Ok(())
    })
}

/// Which shard (an index below `shard_count`) the index puts tensor `name` in, into `*shard`,
/// without opening it. Errors: `ST_ERR_TENSOR_NOT_FOUND`.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_shard_of(
    checkpoint: *const st_checkpoint,
    name: *const c_char,
    name_len: usize,
    shard: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_shard_of");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, name, out) = unsafe {
            (
                c.handle(checkpoint, "checkpoint")?,
                c.name(name, name_len, "name")?,
                c.out(shard, "shard")?,
            )
        };
        *out = ckpt
            .inner
            .shard_of(name_to_find(name, ckpt.inner.path())?)?;
        Ok(())
    })
}

/// The path of shard `i` (absolute for an index's shards) into `*path`, and with
/// `trailing_bytes` not NULL, the bytes after its last tensor (which opens the shard; 0 unless
/// opened with `ST_OPEN_ALLOW_TRAILING_BYTES`). Valid while the checkpoint lives.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_shard(
    checkpoint: *const st_checkpoint,
    i: usize,
    path: *mut st_str,
    trailing_bytes: *mut u64,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_shard");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(path, "path")?) };
        let i = c.index(i, ckpt.inner.shard_count(), "the checkpoint's shard list")?;
        if !trailing_bytes.is_null() {
            let n = ckpt.inner.shard(i)?.trailing_bytes();
            // SAFETY: not NULL; the caller's promise that it is writable.
            unsafe { *trailing_bytes = n };
        }
        let p = ckpt
            .inner
            .shard_path(i)
            .map_or(&[][..], |p| p.as_os_str().as_bytes());
        *out = st_str::of(p);
        Ok(())
    })
}

/// Tensors the index lists but their shard lacks (lenient checkpoints; always none in strict
/// mode, where such a shard fails to open): their number into `*count`. Opens every shard the
/// first time (an error opening one is returned, and the next call tries again); the list is
/// then kept. Read them with `st_checkpoint_missing_at`.
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_missing_count(
    checkpoint: *const st_checkpoint,
    count: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_missing_count");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(count, "count")?) };
        *out = ckpt.missing()?.len();
        Ok(())
    })
}

/// Missing tensor `i` (sorted by name, below the count `st_checkpoint_missing_count` gives):
/// its name into `*name` (valid while the checkpoint lives) and its shard into `*shard` (may be
/// NULL).
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_missing_at(
    checkpoint: *const st_checkpoint,
    i: usize,
    name: *mut st_str,
    shard: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_missing_at");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(name, "name")?) };
        let list = ckpt.missing()?;
        let (missing, in_shard) = &list[c.index(i, list.len(), "the list of missing tensors")?];
        // The checkpoint keeps the list once made (never replaced), so its strings live as
        // long as the checkpoint.
        *out = st_str::of(missing.as_bytes());
        if !shard.is_null() {
            // SAFETY: not NULL; the caller's promise that it is writable.
            unsafe { *shard = *in_shard };
        }
        Ok(())
    })
}
