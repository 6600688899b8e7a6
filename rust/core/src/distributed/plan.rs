//! The distributed load plan: given what every rank needs, which rank reads which bytes, so that
//! every needed byte is read exactly once across the world and ranges several ranks need are read
//! once and then broadcast.
//!
//! Every rank builds the same plan from the same inputs (it is deterministic), so the ranks agree
//! on the order of the collective calls without talking to each other first.
//!
//! How: all requested runs of a file are cut at every run boundary into elementary segments, each
//! needed by a set of ranks. Neighbouring segments needed by the same set are merged. A segment
//! one rank needs is read by that rank (shards stay local); a shared one is read by the needing
//! rank with the fewest bytes assigned so far, largest segments first, which balances the reads
//! by bytes. Steps longer than `max_step` are cut so that a rank never stages more than that.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// One request of one rank: a selection of a tensor, as runs of the file's data buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Which file (an index the caller gives each distinct file).
    pub file: usize,
    /// The whole tensor's `[begin, end)` in the data buffer: what a naive load would read.
    pub tensor: (u64, u64),
    /// `(offset, len)` runs in the data buffer, in the order the result lays them out.
    pub runs: Vec<(u64, u64)>,
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

/// Bytes a rank copies out of a step into one of its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The step.
    pub step: usize,
    /// Offset inside the step.
    pub step_offset: u64,
    /// The rank's request (index into its list of needs).
    pub request: usize,
    /// Offset inside that request's result.
    pub out_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// The whole plan: the same steps for every rank, and each rank's pieces.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    steps: Vec<Step>,
    pieces: Vec<Vec<Piece>>,
    result_lens: Vec<Vec<u64>>,
    naive: u64,
}

/// A segment needed by a set of ranks (a sorted list).
struct Segment {
    file: usize,
    start: u64,
    end: u64,
    ranks: Vec<usize>,
}

/// A request the plan cannot serve (no world, or runs past the end of the address space).
fn invalid(reason: String) -> Error {
    Error::InvalidSlice {
        tensor: String::new(),
        reason,
    }
}

