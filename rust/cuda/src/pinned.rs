//! Pinned staging: page-locked host buffers (cached, not write-combined: readers write them and
//! the copy engine reads them), each with the event that marks its last copy done, and
//! [`GpuTarget`], the core ring's view of one upload's destination on a device.

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::upload::{on_reader_thread, DirectSpan, UploadTarget};
use safetensors_core::{Error, Result};

use crate::driver::{call, Current, Gpu};
use crate::memory::{EventPool, Stream};
use crate::pool::{self, Pinned};
use crate::register::Feeder;
use crate::trace::DeviceTrace;

impl Gpu {
    /// Seconds for one copy of `bytes` from pinned host memory to the device: the link's
    /// practical limit, for benchmarks.
    pub fn pinned_copy_seconds(self: &Arc<Self>, bytes: usize) -> Result<f64> {
        let dst = self.alloc(bytes)?;
        let _current = self.enter()?;
        let mut slot = PinnedSlot::new(self, bytes)?;
        slot.buffer().fill(1);
        let stream = Stream::new(self)?;
        let target = GpuTarget::new(self, stream.handle, dst.ptr);
        target.submit(&mut slot, bytes, 0)?; // warm-up
        target.wait(&mut slot)?;
        let start = std::time::Instant::now();
        target.submit(&mut slot, bytes, 0)?;
        target.wait(&mut slot)?;
        Ok(start.elapsed().as_secs_f64())
    }
}

/// What a slot's last copy is tracked by.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
    None,
    /// The slot's event, recorded after the copy.
    Event,
    /// The copy was enqueued but its event could not be recorded, and waiting for its stream
    /// failed too: when it is done cannot be known. The buffer is abandoned (leaked, never
    /// reused or freed) and the slot takes a fresh one before its next use. Never waited for
    /// through the stream (a caller's stream may be destroyed once the call that enqueued the
    /// copy has returned, and its handle must not be used after that), nor through
    /// `cuCtxSynchronize`, which waits for every stream of the context, the caller's too: a
    /// deadlock if one of them waits for work the caller enqueues only after we return.
    Lost,
    /// Copies on a stream this library created and still owns (the multi-rank stager's), waited
    /// for through that stream. Never a caller's stream (see `Lost`).
    OwnStream(sys::CUstream),
}

/// A pinned staging buffer and the event that marks its last copy done. Dropping it waits for
/// that copy and hands both to the device's idle list (`pool.rs`), for the next slot to reuse
/// without pinning anew; a buffer whose copy could not be waited for is leaked rather than
/// reused or freed under the copy engine.
pub struct PinnedSlot {
    /// `None` only once dropped.
    memory: Option<Pinned>,
    host: *mut u8,
    /// Bytes asked for: the buffer may be larger (an idle one reused), never used past this.
    pub(crate) len: usize,
    pub(crate) event: sys::CUevent,
    pub(crate) pending: Pending,
    ctx: sys::CUcontext,
    ordinal: usize,
}

// SAFETY: the pinned buffer and event are owned by the slot, which the ring hands to one thread
// at a time.
unsafe impl Send for PinnedSlot {}

impl PinnedSlot {
    pub(crate) fn new(gpu: &Gpu, len: usize) -> Result<PinnedSlot> {
        let memory = pool::take(gpu.ctx, gpu.ordinal(), len)?;
        Ok(PinnedSlot {
            host: memory.host,
            event: memory.event,
            memory: Some(memory),
            len,
            pending: Pending::None,
            ctx: gpu.ctx,
            ordinal: gpu.ordinal(),
        })
    }

