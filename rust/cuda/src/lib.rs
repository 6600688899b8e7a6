//! Uploads to NVIDIA GPUs through the CUDA driver API, loaded at run time with `cudarc`: no CUDA
//! toolkit to build, and a clean [`Error::Cuda`] (never a panic) on machines without a driver or
//! a device.
//!
//! [`Uploader`] runs `safetensors_core`'s staged pipeline ([`Ring`]) with pinned staging buffers
//! (page-locked, not write-combined: readers write them and the copy engine reads them), a
//! blocking-sync event per buffer (a waiting reader sleeps instead of spinning on a core the
//! other readers need), and asynchronous host-to-device copies on a non-blocking stream. Only
//! the staging ring is page-locked, never the mapped file: locking a whole file and copying
//! pageable memory were both measured slow by others.
//!
//! Contexts, as the CUDA runtime handles them: each device's primary context is retained once,
//! the first time the library uses the device, and kept for the life of the process, so device
//! memory handed to a caller outlives every `Uploader` (releasing the last reference would reset
//! the context and free it). Every entry point makes the context current only for its own
//! duration ([`Current`]) and restores the caller's, on the caller's thread and on each reader
//! thread.
//!
//! Streaming uploads (each tensor handed to the caller as it lands, or through a bounded device
//! scratch ring) are in `landing.rs`.

mod landing;
mod stage;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use safetensors_core::upload::{Ring, RingOptions, UploadPlan, UploadStats, UploadTarget};
use safetensors_core::{Error, Result, SafeFile};

pub use landing::{Delivery, LandedTensor};
pub use stage::Stager;

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

/// Number of CUDA devices (an error when there is no driver).
pub fn device_count() -> Result<usize> {
    driver()?;
    call("cuDeviceGetCount", cu::device::get_count).map(|n| n.max(0) as usize)
}

/// A context made current on this thread for the guard's life; the thread's previous context
/// (none included) comes back on drop, so a caller's later allocations and kernels land where
/// they did before calling us.
pub struct Current {
    previous: Option<sys::CUcontext>,
    changed: bool,
}

impl Current {
    fn enter(ctx: sys::CUcontext) -> Result<Current> {
        let previous = call("cuCtxGetCurrent", cu::ctx::get_current)?;
        if previous == Some(ctx) {
            return Ok(Current {
                previous,
                changed: false,
            });
        }
        // SAFETY: `ctx` is a primary context retained for the life of the process.
        call("cuCtxSetCurrent", || unsafe { cu::ctx::set_current(ctx) })?;
        Ok(Current {
            previous,
            changed: true,
        })
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.changed {
            let previous = self.previous.unwrap_or(std::ptr::null_mut());
            // SAFETY: the caller's own context (or none), as it was when we were entered.
            let _ = call("cuCtxSetCurrent", || unsafe {
                cu::ctx::set_current(previous)
            });
        }
    }
}

/// The primary context of each device, retained once and never released (see the crate
/// documentation). Stored as addresses: the handles are plain pointers valid on any thread.
fn primary_context(ordinal: usize, device: sys::CUdevice) -> Result<sys::CUcontext> {
    static RETAINED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut retained = RETAINED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, ctx)) = retained.iter().find(|(o, _)| *o == ordinal) {
        return Ok(ctx as sys::CUcontext);
    }
    // SAFETY: `device` came from cuDeviceGet.
    let ctx = call("cuDevicePrimaryCtxRetain", || unsafe {
        cu::primary_ctx::retain(device)
    })?;
    retained.push((ordinal, ctx as usize));
    Ok(ctx)
}

