//! Uploads to NVIDIA GPUs through the CUDA driver API, loaded at run time with `cudarc`: no CUDA
//! toolkit to build, and a clean [`Error::Cuda`] (never a panic) on machines without a driver or
//! a device.
//!
//! [`Uploader`] runs `safetensors_core`'s staged pipeline ([`Ring`]) with pinned staging buffers
//! (page-locked, not write-combined: readers write them and the copy engine reads them), an event
//! per buffer, and asynchronous host-to-device copies on a non-blocking stream. Only the staging
//! ring is page-locked, never the mapped file: locking a whole file and copying pageable memory
//! were both measured slow by others.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use safetensors_core::upload::{Device, Ring, RingOptions, UploadPlan, UploadStats};
use safetensors_core::{Error, Result, SafeFile};

/// Runs a driver call, turning its error, and the panic `cudarc` raises for a missing driver
/// library or symbol, into `Error::Cuda` naming what was being done.
fn call<T>(what: &str, f: impl FnOnce() -> std::result::Result<T, DriverError>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        // The enum's own name (e.g. CUDA_ERROR_NO_DEVICE): DriverError's Debug asks the driver
        // for a description, which must not be relied on when the driver is the problem.
        Ok(Err(e)) => Err(Error::Cuda {
            message: format!("{what} failed: {:?}", e.0),
        }),
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::Cuda {
                message: format!("{what}: the CUDA driver library is unusable: {why}"),
            })
        }
    }
}

/// Loads the driver library and initialises it, once. The library is probed first because
/// `cudarc` panics when it is missing.
fn driver() -> Result<()> {
    static INIT: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver is \
                        installed, or it is not on the library path"
                    .into(),
            );
        }
        call("cuInit", cu::init).map_err(|e| match e {
            Error::Cuda { message } if message.contains("CUDA_ERROR_NO_DEVICE") => {
                "no CUDA device: the driver is installed but sees no GPU".to_string()
            }
            other => other.to_string(),
        })
    })
    .clone()
    .map_err(|message| Error::Cuda { message })
}

/// Whether CUDA can be used here, and if not, why.
pub fn status() -> std::result::Result<usize, Error> {
    device_count()
}

/// Number of CUDA devices (an error when there is no driver).
pub fn device_count() -> Result<usize> {
    driver()?;
    call("cuDeviceGetCount", cu::device::get_count).map(|n| n.max(0) as usize)
}

/// One device, with its primary context retained.
pub struct Gpu {
    ordinal: usize,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread once made current there.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Device `ordinal`, or `Error::Cuda` saying why not.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Cuda {
                message: format!("no CUDA device {ordinal}: this machine has {count}"),
            });
        }
        let device = call("cuDeviceGet", || cu::device::get(ordinal as i32))?;
        // SAFETY: `device` came from cuDeviceGet.
        let ctx = call("cuDevicePrimaryCtxRetain", || unsafe {
            cu::primary_ctx::retain(device)
        })?;
        let gpu = Gpu {
            ordinal,
            device,
            ctx,
        };
        gpu.make_current()?;
        Ok(Arc::new(gpu))
    }

    /// Makes this device's context current on the calling thread.
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained for as long as `self` lives.
        call("cuCtxSetCurrent", || unsafe {
            cu::ctx::set_current(self.ctx)
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> Result<String> {
        call("cuDeviceGetName", || cu::device::get_name(self.device))
    }

    /// Allocates `bytes` of device memory (at least 1).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        self.make_current()?;
        // SAFETY: the context is current.
        let ptr = call("cuMemAlloc", || unsafe { cu::malloc_sync(bytes.max(1)) })?;
        Ok(DeviceBuffer {
            gpu: self.clone(),
            ptr,
            len: bytes,
        })
    }

    /// Copies `dst.len()` bytes from device address `src` to host memory (synchronous).
    pub fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.make_current()?;
        // SAFETY: the caller names device memory of at least `dst.len()` bytes.
        call("cuMemcpyDtoH", || unsafe { cu::memcpy_dtoh_sync(dst, src) })
    }

    /// Seconds for one copy of `bytes` from pinned host memory to the device: the link's
    /// practical limit, for benchmarks.
    pub fn pinned_copy_seconds(self: &Arc<Self>, bytes: usize) -> Result<f64> {
        let dst = self.alloc(bytes)?;
        let mut slot = PinnedSlot::new(self, bytes)?;
        slot.buffer().fill(1);
        let stream = Stream::new(self)?;
        let target = Target {
            gpu: self,
            stream: stream.0,
            dst: dst.ptr,
        };
        target.submit(&mut slot, bytes, 0)?; // warm-up
        target.wait(&mut slot)?;
        let start = std::time::Instant::now();
        target.submit(&mut slot, bytes, 0)?;
        target.wait(&mut slot)?;
        let seconds = start.elapsed().as_secs_f64();
        slot.free(self);
        Ok(seconds)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken in `open`.
        let _ = call("cuDevicePrimaryCtxRelease", || unsafe {
            cu::primary_ctx::release(self.device)
        });
    }
}

