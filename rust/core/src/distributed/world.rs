//! A world's needs gathered selection by selection, with the files they read, and a plan's
//! steps read out of those files: the two halves of a multi-rank load that touch files rather
//! than offsets. The bindings hand selections in and buffers to fill; every rule (a rank inside
//! the world, files told apart by identity, a step that exists, a buffer of exactly the steps'
//! length) is here.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Result;
use crate::fallible;
use crate::file::{read_many, SafeFile};
use crate::slice::SlicePlan;

use super::need::{invalid, Need};
use super::plan::LoadPlan;

/// Every rank's selections, collected before planning, and the files they come from.
pub struct Needs {
    needs: Vec<Vec<Need>>,
    files: Vec<Arc<SafeFile>>,
    /// Each file's number in `files`, by its address: a plan of every tensor of a checkpoint of
    /// 163 shards adds 700,000 selections, and a search of `files` for each was most of it.
    ids: HashMap<usize, usize>,
    /// The last file added and its number: selections come file by file in practice, so most
    /// additions need no lookup at all.
    last: Option<(usize, usize)>,
}

/// A built plan and the files its steps' `file` numbers name.
#[derive(Clone)]
pub struct FilePlan {
    /// The steps and what each rank asked for.
    pub plan: LoadPlan,
    /// The files, numbered as the steps and needs number them.
    pub files: Vec<Arc<SafeFile>>,
}

impl Needs {
    /// Nothing needed yet by any of `world` ranks (a world of 0 is refused when built).
    pub fn new(world: usize) -> Needs {
        Needs {
            needs: (0..world).map(|_| Vec::new()).collect(),
            files: Vec::new(),
            ids: HashMap::new(),
            last: None,
        }
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        self.needs.len()
    }

    /// Adds the selection `slice` of the tensor at `tensor` (file order) of `file` to what `rank`
    /// needs. Files are told apart by identity: selections from one open file share reads.
    /// `InvalidSlice` for a rank outside the world or a tensor the file does not hold.
    pub fn add(
        &mut self,
        rank: usize,
        file: &Arc<SafeFile>,
        tensor: usize,
        slice: Arc<SlicePlan>,
    ) -> Result<()> {
        let world = self.needs.len();
        let Some(list) = self.needs.get_mut(rank) else {
            return Err(invalid(format!(
                "rank {rank} is not in a world of {world} ranks"
            )));
        };
        let Some(placement) = file.header().placement(tensor) else {
            return Err(invalid(format!(
                "the file holds no tensor at position {tensor}"
            )));
        };
        let key = Arc::as_ptr(file) as usize;
        let id = match self.last {
            Some((last, id)) if last == key => id,
            _ => {
                let files = &mut self.files;
                let id = *self.ids.entry(key).or_insert_with(|| {
                    files.push(Arc::clone(file));
                    files.len() - 1
                });
                self.last = Some((key, id));
                id
            }
        };
        // The selection itself, not its runs: a strided selection has as many runs as elements,
        // and the plan walks them lazily.
        fallible::push(
            list,
            Need::new(id, tensor, placement.data_offsets.0 as u64, slice),
            "a rank's needs",
        )
    }

    /// Plans the selections added so far, which move into the plan (the files stay known, so
    /// that more selections of them make a next plan).
    pub fn build(&mut self, max_step: u64) -> Result<FilePlan> {
        let world = self.needs.len();
        let needs = std::mem::replace(&mut self.needs, (0..world).map(|_| Vec::new()).collect());
        Ok(FilePlan {
            plan: LoadPlan::new(needs, max_step)?,
            files: self.files.clone(),
        })
    }
}

impl FilePlan {
    /// Reads the steps `steps` into `dst`, one after another, several at once ([`read_many`]).
    /// `dst` holds exactly their lengths together; a step number the plan lacks or a buffer of
    /// another length is `InvalidSlice`, before anything is read.
    pub fn read_steps(&self, steps: &[usize], dst: &mut [u8]) -> Result<()> {
        let all = self.plan.steps();
        let mut total = 0u64;
        for &i in steps {
            let Some(s) = all.get(i) else {
                return Err(invalid(format!(
                    "there is no step {i}: the plan has {}",
                    all.len()
                )));
            };
            total = total.saturating_add(s.len);
        }
        if dst.len() as u64 != total {
            let what = match steps {
                [i] => format!("step {i} of {}", all.len()),
                _ => format!("{} steps", steps.len()),
            };
            return Err(invalid(format!(
                "{what} needs a {total}-byte buffer, got {}",
                dst.len()
            )));
        }
        let mut reads = Vec::new();
        fallible::reserve(&mut reads, steps.len(), "a batch of step reads")?;
        let mut rest = dst;
        for &i in steps {
            let s = &all[i];
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(s.len as usize);
            let file = self
                .files
                .get(s.file)
                .ok_or_else(|| invalid(format!("step {i} reads a file the plan does not hold")))?;
            reads.push((file.as_ref(), s.offset, head));
            rest = tail;
        }
        read_many(&mut reads)
    }

    /// The name of the tensor `need` selects (empty if its file does not name it).
    pub fn name_of(&self, need: &Need) -> &str {
        self.files
            .get(need.file)
            .and_then(|f| f.header().name_at(need.tensor))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