    pub(crate) fn buffer(&mut self) -> &mut [u8] {
        // SAFETY: `host` points to `len` bytes owned by this slot.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }

    /// Blocks until the slot's last copy is done.
    pub(crate) fn wait(&mut self) -> Result<()> {
        match self.pending {
            Pending::None => {}
            // SAFETY: the event was recorded by `submit`.
            Pending::Event => call("cuEventSynchronize", || unsafe {
                cu::event::synchronize(self.event)
            })?,
            Pending::Lost => {
                let fresh = pool::take(self.ctx, self.ordinal, self.len)?;
                self.host = fresh.host;
                self.event = fresh.event;
                // The copy engine may still read the old buffer: never freed nor reused.
                std::mem::forget(self.memory.replace(fresh));
            }
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
        let Some(memory) = self.memory.take() else {
            return;
        };
        if self.pending == Pending::Lost {
            std::mem::forget(memory);
            return;
        }
        let waited = Current::enter(self.ctx).and_then(|_current| self.wait());
        if waited.is_err() {
            // The copy engine may still read the buffer: leak it rather than reuse or free it.
            std::mem::forget(memory);
            return;
        }
        pool::give_back(self.ordinal, memory);
    }
}

thread_local! {
    /// A reader thread's context before `enter_thread`, restored by `leave_thread`.
    static READER_CONTEXT: std::cell::RefCell<Option<Current>> =
        const { std::cell::RefCell::new(None) };
    /// On a ring's own reader thread: the context made current on it for good (0: none yet).
    static OWN_CONTEXT: Cell<usize> = const { Cell::new(0) };
}

/// A destination being allocated while the readers start: copies wait for its address.
pub(crate) struct PendingDst {
    /// `Some(Ok(address))` once allocated, `Some(Err(()))` when the allocation failed.
    state: Mutex<Option<std::result::Result<sys::CUdeviceptr, ()>>>,
    ready: Condvar,
}

impl PendingDst {
    pub(crate) fn new() -> PendingDst {
        PendingDst {
            state: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    pub(crate) fn set(&self, outcome: std::result::Result<sys::CUdeviceptr, ()>) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.ready.notify_all();
    }

    fn get(&self) -> Result<sys::CUdeviceptr> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match *st {
                Some(Ok(ptr)) => return Ok(ptr),
                Some(Err(())) => {
                    return Err(Error::Cuda {
                        message: "the upload stopped: its destination could not be allocated"
                            .into(),
                    })
                }
                None => st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

/// One upload's destination on a [`Gpu`]: the device pointer (or one being allocated) and the
/// stream its copies go on; for streaming uploads the pool its marks (events) come from; when
/// traced, the device's timeline; for zero-copy, the feeder.
pub(crate) struct GpuTarget<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) stream: sys::CUstream,
    pub(crate) dst: sys::CUdeviceptr,
    pub(crate) events: Option<&'a EventPool>,
    pub(crate) pending_dst: Option<&'a PendingDst>,
    pub(crate) trace: Option<&'a DeviceTrace>,
    /// The feeder and the ring's chunk size.
    pub(crate) feeder: Option<(&'a Feeder, usize)>,
}

impl<'a> GpuTarget<'a> {
    pub(crate) fn new(gpu: &'a Gpu, stream: sys::CUstream, dst: sys::CUdeviceptr) -> Self {
        GpuTarget {
            gpu,
            stream,
            dst,
            events: None,
            pending_dst: None,
            trace: None,
            feeder: None,
        }
    }

    /// The destination's address (waiting for it while it is being allocated).
    fn destination(&self) -> Result<sys::CUdeviceptr> {
        match self.pending_dst {
            Some(pending) => pending.get(),
            None => Ok(self.dst),
        }
    }
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
        let dst = self.destination()?;
        let src = &slot.buffer()[..len];
        // SAFETY: the slot stays untouched until `wait` sees its copy done; the destination
        // range lies inside the allocation the plan was sized for.
        let copy = || {
            call("cuMemcpyHtoDAsync", || unsafe {
                cu::memcpy_htod_async(dst + dst_offset, src, self.stream)
            })
        };
        match self.trace {
            Some(trace) => trace.around(dst_offset, len as u64, copy)?,
            None => copy()?,
        }
        // SAFETY: the event belongs to this slot, in this context.
        let recorded = call("cuEventRecord", || unsafe {
            cu::event::record(slot.event, self.stream)
        });
        match recorded {
            Ok(()) => slot.pending = Pending::Event,
            Err(e) => {
                // The copy is queued but untracked: wait for its stream now, while the handle is
                // certainly valid, before the slot can be refilled; if even that fails, track
                // the buffer as lost instead (see `Pending::Lost`).
                // SAFETY: the stream this call enqueued the copy on.
                let drained = call("cuStreamSynchronize", || unsafe {
                    cu::stream::synchronize(self.stream)
                });
                slot.pending = if drained.is_ok() {
                    Pending::None
                } else {
                    Pending::Lost
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
        if on_reader_thread() {
            // One of the ring's own threads, which serve this device only and live as long as
            // the ring: placed and given the context once, for good.
            let ctx = self.gpu.ctx as usize;
            if OWN_CONTEXT.with(Cell::get) == ctx {
                return Ok(());
            }
            if let Some(node) = self.gpu.numa_node() {
                crate::numa::run_on(node);
            }
            std::mem::forget(self.gpu.enter()?);
            OWN_CONTEXT.with(|c| c.set(ctx));
            return Ok(());
        }
        // Another thread (the caller's, lending itself): on the CPUs of the device's NUMA
        // node, its context restored after the run.
        if let Some(node) = self.gpu.numa_node() {
            crate::numa::run_on(node);
        }
        let current = self.gpu.enter()?;
        READER_CONTEXT.with(|c| *c.borrow_mut() = Some(current));
        Ok(())
    }

    fn leave_thread(&self) {
        if !on_reader_thread() {
            READER_CONTEXT.with(|c| drop(c.borrow_mut().take()));
        }
    }

    fn takes_direct(&self) -> bool {
        self.feeder.is_some_and(|(f, _)| f.is_on()) && self.events.is_some()
    }

    fn direct_chunks(&self) -> usize {
        self.feeder.map_or(1, |(f, chunk)| f.span_chunks(chunk))
    }

    fn copy_direct(&self, span: &DirectSpan<'_>) -> Result<bool> {
        let (Some((feeder, _)), Some(events)) = (self.feeder, self.events) else {
            return Ok(false);
        };
        let dst = self.destination()?;
        feeder.copy(span, dst, self.stream, events, self.trace)
    }

    fn finish_direct(&self) -> Result<()> {
        match (self.feeder, self.events) {
            (Some((feeder, _)), Some(events)) => feeder.finish(self.stream, events),
            _ => Ok(()),
        }
    }
}