/// A device allocation, freed on drop unless released.
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives up ownership: the caller frees the address with `cuMemFree`.
    pub fn release(mut self) -> u64 {
        std::mem::replace(&mut self.ptr, 0)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.gpu.make_current().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
            let _ = call("cuMemFree", || unsafe { cu::free_sync(self.ptr) });
        }
    }
}

/// Frees device memory that a caller took over with [`DeviceBuffer::release`].
pub fn free(ordinal: usize, ptr: u64) -> Result<()> {
    let gpu = Gpu::open(ordinal)?;
    // SAFETY: the caller passes an address from this library's allocation on this device.
    call("cuMemFree", || unsafe { cu::free_sync(ptr) }).map(|_| drop(gpu))
}

/// A non-blocking stream, destroyed on drop.
struct Stream(sys::CUstream);

impl Stream {
    fn new(gpu: &Gpu) -> Result<Stream> {
        gpu.make_current()?;
        call("cuStreamCreate", || {
            cu::stream::create(cu::stream::StreamKind::NonBlocking)
        })
        .map(Stream)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by `Stream::new` and destroyed once.
        let _ = call("cuStreamDestroy", || unsafe { cu::stream::destroy(self.0) });
    }
}

/// A pinned staging buffer and the event that marks its last copy done.
pub struct PinnedSlot {
    host: *mut u8,
    len: usize,
    event: sys::CUevent,
    pending: bool,
}

// SAFETY: the pinned buffer and event are owned by the slot, which the ring hands to one thread
// at a time.
unsafe impl Send for PinnedSlot {}

impl PinnedSlot {
    fn new(gpu: &Gpu, len: usize) -> Result<PinnedSlot> {
        gpu.make_current()?;
        // Flags 0: page-locked, cached host memory (not write-combined, which CPU writes of file
        // data would pay for).
        // SAFETY: the context is current; the memory is only read after being written.
        let host = call("cuMemHostAlloc", || unsafe { cu::malloc_host(len, 0) })? as *mut u8;
        let event = match call("cuEventCreate", || {
            cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        }) {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: allocated just above.
                let _ = unsafe { cu::free_host(host as *mut c_void) };
                return Err(e);
            }
        };
        Ok(PinnedSlot {
            host,
            len,
            event,
            pending: false,
        })
    }

    fn buffer(&mut self) -> &mut [u8] {
        // SAFETY: `host` points to `len` bytes owned by this slot.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }

    /// Frees the buffer and event; the caller has waited for the last copy.
    fn free(self, gpu: &Gpu) {
        let _ = gpu.make_current();
        // SAFETY: owned by this slot, freed once, no copy in flight.
        let _ = call("cuEventDestroy", || unsafe {
            cu::event::destroy(self.event)
        });
        let _ = call("cuMemFreeHost", || unsafe {
            cu::free_host(self.host as *mut c_void)
        });
    }
}

/// The pipeline's view of one upload: a stream and a destination on a device.
struct Target<'a> {
    gpu: &'a Gpu,
    stream: sys::CUstream,
    dst: sys::CUdeviceptr,
}

// SAFETY: the stream and device pointer are plain handles valid on any thread with the context.
unsafe impl Sync for Target<'_> {}

impl Device for Target<'_> {
    type Slot = PinnedSlot;

    fn new_slot(&self, bytes: usize) -> Result<PinnedSlot> {
        PinnedSlot::new(self.gpu, bytes)
    }

    fn buffer<'s>(&self, slot: &'s mut PinnedSlot) -> &'s mut [u8] {
        slot.buffer()
    }

    fn submit(&self, slot: &mut PinnedSlot, len: usize, dst_offset: u64) -> Result<()> {
        let src = &slot.buffer()[..len];
        // SAFETY: the slot stays untouched until `wait` sees its event; the destination range
        // lies inside the allocation the plan was sized for.
        call("cuMemcpyHtoDAsync", || unsafe {
            cu::memcpy_htod_async(self.dst + dst_offset, src, self.stream)
        })?;
        call("cuEventRecord", || unsafe {
            cu::event::record(slot.event, self.stream)
        })?;
        slot.pending = true;
        Ok(())
    }

    fn wait(&self, slot: &mut PinnedSlot) -> Result<()> {
        if slot.pending {
            // SAFETY: the event was recorded by `submit`.
            call("cuEventSynchronize", || unsafe {
                cu::event::synchronize(slot.event)
            })?;
            slot.pending = false;
        }
        Ok(())
    }

    fn enter_thread(&self) -> Result<()> {
        self.gpu.make_current()
    }
}

