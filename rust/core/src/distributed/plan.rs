//! The distributed load plan: given what every rank needs, which rank reads which bytes, so that
//! every needed byte is read exactly once across the world and ranges several ranks need are read
//! once and then broadcast.
//!
//! Every rank builds the same plan from the same inputs (it is deterministic), so the ranks agree
//! on the order of the collective calls without talking to each other first.
//!
//! How: the runs every rank needs of a file are swept in offset order (generated lazily from each
//! selection's slice plan, never listed) and cut at every run boundary into segments, each needed
//! by a set of ranks. Segments are merged as they are produced: neighbours needed by the same
//! ranks less than [`MERGE_GAP`](super::MERGE_GAP) apart, together with the bytes between them; and a segment
//! shorter than [`SMALL_SEGMENT`](super::SMALL_SEGMENT) with a neighbour as close, whose ranks then all receive both. A
//! segment one rank needs is read by that rank (shards stay local); a shared one is read by the
//! needing rank with the fewest bytes assigned so far, largest segments first, which balances the
//! reads by bytes. Steps longer than `max_step` are cut so that a rank never stages more than
//! that.
//!
//! Memory is in proportion to the merged ranges, not to the runs: a step-2 selection of a
//! 16 MiB tensor is one step, however many one-byte runs it has. What a rank copies out of a step
//! is found again from the slice plans when it copies ([`LoadPlan::scatter`]), not stored.

use crate::error::Result;
use crate::fallible;
use crate::slice::Placed;

use super::need::{invalid, Need, Part, Piece, Step};
use super::segments::{assign, segments};

/// The whole plan: the same steps for every rank, and what each rank asked for.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    steps: Vec<Step>,
    needs: Vec<Vec<Need>>,
    result_lens: Vec<Vec<u64>>,
    naive: u64,
}

