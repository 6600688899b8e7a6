//! [`st_writer`]: a file, or a sharded checkpoint, written tensor by tensor: declared up front
//! (names, dtypes, shapes, metadata), then each tensor's bytes handed in one piece or in chunks,
//! from any thread and in any order, then finished (a failed finish keeps the writer, to be
//! finished again once the cause is fixed). The core's `CheckpointWriter` does the work
//! (docs/writing.md) from the core's `Declarations`; this layer reads the caller's arguments
//! and keeps the file names the handle hands out.

use std::ffi::{c_char, c_void};
use std::os::raw::c_int;
use std::path::Path;

use safetensors_core::{CheckpointWriter, Declarations, ShardOptions, WriteOptions};

use crate::args::{st_str, Call};
use crate::ffi::{free_box, hand_out};
use crate::status::{run, st_error, Res};
use crate::tensor::st_tensor;
use crate::write::{
    declare_metadata, declare_tensors, durability, st_metadata_entry, ST_SAVE_EMPTY_METADATA,
    ST_SAVE_NO_SYNC,
};

/// How an `st_writer` writes. A NULL `st_write_options*` means every field's default (all
/// zero).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_write_options {
    /// `ST_SAVE_NO_SYNC`, `ST_SAVE_EMPTY_METADATA` (as for `st_save_file`).
    pub flags: u32,
    /// The boundary each file's data buffer starts on: 0 for the reference's layout
    /// (byte-identical to Python's `save_file`), or a power of two up to 64 MiB (e.g. 4096
    /// for direct I/O); the header is padded with spaces, as the format allows.
    pub alignment: usize,
    /// Sharded checkpoints only: the most tensor bytes in one shard (a larger tensor gets a
    /// shard of its own); 0 for `huggingface_hub`'s default, 5 GB (5,000,000,000 bytes).
    pub max_shard_size: u64,
    /// Sharded checkpoints only: the files' common name (`{prefix}.safetensors` for one shard,
    /// else `{prefix}-00001-of-0000N.safetensors` and `{prefix}.safetensors.index.json`); empty
    /// (`ptr` may then be NULL) for `model`.
    pub prefix: st_str,
}

/// A file or sharded checkpoint being written (`st_writer_create`,
/// `st_writer_create_sharded`). `st_writer_write` may be called from several threads at once;
/// `st_writer_finish` and `st_writer_free` from one, once every write has returned. Nothing
/// appears under the target's name before `st_writer_finish` succeeds; a writer freed, or a
/// process killed, before that leaves nothing behind. A successful `st_writer_finish` frees
/// the writer; a failed one keeps it, to be finished again or freed.
pub struct st_writer {
    inner: CheckpointWriter,
    /// The file names the writer will publish, in order (for `st_writer_file_name`, whose
    /// strings live as long as the writer).
    files: Vec<String>,
}

/// The caller's declarations and options, read into the core's `Declarations` (which check
/// them), naming `target` in their errors.
struct Declared {
    decls: Declarations,
    write: WriteOptions,
    options: st_write_options,
}

/// Reads the declarations (`data` and `byte_size` of each `st_tensor` are ignored) and options.
///
/// # Safety
/// As the header says of `st_writer_create`'s arguments.
unsafe fn declared(
    c: Call,
    target: &Path,
    tensors: *const st_tensor,
    count: usize,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    options: *const st_write_options,
) -> Res<Declared> {
    // A NULL `st_write_options*` is every field's default: all zero.
    let options = if options.is_null() {
        st_write_options {
            flags: 0,
            alignment: 0,
            max_shard_size: 0,
            prefix: st_str {
                ptr: std::ptr::null(),
                len: 0,
            },
        }
    } else {
        // SAFETY: the caller's promise.
        *unsafe { c.handle(options, "options")? }
    };
    c.flags(options.flags, ST_SAVE_NO_SYNC | ST_SAVE_EMPTY_METADATA)?;
    let mut decls = Declarations::with_capacity(Some(target), count)?;
    // SAFETY: as above.
    unsafe {
        declare_tensors(c, &mut decls, tensors, count, false)?;
        declare_metadata(c, &mut decls, metadata, metadata_count, options.flags)?;
    }
    Ok(Declared {
        decls,
        write: WriteOptions {
            durability: durability(options.flags),
            alignment: options.alignment,
        },
        options,
    })
}

