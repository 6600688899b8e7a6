//! [`st_file`]: one open safetensors file (mapped, read on demand, or a caller's memory), its
//! tensors, metadata and bytes.

use std::ffi::{c_char, c_void};
use std::os::raw::c_int;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use safetensors_core::{
    tensor_not_found, AddressRange, AlignedBuf, Backend, Error, LentBytes, MetadataList,
    OpenOptions, Release, SafeFile, SortedNames, TensorInfo,
};

use crate::args::{st_str, Call};
use crate::ffi::{free_box, hand_out};
use crate::status::{run, st_error, Fail, Res};
use crate::tensor::st_tensor;

/// Backend: map the file read-only; tensor bytes are zero-copy pointers into the mapping.
pub const ST_BACKEND_MMAP: u32 = 0;
/// Backend: read the header at open, tensor bytes with `pread` when asked (network filesystems,
/// files another process may change).
pub const ST_BACKEND_READ: u32 = 1;
/// Backend: like `ST_BACKEND_READ`, with `O_DIRECT` into aligned buffers (cold loads at the
/// disk's speed); falls back to `pread` where the filesystem refuses `O_DIRECT`.
pub const ST_BACKEND_DIRECT: u32 = 2;
/// Open flag: accept bytes after the last tensor (some tools append them), instead of
/// `ST_ERR_METADATA_INCOMPLETE_BUFFER`; `st_file_desc.trailing_bytes` counts them.
pub const ST_OPEN_ALLOW_TRAILING_BYTES: u32 = 0x100;
/// Open flag, checkpoints only: read the index as an allow-list (tensors it lists but their
/// shard lacks are `ST_ERR_SHARD_MISSING` only when asked for; copies in other shards are
/// ignored).
pub const ST_OPEN_LENIENT: u32 = 0x200;

/// The low byte of open flags: the backend.
pub(crate) const BACKEND_BITS: u32 = 0xff;

/// `st_file_key` order: names sorted byte-wise, like Python's `safe_open(...).keys()`.
pub const ST_ORDER_SORTED: u32 = 0;
/// `st_file_key` order: file order (by data offset), as the tensors lie in the file.
pub const ST_ORDER_FILE: u32 = 1;

/// The backend the low byte of `flags` names.
pub(crate) fn backend(c: Call, flags: u32) -> Res<Backend> {
    match flags & BACKEND_BITS {
        ST_BACKEND_MMAP => Ok(Backend::Mmap),
        ST_BACKEND_READ => Ok(Backend::Read),
        ST_BACKEND_DIRECT => Ok(Backend::Direct),
        other => Err(Fail::careless(format!(
            "{}: {other} is no backend (ST_BACKEND_MMAP, ST_BACKEND_READ or ST_BACKEND_DIRECT)",
            c.0
        ))),
    }
}

/// An open, validated safetensors file. Safe to use from several threads at once; free it with
/// `st_file_free`. Whatever was made from it (slices, streams, upload plans) holds the file
/// itself and may outlive this handle; pointers into it (names, shapes, zero-copy bytes) do
/// not.
pub struct st_file {
    pub(crate) inner: Arc<SafeFile>,
    /// The names in `ST_ORDER_SORTED`, sorted at the first call that asks.
    sorted: SortedNames,
    metadata: MetadataList,
}

impl st_file {
    pub(crate) fn new(inner: SafeFile) -> st_file {
        st_file {
            metadata: MetadataList::of(inner.header().metadata()),
            inner: Arc::new(inner),
            sorted: SortedNames::new(),
        }
    }

    /// The tensor `name` (any bytes), or `TensorNotFound` naming the file.
    pub(crate) fn find(&self, name: &[u8]) -> Res<TensorInfo<'_>> {
        let header = self.inner.header();
        header
            .position_bytes(name)
            .and_then(|i| header.at(i))
            .ok_or_else(|| not_found(name, self.inner.path()))
    }
}

/// The core's `TensorNotFound` for `name` in `path`.
pub(crate) fn not_found(name: &[u8], path: &Path) -> Fail {
    tensor_not_found(name, path).into()
}

