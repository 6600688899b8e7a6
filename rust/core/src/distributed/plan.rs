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
//! ranks less than [`MERGE_GAP`] apart, together with the bytes between them; and a segment
//! shorter than [`SMALL_SEGMENT`] with a neighbour as close, whose ranks then all receive both. A
//! segment one rank needs is read by that rank (shards stay local); a shared one is read by the
//! needing rank with the fewest bytes assigned so far, largest segments first, which balances the
//! reads by bytes. Steps longer than `max_step` are cut so that a rank never stages more than
//! that.
//!
//! Memory is in proportion to the merged ranges, not to the runs: a step-2 selection of a
//! 16 MiB tensor is one step, however many one-byte runs it has. What a rank copies out of a step
//! is found again from the slice plans when it copies ([`LoadPlan::scatter`]), not stored.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::fallible;
use crate::slice::{Placed, Runs, SlicePlan};

/// Bytes between two segments needed by the same ranks that are read (and broadcast) with them
/// rather than skipped: a page, which the kernel reads whole anyway, costs less than a second
/// read and a second broadcast.
pub const MERGE_GAP: u64 = 4096;

/// A segment shorter than this joins a neighbour less than [`MERGE_GAP`] away even when other
/// ranks need the neighbour (every rank of either then receives both). Selections that
/// interleave ranks byte by byte (rank 0 the even elements, rank 1 the odd ones) would otherwise
/// cost one read, one broadcast and one step record per element; runs of this size and more,
/// such as column shards of any real matrix, stay separate and local.
pub const SMALL_SEGMENT: u64 = 256;

/// One request of one rank: a selection of a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Which file (an index the caller gives each distinct file).
    pub file: usize,
    /// The tensor's first byte in the file's data buffer.
    pub begin: u64,
    /// The selection, in result order.
    pub slice: SlicePlan,
}

impl Need {
    /// The whole tensor's `[begin, end)` in the data buffer: what a naive load would read.
    pub fn tensor(&self) -> (u64, u64) {
        let len = self.slice.tensor_byte_len() as u64;
        (self.begin, self.begin.saturating_add(len))
    }

    /// Bytes of the result.
    pub fn len(&self) -> u64 {
        self.slice.byte_len() as u64
    }

    /// Whether the selection is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One read, done by `reader`, then broadcast when `shared`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The file.
    pub file: usize,
    /// First byte in the file's data buffer.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The rank that reads it.
    pub reader: usize,
    /// The ranks that need it, sorted.
    pub needed_by: Vec<usize>,
}

impl Step {
    /// Whether ranks other than the reader need the bytes (so they must be broadcast).
    pub fn shared(&self) -> bool {
        self.needed_by.iter().any(|&r| r != self.reader)
    }
}

/// A request of a rank that may have bytes in a step: the rank copies them out with
/// [`LoadPlan::scatter`] (or [`LoadPlan::pieces`]) once the step is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The step.
    pub step: usize,
    /// The rank's request (index into its list of needs).
    pub request: usize,
}

/// Bytes a rank copies out of a step into one of its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset inside the step.
    pub step_offset: u64,
    /// Offset inside the request's result.
    pub out_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where the pieces after this one start: pass it to [`LoadPlan::pieces`] to go on from
    /// there.
    pub next: u64,
}

/// The whole plan: the same steps for every rank, and what each rank asked for.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    steps: Vec<Step>,
    needs: Vec<Vec<Need>>,
    result_lens: Vec<Vec<u64>>,
    naive: u64,
}

