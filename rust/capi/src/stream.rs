//! Cold loads: requests (whole tensors or slices, of a file or a checkpoint), host streams with
//! a bounded budget (`TensorStream`), prefetching into the page cache (`Plan`, `Prefetch`) and
//! access advice. The core resolves requests in file order, one rule for all of them.

use std::os::raw::c_int;
use std::path::Path;
use std::sync::Arc;

use safetensors_core::{
    advise, name_to_find, Advice, Plan, Prefetch, PrefetchOptions, Request, SafeFile, Source,
    StreamOptions, StreamTensor, TensorStream,
};

use crate::args::{bytes_ptr, dims_ptr, st_str, Call};
use crate::checkpoint::st_checkpoint;
use crate::ffi::{free_box, hand_out};
use crate::file::st_file;
use crate::slice::st_index;
use crate::status::{run, st_error, Fail, Res};
use crate::tensor::st_tensor;

/// One requested tensor: whole (`index_count` 0), or the bytes a selection of it takes, packed
/// in row-major order. A zeroed request's other fields mean "wherever the source has it".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_request {
    /// The tensor's name.
    pub name: st_str,
    /// The selection, `index_count` indices as `st_file_slice` takes them (NULL with 0).
    pub indices: *const st_index,
    /// Number of indices; 0 for the whole tensor.
    pub index_count: usize,
    /// Nonzero when `file` says which file of the source holds it (a checkpoint's shard
    /// index); otherwise the checkpoint's index says, or the file is the one given.
    pub has_file: u8,
    /// See `has_file`.
    pub file: usize,
}

/// The caller's requests: `None` (every tensor) for `requests` NULL with `count` 0.
pub(crate) unsafe fn resolve_requests(
    c: Call,
    requests: *const st_request,
    count: usize,
    source: &Path,
) -> Res<Option<Vec<Request>>> {
    if requests.is_null() && count == 0 {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    let list = unsafe { c.array(requests, count, "requests")? };
    let mut out = safetensors_core::fallible::with_capacity(list.len(), "the requests")?;
    for (i, r) in list.iter().enumerate() {
        // SAFETY: as above.
        let (name, indices) = unsafe {
            (
                c.name(r.name.ptr, r.name.len, &format!("requests[{i}].name.ptr"))?,
                c.array(r.indices, r.index_count, &format!("requests[{i}].indices"))?,
            )
        };
        let name = name_to_find(name, source)?;
        let mut request = if indices.is_empty() {
            Request::tensor(name)
        } else {
            Request::slice(name, crate::slice::indexers(c, indices)?)
        };
        if r.has_file != 0 {
            request = request.in_file(r.file);
        }
        out.push(request);
    }
    Ok(Some(out))
}

/// Stream flag: when the stream cannot go on until delivered tensors are freed, make
/// `st_stream_next` wait for other threads to free them, instead of failing at once with
/// `ST_ERR_BUDGET_EXCEEDED`.
pub const ST_STREAM_WAIT_FOR_RELEASE: u32 = 1;

/// Tensors delivered in file order as soon as their bytes are read by a background thread,
/// with at most a bounded number of bytes alive at once. Holds its files itself. Used by one
/// thread at a time (like a `FILE*`); the tensors it delivers are independent and may be used
/// and freed on any thread. Freeing it cancels the reads not started.
pub struct st_stream {
    inner: TensorStream,
}

/// One tensor (or slice) a stream delivered; owns its bytes. Freeing it returns them to the
/// stream's budget (it may outlive the stream).
pub struct st_stream_tensor {
    inner: StreamTensor,
}

fn stream_options(c: Call, max_inflight_bytes: u64, flags: u32) -> Res<StreamOptions> {
    c.flags(flags, ST_STREAM_WAIT_FOR_RELEASE)?;
    let default = StreamOptions::default();
    Ok(StreamOptions {
        max_inflight_bytes: if max_inflight_bytes == 0 {
            default.max_inflight_bytes
        } else {
            max_inflight_bytes
        },
        wait_for_release: flags & ST_STREAM_WAIT_FOR_RELEASE != 0,
    })
}

/// Streams `requests` (`count` of them; NULL with 0 for every tensor, in file order; a non-NULL
/// list of 0 streams nothing) of `file`, with at most `max_inflight_bytes` (0: 256 MiB) of
/// buffers alive: read, queued, or delivered and not yet freed. A tensor larger than that is
/// read alone, once nothing else is alive. `flags`: `ST_STREAM_WAIT_FOR_RELEASE`. Every request
/// is resolved now: a missing tensor or a bad selection is returned here, before anything is
/// read. Free the stream with `st_stream_free`.
#[no_mangle]
pub unsafe extern "C" fn st_stream_file(
    file: *const st_file,
    requests: *const st_request,
    count: usize,
    max_inflight_bytes: u64,
    flags: u32,
    out: *mut *mut st_stream,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_stream_file");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, out) = unsafe { (c.handle(file, "file")?, c.out(out, "out")?) };
        let options = stream_options(c, max_inflight_bytes, flags)?;
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, file.inner.path())? };
        let files = [file.inner.clone()];
        let inner = TensorStream::open(Source::Files(&files), list.as_deref(), options)?;
        *out = hand_out(st_stream { inner });
        Ok(())
    })
}

