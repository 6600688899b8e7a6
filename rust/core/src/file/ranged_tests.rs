//! Files read from a ranged source (a remote object read on demand): exactly the runs asked
//! for, slices and batches in bounded calls, streams and host loads that batch, and the
//! source's errors passed through unchanged.

use super::*;
use crate::{serialize, Dtype, ErrorKind, TensorView};

/// A [`crate::file::RangeSource`] over bytes in memory that records every call's runs.
struct Recorded {
    bytes: Vec<u8>,
    calls: std::sync::Mutex<Vec<Vec<(u64, usize)>>>,
    fail: bool,
}

impl crate::file::RangeSource for Recorded {
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> crate::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(runs.iter().map(|(at, d)| (*at, d.len())).collect());
        if self.fail {
            return Err(crate::Error::io(
                Path::new("https://example.com/m.safetensors"),
                "GET",
                std::io::Error::other("the server went away"),
            ));
        }
        for (at, dst) in runs.iter_mut() {
            let at = *at as usize;
            dst.copy_from_slice(&self.bytes[at..at + dst.len()]);
        }
        Ok(())
    }
}

fn ranged(bytes: &[u8], fail: bool) -> (std::sync::Arc<SafeFile>, std::sync::Arc<Recorded>) {
    struct Shared(std::sync::Arc<Recorded>);
    impl crate::file::RangeSource for Shared {
        fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> crate::Result<()> {
            self.0.read_runs(runs)
        }
    }
    let rec = std::sync::Arc::new(Recorded {
        bytes: bytes.to_vec(),
        calls: Default::default(),
        fail,
    });
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let f = SafeFile::from_source(
        "https://example.com/m.safetensors",
        &bytes[..8 + n],
        bytes.len() as u64,
        Box::new(Shared(rec.clone())),
        crate::file::OpenOptions::default(),
    )
    .unwrap();
    (std::sync::Arc::new(f), rec)
}

fn grid() -> Vec<u8> {
    let data: Vec<u8> = (0..48u8).collect();
    let small = [7u8, 8, 9];
    serialize(
        [
            ("grid", TensorView::new(Dtype::U8, &[6, 8], &data)),
            ("small", TensorView::new(Dtype::U8, &[3], &small)),
        ],
        None,
    )
    .unwrap()
}

#[test]
fn a_ranged_file_reads_exactly_what_is_asked_and_slices_in_one_call() {
    use crate::slice::Indexer;
    let bytes = grid();
    let local =
        SafeFile::from_memory("local", Box::new(bytes.clone()), Default::default()).unwrap();
    let (f, rec) = ranged(&bytes, false);
    assert_eq!(f.backend(), Backend::Read);
    assert!(!f.is_in_memory() && f.mapped_data().unwrap().is_none());
    assert_eq!(&*f.tensor_bytes("small").unwrap(), &[7, 8, 9]);
    let start = f.header().data_start() as u64;
    let (b, _) = f.info("small").unwrap().data_offsets;
    assert_eq!(
        rec.calls.lock().unwrap().as_slice(),
        &[vec![(start + b as u64, 3)]]
    );
    // Rows 1..5 step 2, columns 2..6: four runs of 4 bytes, asked for in one call.
    let idx = [
        Indexer::Range {
            start: Some(1),
            stop: Some(5),
            step: 2,
        },
        Indexer::Range {
            start: Some(2),
            stop: Some(6),
            step: 1,
        },
    ];
    let plan = f.plan_slice("grid", &idx).unwrap();
    let mut got = vec![0u8; plan.byte_len()];
    f.read_slice("grid", &plan, &mut got).unwrap();
    let mut want = vec![0u8; plan.byte_len()];
    local.read_slice("grid", &plan, &mut want).unwrap();
    assert_eq!(got, want);
    assert_eq!(got, [10, 11, 12, 13, 26, 27, 28, 29]);
    let calls = rec.calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    let (g, _) = f.info("grid").unwrap().data_offsets;
    let at = start + g as u64;
    assert_eq!(calls[1], vec![(at + 10, 4), (at + 26, 4)]);
    drop(calls);
    assert_eq!(f.bytes_read(), 3 + 8);
    // Outside the data buffer: the caller's range, refused before the source is asked.
    let mut dst = [0u8; 4];
    let e = f
        .read_data(f.header().data_len() as u64 - 2, &mut dst)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice, "{e}");
    assert_eq!(rec.calls.lock().unwrap().len(), 2);
}

