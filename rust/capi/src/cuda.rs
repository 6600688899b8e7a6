//! GPU uploads: an upload plan (where each requested tensor or slice goes in one destination;
//! no GPU needed), and the CUDA entry points that run it: into a new allocation or a caller's
//! one, through the device's shared one-shot uploader or an `st_uploader` of one's own.
//! Device pointers cross as `void*` and streams as `uintptr_t` (a `cudaStream_t` is a
//! `CUstream`), so no CUDA header is needed. The driver is loaded at run time; without it, or in
//! a build without CUDA, every CUDA call returns `ST_ERR_CUDA` saying which.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::Arc;

use safetensors_core::upload::UploadPlan;
use safetensors_core::{Request, SafeFile, Source};

use crate::args::{dims_ptr, st_str, Call};
use crate::checkpoint::st_checkpoint;
use crate::file::st_file;
use crate::status::{quietly, run, st_error, Res};
use crate::stream::{resolve_requests, st_request};

/// What to upload and where each tensor goes: one destination, tensors (or slices) back to
/// back in request order, each on a multiple of the alignment. Holds its files itself.
pub struct st_upload_plan {
    plan: UploadPlan,
    // Held so that a plan keeps its files alive as every reader does.
    files: Vec<Arc<SafeFile>>,
}

impl st_upload_plan {
    /// The core's plan of `requests` of `source` (`UploadPlan::of`, as C++'s uploads make it:
    /// the same resolution of names, shard pins and slices, the same alignment rule).
    fn of(
        source: Source<'_>,
        requests: Option<&[Request]>,
        alignment: usize,
    ) -> Res<st_upload_plan> {
        let (plan, files) = UploadPlan::of(source, requests, alignment)?;
        Ok(st_upload_plan { plan, files })
    }

    fn file_refs(&self) -> Vec<&SafeFile> {
        self.files.iter().map(|f| f.as_ref()).collect()
    }
}

/// Plans an upload of `requests` of `file` (NULL with 0: every tensor, in sorted-name order),
/// each placed on a multiple of `alignment` (0: 256, what CUDA allocations are aligned to; else
/// a power of two). A request's `file`, when `has_file` is set, must be 0 (the one file). No GPU
/// needed. Free it with `st_upload_plan_free`.
#[no_mangle]
pub unsafe extern "C" fn st_upload_plan_file(
    file: *const st_file,
    requests: *const st_request,
    count: usize,
    alignment: usize,
    out: *mut *mut st_upload_plan,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_upload_plan_file");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (file, out) = unsafe { (c.handle(file, "file")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, file.inner.path())? };
        let files = [file.inner.clone()];
        let plan = st_upload_plan::of(Source::Files(&files), list.as_deref(), alignment)?;
        *out = Box::into_raw(Box::new(plan));
        Ok(())
    })
}

/// `st_upload_plan_file` for a checkpoint (every tensor as `st_checkpoint_keys` lists them, or
/// the requests, each from its shard; a request's `file` picks the shard). Opens the shards it
/// touches.
#[no_mangle]
pub unsafe extern "C" fn st_upload_plan_checkpoint(
    checkpoint: *const st_checkpoint,
    requests: *const st_request,
    count: usize,
    alignment: usize,
    out: *mut *mut st_upload_plan,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_upload_plan_checkpoint");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (ckpt, out) = unsafe { (c.handle(checkpoint, "checkpoint")?, c.out(out, "out")?) };
        // SAFETY: as above.
        let list = unsafe { resolve_requests(c, requests, count, ckpt.inner.path())? };
        let plan = st_upload_plan::of(Source::Checkpoint(&ckpt.inner), list.as_deref(), alignment)?;
        *out = Box::into_raw(Box::new(plan));
        Ok(())
    })
}

/// Frees an upload plan (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn st_upload_plan_free(plan: *mut st_upload_plan) {
    if !plan.is_null() {
        // SAFETY: a plan from `st_upload_plan_*`, freed once (the header's contract).
        quietly(|| drop(unsafe { Box::from_raw(plan) }));
    }
}

