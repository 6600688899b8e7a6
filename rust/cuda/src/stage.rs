//! The device half of a multi-rank load (`LoadPlan` in the C++ API): one destination allocation
//! that a rank's tensors land in, two pinned staging buffers that its reads (and host
//! broadcasts) fill in turn, a device scratch buffer that device broadcasts (NCCL) carry shared
//! reads in, and one non-blocking stream that every copy is ordered on. Copies from the host
//! come only from the pinned buffers (an asynchronous copy from pageable memory would be
//! synchronous and staged by the driver), and a buffer is refilled only once the copies out of
//! it are done. With two, the read of one turn runs while the copies of the turn before it do
//! (one buffer serialised them: on a 16-core host with an H200, two ranks on one GPU loaded a
//! 4.7 GB file in 464 ms with one buffer and 165 ms with two and parallel reads, one rank's
//! uploader in 103-142 ms).

use std::sync::Arc;

use cudarc::driver::result as cu;
use safetensors_core::{Error, Result};

use crate::driver::{call, Gpu};
use crate::memory::{DeviceBuffer, Stream};
use crate::pinned::{Pending, PinnedSlot};

/// Stages one rank's share of a multi-rank load onto a device (see the module comment).
/// Dropping it waits for its copies, then frees what it still owns (the destination too, unless
/// [`Stager::finish`] handed it over).
pub struct Stager {
    // Dropped in this order, after `Drop::drop` has waited for the stream: the pinned buffers,
    // the device buffers, then the stream.
    slots: [Option<PinnedSlot>; 2],
    /// The buffer `host` last handed out: the one copies come from.
    current: usize,
    /// How many bytes `host` last handed out: copies come from those only, not from what an
    /// earlier, longer turn left in the rest of a buffer.
    staged: usize,
    scratch: Option<DeviceBuffer>,
    dst: Option<DeviceBuffer>,
    stream: Stream,
    gpu: Arc<Gpu>,
}

fn out_of_range(what: &str, offset: usize, len: usize, size: usize) -> Error {
    Error::Cuda {
        message: format!(
            "a staged copy of {len} bytes at offset {offset} would pass the end of the {what} \
             ({size} bytes): the load plan and the staging disagree"
        ),
    }
}

/// `offset + len <= size`, without overflow.
fn check_range(what: &str, offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range(what, offset, len, size)),
    }
}

impl Stager {
    /// A stager for device `ordinal` with a destination of `total` bytes (allocated now).
    pub fn new(ordinal: usize, total: usize) -> Result<Stager> {
        let gpu = Gpu::open(ordinal)?;
        let stream = Stream::new(&gpu)?;
        let dst = gpu.alloc(total)?;
        Ok(Stager {
            slots: [None, None],
            current: 1,
            staged: 0,
            scratch: None,
            dst: Some(dst),
            stream,
            gpu,
        })
    }

    /// The destination's device address (0 once handed over).
    pub fn destination(&self) -> u64 {
        self.dst.as_ref().map_or(0, |d| d.ptr())
    }

    fn destination_len(&self) -> usize {
        self.dst.as_ref().map_or(0, |d| d.len())
    }

    /// The stream every copy is ordered on, for the collective's device calls.
    pub fn stream(&self) -> u64 {
        self.stream.handle as u64
    }

    /// The next pinned staging buffer (the two take turns), at least `len` bytes, once every
    /// copy out of it is done (and only those: the copies out of the other buffer, and device
    /// work queued after them on the stream, may still run).
    pub fn host(&mut self, len: usize) -> Result<&mut [u8]> {
        let _current = self.gpu.enter()?;
        let next = 1 - self.current;
        let slot = &mut self.slots[next];
        let grow = slot.as_ref().is_none_or(|s| s.len < len);
        if let Some(slot) = slot.as_mut() {
            slot.wait()?;
        }
        if grow {
            // The old buffer has no copy pending (waited for above), so dropping it frees it.
            *slot = None;
            // At least one byte: a zero-byte pinned allocation is an error to the driver.
            *slot = Some(PinnedSlot::new(&self.gpu, len.max(1))?);
        }
        self.current = next;
        self.staged = len;
        let slot = slot.as_mut().expect("made above");
        Ok(&mut slot.buffer()[..len])
    }

    /// Enqueues a copy of `len` staged bytes from `src_offset` of the pinned buffer to
    /// `dst_offset` of the destination.
    pub fn host_to_destination(
        &mut self,
        src_offset: usize,
        len: usize,
        dst_offset: usize,
    ) -> Result<()> {
        check_range("destination", dst_offset, len, self.destination_len())?;
        let dst = self.destination() + dst_offset as u64;
        self.copy_from_host(src_offset, len, dst)
    }

