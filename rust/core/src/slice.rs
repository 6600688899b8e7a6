//! Slice planning: which bytes of a tensor a NumPy-style selection needs, without reading any.
//!
//! A plan is the new shape plus the contiguous byte runs, in row-major order, that make up the
//! result. Runs are produced lazily (a strided slice of a large tensor can have millions): the
//! contiguous inner block is found once, the outer dimensions are walked like an odometer, and
//! runs that touch (the end of one row meeting the start of the next) are merged as they go.
//!
//! Positions, bounds and steps come from callers and shapes from files: planning arithmetic is
//! checked (the lint below keeps it so); a plan's own positions all lie below the tensor's byte
//! length, which fits, so walking the runs of a plan cannot overflow.
#![deny(clippy::arithmetic_side_effects)]

use crate::byte_len::{checked_numel, tensor_byte_len};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::header::TensorInfo;

mod runs;
pub use runs::{Placed, Runs};

/// How to select along one dimension. Negative positions count from the end, as in Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Indexer {
    /// One position; the dimension disappears from the result (like `a[3]`).
    Select(i64),
    /// `start:stop:step` with `step >= 1`; `None` means the dimension's start or end.
    Range {
        /// First position (inclusive); `None` is 0.
        start: Option<i64>,
        /// End position (exclusive); `None` is the dimension's size.
        stop: Option<i64>,
        /// Stride, at least 1.
        step: i64,
    },
}

impl Indexer {
    /// The whole dimension, `:`.
    pub const FULL: Indexer = Indexer::Range {
        start: None,
        stop: None,
        step: 1,
    };

    /// `start:stop`.
    pub fn range(start: i64, stop: i64) -> Indexer {
        Indexer::Range {
            start: Some(start),
            stop: Some(stop),
            step: 1,
        }
    }
}

/// Indexed axes whose planning state [`SlicePlan::new`] keeps on the stack.
const INLINE_AXES: usize = 8;

/// Dimensions of a result shape a plan holds without an allocation of its own.
const INLINE_RANK: usize = 4;

/// A plan's result shape: inline up to [`INLINE_RANK`] dimensions (nearly every tensor, so a
/// tensor-parallel plan's hundreds of thousands of selections allocate no shapes), else on the
/// heap.
#[derive(Debug, Clone)]
enum Dims {
    Inline(u8, [usize; INLINE_RANK]),
    Heap(Vec<usize>),
}

impl std::ops::Deref for Dims {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline(rank, d) => &d[..usize::from(*rank)],
            Dims::Heap(v) => v,
        }
    }
}

impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        **self == **other
    }
}

impl Eq for Dims {}

/// One dimension after resolving its indexer.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    start: usize,
    count: usize,
    step: usize,
    keep: bool,
}

/// One dimension the run iterator walks: how many positions and the byte distance between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Walk {
    count: usize,
    stride: usize,
}

/// The bytes a slice selects from one tensor, in row-major order of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePlan {
    shape: Dims,
    dtype: Dtype,
    tensor_len: usize,
    base: usize,
    run_len: usize,
    walks: Vec<Walk>,
    runs: usize,
}