#[test]
fn a_ranged_source_streams_and_its_errors_pass_through_unchanged() {
    let bytes = grid();
    let (f, _) = ranged(&bytes, false);
    let got: Vec<(String, Vec<u8>)> = crate::TensorStream::new(f, None, 1 << 20)
        .unwrap()
        .map(|t| {
            let t = t.unwrap();
            (t.name.clone(), t.data().to_vec())
        })
        .collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, (0..48u8).collect::<Vec<_>>());
    assert_eq!(got[1], ("small".to_string(), vec![7, 8, 9]));
    let (f, _) = ranged(&bytes, true);
    let e = f.tensor_bytes("small").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    let text = e.to_string();
    assert!(
        text.contains("the server went away") && text.matches("example.com").count() == 1,
        "{text}"
    );
}

/// Four small tensors back to back.
fn four() -> Vec<u8> {
    let a = [1u8; 5];
    let b = [2u8; 7];
    let c = [3u8; 11];
    let d = [4u8; 13];
    serialize(
        [
            ("a", TensorView::new(Dtype::U8, &[5], &a)),
            ("b", TensorView::new(Dtype::U8, &[7], &b)),
            ("c", TensorView::new(Dtype::U8, &[11], &c)),
            ("d", TensorView::new(Dtype::U8, &[13], &d)),
        ],
        None,
    )
    .unwrap()
}

/// What a stream delivers, up to and including its first error (a failed stream repeats it).
fn stream_of(f: std::sync::Arc<SafeFile>, budget: u64) -> Vec<crate::Result<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for t in crate::TensorStream::new(f, None, budget).unwrap() {
        let failed = t.is_err();
        out.push(t.map(|t| (t.name.clone(), t.data().to_vec())));
        if failed {
            break;
        }
    }
    out
}

#[test]
fn a_stream_reads_the_small_tensors_of_a_ranged_file_together_within_its_budget() {
    let bytes = four();
    let want: Vec<(String, Vec<u8>)> =
        [("a", 1u8, 5usize), ("b", 2, 7), ("c", 3, 11), ("d", 4, 13)]
            .iter()
            .map(|&(n, v, len)| (n.to_string(), vec![v; len]))
            .collect();
    // A budget that holds them all: one call with the four runs.
    let (f, rec) = ranged(&bytes, false);
    let got: Vec<_> = stream_of(f, 1 << 20)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got, want);
    let calls = rec.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].iter().map(|r| r.1).collect::<Vec<_>>(),
        [5, 7, 11, 13]
    );
    // A budget of 20 bytes: batches of what fits with the tensors still held (the consumer
    // here takes and keeps nothing, so each batch starts with an empty budget).
    let (f, rec) = ranged(&bytes, false);
    let got: Vec<_> = stream_of(f, 20).into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(got, want);
    let calls = rec.calls.lock().unwrap().clone();
    assert!(calls.len() >= 2, "{calls:?}");
    for call in &calls {
        let sum: usize = call.iter().map(|r| r.1).sum();
        assert!(sum <= 20 || call.len() == 1, "{calls:?}");
    }
    // A failing source: the stream ends with its error, nothing else delivered.
    let (f, _) = ranged(&bytes, true);
    let got = stream_of(f, 1 << 20);
    assert_eq!(got.len(), 1);
    let e = got[0].as_ref().unwrap_err();
    assert!(e.to_string().contains("the server went away"), "{e}");
}

#[test]
fn a_stream_reads_repeated_requests_of_a_ranged_file_each_on_its_own() {
    let bytes = four();
    let (f, rec) = ranged(&bytes, false);
    let requests = [
        crate::Request::tensor("b").in_file(0),
        crate::Request::tensor("b").in_file(0),
        crate::Request::tensor("c").in_file(0),
    ];
    let files = [f];
    let got: Vec<(String, Vec<u8>)> = crate::TensorStream::open(
        crate::Source::Files(&files),
        Some(&requests),
        crate::StreamOptions::default(),
    )
    .unwrap()
    .map(|t| {
        let t = t.unwrap();
        (t.name.clone(), t.data().to_vec())
    })
    .collect();
    assert_eq!(
        got,
        [
            ("b".to_string(), vec![2u8; 7]),
            ("b".to_string(), vec![2u8; 7]),
            ("c".to_string(), vec![3u8; 11])
        ]
    );
    // No call holds two runs that overlap.
    for call in rec.calls.lock().unwrap().iter() {
        for w in call.windows(2) {
            assert!(w[0].0 + w[0].1 as u64 <= w[1].0, "{call:?}");
        }
    }
}