impl LoadPlan {
    /// Plans `needs[rank]` for every rank of a world of `needs.len()`. `max_step` (at least 1)
    /// bounds a step's length. Memory that cannot be had (a tiny `max_step` over a large
    /// selection asks for one step record per `max_step` bytes) is an `Io` error.
    pub fn new(needs: Vec<Vec<Need>>, max_step: u64) -> Result<LoadPlan> {
        if needs.is_empty() {
            return Err(invalid(
                "a load plan needs a world of at least one rank".into(),
            ));
        }
        let max_step = max_step.max(1);
        let segments = segments(&needs)?;
        let steps = assign(segments, needs.len(), max_step)?;
        let mut result_lens = fallible::with_capacity(needs.len(), "a load plan's results")?;
        for rank_needs in &needs {
            let mut lens = fallible::with_capacity(rank_needs.len(), "a load plan's results")?;
            lens.extend(rank_needs.iter().map(Need::len));
            result_lens.push(lens);
        }
        let mut naive = 0u64;
        for rank_needs in &needs {
            naive = naive.saturating_add(naive_for(rank_needs)?);
        }
        Ok(LoadPlan {
            steps,
            needs,
            result_lens,
            naive,
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.needs.len()
    }

    /// What `rank` asked for, in request order (empty for a rank outside the world).
    pub fn needs(&self, rank: usize) -> &[Need] {
        self.needs.get(rank).map_or(&[], Vec::as_slice)
    }

    /// The steps, in the order every rank runs them.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The requests of `rank` that may have bytes in each step, ordered by step, then request
    /// (empty for a rank outside the world). One entry per step a request spans that `rank`
    /// needs: proportional to the steps and requests, not to the runs.
    pub fn parts(&self, rank: usize) -> Result<Vec<Part>> {
        let what = "a rank's share of a load plan";
        let mut out = Vec::new();
        for (request, need) in self.needs.get(rank).into_iter().flatten().enumerate() {
            let Some((lo, hi)) = need.extent() else {
                continue;
            };
            let lo = need.begin.saturating_add(lo);
            let hi = need.begin.saturating_add(hi);
            let first = self
                .steps
                .partition_point(|s| (s.file, s.offset + s.len) <= (need.file, lo));
            for (i, s) in self.steps.iter().enumerate().skip(first) {
                if s.file != need.file || s.offset >= hi {
                    break;
                }
                if s.needed_by.binary_search(&rank).is_ok() {
                    fallible::push(&mut out, Part { step: i, request }, what)?;
                }
            }
        }
        out.sort_unstable_by_key(|p| (p.step, p.request));
        Ok(out)
    }

    /// What request `request` of `rank` copies out of step `step`, from piece position `from`
    /// on (0 for the first; a piece's `next` to go on after it), in result order. Nothing for
    /// a rank, request or step that does not exist.
    pub fn pieces(&self, rank: usize, step: usize, request: usize, from: u64) -> Pieces<'_> {
        let found = self.needs.get(rank).and_then(|n| n.get(request));
        let placed = match (found, self.steps.get(step)) {
            (Some(need), Some(s)) if need.file == s.file => {
                let lo = s.offset.saturating_sub(need.begin) as usize;
                let hi = (s.offset + s.len).saturating_sub(need.begin) as usize;
                Some(
                    need.slice()
                        .runs_in_tensor(lo, hi)
                        .starting_at(from as usize),
                )
            }
            _ => None,
        };
        Pieces {
            placed,
            step_start: self.steps.get(step).map_or(0, |s| s.offset),
            begin: found.map_or(0, |n| n.begin),
        }
    }

    /// Copies what request `request` of `rank` needs from step `step` (its bytes in `staging`)
    /// into `out` (the whole result of that request). `InvalidSlice` when the rank, request or
    /// step does not exist or a buffer has the wrong length.
    pub fn scatter(
        &self,
        rank: usize,
        step: usize,
        request: usize,
        staging: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        let s = self.steps.get(step).ok_or_else(|| {
            invalid(format!(
                "step {step} of a load plan of {} steps",
                self.steps.len()
            ))
        })?;
        let Some(&len) = self.result_lens(rank).get(request) else {
            return Err(invalid(format!(
                "rank {rank} of a world of {} has no request {request}",
                self.world()
            )));
        };
        if staging.len() as u64 != s.len || out.len() as u64 != len {
            return Err(invalid(format!(
                "step {step} needs a {}-byte staging buffer and request {request} a {len}-byte \
                 result, got {} and {}",
                s.len,
                staging.len(),
                out.len()
            )));
        }
        for p in self.pieces(rank, step, request, 0) {
            let (from, to, n) = (
                p.step_offset as usize,
                p.out_offset as usize,
                p.len as usize,
            );
            out[to..to + n].copy_from_slice(&staging[from..from + n]);
        }
        Ok(())
    }

    /// Byte length of each of `rank`'s results.
    pub fn result_lens(&self, rank: usize) -> &[u64] {
        self.result_lens.get(rank).map_or(&[], Vec::as_slice)
    }

    /// Bytes `rank` reads from storage.
    pub fn bytes_read_by(&self, rank: usize) -> u64 {
        self.steps
            .iter()
            .filter(|s| s.reader == rank)
            .map(|s| s.len)
            .sum()
    }

    /// Bytes read across all ranks: the union of every rank's needs, each byte once, with the
    /// gaps merged into reads (see [`MERGE_GAP`](super::MERGE_GAP)).
    pub fn bytes_read(&self) -> u64 {
        self.steps.iter().map(|s| s.len).sum()
    }

    /// Bytes delivered through the collective to ranks that need them (excluding the reader).
    pub fn bytes_delivered(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.len * s.needed_by.iter().filter(|&&r| r != s.reader).count() as u64)
            .sum()
    }

    /// Bytes a whole-world broadcast of every shared step moves (`len × (world − 1)`).
    pub fn bytes_broadcast(&self) -> u64 {
        let others = self.world() as u64 - 1;
        self.steps
            .iter()
            .filter(|s| s.shared())
            .map(|s| s.len * others)
            .sum()
    }

    /// Bytes the naive load reads: each rank reads every tensor it touches whole.
    pub fn naive_bytes_read(&self) -> u64 {
        self.naive
    }
}

/// What request of a rank copies out of a step, in result order (see [`LoadPlan::pieces`]).
pub struct Pieces<'p> {
    placed: Option<Placed<'p>>,
    step_start: u64,
    begin: u64,
}

impl Iterator for Pieces<'_> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let (src, out, len) = self.placed.as_mut()?.next()?;
        Some(Piece {
            step_offset: self.begin + src as u64 - self.step_start,
            out_offset: out as u64,
            len: len as u64,
            next: (out + len) as u64,
        })
    }
}

/// The naive load of one rank: each distinct tensor it touches, whole.
fn naive_for(rank_needs: &[Need]) -> Result<u64> {
    let mut tensors = fallible::with_capacity(rank_needs.len(), "a load plan's tensors")?;
    tensors.extend(
        rank_needs
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| (n.file, n.tensor())),
    );
    tensors.sort_unstable();
    tensors.dedup();
    Ok(tensors.iter().map(|(_, (b, e))| e - b).sum())
}

#[cfg(test)]
mod tests;
