//! Glue for multi-rank loading: the tensor-parallel rules and the distributed load plan of
//! `safetensors_core::distributed`, as C++ (`include/safetensors/distributed.hpp`) sees them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use safetensors_core::distributed::{
    qkv_indexers, shard_indexers, Gqa, LoadPlan, Need, QkvPart, Split,
};
use safetensors_core::{fallible, Error, Indexer, SafeFile};

use crate::ffi::Status;
use crate::ffi::{DistPart, DistPiece, DistStep, SliceIndex, TpRule};
use crate::file::{File, SlicePlan};
use crate::{guard, handed_over};

fn slice_index(i: Indexer) -> SliceIndex {
    match i {
        Indexer::Select(p) => SliceIndex {
            kind: 0,
            start: p,
            stop: 0,
            step: 1,
            has_start: true,
            has_stop: false,
        },
        Indexer::Range { start, stop, step } => SliceIndex {
            kind: 1,
            start: start.unwrap_or(0),
            stop: stop.unwrap_or(0),
            step,
            has_start: start.is_some(),
            has_stop: stop.is_some(),
        },
    }
}

/// The selection `rule` gives a tensor named `name` of `shape`: `kind` 0 splits dimension `dim`;
/// `kind` 1 takes the rows of one attention projection (`part` 0–2: separate q/k/v tensors,
/// 3–5: the q/k/v blocks of a fused tensor).
pub fn tp_indices(
    name: &[u8],
    shape: &[usize],
    rule: &TpRule,
    status: &mut Status,
) -> Vec<SliceIndex> {
    guard(status, || {
        let name = String::from_utf8_lossy(name);
        let split = if rule.uneven {
            Split::Uneven
        } else {
            Split::Even
        };
        let indexers = match rule.kind {
            0 => shard_indexers(&name, shape, rule.dim, rule.rank, rule.world, split)?,
            _ => rule_qkv_indexers(&name, shape, rule)?,
        };
        Ok(indexers.into_iter().map(slice_index).collect())
    })
}

/// The attention rule of `rule` (`part` 0–2: separate q/k/v tensors, 3–5: fused blocks).
fn rule_qkv_indexers(name: &str, shape: &[usize], rule: &TpRule) -> Result<Vec<Indexer>, Error> {
    let g = Gqa {
        heads: rule.heads,
        kv_heads: rule.kv_heads,
        head_dim: rule.head_dim,
    };
    let (part, fused) = match rule.part {
        0 => (QkvPart::Q, false),
        1 => (QkvPart::K, false),
        2 => (QkvPart::V, false),
        3 => (QkvPart::Q, true),
        4 => (QkvPart::K, true),
        _ => (QkvPart::V, true),
    };
    qkv_indexers(name, shape, g, part, fused, rule.rank, rule.world)
}

/// Every rank's selections, collected before planning.
pub struct DistPlanBuilder {
    files: Vec<Arc<SafeFile>>,
    needs: Vec<Vec<Need>>,
}

pub fn new_dist_plan_builder(world: usize) -> Box<DistPlanBuilder> {
    Box::new(DistPlanBuilder {
        files: Vec::new(),
        needs: (0..world).map(|_| Vec::new()).collect(),
    })
}

impl DistPlanBuilder {
    /// Adds a selection `plan` of a tensor of `file` to what `rank` needs. Files are told apart
    /// by identity: selections from one open file or checkpoint share reads.
    pub fn add_need(&mut self, rank: usize, file: &File, plan: &SlicePlan, status: &mut Status) {
        guard(status, || {
            let world = self.needs.len();
            let Some(list) = self.needs.get_mut(rank) else {
                return Err(Error::InvalidSlice {
                    tensor: String::new(),
                    reason: format!("rank {rank} is not in a world of {world} ranks"),
                });
            };
            let shared = file.shared();
            let id = match self.files.iter().position(|f| Arc::ptr_eq(f, &shared)) {
                Some(i) => i,
                None => {
                    self.files.push(shared);
                    self.files.len() - 1
                }
            };
            let meta = file.meta_at(plan.tensor_index());
            // The selection itself, not its runs: a strided selection has as many runs as
            // elements, and the plan walks them lazily.
            list.push(Need {
                file: id,
                begin: meta.begin as u64,
                slice: plan.core().clone(),
            });
            Ok(())
        })
    }

    /// Plans the selections added so far (they move into the plan).
    pub fn build_plan(&mut self, max_step: u64, status: &mut Status) -> *mut DistPlan {
        guard(status, || {
            let world = self.needs.len();
            let needs =
                std::mem::replace(&mut self.needs, (0..world).map(|_| Vec::new()).collect());
            let plan = LoadPlan::new(needs, max_step)?;
            Ok(handed_over(DistPlan {
                plan,
                files: self.files.clone(),
                read: AtomicU64::new(0),
                log: Mutex::new(Vec::new()),
            }))
        })
    }
}

/// A built plan plus the files it reads and what this process has read through it.
pub struct DistPlan {
    plan: LoadPlan,
    files: Vec<Arc<SafeFile>>,
    read: AtomicU64,
    log: Mutex<Vec<DistStep>>,
}

impl DistPlan {
    pub fn world(&self) -> usize {
        self.plan.world()
    }
    pub fn step_count(&self) -> usize {
        self.plan.steps().len()
    }
    pub fn step(&self, i: usize) -> DistStep {
        self.plan.steps().get(i).map_or(
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
            let parts = self.plan.parts(rank)?;
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
            self.plan.scatter(rank, step, request, staging, out)
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
        self.plan.result_lens(rank).to_vec()
    }
    /// Reads step `i` into `dst` (exactly its length), counting and logging the read.
    pub fn read_step(&self, i: usize, dst: &mut [u8], status: &mut Status) {
        guard(status, || {
            let s = self.step(i);
            if i >= self.step_count() || dst.len() as u64 != s.len {
                return Err(Error::InvalidSlice {
                    tensor: String::new(),
                    reason: format!(
                        "step {i} of {} needs a {}-byte buffer, got {}",
                        self.step_count(),
                        s.len,
                        dst.len()
                    ),
                });
            }
            self.files[s.file].read_data(s.offset, dst)?;
            self.read.fetch_add(s.len, Ordering::Relaxed);
            if let Ok(mut log) = self.log.lock() {
                log.push(s);
            }
            Ok(())
        })
    }
    pub fn bytes_read_here(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
    /// The steps this object has read, in order.
    pub fn reads_here(&self) -> Vec<DistStep> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
    pub fn planned_bytes_read_by(&self, rank: usize) -> u64 {
        self.plan.bytes_read_by(rank)
    }
    pub fn planned_bytes_read(&self) -> u64 {
        self.plan.bytes_read()
    }
    pub fn bytes_delivered(&self) -> u64 {
        self.plan.bytes_delivered()
    }
    pub fn bytes_broadcast(&self) -> u64 {
        self.plan.bytes_broadcast()
    }
    pub fn naive_bytes_read(&self) -> u64 {
        self.plan.naive_bytes_read()
    }
}