/// Opens and validates the safetensors file at `path` (NUL-terminated, as the OS takes it).
/// `flags`: a backend (`ST_BACKEND_MMAP`, the default 0, `_READ` or `_DIRECT`), plus
/// `ST_OPEN_ALLOW_TRAILING_BYTES`. On success `*out` is the new file; free it with
/// `st_file_free`.
///
/// Errors: every malformed file is its `ST_ERR_*` kind (the whole header is validated here);
/// `ST_ERR_IO` for a missing file, a directory, a FIFO, permissions.
#[no_mangle]
pub unsafe extern "C" fn st_file_open(
    path: *const c_char,
    flags: u32,
    out: *mut *mut st_file,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_open");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (path, out) = unsafe { (c.path(path, "path")?, c.out(out, "out")?) };
        c.flags(flags, BACKEND_BITS | ST_OPEN_ALLOW_TRAILING_BYTES)?;
        let options = OpenOptions {
            backend: backend(c, flags)?,
            allow_trailing_bytes: flags & ST_OPEN_ALLOW_TRAILING_BYTES != 0,
            ..OpenOptions::default()
        };
        let file = SafeFile::open_with(path, options)?;
        *out = hand_out(st_file::new(file));
        Ok(())
    })
}

/// Called once with the `owner` given to `st_file_open_memory` when the library no longer
/// reads the bytes.
pub type st_release_fn = Option<unsafe extern "C" fn(owner: *mut c_void)>;

/// A copy of a caller's bytes, aligned to 4096 bytes (so that typed reads of every dtype are
/// aligned, as from a mapping).
struct Copied(AlignedBuf);

impl AsRef<[u8]> for Copied {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// The name a file in memory is given in messages.
unsafe fn memory_name<'a>(c: Call, name: *const c_char) -> Res<&'a Path> {
    if name.is_null() {
        return Ok(Path::new("<memory>"));
    }
    // SAFETY: the caller's promise: NULL or NUL-terminated.
    unsafe { c.path(name, "name") }
}

/// Opens a complete safetensors file held in memory, with exactly the checks a file on disk
/// gets, and borrows the bytes (no copy): tensor pointers point into them. `name` (NULL:
/// `"<memory>"`) stands for the file in messages. `flags`: `ST_OPEN_ALLOW_TRAILING_BYTES`
/// (the backend bits are ignored: the bytes are already in memory).
///
/// Lifetime: the library reads the bytes for as long as anything made from the file lives
/// (the `st_file`, its slices, streams, upload plans). With `release` not NULL, the library
/// calls `release(owner)` exactly once, from whichever thread drops the last of them, and the
/// bytes must stay alive and unchanged until then; on failure it is called before this
/// returns. With `release` NULL the caller must keep the bytes alive and unchanged until the
/// file and everything made from it are freed.
#[no_mangle]
pub unsafe extern "C" fn st_file_open_memory(
    data: *const c_void,
    len: usize,
    name: *const c_char,
    flags: u32,
    release: st_release_fn,
    owner: *mut c_void,
    out: *mut *mut st_file,
    err: *mut st_error,
) -> c_int {
    // Taken first, so that the owner is released on every path, errors included.
    // SAFETY: the header's contract: `release(owner)` may be called once, from any thread.
    let owner = release.map(|release| unsafe { Release::new(release, owner) });
    let c = Call("st_file_open_memory");
    run(err, move || {
        // SAFETY: the header's contract for each argument.
        let (bytes, name, out) = unsafe {
            (
                c.bytes(data, len, "data")?,
                memory_name(c, name)?,
                c.out(out, "out")?,
            )
        };
        c.flags(flags, BACKEND_BITS | ST_OPEN_ALLOW_TRAILING_BYTES)?;
        // SAFETY: the header's contract: the bytes stay alive and unchanged until the owner is
        // released (without one, until everything made from the file is freed).
        let lent = unsafe { LentBytes::new(bytes.as_ptr(), bytes.len(), owner) };
        let options = OpenOptions {
            allow_trailing_bytes: flags & ST_OPEN_ALLOW_TRAILING_BYTES != 0,
            ..OpenOptions::default()
        };
        let file = SafeFile::from_memory(name, lent.into_memory(), options)?;
        *out = hand_out(st_file::new(file));
        Ok(())
    })
}

/// `st_file_open_memory` on a copy of the bytes (4096-byte aligned) that the file owns: the
/// caller's bytes are not used after this returns.
#[no_mangle]
pub unsafe extern "C" fn st_file_open_memory_copy(
    data: *const c_void,
    len: usize,
    name: *const c_char,
    flags: u32,
    out: *mut *mut st_file,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_open_memory_copy");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (bytes, name, out) = unsafe {
            (
                c.bytes(data, len, "data")?,
                memory_name(c, name)?,
                c.out(out, "out")?,
            )
        };
        c.flags(flags, BACKEND_BITS | ST_OPEN_ALLOW_TRAILING_BYTES)?;
        let mut copy = AlignedBuf::new(bytes.len()).map_err(|e| Error::io(name, "copy", e))?;
        copy.as_mut_slice().copy_from_slice(bytes);
        let options = OpenOptions {
            allow_trailing_bytes: flags & ST_OPEN_ALLOW_TRAILING_BYTES != 0,
            ..OpenOptions::default()
        };
        let file = SafeFile::from_memory(name, Box::new(Copied(copy)), options)?;
        *out = hand_out(st_file::new(file));
        Ok(())
    })
}

