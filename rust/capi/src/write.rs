//! Writing a file all at once: `st_save_file` (atomic replace on disk) and `st_serialize` (into
//! memory the library allocates). The layout is the reference's, byte for byte. Writing tensor
//! by tensor, one file or a sharded checkpoint, is `writer.rs` (`st_writer`).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::os::raw::c_int;

use safetensors_core::{
    fallible, text_to_write, Durability, Error, PreparedFile, TensorView, TextField,
};

use crate::args::{st_str, Call};
use crate::dtype::to_write;
use crate::status::{quietly, run, st_error, Res};
use crate::tensor::{given, st_tensor};

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

/// The caller's tensors and metadata, checked: names and metadata UTF-8, dtypes real, keys not
/// repeated. The tensors borrow the caller's memory for the call.
struct Input<'a> {
    tensors: Vec<(String, TensorView<'a>)>,
    metadata: Option<BTreeMap<String, String>>,
}

unsafe fn input<'a>(
    c: Call,
    tensors: *const st_tensor,
    count: usize,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    flags: u32,
) -> Res<Input<'a>> {
    c.flags(flags, ST_SAVE_NO_SYNC | ST_SAVE_EMPTY_METADATA)?;
    // SAFETY: the caller's promise.
    let list = unsafe { c.array(tensors, count, "tensors")? };
    let mut out = fallible::with_capacity(list.len(), "the tensors to write")?;
    for (i, t) in list.iter().enumerate() {
        // SAFETY: as above.
        let t = unsafe { given(c, t, &format!("tensors[{i}]"))? };
        let name = text_to_write(t.name, TextField::TensorName)?;
        let dtype = to_write(&name, t.dtype)?;
        out.push((name, TensorView::new(dtype, t.shape, t.data)));
    }
    Ok(Input {
        tensors: out,
        // SAFETY: as above.
        metadata: unsafe { metadata_of(c, metadata, metadata_count, flags)? },
    })
}

/// The caller's metadata entries, checked: UTF-8, keys not repeated; `None` when there are
/// none and `ST_SAVE_EMPTY_METADATA` is not in `flags`.
///
/// # Safety
/// `metadata` points to `metadata_count` entries, each describing memory as the header says.
pub(crate) unsafe fn metadata_of(
    c: Call,
    metadata: *const st_metadata_entry,
    metadata_count: usize,
    flags: u32,
) -> Res<Option<BTreeMap<String, String>>> {
    // SAFETY: the caller's promise.
    let entries = unsafe { c.array(metadata, metadata_count, "metadata")? };
    let mut map = (metadata_count > 0 || flags & ST_SAVE_EMPTY_METADATA != 0).then(BTreeMap::new);
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
        let key = text_to_write(k, TextField::MetadataKey)?;
        let value = text_to_write(v, TextField::MetadataValue)?;
        let map = map.get_or_insert_with(BTreeMap::new);
        if map.contains_key(&key) {
            return Err(Error::DuplicateKey {
                key,
                in_metadata: true,
            }
            .into());
        }
        map.insert(key, value);
    }
    Ok(map)
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
        let durability = if flags & ST_SAVE_NO_SYNC != 0 {
            Durability::Unsynced
        } else {
            Durability::Synced
        };
        // SAFETY: as above.
        unsafe { input(c, tensors, count, metadata, metadata_count, flags) }
            .and_then(|i| {
                let prepared = PreparedFile::new(i.tensors, i.metadata.as_ref())?;
                Ok(prepared.write_file_with(path, durability)?)
            })
            .map_err(|e| match e {
                crate::status::Fail::Core(e) => e.in_file(path).into(),
                other => other,
            })
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
        // SAFETY: as above.
        let input = unsafe { input(c, tensors, count, metadata, metadata_count, flags)? };
        let prepared = PreparedFile::new(input.tensors, input.metadata.as_ref())?;
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