impl SlicePlan {
    /// Plans `indexers` (at most one per dimension; missing trailing ones mean `:`) over the
    /// tensor `info`. Out-of-range positions are errors, not clamped; `start >= stop` is empty.
    ///
    /// ```
    /// use safetensors_core::{Dtype, Indexer, SlicePlan, TensorInfo};
    /// let info = TensorInfo { name: "w", dtype: Dtype::F32, shape: &[4, 6], data_offsets: (0, 96) };
    /// let plan = SlicePlan::new(&info, &[Indexer::FULL, Indexer::range(0, 3)]).unwrap();
    /// assert_eq!(plan.shape(), &[4, 3]);
    /// assert_eq!(plan.runs().collect::<Vec<_>>(), [(0, 12), (24, 12), (48, 12), (72, 12)]);
    /// ```
    pub fn new(info: &TensorInfo<'_>, indexers: &[Indexer]) -> Result<SlicePlan> {
        // Cost is bounded by the tensor's rank (itself bounded by the header's size) plus the
        // indexers given: one pass over the shape for the element count, one to copy the result
        // shape, and per-axis state only for the axes that have an indexer. Axes without one are
        // taken whole and only ever contribute to one product. (A header of 100 MB can hold a
        // tensor of rank ~50 million; per-axis records for every axis cost gigabytes.)
        let shape = info.shape;
        let invalid = |reason: String| Error::InvalidSlice {
            tensor: info.name.to_owned(),
            reason,
        };
        if indexers.len() > shape.len() {
            return Err(invalid(format!(
                "{} indexers for a tensor of rank {} (shape {})",
                indexers.len(),
                shape.len(),
                short_shape(shape)
            )));
        }
        let k = indexers.len();
        // Per-axis state on the stack for the few axes nearly every selection indexes (a
        // tensor-parallel plan makes hundreds of thousands of plans), on the heap past that.
        let unset = Resolved {
            start: 0,
            count: 0,
            step: 1,
            keep: false,
        };
        let (mut dims_inline, mut dims_heap) = ([unset; INLINE_AXES], Vec::new());
        let dims: &mut [Resolved] = if k <= INLINE_AXES {
            &mut dims_inline[..k]
        } else {
            dims_heap.resize(k, unset);
            &mut dims_heap
        };
        for (axis, (&indexer, &size)) in indexers.iter().zip(shape).enumerate() {
            dims[axis] =
                resolve(indexer, size).map_err(|r| invalid(format!("dimension {axis}: {r}")))?;
        }
        let dims: &[Resolved] = dims;
        let kept = dims.iter().filter(|d| d.keep).map(|d| d.count);
        let rest = shape[k..].iter().copied();
        let rank = dims
            .iter()
            .filter(|d| d.keep)
            .count()
            .saturating_add(shape.len().saturating_sub(k));
        let new_shape = if rank <= INLINE_RANK {
            let mut d = [0usize; INLINE_RANK];
            for (to, from) in d.iter_mut().zip(kept.chain(rest)) {
                *to = from;
            }
            Dims::Inline(rank as u8, d)
        } else {
            let mut v = Vec::new();
            v.try_reserve_exact(rank)
                .map_err(|_| invalid(format!("no memory for a result of rank {rank}")))?;
            v.extend(kept.chain(rest));
            Dims::Heap(v)
        };
        let bits = info.dtype.bits();
        // The tensor itself must be one that can exist; every dtype has at least 4 bits, so it
        // has no elements exactly when it has no bytes.
        let tensor_len = tensor_byte_len(info.name, info.dtype, shape)?;
        let mut plan = SlicePlan {
            shape: new_shape,
            dtype: info.dtype,
            tensor_len,
            base: 0,
            run_len: 0,
            walks: Vec::new(),
            runs: 0,
        };
        if dims.iter().any(|d| d.count == 0) || tensor_len == 0 {
            return Ok(plan);
        }
        // Element strides of the indexed axes: products of suffixes of a shape whose full
        // product fits. The axes without an indexer make one block of `inner` elements. Every
        // position below is under the element count, so none of this can overflow; it is
        // checked all the same, so that a broken invariant is an error, not a wrapped offset.
        let wrapped = || Error::Internal {
            message: format!(
                "slice planning of tensor `{}` (shape {}) overflowed",
                info.name,
                short_shape(shape)
            ),
        };
        let inner = checked_numel(&shape[k..]).ok_or_else(wrapped)?;
        let (mut strides_inline, mut strides_heap) = ([0usize; INLINE_AXES], Vec::new());
        let strides: &mut [usize] = if k <= INLINE_AXES {
            &mut strides_inline[..k]
        } else {
            strides_heap.resize(k, 0);
            &mut strides_heap
        };
        let mut suffix = inner;
        for axis in (0..k).rev() {
            strides[axis] = suffix;
            suffix = suffix.checked_mul(shape[axis]).ok_or_else(wrapped)?;
        }
        let full = |axis: usize| {
            let d = dims[axis];
            d.start == 0 && d.count == shape[axis] && (d.step == 1 || d.count == 1)
        };
        // The last dimension that is not taken whole: everything after it is one contiguous block.
        let Some(last) = (0..k).rev().find(|&a| !full(a)) else {
            plan.run_len = tensor_len;
            plan.runs = 1;
            return Ok(plan);
        };
        // Positions are in elements until the byte check at the end; all are below numel.
        // Only axes with more than one position iterate, and the product of their counts is at
        // most numel, so there are at most 64 walks whatever the rank.
        let mut base = 0usize;
        let mut walks = Vec::new();
        for (axis, d) in dims.iter().enumerate().take(last.saturating_add(1)) {
            let offset = d.start.checked_mul(strides[axis]).ok_or_else(wrapped)?;
            base = base.checked_add(offset).ok_or_else(wrapped)?;
            let iterates = if axis == last {
                d.step != 1 && d.count > 1
            } else {
                d.count > 1
            };
            if iterates {
                walks.push(Walk {
                    count: d.count,
                    stride: d.step.checked_mul(strides[axis]).ok_or_else(wrapped)?,
                });
            }
        }
        let last_dim = dims[last];
        let run = if last_dim.step == 1 || last_dim.count == 1 {
            last_dim
                .count
                .checked_mul(strides[last])
                .ok_or_else(wrapped)?
        } else {
            strides[last]
        };
        let to_bytes = |elems: usize, what: &str| -> Result<usize> {
            let b = elems.checked_mul(bits).ok_or_else(wrapped)?;
            if b % 8 == 0 {
                Ok(b / 8)
            } else {
                Err(misaligned(
                    info,
                    format!("{what} falls inside a byte ({b} bits of {}); choose bounds on byte boundaries", info.dtype),
                ))
            }
        };
        plan.base = to_bytes(base, "the slice start")?;
        plan.run_len = to_bytes(run, "a contiguous run")?;
        for w in &mut walks {
            w.stride = to_bytes(w.stride, "a stride")?;
        }
        plan.runs = walks
            .iter()
            .try_fold(1usize, |n, w| n.checked_mul(w.count))
            .ok_or_else(wrapped)?;
        plan.walks = walks;
        Ok(plan)
    }

