//! Slice plans as C++ holds them: the indices C++ passes turned into the core's indexers, and
//! what a plan answers (its shape, its runs, the one run of a contiguous slice).

use std::sync::Arc;

use safetensors_core::{Error, Indexer};

use super::ffi::{ByteRun, ByteRunsMut, SliceIndex, SliceKind};
use super::SlicePlan;
use crate::status::{guard, lent_mut, Sizes, Status};

/// The core's indexer; a kind that names none is `InvalidSlice`.
pub(super) fn indexer(i: &SliceIndex) -> Result<Indexer, Error> {
    match i.kind {
        SliceKind::Select => Ok(Indexer::Select(i.start)),
        SliceKind::Range => Ok(Indexer::Range {
            start: i.has_start.then_some(i.start),
            stop: i.has_stop.then_some(i.stop),
            step: i.step,
        }),
        SliceKind { repr } => Err(Error::InvalidSlice {
            tensor: String::new(),
            reason: format!("slice index kind {repr} is not Select (0) or Range (1)"),
        }),
    }
}

/// The core's indexers of a request.
pub(crate) fn indexers(indices: &[SliceIndex]) -> Result<Vec<Indexer>, Error> {
    indices.iter().map(indexer).collect()
}

impl SlicePlan {
    /// Position in file order of the tensor this plan slices.
    pub(crate) fn tensor_index(&self) -> usize {
        self.index
    }

    pub fn shape(&self) -> Sizes {
        Sizes::of(self.plan.shape())
    }

    pub fn byte_len(&self) -> usize {
        self.plan.byte_len()
    }

    pub fn run_count(&self, status: &mut Status) -> usize {
        guard(status, || Ok(self.plan.runs().count()))
    }

    /// The runs relative to the start of the data buffer, into the room C++ made for exactly
    /// `run_count()` of them (as many as elements for a strided selection, so C++ allocates
    /// them fallibly).
    pub fn write_runs(&self, out: ByteRunsMut, status: &mut Status) {
        // SAFETY: C++ lends `out` for this call.
        let out = unsafe { lent_mut(out.data, out.len) };
        guard(status, || {
            let room = out.len();
            let mismatch = || Error::Internal {
                message: format!(
                    "room for {room} byte runs, but the selection has {}",
                    self.plan.runs().count()
                ),
            };
            let mut runs = self.plan.runs();
            for slot in out.iter_mut() {
                let (offset, len) = runs.next().ok_or_else(mismatch)?;
                *slot = ByteRun {
                    offset: (self.begin + offset) as u64,
                    length: len as u64,
                };
            }
            match runs.next() {
                Some(_) => Err(mismatch()),
                None => Ok(()),
            }
        })
    }

    /// The first run's offset, relative to the data buffer (0 for an empty selection).
    pub fn first_offset(&self) -> u64 {
        self.plan
            .extent()
            .map_or(0, |(lo, _)| (self.begin + lo) as u64)
    }

    /// The core's plan, shared: for a multi-rank plan that keeps it.
    pub(crate) fn shared(&self) -> Arc<safetensors_core::SlicePlan> {
        Arc::clone(&self.plan)
    }

    /// Whether the slice is at most one contiguous run (so a view into the mapping can serve it).
    pub fn contiguous(&self) -> bool {
        let mut runs = self.plan.runs();
        runs.next();
        runs.next().is_none()
    }
}
