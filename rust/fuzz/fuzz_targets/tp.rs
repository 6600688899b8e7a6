//! The tensor-parallel rules on arbitrary numbers (lengths, ranks, worlds, head counts, head
//! sizes, shapes of any magnitude): never a panic (this target runs with overflow checks), and
//! every answer equals the rule computed here independently in 128 bits: `shard_range` gives
//! `numpy.array_split`'s share, `qkv_rows` vLLM's rows exactly when the geometry divides and its
//! row count fits in 64 bits, and `qkv_indexers` accepts only a tensor with that many rows.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use safetensors_core::distributed::{
    qkv_indexers, qkv_rows, shard_indexers, shard_range, Gqa, QkvPart, Split,
};
use safetensors_core::Indexer;

/// A number of any magnitude: small ones often, and the edges of 64 bits.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Number {
    Small(u8),
    Pow2(u8),
    NearPow2(u8, bool),
    Any(u64),
}

impl Number {
    fn get(self) -> usize {
        let v: u64 = match self {
            Number::Small(v) => u64::from(v % 16),
            Number::Pow2(b) => 1 << (b % 64),
            Number::NearPow2(b, up) => {
                let p = 1u64 << (b % 64);
                if up {
                    p.wrapping_add(1)
                } else {
                    p.wrapping_sub(1)
                }
            }
            Number::Any(v) => v,
        };
        v as usize
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    len: Number,
    rank: Number,
    world: Number,
    uneven: bool,
    heads: Number,
    kv_heads: Number,
    head_dim: Number,
    part: u8,
    fused: bool,
    rows: Option<Number>,
}

/// vLLM's rows in 128 bits, or `None` where the rule refuses.
fn oracle(g: Gqa, rank: usize, world: usize) -> Option<[(u128, u128); 3]> {
    let (h, k, d, r, w) = (
        g.heads as u128,
        g.kv_heads as u128,
        g.head_dim as u128,
        rank as u128,
        world as u128,
    );
    if w == 0 || r >= w || h == 0 || k == 0 || d == 0 || h % k != 0 || h % w != 0 {
        return None;
    }
    if (h + 2 * k).checked_mul(d)? > u64::MAX as u128 {
        return None;
    }
    let (kv_per, kv_index) = if w >= k {
        if w % k != 0 {
            return None;
        }
        (1, r / (w / k))
    } else {
        if k % w != 0 {
            return None;
        }
        (k / w, r)
    };
    let q_per = h / w;
    let q = (r * q_per * d, (r + 1) * q_per * d);
    let k0 = h * d + kv_index * kv_per * d;
    let v0 = (h + k) * d + kv_index * kv_per * d;
    Some([q, (k0, k0 + kv_per * d), (v0, v0 + kv_per * d)])
}

fn range_of(i: &Indexer) -> (i64, i64) {
    match *i {
        Indexer::Range {
            start: Some(a),
            stop: Some(b),
            step: 1,
        } => (a, b),
        other => panic!("a shard is a plain range, not {other:?}"),
    }
}

fuzz_target!(|input: Input| {
    let (len, rank, world) = (input.len.get(), input.rank.get(), input.world.get());
    let split = if input.uneven {
        Split::Uneven
    } else {
        Split::Even
    };
    match shard_range("w", len, rank, world, split) {
        Ok(r) => {
            assert!(world > 0 && rank < world);
            let (l, rk, w) = (len as u128, rank as u128, world as u128);
            let (base, extra) = (l / w, l % w);
            assert!(split == Split::Uneven || extra == 0);
            let start = rk * base + rk.min(extra);
            let size = base + u128::from(rk < extra);
            assert_eq!((r.start as u128, r.end as u128), (start, start + size));
        }
        Err(e) => {
            assert_eq!(e.kind(), safetensors_core::ErrorKind::InvalidSlice);
            let divides = world > 0 && len % world == 0;
            assert!(world == 0 || rank >= world || (split == Split::Even && !divides));
        }
    }
    if let Ok(idx) = shard_indexers("w", &[len, 3], 0, rank, world, split) {
        let (a, b) = range_of(&idx[0]);
        assert!(0 <= a && a <= b && b as u128 <= len as u128);
        assert_eq!(idx[1], Indexer::FULL);
    }

    let g = Gqa {
        heads: input.heads.get(),
        kv_heads: input.kv_heads.get(),
        head_dim: input.head_dim.get(),
    };
    let want = oracle(g, rank, world);
    match qkv_rows("qkv", g, rank, world) {
        Ok(rows) => {
            let got = [rows.q, rows.k, rows.v].map(|r| (r.start as u128, r.end as u128));
            assert_eq!(Some(got), want, "{g:?} rank {rank} of {world}");
        }
        Err(e) => {
            assert_eq!(e.kind(), safetensors_core::ErrorKind::InvalidSlice);
            assert!(want.is_none(), "{g:?} rank {rank} of {world} refused: {e}");
        }
    }
    let part = match input.part % 3 {
        0 => QkvPart::Q,
        1 => QkvPart::K,
        _ => QkvPart::V,
    };
    let (h, k, d) = (g.heads as u128, g.kv_heads as u128, g.head_dim as u128);
    // In 128 bits; a fused count beyond them (no tensor has it) stops at the largest value.
    let rows = match (input.fused, part) {
        (true, _) => (h + 2 * k).checked_mul(d).unwrap_or(u128::MAX),
        (false, QkvPart::Q) => h * d,
        (false, _) => k * d,
    };
    // Often the geometry's own row count (when it fits), else any number.
    let tensor_rows = match input.rows {
        Some(n) => n.get(),
        None => usize::try_from(rows).unwrap_or(usize::MAX),
    };
    if let Ok(idx) = qkv_indexers("qkv", &[tensor_rows, 2], g, part, input.fused, rank, world) {
        assert_eq!(
            tensor_rows as u128, rows,
            "accepted a tensor that is not the geometry's"
        );
        let (a, b) = range_of(&idx[0]);
        assert!(0 <= a && a <= b && b as u128 <= rows);
        let blocks = want.expect("qkv_indexers accepted what qkv_rows refuses");
        let block = blocks[match part {
            QkvPart::K => 1,
            QkvPart::V => 2,
            _ => 0,
        }];
        assert_eq!(b as u128 - a as u128, block.1 - block.0);
    }
});
