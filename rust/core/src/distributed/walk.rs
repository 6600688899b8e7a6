//! A rank's share of a load plan as it runs: the collective checked against the plan's world,
//! the turns of the rank's walk over the steps (which steps it reads together, which it takes
//! part in broadcasting), and where each of its results goes in one device allocation. The host
//! and device loads of `include/safetensors/distributed*.hpp` run these and only move bytes and
//! call the collective.

use crate::error::{Error, Result};
use crate::fallible;
use crate::upload;

use super::need::{invalid, Need};
use super::plan::LoadPlan;

/// The most bytes a turn of steps that a rank reads for itself alone stages at once, however
/// large the plan's steps may be: a turn is staging memory (pinned, on a device load).
pub const MAX_TURN_BYTES: u64 = 64 << 20;

/// One turn of a rank's walk: one shared step (every rank of the world takes part in its
/// broadcast, in step order), or consecutive steps the rank reads for itself alone, together at
/// most the walk's bound (or one larger step), read at once on several threads (a rank's share
/// of many small tensors is many small steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The turn's first step in [`Walk::steps`].
    pub first: usize,
    /// How many steps of [`Walk::steps`] it takes, from `first` on.
    pub count: usize,
    /// Bytes of its steps together: what the turn stages.
    pub len: u64,
    /// One shared step, broadcast from `reader` to every rank.
    pub shared: bool,
    /// The walking rank reads the steps.
    pub reads: bool,
    /// The rank that reads them.
    pub reader: usize,
}

/// A rank's walk over a plan's steps: the steps it takes part in, in plan order (steps another
/// rank reads for itself are passed over), cut into turns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// Indices into [`LoadPlan::steps`].
    pub steps: Vec<usize>,
    /// The turns, in order; each names a run of `steps`.
    pub turns: Vec<Turn>,
}

impl Walk {
    /// The steps of `turn`.
    pub fn steps_of(&self, turn: &Turn) -> &[usize] {
        self.steps
            .get(turn.first..turn.first + turn.count)
            .unwrap_or(&[])
    }
}

/// Where each of a rank's results goes in one allocation: `offsets[request]`, each a multiple
/// of `alignment`, in request order; `total` bytes in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Each result's first byte in the allocation, in request order.
    pub offsets: Vec<u64>,
    /// Bytes of the allocation: the end of the last result.
    pub total: u64,
    /// The alignment the rule gave (256 for 0).
    pub alignment: u64,
}

impl LoadPlan {
    /// Checks that a collective of `size` ranks, this process being `rank`, runs this plan:
    /// `InvalidSlice` naming both worlds otherwise.
    pub fn check_collective(&self, rank: usize, size: usize) -> Result<()> {
        if size != self.world() || rank >= self.world() {
            return Err(invalid(format!(
                "the load plan is for {} ranks but the collective has {size} (this is rank {rank})",
                self.world()
            )));
        }
        Ok(())
    }

    /// Rank `rank`'s walk, with turns of steps it reads alone bounded by `max_bytes` and
    /// [`MAX_TURN_BYTES`] (a step longer than the bound is a turn of its own). `InvalidSlice`
    /// for a rank outside the world.
    pub fn walk(&self, rank: usize, max_bytes: u64) -> Result<Walk> {
        self.check_rank(rank)?;
        let bound = max_bytes.min(MAX_TURN_BYTES);
        let what = "a rank's walk over a load plan";
        let mut walk = Walk::default();
        let mut open: Option<Turn> = None;
        for (i, s) in self.steps().iter().enumerate() {
            let reads = s.reader == rank;
            let shared = s.shared();
            if !reads && !shared {
                continue;
            }
            fallible::push(&mut walk.steps, i, what)?;
            if let Some(t) = open.as_mut() {
                if !shared && s.len <= bound.saturating_sub(t.len) {
                    t.count += 1;
                    t.len += s.len;
                    continue;
                }
            }
            if let Some(t) = open.take() {
                fallible::push(&mut walk.turns, t, what)?;
            }
            let turn = Turn {
                first: walk.steps.len() - 1,
                count: 1,
                len: s.len,
                shared,
                reads,
                reader: s.reader,
            };
            if shared {
                fallible::push(&mut walk.turns, turn, what)?;
            } else {
                open = Some(turn);
            }
        }
        if let Some(t) = open {
            fallible::push(&mut walk.turns, t, what)?;
        }
        Ok(walk)
    }

    /// Where each of `rank`'s results goes in one allocation, on multiples of `alignment` (the
    /// rule of every upload, [`upload::alignment`]: 0 for the default, else a power of two).
    /// `name_of` names a request's tensor for the error when the layout passes 2^64 bytes
    /// (`LayoutOverflow`). `InvalidSlice` for a rank outside the world or a bad alignment.
    pub fn layout(
        &self,
        rank: usize,
        alignment: usize,
        name_of: impl Fn(&Need) -> String,
    ) -> Result<Layout> {
        self.check_rank(rank)?;
        let alignment = upload::alignment(alignment)? as u64;
        let needs = self.needs(rank);
        let mut offsets = fallible::with_capacity(needs.len(), "a rank's placements")?;
        let mut total = 0u64;
        for need in needs {
            let len = need.len();
            let (offset, end) =
                upload::place(total, len, alignment).ok_or_else(|| Error::LayoutOverflow {
                    tensor: name_of(need),
                    placed: total,
                    len,
                    alignment,
                })?;
            offsets.push(offset);
            total = end;
        }
        Ok(Layout {
            offsets,
            total,
            alignment,
        })
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.world() {
            return Err(invalid(format!(
                "rank {rank} is not in the load plan's world of {} ranks",
                self.world()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
