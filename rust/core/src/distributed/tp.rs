//! Tensor-parallel shard rules, in one place: the C++ `Slice` helpers call these through the
//! bridge rather than re-deriving them.
//!
//! - An even split gives every rank `len / world` positions and refuses a length the world does
//!   not divide; an uneven split (only when asked) gives the first `len % world` ranks one more,
//!   like `numpy.array_split`, so a rank may get an empty share.
//! - Fused QKV for grouped-query attention follows vLLM's `QKVParallelLinear`
//!   (`vllm/model_executor/layers/linear.py`): query heads are divided evenly; when the world is
//!   at least the number of KV heads each rank holds one KV head and
//!   `num_kv_head_replicas = world / kv_heads` consecutive ranks share it (rank `r` takes KV head
//!   `r / num_kv_head_replicas`), otherwise the KV heads are divided evenly. vLLM's `divide`
//!   asserts exact division, so we refuse the same cases with a typed error.

// Every number here comes from a caller (ranks, world sizes, head counts, shapes): arithmetic is
// checked, and the lint keeps it so.
#![deny(clippy::arithmetic_side_effects)]

use std::num::NonZeroUsize;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::slice::Indexer;

/// How to split a dimension whose length the world may not divide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every rank gets the same share; a length the world does not divide is an error.
    Even,
    /// The first `len % world` ranks get one more position (`numpy.array_split`).
    Uneven,
}

fn invalid(tensor: &str, reason: String) -> Error {
    Error::InvalidSlice {
        tensor: tensor.to_owned(),
        reason,
    }
}

/// The world, once `rank` is known to be in it.
fn check_rank(tensor: &str, rank: usize, world: usize) -> Result<NonZeroUsize> {
    match NonZeroUsize::new(world) {
        Some(w) if rank < world => Ok(w),
        _ => Err(invalid(
            tensor,
            format!("rank {rank} is not in a world of {world} ranks"),
        )),
    }
}

/// A row or position as a slice bound (slices take signed 64-bit positions).
fn bound(tensor: &str, position: usize) -> Result<i64> {
    i64::try_from(position).map_err(|_| {
        invalid(
            tensor,
            format!("position {position} does not fit a signed 64-bit slice bound"),
        )
    })
}

/// The positions `[start, stop)` rank `rank` of `world` takes out of `len`.
///
/// ```
/// use safetensors_core::distributed::{shard_range, Split};
/// assert_eq!(shard_range("w", 10, 1, 2, Split::Even).unwrap(), 5..10);
/// assert_eq!(shard_range("w", 10, 3, 4, Split::Uneven).unwrap(), 8..10);
/// assert!(shard_range("w", 10, 0, 4, Split::Even).is_err());
/// ```
pub fn shard_range(
    tensor: &str,
    len: usize,
    rank: usize,
    world: usize,
    split: Split,
) -> Result<Range<usize>> {
    let w = check_rank(tensor, rank, world)?;
    let (base, extra) = (len / w, len % w);
    if extra != 0 && split == Split::Even {
        return Err(invalid(
            tensor,
            format!(
                "a dimension of {len} does not split evenly over {world} ranks \
                 ({len} % {world} = {extra}); ask for an uneven split explicitly if that is meant"
            ),
        ));
    }
    // rank < world, so rank × base + min(rank, extra) + base + 1 ≤ len: nothing here can fail,
    // but a wrong bound is an error rather than a wrapped position.
    let wrapped = || {
        invalid(
            tensor,
            format!("the share of rank {rank} of {len} positions overflows"),
        )
    };
    let start = rank
        .checked_mul(base)
        .and_then(|s| s.checked_add(rank.min(extra)))
        .ok_or_else(wrapped)?;
    let stop = start
        .checked_add(base)
        .and_then(|s| s.checked_add(usize::from(rank < extra)))
        .ok_or_else(wrapped)?;
    Ok(start..stop)
}

/// One indexer per dimension of `shape`: the whole dimension everywhere but `dim`, which is
/// split by [`shard_range`].
pub fn shard_indexers(
    tensor: &str,
    shape: &[usize],
    dim: usize,
    rank: usize,
    world: usize,
    split: Split,
) -> Result<Vec<Indexer>> {
    let Some(&len) = shape.get(dim) else {
        return Err(invalid(
            tensor,
            format!(
                "cannot shard dimension {dim} of a tensor of rank {} (shape {shape:?})",
                shape.len()
            ),
        ));
    };
    let r = shard_range(tensor, len, rank, world, split)?;
    let mut out = vec![Indexer::FULL; shape.len()];
    out[dim] = Indexer::range(bound(tensor, r.start)?, bound(tensor, r.end)?);
    Ok(out)
}