/// Frees a file (NULL is ignored). Slices, streams and plans made from it keep what they need.
#[no_mangle]
pub unsafe extern "C" fn st_file_free(file: *mut st_file) {
    // SAFETY: NULL or a file from `st_file_open*`, freed once (the header's contract).
    unsafe { free_box(file) }
}

/// What `st_file_describe` reports about a file.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_file_desc {
    /// Number of tensors.
    pub tensor_count: usize,
    /// How tensor bytes are reached: `ST_BACKEND_*` (a file in memory says `ST_BACKEND_MMAP`).
    pub backend: u32,
    /// Whether the bytes are a caller's memory (`st_file_open_memory*`).
    pub in_memory: bool,
    /// Whether the header has a `__metadata__` map (`null` counts as absent).
    pub has_metadata: bool,
    /// Number of metadata entries (for `st_file_metadata`).
    pub metadata_count: usize,
    /// The header length N: the data buffer starts at file offset 8 + N.
    pub header_len: u64,
    /// Bytes of the data buffer.
    pub data_len: u64,
    /// Bytes after the last tensor (0 unless opened with `ST_OPEN_ALLOW_TRAILING_BYTES`).
    pub trailing_bytes: u64,
    /// Data bytes read so far by the read and direct backends (0 for mapped files).
    pub bytes_read: u64,
    /// The path given to `st_file_open` (or the name given to `st_file_open_memory*`); valid
    /// while the file lives.
    pub path: st_str,
}

/// Describes `file` into `*out`.
#[no_mangle]
pub unsafe extern "C" fn st_file_describe(
    file: *const st_file,
    out: *mut st_file_desc,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_describe");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, out) = unsafe { (c.handle(file, "file")?, c.out(out, "out")?) };
        let f = &file.inner;
        let header = f.header();
        *out = st_file_desc {
            tensor_count: header.len(),
            backend: f.backend() as u32,
            in_memory: f.is_in_memory(),
            has_metadata: header.metadata().is_some(),
            metadata_count: header.metadata().map_or(0, |m| m.len()),
            header_len: header.header_len() as u64,
            data_len: header.data_len() as u64,
            trailing_bytes: f.trailing_bytes(),
            bytes_read: f.bytes_read(),
            path: st_str::of(f.path().as_os_str().as_bytes()),
        };
        Ok(())
    })
}

/// The name of tensor `i` (below `tensor_count`) in `order`: `ST_ORDER_SORTED` (byte-wise
/// name order, like Python's `keys()`) or `ST_ORDER_FILE` (data-offset order). `*name` is
/// valid while the file lives.
#[no_mangle]
pub unsafe extern "C" fn st_file_key(
    file: *const st_file,
    i: usize,
    order: u32,
    name: *mut st_str,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_key");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, out) = unsafe { (c.handle(file, "file")?, c.out(name, "name")?) };
        let header = file.inner.header();
        let i = c.index(i, header.len(), "the file's tensor list")?;
        let position = match order {
            ST_ORDER_SORTED => file.sorted.position(header, i).unwrap_or(i),
            ST_ORDER_FILE => i,
            other => {
                return Err(Fail::careless(format!(
                    "st_file_key: {other} is no order (ST_ORDER_SORTED or ST_ORDER_FILE)"
                )))
            }
        };
        let info = header
            .at(position)
            .ok_or_else(|| Fail::careless(format!("st_file_key: no tensor at {position}")))?;
        *out = st_str::of(info.name.as_bytes());
        Ok(())
    })
}

/// Describes tensor `name` (`name_len` bytes) into `*out`: dtype, shape, data offsets, and its
/// bytes zero-copy when the file is mapped or in memory (NULL otherwise: use `st_file_read`).
/// Reads no tensor data. Every pointer in `*out` is valid while the file lives. A mapped file
/// is mapped at the first call that needs its bytes (this one, or a read), not at open.
///
/// Errors: `ST_ERR_TENSOR_NOT_FOUND`; `ST_ERR_IO` when that mapping fails (the file was
/// truncated since it was opened).
#[no_mangle]
pub unsafe extern "C" fn st_file_info(
    file: *const st_file,
    name: *const c_char,
    name_len: usize,
    out: *mut st_tensor,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_info");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, name, out) = unsafe {
            (
                c.handle(file, "file")?,
                c.name(name, name_len, "name")?,
                c.out(out, "out")?,
            )
        };
        *out = st_tensor::of(&file.inner, &file.find(name)?)?;
        Ok(())
    })
}

