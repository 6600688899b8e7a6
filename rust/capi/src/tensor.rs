//! [`st_tensor`]: a tensor's name, dtype, shape and bytes, the one description that crosses the
//! C API in both directions (what a file says about a tensor, a slice, a streamed tensor; what
//! a caller gives to write or to convert).

use std::ffi::c_void;

use safetensors_core::{SafeFile, TensorInfo};

use crate::args::{bytes_ptr, dims_ptr, st_str, Call};
use crate::status::Res;

/// A tensor: name, dtype, shape and bytes.
///
/// Filled by the library (`st_file_info`, `st_checkpoint_info`, `st_slice_tensor`,
/// `st_stream_tensor_get`): every pointer in it borrows from the object it came from and is
/// valid while that object lives (the `st_file`, the `st_checkpoint`, the `st_slice`, the
/// `st_stream_tensor`). Given by a caller (`st_save_file`, `st_serialize`, `st_convert`, the
/// dequantizers): the library reads it during the call only; `data_begin` and `data_end` are
/// ignored.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_tensor {
    /// The tensor's name (conversions do not use it; may be empty).
    pub name: st_str,
    /// Its element type, one of `ST_DTYPE_*`.
    pub dtype: i32,
    /// Number of dimensions (0 for a scalar).
    pub rank: usize,
    /// `rank` dimensions, outermost first (never NULL when filled by the library).
    pub shape: *const usize,
    /// Its bytes, little-endian, row-major. Filled by `st_file_info` and
    /// `st_checkpoint_info`: zero-copy, in the file's mapping or the caller's memory
    /// (`st_file_open_memory`), or NULL with the read and direct backends, which map
    /// nothing (read the bytes with `st_file_read`); by `st_slice_tensor`: the same, when the
    /// selection is one contiguous run of such a file, else NULL (use `st_slice_read`).
    pub data: *const c_void,
    /// Number of bytes.
    pub byte_size: usize,
    /// Filled by `st_file_info` and `st_checkpoint_info`: the tensor's `data_offsets`, relative
    /// to the start of its file's data buffer (which begins at file offset 8 + the header
    /// length); by `st_slice_tensor`: the first and one past the last byte the selection
    /// touches there; 0 elsewhere.
    pub data_begin: u64,
    /// See `data_begin`.
    pub data_end: u64,
}

impl st_tensor {
    /// The description of `info` in `file`, its bytes zero-copy when the file is in memory
    /// (mapped now if its mapping was deferred, which can fail: `Io`).
    pub(crate) fn of(
        file: &SafeFile,
        info: &TensorInfo<'_>,
    ) -> safetensors_core::Result<st_tensor> {
        let (begin, end) = info.data_offsets;
        let data = file
            .mapped_data()?
            .and_then(|d| d.get(begin..end))
            .map_or(std::ptr::null(), bytes_ptr);
        Ok(st_tensor {
            name: st_str::of(info.name.as_bytes()),
            dtype: info.dtype as i32,
            rank: info.shape.len(),
            shape: dims_ptr(info.shape),
            data,
            byte_size: end - begin,
            data_begin: begin as u64,
            data_end: end as u64,
        })
    }
}

/// A tensor a caller gives for a conversion, its pointers checked (its name is checked too,
/// but a conversion does not use it).
pub(crate) struct Given<'a> {
    pub dtype: i32,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// Reads a caller's `st_tensor` (`what` names it in messages).
///
/// # Safety
/// `t` describes memory as the header says: `name.len` bytes at `name.ptr`, `rank` dimensions
/// at `shape`, `byte_size` bytes at `data`, all unchanged during the call.
pub(crate) unsafe fn given<'a>(c: Call, t: &'a st_tensor, what: &str) -> Res<Given<'a>> {
    // SAFETY: the caller's promise.
    unsafe {
        c.name(t.name.ptr, t.name.len, &format!("{what}.name.ptr"))?;
        Ok(Given {
            dtype: t.dtype,
            shape: c.array(t.shape, t.rank, &format!("{what}.shape"))?,
            data: c.bytes(t.data, t.byte_size, &format!("{what}.data"))?,
        })
    }
}
