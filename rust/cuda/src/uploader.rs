//! [`Uploader`]: the core's staged pipeline ([`Ring`]) on one device, with pinned staging slots,
//! a stream of its own, and the events streaming uploads use. Streaming uploads are in
//! `landing.rs`; checks of a caller's destination and stream are the device's (`driver.rs`).

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use safetensors_core::upload::{Ring, RingOptions, UploadPlan, UploadStats};
use safetensors_core::{Error, Result, SafeFile};

use crate::driver::Gpu;
use crate::memory::{DeviceBuffer, EventPool, Stream};
use crate::pinned::{GpuTarget, PinnedSlot};

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
    pub(crate) ring: Ring<PinnedSlot>,
    pub(crate) stream: Stream,
    pub(crate) events: EventPool,
    pub(crate) gpu: Arc<Gpu>,
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
        let events = EventPool::new(gpu.ctx);
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
        let events = EventPool::new(gpu.ctx);
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

    pub(crate) fn target(&self, stream: sys::CUstream, dst: sys::CUdeviceptr) -> GpuTarget<'_> {
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
    pub(crate) fn check_into(
        &self,
        plan: &UploadPlan,
        dst: u64,
        capacity: usize,
        stream: u64,
    ) -> Result<()> {
        if (capacity as u64) < plan.total() {
            return Err(Error::Cuda {
                message: format!(
                    "the destination holds {capacity} bytes; the upload needs {}",
                    plan.total()
                ),
            });
        }
        if !dst.is_multiple_of(plan.alignment()) {
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
