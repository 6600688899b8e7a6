//! What a load plan is made of, shared by the plan (`plan.rs`) and the sweep that builds it
//! (`segments.rs`): a rank's request ([`Need`]), the steps every rank takes ([`Step`]), what a
//! rank copies out of a step ([`Part`], [`Piece`]), the merge thresholds, and the caller error.

use std::sync::Arc;

use crate::error::Error;
use crate::slice::SlicePlan;

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
    /// The selection, in result order; shared, so that handing a caller's selection to a plan
    /// copies no shape or walk (a tensor-parallel plan of a 90k-tensor checkpoint takes
    /// hundreds of thousands).
    pub slice: Arc<SlicePlan>,
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

/// A caller error (no world, a rank, request or step that does not exist, runs past the end of
/// the address space).
pub(crate) fn invalid(reason: String) -> Error {
    Error::InvalidSlice {
        tensor: String::new(),
        reason,
    }
}
