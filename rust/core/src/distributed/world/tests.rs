//! Needs gathered by rank with files told apart by identity, and a plan's steps read out of the
//! files into one buffer with every rule checked first.

use super::*;
use crate::slice::Indexer;
use crate::{serialize, Dtype, ErrorKind, TensorView};

/// A file of "a" (U8 [4, 8], bytes 0..32) and "b" (U8 [16], bytes 100..116).
fn file() -> Arc<SafeFile> {
    let a: Vec<u8> = (0..32).collect();
    let b: Vec<u8> = (100..116).collect();
    let bytes = serialize(
        [
            ("a", TensorView::new(Dtype::U8, &[4, 8], &a)),
            ("b", TensorView::new(Dtype::U8, &[16], &b)),
        ],
        None,
    )
    .unwrap();
    Arc::new(SafeFile::from_memory("mem", Box::new(bytes), Default::default()).unwrap())
}

fn rows(start: i64, stop: i64) -> Indexer {
    Indexer::Range {
        start: Some(start),
        stop: Some(stop),
        step: 1,
    }
}

fn slice(f: &SafeFile, tensor: usize, indexers: &[Indexer]) -> Arc<SlicePlan> {
    let name = f.header().name_at(tensor).unwrap();
    Arc::new(SlicePlan::new(&f.info(name).unwrap(), indexers).unwrap())
}

/// Every step of the plan read at once, then each rank's results scattered out of them.
fn results(plan: &FilePlan, rank: usize) -> Vec<Vec<u8>> {
    let steps: Vec<usize> = (0..plan.plan.steps().len()).collect();
    let total: u64 = plan.plan.steps().iter().map(|s| s.len).sum();
    let mut staging = vec![0u8; total as usize];
    plan.read_steps(&steps, &mut staging).unwrap();
    let mut out: Vec<Vec<u8>> = plan
        .plan
        .result_lens(rank)
        .iter()
        .map(|&l| vec![0u8; l as usize])
        .collect();
    let mut at = 0usize;
    for (i, s) in plan.plan.steps().iter().enumerate() {
        let bytes = &staging[at..at + s.len as usize];
        for p in plan.plan.parts(rank).unwrap() {
            if p.step == i {
                plan.plan
                    .scatter(rank, i, p.request, bytes, &mut out[p.request])
                    .unwrap();
            }
        }
        at += s.len as usize;
    }
    out
}

#[test]
fn ranks_get_their_selections_and_one_file_added_twice_is_one_file() {
    let f = file();
    let mut needs = Needs::new(2);
    // Rank 0: rows 0..2 of "a" and all of "b"; rank 1: rows 2..4 of "a" and all of "b".
    needs.add(0, &f, 0, slice(&f, 0, &[rows(0, 2)])).unwrap();
    needs.add(0, &f, 1, slice(&f, 1, &[])).unwrap();
    let other = Arc::clone(&f);
    needs
        .add(1, &other, 0, slice(&f, 0, &[rows(2, 4)]))
        .unwrap();
    needs.add(1, &other, 1, slice(&f, 1, &[])).unwrap();
    let plan = needs.build(1 << 20).unwrap();
    assert_eq!(plan.files.len(), 1, "one file by identity");
    assert_eq!(plan.plan.world(), 2);
    let b: Vec<u8> = (100..116).collect();
    assert_eq!(
        results(&plan, 0),
        vec![(0..16).collect::<Vec<u8>>(), b.clone()]
    );
    assert_eq!(results(&plan, 1), vec![(16..32).collect::<Vec<u8>>(), b]);
    assert_eq!(plan.name_of(&plan.plan.needs(1)[1]), "b");
    // The needs moved into the plan: building again plans nothing new for anyone.
    let again = needs.build(1 << 20).unwrap();
    assert!(again.plan.steps().is_empty());
}

#[test]
fn a_second_open_of_the_same_bytes_is_another_file() {
    let (f, g) = (file(), file());
    let mut needs = Needs::new(1);
    needs.add(0, &f, 1, slice(&f, 1, &[])).unwrap();
    needs.add(0, &g, 1, slice(&g, 1, &[])).unwrap();
    needs.add(0, &f, 0, slice(&f, 0, &[])).unwrap();
    let plan = needs.build(1 << 20).unwrap();
    assert_eq!(plan.files.len(), 2);
    let got = results(&plan, 0);
    assert_eq!(got[0], got[1]);
    assert_eq!(got[2], (0..32).collect::<Vec<u8>>());
}

#[test]
fn a_rank_outside_the_world_or_a_missing_tensor_is_refused() {
    let f = file();
    let mut needs = Needs::new(2);
    let e = needs.add(2, &f, 0, slice(&f, 0, &[])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    assert!(
        e.to_string()
            .contains("rank 2 is not in a world of 2 ranks"),
        "{e}"
    );
    let e = needs.add(0, &f, 9, slice(&f, 0, &[])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    assert!(e.to_string().contains("position 9"), "{e}");
    assert!(Needs::new(0).build(16).is_err(), "a world of no ranks");
}

#[test]
fn reading_steps_checks_every_step_and_the_buffer_length_before_reading() {
    let f = file();
    let mut needs = Needs::new(1);
    needs.add(0, &f, 0, slice(&f, 0, &[])).unwrap();
    let plan = needs.build(8).unwrap();
    let n = plan.plan.steps().len();
    assert_eq!(n, 4, "32 bytes in steps of at most 8");
    let mut buf = vec![0xAAu8; 16];
    let e = plan.read_steps(&[0, n], &mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    assert!(e.to_string().contains(&format!("no step {n}")), "{e}");
    assert!(buf.iter().all(|&b| b == 0xAA), "nothing read");
    let e = plan.read_steps(&[1], &mut buf).unwrap_err();
    assert!(
        e.to_string()
            .contains("step 1 of 4 needs a 8-byte buffer, got 16"),
        "{e}"
    );
    let e = plan.read_steps(&[0, 1, 2], &mut buf).unwrap_err();
    assert!(
        e.to_string().contains("3 steps needs a 24-byte buffer"),
        "{e}"
    );
    plan.read_steps(&[3, 1], &mut buf).unwrap();
    let want: Vec<u8> = (24..32).chain(8..16).collect();
    assert_eq!(buf, want, "steps one after another, in the order asked");
    plan.read_steps(&[], &mut []).unwrap();
}