/// `st_stream_file` for a checkpoint: file order is shard order, then data offsets; a request's
/// `file` is a shard index. Opens the shards the requests touch now.
#[no_mangle]
pub unsafe extern "C" fn st_stream_checkpoint(
    checkpoint: *const st_checkpoint,
    requests: *const st_request,
    count: usize,
    max_inflight_bytes: u64,
    flags: u32,
    out: *mut *mut st_stream,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_stream_checkpoint");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(out, "out")?) };
        let options = stream_options(c, max_inflight_bytes, flags)?;
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, ckpt.inner.path())? };
        let inner = TensorStream::open(Source::Checkpoint(&ckpt.inner), list.as_deref(), options)?;
        *out = hand_out(st_stream { inner });
        Ok(())
    })
}

/// The next tensor into `*tensor` (free it with `st_stream_tensor_free`), or NULL when every
/// tensor was delivered. Errors: `ST_ERR_BUDGET_EXCEEDED` when the next tensor cannot be read
/// until the caller frees delivered ones (recoverable: free some and call again; nothing is
/// skipped); any other error ends the stream, and every later call returns it again.
#[no_mangle]
pub unsafe extern "C" fn st_stream_next(
    stream: *mut st_stream,
    tensor: *mut *mut st_stream_tensor,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_stream_next");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (stream, out) = unsafe { (c.handle_mut(stream, "stream")?, c.out(tensor, "tensor")?) };
        *out = std::ptr::null_mut();
        if let Some(next) = stream.inner.next() {
            *out = hand_out(st_stream_tensor { inner: next? });
        }
        Ok(())
    })
}

/// What `st_stream_describe` reports about a stream.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_stream_desc {
    /// How many tensors (or slices) it delivers in all.
    pub tensor_count: usize,
    /// Bytes it delivers in all.
    pub total_bytes: u64,
    /// Bytes of buffers alive now.
    pub inflight_bytes: u64,
    /// The most bytes alive so far: at most max(`max_inflight_bytes`, the largest tensor).
    pub peak_inflight_bytes: u64,
}

/// Describes `stream` into `*out`.
#[no_mangle]
pub unsafe extern "C" fn st_stream_describe(
    stream: *const st_stream,
    out: *mut st_stream_desc,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_stream_describe");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (stream, out) = unsafe { (c.handle(stream, "stream")?, c.out(out, "out")?) };
        let s = &stream.inner;
        *out = st_stream_desc {
            tensor_count: s.len(),
            total_bytes: s.total_bytes(),
            inflight_bytes: s.inflight_bytes(),
            peak_inflight_bytes: s.peak_inflight_bytes(),
        };
        Ok(())
    })
}

