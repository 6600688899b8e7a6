//! Glue for multi-rank loading: the tensor-parallel rules and the distributed load plan of
//! `safetensors_core::distributed`, as C++ (`include/safetensors/distributed.hpp`) sees them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use safetensors_core::distributed::{
    qkv_indexers, shard_indexers, FilePlan, Gqa, Need, Needs, QkvPart, Split,
};
use safetensors_core::{fallible, Error, Indexer};

use crate::file::{File, SlicePlan};
use crate::status::handed_over;
use crate::status::{guard, Fallback, Status};
use ffi::{
    DistLayout, DistPart, DistPiece, DistStep, DistTurn, DistWalk, Projection, TpKind, TpRule,
};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        include!("safetensors/ffi/src/file.rs.h");
        type Status = crate::status::ffi::Status;
        type File = crate::file::File;
        type SlicePlan = crate::file::SlicePlan;
    }

    /// Which tensor-parallel rule a `TpRule` is.
    #[derive(Debug)]
    #[repr(u8)]
    enum TpKind {
        /// Split dimension `dim` (evenly unless `uneven`).
        Split = 0,
        /// One attention projection's rows for grouped-query attention.
        Attention = 1,
    }

    /// An attention projection: `safetensors::Projection`'s values.
    #[derive(Debug)]
    #[repr(u8)]
    enum Projection {
        Q = 0,
        K = 1,
        V = 2,
    }

    /// A tensor-parallel rule for rank `rank` of `world`: a `Split` of dimension `dim`, or the
    /// rows of `projection` (of a fused qkv tensor when `fused`) under the attention geometry
    /// `heads`, `kv_heads`, `head_dim`.
    #[derive(Debug, Clone, Copy)]
    struct TpRule {
        kind: TpKind,
        dim: usize,
        rank: usize,
        world: usize,
        uneven: bool,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        projection: Projection,
        fused: bool,
    }

    /// One step of a distributed load: `reader` reads `[offset, offset + len)` of file `file`'s
    /// data buffer, then broadcasts it when `shared`.
    #[derive(Debug, Clone, Copy)]
    struct DistStep {
        file: usize,
        offset: u64,
        len: u64,
        reader: usize,
        shared: bool,
    }

    /// A request of a rank that may have bytes in a step.
    #[derive(Debug, Clone, Copy)]
    struct DistPart {
        step: usize,
        request: usize,
    }

    /// Bytes a rank copies from a step into one of its results; `next` is where the pieces
    /// after it start.
    #[derive(Debug, Clone, Copy)]
    struct DistPiece {
        step_offset: u64,
        out_offset: u64,
        len: u64,
        next: u64,
    }

    /// A turn of a rank's walk over a plan's steps (the core's `Turn`): `count` steps of the
    /// walk's list from `first` on, `len` bytes together; one shared step broadcast from
    /// `reader`, or steps this rank reads for itself (`reads`).
    #[derive(Debug, Clone, Copy)]
    struct DistTurn {
        first: usize,
        count: usize,
        len: u64,
        shared: bool,
        reads: bool,
        reader: usize,
    }

    /// A rank's walk: the steps it takes part in, in order, and its turns over them.
    #[derive(Debug, Default)]
    struct DistWalk {
        steps: Vec<usize>,
        turns: Vec<DistTurn>,
    }

    /// Where each of a rank's results goes in one device allocation of `total` bytes.
    #[derive(Debug, Default)]
    struct DistLayout {
        offsets: Vec<u64>,
        total: u64,
    }

    extern "Rust" {
        /// The plan of the selection a tensor-parallel rule gives the tensor at `index` of
        /// `file`: the rule's indices and the slice plan in one call. Null on failure.
        fn plan_tp(file: &File, index: usize, rule: &TpRule, status: &mut Status)
            -> *mut SlicePlan;

        /// Every rank's selections, before planning.
        type DistPlanBuilder;
        /// A builder for a world of `world` ranks.
        fn new_dist_plan_builder(world: usize) -> Box<DistPlanBuilder>;
        /// Adds a selection of a tensor of `file` to what `rank` needs.
        fn add_need(
            self: &mut DistPlanBuilder,
            rank: usize,
            file: &File,
            plan: &SlicePlan,
            status: &mut Status,
        );
        /// Plans every rank's reads; no step is longer than `max_step` bytes. Null on failure.
        fn build_plan(
            self: &mut DistPlanBuilder,
            max_step: u64,
            status: &mut Status,
        ) -> *mut DistPlan;

        /// A distributed load plan: the same steps on every rank.
        type DistPlan;
        /// Number of ranks.
        fn world(self: &DistPlan) -> usize;
        /// `InvalidSlice` unless a collective of `size` ranks, this being `rank`, runs the plan.
        fn check_collective(self: &DistPlan, rank: usize, size: usize, status: &mut Status);
        /// Rank `rank`'s walk: turns of its own reads at most `max_bytes` (and 64 MiB) each.
        fn walk(self: &DistPlan, rank: usize, max_bytes: u64, status: &mut Status) -> DistWalk;
        /// Rank `rank`'s results laid out on `alignment` (0 for the default; a power of two).
        fn layout(
            self: &DistPlan,
            rank: usize,
            alignment: usize,
            status: &mut Status,
        ) -> DistLayout;
        /// Number of steps.
        fn step_count(self: &DistPlan) -> usize;
        /// Step `i` (all zero out of range).
        fn step(self: &DistPlan, i: usize) -> DistStep;
        /// The requests of `rank` that may have bytes in each step, ordered by step.
        fn parts(self: &DistPlan, rank: usize, status: &mut Status) -> Vec<DistPart>;
        /// Copies what request `request` of `rank` needs from step `step` (read into
        /// `staging`) into its result `out`.
        fn scatter(
            self: &DistPlan,
            rank: usize,
            step: usize,
            request: usize,
            staging: &[u8],
            out: &mut [u8],
            status: &mut Status,
        );
        /// At most `max` (and at most 4096) of the pieces request `request` of `rank` copies
        /// out of step `step`, from piece position `from` on (0, or the last piece's `next`).
        fn pieces(
            self: &DistPlan,
            rank: usize,
            step: usize,
            request: usize,
            from: u64,
            max: usize,
        ) -> Vec<DistPiece>;
        /// Byte length of each of `rank`'s results.
        fn result_lens(self: &DistPlan, rank: usize) -> Vec<u64>;
        /// Reads the steps `steps` into `dst`, one after another (exactly their lengths
        /// together), on several threads at once.
        fn read_steps(self: &DistPlan, steps: &[usize], dst: &mut [u8], status: &mut Status);
        /// Bytes this object has read through `read_steps`.
        fn bytes_read_here(self: &DistPlan) -> u64;
        /// The steps this object has read, in order.
        fn reads_here(self: &DistPlan) -> Vec<DistStep>;
        /// Bytes the plan has `rank` read.
        fn planned_bytes_read_by(self: &DistPlan, rank: usize) -> u64;
        /// Bytes the plan reads across all ranks.
        fn planned_bytes_read(self: &DistPlan) -> u64;
        /// Bytes the collective delivers to ranks that need them.
        fn bytes_delivered(self: &DistPlan) -> u64;
        /// Bytes whole-world broadcasts of the shared steps move.
        fn bytes_broadcast(self: &DistPlan) -> u64;
        /// Bytes a naive per-rank load reads (whole tensors on every rank).
        fn naive_bytes_read(self: &DistPlan) -> u64;
    }

    impl Box<DistPlan> {}
}

