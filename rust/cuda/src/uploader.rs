//! [`Uploader`]: the core's staged pipeline ([`Ring`]) on one device, with pinned staging slots,
//! a stream of its own, and the events streaming uploads use. Streaming uploads are in
//! `landing.rs`; checks of a caller's destination and stream are the device's (`driver.rs`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::sys;
use safetensors_core::upload::{Ring, RingOptions, Timeline, UploadPlan, UploadStats};
use safetensors_core::{Error, Result, SafeFile};

use crate::driver::Gpu;
use crate::memory::{DeviceBuffer, EventPool, Stream};
use crate::pinned::{GpuTarget, PendingDst, PinnedSlot};
use crate::register::{FeedStats, Feeder, ZeroCopy};
use crate::trace::DeviceTrace;

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
    // pinned memory and event) and reader threads, then the stream, the streaming uploads'
    // events, then the device handle. The context itself is never released.
    pub(crate) ring: Ring<PinnedSlot>,
    pub(crate) stream: Stream,
    pub(crate) events: EventPool,
    /// Zero-copy spans, when on ([`ZeroCopy`]) and the device can.
    feeder: Option<Feeder>,
    /// The last traced upload's timeline, with the device's copy times, and the file each is
    /// appended to.
    trace: Mutex<Option<Timeline>>,
    trace_file: Option<std::path::PathBuf>,
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
            let target = GpuTarget::new(&gpu, stream.handle, 0);
            // On error the slots made so far drop, freeing themselves.
            Ring::new(&target, options)?
        };
        Ok(Uploader::assemble(ring, stream, gpu))
    }

    fn assemble(ring: Ring<PinnedSlot>, stream: Stream, gpu: Arc<Gpu>) -> Uploader {
        Uploader {
            ring,
            stream,
            events: EventPool::new(gpu.ctx),
            feeder: Feeder::new(&gpu, ZeroCopy::from_env()),
            trace: Mutex::new(None),
            trace_file: crate::trace::trace_file(),
            gpu,
        }
    }

    /// The uploader with zero-copy set as `zero_copy` says (instead of the environment's
    /// `SAFETENSORS_ZERO_COPY`); on where the device can register read-only host memory.
    pub fn with_zero_copy(mut self, zero_copy: ZeroCopy) -> Uploader {
        self.feeder = Feeder::new(&self.gpu, zero_copy);
        self
    }

    /// Whether whole uploads copy spans of mapped files straight from the page cache (on, and
    /// the device can, and no registration failed in a way that will repeat).
    pub fn zero_copy(&self) -> bool {
        self.feeder.as_ref().is_some_and(Feeder::is_on)
    }

    /// What the zero-copy feeder did so far (zeros when it is off).
    pub fn zero_copy_stats(&self) -> FeedStats {
        self.feeder.as_ref().map(Feeder::stats).unwrap_or_default()
    }

    /// The zero-copy settings in use, when on.
    pub fn zero_copy_config(&self) -> Option<ZeroCopy> {
        self.feeder.as_ref().map(Feeder::config)
    }

    /// The last traced upload's timeline (uploads are traced with `SAFETENSORS_UPLOAD_TRACE`
    /// set when the uploader was made), taken.
    pub fn take_trace(&self) -> Option<Timeline> {
        self.trace.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Reader threads started so far: they live as long as the uploader.
    pub fn reader_threads(&self) -> usize {
        self.ring.reader_threads()
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
        let u = Arc::new(Uploader::assemble(ring, stream, gpu));
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
        GpuTarget::new(&self.gpu, stream, dst)
    }

    /// Uploads `plan` into a new allocation; the data is on the device when this returns. The
    /// allocation is made while the readers fill the first stripes (their copies wait for its
    /// address), and with zero-copy on, spans of mapped files are copied straight from their
    /// pages.
    pub fn upload(&self, files: &[&SafeFile], plan: &UploadPlan) -> Result<DeviceBuffer> {
        self.not_from_own_callback()?;
        let _current = self.gpu.enter()?;
        let tracing = self.ring.pipeline().trace;
        let device_trace = if tracing {
            Some(DeviceTrace::start(self.stream.handle)?)
        } else {
            None
        };
        let pending = PendingDst::new();
        let target = GpuTarget {
            events: Some(&self.events),
            pending_dst: Some(&pending),
            trace: device_trace.as_ref(),
            feeder: self.feeder.as_ref().map(|f| (f, self.ring.slot_bytes())),
            ..self.target(self.stream.handle, 0)
        };
        let mut buffer: Option<DeviceBuffer> = None;
        let mut alloc_span = None;
        let result = self.ring.upload_while(&target, files, plan, &mut || {
            let began = Instant::now();
            let made = self.gpu.alloc(plan.total() as usize);
            alloc_span = Some((began, Instant::now()));
            match made {
                Ok(b) => {
                    pending.set(Ok(b.ptr));
                    buffer = Some(b);
                    Ok(())
                }
                Err(e) => {
                    pending.set(Err(()));
                    Err(e)
                }
            }
        });
        if tracing {
            self.keep_trace(device_trace, alloc_span);
        }
        match (result, buffer) {
            (Ok(_), Some(buffer)) => Ok(buffer),
            (Ok(_), None) => Err(Error::Internal {
                message: "an upload finished without its destination".into(),
            }),
            (Err(e), buffer) => {
                // Free the allocation only once nothing can still be copying into it.
                if let Some(buffer) = buffer {
                    if self.stream.synchronize().is_err() {
                        let _ = buffer.release();
                    }
                }
                Err(e)
            }
        }
    }

    /// The ring's timeline of the upload just made, with the device's copy times and the
    /// allocation's span: kept for [`Uploader::take_trace`] and appended to the trace file.
    fn keep_trace(&self, device: Option<DeviceTrace>, alloc: Option<(Instant, Instant)>) {
        let Some(mut timeline) = self.ring.take_trace() else {
            return;
        };
        if let Some(device) = device {
            // After the upload every copy is complete; a failed read of the times leaves them out.
            let _ = device.finish(&mut timeline);
        }
        if let (Some(origin), Some((a, b))) = (timeline.origin, alloc) {
            let ns = |t: Instant| t.saturating_duration_since(origin).as_nanos() as u64;
            timeline.alloc = Some((ns(a), ns(b)));
        }
        if let Some(path) = &self.trace_file {
            crate::trace::append(path, &timeline);
        }
        *self.trace.lock().unwrap_or_else(|p| p.into_inner()) = Some(timeline);
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