/// Frees a stream (NULL is ignored): cancels the reads not started, and returns once the read
/// in progress ends. Tensors it delivered stay valid.
#[no_mangle]
pub unsafe extern "C" fn st_stream_free(stream: *mut st_stream) {
    // SAFETY: NULL or a stream from `st_stream_*`, freed once (the header's contract).
    unsafe { free_box(stream) }
}

/// Describes a delivered tensor into `*out` (`data_begin`/`data_end` are 0): its bytes (the
/// whole tensor, or the selection packed) are valid until `st_stream_tensor_free`. With
/// `request` not NULL, its position in the request list (for every tensor: in delivery order);
/// with `file` not NULL, the file it came from (a checkpoint's shard index; 0 for a file).
#[no_mangle]
pub unsafe extern "C" fn st_stream_tensor_get(
    tensor: *const st_stream_tensor,
    out: *mut st_tensor,
    request: *mut usize,
    file: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_stream_tensor_get");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (t, out) = unsafe { (c.handle(tensor, "tensor")?, c.out(out, "out")?) };
        let t = &t.inner;
        *out = st_tensor {
            name: st_str::of(t.name.as_bytes()),
            dtype: t.dtype as i32,
            rank: t.shape.len(),
            shape: dims_ptr(&t.shape),
            data: bytes_ptr(t.data()),
            byte_size: t.data().len(),
            data_begin: 0,
            data_end: 0,
        };
        // SAFETY: each is NULL or writable (the caller's promise).
        unsafe {
            if let Some(r) = request.as_mut() {
                *r = t.request;
            }
            if let Some(f) = file.as_mut() {
                *f = t.file;
            }
        }
        Ok(())
    })
}

/// Frees a delivered tensor (NULL is ignored), returning its bytes to its stream's budget.
#[no_mangle]
pub unsafe extern "C" fn st_stream_tensor_free(tensor: *mut st_stream_tensor) {
    // SAFETY: NULL or a tensor from `st_stream_next`, freed once (the header's contract).
    unsafe { free_box(tensor) }
}

/// A prefetch in progress: reader threads warming the page cache for a plan. Every call may
/// come from several threads at once. Freeing it cancels the requests not started and waits
/// for the running ones.
pub struct st_prefetch {
    inner: Prefetch,
}

fn prefetch_options(threads: usize, request_bytes: usize) -> PrefetchOptions {
    let default = PrefetchOptions::default();
    PrefetchOptions {
        threads: if threads == 0 {
            default.threads
        } else {
            threads
        },
        request_bytes: if request_bytes == 0 {
            default.request_bytes
        } else {
            request_bytes
        },
    }
}

fn start(
    plan: Res<Plan>,
    threads: usize,
    request_bytes: usize,
    out: &mut *mut st_prefetch,
) -> Res<()> {
    let inner = plan?.prefetch(prefetch_options(threads, request_bytes))?;
    *out = hand_out(st_prefetch { inner });
    Ok(())
}

/// Starts warming the page cache with the bytes of `requests` of `file` (NULL with 0: every
/// tensor) in the background: `threads` readers (0: 4) of `request_bytes` requests (0: 16 MiB).
/// A file in memory has nothing to warm. Wait with `st_prefetch_wait`; free with
/// `st_prefetch_free`.
#[no_mangle]
pub unsafe extern "C" fn st_prefetch_file(
    file: *const st_file,
    requests: *const st_request,
    count: usize,
    threads: usize,
    request_bytes: usize,
    out: *mut *mut st_prefetch,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_prefetch_file");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, out) = unsafe { (c.handle(file, "file")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, file.inner.path())? };
        let files = [file.inner.clone()];
        let plan = Plan::of(Source::Files(&files), list.as_deref()).map_err(Fail::from);
        start(plan, threads, request_bytes, out)
    })
}

