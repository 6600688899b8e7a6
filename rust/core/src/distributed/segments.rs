//! The sweep behind a load plan (`plan.rs`): every file's needed runs, in offset order, cut into
//! segments needed by a set of ranks and merged as they are produced; then each segment given to
//! the rank that reads it, cut into steps of at most `max_step` bytes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::need::{invalid, Need, NeedRuns, Step, MERGE_GAP, SMALL_SEGMENT};
use crate::error::Result;
use crate::fallible;

/// A run of a file needed by a set of ranks (a sorted list).
pub(super) struct Segment {
    file: usize,
    start: u64,
    end: u64,
    ranks: Vec<usize>,
}

/// One need being swept: its runs, lazily, and whether the sweep is inside its current run.
/// A need of one run has both its events queued up front (`queued`); others have one event at
/// a time in the heap.
struct Cursor<'a> {
    runs: NeedRuns<'a>,
    queued: bool,
    begin: u64,
    rank: usize,
    end: u64,
    inside: bool,
}

impl Cursor<'_> {
    /// The next run's `[start, end)` in the data buffer.
    fn next_run(&mut self) -> Result<Option<u64>> {
        let Some((offset, len)) = self.runs.next() else {
            return Ok(None);
        };
        let overflow = || invalid(format!("a run at {} + {offset} overflows", self.begin));
        let start = self.begin.checked_add(offset as u64).ok_or_else(overflow)?;
        self.end = start.checked_add(len as u64).ok_or_else(overflow)?;
        Ok(Some(start))
    }
}

