//! Pinned staging: page-locked host buffers (cached, not write-combined: readers write them and
//! the copy engine reads them), each with the event that marks its last copy done, and
//! [`GpuTarget`], the core ring's view of one upload's destination on a device.

use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::upload::UploadTarget;
use safetensors_core::Result;

use crate::driver::{call, Current, Gpu};
use crate::memory::{EventPool, Stream};
use crate::pool::{self, Pinned};

impl Gpu {
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
}

/// One upload's destination on a [`Gpu`]: the device pointer and the stream its copies go on,
/// and for streaming uploads the pool its marks (events) come from.
pub(crate) struct GpuTarget<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) stream: sys::CUstream,
    pub(crate) dst: sys::CUdeviceptr,
    pub(crate) events: Option<&'a EventPool>,
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
        let current = self.gpu.enter()?;
        READER_CONTEXT.with(|c| *c.borrow_mut() = Some(current));
        Ok(())
    }

    fn leave_thread(&self) {
        READER_CONTEXT.with(|c| drop(c.borrow_mut().take()));
    }
}
