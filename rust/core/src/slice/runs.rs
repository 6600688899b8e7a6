//! Walking a plan's runs: [`Runs`] gives them in result order, merged where they touch;
//! [`Placed`] gives the parts of them inside a range of the tensor or of the result.

use super::SlicePlan;

/// Iterator over a plan's `(offset, len)` runs.
pub struct Runs<'p> {
    pub(super) plan: &'p SlicePlan,
    pub(super) counters: Vec<usize>,
    pub(super) offset: usize,
    pub(super) left: usize,
}

// The walk stays inside the plan's byte range (below the tensor's byte length, which fits): the
// odometer's sums and differences cannot overflow.
#[allow(clippy::arithmetic_side_effects)]
impl Runs<'_> {
    /// The next fixed-size piece before merging.
    fn piece(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let at = self.offset;
        // Odometer step: advance the innermost walk, carrying outwards.
        for (i, w) in self.plan.walks.iter().enumerate().rev() {
            self.counters[i] += 1;
            if self.counters[i] < w.count {
                self.offset += w.stride;
                break;
            }
            self.counters[i] = 0;
            self.offset -= w.stride * (w.count - 1);
        }
        Some(at)
    }
}

/// Parts of a slice's result within a range of the tensor or of the result, as
/// `(tensor offset, result offset, len)`: see [`SlicePlan::runs_in_tensor`].
pub struct Placed<'p> {
    pub(super) runs: Runs<'p>,
    pub(super) lo: usize,
    pub(super) hi: usize,
    pub(super) by_result: bool,
    pub(super) out_from: usize,
}

// As `Runs`: positions and lengths lie inside the plan's byte range and its result.
#[allow(clippy::arithmetic_side_effects)]
impl<'p> Placed<'p> {
    /// The same parts, leaving out result bytes before `from` (to go on where an earlier walk
    /// stopped, without walking the runs before it again).
    pub fn starting_at(mut self, from: usize) -> Placed<'p> {
        let plan = self.runs.plan;
        let k = from.checked_div(plan.run_len).unwrap_or(plan.runs);
        if k > plan.runs - self.runs.left {
            self.runs = plan.runs_from(k);
        }
        self.out_from = from;
        self
    }
}

#[allow(clippy::arithmetic_side_effects)]
impl Iterator for Placed<'_> {
    type Item = (usize, usize, usize);

    fn next(&mut self) -> Option<(usize, usize, usize)> {
        loop {
            // Piece `k` is result bytes `[k × run_len, (k + 1) × run_len)`.
            let out = (self.runs.plan.runs - self.runs.left) * self.runs.plan.run_len;
            let (src, len) = self.runs.next()?;
            let from = if self.by_result { out } else { src };
            if from >= self.hi {
                self.runs.left = 0;
                return None;
            }
            // Every run walked ends after `lo`, so the clipped part is not empty.
            let end = len.min(self.hi - from);
            let skip = self
                .lo
                .saturating_sub(from)
                .max(self.out_from.saturating_sub(out));
            if skip >= end {
                continue;
            }
            return Some((src + skip, out + skip, end - skip));
        }
    }
}

// As `Runs::piece`: merged runs lie inside the plan's byte range.
#[allow(clippy::arithmetic_side_effects)]
impl Iterator for Runs<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let start = self.piece()?;
        let mut len = self.plan.run_len;
        while self.left > 0 && self.offset == start + len {
            self.piece();
            len += self.plan.run_len;
        }
        Some((start, len))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.left > 0), Some(self.left))
    }
}