/// The writer handed out, with the names of the files it publishes.
fn writer(inner: CheckpointWriter) -> *mut st_writer {
    let files = inner.files();
    hand_out(st_writer { inner, files })
}

/// Starts writing one safetensors file at `path`: `count` tensors declared (name, dtype,
/// shape; their `data` and `byte_size` are ignored) and `metadata_count` metadata entries.
/// The header is laid out now, exactly as `st_save_file` would write these tensors, and the
/// whole file is reserved on the disk where the filesystem allows (a disk too small fails
/// here). On success `*out` is the writer; give every byte of every tensor with
/// `st_writer_write`, then call `st_writer_finish`.
///
/// Errors: those of `st_save_file` for the declarations (`ST_ERR_INVALID_TENSOR_NAME`,
/// `ST_ERR_DUPLICATE_KEY`, `ST_ERR_TYPE_MISMATCH`, `ST_ERR_VALIDATION_OVERFLOW`,
/// `ST_ERR_HEADER_TOO_LARGE`), `ST_ERR_INVALID_SLICE` for an alignment that is not a power of
/// two up to 64 MiB, `ST_ERR_IO` (the directory, or no space for the file).
#[no_mangle]
pub unsafe extern "C" fn st_writer_create(
    path: *const c_char,
    tensors: *const st_tensor,
    count: usize,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    options: *const st_write_options,
    out: *mut *mut st_writer,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_writer_create");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (path, out) = unsafe { (c.path(path, "path")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let d = unsafe { declared(c, path, tensors, count, metadata, metadata_count, options)? };
        *out = writer(CheckpointWriter::file(path, &d.decls, d.write)?);
        Ok(())
    })
}

/// Starts writing a sharded checkpoint into the existing directory `dir`, cut and named as
/// `huggingface_hub` does (`split_state_dict_into_shards_factory`: tensors in the order
/// declared, a new shard when the next tensor would pass `options->max_shard_size`), with
/// `{prefix}.safetensors.index.json` when there is more than one shard. Arguments and errors
/// as `st_writer_create`, and `ST_ERR_INVALID_SHARD_PATH` for a prefix that is not a plain
/// file name. `st_writer_file_count` and `st_writer_file_name` say which files it will write.
#[no_mangle]
pub unsafe extern "C" fn st_writer_create_sharded(
    dir: *const c_char,
    tensors: *const st_tensor,
    count: usize,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    options: *const st_write_options,
    out: *mut *mut st_writer,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_writer_create_sharded");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (dir, out) = unsafe { (c.path(dir, "dir")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let d = unsafe { declared(c, dir, tensors, count, metadata, metadata_count, options)? };
        // Zeroed fields mean the defaults (C's `st_write_options` starts zeroed).
        let mut shard = ShardOptions {
            write: d.write,
            ..ShardOptions::default()
        };
        if d.options.max_shard_size != 0 {
            shard.max_shard_size = d.options.max_shard_size;
        }
        let prefix = &d.options.prefix;
        // SAFETY: as above.
        let prefix = unsafe { c.name(prefix.ptr, prefix.len, "options->prefix")? };
        if !prefix.is_empty() {
            shard.prefix = d.decls.shard_prefix(prefix)?;
        }
        *out = writer(CheckpointWriter::sharded(dir, &d.decls, shard)?);
        Ok(())
    })
}