/// Sweeps every file's needed runs in offset order into merged segments.
pub(super) fn segments(needs: &[Vec<Need>]) -> Result<Vec<Segment>> {
    let what = "a load plan's requests";
    let total = needs.iter().map(Vec::len).sum();
    let mut order = fallible::with_capacity(total, what)?;
    for (rank, rank_needs) in needs.iter().enumerate() {
        order.extend((0..rank_needs.len()).map(|i| (rank_needs[i].file, rank, i)));
    }
    order.sort_unstable();
    let mut merged = Merger {
        current: None,
        out: Vec::new(),
    };
    let mut count = fallible::filled(needs.len(), 0usize, "a load plan's ranks")?;
    let mut active = fallible::with_capacity(needs.len(), "a load plan's ranks")?;
    for file_needs in order.chunk_by(|a, b| a.0 == b.0) {
        let file = file_needs[0].0;
        let mut cursors = fallible::with_capacity(file_needs.len(), what)?;
        let mut heap = BinaryHeap::new();
        heap.try_reserve(file_needs.len())
            .map_err(|_| fallible::out_of_memory(what, (file_needs.len() * 16) as u64))?;
        // Needs of one run (nearly all: a row or column shard, a whole tensor) have their start
        // and end queued here, sorted once, instead of passing through the heap: the sweep
        // takes events in (position, cursor) order from both, the order the heap alone gave.
        let mut queued: Vec<(u64, usize)> =
            fallible::with_capacity(file_needs.len().saturating_mul(2), what)?;
        for &(_, rank, i) in file_needs {
            let need = &needs[rank][i];
            let mut c = Cursor {
                runs: need.runs(),
                queued: need.one_run().is_some(),
                begin: need.begin,
                rank,
                end: 0,
                inside: false,
            };
            if let Some(start) = c.next_run()? {
                if c.queued {
                    queued.push((start, cursors.len()));
                    queued.push((c.end, cursors.len()));
                } else {
                    heap.push(Reverse((start, cursors.len())));
                }
            }
            cursors.push(c);
        }
        queued.sort_unstable();
        let mut queued = queued.into_iter().peekable();
        // Each heap cursor has one event in the heap at a time (its run's start, then its end),
        // so the heap never grows past the capacity reserved above.
        let mut at: Option<u64> = None;
        loop {
            let from_queue = match (queued.peek(), heap.peek()) {
                (Some(&q), Some(&Reverse(h))) => q < h,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let (pos, k) = if from_queue {
                queued.next()
            } else {
                heap.pop().map(|Reverse(h)| h)
            }
            .ok_or_else(|| invalid("the sweep lost an event".into()))?;
            if let Some(prev) = at.filter(|&p| p < pos) {
                if !active.is_empty() {
                    merged.push(file, prev, pos, &active)?;
                }
            }
            at = Some(pos);
            let c = &mut cursors[k];
            if c.inside {
                c.inside = false;
                count[c.rank] -= 1;
                if count[c.rank] == 0 {
                    if let Ok(j) = active.binary_search(&c.rank) {
                        active.remove(j);
                    }
                }
                if let Some(start) = c.next_run()? {
                    heap.push(Reverse((start, k)));
                }
            } else {
                c.inside = true;
                count[c.rank] += 1;
                if count[c.rank] == 1 {
                    if let Err(j) = active.binary_search(&c.rank) {
                        active.insert(j, c.rank);
                    }
                }
                if !c.queued {
                    heap.push(Reverse((c.end, k)));
                }
            }
        }
    }
    merged.finish()
}

/// Merges segments as the sweep produces them (in file order), by the rules in the module
/// comment.
struct Merger {
    current: Option<Segment>,
    out: Vec<Segment>,
}

impl Merger {
    fn push(&mut self, file: usize, start: u64, end: u64, ranks: &[usize]) -> Result<()> {
        let what = "a load plan's segments";
        if let Some(c) = self.current.as_mut() {
            if c.file == file && start - c.end < MERGE_GAP && mergeable(c, end - start, ranks) {
                c.end = end;
                for &r in ranks {
                    if let Err(j) = c.ranks.binary_search(&r) {
                        fallible::reserve(&mut c.ranks, 1, what)?;
                        c.ranks.insert(j, r);
                    }
                }
                return Ok(());
            }
        }
        let next = Segment {
            file,
            start,
            end,
            ranks: fallible::copied(ranks, what)?,
        };
        if let Some(done) = self.current.replace(next) {
            fallible::push(&mut self.out, done, what)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<Segment>> {
        if let Some(done) = self.current.take() {
            fallible::push(&mut self.out, done, "a load plan's segments")?;
        }
        Ok(self.out)
    }
}

/// Whether a segment of `len` bytes needed by `ranks` may join `c`: every rank that would
/// receive bytes it does not need receives fewer than [`SMALL_SEGMENT`] of them (plus the gap).
fn mergeable(c: &Segment, len: u64, ranks: &[usize]) -> bool {
    let subset = |a: &[usize], b: &[usize]| a.iter().all(|r| b.binary_search(r).is_ok());
    (subset(ranks, &c.ranks) || c.end - c.start < SMALL_SEGMENT)
        && (subset(&c.ranks, ranks) || len < SMALL_SEGMENT)
}

/// Chooses a reader for every segment and cuts long ones into steps, in file order.
pub(super) fn assign(segments: Vec<Segment>, world: usize, max_step: u64) -> Result<Vec<Step>> {
    let what = "a load plan's steps";
    let mut load = fallible::filled(world, 0u64, "a load plan's ranks")?;
    let mut reader = fallible::filled(segments.len(), usize::MAX, what)?;
    for (i, s) in segments.iter().enumerate() {
        if s.ranks.len() == 1 {
            reader[i] = s.ranks[0];
            load[s.ranks[0]] += s.end - s.start;
        }
    }
    let mut shared = fallible::with_capacity(segments.len(), what)?;
    shared.extend((0..segments.len()).filter(|&i| reader[i] == usize::MAX));
    // Largest first (ties in file order), each to the least-loaded rank that needs it.
    shared.sort_by_key(|&i| (Reverse(segments[i].end - segments[i].start), i));
    for i in shared {
        let s = &segments[i];
        let Some(&r) = s.ranks.iter().min_by_key(|&&r| (load[r], r)) else {
            continue; // never: a segment has at least one rank
        };
        reader[i] = r;
        load[r] += s.end - s.start;
    }
    let mut steps = fallible::with_capacity(segments.len(), what)?;
    for (s, r) in segments.into_iter().zip(reader) {
        let mut at = s.start;
        while at < s.end {
            let len = (s.end - at).min(max_step);
            let needed_by = fallible::copied(&s.ranks, what)?;
            fallible::push(
                &mut steps,
                Step {
                    file: s.file,
                    offset: at,
                    len,
                    reader: r,
                    needed_by,
                },
                what,
            )?;
            at += len;
        }
    }
    Ok(steps)
}
