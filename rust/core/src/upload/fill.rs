//! Filling staging memory: the destination bytes of a range (a stripe of a chunk) read from the
//! files where a piece covers them, zeros elsewhere (alignment padding); and, for zero-copy
//! targets, the same range described as runs of the files' bytes ([`DirectSpan`]).

use super::plan::Piece;
use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::slice::SlicePlan;

/// What a run's readers copy from and where to: the files, the plan's pieces (sorted by
/// destination) and its slice plans.
pub(super) struct Sources<'a> {
    pub(super) files: &'a [&'a SafeFile],
    pub(super) pieces: &'a [Piece],
    pub(super) slices: &'a [SlicePlan],
}

/// The next `[from, to)` of the destination bytes `rest` starts at `*at`: the gap before it
/// zeroed, `rest` and `*at` moved past it.
pub(crate) fn carve<'a>(
    from: u64,
    to: u64,
    rest: &mut &'a mut [u8],
    at: &mut u64,
) -> Result<&'a mut [u8]> {
    let (skip, len) = match (from.checked_sub(*at), to.checked_sub(from)) {
        (Some(skip), Some(len)) if skip + len <= rest.len() as u64 => (skip as usize, len as usize),
        _ => {
            return Err(Error::Internal {
                message: format!(
                    "a load's piece [{from}, {to}) is out of order in its chunk (at {at})"
                ),
            })
        }
    };
    let (gap, tail) = std::mem::take(rest).split_at_mut(skip);
    gap.fill(0);
    let (mine, tail) = tail.split_at_mut(len);
    *rest = tail;
    *at = to;
    Ok(mine)
}

/// [`fill`] for jobs with files that read in batches ([`SafeFile::reads_in_batches`]: remote
/// files read on demand): the chunk's reads of each such file are handed to it together (one
/// round of concurrent ranged GETs, runs closer than a part coalesced) rather than one round
/// trip per tensor or slice run. Reads of one file that overlap (a tensor requested twice) are
/// made one by one.
fn fill_in_batches(buf: &mut [u8], start: u64, len: usize, job: &Sources<'_>) -> Result<()> {
    let end = start + len as u64;
    let mut rest: &mut [u8] = &mut buf[..len];
    let mut at = start;
    // Each read as (file, source offset, its bytes of `buf`), carved in destination order.
    let mut reads: Vec<(usize, u64, &mut [u8])> = Vec::new();
    let pieces = job.pieces;
    let first = pieces.partition_point(|p| p.dst + p.len <= start);
    for p in pieces[first..].iter().take_while(|p| p.dst < end) {
        let lo = p.dst.max(start);
        let hi = (p.dst + p.len).min(end);
        match p.slice.and_then(|k| job.slices.get(k)) {
            None => {
                let dst = carve(lo, hi, &mut rest, &mut at)?;
                crate::fallible::push(
                    &mut reads,
                    (p.source, p.src + (lo - p.dst), dst),
                    "a chunk's reads",
                )?;
            }
            Some(plan) => {
                for (src, out, n) in
                    plan.runs_in_result((lo - p.dst) as usize, (hi - p.dst) as usize)
                {
                    let to = p.dst + out as u64;
                    let dst = carve(to, to + n as u64, &mut rest, &mut at)?;
                    crate::fallible::push(
                        &mut reads,
                        (p.source, p.src + src as u64, dst),
                        "a chunk's reads",
                    )?;
                }
            }
        }
    }
    rest.fill(0);
    read_grouped(job.files, &mut reads)
}

