//! Writing a file all at once: `st_save_file` (atomic replace on disk) and `st_serialize` (into
//! memory the library allocates). The layout is the reference's, byte for byte. Writing tensor
//! by tensor, one file or a sharded checkpoint, is `writer.rs` (`st_writer`).

use std::ffi::{c_char, c_void};
use std::os::raw::c_int;

use safetensors_core::{fallible, Declarations, Durability};

use crate::args::{st_str, Call};
use crate::status::{quietly, run, st_error, Res};
use crate::tensor::st_tensor;

/// One `__metadata__` entry to write.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_metadata_entry {
    /// The key (UTF-8).
    pub key: st_str,
    /// The value (UTF-8).
    pub value: st_str,
}

/// Save flag: skip the `fsync` (still atomic; Python's `save_file` behaves like this).
pub const ST_SAVE_NO_SYNC: u32 = 1;
/// Save flag: write `"__metadata__":{}` when no entry is given (byte-identical to Python's
/// `save_file(..., metadata={})`); by default no entries means no `__metadata__`.
pub const ST_SAVE_EMPTY_METADATA: u32 = 2;

/// Reads the caller's tensors into `decls`, each checked by the core as it comes, and returns
/// their bytes when `with_data` (writing all at once; a streaming writer's declarations have
/// none, and their `data` and `byte_size` are not read).
///
/// # Safety
/// `tensors` points to `count` tensors, each describing memory as the header says.
pub(crate) unsafe fn declare_tensors<'a>(
    c: Call,
    decls: &mut Declarations,
    tensors: *const st_tensor,
    count: usize,
    with_data: bool,
) -> Res<Vec<&'a [u8]>> {
    // SAFETY: the caller's promise.
    let list = unsafe { c.array(tensors, count, "tensors")? };
    let mut data = fallible::with_capacity(if with_data { list.len() } else { 0 }, "the tensors")?;
    for (i, t) in list.iter().enumerate() {
        // SAFETY: as above.
        let (name, shape) = unsafe {
            (
                c.name(t.name.ptr, t.name.len, &format!("tensors[{i}].name.ptr"))?,
                c.array(t.shape, t.rank, &format!("tensors[{i}].shape"))?,
            )
        };
        if with_data {
            // SAFETY: as above.
            data.push(unsafe { c.bytes(t.data, t.byte_size, &format!("tensors[{i}].data"))? });
        }
        decls.tensor(name, t.dtype, shape)?;
    }
    Ok(data)
}

/// Reads the caller's metadata entries into `decls` (the core checks each), keeping an empty
/// `__metadata__` when `flags` has `ST_SAVE_EMPTY_METADATA`.
///
/// # Safety
/// `metadata` points to `count` entries, each describing memory as the header says.
pub(crate) unsafe fn declare_metadata(
    c: Call,
    decls: &mut Declarations,
    metadata: *const st_metadata_entry,
    count: usize,
    flags: u32,
) -> Res<()> {
    if flags & ST_SAVE_EMPTY_METADATA != 0 {
        decls.keep_empty_metadata();
    }
    // SAFETY: the caller's promise.
    let entries = unsafe { c.array(metadata, count, "metadata")? };
    for (i, e) in entries.iter().enumerate() {
        // SAFETY: as above.
        let (k, v) = unsafe {
            (
                c.name(e.key.ptr, e.key.len, &format!("metadata[{i}].key.ptr"))?,
                c.name(
                    e.value.ptr,
                    e.value.len,
                    &format!("metadata[{i}].value.ptr"),
                )?,
            )
        };
        decls.metadata_entry(k, v)?;
    }
    Ok(())
}

/// The durability `flags` ask for.
pub(crate) fn durability(flags: u32) -> Durability {
    if flags & ST_SAVE_NO_SYNC != 0 {
        Durability::Unsynced
    } else {
        Durability::Synced
    }
}

