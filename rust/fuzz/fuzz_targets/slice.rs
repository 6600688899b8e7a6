//! Slice planning over arbitrary shapes and indexers: never panics (shapes may overflow), and a
//! plan's runs are exactly the selected elements, in order, merged, inside the tensor; the runs
//! within a range of the tensor or of the result are those runs, clipped.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use safetensors_core::{Dtype, Indexer, SlicePlan, TensorInfo};

#[derive(Arbitrary, Debug)]
enum Idx {
    Select(i64),
    Range(Option<i64>, Option<i64>, i64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    dtype: u8,
    shape: Vec<u64>,
    indexers: Vec<Idx>,
    /// A range (of the tensor, then of the result) and a result offset to start from.
    range: (u16, u16, u16),
}

fuzz_target!(|input: Input| {
    let dtype = Dtype::ALL[usize::from(input.dtype) % Dtype::ALL.len()];
    let shape: Vec<usize> = input.shape.iter().take(6).map(|&d| d as usize).collect();
    let indexers: Vec<Indexer> = input
        .indexers
        .iter()
        .take(7)
        .map(|i| match *i {
            Idx::Select(p) => Indexer::Select(p),
            Idx::Range(start, stop, step) => Indexer::Range { start, stop, step },
        })
        .collect();
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let len = numel.and_then(|n| dtype.byte_size(n)).unwrap_or(0);
    let info = TensorInfo { name: "t", dtype, shape: &shape, data_offsets: (0, len) };
    let Ok(plan) = SlicePlan::new(&info, &indexers) else { return };
    // Huge valid tensors can have billions of runs: walk the first 100,000 (the planner is lazy).
    const WALK: usize = 100_000;
    let mut total = 0usize;
    let mut walked = 0usize;
    let mut last_end: Option<usize> = None;
    for (offset, run) in plan.runs().take(WALK) {
        walked += 1;
        assert!(run > 0 && offset + run <= len, "run {offset}+{run} outside {len}");
        if let Some(end) = last_end {
            assert!(offset > end, "runs overlap, touch or go backwards");
        }
        last_end = Some(offset + run);
        total += run;
    }
    if walked < WALK {
        assert_eq!(total, plan.byte_len());
    }
    let elems: usize = plan.shape().iter().product();
    assert_eq!(Some(plan.byte_len()), dtype.byte_size(elems));
    // Small tensors: the copy equals picking the selected elements one by one.
    if len <= 4096 && dtype.bits() >= 8 && shape.iter().all(|&d| d <= 4096) {
        let src: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
        let mut out = vec![0u8; plan.byte_len()];
        plan.gather(&src, &mut out).unwrap();
        assert_eq!(out, oracle(&shape, &indexers, dtype.bits() / 8, &src));
        clipped(&plan, input.range);
    }
});

/// `runs_in_tensor` and `runs_in_result` (from an offset) against the runs, byte by byte.
fn clipped(plan: &SlicePlan, (lo, hi, from): (u16, u16, u16)) {
    let (lo, hi, from) = (usize::from(lo), usize::from(hi), usize::from(from));
    let bytes: Vec<(usize, usize)> =
        plan.runs().flat_map(|(o, l)| o..o + l).enumerate().map(|(out, src)| (src, out)).collect();
    let flat = |parts: safetensors_core::Placed<'_>| -> Vec<(usize, usize)> {
        parts.flat_map(|(src, out, len)| (0..len).map(move |k| (src + k, out + k))).collect()
    };
    let want: Vec<_> = bytes.iter().copied().filter(|b| (lo..hi).contains(&b.0)).collect();
    assert_eq!(flat(plan.runs_in_tensor(lo, hi)), want);
    let (lo, hi) = (lo.min(plan.byte_len()), hi.min(plan.byte_len()));
    let want: Vec<_> = bytes.iter().copied().filter(|b| (lo..hi).contains(&b.1) && b.1 >= from).collect();
    assert_eq!(flat(plan.runs_in_result(lo, hi).starting_at(from)), want);
}

/// Positions each dimension selects, by Python's rules (the plan succeeded, so all are valid).
fn positions(indexer: Option<&Indexer>, size: usize) -> Vec<usize> {
    let resolve = |p: i64| if p < 0 { (p + size as i64) as usize } else { p as usize };
    match indexer {
        None => (0..size).collect(),
        Some(Indexer::Select(p)) => vec![resolve(*p)],
        Some(Indexer::Range { start, stop, step }) => {
            let start = start.map_or(0, resolve);
            let stop = stop.map_or(size, resolve);
            (start..stop.max(start)).step_by(*step as usize).collect()
        }
    }
}

/// The slice's bytes, element by element in row-major order.
fn oracle(shape: &[usize], indexers: &[Indexer], elem: usize, src: &[u8]) -> Vec<u8> {
    let picks: Vec<Vec<usize>> = shape.iter().enumerate().map(|(a, &d)| positions(indexers.get(a), d)).collect();
    let mut strides = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let total: usize = picks.iter().map(Vec::len).product();
    let mut out = Vec::with_capacity(total * elem);
    for mut flat in 0..total {
        let mut offset = 0;
        for a in (0..shape.len()).rev() {
            offset += picks[a][flat % picks[a].len()] * strides[a];
            flat /= picks[a].len();
        }
        out.extend_from_slice(&src[offset * elem..(offset + 1) * elem]);
    }
    out
}
