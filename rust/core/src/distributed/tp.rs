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

fn check_rank(tensor: &str, rank: usize, world: usize) -> Result<()> {
    if world == 0 || rank >= world {
        return Err(invalid(
            tensor,
            format!("rank {rank} is not in a world of {world} ranks"),
        ));
    }
    Ok(())
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
    check_rank(tensor, rank, world)?;
    let (base, extra) = (len / world, len % world);
    if extra != 0 && split == Split::Even {
        return Err(invalid(
            tensor,
            format!(
                "a dimension of {len} does not split evenly over {world} ranks \
                 ({len} % {world} = {extra}); ask for an uneven split explicitly if that is meant"
            ),
        ));
    }
    let start = rank * base + rank.min(extra);
    let stop = start + base + usize::from(rank < extra);
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
    out[dim] = Indexer::range(r.start as i64, r.end as i64);
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

/// Rows of the fused `qkv_proj` (q block, then k, then v) that `rank` of `world` takes, by
/// vLLM's rule (see the module comment). Rows of a separate `k_proj`/`v_proj` are
/// `k`/`v` minus their block start, `heads * head_dim` and `(heads + kv_heads) * head_dim`.
///
/// ```
/// use safetensors_core::distributed::{qkv_rows, Gqa};
/// // 8 query heads, 2 KV heads, head_dim 4, world 4: ranks 0,1 share KV head 0.
/// let g = Gqa { heads: 8, kv_heads: 2, head_dim: 4 };
/// let r1 = qkv_rows("qkv", g, 1, 4).unwrap();
/// assert_eq!((r1.q, r1.k, r1.v), (8..16, 32..36, 40..44));
/// ```
pub fn qkv_rows(tensor: &str, g: Gqa, rank: usize, world: usize) -> Result<QkvRows> {
    check_rank(tensor, rank, world)?;
    if g.heads == 0 || g.kv_heads == 0 || g.head_dim == 0 || g.heads % g.kv_heads != 0 {
        return Err(invalid(
            tensor,
            format!(
                "{} query heads, {} KV heads and head_dim {} is not a grouped-query attention \
                 layout (heads must be a positive multiple of the KV heads)",
                g.heads, g.kv_heads, g.head_dim
            ),
        ));
    }
    if g.heads % world != 0 {
        return Err(invalid(
            tensor,
            format!(
                "{} query heads do not divide over {world} ranks; tensor parallelism needs the \
                 world to divide the query heads",
                g.heads
            ),
        ));
    }
    let q_per = g.heads / world;
    // vLLM: tp_size >= total_num_kv_heads → one KV head per rank, replicated across
    // tp_size / total_num_kv_heads ranks; otherwise divided.
    let (kv_per, kv_index) = if world >= g.kv_heads {
        if world % g.kv_heads != 0 {
            return Err(invalid(
                tensor,
                format!(
                    "{world} ranks cannot replicate {} KV heads evenly (the world must be a \
                     multiple of the KV heads when it exceeds them)",
                    g.kv_heads
                ),
            ));
        }
        (1, rank / (world / g.kv_heads))
    } else {
        if g.kv_heads % world != 0 {
            return Err(invalid(
                tensor,
                format!("{} KV heads do not divide over {world} ranks", g.kv_heads),
            ));
        }
        (g.kv_heads / world, rank)
    };
    let hd = g.head_dim;
    let q0 = rank * q_per * hd;
    let k_base = g.heads * hd;
    let v_base = (g.heads + g.kv_heads) * hd;
    let k0 = kv_index * kv_per * hd;
    Ok(QkvRows {
        q: q0..q0 + q_per * hd,
        k: k_base + k0..k_base + k0 + kv_per * hd,
        v: v_base + k0..v_base + k0 + kv_per * hd,
    })
}

/// Total rows a projection has along dimension 0.
pub fn qkv_part_rows(g: Gqa, part: QkvPart) -> usize {
    match part {
        QkvPart::Q => g.heads * g.head_dim,
        QkvPart::K | QkvPart::V => g.kv_heads * g.head_dim,
        QkvPart::Fused => (g.heads + 2 * g.kv_heads) * g.head_dim,
    }
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