/// Makes `reads` (file number, source offset, destination bytes; destinations disjoint): each
/// file that reads in batches gets its reads in one [`SafeFile::read_batch`] (one by one when
/// two of them overlap in the file, as a tensor requested twice does); other files read them
/// one by one.
pub(crate) fn read_grouped(
    files: &[&SafeFile],
    reads: &mut [(usize, u64, &mut [u8])],
) -> Result<()> {
    let mut sources: Vec<usize> = reads.iter().map(|r| r.0).collect();
    sources.sort_unstable();
    sources.dedup();
    for source in sources {
        let file = files.get(source).ok_or_else(|| Error::Internal {
            message: format!("a load reads source {source} of {}", files.len()),
        })?;
        let mut runs: Vec<(u64, &mut [u8])> = Vec::new();
        for (s, src, dst) in reads.iter_mut() {
            if *s == source {
                crate::fallible::push(&mut runs, (*src, &mut **dst), "a load's reads")?;
            }
        }
        let mut spans: Vec<(u64, u64)> = runs
            .iter()
            .map(|(o, d)| (*o, *o + d.len() as u64))
            .collect();
        spans.sort_unstable();
        if file.reads_in_batches() && spans.windows(2).all(|w| w[0].1 <= w[1].0) {
            file.read_batch(&mut runs)?;
        } else {
            for (src, dst) in runs.iter_mut() {
                file.read_data(*src, dst)?;
            }
        }
    }
    Ok(())
}

/// Fills `buf[..len]` with destination bytes `[start, start + len)`: source bytes where a piece
/// covers them, zeros elsewhere.
pub(super) fn fill(buf: &mut [u8], start: u64, len: usize, job: &Sources<'_>) -> Result<()> {
    if job.files.iter().any(|f| f.reads_in_batches()) {
        return fill_in_batches(buf, start, len, job);
    }
    let end = start + len as u64;
    let buf = &mut buf[..len];
    let pieces = job.pieces;
    // First piece that ends after `start`.
    let first = pieces.partition_point(|p| p.dst + p.len <= start);
    let mut at = start;
    for p in pieces[first..].iter().take_while(|p| p.dst < end) {
        let lo = p.dst.max(start);
        let hi = (p.dst + p.len).min(end);
        if lo > at {
            buf[(at - start) as usize..(lo - start) as usize].fill(0);
        }
        let file = job.files[p.source];
        match p.slice.and_then(|k| job.slices.get(k)) {
            None => {
                let dst = &mut buf[(lo - start) as usize..(hi - start) as usize];
                file.read_data(p.src + (lo - p.dst), dst)?;
            }
            Some(plan) => {
                let range = plan.runs_in_result((lo - p.dst) as usize, (hi - p.dst) as usize);
                for (src, out, n) in range {
                    let to = (p.dst + out as u64 - start) as usize;
                    file.read_data(p.src + src as u64, &mut buf[to..to + n])?;
                }
            }
        }
        at = hi;
    }
    if at < end {
        buf[(at - start) as usize..].fill(0);
    }
    Ok(())
}

/// Destination bytes `[start, start + len)` as runs of the files' bytes, for a target that copies
/// them without staging (zero-copy); bytes no run covers are padding (zeros).
pub struct DirectSpan<'a> {
    /// The span's first destination byte.
    pub start: u64,
    /// Its bytes.
    pub len: u64,
    /// In destination order, disjoint, inside the span.
    pub runs: Vec<DirectRun<'a>>,
}

/// `len` bytes of `file`'s data buffer from `src`, for destination offset `dst`.
#[derive(Clone, Copy)]
pub struct DirectRun<'a> {
    /// The file read.
    pub file: &'a SafeFile,
    /// Offset in the file's data buffer.
    pub src: u64,
    /// Offset in the destination.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

/// The span `[start, start + len)` of `job` as runs, or `None` when a piece in it is a slice (its
/// many small runs are better staged) or its file reads in batches (remote).
pub(super) fn direct_span<'a>(job: &Sources<'a>, start: u64, len: u64) -> Option<DirectSpan<'a>> {
    let end = start + len;
    let pieces: &[Piece] = job.pieces;
    let first = pieces.partition_point(|p| p.dst + p.len <= start);
    let mut runs = Vec::new();
    for p in pieces[first..].iter().take_while(|p| p.dst < end) {
        let file: &'a SafeFile = job.files[p.source];
        if p.slice.is_some() || file.reads_in_batches() {
            return None;
        }
        let lo = p.dst.max(start);
        let hi = (p.dst + p.len).min(end);
        runs.push(DirectRun {
            file,
            src: p.src + (lo - p.dst),
            dst: lo,
            len: hi - lo,
        });
    }
    Some(DirectSpan { start, len, runs })
}