/// The attention geometry of a grouped-query attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gqa {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (equal to `heads` without GQA).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// Which projection of an attention layer a tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvPart {
    /// `q_proj` alone: `heads * head_dim` rows.
    Q,
    /// `k_proj` alone: `kv_heads * head_dim` rows.
    K,
    /// `v_proj` alone: `kv_heads * head_dim` rows.
    V,
    /// The fused `qkv_proj`: `(heads + 2 * kv_heads) * head_dim` rows, q then k then v.
    Fused,
}

/// The rows along dimension 0 one rank takes from a projection: for a single projection only
/// `q`, `k` or `v` is meaningful; for the fused tensor all three, in fused row numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QkvRows {
    /// Query rows.
    pub q: Range<usize>,
    /// Key rows.
    pub k: Range<usize>,
    /// Value rows.
    pub v: Range<usize>,
}

/// Row counts of a layout, all in one place and checked: each block's rows and where each
/// block starts in the fused tensor (q, then k, then v).
#[derive(Debug, Clone, Copy)]
struct Blocks {
    q: usize,
    kv: usize,
    v_start: usize,
    fused: usize,
}

/// The layout's [`Blocks`]; an error when the fused total does not fit in 64 bits (then no
/// tensor has that many rows).
fn blocks(tensor: &str, g: Gqa) -> Result<Blocks> {
    let q = g.heads.checked_mul(g.head_dim);
    let kv = g.kv_heads.checked_mul(g.head_dim);
    let v_start = q.zip(kv).and_then(|(q, kv)| q.checked_add(kv));
    let fused = v_start.zip(kv).and_then(|(v, kv)| v.checked_add(kv));
    match (q, kv, v_start, fused) {
        (Some(q), Some(kv), Some(v_start), Some(fused)) => Ok(Blocks {
            q,
            kv,
            v_start,
            fused,
        }),
        _ => Err(invalid(
            tensor,
            format!(
                "{} query heads, {} KV heads and head_dim {} make (heads + 2 × KV heads) × \
                 head_dim rows, more than fit in 64 bits; check the attention geometry",
                g.heads, g.kv_heads, g.head_dim
            ),
        )),
    }
}

/// Rows of the fused `qkv_proj` (q block, then k, then v) that `rank` of `world` takes, by
/// vLLM's rule (see the module comment). Rows of a separate `k_proj`/`v_proj` are
/// `k`/`v` minus their block start, `heads * head_dim` and `(heads + kv_heads) * head_dim`.
/// A geometry whose row count does not fit in 64 bits is `InvalidSlice`.
///
/// ```
/// use safetensors_core::distributed::{qkv_rows, Gqa};
/// // 8 query heads, 2 KV heads, head_dim 4, world 4: ranks 0,1 share KV head 0.
/// let g = Gqa { heads: 8, kv_heads: 2, head_dim: 4 };
/// let r1 = qkv_rows("qkv", g, 1, 4).unwrap();
/// assert_eq!((r1.q, r1.k, r1.v), (8..16, 32..36, 40..44));
/// ```
pub fn qkv_rows(tensor: &str, g: Gqa, rank: usize, world: usize) -> Result<QkvRows> {
    let w = check_rank(tensor, rank, world)?;
    let geometry = || {
        invalid(
            tensor,
            format!(
                "{} query heads, {} KV heads and head_dim {} is not a grouped-query attention \
                 layout (heads must be a positive multiple of the KV heads)",
                g.heads, g.kv_heads, g.head_dim
            ),
        )
    };
    let kv = NonZeroUsize::new(g.kv_heads).ok_or_else(geometry)?;
    if g.heads == 0 || g.head_dim == 0 || g.heads % kv != 0 {
        return Err(geometry());
    }
    if g.heads % w != 0 {
        return Err(invalid(
            tensor,
            format!(
                "{} query heads do not divide over {world} ranks; tensor parallelism needs the \
                 world to divide the query heads",
                g.heads
            ),
        ));
    }
    let b = blocks(tensor, g)?;
    let q_per = g.heads / w;
    // vLLM: tp_size >= total_num_kv_heads → one KV head per rank, replicated across
    // tp_size / total_num_kv_heads ranks; otherwise divided.
    let (kv_per, kv_index) = if world >= g.kv_heads {
        if world % kv != 0 {
            return Err(invalid(
                tensor,
                format!(
                    "{world} ranks cannot replicate {} KV heads evenly (the world must be a \
                     multiple of the KV heads when it exceeds them)",
                    g.kv_heads
                ),
            ));
        }
        // world ≥ kv_heads ≥ 1 and kv_heads divides it, so the quotient is at least 1.
        let replicas = NonZeroUsize::new(world / kv).ok_or_else(geometry)?;
        (1, rank / replicas)
    } else {
        if g.kv_heads % w != 0 {
            return Err(invalid(
                tensor,
                format!("{} KV heads do not divide over {world} ranks", g.kv_heads),
            ));
        }
        (g.kv_heads / w, rank)
    };
    // Every row below lies inside the fused total, which `blocks` showed fits: these
    // products and sums cannot overflow, and are checked all the same.
    let hd = g.head_dim;
    let wrapped = || {
        invalid(
            tensor,
            format!("the rows of rank {rank} of {world} overflow"),
        )
    };
    let rows = |count: usize, first: usize| -> Result<(usize, usize)> {
        let len = count.checked_mul(hd).ok_or_else(wrapped)?;
        let start = first.checked_mul(len).ok_or_else(wrapped)?;
        Ok((start, len))
    };
    let (q0, q_len) = rows(q_per, rank)?;
    let (k0, kv_len) = rows(kv_per, kv_index)?;
    let k_start = b.q.checked_add(k0).ok_or_else(wrapped)?;
    let v_start = b.v_start.checked_add(k0).ok_or_else(wrapped)?;
    let end = |start: usize, len: usize| start.checked_add(len).ok_or_else(wrapped);
    Ok(QkvRows {
        q: q0..end(q0, q_len)?,
        k: k_start..end(k_start, kv_len)?,
        v: v_start..end(v_start, kv_len)?,
    })
}

