//! Which bytes of one tensor a streaming writer has received: disjoint ranges, merged as they
//! touch, so that a tensor written front to back in any number of pieces costs one range, and
//! pieces in any order cost one range per gap between them.
//!
//! A piece is reserved before its bytes are written, so that two threads handing over the same
//! bytes are told apart here (the second gets `Overlap`) rather than racing in the file.

use std::collections::BTreeMap;

use crate::error::PieceProblem;

/// The ranges of one tensor written so far.
#[derive(Debug, Default)]
pub(crate) struct Pieces {
    /// Start → end of each written range; disjoint, and never touching (touching ranges merge).
    ranges: BTreeMap<u64, u64>,
    written: u64,
}

impl Pieces {
    /// Records `[offset, offset + len)` of a tensor of `tensor_len` bytes as written, or says
    /// why it cannot be (past the end, or overlapping bytes already written). An empty piece
    /// inside the tensor is accepted and records nothing.
    pub(crate) fn reserve(
        &mut self,
        offset: u64,
        len: u64,
        tensor_len: u64,
    ) -> Result<(), PieceProblem> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= tensor_len)
            .ok_or(PieceProblem::Long {
                offset,
                len,
                tensor_len,
                whole: false,
            })?;
        if len == 0 {
            return Ok(());
        }
        // The range starting at or before `offset`, and the first one after it.
        let before = self
            .ranges
            .range(..=offset)
            .next_back()
            .map(|(&b, &e)| (b, e));
        let after = self
            .ranges
            .range(offset + 1..)
            .next()
            .map(|(&b, &e)| (b, e));
        for (b, e) in [before, after].into_iter().flatten() {
            if b < end && offset < e {
                return Err(PieceProblem::Overlap {
                    offset,
                    len,
                    written_begin: b,
                    written_end: e,
                });
            }
        }
        let mut start = offset;
        let mut stop = end;
        if let Some((b, e)) = before.filter(|&(_, e)| e == offset) {
            self.ranges.remove(&b);
            start = b;
            debug_assert_eq!(e, offset);
        }
        if let Some((b, e)) = after.filter(|&(b, _)| b == end) {
            self.ranges.remove(&b);
            stop = e;
        }
        self.ranges.insert(start, stop);
        self.written += len;
        Ok(())
    }

    /// `None` when all `tensor_len` bytes were written, else what is missing.
    pub(crate) fn missing(&self, tensor_len: u64) -> Option<PieceProblem> {
        if self.written == tensor_len {
            return None;
        }
        // The first gap: before the first range, or after it.
        let (gap_begin, gap_end) = match self.ranges.iter().next() {
            Some((&b, _)) if b > 0 => (0, b),
            Some((_, &e)) => (
                e,
                self.ranges
                    .range(e..)
                    .next()
                    .map_or(tensor_len, |(&b, _)| b),
            ),
            None => (0, tensor_len),
        };
        Some(PieceProblem::Missing {
            written: self.written,
            tensor_len,
            gap_begin,
            gap_end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_in_any_order_merge_into_one_range() {
        let mut p = Pieces::default();
        for (offset, len) in [(40, 10), (0, 10), (20, 10), (10, 10), (30, 10), (50, 50)] {
            p.reserve(offset, len, 100).unwrap();
        }
        assert_eq!(p.ranges.len(), 1);
        assert_eq!(p.missing(100), None);
    }

    #[test]
    fn overlaps_and_pieces_past_the_end_are_refused() {
        let mut p = Pieces::default();
        p.reserve(10, 10, 100).unwrap();
        for (offset, len) in [(5, 6), (19, 5), (10, 10), (0, 100), (12, 1)] {
            assert!(
                matches!(
                    p.reserve(offset, len, 100),
                    Err(PieceProblem::Overlap { .. })
                ),
                "[{offset}, +{len})"
            );
        }
        assert!(matches!(
            p.reserve(95, 6, 100),
            Err(PieceProblem::Long { .. })
        ));
        assert!(matches!(
            p.reserve(u64::MAX, 2, 100),
            Err(PieceProblem::Long { .. })
        ));
        // Touching is not overlapping.
        p.reserve(5, 5, 100).unwrap();
        p.reserve(20, 5, 100).unwrap();
        assert_eq!(p.written, 20);
    }

    #[test]
    fn missing_names_the_first_gap() {
        let mut p = Pieces::default();
        assert!(matches!(
            p.missing(8),
            Some(PieceProblem::Missing {
                gap_begin: 0,
                gap_end: 8,
                written: 0,
                ..
            })
        ));
        p.reserve(0, 2, 8).unwrap();
        p.reserve(5, 1, 8).unwrap();
        assert!(matches!(
            p.missing(8),
            Some(PieceProblem::Missing {
                gap_begin: 2,
                gap_end: 5,
                written: 3,
                ..
            })
        ));
        let mut q = Pieces::default();
        q.reserve(3, 5, 8).unwrap();
        assert!(matches!(
            q.missing(8),
            Some(PieceProblem::Missing {
                gap_begin: 0,
                gap_end: 3,
                ..
            })
        ));
        assert_eq!(Pieces::default().missing(0), None);
    }
}
