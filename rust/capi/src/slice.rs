//! [`st_slice`]: a NumPy-style selection of one tensor, planned without reading: its shape, its
//! contiguous byte runs in the file, and its bytes on request.

use std::ffi::{c_char, c_void};
use std::os::raw::c_int;
use std::sync::Arc;

use safetensors_core::{name_to_find, AddressRange, Indexer, SafeFile, SlicePlan, TensorInfo};

use crate::args::{bytes_ptr, dims_ptr, st_str, Call};
use crate::checkpoint::st_checkpoint;
use crate::ffi::{free_box, hand_out};
use crate::file::st_file;
use crate::status::{run, st_error, Fail, Res};
use crate::tensor::st_tensor;

/// `st_index.kind`: `start:stop:step` (the default of a zeroed `st_index`; see `has_start`).
pub const ST_INDEX_RANGE: u32 = 0;
/// `st_index.kind`: one position, `start`; the dimension disappears from the result.
pub const ST_INDEX_SELECT: u32 = 1;

/// How to select along one dimension, as in Python: negative positions count from the end.
/// Build them with `st_all()`, `st_range(start, stop)`, `st_range_step(start, stop, step)` and
/// `st_select(i)`. Missing trailing dimensions mean `:`. (The flags are bytes, nonzero for yes,
/// rather than `bool`: a caller's byte is never an invalid value.)
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_index {
    /// `ST_INDEX_RANGE` or `ST_INDEX_SELECT`.
    pub kind: u32,
    /// Range: nonzero when `start` is given (else the dimension's start).
    pub has_start: u8,
    /// Range: nonzero when `stop` is given (else the dimension's end).
    pub has_stop: u8,
    /// Range: first position; select: the position.
    pub start: i64,
    /// Range: end position (exclusive); `start >= stop` is an empty range.
    pub stop: i64,
    /// Range: the stride, at least 1.
    pub step: i64,
}

/// A planned selection of one tensor: shape and byte runs, no data read. Holds its file (a
/// checkpoint's shard) itself, so it may outlive the `st_file` or `st_checkpoint` it came from;
/// free it with `st_slice_free`. Safe to use from several threads at once.
pub struct st_slice {
    file: Arc<SafeFile>,
    /// The tensor's position in its file (offset order).
    position: usize,
    plan: SlicePlan,
}

impl st_slice {
    fn info(&self) -> Res<TensorInfo<'_>> {
        self.file
            .header()
            .at(self.position)
            .ok_or_else(|| Fail::careless(format!("st_slice: no tensor at {}", self.position)))
    }
}

pub(crate) fn indexers(c: Call, indices: &[st_index]) -> Res<Vec<Indexer>> {
    indices
        .iter()
        .enumerate()
        .map(|(axis, i)| match i.kind {
            ST_INDEX_RANGE => Ok(Indexer::Range {
                start: (i.has_start != 0).then_some(i.start),
                stop: (i.has_stop != 0).then_some(i.stop),
                step: i.step,
            }),
            ST_INDEX_SELECT => Ok(Indexer::Select(i.start)),
            other => Err(Fail::careless(format!(
                "{}: indices[{axis}].kind is {other}, neither ST_INDEX_RANGE nor ST_INDEX_SELECT",
                c.0
            ))),
        })
        .collect()
}

/// Plans the selection and makes the slice.
unsafe fn make(
    c: Call,
    file: &Arc<SafeFile>,
    info: &TensorInfo<'_>,
    indices: *const st_index,
    count: usize,
    out: &mut *mut st_slice,
) -> Res<()> {
    // SAFETY: the caller's promise.
    let indices = unsafe { c.array(indices, count, "indices")? };
    let plan = SlicePlan::new(info, &indexers(c, indices)?).map_err(|e| e.in_file(file.path()))?;
    let position = file.header().position(info.name).ok_or_else(|| {
        Fail::careless(format!("{}: tensor `{}` has no position", c.0, info.name))
    })?;
    *out = hand_out(st_slice {
        file: file.clone(),
        position,
        plan,
    });
    Ok(())
}

/// Plans a selection of tensor `name` of `file`: `count` indices (at most its rank). Reads
/// nothing. Errors: `ST_ERR_TENSOR_NOT_FOUND`; `ST_ERR_INVALID_SLICE` (too many indices, out of
/// range, a step below 1); `ST_ERR_MISALIGNED_SLICE` (F4/F6 cut inside a byte).
#[no_mangle]
pub unsafe extern "C" fn st_file_slice(
    file: *const st_file,
    name: *const c_char,
    name_len: usize,
    indices: *const st_index,
    count: usize,
    out: *mut *mut st_slice,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_file_slice");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, name, out) = unsafe {
            (
                c.handle(file, "file")?,
                c.name(name, name_len, "name")?,
                c.out(out, "out")?,
            )
        };
        let info = file.find(name)?;
        // SAFETY: as above.
        unsafe { make(c, &file.inner, &info, indices, count, out) }
    })
}