impl Fallback for DistWalk {
    fn fallback() -> Self {
        DistWalk::default()
    }
}

impl Fallback for DistLayout {
    fn fallback() -> Self {
        DistLayout::default()
    }
}

/// The slice plan of the selection `rule` gives the tensor at `index` of `file`: the core's
/// rule and the core's plan, with no indices crossing to C++ and back.
pub fn plan_tp(file: &File, index: usize, rule: &TpRule, status: &mut Status) -> *mut SlicePlan {
    guard(status, || {
        let info = file.tensor_at(index)?;
        let indexers = tp_indexers(info.name, info.shape, rule)?;
        file.plan_of(index, &info, &indexers)
    })
}

/// The indices a tensor-parallel rule gives a tensor `name` of `shape`.
fn tp_indexers(name: &str, shape: &[usize], rule: &TpRule) -> Result<Vec<Indexer>, Error> {
    let split = if rule.uneven {
        Split::Uneven
    } else {
        Split::Even
    };
    match rule.kind {
        TpKind::Split => shard_indexers(name, shape, rule.dim, rule.rank, rule.world, split),
        TpKind::Attention => rule_qkv_indexers(name, shape, rule),
        TpKind { repr } => Err(unknown("rule kind", repr)),
    }
}

/// The attention rule of `rule`.
fn rule_qkv_indexers(name: &str, shape: &[usize], rule: &TpRule) -> Result<Vec<Indexer>, Error> {
    let g = Gqa {
        heads: rule.heads,
        kv_heads: rule.kv_heads,
        head_dim: rule.head_dim,
    };
    let part = match rule.projection {
        Projection::Q => QkvPart::Q,
        Projection::K => QkvPart::K,
        Projection::V => QkvPart::V,
        Projection { repr } => return Err(unknown("projection", repr)),
    };
    qkv_indexers(name, shape, g, part, rule.fused, rule.rank, rule.world)
}