/// A caller error (no world, a rank, request or step that does not exist, runs past the end of
/// the address space).
fn invalid(reason: String) -> Error {
    Error::InvalidSlice {
        tensor: String::new(),
        reason,
    }
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
            let Some((lo, hi)) = need.slice.extent() else {
                continue;
            };
            let lo = need.begin.saturating_add(lo as u64);
            let hi = need.begin.saturating_add(hi as u64);
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
                Some(need.slice.runs_in_tensor(lo, hi).starting_at(from as usize))
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
    /// gaps merged into reads (see [`MERGE_GAP`]).
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

/// A run of a file needed by a set of ranks (a sorted list).
struct Segment {
    file: usize,
    start: u64,
    end: u64,
    ranks: Vec<usize>,
}

/// One need being swept: its runs, lazily, and whether the sweep is inside its current run.
struct Cursor<'a> {
    runs: Runs<'a>,
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
fn segments(needs: &[Vec<Need>]) -> Result<Vec<Segment>> {
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
        for &(_, rank, i) in file_needs {
            let need = &needs[rank][i];
            let mut c = Cursor {
                runs: need.slice.runs(),
                begin: need.begin,
                rank,
                end: 0,
                inside: false,
            };
            if let Some(start) = c.next_run()? {
                heap.push(Reverse((start, cursors.len())));
            }
            cursors.push(c);
        }
        // Each cursor has one event in the heap at a time (its run's start, then its end), so
        // the heap never grows past the capacity reserved above.
        let mut at: Option<u64> = None;
        while let Some(Reverse((pos, k))) = heap.pop() {
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
                heap.push(Reverse((c.end, k)));
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
fn assign(segments: Vec<Segment>, world: usize, max_step: u64) -> Result<Vec<Step>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dtype, Indexer, TensorInfo};

    /// A selection `idx` of a U8 tensor of `shape` whose first byte is `begin` of `file`.
    fn need(file: usize, begin: u64, shape: &[usize], idx: &[Indexer]) -> Need {
        let info = TensorInfo {
            name: "t",
            dtype: Dtype::U8,
            shape,
            data_offsets: (0, shape.iter().product()),
        };
        Need {
            file,
            begin,
            slice: SlicePlan::new(&info, idx).unwrap(),
        }
    }

    fn bytes(file: usize, begin: u64, len: usize) -> Need {
        need(file, begin, &[len], &[])
    }

    fn step(by: i64) -> Indexer {
        Indexer::Range {
            start: None,
            stop: None,
            step: by,
        }
    }

    /// Loads `needs` over `data[file]` as every rank would, checking every invariant on the
    /// way: every needed byte is read exactly once, nothing twice, bytes no rank needs only in
    /// gaps shorter than `MERGE_GAP` between needed ones, and every rank's results equal a
    /// direct gather of its selections (through `scatter`, and through `pieces` in batches).
    fn simulate(needs: &[Vec<Need>], data: &[Vec<u8>], max_step: u64) -> LoadPlan {
        let plan = LoadPlan::new(needs.to_vec(), max_step).unwrap();
        let mut reads: Vec<Vec<u32>> = data.iter().map(|d| vec![0; d.len()]).collect();
        let mut needed: Vec<Vec<Vec<usize>>> =
            data.iter().map(|d| vec![Vec::new(); d.len()]).collect();
        for (rank, rank_needs) in needs.iter().enumerate() {
            for n in rank_needs {
                for (o, l) in n.slice.runs() {
                    let at = n.begin as usize + o;
                    for ranks in &mut needed[n.file][at..at + l] {
                        ranks.push(rank);
                    }
                }
            }
        }
        for s in plan.steps() {
            assert!(s.len > 0 && s.len <= max_step.max(1));
            assert!(
                s.needed_by.contains(&s.reader),
                "the reader needs the bytes"
            );
            for p in s.offset..s.offset + s.len {
                reads[s.file][p as usize] += 1;
                for r in &needed[s.file][p as usize] {
                    assert!(s.needed_by.contains(r), "rank {r} needs byte {p}");
                }
            }
        }
        for (file, (got, need)) in reads.iter().zip(&needed).enumerate() {
            let mut gap = 0;
            let mut gap_read = false;
            for (p, (&count, ranks)) in got.iter().zip(need).enumerate() {
                assert!(count <= 1, "file {file} byte {p} read {count} times");
                if !ranks.is_empty() {
                    assert_eq!(count, 1, "needed byte {p} of file {file} not read");
                    assert!(!gap_read || gap < MERGE_GAP, "a gap of {gap} bytes read");
                    gap = 0;
                    gap_read = false;
                } else {
                    gap += 1;
                    gap_read |= count == 1;
                }
            }
            assert!(
                !gap_read,
                "file {file}: bytes after the last needed one read"
            );
        }
        let read: u64 = reads.iter().flatten().map(|&c| u64::from(c)).sum();
        assert_eq!(plan.bytes_read(), read);
        for (rank, rank_needs) in needs.iter().enumerate() {
            let mut scattered: Vec<Vec<u8>> = plan
                .result_lens(rank)
                .iter()
                .map(|&l| vec![0xEE; l as usize])
                .collect();
            let mut batched = scattered.clone();
            let parts = plan.parts(rank).unwrap();
            assert!(parts
                .windows(2)
                .all(|w| (w[0].step, w[0].request) < (w[1].step, w[1].request)));
            for p in parts {
                let s = &plan.steps()[p.step];
                let staging = &data[s.file][s.offset as usize..(s.offset + s.len) as usize];
                plan.scatter(rank, p.step, p.request, staging, &mut scattered[p.request])
                    .unwrap();
                // Two pieces at a time, going on from each batch's last `next`.
                let mut from = 0;
                loop {
                    let batch: Vec<Piece> =
                        plan.pieces(rank, p.step, p.request, from).take(2).collect();
                    for q in &batch {
                        let src = &staging[q.step_offset as usize..][..q.len as usize];
                        batched[p.request][q.out_offset as usize..][..q.len as usize]
                            .copy_from_slice(src);
                    }
                    match batch.last() {
                        Some(q) if batch.len() == 2 => from = q.next,
                        _ => break,
                    }
                }
            }
            for (i, n) in rank_needs.iter().enumerate() {
                let (b, e) = n.tensor();
                let mut want = vec![0; n.len() as usize];
                n.slice
                    .gather(&data[n.file][b as usize..e as usize], &mut want)
                    .unwrap();
                assert_eq!(scattered[i], want, "rank {rank} request {i}");
                assert_eq!(batched[i], want, "rank {rank} request {i}, in batches");
            }
        }
        plan
    }

    fn files(len: usize) -> Vec<Vec<u8>> {
        vec![
            (0..len).map(|i| (i * 7 % 251) as u8).collect(),
            (0..len).map(|i| (i * 13 % 241) as u8).collect(),
        ]
    }

    #[test]
    fn disjoint_shards_stay_local() {
        let needs = vec![
            vec![need(0, 0, &[600], &[Indexer::range(0, 300)])],
            vec![need(0, 0, &[600], &[Indexer::range(300, 600)])],
        ];
        let plan = simulate(&needs, &files(1000), 1 << 20);
        assert_eq!(plan.bytes_read_by(0), 300);
        assert_eq!(plan.bytes_read_by(1), 300);
        assert_eq!(plan.bytes_delivered(), 0);
        assert!(plan.steps().iter().all(|s| !s.shared()));
    }

    #[test]
    fn column_shards_of_real_rows_stay_local() {
        // Two ranks, each half of every 1 KiB row: 64 local reads each, nothing broadcast.
        let needs: Vec<Vec<Need>> = (0..2i64)
            .map(|r| {
                vec![need(
                    0,
                    0,
                    &[64, 1024],
                    &[Indexer::FULL, Indexer::range(r * 512, (r + 1) * 512)],
                )]
            })
            .collect();
        let plan = simulate(&needs, &files(64 * 1024), 1 << 20);
        assert_eq!(plan.steps().len(), 128);
        assert_eq!(plan.bytes_delivered(), 0);
    }

    #[test]
    fn replicated_tensor_is_read_once_and_balanced() {
        // Four ranks all need two tensors: each is read once, by different ranks.
        let needs: Vec<Vec<Need>> = (0..4)
            .map(|_| vec![bytes(0, 0, 40), bytes(1, 0, 40)])
            .collect();
        let plan = simulate(&needs, &files(200), 1 << 20);
        assert_eq!(plan.bytes_read(), 80);
        assert_eq!(plan.bytes_delivered(), 80 * 3);
        assert_eq!(plan.naive_bytes_read(), 4 * 80);
        assert_ne!(plan.steps()[0].reader, plan.steps()[1].reader);
    }

    #[test]
    fn partial_overlaps_and_strided_runs() {
        let needs = vec![
            vec![need(0, 0, &[5, 10], &[step(2)]), bytes(1, 5, 30)],
            vec![
                bytes(0, 5, 40),
                need(0, 3000, &[40, 300], &[step(3), Indexer::range(7, 250)]),
            ],
            vec![],
            vec![
                need(1, 0, &[10], &[Indexer::range(0, 0)]),
                bytes(1, 30, 10),
                need(0, 2000, &[3000], &[step(5)]),
            ],
        ];
        simulate(&needs, &files(20_000), 7);
        simulate(&needs, &files(20_000), 1000);
    }

    #[test]
    fn gaps_of_a_page_and_more_are_not_read() {
        // Rows 0 and 2 of 5000 bytes: the 5000-byte row between them is not read. Rows 0 and 2
        // of 100 bytes: one read, the row between them included.
        let needs = vec![vec![
            need(0, 0, &[3, 5000], &[step(2)]),
            need(1, 0, &[3, 100], &[step(2)]),
        ]];
        let plan = simulate(&needs, &files(15_000), 1 << 20);
        assert_eq!(plan.steps().len(), 3);
        assert_eq!(plan.bytes_read(), 2 * 5000 + 300);
    }

    #[test]
    fn a_strided_selection_is_one_step_not_one_per_run() {
        // The shape of the load that used to take a step (and a piece) per element.
        let needs = vec![vec![need(0, 0, &[1 << 16], &[step(2)])]];
        let plan = simulate(&needs, &files(1 << 16), 1 << 20);
        assert_eq!(plan.steps().len(), 1);
        assert_eq!(plan.bytes_read(), (1 << 16) - 1);
        assert_eq!(
            plan.parts(0).unwrap(),
            [Part {
                step: 0,
                request: 0
            }]
        );
        let cut = simulate(&needs, &files(1 << 16), 1000);
        assert_eq!(cut.steps().len(), (1 << 16) / 1000 + 1);
    }

    #[test]
    fn ranks_interleaved_element_by_element_share_reads() {
        // Rank 0 the even bytes, rank 1 the odd ones: one shared read, not one per byte.
        let needs = vec![
            vec![need(0, 0, &[1 << 16], &[step(2)])],
            vec![need(
                0,
                0,
                &[1 << 16],
                &[Indexer::Range {
                    start: Some(1),
                    stop: None,
                    step: 2,
                }],
            )],
        ];
        let plan = simulate(&needs, &files(1 << 16), 1 << 20);
        assert_eq!(plan.steps().len(), 1);
        assert_eq!(plan.steps()[0].needed_by, [0, 1]);
    }

    #[test]
    fn a_small_segment_does_not_make_a_large_one_shared() {
        // Rank 1's 10 bytes beside rank 0's 100 KB are read on their own, not broadcast with it.
        let needs = vec![vec![bytes(0, 0, 100_000)], vec![bytes(0, 100_010, 10)]];
        let plan = simulate(&needs, &files(100_100), 1 << 20);
        assert_eq!(plan.bytes_delivered(), 0);
        assert_eq!(plan.bytes_read_by(1), 10);
    }

    #[test]
    fn empty_shares_and_a_world_of_one() {
        let plan = simulate(&[vec![], vec![]], &files(200), 16);
        assert_eq!(plan.bytes_read(), 0);
        assert!(plan.steps().is_empty());
        simulate(&[vec![bytes(0, 3, 100)]], &files(200), 16);
        assert!(LoadPlan::new(Vec::new(), 16).is_err());
    }

    #[test]
    fn shared_reads_balance_by_bytes() {
        // Rank 0 already reads 1000 bytes alone; the shared 600 bytes go to rank 1.
        let needs = vec![
            vec![bytes(0, 0, 1000), bytes(0, 1000, 600)],
            vec![bytes(0, 1000, 600)],
        ];
        let plan = simulate(&needs, &files(2000), 1 << 20);
        assert_eq!(plan.bytes_read_by(1), 600);
        assert_eq!(plan.bytes_read_by(0), 1000);
    }

    #[test]
    fn scatter_refuses_what_does_not_exist() {
        let plan = LoadPlan::new(vec![vec![bytes(0, 0, 10)]], 16).unwrap();
        let mut out = [0u8; 10];
        for (rank, step, request, staging) in
            [(1, 0, 0, 10), (0, 1, 0, 10), (0, 0, 1, 10), (0, 0, 0, 9)]
        {
            let e = plan
                .scatter(rank, step, request, &vec![0; staging], &mut out)
                .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidSlice, "{e}");
        }
        assert_eq!(plan.pieces(0, 5, 0, 0).count(), 0);
        assert!(plan.parts(3).unwrap().is_empty());
    }

    #[test]
    fn runs_past_the_address_space_are_refused() {
        let e = LoadPlan::new(vec![vec![bytes(0, u64::MAX - 4, 10)]], 16).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidSlice, "{e}");
    }
}