    /// The shape of the result.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type (unchanged by slicing).
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Bytes in the result.
    pub fn byte_len(&self) -> usize {
        // At most the tensor's bytes (see `new`), so the product never saturates.
        self.runs.saturating_mul(self.run_len)
    }

    /// `(offset, len)` byte runs relative to the tensor's first byte, in result order; runs
    /// that touch are merged, so consecutive runs always leave a gap.
    pub fn runs(&self) -> Runs<'_> {
        Runs {
            plan: self,
            counters: vec![0; self.walks.len()],
            offset: self.base,
            left: self.runs,
        }
    }

    /// Whether the selection is at most one contiguous run of the tensor's bytes (after
    /// merging runs that touch), so that a file in memory can hand it out without a copy: the
    /// one rule the C API's `st_slice_tensor` and the C++ bridge's zero-copy selections follow.
    pub fn is_contiguous(&self) -> bool {
        let mut runs = self.runs();
        runs.next();
        runs.next().is_none()
    }

    /// Pieces of the selection (runs before merging those that touch): 1 when it is one run,
    /// `[extent]`.
    pub fn run_count(&self) -> usize {
        self.runs
    }

    /// Bytes of the tensor this plan slices.
    pub fn tensor_byte_len(&self) -> usize {
        self.tensor_len
    }

    /// The tensor bytes the selection touches, first to last, as `[begin, end)` relative to the
    /// tensor's first byte; `None` when it selects nothing.
    // Piece positions: walks have counts above 1 (never 0) and every offset lies inside the
    // tensor's bytes (checked by `new`), so none of this can overflow or divide by zero.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn extent(&self) -> Option<(usize, usize)> {
        let last = self.runs.checked_sub(1)?;
        Some((self.base, self.piece_offset(last) + self.run_len))
    }

    /// The parts of the result whose bytes lie in tensor bytes `[lo, hi)`, each as
    /// `(tensor offset, result offset, len)`, ascending and clipped to the range. Found by
    /// binary search, then walked: the cost is the runs inside the range, not before it.
    // Piece positions: walks have counts above 1 (never 0) and every offset lies inside the
    // tensor's bytes (checked by `new`), so none of this can overflow or divide by zero.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn runs_in_tensor(&self, lo: usize, hi: usize) -> Placed<'_> {
        // Pieces (runs before merging) ascend in the tensor: the first one ending after `lo`.
        let (mut a, mut b) = (0, self.runs);
        while a < b {
            let m = a + (b - a) / 2;
            if self.piece_offset(m) + self.run_len <= lo {
                a = m + 1;
            } else {
                b = m;
            }
        }
        self.placed(a, lo, hi, false)
    }

    /// The parts of the result in result bytes `[lo, hi)`, as [`SlicePlan::runs_in_tensor`]
    /// gives them.
    pub fn runs_in_result(&self, lo: usize, hi: usize) -> Placed<'_> {
        let first = lo.checked_div(self.run_len).unwrap_or(self.runs);
        self.placed(first, lo, hi, true)
    }

    fn placed(&self, first: usize, lo: usize, hi: usize, by_result: bool) -> Placed<'_> {
        Placed {
            runs: self.runs_from(first),
            lo,
            hi,
            by_result,
            out_from: 0,
        }
    }

    /// Where piece `k` (the `k`-th run before merging) starts in the tensor.
    // Piece positions: walks have counts above 1 (never 0) and every offset lies inside the
    // tensor's bytes (checked by `new`), so none of this can overflow or divide by zero.
    #[allow(clippy::arithmetic_side_effects)]
    fn piece_offset(&self, k: usize) -> usize {
        let mut offset = self.base;
        let mut rest = k;
        for w in self.walks.iter().rev() {
            offset += (rest % w.count) * w.stride;
            rest /= w.count;
        }
        offset
    }

    /// The runs from piece `k` on.
    // Piece positions: walks have counts above 1 (never 0) and every offset lies inside the
    // tensor's bytes (checked by `new`), so none of this can overflow or divide by zero.
    #[allow(clippy::arithmetic_side_effects)]
    fn runs_from(&self, k: usize) -> Runs<'_> {
        let k = k.min(self.runs);
        let mut counters = vec![0; self.walks.len()];
        let mut rest = k;
        for (c, w) in counters.iter_mut().zip(&self.walks).rev() {
            *c = rest % w.count;
            rest /= w.count;
        }
        Runs {
            plan: self,
            counters,
            offset: self.piece_offset(k),
            left: self.runs - k,
        }
    }

    /// Checks that `info` is a tensor this plan was made for and `dst_len` fits the result.
    pub fn check_fits(&self, info: &TensorInfo<'_>, dst_len: usize) -> Result<()> {
        if info.dtype != self.dtype || info.byte_len() != self.tensor_len {
            return Err(Error::InvalidSlice {
                tensor: info.name.to_owned(),
                reason: "the slice plan was made for a different tensor".into(),
            });
        }
        if dst_len != self.byte_len() {
            return Err(Error::InvalidSlice {
                tensor: info.name.to_owned(),
                reason: format!(
                    "destination holds {dst_len} bytes but the slice has {}",
                    self.byte_len()
                ),
            });
        }
        Ok(())
    }

    /// Copies the selected bytes of `tensor` (all of the tensor's bytes) into `dst`.
    pub fn gather(&self, tensor: &[u8], dst: &mut [u8]) -> Result<()> {
        let wrong = |buffer, expected: usize, actual: usize| Error::WrongBufferLength {
            buffer,
            expected: expected as u64,
            actual: actual as u64,
        };
        if tensor.len() != self.tensor_len {
            return Err(wrong(
                "the tensor given to gather from",
                self.tensor_len,
                tensor.len(),
            ));
        }
        if dst.len() != self.byte_len() {
            return Err(wrong(
                "the destination of a gather",
                self.byte_len(),
                dst.len(),
            ));
        }
        let mut rest = dst;
        for (offset, len) in self.runs() {
            // Runs lie inside the tensor and add up to `byte_len`; `get` keeps both checked facts.
            let (Some(src), true) = (
                tensor.get(offset..offset.saturating_add(len)),
                len <= rest.len(),
            ) else {
                return Err(Error::Internal {
                    message: format!(
                        "a slice run ({offset}, {len}) lies outside the tensor or the result"
                    ),
                });
            };
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            head.copy_from_slice(src);
            rest = tail;
        }
        Ok(())
    }
}