/// Where one planned tensor goes in the destination.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_placement {
    /// The tensor's name.
    pub name: st_str,
    /// Its dtype (`ST_DTYPE_*`).
    pub dtype: i32,
    /// Dimensions of what is uploaded (the selection's, for a slice).
    pub rank: usize,
    /// See `rank`.
    pub shape: *const usize,
    /// Byte offset in the destination, a multiple of the plan's alignment.
    pub offset: u64,
    /// Number of bytes.
    pub byte_size: u64,
}

/// The plan's number of placements into `*count` and the bytes its destination needs into
/// `*total_bytes` (either may be NULL).
#[no_mangle]
pub unsafe extern "C" fn st_upload_plan_describe(
    plan: *const st_upload_plan,
    count: *mut usize,
    total_bytes: *mut u64,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_upload_plan_describe");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let plan = unsafe { c.handle(plan, "plan")? };
        // SAFETY: each is NULL or writable (the caller's promise).
        unsafe {
            if let Some(n) = count.as_mut() {
                *n = plan.plan.placements().len();
            }
            if let Some(t) = total_bytes.as_mut() {
                *t = plan.plan.total();
            }
        }
        Ok(())
    })
}

/// Placement `i` (in request order) into `*out`; valid while the plan lives.
#[no_mangle]
pub unsafe extern "C" fn st_upload_plan_placement(
    plan: *const st_upload_plan,
    i: usize,
    out: *mut st_placement,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_upload_plan_placement");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (plan, out) = unsafe { (c.handle(plan, "plan")?, c.out(out, "out")?) };
        let all = plan.plan.placements();
        let p = &all[c.index(i, all.len(), "the plan")?];
        *out = st_placement {
            name: st_str::of(p.name.as_bytes()),
            dtype: p.dtype as i32,
            rank: p.shape.len(),
            shape: dims_ptr(&p.shape),
            offset: p.offset,
            byte_size: p.len,
        };
        Ok(())
    })
}

/// Whether this library was built with CUDA support (a driver is still needed at run time).
#[no_mangle]
pub extern "C" fn st_cuda_built() -> bool {
    safetensors_cuda::BUILT
}

/// Refuses a `dst` that overlaps `src` numerically (a copy onto itself), as C++'s
/// `copy_to_host` does.
fn copy_overlap(c: Call, src: *const c_void, dst: *mut c_void, len: usize) -> Res<()> {
    crate::args::refuse_overlap(c, (src as usize, len), (dst, len))
}

/// A reusable upload pipeline for one device: pinned staging buffers, reader threads, a stream.
/// Safe to share between threads (uploads through it take turns). Free it with
/// `st_uploader_free`.
pub struct st_uploader {
    inner: safetensors_cuda::Uploader,
}

/// The calls into `rust/cuda`, the same in every build: without CUDA that crate answers each
/// with `Error::Cuda` saying so.
mod device {
    use super::*;

    pub(super) fn device_count() -> Res<usize> {
        Ok(safetensors_cuda::device_count()?)
    }

    pub(super) fn new_uploader(
        device: usize,
        slots: usize,
        slot_bytes: usize,
        readers: usize,
    ) -> Res<st_uploader> {
        let options =
            safetensors_core::upload::RingOptions::with_counts(slots, slot_bytes, readers);
        Ok(st_uploader {
            inner: safetensors_cuda::Uploader::new(device, options)?,
        })
    }

    pub(super) fn load(device: usize, plan: &st_upload_plan) -> Res<u64> {
        let u = safetensors_cuda::Uploader::shared(device)?;
        Ok(u.upload(&plan.file_refs(), &plan.plan)?.release())
    }

    pub(super) fn uploader_load(u: &st_uploader, plan: &st_upload_plan) -> Res<u64> {
        Ok(u.inner.upload(&plan.file_refs(), &plan.plan)?.release())
    }

    pub(super) fn load_into(
        u: &st_uploader,
        plan: &st_upload_plan,
        dst: u64,
        capacity: usize,
        stream: u64,
    ) -> Res<()> {
        u.inner
            .upload_into(&plan.file_refs(), &plan.plan, dst, capacity, stream)?;
        Ok(())
    }