/// One device and its primary context (retained for the life of the process).
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
        let ctx = primary_context(ordinal, device)?;
        Ok(Arc::new(Gpu {
            ordinal,
            device,
            ctx,
        }))
    }

    /// Makes this device's context current on the calling thread until the guard drops.
    pub fn enter(&self) -> Result<Current> {
        Current::enter(self.ctx)
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
        let _current = self.enter()?;
        // SAFETY: the context is current.
        let ptr = call("cuMemAlloc", || unsafe { cu::malloc_sync(bytes.max(1)) }).map_err(|e| {
            Error::Cuda {
                message: format!(
                    "{e} (allocating {bytes} bytes on CUDA device {})",
                    self.ordinal
                ),
            }
        })?;
        Ok(DeviceBuffer {
            gpu: self.clone(),
            ptr,
            len: bytes,
        })
    }

    /// Copies `dst.len()` bytes from device address `src` to host memory (synchronous).
    pub fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller names device memory of at least `dst.len()` bytes.
        call("cuMemcpyDtoH", || unsafe { cu::memcpy_dtoh_sync(dst, src) })
    }

    /// Seconds for one copy of `bytes` from pinned host memory to the device: the link's
    /// practical limit, for benchmarks.
    pub fn pinned_copy_seconds(self: &Arc<Self>, bytes: usize) -> Result<f64> {
        let dst = self.alloc(bytes)?;
        let _current = self.enter()?;
        let mut slot = PinnedSlot::new(self, bytes)?;
        slot.buffer().fill(1);
        let stream = Stream::new(self)?;
        let target = GpuTarget {
            gpu: self,
            stream: stream.handle,
            dst: dst.ptr,
            events: None,
        };
        target.submit(&mut slot, bytes, 0)?; // warm-up
        target.wait(&mut slot)?;
        let start = std::time::Instant::now();
        target.submit(&mut slot, bytes, 0)?;
        target.wait(&mut slot)?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Checks that `stream` may carry this device's copies: not the per-thread default stream
    /// (our copies are issued from reader threads, each of which has its own), in this
    /// device's context, and not capturing a graph (a captured copy would run at graph launch,
    /// long after the staging buffer was reused).
    fn check_stream(&self, stream: u64) -> Result<()> {
        // 0 and CU_STREAM_LEGACY (1) are the legacy default stream of the current context,
        // which readers make ours.
        if stream == 0 || stream == 1 {
            return Ok(());
        }
        if stream == 2 {
            return Err(Error::Cuda {
                message: "the per-thread default stream (cudaStreamPerThread, 0x2) cannot carry \
                          an upload: its copies are issued from the library's reader threads, \
                          each of which has its own per-thread stream. Pass a stream you created, \
                          or 0 for the legacy default stream"
                    .into(),
            });
        }
        let handle = stream as sys::CUstream;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller passes a stream handle; the driver validates it.
        call("cuStreamGetCtx", || unsafe {
            sys::cuStreamGetCtx(handle, &mut ctx).result()
        })
        .map_err(|e| Error::Cuda {
            message: format!("{e}: {stream:#x} is not a valid CUDA stream"),
        })?;
        if ctx != self.ctx {
            return Err(Error::Cuda {
                message: format!(
                    "stream {stream:#x} belongs to another context than CUDA device {}'s primary \
                     context (another device, or a context created with cuCtxCreate): upload on \
                     a stream of device {}",
                    self.ordinal, self.ordinal
                ),
            });
        }
        // SAFETY: a valid stream, checked above.
        let status = call("cuStreamIsCapturing", || unsafe {
            cu::stream::is_capturing(handle)
        })?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::Cuda {
                message: format!(
                    "stream {stream:#x} is capturing a CUDA graph: an upload cannot be captured \
                     (its staging buffers are reused as soon as each copy has run); end the \
                     capture first"
                ),
            });
        }
        Ok(())
    }

    /// Checks that `[dst, dst + capacity)` is device memory of this device, in one allocation.
    fn check_destination(&self, dst: u64, capacity: usize) -> Result<()> {
        let attribute = |what: &str, attr: sys::CUpointer_attribute| -> Result<u64> {
            let mut value = 0u64;
            // SAFETY: every attribute read here fits in 8 bytes (an int is read into the low
            // bytes on little-endian hosts, the only ones CUDA supports).
            call(what, || unsafe {
                sys::cuPointerGetAttribute(
                    &mut value as *mut u64 as *mut c_void,
                    attr,
                    dst as sys::CUdeviceptr,
                )
                .result()
            })
            .map_err(|e| Error::Cuda {
                message: format!(
                    "{e}: the destination {dst:#x} is not device memory this driver knows"
                ),
            })?;
            Ok(value)
        };
        use sys::CUpointer_attribute as A;
        let ordinal = attribute(
            "cuPointerGetAttribute(DEVICE_ORDINAL)",
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        )? as u32 as usize;
        if ordinal != self.ordinal {
            return Err(Error::Cuda {
                message: format!(
                    "the destination {dst:#x} is memory of CUDA device {ordinal}, not of device \
                     {} that this uploader writes to",
                    self.ordinal
                ),
            });
        }
        let start = attribute(
            "cuPointerGetAttribute(RANGE_START_ADDR)",
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        )?;
        let size = attribute(
            "cuPointerGetAttribute(RANGE_SIZE)",
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        )?;
        // Compared as what is left, never as `dst - start + capacity`: a caller's capacity near
        // 2^64 (SIZE_MAX for "unknown") would wrap that sum into "fits".
        let left = size.saturating_sub(dst.saturating_sub(start));
        if capacity as u64 > left {
            return Err(Error::Cuda {
                message: format!(
                    "the destination {dst:#x} has {left} bytes left in its allocation, not the \
                     {capacity} bytes of capacity given"
                ),
            });
        }
        Ok(())
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

    /// Gives up ownership: the caller frees the address with `cuMemFree`. The memory stays
    /// valid for the life of the process (the device's primary context is never released).
    pub fn release(mut self) -> u64 {
        std::mem::replace(&mut self.ptr, 0)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            if let Ok(_current) = self.gpu.enter() {
                // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
                let _ = call("cuMemFree", || unsafe { cu::free_sync(self.ptr) });
            }
        }
    }
}

