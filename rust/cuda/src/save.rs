//! Saving tensors that live in device memory: each tensor is copied off the device in pieces of
//! at most one staging slot into a small ring of pinned slots, with asynchronous copies on a
//! stream of the library's own, and each piece is handed to the caller's writer (a positioned
//! write into the file) once its copy has completed, while the next copies run.
//!
//! Memory: the ring, `slots` × `slot_bytes` of pinned host memory (smaller when the tensors are),
//! whatever the tensors' size; nothing else. The caller's tensors must be complete before the
//! call (synchronise the stream that produced them): the copies run on a stream of ours, which
//! does not wait for the caller's.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::result as cu;
use safetensors_core::{Error, Result};

use crate::driver::{call, Gpu};
use crate::memory::Stream;
use crate::pinned::{Pending, PinnedSlot};

/// One tensor to save: its name (for messages), its device address and its bytes.
pub struct DeviceSource<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Its device address.
    pub ptr: u64,
    /// Its bytes.
    pub len: u64,
}

/// A piece copied into a slot, waiting to be written.
struct InFlight {
    slot: usize,
    tensor: usize,
    offset: u64,
    len: usize,
}

/// Copies every tensor of `sources` off `gpu` and hands it to `write(tensor, offset, bytes)`
/// (tensor: its position in `sources`), piece by piece, in order, through `slots` pinned slots
/// of at most `slot_bytes` each. Every source is checked first to be device memory of `gpu`
/// holding its bytes (`Cuda`). An error of `write` or of the device stops the save and is
/// returned once every copy in flight has completed; the slots are freed before returning.
pub fn save_from_device(
    gpu: &Arc<Gpu>,
    sources: &[DeviceSource<'_>],
    slots: usize,
    slot_bytes: usize,
    mut write: impl FnMut(usize, u64, &[u8]) -> Result<()>,
) -> Result<()> {
    if slots == 0 || slot_bytes == 0 {
        return Err(Error::Cuda {
            message: format!(
                "a save needs at least one staging slot of at least one byte ({slots} slots of \
                 {slot_bytes} bytes asked for)"
            ),
        });
    }
    let _current = gpu.enter()?;
    for s in sources.iter().filter(|s| s.len > 0) {
        let len = usize::try_from(s.len).map_err(|_| Error::Cuda {
            message: format!(
                "tensor `{}` has {} bytes, more than this host can address",
                s.name, s.len
            ),
        })?;
        gpu.check_source(s.name, s.ptr, len)?;
    }
    // Slots no larger than the largest tensor needs.
    let largest = sources.iter().map(|s| s.len).max().unwrap_or(0);
    let slot_len = slot_bytes
        .min(usize::try_from(largest).unwrap_or(usize::MAX))
        .max(1);
    let stream = Stream::new(gpu)?;
    let mut ring: Vec<PinnedSlot> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut queue: VecDeque<InFlight> = VecDeque::new();
    let result = (|| -> Result<()> {
        for (tensor, source) in sources.iter().enumerate() {
            let mut offset = 0u64;
            while offset < source.len {
                let len = (source.len - offset).min(slot_len as u64) as usize;
                let slot = match free.pop() {
                    Some(slot) => slot,
                    None if ring.len() < slots => {
                        ring.push(PinnedSlot::new(gpu, slot_len)?);
                        ring.len() - 1
                    }
                    None => {
                        // Every slot is in flight: write the oldest piece out, then reuse it.
                        let done = queue.pop_front().ok_or_else(|| Error::Internal {
                            message: "a save's staging ring is full with nothing in flight".into(),
                        })?;
                        land(&mut ring[done.slot], &done, &mut write)?;
                        done.slot
                    }
                };
                enqueue(&mut ring[slot], &stream, source.ptr + offset, len)?;
                queue.push_back(InFlight {
                    slot,
                    tensor,
                    offset,
                    len,
                });
                offset += len as u64;
            }
        }
        while let Some(done) = queue.pop_front() {
            land(&mut ring[done.slot], &done, &mut write)?;
        }
        Ok(())
    })();
    // On an error, the slots wait for their copies as they drop, then the stream goes.
    drop(ring);
    drop(stream);
    result
}

/// Enqueues the copy of `len` bytes at device address `src` into `slot`, and its event.
fn enqueue(slot: &mut PinnedSlot, stream: &Stream, src: u64, len: usize) -> Result<()> {
    let dst = &mut slot.buffer()[..len];
    // SAFETY: `src` holds the bytes (checked above); the slot is not touched again before its
    // event says the copy is done.
    call("cuMemcpyDtoHAsync", || unsafe {
        cu::memcpy_dtoh_async(dst, src, stream.handle)
    })?;
    // SAFETY: the slot's own event, on our stream, in the current context.
    match call("cuEventRecord", || unsafe {
        cu::event::record(slot.event, stream.handle)
    }) {
        Ok(()) => {
            slot.pending = Pending::Event;
            Ok(())
        }
        Err(e) => {
            // The copy is queued but untracked: wait for our stream before the slot is reused.
            slot.pending = match stream.synchronize() {
                Ok(()) => Pending::None,
                Err(_) => Pending::OwnStream(stream.handle),
            };
            Err(e)
        }
    }
}

/// Waits for `piece`'s copy into `slot` and writes it out.
fn land(
    slot: &mut PinnedSlot,
    piece: &InFlight,
    write: &mut impl FnMut(usize, u64, &[u8]) -> Result<()>,
) -> Result<()> {
    slot.wait()?;
    write(piece.tensor, piece.offset, &slot.buffer()[..piece.len])
}