    pub(super) fn synchronize(u: &st_uploader) -> Res<()> {
        Ok(u.inner.synchronize()?)
    }

    pub(super) fn free(device: usize, ptr: u64) -> Res<()> {
        Ok(safetensors_cuda::free(device, ptr)?)
    }

    pub(super) fn download(device: usize, src: u64, dst: &mut [u8]) -> Res<()> {
        Ok(safetensors_cuda::Gpu::open(device)?.download(src, dst)?)
    }

    pub(super) fn release_staging(device: usize) -> Res<usize> {
        Ok(safetensors_cuda::release_idle(device))
    }
}

/// The number of CUDA devices into `*count`. Errors: `ST_ERR_CUDA` without a driver (saying
/// so), or in a build without CUDA.
#[no_mangle]
pub unsafe extern "C" fn st_cuda_device_count(count: *mut usize, err: *mut st_error) -> c_int {
    let c = Call("st_cuda_device_count");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let out = unsafe { c.out(count, "count")? };
        *out = device::device_count()?;
        Ok(())
    })
}

/// Uploads `plan` to `device` into one new allocation, complete on return, through the device's
/// shared uploader (made on first use and kept: no staging set-up per call after the first).
/// `*device_ptr` is the allocation (each tensor at its placement's offset); free it with
/// `st_cuda_free` (or `cuMemFree` in the device's primary context). Errors: `ST_ERR_CUDA`, and
/// the files' read errors.
#[no_mangle]
pub unsafe extern "C" fn st_cuda_load(
    device: usize,
    plan: *const st_upload_plan,
    device_ptr: *mut *mut c_void,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_cuda_load");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (plan, out) = unsafe { (c.handle(plan, "plan")?, c.out(device_ptr, "device_ptr")?) };
        *out = device::load(device, plan)? as usize as *mut c_void;
        Ok(())
    })
}

/// Unpins the staging buffers no upload to `device` holds now (pinned memory that uploads
/// keep idle for the next one: at most 16 buffers and 256 MiB per device) and puts the bytes
/// unpinned into `*released` (may be NULL), as C++'s `cuda::release_staging` returns them.
/// Uploads after it pin afresh. Errors: `ST_ERR_CUDA` in a build without CUDA.
#[no_mangle]
pub unsafe extern "C" fn st_cuda_release_staging(
    device: usize,
    released: *mut usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_cuda_release_staging");
    run(err, || {
        let n = device::release_staging(device)?;
        if !released.is_null() {
            // SAFETY: the header's contract: NULL or a writable size_t.
            unsafe { *c.out(released, "released")? = n };
        }
        Ok(())
    })
}

/// Makes an uploader for `device` with its staging ring: `slots` pinned buffers of
/// `slot_bytes` each, filled by `readers` threads (0 for each: the defaults, sized for a PCIe
/// Gen5 link). Free it with `st_uploader_free`.
#[no_mangle]
pub unsafe extern "C" fn st_uploader_new(
    device: usize,
    slots: usize,
    slot_bytes: usize,
    readers: usize,
    out: *mut *mut st_uploader,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_uploader_new");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let out = unsafe { c.out(out, "out")? };
        *out = Box::into_raw(Box::new(device::new_uploader(
            device, slots, slot_bytes, readers,
        )?));
        Ok(())
    })
}

/// Frees an uploader (NULL is ignored), after its copies have completed. Device memory it
/// allocated stays valid.
#[no_mangle]
pub unsafe extern "C" fn st_uploader_free(uploader: *mut st_uploader) {
    if !uploader.is_null() {
        // SAFETY: an uploader from `st_uploader_new`, freed once (the header's contract).
        quietly(|| drop(unsafe { Box::from_raw(uploader) }));
    }
}