/// Writes `count` tensors (each: name, dtype, shape, `byte_size` bytes at `data`) and
/// `metadata_count` metadata entries as a safetensors file at `path`, atomically: written to a
/// temporary file beside it, synced (unless `ST_SAVE_NO_SYNC`), renamed over it. On any error
/// an existing file is untouched. `flags`: `ST_SAVE_NO_SYNC`, `ST_SAVE_EMPTY_METADATA`. The
/// layout is the reference's (dtype-descending then name order, metadata first, sorted keys,
/// padded to 8 bytes): byte-identical to Python's `save_file` with at most one metadata key.
///
/// Errors: `ST_ERR_INVALID_TENSOR_NAME` (`__metadata__`, or not UTF-8), `ST_ERR_INVALID_HEADER`
/// (metadata not UTF-8), `ST_ERR_DUPLICATE_KEY`, `ST_ERR_TYPE_MISMATCH` (no such dtype),
/// `ST_ERR_TENSOR_INVALID_INFO` (bytes that disagree with dtype and shape),
/// `ST_ERR_HEADER_TOO_LARGE`, `ST_ERR_IO` (including a directory or FIFO at `path`).
#[no_mangle]
pub unsafe extern "C" fn st_save_file(
    path: *const c_char,
    tensors: *const st_tensor,
    count: usize,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    flags: u32,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_save_file");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let path = unsafe { c.path(path, "path")? };
        c.flags(flags, ST_SAVE_NO_SYNC | ST_SAVE_EMPTY_METADATA)?;
        let mut decls = Declarations::new(Some(path));
        // SAFETY: as above.
        let data = unsafe { declare_tensors(c, &mut decls, tensors, count, true)? };
        // SAFETY: as above.
        unsafe { declare_metadata(c, &mut decls, metadata, metadata_count, flags)? };
        let prepared = decls.prepare(&data, 0)?;
        Ok(prepared.write_file_with(path, durability(flags))?)
    })
}

/// `st_save_file` into memory: on success `*data` holds the file's `*len` bytes, allocated by
/// the library; free them with `st_bytes_free`.
#[no_mangle]
pub unsafe extern "C" fn st_serialize(
    tensors: *const st_tensor,
    count: usize,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    flags: u32,
    data: *mut *mut c_void,
    len: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_serialize");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (data, len) = unsafe { (c.out(data, "data")?, c.out(len, "len")?) };
        c.flags(flags, ST_SAVE_NO_SYNC | ST_SAVE_EMPTY_METADATA)?;
        let mut decls = Declarations::new(None);
        // SAFETY: as above.
        let bytes = unsafe { declare_tensors(c, &mut decls, tensors, count, true)? };
        // SAFETY: as above.
        unsafe { declare_metadata(c, &mut decls, metadata, metadata_count, flags)? };
        let prepared = decls.prepare(&bytes, 0)?;
        let n = prepared.len();
        // malloc, so that `st_bytes_free` needs no length. Never 0 bytes: a file has a header.
        // SAFETY: a fresh allocation, checked below.
        let buffer = unsafe { libc::malloc(n.max(1)) }.cast::<u8>();
        if buffer.is_null() {
            return Err(fallible::out_of_memory("a serialized file", n as u64).into());
        }
        // SAFETY: `n` writable bytes we own.
        let out = unsafe { std::slice::from_raw_parts_mut(buffer, n) };
        if let Err(e) = prepared.write_into(out) {
            // SAFETY: ours, not handed out.
            unsafe { libc::free(buffer.cast()) };
            return Err(e.into());
        }
        *data = buffer.cast();
        *len = n;
        Ok(())
    })
}

/// Frees bytes `st_serialize` returned (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn st_bytes_free(data: *mut c_void) {
    // SAFETY: NULL or a buffer of `st_serialize` (malloc), freed once (the header's contract).
    quietly(|| unsafe { libc::free(data) });
}
