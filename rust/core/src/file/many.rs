//! Many reads of many files at once ([`read_many`]): a multi-rank load's steps, a plan's runs.

use std::sync::{Mutex, PoisonError};

use crate::error::Result;

use super::{parallel, Reader, SafeFile, Storage};

/// Several reads, each `(file, offset, dst)` as [`SafeFile::read_data`] of that file, made on
/// several threads at once: each read of a mapped, in-memory or held-open file is cut into
/// pieces of 1 MiB that the threads take in turn, so that many reads too small to be split on
/// their own (a multi-rank load's steps: one per tensor a rank takes rows of) share the cores as
/// one large read does. Reads of a remote file go to its source in one batch per file (fetched
/// concurrently there); reads of a file that opens a descriptor per read, or of the direct
/// backend, are made one by one (each splits a large read itself). Every range is checked
/// before anything is read; the first error met is returned, and what the buffers hold is then
/// unspecified. Reads of a remote file whose ranges overlap are refused (`InvalidSlice`, as its
/// batched read refuses them, before anything is fetched); the callers' steps never overlap.
pub fn read_many(reads: &mut [(&SafeFile, u64, &mut [u8])]) -> Result<()> {
    for (file, offset, dst) in reads.iter() {
        offset
            .checked_add(dst.len() as u64)
            .filter(|&end| end <= file.header.data_len() as u64)
            .ok_or_else(|| file.outside(*offset, dst.len()))?;
    }
    let in_pieces = |f: &SafeFile| {
        matches!(
            f.storage,
            Storage::Mapped(_) | Storage::Memory(_) | Storage::Reader(Reader::Held(_))
        )
    };
    // A remote file's reads, in one batch per file.
    let mut done = vec![false; reads.len()];
    for i in 0..reads.len() {
        if done[i] || !reads[i].0.reads_in_batches() {
            continue;
        }
        let file: &SafeFile = reads[i].0;
        let mut batch: Vec<(u64, &mut [u8])> = Vec::new();
        for (j, (f, offset, dst)) in reads.iter_mut().enumerate().skip(i) {
            if std::ptr::eq(*f, file) {
                done[j] = true;
                batch.push((*offset, &mut **dst));
            }
        }
        file.read_batch(&mut batch)?;
    }
    // Reads made one by one.
    for (i, (file, offset, dst)) in reads.iter_mut().enumerate() {
        if !done[i] && !in_pieces(file) {
            done[i] = true;
            file.read_data(*offset, dst)?;
        }
    }
    // The rest, in pieces on several threads.
    let total: usize = reads
        .iter()
        .zip(&done)
        .filter(|(_, &d)| !d)
        .map(|((_, _, dst), _)| dst.len())
        .sum();
    let threads = parallel::threads_for(total);
    if threads <= 1 {
        // One thread: each read whole, not in pieces (one system call, not one per MiB).
        return reads
            .iter_mut()
            .zip(&done)
            .filter(|(_, &d)| !d)
            .try_for_each(|((file, offset, dst), _)| file.read_data(*offset, dst));
    }
    let mut pieces: Vec<(&SafeFile, u64, Mutex<&mut [u8]>)> = Vec::new();
    crate::fallible::reserve(
        &mut pieces,
        total / parallel::MANY_PIECE + 2 * reads.len(),
        "a batch of reads",
    )?;
    for ((file, offset, dst), _) in reads.iter_mut().zip(&done).filter(|(_, &d)| !d) {
        let mut at = *offset;
        for piece in parallel::split(dst, parallel::MANY_PIECE) {
            let len = piece.len() as u64;
            pieces.push((*file, at, Mutex::new(piece)));
            at += len;
        }
    }
    parallel::on_tasks(pieces.len(), threads, |i| {
        let (file, offset, piece) = &pieces[i];
        let mut piece = piece.lock().unwrap_or_else(PoisonError::into_inner);
        file.read_data(*offset, &mut piece)
    })
}