/// `st_prefetch_file` for a checkpoint (every tensor its index lists, or the requests), shard
/// by shard.
#[no_mangle]
pub unsafe extern "C" fn st_prefetch_checkpoint(
    checkpoint: *const st_checkpoint,
    requests: *const st_request,
    count: usize,
    threads: usize,
    request_bytes: usize,
    out: *mut *mut st_prefetch,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_prefetch_checkpoint");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, ckpt.inner.path())? };
        let plan = Plan::of(Source::Checkpoint(&ckpt.inner), list.as_deref()).map_err(Fail::from);
        start(plan, threads, request_bytes, out)
    })
}

/// Waits for every request of the prefetch. Its error, if any, is returned to every call
/// (`ST_ERR_IO` naming the file that could not be read, or that was replaced since it was
/// opened).
#[no_mangle]
pub unsafe extern "C" fn st_prefetch_wait(
    prefetch: *const st_prefetch,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_prefetch_wait");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let p = unsafe { c.handle(prefetch, "prefetch")? };
        Ok(p.inner.wait()?)
    })
}

/// Progress: bytes in the page cache so far into `*done` and bytes in all into `*total` (either
/// may be NULL).
#[no_mangle]
pub unsafe extern "C" fn st_prefetch_progress(
    prefetch: *const st_prefetch,
    done: *mut u64,
    total: *mut u64,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_prefetch_progress");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let p = unsafe { c.handle(prefetch, "prefetch")? };
        // SAFETY: each is NULL or writable (the caller's promise).
        unsafe {
            if let Some(d) = done.as_mut() {
                *d = p.inner.bytes_done();
            }
            if let Some(t) = total.as_mut() {
                *t = p.inner.total_bytes();
            }
        }
        Ok(())
    })
}

/// Frees a prefetch (NULL is ignored): cancels the requests not started and waits for the
/// running ones.
#[no_mangle]
pub unsafe extern "C" fn st_prefetch_free(prefetch: *mut st_prefetch) {
    // SAFETY: NULL or a prefetch from `st_prefetch_*`, freed once (the header's contract).
    unsafe { free_box(prefetch) }
}

/// Advice: the bytes will be read soon (`MADV_WILLNEED`).
pub const ST_ADVICE_WILL_NEED: u32 = 0;
/// Advice: read front to back (`MADV_SEQUENTIAL`).
pub const ST_ADVICE_SEQUENTIAL: u32 = 1;
/// Advice: scattered reads (`MADV_RANDOM`).
pub const ST_ADVICE_RANDOM: u32 = 2;

/// Gives the kernel `advice` (`ST_ADVICE_*`) for the mapping of the bytes of `requests` of
/// `file` (NULL with 0: every tensor). Does nothing for the read and direct backends and files
/// in memory. Errors: `ST_ERR_IO` when the kernel refuses.
#[no_mangle]
pub unsafe extern "C" fn st_advise_file(
    file: *const st_file,
    requests: *const st_request,
    count: usize,
    advice: u32,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_advise_file");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let file = unsafe { c.handle(file, "file")? };
        let advice = match advice {
            ST_ADVICE_WILL_NEED => Advice::WillNeed,
            ST_ADVICE_SEQUENTIAL => Advice::Sequential,
            ST_ADVICE_RANDOM => Advice::Random,
            other => {
                return Err(Fail::careless(format!(
                    "st_advise_file: {other} is no advice (ST_ADVICE_WILL_NEED, _SEQUENTIAL or _RANDOM)"
                )))
            }
        };
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, file.inner.path())? };
        let files: [Arc<SafeFile>; 1] = [file.inner.clone()];
        let plan = Plan::of(Source::Files(&files), list.as_deref())?;
        Ok(advise(&file.inner, &plan, advice)?)
    })
}