#[test]
fn a_batch_of_overlapping_reads_is_refused_before_the_source_is_asked() {
    let bytes = four();
    let (f, rec) = ranged(&bytes, false);
    let mut a = [0u8; 6];
    let mut b = [0u8; 6];
    let mut runs: Vec<(u64, &mut [u8])> = vec![(0, &mut a), (4, &mut b)];
    let e = f.read_batch(&mut runs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice, "{e}");
    assert!(rec.calls.lock().unwrap().is_empty());
    // Disjoint, in any order: one call, the data offsets given back unchanged.
    let mut runs: Vec<(u64, &mut [u8])> = vec![(6, &mut a), (0, &mut b)];
    f.read_batch(&mut runs).unwrap();
    assert_eq!((runs[0].0, runs[1].0), (6, 0));
    assert_eq!(a, [2, 2, 2, 2, 2, 2]);
    assert_eq!(b, [1, 1, 1, 1, 1, 2]);
    assert_eq!(rec.calls.lock().unwrap().len(), 1);
}

#[test]
fn a_host_load_from_a_ranged_file_reads_its_tensors_and_slices_in_one_call() {
    use crate::slice::Indexer;
    let bytes = grid();
    let local = std::sync::Arc::new(
        SafeFile::from_memory("local", Box::new(bytes.clone()), Default::default()).unwrap(),
    );
    let (f, rec) = ranged(&bytes, false);
    let rows = vec![Indexer::Range {
        start: Some(1),
        stop: Some(6),
        step: 2,
    }];
    let requests = [
        crate::Request::tensor("small").in_file(0),
        crate::Request::slice("grid", rows).in_file(0),
    ];
    let load = |file: std::sync::Arc<SafeFile>| {
        let files = [file];
        let (plan, sources) =
            crate::upload::UploadPlan::of(crate::Source::Files(&files), Some(&requests), 64)
                .unwrap();
        let mut out = vec![0xAAu8; plan.total() as usize];
        plan.read_into(&sources, &mut out).unwrap();
        out
    };
    assert_eq!(load(f), load(local));
    let calls = rec.calls.lock().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].len(), 4, "{calls:?}");
}

#[test]
fn a_refused_batch_leaves_its_offsets_as_given_and_reads_nothing() {
    let bytes = grid();
    let (f, rec) = ranged(&bytes, false);
    let data_len = f.header().data_len() as u64;
    let (mut a, mut b) = (vec![0u8; 4], vec![0u8; 4]);
    // The second run ends past the data: refused before anything is read.
    let mut runs: Vec<(u64, &mut [u8])> = vec![(2, &mut a), (data_len - 2, &mut b)];
    let e = f.read_batch(&mut runs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice, "{e}");
    assert_eq!(runs[0].0, 2);
    assert_eq!(runs[1].0, data_len - 2);
    assert!(rec.calls.lock().unwrap().is_empty());
    // The same runs, once in bounds, read their bytes.
    runs[1].0 = data_len - 4;
    f.read_batch(&mut runs).unwrap();
    assert_eq!(runs[0].0, 2);
    let start = f.header().data_start();
    assert_eq!(&*runs[0].1, &bytes[start + 2..start + 6]);
    assert_eq!(&*runs[1].1, &bytes[bytes.len() - 4..]);
}

#[test]
fn a_slice_of_millions_of_runs_reaches_a_ranged_source_in_bounded_calls() {
    use crate::slice::Indexer;
    // Every other byte of a 1-D tensor: one run per selected byte, twice RANGED_RUNS and some.
    let n = 2 * (2 * crate::file::RANGED_RUNS + 5);
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let bytes = serialize([("v", TensorView::new(Dtype::U8, &[n], &data))], None).unwrap();
    let (f, rec) = ranged(&bytes, false);
    let plan = f
        .plan_slice(
            "v",
            &[Indexer::Range {
                start: None,
                stop: None,
                step: 2,
            }],
        )
        .unwrap();
    let mut got = vec![0u8; plan.byte_len()];
    f.read_slice("v", &plan, &mut got).unwrap();
    let want: Vec<u8> = data.iter().step_by(2).copied().collect();
    assert!(got == want, "the slice's bytes differ");
    let calls = rec.calls.lock().unwrap();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        [crate::file::RANGED_RUNS, crate::file::RANGED_RUNS, 5]
    );
    assert_eq!(f.bytes_read(), want.len() as u64);
}

#[test]
fn many_reads_of_a_remote_file_reach_its_source_in_one_call() {
    let bytes = grid();
    let (f, rec) = ranged(&bytes, false);
    let data = f.tensor_bytes("grid").unwrap().to_vec();
    let (mut a, mut b) = (vec![0u8; 5], vec![0u8; 9]);
    let mut reads: Vec<(&SafeFile, u64, &mut [u8])> =
        vec![(&f, 30, &mut a[..]), (&f, 2, &mut b[..])];
    let before = rec.calls.lock().unwrap().len();
    crate::file::read_many(&mut reads).unwrap();
    assert_eq!(rec.calls.lock().unwrap().len(), before + 1);
    assert!(a[..] == data[30..35] && b[..] == data[2..11]);
}