/// A code C++ passed that names nothing (a `static_cast` can make any byte).
fn unknown(what: &str, repr: u8) -> Error {
    Error::InvalidSlice {
        tensor: String::new(),
        reason: format!("tensor-parallel {what} value {repr} names none"),
    }
}

/// Every rank's selections, collected before planning (the core's `Needs`).
pub struct DistPlanBuilder(Needs);

pub fn new_dist_plan_builder(world: usize) -> Box<DistPlanBuilder> {
    Box::new(DistPlanBuilder(Needs::new(world)))
}

impl DistPlanBuilder {
    /// Adds a selection `plan` of a tensor of `file` to what `rank` needs.
    pub fn add_need(&mut self, rank: usize, file: &File, plan: &SlicePlan, status: &mut Status) {
        guard(status, || {
            self.0
                .add(rank, &file.shared(), plan.tensor_index(), plan.shared())
        })
    }

    /// Plans the selections added so far (they move into the plan).
    pub fn build_plan(&mut self, max_step: u64, status: &mut Status) -> *mut DistPlan {
        guard(status, || {
            let plan = self.0.build(max_step)?;
            let world = plan.plan.world();
            Ok(handed_over(DistPlan {
                plan,
                read: AtomicU64::new(0),
                log: (0..world).map(|_| Mutex::new(Vec::new())).collect(),
            }))
        })
    }
}

/// A built plan plus the files it reads and what this process has read through it.
pub struct DistPlan {
    plan: FilePlan,
    read: AtomicU64,
    /// The steps read through this object, one list per reading rank (ranks that share a plan
    /// object run on threads of their own: one list each keeps them from waiting on each other).
    /// Every lock of a list is announced to a C++ ThreadSanitizer build (`tsan::lock`): a list
    /// is grown by its rank's thread and copied by whichever thread asks for `reads_here`.
    log: Vec<Mutex<Vec<DistStep>>>,
}