/// `st_file_slice` for tensor `name` of a checkpoint (its shard is opened now if it was not).
#[no_mangle]
pub unsafe extern "C" fn st_checkpoint_slice(
    checkpoint: *const st_checkpoint,
    name: *const c_char,
    name_len: usize,
    indices: *const st_index,
    count: usize,
    out: *mut *mut st_slice,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_checkpoint_slice");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, name, out) = unsafe {
            (
                c.handle(checkpoint, "checkpoint")?,
                c.name(name, name_len, "name")?,
                c.out(out, "out")?,
            )
        };
        let text = name_to_find(name, ckpt.inner.path())?;
        let shard = ckpt.inner.shard_holding(text)?;
        let file = ckpt.inner.shard(shard)?;
        let info = file.info(text)?;
        // SAFETY: as above.
        unsafe { make(c, file, &info, indices, count, out) }
    })
}

/// Frees a slice (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn st_slice_free(slice: *mut st_slice) {
    // SAFETY: NULL or a slice from `st_*_slice`, freed once (the header's contract).
    unsafe { free_box(slice) }
}

/// Describes the selection into `*out`: the tensor's name and dtype, the selection's shape and
/// byte size, its bytes zero-copy when it is one contiguous run of a file in memory (else
/// NULL: use `st_slice_read`), and in `data_begin`/`data_end` the first and one past the last
/// byte it touches in the data buffer. Valid while the slice lives.
#[no_mangle]
pub unsafe extern "C" fn st_slice_tensor(
    slice: *const st_slice,
    out: *mut st_tensor,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_slice_tensor");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (slice, out) = unsafe { (c.handle(slice, "slice")?, c.out(out, "out")?) };
        let info = slice.info()?;
        let begin = info.data_offsets.0;
        let (lo, hi) = slice.plan.extent().unwrap_or((0, 0));
        let data = match slice.file.mapped_data()? {
            Some(d) if slice.plan.is_contiguous() => d
                .get(begin + lo..begin + hi)
                .map_or(std::ptr::null(), bytes_ptr),
            _ => std::ptr::null(),
        };
        *out = st_tensor {
            name: st_str::of(info.name.as_bytes()),
            dtype: info.dtype as i32,
            rank: slice.plan.shape().len(),
            shape: dims_ptr(slice.plan.shape()),
            data,
            byte_size: slice.plan.byte_len(),
            data_begin: (begin + lo) as u64,
            data_end: (begin + hi) as u64,
        };
        Ok(())
    })
}

/// Copies the selected bytes, packed in row-major order, into `dst` of exactly the slice's
/// byte size. Only the selected bytes are read. Errors: `ST_ERR_INVALID_SLICE` for another
/// size or a `dst` overlapping the file's bytes in memory; `ST_ERR_IO`.
#[no_mangle]
pub unsafe extern "C" fn st_slice_read(
    slice: *const st_slice,
    dst: *mut c_void,
    dst_len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_slice_read");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let slice = unsafe { c.handle(slice, "slice")? };
        let reads = [AddressRange::of_file(&slice.file)?];
        // SAFETY: as above.
        let dst = unsafe { c.output(&reads, dst, dst_len)? };
        let info = slice.info()?;
        Ok(slice.file.read_slice_of(&info, &slice.plan, dst)?)
    })
}

/// One contiguous run of bytes: `length` bytes from `offset`, relative to the start of the
/// file's data buffer (file offset 8 + the header length).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct st_byte_run {
    /// Offset in the data buffer.
    pub offset: u64,
    /// Number of bytes.
    pub length: u64,
}

/// The selection's contiguous byte runs, in result order, touching runs merged (what a GPU or
/// I/O path reads): the first `capacity` into `runs` (NULL with `capacity` 0), and their total
/// number into `*count`. Call once with `capacity` 0 to size the array (a strided selection
/// has a run per element).
#[no_mangle]
pub unsafe extern "C" fn st_slice_runs(
    slice: *const st_slice,
    runs: *mut st_byte_run,
    capacity: usize,
    count: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_slice_runs");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (slice, count) = unsafe { (c.handle(slice, "slice")?, c.out(count, "count")?) };
        if capacity > 0 && runs.is_null() {
            return Err(Fail::careless(
                "st_slice_runs: `runs` is NULL with a capacity above 0".into(),
            ));
        }
        let begin = slice.info()?.data_offsets.0 as u64;
        let mut n = 0usize;
        for (offset, length) in slice.plan.runs() {
            if n < capacity {
                let run = st_byte_run {
                    offset: begin + offset as u64,
                    length: length as u64,
                };
                // SAFETY: `runs` holds `capacity` elements (the caller's promise).
                unsafe { runs.add(n).write(run) };
            }
            n += 1;
        }
        *count = n;
        Ok(())
    })
}