/// Uploads plans to one device through a reusable staging ring.
///
/// ```no_run
/// use safetensors_core::{Backend, SafeFile, upload::{RingOptions, UploadPlan}};
/// let file = SafeFile::open("model.safetensors", Backend::Mmap)?;
/// let mut plan = UploadPlan::new(256);
/// for name in file.header().sorted_names() { plan.add_tensor(0, &file, name)?; }
/// let uploader = safetensors_cuda::Uploader::new(0, RingOptions::default())?;
/// let weights = uploader.upload(&[&file], &plan)?;   // one allocation, complete on return
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub struct Uploader {
    gpu: Arc<Gpu>,
    ring: Option<Ring<PinnedSlot>>,
    stream: Stream,
    /// The stream of the last `upload_into`, whose copies may still be in flight.
    caller_stream: std::sync::Mutex<Option<u64>>,
}

// SAFETY: the ring's slots are behind its mutexes; the stream is a plain handle.
unsafe impl Send for Uploader {}
unsafe impl Sync for Uploader {}

impl Uploader {
    /// An uploader for device `ordinal` with its staging ring allocated.
    pub fn new(ordinal: usize, options: RingOptions) -> Result<Uploader> {
        let gpu = Gpu::open(ordinal)?;
        let stream = Stream::new(&gpu)?;
        let ring = {
            let target = Target {
                gpu: &gpu,
                stream: stream.0,
                dst: 0,
            };
            Ring::new(&target, options)?
        };
        Ok(Uploader {
            gpu,
            ring: Some(ring),
            stream,
            caller_stream: std::sync::Mutex::new(None),
        })
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Bytes of pinned host memory the staging ring holds.
    pub fn staging_bytes(&self) -> usize {
        self.ring.as_ref().map_or(0, Ring::staging_bytes)
    }

    fn ring(&self) -> &Ring<PinnedSlot> {
        self.ring.as_ref().expect("the ring lives until drop")
    }

    /// Uploads `plan` into a new allocation; the data is on the device when this returns.
    pub fn upload(&self, files: &[&SafeFile], plan: &UploadPlan) -> Result<DeviceBuffer> {
        let buffer = self.gpu.alloc(plan.total() as usize)?;
        let target = Target {
            gpu: &self.gpu,
            stream: self.stream.0,
            dst: buffer.ptr,
        };
        let run = self.ring().run(&target, files, plan);
        let waited = self.ring().wait_all(&target);
        run.and(waited)?;
        Ok(buffer)
    }

    /// Uploads `plan` into `dst` (at least `capacity` bytes of device memory) with copies on
    /// the caller's `stream`. Returns once every copy is enqueued: completion is visible on
    /// that stream. Staging buffers are reused only after their copies finish, so the next
    /// upload, `synchronize` or drop waits for these.
    pub fn upload_into(
        &self,
        files: &[&SafeFile],
        plan: &UploadPlan,
        dst: u64,
        capacity: usize,
        stream: u64,
    ) -> Result<UploadStats> {
        if (capacity as u64) < plan.total() {
            return Err(Error::Cuda {
                message: format!(
                    "the destination holds {capacity} bytes; the upload needs {}",
                    plan.total()
                ),
            });
        }
        let target = Target {
            gpu: &self.gpu,
            stream: stream as sys::CUstream,
            dst,
        };
        *self.caller_stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream);
        self.ring().run(&target, files, plan)
    }

    /// Waits for every copy this uploader has enqueued.
    pub fn synchronize(&self) -> Result<()> {
        let target = Target {
            gpu: &self.gpu,
            stream: self.stream.0,
            dst: 0,
        };
        self.gpu.make_current()?;
        self.ring().wait_all(&target)
    }

    /// Seconds for uploading `plan` into a new allocation, for benchmarks.
    pub fn timed_upload(
        &self,
        files: &[&SafeFile],
        plan: &UploadPlan,
    ) -> Result<(DeviceBuffer, f64)> {
        let start = std::time::Instant::now();
        let b = self.upload(files, plan)?;
        Ok((b, start.elapsed().as_secs_f64()))
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        let _ = self.synchronize();
        if let Some(ring) = self.ring.take() {
            for slot in ring.into_slots() {
                slot.free(&self.gpu);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On machines without an NVIDIA driver (CI), every entry point gives a `Cuda` error that
    /// says so, instead of panicking.
    #[test]
    fn no_driver_is_a_clean_cuda_error() {
        match device_count() {
            Ok(n) => eprintln!("SKIPPED: a CUDA driver is present here ({n} devices)"),
            Err(e) => {
                assert_eq!(e.kind(), safetensors_core::ErrorKind::Cuda);
                let text = e.to_string();
                assert!(
                    text.contains("libcuda") || text.contains("no CUDA device"),
                    "{text}"
                );
                assert_eq!(
                    Gpu::open(0).err().map(|e| e.kind()),
                    Some(safetensors_core::ErrorKind::Cuda)
                );
                assert_eq!(
                    Uploader::new(0, RingOptions::default())
                        .err()
                        .map(|e| e.kind()),
                    Some(safetensors_core::ErrorKind::Cuda)
                );
            }
        }
    }
}