impl DistPlan {
    pub fn world(&self) -> usize {
        self.plan.plan.world()
    }
    pub fn check_collective(&self, rank: usize, size: usize, status: &mut Status) {
        guard(status, || self.plan.plan.check_collective(rank, size))
    }
    pub fn walk(&self, rank: usize, max_bytes: u64, status: &mut Status) -> DistWalk {
        guard(status, || {
            let walk = self.plan.plan.walk(rank, max_bytes)?;
            let what = "a rank's walk over a load plan";
            let mut turns = fallible::with_capacity(walk.turns.len(), what)?;
            turns.extend(walk.turns.iter().map(|t| DistTurn {
                first: t.first,
                count: t.count,
                len: t.len,
                shared: t.shared,
                reads: t.reads,
                reader: t.reader,
            }));
            Ok(DistWalk {
                steps: walk.steps,
                turns,
            })
        })
    }
    pub fn layout(&self, rank: usize, alignment: usize, status: &mut Status) -> DistLayout {
        guard(status, || {
            let name = |n: &Need| self.plan.name_of(n).to_owned();
            let layout = self.plan.plan.layout(rank, alignment, name)?;
            Ok(DistLayout {
                offsets: layout.offsets,
                total: layout.total,
            })
        })
    }
    pub fn step_count(&self) -> usize {
        self.plan.plan.steps().len()
    }
    pub fn step(&self, i: usize) -> DistStep {
        self.plan.plan.steps().get(i).map_or(
            DistStep {
                file: 0,
                offset: 0,
                len: 0,
                reader: 0,
                shared: false,
            },
            |s| DistStep {
                file: s.file,
                offset: s.offset,
                len: s.len,
                reader: s.reader,
                shared: s.shared(),
            },
        )
    }
    pub fn parts(&self, rank: usize, status: &mut Status) -> Vec<DistPart> {
        guard(status, || {
            let parts = self.plan.plan.parts(rank)?;
            let mut out = fallible::with_capacity(parts.len(), "a rank's share of a load plan")?;
            out.extend(parts.iter().map(|p| DistPart {
                step: p.step,
                request: p.request,
            }));
            Ok(out)
        })
    }
    pub fn scatter(
        &self,
        rank: usize,
        step: usize,
        request: usize,
        staging: &[u8],
        out: &mut [u8],
        status: &mut Status,
    ) {
        guard(status, || {
            self.plan.plan.scatter(rank, step, request, staging, out)
        })
    }
    pub fn pieces(
        &self,
        rank: usize,
        step: usize,
        request: usize,
        from: u64,
        max: usize,
    ) -> Vec<DistPiece> {
        // At most 4096 at a time: a bounded allocation whatever the caller asks for.
        self.plan
            .plan
            .pieces(rank, step, request, from)
            .take(max.min(4096))
            .map(|p| DistPiece {
                step_offset: p.step_offset,
                out_offset: p.out_offset,
                len: p.len,
                next: p.next,
            })
            .collect()
    }
    pub fn result_lens(&self, rank: usize) -> Vec<u64> {
        self.plan.plan.result_lens(rank).to_vec()
    }
    /// Reads the steps `steps` into `dst`, one after another (exactly their lengths together),
    /// on several threads at once ([`read_many`]), counting and logging each read.
    pub fn read_steps(&self, steps: &[usize], dst: &mut [u8], status: &mut Status) {
        guard(status, || {
            self.plan.read_steps(steps, dst)?;
            for &i in steps {
                let s = self.step(i);
                self.read.fetch_add(s.len, Ordering::Relaxed);
                if let Some(log) = self.log.get(s.reader) {
                    // Announced (`tsan::lock`): `reads_here` copies the list on another thread.
                    safetensors_core::tsan::lock(log).push(s);
                }
            }
            Ok(())
        })
    }
    pub fn bytes_read_here(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
    /// The steps this object has read: each rank's in the order it read them, rank by rank.
    pub fn reads_here(&self) -> Vec<DistStep> {
        self.log
            .iter()
            .flat_map(|l| safetensors_core::tsan::lock(l).clone())
            .collect()
    }
    pub fn planned_bytes_read_by(&self, rank: usize) -> u64 {
        self.plan.plan.bytes_read_by(rank)
    }
    pub fn planned_bytes_read(&self) -> u64 {
        self.plan.plan.bytes_read()
    }
    pub fn bytes_delivered(&self) -> u64 {
        self.plan.plan.bytes_delivered()
    }
    pub fn bytes_broadcast(&self) -> u64 {
        self.plan.plan.bytes_broadcast()
    }
    pub fn naive_bytes_read(&self) -> u64 {
        self.plan.plan.naive_bytes_read()
    }
}

#[cfg(test)]
mod tests {
    use safetensors_core::ErrorKind;

    use super::*;

    fn rule(kind: TpKind, projection: Projection) -> TpRule {
        TpRule {
            kind,
            dim: 0,
            rank: 0,
            world: 2,
            uneven: false,
            heads: 4,
            kv_heads: 2,
            head_dim: 2,
            projection,
            fused: false,
        }
    }

    /// A rule kind or projection C++ made with `static_cast` from any byte: an error, never a
    /// silent choice of another rule.
    #[test]
    fn rule_codes_that_name_none_are_errors_not_guesses() {
        let shape = [8usize, 3];
        let err = tp_indexers("w", &shape, &rule(TpKind { repr: 5 }, Projection::Q)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{err}");
        assert!(err.to_string().contains("rule kind value 5"), "{err}");
        let attention = TpKind::Attention;
        let err = tp_indexers("w", &shape, &rule(attention, Projection { repr: 3 })).unwrap_err();
        assert!(err.to_string().contains("projection value 3"), "{err}");
        let split = tp_indexers("w", &shape, &rule(TpKind::Split, Projection::Q));
        assert_eq!(split.unwrap().len(), shape.len());
    }
}