/// Frees device memory that a caller took over with [`DeviceBuffer::release`].
pub fn free(ordinal: usize, ptr: u64) -> Result<()> {
    let gpu = Gpu::open(ordinal)?;
    let _current = gpu.enter()?;
    // SAFETY: the caller passes an address from this library's allocation on this device.
    call("cuMemFree", || unsafe { cu::free_sync(ptr) })
}

/// A non-blocking stream, destroyed on drop (in its context, which outlives it).
struct Stream {
    handle: sys::CUstream,
    ctx: sys::CUcontext,
}

impl Stream {
    fn new(gpu: &Gpu) -> Result<Stream> {
        let _current = gpu.enter()?;
        call("cuStreamCreate", || {
            cu::stream::create(cu::stream::StreamKind::NonBlocking)
        })
        .map(|handle| Stream {
            handle,
            ctx: gpu.ctx,
        })
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: a stream we created and have not destroyed.
        call("cuStreamSynchronize", || unsafe {
            cu::stream::synchronize(self.handle)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_current) = Current::enter(self.ctx) {
            // Copies still queued would be lost with the stream.
            let _ = self.synchronize();
            // SAFETY: created by `Stream::new` and destroyed once.
            let _ = call("cuStreamDestroy", || unsafe {
                cu::stream::destroy(self.handle)
            });
        }
    }
}

/// What a slot's last copy is tracked by.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    None,
    /// The slot's event, recorded after the copy.
    Event,
    /// The copy was enqueued but its event could not be recorded, and waiting for its stream
    /// failed too: the whole context (current wherever a slot is waited for) must be waited
    /// for. Never the stream itself: a caller's stream may be destroyed once the call that
    /// enqueued the copy has returned, and its handle must not be used after that.
    Context,
    /// Copies on a stream this library created and still owns (the multi-rank stager's), waited
    /// for through that stream. Never a caller's stream (see `Context`).
    OwnStream(sys::CUstream),
}

/// A pinned staging buffer and the event that marks its last copy done. Dropping it waits for
/// that copy and frees both; a buffer whose copy could not be waited for is leaked rather than
/// freed under the copy engine.
pub struct PinnedSlot {
    host: *mut u8,
    len: usize,
    event: sys::CUevent,
    pending: Pending,
    ctx: sys::CUcontext,
}

// SAFETY: the pinned buffer and event are owned by the slot, which the ring hands to one thread
// at a time.
unsafe impl Send for PinnedSlot {}

impl PinnedSlot {
    fn new(gpu: &Gpu, len: usize) -> Result<PinnedSlot> {
        let _current = gpu.enter()?;
        // Flags 0: page-locked, cached host memory (not write-combined, which CPU writes of file
        // data would pay for).
        // SAFETY: the context is current; the memory is only read after being written.
        let host = call("cuMemHostAlloc", || unsafe { cu::malloc_host(len, 0) }).map_err(|e| {
            Error::Cuda {
                message: format!("{e} (allocating {len} bytes of pinned staging memory)"),
            }
        })? as *mut u8;
        // From here on, `Drop` frees what was allocated if the event cannot be created.
        let mut slot = PinnedSlot {
            host,
            len,
            event: std::ptr::null_mut(),
            pending: Pending::None,
            ctx: gpu.ctx,
        };
        // Blocking sync: a reader waiting for its slot sleeps rather than spinning.
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: writes one event handle.
        call("cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut slot.event, flags).result()
        })?;
        Ok(slot)
    }

    fn buffer(&mut self) -> &mut [u8] {
        // SAFETY: `host` points to `len` bytes owned by this slot.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }

    /// Blocks until the slot's last copy is done.
    fn wait(&mut self) -> Result<()> {
        match self.pending {
            Pending::None => {}
            // SAFETY: the event was recorded by `submit`.
            Pending::Event => call("cuEventSynchronize", || unsafe {
                cu::event::synchronize(self.event)
            })?,
            Pending::Context => call("cuCtxSynchronize", cu::ctx::synchronize)?,
            // SAFETY: the stream is owned by whoever marked the slot, and outlives the slot's use.
            Pending::OwnStream(stream) => call("cuStreamSynchronize", || unsafe {
                cu::stream::synchronize(stream)
            })?,
        }
        self.pending = Pending::None;
        Ok(())
    }
}