/// Writes `len` bytes at `data` as the bytes of tensor `name` (`name_len` bytes) from byte
/// `offset` of that tensor on. Pieces may come in any order and from several threads at once;
/// each byte of a tensor must be given exactly once. The bytes are in the file (or the kernel's
/// cache) when the call returns; `data` is not used after it.
///
/// Errors: `ST_ERR_TENSOR_NOT_FOUND` (not declared, or a name that is not UTF-8);
/// `ST_ERR_TENSOR_INVALID_INFO` (a piece past the tensor's end); `ST_ERR_INVALID_OFFSET`
/// (bytes already given); `ST_ERR_IO` (the disk: the writer is then failed, and every later
/// call reports that error).
#[no_mangle]
pub unsafe extern "C" fn st_writer_write(
    writer: *const st_writer,
    name: *const c_char,
    name_len: usize,
    offset: u64,
    data: *const c_void,
    len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_writer_write");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (writer, name, bytes) = unsafe {
            (
                c.handle(writer, "writer")?,
                c.name(name, name_len, "name")?,
                c.bytes(data, len, "data")?,
            )
        };
        Ok(writer.inner.write_at(name, offset, bytes)?)
    })
}

/// Checks that every byte of every declared tensor was given, syncs (unless `ST_SAVE_NO_SYNC`)
/// and publishes: renames the file over its target, or for a sharded checkpoint publishes the
/// set as a transaction, the checkpoint already in the directory staying whole until the new
/// one is (docs/writing.md). On success the writer is freed: do not use or free it afterwards.
/// On an error the writer is kept and, unless the error says the new checkpoint is in place
/// (only a file of the earlier one could not be removed), nothing was published: fix the cause
/// (write the missing bytes, clear the target's name) and call `st_writer_finish` again, or
/// `st_writer_free` it. A writer whose write or sync failed on the disk reports that error
/// again on every call: free it.
///
/// Errors: `ST_ERR_METADATA_INCOMPLETE_BUFFER` (a tensor with bytes missing, named with the
/// first missing range), the error a failed write reported, `ST_ERR_INVALID_INDEX` (the
/// directory holds an index the writer cannot read, which it will not replace), `ST_ERR_IO`.
#[no_mangle]
pub unsafe extern "C" fn st_writer_finish(writer: *mut st_writer, err: *mut st_error) -> c_int {
    let c = Call("st_writer_finish");
    run(err, || {
        if writer.is_null() {
            return Err(c.null("writer"));
        }
        // SAFETY: a live writer from `st_writer_create*`, used by this thread alone (the
        // header's contract).
        unsafe { &mut *writer }.inner.finish()?;
        // SAFETY: as above; published, it is given back once, here.
        unsafe { free_box(writer) };
        Ok(())
    })
}

/// Frees a writer without publishing anything: its temporary files are removed and the
/// targets are untouched (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn st_writer_free(writer: *mut st_writer) {
    // SAFETY: NULL or a writer from `st_writer_create*`, freed once (the header's contract).
    unsafe { free_box(writer) }
}

/// The number of files the writer publishes: 1 for `st_writer_create`; the shards plus the
/// index (when there is more than one shard) for `st_writer_create_sharded`.
#[no_mangle]
pub unsafe extern "C" fn st_writer_file_count(writer: *const st_writer) -> usize {
    // SAFETY: NULL or a live writer (the header's contract).
    unsafe { writer.as_ref() }.map_or(0, |w| w.files.len())
}

/// The name (not the path) of file `index` of the writer, shards in order then the index;
/// valid while the writer lives. Errors: an `index` out of range.
#[no_mangle]
pub unsafe extern "C" fn st_writer_file_name(
    writer: *const st_writer,
    index: usize,
    out: *mut st_str,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_writer_file_name");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (writer, out) = unsafe { (c.handle(writer, "writer")?, c.out(out, "out")?) };
        let i = c.index(index, writer.files.len(), "the writer's files")?;
        *out = st_str::of(writer.files[i].as_bytes());
        Ok(())
    })
}