/// Total rows a projection has along dimension 0 (`InvalidSlice` when that does not fit in 64
/// bits).
pub fn qkv_part_rows(tensor: &str, g: Gqa, part: QkvPart) -> Result<usize> {
    let b = blocks(tensor, g)?;
    Ok(match part {
        QkvPart::Q => b.q,
        QkvPart::K | QkvPart::V => b.kv,
        QkvPart::Fused => b.fused,
    })
}

/// One indexer per dimension of a projection tensor of `shape`: the rows of block `part`
/// (`Q`, `K` or `V`) that `rank` of `world` takes, by [`qkv_rows`], from a tensor that holds
/// that projection alone (`fused` false) or the fused `qkv_proj` (`fused` true; `part` `Fused`
/// is the q block). Dimension 0 must be the projection's row count (`InvalidSlice`).
pub fn qkv_indexers(
    tensor: &str,
    shape: &[usize],
    g: Gqa,
    part: QkvPart,
    fused: bool,
    rank: usize,
    world: usize,
) -> Result<Vec<Indexer>> {
    let rows = qkv_rows(tensor, g, rank, world)?;
    let layout = if fused { QkvPart::Fused } else { part };
    let want = qkv_part_rows(tensor, g, layout)?;
    if shape.first() != Some(&want) {
        return Err(invalid(
            tensor,
            format!(
                "a {layout:?} projection of {} heads, {} KV heads and head_dim {} has {want} \
                 rows in dimension 0, but the tensor's shape is {shape:?}",
                g.heads, g.kv_heads, g.head_dim
            ),
        ));
    }
    let b = blocks(tensor, g)?;
    let (r, block_start) = match part {
        QkvPart::Q | QkvPart::Fused => (rows.q, 0),
        QkvPart::K => (rows.k, b.q),
        QkvPart::V => (rows.v, b.v_start),
    };
    // In a separate projection, rows count from its own start.
    let base = if fused { 0 } else { block_start };
    let local = |row: usize| {
        row.checked_sub(base)
            .ok_or_else(|| invalid(tensor, format!("row {row} is before its block at {base}")))
    };
    let mut out = vec![Indexer::FULL; shape.len()];
    out[0] = Indexer::range(
        bound(tensor, local(r.start)?)?,
        bound(tensor, local(r.end)?)?,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn even_split_refuses_a_remainder() {
        let e = shard_range("w", 10, 0, 3, Split::Even).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSlice);
        assert!(e.to_string().contains("10 % 3 = 1"), "{e}");
        assert_eq!(shard_range("w", 12, 2, 3, Split::Even).unwrap(), 8..12);
    }

    #[test]
    fn uneven_split_covers_every_position_once_and_may_be_empty() {
        for (len, world) in [(10, 4), (3, 8), (0, 2), (7, 7)] {
            let mut next = 0;
            for rank in 0..world {
                let r = shard_range("w", len, rank, world, Split::Uneven).unwrap();
                assert_eq!(r.start, next);
                next = r.end;
            }
            assert_eq!(next, len);
        }
        assert!(shard_range("w", 3, 5, 8, Split::Uneven).unwrap().is_empty());
    }

    #[test]
    fn rank_outside_the_world_is_an_error() {
        for (rank, world) in [(0, 0), (4, 4)] {
            assert_eq!(
                shard_range("w", 8, rank, world, Split::Even)
                    .unwrap_err()
                    .kind(),
                ErrorKind::InvalidSlice
            );
        }
    }

    #[test]
    fn shard_indexers_split_one_dimension() {
        let idx = shard_indexers("w", &[6, 4], 1, 1, 2, Split::Even).unwrap();
        assert_eq!(idx, [Indexer::FULL, Indexer::range(2, 4)]);
        assert!(shard_indexers("w", &[6], 1, 0, 2, Split::Even).is_err());
    }

    #[test]
    fn qkv_divides_kv_heads_when_the_world_is_smaller() {
        let g = Gqa {
            heads: 8,
            kv_heads: 4,
            head_dim: 2,
        };
        let r = qkv_rows("qkv", g, 1, 2).unwrap();
        assert_eq!((r.q, r.k, r.v), (8..16, 20..24, 28..32));
    }

    #[test]
    fn qkv_replicates_kv_heads_when_the_world_exceeds_them() {
        let g = Gqa {
            heads: 8,
            kv_heads: 2,
            head_dim: 1,
        };
        // world 8: replicas = 4, so ranks 0..4 take KV head 0 and 4..8 take KV head 1.
        let ks: Vec<_> = (0..8)
            .map(|r| qkv_rows("qkv", g, r, 8).unwrap().k.start)
            .collect();
        assert_eq!(ks, [8, 8, 8, 8, 9, 9, 9, 9]);
        assert_eq!(qkv_rows("qkv", g, 5, 8).unwrap().v, 11..12);
    }

    #[test]
    fn qkv_geometry_whose_rows_overflow_is_refused_at_every_world() {
        // (4 + 2 × 2) × (2^62 + 1) wraps to 8 rows in 64-bit arithmetic, a plausible count.
        let g = Gqa {
            heads: 4,
            kv_heads: 2,
            head_dim: (1 << 62) + 1,
        };
        for world in [1, 2] {
            let e = qkv_rows("qkv", g, 0, world).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSlice);
            assert!(e.to_string().contains("more than fit in 64 bits"), "{e}");
            let e = qkv_indexers("qkv", &[8, 4], g, QkvPart::Q, true, 0, world).unwrap_err();
            assert!(e.to_string().contains("more than fit in 64 bits"), "{e}");
        }
        for part in [QkvPart::Q, QkvPart::K, QkvPart::V, QkvPart::Fused] {
            assert!(qkv_part_rows("qkv", g, part).is_err(), "{part:?}");
        }
        // The largest geometry that fits still works, with rows counted exactly.
        let big = Gqa {
            heads: 1,
            kv_heads: 1,
            head_dim: usize::MAX / 3,
        };
        let r = qkv_rows("qkv", big, 0, 1).unwrap();
        assert_eq!(r.v.end, usize::MAX / 3 * 3);
    }

    #[test]
    fn bounds_beyond_i64_are_refused_not_wrapped() {
        let e = shard_indexers("w", &[usize::MAX], 0, 0, 1, Split::Even).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSlice);
        assert!(e.to_string().contains("signed 64-bit"), "{e}");
        let big = Gqa {
            heads: 1,
            kv_heads: 1,
            head_dim: usize::MAX / 3,
        };
        let shape = [usize::MAX / 3 * 3, 1];
        let e = qkv_indexers("qkv", &shape, big, QkvPart::V, true, 0, 1).unwrap_err();
        assert!(e.to_string().contains("signed 64-bit"), "{e}");
    }

    #[test]
    fn qkv_indexers_count_rows_of_a_separate_projection_from_its_start() {
        let g = Gqa {
            heads: 8,
            kv_heads: 2,
            head_dim: 4,
        };
        // Rank 2 of 4 takes KV head 1: rows 4..8 of k_proj, 36..40 of the fused tensor.
        let k = qkv_indexers("k", &[8, 3], g, QkvPart::K, false, 2, 4).unwrap();
        assert_eq!(k, [Indexer::range(4, 8), Indexer::FULL]);
        let fused = qkv_indexers("qkv", &[48, 3], g, QkvPart::V, true, 2, 4).unwrap();
        assert_eq!(fused, [Indexer::range(44, 48), Indexer::FULL]);
        let e = qkv_indexers("k", &[9, 3], g, QkvPart::K, false, 2, 4).unwrap_err();
        assert!(e.to_string().contains("has 8 rows in dimension 0"), "{e}");
    }

    #[test]
    fn qkv_refuses_what_vllm_cannot_divide() {
        let g = Gqa {
            heads: 12,
            kv_heads: 4,
            head_dim: 2,
        };
        // 12 heads over 8 ranks; 6 ranks over 4 KV heads.
        assert!(qkv_rows("qkv", g, 0, 8).is_err());
        assert!(qkv_rows("qkv", g, 0, 6).is_err());
        let bad = Gqa {
            heads: 6,
            kv_heads: 4,
            head_dim: 2,
        };
        assert!(qkv_rows("qkv", bad, 0, 2).is_err());
    }
}
