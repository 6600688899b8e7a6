//! What a load plan is made of, shared by the plan (`plan.rs`) and the sweep that builds it
//! (`segments.rs`): a rank's request ([`Need`]), the steps every rank takes ([`Step`]), what a
//! rank copies out of a step ([`Part`], [`Piece`]), the merge thresholds, and the caller error.

use std::sync::Arc;

use crate::error::Error;
use crate::slice::{Runs, SlicePlan};

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
///
/// What the plan's passes read of the selection (its bytes, its tensor's, its extent, and its
/// run when it has one) is copied in when the need is made: a tensor-parallel plan of a
/// 90k-tensor checkpoint holds hundreds of thousands of needs, each selection's plan elsewhere
/// on the heap, and reaching into each of them again in every pass was most of the plan's
/// time (one cache miss per need per pass).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Which file (an index the caller gives each distinct file).
    pub file: usize,
    /// Which tensor of that file (its index in the file's header order): how the plan names the
    /// request in an error.
    pub tensor: usize,
    /// The tensor's first byte in the file's data buffer.
    pub begin: u64,
    /// The selection, in result order; shared, so that handing a caller's selection to a plan
    /// copies no shape or walk.
    slice: Arc<SlicePlan>,
    len: u64,
    tensor_len: u64,
    /// `[lo, hi)` of the tensor's bytes the selection touches (meaningful when `touches`).
    lo: u64,
    hi: u64,
    touches: bool,
    /// The selection is the one run `[lo, hi)`.
    one_run: bool,
}

impl Need {
    /// Selection `slice` of tensor `tensor` of file `file`, whose first byte is at `begin` of
    /// the file's data buffer.
    pub fn new(file: usize, tensor: usize, begin: u64, slice: Arc<SlicePlan>) -> Need {
        let extent = slice.extent();
        let (lo, hi) = extent.map_or((0, 0), |(lo, hi)| (lo as u64, hi as u64));
        Need {
            file,
            tensor,
            begin,
            len: slice.byte_len() as u64,
            tensor_len: slice.tensor_byte_len() as u64,
            lo,
            hi,
            touches: extent.is_some(),
            one_run: slice.run_count() == 1,
            slice,
        }
    }

    /// The selection.
    pub fn slice(&self) -> &Arc<SlicePlan> {
        &self.slice
    }

    /// The whole tensor's `[begin, end)` in the data buffer: what a naive load would read.
    pub fn tensor(&self) -> (u64, u64) {
        (self.begin, self.begin.saturating_add(self.tensor_len))
    }

    /// The tensor bytes the selection touches, first to last, relative to the tensor's first
    /// byte ([`SlicePlan::extent`]); `None` when it selects nothing.
    pub fn extent(&self) -> Option<(u64, u64)> {
        self.touches.then_some((self.lo, self.hi))
    }

    /// The selection's one run `(offset, len)` relative to the tensor's first byte, when it is
    /// one run.
    pub(super) fn one_run(&self) -> Option<(usize, usize)> {
        self.one_run
            .then(|| (self.lo as usize, (self.hi - self.lo) as usize))
    }

    /// The selection's `(offset, len)` byte runs relative to the tensor's first byte
    /// ([`SlicePlan::runs`]), without reaching into the selection's plan when it is one run.
    pub(super) fn runs(&self) -> NeedRuns<'_> {
        if self.one_run {
            NeedRuns::One(Some((self.lo as usize, (self.hi - self.lo) as usize)))
        } else {
            NeedRuns::Walked(self.slice.runs())
        }
    }

    /// Bytes of the result.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the selection is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A need's runs: its one run, or its selection's runs walked.
pub(super) enum NeedRuns<'a> {
    One(Option<(usize, usize)>),
    Walked(Runs<'a>),
}

impl Iterator for NeedRuns<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        match self {
            NeedRuns::One(run) => run.take(),
            NeedRuns::Walked(runs) => runs.next(),
        }
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
/// [`LoadPlan::scatter`](crate::distributed::LoadPlan::scatter) (or [`LoadPlan::pieces`](crate::distributed::LoadPlan::pieces)) once the step is read.
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
    /// Where the pieces after this one start: pass it to [`LoadPlan::pieces`](crate::distributed::LoadPlan::pieces) to go on from
    /// there.
    pub next: u64,
}

/// A caller error (no world, a rank, request or step that does not exist, runs past the end of
/// the address space).
pub(crate) fn invalid(reason: String) -> Error {
    Error::InvalidSlice {
        tensor: String::new(),
        reason,
    }
}
