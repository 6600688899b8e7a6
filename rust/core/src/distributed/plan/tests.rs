//! Load plans: every needed byte read once across the world, merged gaps, shared steps,
//! balanced reads, the step bound, and what each rank copies out.

use super::*;
use crate::distributed::MERGE_GAP;
use crate::slice::SlicePlan;
use crate::{Dtype, Indexer, TensorInfo};

/// A selection `idx` of a U8 tensor of `shape` whose first byte is `begin` of `file`.
fn need(file: usize, begin: u64, shape: &[usize], idx: &[Indexer]) -> Need {
    let info = TensorInfo {
        name: "t",
        dtype: Dtype::U8,
        shape,
        data_offsets: (0, shape.iter().product()),
    };
    Need::new(file, 0, begin, SlicePlan::new(&info, idx).unwrap().into())
}

fn bytes(file: usize, begin: u64, len: usize) -> Need {
    need(file, begin, &[len], &[])
}

fn step(by: i64) -> Indexer {
    Indexer::Range {
        start: None,
        stop: None,
        step: by,
    }
}

/// Loads `needs` over `data[file]` as every rank would, checking every invariant on the
/// way: every needed byte is read exactly once, nothing twice, bytes no rank needs only in
/// gaps shorter than `MERGE_GAP` between needed ones, and every rank's results equal a
/// direct gather of its selections (through `scatter`, and through `pieces` in batches).
fn simulate(needs: &[Vec<Need>], data: &[Vec<u8>], max_step: u64) -> LoadPlan {
    let plan = LoadPlan::new(needs.to_vec(), max_step).unwrap();
    let mut reads: Vec<Vec<u32>> = data.iter().map(|d| vec![0; d.len()]).collect();
    let mut needed: Vec<Vec<Vec<usize>>> = data.iter().map(|d| vec![Vec::new(); d.len()]).collect();
    for (rank, rank_needs) in needs.iter().enumerate() {
        for n in rank_needs {
            for (o, l) in n.slice().runs() {
                let at = n.begin as usize + o;
                for ranks in &mut needed[n.file][at..at + l] {
                    ranks.push(rank);
                }
            }
        }
    }
    for s in plan.steps() {
        assert!(s.len > 0 && s.len <= max_step.max(1));
        assert!(
            s.needed_by.contains(&s.reader),
            "the reader needs the bytes"
        );
        for p in s.offset..s.offset + s.len {
            reads[s.file][p as usize] += 1;
            for r in &needed[s.file][p as usize] {
                assert!(s.needed_by.contains(r), "rank {r} needs byte {p}");
            }
        }
    }
    for (file, (got, need)) in reads.iter().zip(&needed).enumerate() {
        let mut gap = 0;
        let mut gap_read = false;
        for (p, (&count, ranks)) in got.iter().zip(need).enumerate() {
            assert!(count <= 1, "file {file} byte {p} read {count} times");
            if !ranks.is_empty() {
                assert_eq!(count, 1, "needed byte {p} of file {file} not read");
                assert!(!gap_read || gap < MERGE_GAP, "a gap of {gap} bytes read");
                gap = 0;
                gap_read = false;
            } else {
                gap += 1;
                gap_read |= count == 1;
            }
        }
        assert!(
            !gap_read,
            "file {file}: bytes after the last needed one read"
        );
    }
    let read: u64 = reads.iter().flatten().map(|&c| u64::from(c)).sum();
    assert_eq!(plan.bytes_read(), read);
    for (rank, rank_needs) in needs.iter().enumerate() {
        let mut scattered: Vec<Vec<u8>> = plan
            .result_lens(rank)
            .iter()
            .map(|&l| vec![0xEE; l as usize])
            .collect();
        let mut batched = scattered.clone();
        let parts = plan.parts(rank).unwrap();
        assert!(parts
            .windows(2)
            .all(|w| (w[0].step, w[0].request) < (w[1].step, w[1].request)));
        for p in parts {
            let s = &plan.steps()[p.step];
            let staging = &data[s.file][s.offset as usize..(s.offset + s.len) as usize];
            plan.scatter(rank, p.step, p.request, staging, &mut scattered[p.request])
                .unwrap();
            // Two pieces at a time, going on from each batch's last `next`.
            let mut from = 0;
            loop {
                let batch: Vec<Piece> =
                    plan.pieces(rank, p.step, p.request, from).take(2).collect();
                for q in &batch {
                    let src = &staging[q.step_offset as usize..][..q.len as usize];
                    batched[p.request][q.out_offset as usize..][..q.len as usize]
                        .copy_from_slice(src);
                }
                match batch.last() {
                    Some(q) if batch.len() == 2 => from = q.next,
                    _ => break,
                }
            }
        }
        for (i, n) in rank_needs.iter().enumerate() {
            let (b, e) = n.tensor();
            let mut want = vec![0; n.len() as usize];
            n.slice()
                .gather(&data[n.file][b as usize..e as usize], &mut want)
                .unwrap();
            assert_eq!(scattered[i], want, "rank {rank} request {i}");
            assert_eq!(batched[i], want, "rank {rank} request {i}, in batches");
        }
    }
    plan
}