/// A shape for a message: whole when short, else its rank and first dimensions, so that a
/// message about a tensor of rank 50 million is not hundreds of megabytes.
fn short_shape(shape: &[usize]) -> String {
    const SHOWN: usize = 8;
    if shape.len() <= SHOWN {
        format!("{shape:?}")
    } else {
        let head: Vec<String> = shape[..SHOWN].iter().map(usize::to_string).collect();
        format!(
            "[{}, ... {} more]",
            head.join(", "),
            shape.len().saturating_sub(SHOWN)
        )
    }
}

fn misaligned(info: &TensorInfo<'_>, reason: String) -> Error {
    Error::MisalignedSlice {
        tensor: info.name.to_owned(),
        reason,
    }
}

/// Resolves one indexer against a dimension of `size`, Python-style for negatives.
fn resolve(indexer: Indexer, size: usize) -> std::result::Result<Resolved, String> {
    // In i128, where a position of i64 plus a size of u64 cannot overflow.
    let size_i = i128::from(size as u64);
    let position = |p: i64, allow_end: bool| -> std::result::Result<usize, String> {
        let p = i128::from(p);
        let q = if p < 0 { p.saturating_add(size_i) } else { p };
        let in_range = if allow_end { q <= size_i } else { q < size_i };
        match usize::try_from(q) {
            Ok(q) if in_range => Ok(q),
            _ if allow_end => Err(format!("bound {p} is out of range for size {size}")),
            _ => Err(format!("index {p} is out of range for size {size}")),
        }
    };
    match indexer {
        Indexer::Select(i) => Ok(Resolved {
            start: position(i, false)?,
            count: 1,
            step: 1,
            keep: false,
        }),
        Indexer::Range { start, stop, step } => {
            let step = match usize::try_from(step) {
                Ok(s) if s >= 1 => s,
                _ => {
                    return Err(format!(
                        "step {step} is not supported; steps must be at least 1"
                    ))
                }
            };
            let start = start.map_or(Ok(0), |s| position(s, true))?;
            let stop = stop.map_or(Ok(size), |s| position(s, true))?;
            let count = stop.saturating_sub(start).div_ceil(step);
            Ok(Resolved {
                start,
                count,
                step,
                keep: true,
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests;