/// `st_cuda_load` through `uploader` (on its device).
#[no_mangle]
pub unsafe extern "C" fn st_uploader_load(
    uploader: *const st_uploader,
    plan: *const st_upload_plan,
    device_ptr: *mut *mut c_void,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_uploader_load");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (u, plan, out) = unsafe {
            (
                c.handle(uploader, "uploader")?,
                c.handle(plan, "plan")?,
                c.out(device_ptr, "device_ptr")?,
            )
        };
        *out = device::uploader_load(u, plan)? as usize as *mut c_void;
        Ok(())
    })
}

/// Uploads `plan` into the caller's device memory `dst` (`capacity` bytes of the uploader's
/// device, aligned to the plan's alignment) with copies on the caller's `stream` (0: the legacy
/// default stream; it must belong to the device's primary context). Returns once every copy is
/// enqueued: completion is visible on `stream`. Refused with `ST_ERR_CUDA` before anything is
/// enqueued: a capacity below the plan's total or past the allocation's end, a misaligned
/// `dst`, a stream or `dst` of another device, the per-thread default stream, a capturing
/// stream.
#[no_mangle]
pub unsafe extern "C" fn st_uploader_load_into(
    uploader: *const st_uploader,
    plan: *const st_upload_plan,
    dst: *mut c_void,
    capacity: usize,
    stream: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_uploader_load_into");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (u, plan) = unsafe { (c.handle(uploader, "uploader")?, c.handle(plan, "plan")?) };
        device::load_into(u, plan, dst as usize as u64, capacity, stream as u64)
    })
}

/// Waits for every copy `uploader` has enqueued.
#[no_mangle]
pub unsafe extern "C" fn st_uploader_synchronize(
    uploader: *const st_uploader,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_uploader_synchronize");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let u = unsafe { c.handle(uploader, "uploader")? };
        device::synchronize(u)
    })
}

/// Frees device memory that `st_cuda_load` or `st_uploader_load` returned on `device`.
#[no_mangle]
pub unsafe extern "C" fn st_cuda_free(
    device: usize,
    device_ptr: *mut c_void,
    err: *mut st_error,
) -> c_int {
    run(err, || device::free(device, device_ptr as usize as u64))
}

/// Copies `len` bytes of device memory at `src` on `device` to host memory `dst` (waits for
/// the copy). Errors: `ST_ERR_CUDA`; `ST_ERR_INVALID_SLICE` for ranges that overlap.
#[no_mangle]
pub unsafe extern "C" fn st_cuda_copy_to_host(
    device: usize,
    src: *const c_void,
    dst: *mut c_void,
    len: usize,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_cuda_copy_to_host");
    run(err, || {
        copy_overlap(c, src, dst, len)?;
        // SAFETY: the header's contract: `len` writable host bytes at `dst`.
        let dst = unsafe { c.bytes_mut(dst, len, "dst")? };
        device::download(device, src as usize as u64, dst)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{st_error_clear, ST_ERR_CUDA, ST_FAILED};

    /// The one answer of a build without CUDA comes from `rust/cuda` (run with the feature off
    /// by the `cargo_test_not_built` test); a build with it asks the driver, whose absence or
    /// answer is never that one.
    #[test]
    fn a_build_without_cuda_says_so_from_the_cuda_crate() {
        let mut err = st_error {
            kind: -1,
            message: std::ptr::null_mut(),
            message_len: 0,
        };
        let mut count = usize::MAX;
        // SAFETY: valid out-pointers.
        let rc = unsafe { st_cuda_device_count(&mut count, &mut err) };
        assert_eq!(st_cuda_built(), safetensors_cuda::BUILT);
        if safetensors_cuda::BUILT && rc == 0 {
            assert_ne!(count, usize::MAX);
            return;
        }
        assert_eq!(rc, ST_FAILED);
        assert_eq!(err.kind, ST_ERR_CUDA);
        // SAFETY: the message the library wrote, `message_len` bytes.
        let text = unsafe {
            std::slice::from_raw_parts(err.message.cast::<u8>(), err.message_len).to_vec()
        };
        let text = String::from_utf8_lossy(&text);
        assert_eq!(
            text.contains("no CUDA support"),
            !safetensors_cuda::BUILT,
            "{text}"
        );
        // SAFETY: the error the call filled.
        unsafe { st_error_clear(&mut err) };
    }
}
