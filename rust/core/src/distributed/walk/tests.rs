//! A rank's walk over a plan (turns of its own reads bounded, shared steps alone, other ranks'
//! reads passed over), the collective's size checked, and the device layout's rule.

use super::*;
use crate::slice::SlicePlan;
use crate::{Dtype, ErrorKind, TensorInfo};

/// The whole of a U8 tensor of `len` bytes at `begin` of file 0 (tensor number `tensor`).
fn whole(tensor: usize, begin: u64, len: usize) -> Need {
    let shape = [len];
    let info = TensorInfo {
        name: "t",
        dtype: Dtype::U8,
        shape: &shape,
        data_offsets: (0, len),
    };
    Need::new(0, tensor, begin, SlicePlan::new(&info, &[]).unwrap().into())
}

/// Each turn of `rank`'s walk as (the first byte of each of its steps, shared, reads).
fn turns(plan: &LoadPlan, rank: usize, max: u64) -> Vec<(Vec<u64>, bool, bool)> {
    let walk = plan.walk(rank, max).unwrap();
    let mut covered = 0;
    let out = walk
        .turns
        .iter()
        .map(|t| {
            assert_eq!(t.first, covered, "turns take the walk's steps in order");
            covered += t.count;
            let steps = walk.steps_of(t);
            let len: u64 = steps.iter().map(|&i| plan.steps()[i].len).sum();
            assert_eq!(len, t.len);
            for &i in steps {
                assert_eq!(plan.steps()[i].reader, t.reader);
            }
            let at = steps.iter().map(|&i| plan.steps()[i].offset).collect();
            (at, t.shared, t.reads)
        })
        .collect();
    assert_eq!(covered, walk.steps.len());
    out
}

/// Rank 0 alone needs 1000 bytes at 0, 10000, 20000 and 50000, rank 1 alone at 40000, both at
/// 30000 (gaps far above the merge gap: one step each).
fn two_ranks() -> LoadPlan {
    let r0 = vec![
        whole(0, 0, 1000),
        whole(1, 10_000, 1000),
        whole(2, 20_000, 1000),
        whole(3, 30_000, 1000),
        whole(5, 50_000, 1000),
    ];
    let r1 = vec![whole(3, 30_000, 1000), whole(4, 40_000, 1000)];
    LoadPlan::new(vec![r0, r1], 1 << 30).unwrap()
}

#[test]
fn a_rank_reads_its_own_steps_together_up_to_the_bound_and_each_shared_step_alone() {
    let plan = two_ranks();
    assert_eq!(
        turns(&plan, 0, 2500),
        [
            (vec![0, 10_000], false, true),
            (vec![20_000], false, true),
            (vec![30_000], true, plan.steps()[3].reader == 0),
            (vec![50_000], false, true),
        ]
    );
    // Rank 1 passes over rank 0's own steps and takes part in the shared one.
    assert_eq!(
        turns(&plan, 1, 2500),
        [
            (vec![30_000], true, plan.steps()[3].reader == 1),
            (vec![40_000], false, true),
        ]
    );
    // A bound below a step's length: every step is a turn of its own.
    assert_eq!(turns(&plan, 0, 1).len(), 5);
}

#[test]
fn no_turn_stages_more_than_the_cap_whatever_the_bound() {
    let len = (MAX_TURN_BYTES / 2 + 1) as usize;
    let needs = vec![vec![
        whole(0, 0, len),
        whole(1, len as u64 + 10_000, len),
        whole(2, 2 * len as u64 + 20_000, 10),
    ]];
    let plan = LoadPlan::new(needs, u64::MAX).unwrap();
    let got = turns(&plan, 0, u64::MAX);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[1].0.len(),
        2,
        "the small step joins the second large one"
    );
    // A step longer than the cap is a turn of its own, not refused.
    let plan = LoadPlan::new(
        vec![vec![whole(0, 0, 2 * MAX_TURN_BYTES as usize)]],
        u64::MAX,
    )
    .unwrap();
    let walk = plan.walk(0, u64::MAX).unwrap();
    assert_eq!(walk.turns.len(), 1);
    assert_eq!(walk.turns[0].len, 2 * MAX_TURN_BYTES);
}

#[test]
fn a_rank_or_a_collective_outside_the_world_is_refused() {
    let plan = two_ranks();
    let e = plan.walk(2, 1 << 20).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    assert!(e.to_string().contains("rank 2"), "{e}");
    assert!(plan.layout(7, 0, |_| String::new()).is_err());
    plan.check_collective(1, 2).unwrap();
    let e = plan.check_collective(0, 3).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    assert!(
        e.to_string()
            .contains("for 2 ranks but the collective has 3"),
        "{e}"
    );
    assert!(plan.check_collective(2, 2).is_err());
}

#[test]
fn a_rank_s_results_are_laid_out_in_request_order_on_the_upload_alignment() {
    let plan = two_ranks();
    let name = |n: &Need| format!("tensor {}", n.tensor);
    let l = plan.layout(0, 0, name).unwrap();
    assert_eq!(l.alignment, upload::DEFAULT_ALIGNMENT as u64);
    assert_eq!(l.offsets, [0, 1024, 2048, 3072, 4096]);
    assert_eq!(l.total, 5096);
    let l = plan.layout(1, 1, name).unwrap();
    assert_eq!((l.offsets, l.total), (vec![0, 1000], 2000));
    let e = plan.layout(0, 3, name).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    // Padding past 2^64 names the tensor that does not fit.
    // (Rank 1's two fit: 0 and 2^63.)
    assert_eq!(plan.layout(1, 1 << 63, name).unwrap().offsets, [0, 1 << 63]);
    let e = plan.layout(0, 1 << 63, name).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ValidationOverflow);
    assert!(e.to_string().contains("tensor `tensor 2`"), "{e}");
}