    /// A device scratch buffer of at least `len` bytes (for a device broadcast), returned by
    /// address; its earlier contents are not kept.
    pub fn scratch(&mut self, len: usize) -> Result<u64> {
        if self.scratch.as_ref().is_none_or(|s| s.len() < len) {
            let _current = self.gpu.enter()?;
            // Broadcasts and copies still queued may use the old buffer.
            self.stream.synchronize()?;
            self.scratch = None;
            self.scratch = Some(self.gpu.alloc(len)?);
        }
        Ok(self.scratch.as_ref().expect("made above").ptr())
    }

    fn scratch_len(&self) -> usize {
        self.scratch.as_ref().map_or(0, |s| s.len())
    }

    /// Enqueues a copy of the first `len` staged bytes into the scratch buffer.
    pub fn host_to_scratch(&mut self, len: usize) -> Result<()> {
        check_range("scratch buffer", 0, len, self.scratch_len())?;
        let dst = self.scratch.as_ref().map_or(0, |s| s.ptr());
        self.copy_from_host(0, len, dst)
    }

    /// Enqueues a device copy of `len` bytes from `src_offset` of the scratch buffer to
    /// `dst_offset` of the destination.
    pub fn scratch_to_destination(
        &mut self,
        src_offset: usize,
        len: usize,
        dst_offset: usize,
    ) -> Result<()> {
        check_range("scratch buffer", src_offset, len, self.scratch_len())?;
        check_range("destination", dst_offset, len, self.destination_len())?;
        if len == 0 {
            return Ok(());
        }
        let src = self.scratch.as_ref().map_or(0, |s| s.ptr()) + src_offset as u64;
        let dst = self.destination() + dst_offset as u64;
        let _current = self.gpu.enter()?;
        // SAFETY: both ranges lie inside allocations this stager owns (checked above), which
        // are freed only after the stream is synchronised.
        call("cuMemcpyDtoDAsync", || unsafe {
            cu::memcpy_dtod_async(dst, src, len, self.stream.handle)
        })
    }

    fn copy_from_host(&mut self, src_offset: usize, len: usize, dst: u64) -> Result<()> {
        let stream = self.stream.handle;
        let Some(slot) = self.slots[self.current].as_mut() else {
            return Err(out_of_range("staging buffer", src_offset, len, 0));
        };
        check_range("staging buffer", src_offset, len, self.staged.min(slot.len))?;
        if len == 0 {
            return Ok(());
        }
        let _current = self.gpu.enter()?;
        let src = &slot.buffer()[src_offset..src_offset + len];
        // SAFETY: the source is pinned memory this stager owns, left untouched until `host`
        // or drop has waited for its copies (`pending` below); the destination range was
        // checked by the caller.
        let queued = call("cuMemcpyHtoDAsync", || unsafe {
            cu::memcpy_htod_async(dst, src, stream)
        });
        // Marked even on failure: a copy the driver may have queued must be waited for.
        slot.pending = Pending::OwnStream(stream);
        queued?;
        // The slot's event, recorded after this copy (so after every earlier one: they share
        // the stream), lets a refill wait for the copies out of the buffer only, not for the
        // broadcasts and device copies queued behind them. Unrecorded, the stream is waited for.
        // SAFETY: the slot's event, in this context; our own stream.
        if call("cuEventRecord", || unsafe {
            cu::event::record(slot.event, stream)
        })
        .is_ok()
        {
            slot.pending = Pending::Event;
        }
        Ok(())
    }

    /// Waits for every copy, then hands the destination to the caller (who frees it with
    /// `cuMemFree`); returns its address.
    pub fn finish(&mut self) -> Result<u64> {
        let _current = self.gpu.enter()?;
        self.stream.synchronize()?;
        for slot in self.slots.iter_mut().flatten() {
            slot.pending = Pending::None;
        }
        Ok(self.dst.take().map_or(0, |d| d.release()))
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        if let Ok(_current) = self.gpu.enter() {
            if self.stream.synchronize().is_err() {
                // Copies may still be running into the device buffers: leak them rather than
                // free them under the copy engine (the pinned buffer leaks itself likewise).
                if let Some(d) = self.dst.take() {
                    let _ = d.release();
                }
                if let Some(s) = self.scratch.take() {
                    let _ = s.release();
                }
            }
        }
    }
}
