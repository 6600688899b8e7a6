//! The stream's reader thread: every item in file order once it fits the budget, read whole,
//! in pieces that a cancellation can stop between, straight into aligned buffers with the
//! direct backend, or together in one batch from a file whose every read is a round trip.

use std::sync::Arc;

use crate::direct::{AlignedBuf, DIRECT_ALIGN};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::file::SafeFile;
use crate::file::{zeroed, Backend};
use crate::request::Item;

use super::{Buffer, Finish, Shared, StreamTensor};

/// The reader thread: each item in order, once it fits the budget. From a file whose every read
/// is a round trip ([`SafeFile::reads_in_batches`]: a remote one read on demand), the whole
/// tensors that follow one another in it are read together, as many as fit the budget at once
/// and [`BATCH`], so that they are fetched concurrently rather than one round trip each.
pub(super) fn read_all(shared: &Arc<Shared>, items: &[Item]) {
    let _finish = Finish(shared.clone());
    let mut i = 0;
    while i < items.len() {
        let item = &items[i];
        if !shared.acquire(i, item.len) {
            return;
        }
        let t = StreamTensor::unread(item, shared);
        let end = batch_end(shared, items, i);
        let reads: Vec<Result<StreamTensor>> = if end == i + 1 {
            vec![read_item(item, t, &|| shared.cancelled())]
        } else {
            read_together(shared, &items[i..end], t)
        };
        i = end;
        for read in reads {
            let failed = read.is_err();
            if let Some(unwanted) = shared.deliver(read) {
                drop(unwanted);
                return;
            }
            if failed {
                return;
            }
        }
    }
}

/// Most bytes of whole tensors read together from a file that reads in batches: enough parts
/// to keep a remote source's GETs in flight, and at most half the budget, so that the next
/// batch is fetched while the caller works on this one.
const BATCH: u64 = 4 * PIECE as u64;

/// The end of the batch starting with item `i` (whose budget is held): the whole tensors after
/// it in the same file, each starting past the end of the one before (repeats are read on their
/// own), while they fit [`BATCH`] (and half the budget) and the budget now; their budget is
/// taken here.
fn batch_end(shared: &Shared, items: &[Item], i: usize) -> usize {
    let first = &items[i];
    let cap = BATCH.min(shared.bound / 2);
    if !first.source.reads_in_batches() || first.slice.is_some() || first.len >= cap {
        return i + 1;
    }
    let mut total = first.len;
    let mut end = i + 1;
    let mut last = first.begin + first.len;
    while let Some(next) = items.get(end) {
        if next.slice.is_some()
            || !Arc::ptr_eq(&next.source, &first.source)
            || next.begin < last
            || total + next.len > cap
            || !shared.try_acquire(next.len)
        {
            break;
        }
        total += next.len;
        last = next.begin + next.len;
        end += 1;
    }
    end
}

/// Reads `batch` (whole tensors of one file, ascending, budget held) with one
/// [`SafeFile::read_batch`]; `first` is the first one's tensor. Either every one is read, or the
/// first error is returned alone (the others' budget returned as they drop).
fn read_together(
    shared: &Arc<Shared>,
    batch: &[Item],
    first: StreamTensor,
) -> Vec<Result<StreamTensor>> {
    let mut tensors = vec![first];
    for item in &batch[1..] {
        tensors.push(StreamTensor::unread(item, shared));
    }
    let mut buffers = Vec::with_capacity(batch.len());
    for item in batch {
        match zeroed(item.len as usize) {
            Ok(b) => buffers.push(b),
            Err(_) => return vec![Err(out_of_memory(item))],
        }
    }
    let mut runs: Vec<(u64, &mut [u8])> = batch
        .iter()
        .zip(buffers.iter_mut())
        .map(|(item, b)| (item.begin, b.as_mut_slice()))
        .collect();
    if let Err(e) = batch[0].source.read_batch(&mut runs) {
        return vec![Err(e)];
    }
    drop(runs);
    for (t, b) in tensors.iter_mut().zip(buffers) {
        t.data = Buffer::Plain(b);
    }
    tensors.into_iter().map(Ok).collect()
}

/// Whole tensors are read in pieces of this many bytes (a multiple of [`DIRECT_ALIGN`]), with a
/// look at cancellation between pieces, so that dropping a stream during a huge tensor returns
/// after at most one piece.
const PIECE: usize = 64 << 20;

/// Fills `t` with `item`'s bytes; on failure its budget is returned when `t` drops. Stops early
/// (an error nobody receives) once `cancelled()`.
fn read_item(
    item: &Item,
    mut t: StreamTensor,
    cancelled: &dyn Fn() -> bool,
) -> Result<StreamTensor> {
    let file = &item.source;
    let len = usize::try_from(item.len).map_err(|_| out_of_memory(item))?;
    let stop = || Error::Internal {
        message: format!("the stream was dropped while `{}` was read", item.name),
    };
    if item.slice.is_none() && file.backend() == Backend::Direct && len >= DIRECT_ALIGN {
        let mut buf =
            AlignedBuf::new(file.aligned_len(item.begin, len)?).map_err(|_| out_of_memory(item))?;
        // Where the tensor starts in its first block (aligned_len above checked this sum).
        let head =
            ((file.header().data_start() as u64 + item.begin) % DIRECT_ALIGN as u64) as usize;
        // Piece k fills buf[k * PIECE..] (an aligned place, whose file position is aligned too),
        // so each piece's aligned span starts exactly there and the pieces tile the whole span.
        let mut at = 0usize;
        while at < len {
            if cancelled() {
                return Err(stop());
            }
            let place = (head + at) / PIECE * PIECE;
            let n = (place + PIECE).min(head + len) - (head + at);
            let got = file.read_data_aligned(
                item.begin + at as u64,
                n,
                &mut buf.as_mut_slice()[place..],
            )?;
            if place + got != head + at {
                return Err(Error::Internal {
                    message: format!("a piece of `{}` landed out of place", item.name),
                });
            }
            at += n;
        }
        t.data = Buffer::Aligned { buf, head, len };
        return Ok(t);
    }
    let mut data = zeroed(len).map_err(|_| out_of_memory(item))?;
    match &item.slice {
        None => {
            // A file that reads in batches fetches each read concurrently in parts: larger
            // pieces keep more of them in flight (a look at cancellation still between pieces).
            let piece_len = if file.reads_in_batches() {
                4 * PIECE
            } else {
                PIECE
            };
            for (k, piece) in data.chunks_mut(piece_len).enumerate() {
                if cancelled() {
                    return Err(stop());
                }
                file.read_data(item.begin + (k * piece_len) as u64, piece)?;
            }
        }
        Some(plan) => {
            let info = file
                .header()
                .at(item.position)
                .ok_or_else(|| Error::Internal {
                    message: format!("tensor `{}` has no entry at its position", item.name),
                })?;
            file.read_slice_of(&info, plan, &mut data)?;
        }
    }
    t.data = Buffer::Plain(data);
    Ok(t)
}

fn out_of_memory(item: &Item) -> Error {
    Error::io(
        item.source.path(),
        "allocate a stream buffer",
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("{} bytes for tensor `{}`", item.len, item.name),
        ),
    )
}