impl Drop for PinnedSlot {
    fn drop(&mut self) {
        let Ok(_current) = Current::enter(self.ctx) else {
            return;
        };
        if self.wait().is_err() {
            // The copy engine may still read the buffer: leak it rather than free it.
            return;
        }
        if !self.event.is_null() {
            // SAFETY: owned by this slot, destroyed once, no copy pending.
            let _ = call("cuEventDestroy", || unsafe {
                cu::event::destroy(self.event)
            });
        }
        // SAFETY: owned by this slot, freed once, no copy pending.
        let _ = call("cuMemFreeHost", || unsafe {
            cu::free_host(self.host as *mut c_void)
        });
    }
}

thread_local! {
    /// A reader thread's context before `enter_thread`, restored by `leave_thread`.
    static READER_CONTEXT: std::cell::RefCell<Option<Current>> =
        const { std::cell::RefCell::new(None) };
}

/// One upload's destination on a [`Gpu`]: the device pointer and the stream its copies go on,
/// and for streaming uploads the pool its marks (events) come from.
struct GpuTarget<'a> {
    gpu: &'a Gpu,
    stream: sys::CUstream,
    dst: sys::CUdeviceptr,
    events: Option<&'a landing::EventPool>,
}

// SAFETY: the stream and device pointer are plain handles valid on any thread with the context.
unsafe impl Sync for GpuTarget<'_> {}

impl UploadTarget for GpuTarget<'_> {
    type Slot = PinnedSlot;

    fn new_slot(&self, bytes: usize) -> Result<PinnedSlot> {
        PinnedSlot::new(self.gpu, bytes)
    }

    fn buffer<'s>(&self, slot: &'s mut PinnedSlot) -> &'s mut [u8] {
        slot.buffer()
    }

    fn submit(&self, slot: &mut PinnedSlot, len: usize, dst_offset: u64) -> Result<()> {
        let src = &slot.buffer()[..len];
        // SAFETY: the slot stays untouched until `wait` sees its copy done; the destination
        // range lies inside the allocation the plan was sized for.
        call("cuMemcpyHtoDAsync", || unsafe {
            cu::memcpy_htod_async(self.dst + dst_offset, src, self.stream)
        })?;
        // SAFETY: the event belongs to this slot, in this context.
        let recorded = call("cuEventRecord", || unsafe {
            cu::event::record(slot.event, self.stream)
        });
        match recorded {
            Ok(()) => slot.pending = Pending::Event,
            Err(e) => {
                // The copy is queued but untracked: wait for its stream now, while the handle is
                // certainly valid, before the slot can be refilled; if even that fails, track
                // the whole context instead (see `Pending::Context`).
                // SAFETY: the stream this call enqueued the copy on.
                let drained = call("cuStreamSynchronize", || unsafe {
                    cu::stream::synchronize(self.stream)
                });
                slot.pending = if drained.is_ok() {
                    Pending::None
                } else {
                    Pending::Context
                };
                return Err(e);
            }
        }
        Ok(())
    }

    fn wait(&self, slot: &mut PinnedSlot) -> Result<()> {
        slot.wait()
    }

    fn enter_thread(&self) -> Result<()> {
        let current = self.gpu.enter()?;
        READER_CONTEXT.with(|c| *c.borrow_mut() = Some(current));
        Ok(())
    }

    fn leave_thread(&self) {
        READER_CONTEXT.with(|c| drop(c.borrow_mut().take()));
    }
}