impl LoadPlan {
    /// Plans `needs[rank]` for every rank of a world of `needs.len()`. `max_step` (at least 1)
    /// bounds a step's length.
    pub fn new(needs: &[Vec<Need>], max_step: u64) -> Result<LoadPlan> {
        if needs.is_empty() {
            return Err(invalid(
                "a load plan needs a world of at least one rank".into(),
            ));
        }
        let max_step = max_step.max(1);
        let segments = segments(needs)?;
        let steps = assign(segments, needs.len(), max_step);
        let mut pieces = Vec::with_capacity(needs.len());
        let mut result_lens = Vec::with_capacity(needs.len());
        for rank_needs in needs {
            pieces.push(pieces_for(&steps, rank_needs));
            result_lens.push(
                rank_needs
                    .iter()
                    .map(|n| n.runs.iter().map(|r| r.1).sum())
                    .collect(),
            );
        }
        // The naive load: every rank reads each distinct tensor it touches, whole.
        let naive = needs
            .iter()
            .map(|rank_needs| {
                let mut tensors: Vec<(usize, u64, u64)> = rank_needs
                    .iter()
                    .filter(|n| n.runs.iter().any(|r| r.1 > 0))
                    .map(|n| (n.file, n.tensor.0, n.tensor.1))
                    .collect();
                tensors.sort_unstable();
                tensors.dedup();
                tensors.iter().map(|t| t.2 - t.1).sum::<u64>()
            })
            .sum();
        Ok(LoadPlan {
            steps,
            pieces,
            result_lens,
            naive,
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.pieces.len()
    }

    /// The steps, in the order every rank runs them.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// What `rank` copies out of the steps, ordered by step (empty for a rank outside the world).
    pub fn pieces(&self, rank: usize) -> &[Piece] {
        self.pieces.get(rank).map_or(&[], Vec::as_slice)
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

    /// Bytes read across all ranks: the union of every rank's needs, each byte once.
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

/// Cuts every file's requested runs into segments, each with the set of ranks needing it.
fn segments(needs: &[Vec<Need>]) -> Result<Vec<Segment>> {
    // file → (position, rank, +1 start / -1 end)
    let mut events: BTreeMap<usize, Vec<(u64, usize, i8)>> = BTreeMap::new();
    for (rank, rank_needs) in needs.iter().enumerate() {
        for need in rank_needs {
            for &(offset, len) in &need.runs {
                if len == 0 {
                    continue;
                }
                let end = offset
                    .checked_add(len)
                    .ok_or_else(|| invalid(format!("run {offset}+{len} overflows")))?;
                let e = events.entry(need.file).or_default();
                e.push((offset, rank, 1));
                e.push((end, rank, -1));
            }
        }
    }
    let world = needs.len();
    let mut out: Vec<Segment> = Vec::new();
    for (file, mut ev) in events {
        ev.sort_unstable_by_key(|&(pos, rank, delta)| (pos, delta, rank));
        let mut count = vec![0usize; world];
        let mut i = 0;
        while i < ev.len() {
            let pos = ev[i].0;
            while i < ev.len() && ev[i].0 == pos {
                let (_, rank, delta) = ev[i];
                if delta > 0 {
                    count[rank] += 1;
                } else {
                    count[rank] -= 1;
                }
                i += 1;
            }
            let Some(&(next, _, _)) = ev.get(i) else {
                break;
            };
            let ranks: Vec<usize> = (0..world).filter(|&r| count[r] > 0).collect();
            if ranks.is_empty() {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.file == file && last.end == pos && last.ranks == ranks => {
                    last.end = next;
                }
                _ => out.push(Segment {
                    file,
                    start: pos,
                    end: next,
                    ranks,
                }),
            }
        }
    }
    Ok(out)
}

/// Chooses a reader for every segment and cuts long ones into steps, in file order.
fn assign(segments: Vec<Segment>, world: usize, max_step: u64) -> Vec<Step> {
    let mut load = vec![0u64; world];
    let mut reader = vec![usize::MAX; segments.len()];
    for (i, s) in segments.iter().enumerate() {
        if s.ranks.len() == 1 {
            reader[i] = s.ranks[0];
            load[s.ranks[0]] += s.end - s.start;
        }
    }
    let mut shared: Vec<usize> = (0..segments.len())
        .filter(|&i| reader[i] == usize::MAX)
        .collect();
    // Largest first (ties in file order), each to the least-loaded rank that needs it.
    shared.sort_by_key(|&i| (std::cmp::Reverse(segments[i].end - segments[i].start), i));
    for i in shared {
        let s = &segments[i];
        let &r = s
            .ranks
            .iter()
            .min_by_key(|&&r| (load[r], r))
            .expect("a segment has at least one rank");
        reader[i] = r;
        load[r] += s.end - s.start;
    }
    let mut steps = Vec::with_capacity(segments.len());
    for (s, r) in segments.into_iter().zip(reader) {
        let mut at = s.start;
        while at < s.end {
            let len = (s.end - at).min(max_step);
            steps.push(Step {
                file: s.file,
                offset: at,
                len,
                reader: r,
                needed_by: s.ranks.clone(),
            });
            at += len;
        }
    }
    steps
}

/// Maps one rank's runs onto the steps (which cover them, sorted by file then offset).
fn pieces_for(steps: &[Step], needs: &[Need]) -> Vec<Piece> {
    let mut out = Vec::new();
    for (request, need) in needs.iter().enumerate() {
        let mut out_offset = 0u64;
        for &(offset, len) in &need.runs {
            let end = offset + len;
            // First step of this file ending after `offset`.
            let mut k =
                steps.partition_point(|s| (s.file, s.offset + s.len) <= (need.file, offset));
            let mut at = offset;
            while at < end {
                let s = &steps[k];
                let take = (s.offset + s.len).min(end) - at;
                out.push(Piece {
                    step: k,
                    step_offset: at - s.offset,
                    request,
                    out_offset: out_offset + (at - offset),
                    len: take,
                });
                at += take;
                k += 1;
            }
            out_offset += len;
        }
    }
    out.sort_by_key(|p| (p.step, p.request, p.out_offset));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(file: usize, runs: &[(u64, u64)]) -> Need {
        let lo = runs.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = runs.iter().map(|r| r.0 + r.1).max().unwrap_or(0);
        Need {
            file,
            tensor: (lo, hi),
            runs: runs.to_vec(),
        }
    }

    /// Simulates a load over `data[file]`: returns every rank's results and the bytes each
    /// position of each file was read, checking every invariant on the way.
    fn simulate(needs: &[Vec<Need>], data: &[Vec<u8>], max_step: u64) -> LoadPlan {
        let plan = LoadPlan::new(needs, max_step).unwrap();
        let mut reads: Vec<Vec<u32>> = data.iter().map(|d| vec![0; d.len()]).collect();
        for s in plan.steps() {
            assert!(s.len > 0 && s.len <= max_step.max(1));
            assert!(
                s.needed_by.contains(&s.reader),
                "reader must need the bytes"
            );
            for p in s.offset..s.offset + s.len {
                reads[s.file][p as usize] += 1;
            }
        }
        // Every needed byte read exactly once; nothing else read.
        let mut needed: Vec<Vec<u32>> = data.iter().map(|d| vec![0; d.len()]).collect();
        for n in needs.iter().flatten() {
            for &(o, l) in &n.runs {
                for p in o..o + l {
                    needed[n.file][p as usize] = 1;
                }
            }
        }
        assert_eq!(
            reads, needed,
            "reads must cover the needed bytes exactly once"
        );
        let union: u64 = needed.iter().flatten().map(|&c| u64::from(c)).sum();
        assert_eq!(plan.bytes_read(), union);
        // Each rank's assembled results equal the direct gather of its runs.
        for (rank, rank_needs) in needs.iter().enumerate() {
            let mut results: Vec<Vec<u8>> = plan
                .result_lens(rank)
                .iter()
                .map(|&l| vec![0xEE; l as usize])
                .collect();
            for p in plan.pieces(rank) {
                let s = &plan.steps()[p.step];
                let src = (s.offset + p.step_offset) as usize;
                let dst = &mut results[p.request][p.out_offset as usize..][..p.len as usize];
                dst.copy_from_slice(&data[s.file][src..src + p.len as usize]);
            }
            for (n, got) in rank_needs.iter().zip(&results) {
                let want: Vec<u8> = n
                    .runs
                    .iter()
                    .flat_map(|&(o, l)| data[n.file][o as usize..(o + l) as usize].to_vec())
                    .collect();
                assert_eq!(got, &want, "rank {rank}");
            }
        }
        plan
    }

    fn files() -> Vec<Vec<u8>> {
        vec![(0..200u8).collect(), (0..100u8).rev().collect()]
    }

    #[test]
    fn disjoint_shards_stay_local() {
        let needs = vec![vec![need(0, &[(0, 50)])], vec![need(0, &[(50, 50)])]];
        let plan = simulate(&needs, &files(), 1 << 20);
        assert_eq!(plan.bytes_read_by(0), 50);
        assert_eq!(plan.bytes_read_by(1), 50);
        assert_eq!(plan.bytes_delivered(), 0);
        assert!(plan.steps().iter().all(|s| !s.shared()));
    }

    #[test]
    fn replicated_tensor_is_read_once_and_balanced() {
        // Four ranks all need two tensors: each is read once, by different ranks.
        let needs: Vec<Vec<Need>> = (0..4)
            .map(|_| vec![need(0, &[(0, 40)]), need(1, &[(0, 40)])])
            .collect();
        let plan = simulate(&needs, &files(), 1 << 20);
        assert_eq!(plan.bytes_read(), 80);
        assert_eq!(plan.bytes_delivered(), 80 * 3);
        assert_eq!(plan.naive_bytes_read(), 4 * 80);
        assert_ne!(plan.steps()[0].reader, plan.steps()[1].reader);
    }

    #[test]
    fn partial_overlaps_and_strided_runs() {
        let needs = vec![
            vec![need(0, &[(0, 10), (20, 10), (40, 10)]), need(1, &[(5, 30)])],
            vec![need(0, &[(5, 40)])],
            vec![],
            vec![need(1, &[(0, 0)]), need(1, &[(30, 10), (0, 6)])],
        ];
        simulate(&needs, &files(), 7);
    }

    #[test]
    fn gaps_between_needed_ranges_are_not_read() {
        let needs = vec![
            vec![need(0, &[(0, 10), (20, 10)])],
            vec![need(0, &[(25, 10)]), need(1, &[(90, 5)])],
        ];
        let plan = simulate(&needs, &files(), 1 << 20);
        assert_eq!(plan.bytes_read(), 10 + 15 + 5);
    }

    #[test]
    fn empty_shares_and_a_world_of_one() {
        let plan = simulate(&[vec![], vec![]], &files(), 16);
        assert_eq!(plan.bytes_read(), 0);
        assert!(plan.steps().is_empty());
        simulate(&[vec![need(0, &[(3, 100)])]], &files(), 16);
        assert!(LoadPlan::new(&[], 16).is_err());
    }

    #[test]
    fn shared_reads_balance_by_bytes() {
        // Rank 0 already reads 100 bytes alone; the shared 60 bytes go to rank 1.
        let needs = vec![
            vec![need(0, &[(0, 100)]), need(0, &[(100, 60)])],
            vec![need(0, &[(100, 60)])],
        ];
        let plan = simulate(&needs, &files(), 1 << 20);
        assert_eq!(plan.bytes_read_by(1), 60);
        assert_eq!(plan.bytes_read_by(0), 100);
    }
}