/// Copies `len` bytes of `file`, starting at `offset` of its data buffer, into `dst`, which
/// may not overlap the file's memory.
unsafe fn read_into(
    c: Call,
    file: &SafeFile,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> Res<()> {
    // SAFETY: the caller's promise.
    let dst = unsafe { c.output(&[AddressRange::of_file(file)?], dst, len)? };
    Ok(file.read_data(offset, dst)?)
}

/// Copies tensor `name` into `dst`, which must hold exactly its byte size (`dst_len`), with
/// any backend. Errors: `ST_ERR_TENSOR_NOT_FOUND`; `ST_ERR_INVALID_SLICE` for a `dst_len`
/// other than the tensor's size, or a `dst` that overlaps the file's bytes in memory;
/// `ST_ERR_IO` when a read fails (a file that shrank).
#[no_mangle]
pub unsafe extern "C" fn st_file_read(
    file: *const st_file,
    name: *const c_char,
    name_len: usize,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_read");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, name) = unsafe { (c.handle(file, "file")?, c.name(name, name_len, "name")?) };
        let info = file.find(name)?;
        // SAFETY: as above.
        unsafe { read_tensor(c, &file.inner, &info, dst, dst_len) }
    })
}

/// Copies all of tensor `info` of `file` into `dst` of exactly its size.
pub(crate) unsafe fn read_tensor(
    c: Call,
    file: &SafeFile,
    info: &TensorInfo<'_>,
    dst: *mut c_void,
    dst_len: usize,
) -> Res<()> {
    // The length first: a NULL `dst` of the wrong length is told its length, not its NULL.
    info.check_destination(dst_len)?;
    // SAFETY: the caller's promise.
    let dst = unsafe { c.output(&[AddressRange::of_file(file)?], dst, dst_len)? };
    Ok(file.read_tensor(info, dst)?)
}

/// Copies `len` bytes of the data buffer, from `offset` on, into `dst` (with any backend: byte
/// runs of slices are relative to the data buffer). Errors: `ST_ERR_INVALID_SLICE` for a range
/// outside the data buffer or a `dst` overlapping the file's bytes in memory; `ST_ERR_IO`.
#[no_mangle]
pub unsafe extern "C" fn st_file_read_data(
    file: *const st_file,
    offset: u64,
    dst: *mut c_void,
    len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_read_data");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let file = unsafe { c.handle(file, "file")? };
        // SAFETY: as above.
        unsafe { read_into(c, &file.inner, offset, dst, len) }
    })
}

/// Metadata entry `i` (below `st_file_desc.metadata_count`), keys in sorted order. The strings
/// are valid while the file lives.
#[no_mangle]
pub unsafe extern "C" fn st_file_metadata(
    file: *const st_file,
    i: usize,
    key: *mut st_str,
    value: *mut st_str,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_metadata");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, key, value) = unsafe {
            (
                c.handle(file, "file")?,
                c.out(key, "key")?,
                c.out(value, "value")?,
            )
        };
        let list = &file.metadata;
        let (k, v) = list
            .get(c.index(i, list.len(), "the metadata")?)
            .unwrap_or_default();
        *key = st_str::of(k.as_bytes());
        *value = st_str::of(v.as_bytes());
        Ok(())
    })
}

/// The metadata value of `key` (`key_len` bytes) into `*value` and `*found` = true, or
/// `*found` = false (and `*value` empty) when there is no such key. Valid while the file lives.
#[no_mangle]
pub unsafe extern "C" fn st_file_metadata_get(
    file: *const st_file,
    key: *const c_char,
    key_len: usize,
    value: *mut st_str,
    found: *mut bool,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_metadata_get");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, key, value, found) = unsafe {
            (
                c.handle(file, "file")?,
                c.name(key, key_len, "key")?,
                c.out(value, "value")?,
                c.out(found, "found")?,
            )
        };
        let hit = file.metadata.value(key);
        *found = hit.is_some();
        *value = hit.map_or(st_str::empty(), |v| st_str::of(v.as_bytes()));
        Ok(())
    })
}

#[cfg(test)]
mod tests;