fn files(len: usize) -> Vec<Vec<u8>> {
    vec![
        (0..len).map(|i| (i * 7 % 251) as u8).collect(),
        (0..len).map(|i| (i * 13 % 241) as u8).collect(),
    ]
}

#[test]
fn disjoint_shards_stay_local() {
    let needs = vec![
        vec![need(0, 0, &[600], &[Indexer::range(0, 300)])],
        vec![need(0, 0, &[600], &[Indexer::range(300, 600)])],
    ];
    let plan = simulate(&needs, &files(1000), 1 << 20);
    assert_eq!(plan.bytes_read_by(0), 300);
    assert_eq!(plan.bytes_read_by(1), 300);
    assert_eq!(plan.bytes_delivered(), 0);
    assert!(plan.steps().iter().all(|s| !s.shared()));
}

#[test]
fn column_shards_of_real_rows_stay_local() {
    // Two ranks, each half of every 1 KiB row: 64 local reads each, nothing broadcast.
    let needs: Vec<Vec<Need>> = (0..2i64)
        .map(|r| {
            vec![need(
                0,
                0,
                &[64, 1024],
                &[Indexer::FULL, Indexer::range(r * 512, (r + 1) * 512)],
            )]
        })
        .collect();
    let plan = simulate(&needs, &files(64 * 1024), 1 << 20);
    assert_eq!(plan.steps().len(), 128);
    assert_eq!(plan.bytes_delivered(), 0);
}

#[test]
fn replicated_tensor_is_read_once_and_balanced() {
    // Four ranks all need two tensors: each is read once, by different ranks.
    let needs: Vec<Vec<Need>> = (0..4)
        .map(|_| vec![bytes(0, 0, 40), bytes(1, 0, 40)])
        .collect();
    let plan = simulate(&needs, &files(200), 1 << 20);
    assert_eq!(plan.bytes_read(), 80);
    assert_eq!(plan.bytes_delivered(), 80 * 3);
    assert_eq!(plan.naive_bytes_read(), 4 * 80);
    assert_ne!(plan.steps()[0].reader, plan.steps()[1].reader);
}

#[test]
fn partial_overlaps_and_strided_runs() {
    let needs = vec![
        vec![need(0, 0, &[5, 10], &[step(2)]), bytes(1, 5, 30)],
        vec![
            bytes(0, 5, 40),
            need(0, 3000, &[40, 300], &[step(3), Indexer::range(7, 250)]),
        ],
        vec![],
        vec![
            need(1, 0, &[10], &[Indexer::range(0, 0)]),
            bytes(1, 30, 10),
            need(0, 2000, &[3000], &[step(5)]),
        ],
    ];
    simulate(&needs, &files(20_000), 7);
    simulate(&needs, &files(20_000), 1000);
}