/// Uploads plans to one device through a reusable staging ring. Safe to share between
/// threads: uploads through one `Uploader` take turns on its ring.
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
    // Fields drop in this order: the ring's slots (each waits for its copy, then frees its
    // pinned memory and event), then the stream, the streaming uploads' events, then the
    // device handle. The context itself is never released.
    ring: Ring<PinnedSlot>,
    stream: Stream,
    events: landing::EventPool,
    gpu: Arc<Gpu>,
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
            let target = GpuTarget {
                gpu: &gpu,
                stream: stream.handle,
                dst: 0,
                events: None,
            };
            // On error the slots made so far drop, freeing themselves.
            Ring::new(&target, options)?
        };
        let events = landing::EventPool::new(gpu.ctx);
        Ok(Uploader {
            ring,
            stream,
            events,
            gpu,
        })
    }

    /// The process's uploader for device `ordinal`, made on first use, for one-shot calls:
    /// its ring ([`RingOptions::default`]) allocates staging buffers only as uploads need
    /// them and no larger than they need, and is kept (with its stream) for later calls.
    pub fn shared(ordinal: usize) -> Result<Arc<Uploader>> {
        static SHARED: Mutex<Vec<(usize, Arc<Uploader>)>> = Mutex::new(Vec::new());
        static OPTIONS: OnceLock<RingOptions> = OnceLock::new();
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, u)) = shared.iter().find(|(o, _)| *o == ordinal) {
            return Ok(u.clone());
        }
        let gpu = Gpu::open(ordinal)?;
        let stream = Stream::new(&gpu)?;
        let ring = Ring::lazy(*OPTIONS.get_or_init(RingOptions::default));
        let events = landing::EventPool::new(gpu.ctx);
        let u = Arc::new(Uploader {
            ring,
            stream,
            events,
            gpu,
        });
        shared.push((ordinal, u.clone()));
        Ok(u)
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Bytes of pinned host memory the staging ring holds.
    pub fn staging_bytes(&self) -> usize {
        self.ring.staging_bytes()
    }

    fn target(&self, stream: sys::CUstream, dst: sys::CUdeviceptr) -> GpuTarget<'_> {
        GpuTarget {
            gpu: &self.gpu,
            stream,
            dst,
            events: None,
        }
    }

    /// Uploads `plan` into a new allocation; the data is on the device when this returns.
    pub fn upload(&self, files: &[&SafeFile], plan: &UploadPlan) -> Result<DeviceBuffer> {
        self.not_from_own_callback()?;
        let _current = self.gpu.enter()?;
        let buffer = self.gpu.alloc(plan.total() as usize)?;
        let target = self.target(self.stream.handle, buffer.ptr);
        match self.ring.upload(&target, files, plan) {
            Ok(_) => Ok(buffer),
            Err(e) => {
                // Free the allocation only once nothing can still be copying into it.
                if self.stream.synchronize().is_err() {
                    let _ = buffer.release();
                }
                Err(e)
            }
        }
    }

    /// Uploads `plan` into `dst` (at least `capacity` bytes of device memory of this device,
    /// aligned to the plan's alignment) with copies on the caller's `stream` (0: the legacy
    /// default stream). Returns once every copy is enqueued: completion is visible on that
    /// stream. Staging buffers are reused only after their copies finish, so the next upload,
    /// `synchronize` or drop waits for these.
    pub fn upload_into(
        &self,
        files: &[&SafeFile],
        plan: &UploadPlan,
        dst: u64,
        capacity: usize,
        stream: u64,
    ) -> Result<UploadStats> {
        self.not_from_own_callback()?;
        self.check_into(plan, dst, capacity, stream)?;
        let _current = self.gpu.enter()?;
        let target = self.target(stream as sys::CUstream, dst);
        self.ring.run(&target, files, plan)
    }

    /// Checks a caller's destination and stream for `plan` before anything is enqueued.
    fn check_into(&self, plan: &UploadPlan, dst: u64, capacity: usize, stream: u64) -> Result<()> {
        if (capacity as u64) < plan.total() {
            return Err(Error::Cuda {
                message: format!(
                    "the destination holds {capacity} bytes; the upload needs {}",
                    plan.total()
                ),
            });
        }
        if dst % plan.alignment() != 0 {
            return Err(Error::Cuda {
                message: format!(
                    "the destination {dst:#x} is not a multiple of {} bytes, the alignment the \
                     plan places tensors at: pass memory from cudaMalloc/cuMemAlloc (256-byte \
                     aligned), or an offset into it that is a multiple of {}",
                    plan.alignment(),
                    plan.alignment()
                ),
            });
        }
        let _current = self.gpu.enter()?;
        self.gpu.check_stream(stream)?;
        if plan.total() > 0 {
            self.gpu.check_destination(dst, capacity)?;
        }
        Ok(())
    }

    /// Waits for every copy this uploader has enqueued.
    pub fn synchronize(&self) -> Result<()> {
        self.not_from_own_callback()?;
        let _current = self.gpu.enter()?;
        self.ring.wait_all(&self.target(self.stream.handle, 0))
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        let _ = self.synchronize();
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