#[test]
fn gaps_of_a_page_and_more_are_not_read() {
    // Rows 0 and 2 of 5000 bytes: the 5000-byte row between them is not read. Rows 0 and 2
    // of 100 bytes: one read, the row between them included.
    let needs = vec![vec![
        need(0, 0, &[3, 5000], &[step(2)]),
        need(1, 0, &[3, 100], &[step(2)]),
    ]];
    let plan = simulate(&needs, &files(15_000), 1 << 20);
    assert_eq!(plan.steps().len(), 3);
    assert_eq!(plan.bytes_read(), 2 * 5000 + 300);
}

#[test]
fn a_strided_selection_is_one_step_not_one_per_run() {
    // The shape of the load that used to take a step (and a piece) per element.
    let needs = vec![vec![need(0, 0, &[1 << 16], &[step(2)])]];
    let plan = simulate(&needs, &files(1 << 16), 1 << 20);
    assert_eq!(plan.steps().len(), 1);
    assert_eq!(plan.bytes_read(), (1 << 16) - 1);
    assert_eq!(
        plan.parts(0).unwrap(),
        [Part {
            step: 0,
            request: 0
        }]
    );
    let cut = simulate(&needs, &files(1 << 16), 1000);
    assert_eq!(cut.steps().len(), (1 << 16) / 1000 + 1);
}

#[test]
fn ranks_interleaved_element_by_element_share_reads() {
    // Rank 0 the even bytes, rank 1 the odd ones: one shared read, not one per byte.
    let needs = vec![
        vec![need(0, 0, &[1 << 16], &[step(2)])],
        vec![need(
            0,
            0,
            &[1 << 16],
            &[Indexer::Range {
                start: Some(1),
                stop: None,
                step: 2,
            }],
        )],
    ];
    let plan = simulate(&needs, &files(1 << 16), 1 << 20);
    assert_eq!(plan.steps().len(), 1);
    assert_eq!(plan.steps()[0].needed_by, [0, 1]);
}

#[test]
fn a_small_segment_does_not_make_a_large_one_shared() {
    // Rank 1's 10 bytes beside rank 0's 100 KB are read on their own, not broadcast with it.
    let needs = vec![vec![bytes(0, 0, 100_000)], vec![bytes(0, 100_010, 10)]];
    let plan = simulate(&needs, &files(100_100), 1 << 20);
    assert_eq!(plan.bytes_delivered(), 0);
    assert_eq!(plan.bytes_read_by(1), 10);
}

#[test]
fn empty_shares_and_a_world_of_one() {
    let plan = simulate(&[vec![], vec![]], &files(200), 16);
    assert_eq!(plan.bytes_read(), 0);
    assert!(plan.steps().is_empty());
    simulate(&[vec![bytes(0, 3, 100)]], &files(200), 16);
    assert!(LoadPlan::new(Vec::new(), 16).is_err());
}

#[test]
fn shared_reads_balance_by_bytes() {
    // Rank 0 already reads 1000 bytes alone; the shared 600 bytes go to rank 1.
    let needs = vec![
        vec![bytes(0, 0, 1000), bytes(0, 1000, 600)],
        vec![bytes(0, 1000, 600)],
    ];
    let plan = simulate(&needs, &files(2000), 1 << 20);
    assert_eq!(plan.bytes_read_by(1), 600);
    assert_eq!(plan.bytes_read_by(0), 1000);
}

#[test]
fn scatter_refuses_what_does_not_exist() {
    let plan = LoadPlan::new(vec![vec![bytes(0, 0, 10)]], 16).unwrap();
    let mut out = [0u8; 10];
    for (rank, step, request, staging) in
        [(1, 0, 0, 10), (0, 1, 0, 10), (0, 0, 1, 10), (0, 0, 0, 9)]
    {
        let e = plan
            .scatter(rank, step, request, &vec![0; staging], &mut out)
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidSlice, "{e}");
    }
    assert_eq!(plan.pieces(0, 5, 0, 0).count(), 0);
    assert!(plan.parts(3).unwrap().is_empty());
}

#[test]
fn runs_past_the_address_space_are_refused() {
    let e = LoadPlan::new(vec![vec![bytes(0, u64::MAX - 4, 10)]], 16).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidSlice, "{e}");
}
