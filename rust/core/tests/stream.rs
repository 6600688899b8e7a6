//! Host streaming: every tensor's (or slice's) bytes equal `tensor_bytes` (or `read_slice`), in
//! file order, from a file, a checkpoint or a list of files, with every backend; each delivered
//! item says what it is; the in-flight bound holds (instrumented); a caller holding the budget
//! gets `BudgetExceeded`, not a hang, and goes on once it drops what it holds; early drop and
//! errors end the stream cleanly, and an error is reported again by every later call.

mod common;

use std::path::Path;
use std::sync::{mpsc, Arc};

use common::scratch_dir;
use common::sharded::{write_sharded, Spec};
use safetensors_core::{
    serialize_to_file, Backend, Checkpoint, Dtype, Error, ErrorKind, Indexer, Request, SafeFile,
    Source, StreamOptions, TensorStream, TensorView,
};

const LENS: [usize; 7] = [1000, 70_000, 4096, 300_000, 12, 50_000, 65_536];

fn write_sample(path: &Path) {
    let datas: Vec<Vec<u8>> = LENS
        .iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| (i * 13 + t) as u8).collect())
        .collect();
    let names: Vec<String> = (0..LENS.len()).map(|i| format!("t{i}")).collect();
    let shapes: Vec<[usize; 1]> = LENS.iter().map(|&n| [n]).collect();
    serialize_to_file(
        (0..LENS.len()).map(|i| {
            (
                names[i].as_str(),
                TensorView::new(Dtype::U8, &shapes[i], &datas[i]),
            )
        }),
        None,
        path,
    )
    .unwrap();
}

#[test]
fn streams_every_tensor_in_file_order_within_the_bound_with_every_backend() {
    let dir = scratch_dir("streams_every_tensor");
    let path = dir.join("s.safetensors");
    write_sample(&path);
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let f = Arc::new(SafeFile::open(&path, backend).unwrap());
        let bound = 100_000u64;
        let mut stream = TensorStream::new(f.clone(), None, bound).unwrap();
        let mut seen = Vec::new();
        for t in stream.by_ref() {
            let t = t.unwrap();
            assert_eq!(t.data(), f.tensor_bytes(&t.name).unwrap().as_ref());
            seen.push(t.index);
        }
        assert_eq!(seen, (0..LENS.len()).collect::<Vec<_>>(), "{backend:?}");
        // t3 (300,000 bytes) exceeds the bound: delivered alone, so the peak is exactly it.
        assert_eq!(stream.peak_inflight_bytes(), 300_000, "{backend:?}");
        assert_eq!(stream.inflight_bytes(), 0);
    }
}

#[test]
fn a_subset_streams_only_its_tensors_and_the_bound_holds_without_big_tensors() {
    let dir = scratch_dir("a_subset_streams");
    let path = dir.join("s.safetensors");
    write_sample(&path);
    let f = Arc::new(SafeFile::open(&path, Backend::Read).unwrap());
    let mut stream = TensorStream::new(f.clone(), Some(vec![5, 1, 6, 0]), 140_000).unwrap();
    let mut held = Vec::new();
    let mut names = Vec::new();
    for t in stream.by_ref() {
        let t = t.unwrap();
        names.push(t.name.clone());
        held.push(t);
        if held.len() > 1 {
            held.remove(0);
        }
    }
    assert_eq!(names, ["t0", "t1", "t5", "t6"]);
    let peak = stream.peak_inflight_bytes();
    assert!((70_000..=140_000).contains(&peak), "peak {peak}");
    assert_eq!(f.bytes_read(), (1000 + 70_000 + 50_000 + 65_536) as u64);
    // A position past the end is refused up front.
    let err = TensorStream::new(f, Some(vec![7]), 1).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::TensorNotFound);
}

#[test]
fn a_file_that_shrinks_mid_stream_ends_it_with_io_and_dropping_early_is_prompt() {
    let dir = scratch_dir("a_file_that_shrinks");
    let path = dir.join("s.safetensors");
    write_sample(&path);
    for backend in [Backend::Read, Backend::Direct] {
        let f = Arc::new(SafeFile::open(&path, backend).unwrap());
        // Bound 1: one tensor at a time, so nothing past t0 is read before the truncation.
        let mut stream = TensorStream::new(f.clone(), None, 1).unwrap();
        let first = stream.next().unwrap().unwrap();
        assert_eq!(first.name, "t0");
        let cut = f.header().data_start() + 2000;
        common::truncate(&path, cut as u64);
        drop(first);
        let err = stream.next().unwrap().err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Io, "{backend:?}");
        // The stream failed: every later call says so again, never a normal end.
        for _ in 0..3 {
            let again = stream.next().unwrap().err().unwrap();
            assert_eq!(again.to_string(), err.to_string());
        }
        assert_eq!(stream.inflight_bytes(), 0, "everything is freed");
        write_sample(&path);
    }
    // Abandoning a stream while the reader waits on the budget returns (no hang).
    let f = Arc::new(SafeFile::open(&path, Backend::Read).unwrap());
    let mut stream = TensorStream::new(f, None, 1).unwrap();
    let held = stream.next().unwrap().unwrap();
    drop(stream);
    assert_eq!(held.data().len(), 1000);
}

#[test]
fn a_stream_dropped_while_a_large_tensor_is_read_stops_reading_it() {
    // One 1 GiB tensor in a sparse file (reads of holes are cheap, but not free): the reader
    // reads it in 64 MiB pieces and looks for cancellation between them, so dropping the stream
    // returns long before the whole tensor is read; the bytes it did read are counted.
    let dir = scratch_dir("dropped_during_a_large_tensor");
    let path = dir.join("big.safetensors");
    let gib = 1usize << 30;
    let header =
        format!("{{\"big\":{{\"dtype\":\"U8\",\"shape\":[{gib}],\"data_offsets\":[0,{gib}]}}}}");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len((bytes.len() + gib) as u64).unwrap();
    drop(file);
    for backend in [Backend::Read, Backend::Direct] {
        let f = Arc::new(SafeFile::open(&path, backend).unwrap());
        let stream = TensorStream::new(f.clone(), None, u64::MAX).unwrap();
        // Let the reader start on the tensor, then abandon the stream.
        while f.bytes_read() == 0 {
            std::thread::yield_now();
        }
        drop(stream);
        let read = f.bytes_read();
        assert!(
            read < gib as u64,
            "{backend:?}: the whole tensor was read ({read} bytes) before the drop returned"
        );
    }
}

/// Three shards of tensors of several dtypes and sizes; `s1.big` is larger than [`BOUND`].
fn three_shards(dir: &Path) -> std::path::PathBuf {
    let t = |n: &str, d: Dtype, s: &[usize]| -> Spec { (n.to_owned(), d, s.to_vec()) };
    write_sharded(
        dir,
        &[
            vec![
                t("s0.w", Dtype::F32, &[64, 33]),
                t("s0.b", Dtype::F16, &[7]),
                t("s0.e", Dtype::U8, &[0, 4]),
                t("s0.m", Dtype::BF16, &[40, 300]),
            ],
            vec![
                t("s1.big", Dtype::U8, &[3, 50_000]),
                t("s1.x", Dtype::I64, &[5, 6, 7]),
            ],
            vec![
                t("s2.a", Dtype::F64, &[9, 100]),
                t("s2.z", Dtype::I8, &[33_333]),
            ],
        ],
    )
}

const BOUND: u64 = 60_000;

#[test]
fn streams_a_checkpoint_shard_by_shard_saying_what_each_tensor_is_with_every_backend() {
    let dir = scratch_dir("streams_a_checkpoint");
    let index = three_shards(&dir);
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let ckpt = Checkpoint::open(&index, backend).unwrap();
        let options = StreamOptions {
            max_inflight_bytes: BOUND,
            ..StreamOptions::default()
        };
        let mut stream = TensorStream::open(Source::Checkpoint(&ckpt), None, options).unwrap();
        assert_eq!(stream.len(), ckpt.len());
        let mut last = None;
        let mut delivered = 0;
        for (k, t) in stream.by_ref().enumerate() {
            let t = t.unwrap();
            let (f, info) = ckpt.locate(&t.name).unwrap();
            assert_eq!(t.file, ckpt.shard_of(&t.name).unwrap(), "{}", t.name);
            assert_eq!(t.path(), ckpt.shard_path(t.file).unwrap());
            assert_eq!(t.index, f.header().position(&t.name).unwrap());
            assert_eq!(t.request, k);
            assert_eq!((t.dtype, t.shape.as_slice()), (info.dtype, info.shape));
            assert_eq!(
                t.data(),
                f.tensor_bytes(&t.name).unwrap().as_ref(),
                "{backend:?}"
            );
            // Shard by shard, offsets ascending within each.
            let at = (t.file, info.data_offsets.0, info.data_offsets.1);
            assert!(last < Some(at), "{} after {last:?}", t.name);
            last = Some(at);
            delivered += 1;
        }
        assert_eq!(delivered, ckpt.len());
        // s1.big (150,000 bytes) exceeds the bound: read alone, so the peak is exactly it.
        assert_eq!(stream.peak_inflight_bytes(), 150_000, "{backend:?}");
        assert_eq!(stream.inflight_bytes(), 0);
    }
}

#[test]
fn streams_requested_tensors_and_slices_in_file_order_with_their_request_positions() {
    let dir = scratch_dir("streams_requested_tensors");
    let index = three_shards(&dir);
    let ckpt = Checkpoint::open(&index, Backend::Read).unwrap();
    let requests = [
        Request::slice("s2.a", vec![Indexer::range(2, 7), Indexer::range(10, 90)]),
        Request::tensor("s0.w"),
        Request::slice(
            "s0.w",
            vec![
                Indexer::FULL,
                Indexer::Range {
                    start: Some(1),
                    stop: None,
                    step: 3,
                },
            ],
        ),
        Request::tensor("s0.w"),
        Request::slice("s1.x", vec![Indexer::Select(3), Indexer::range(1, 4)]),
        Request::tensor("s0.e"),
        Request::slice("s0.m", vec![Indexer::range(0, 0)]),
    ];
    let options = StreamOptions {
        max_inflight_bytes: 10_000,
        ..StreamOptions::default()
    };
    for source in ["checkpoint", "files"] {
        let files: Vec<Arc<SafeFile>> = (0..3).map(|i| ckpt.shard(i).unwrap().clone()).collect();
        let src = match source {
            "checkpoint" => Source::Checkpoint(&ckpt),
            _ => Source::Files(&files),
        };
        let stream = TensorStream::open(src, Some(&requests), options).unwrap();
        assert_eq!(stream.len(), requests.len());
        let mut order = Vec::new();
        for t in stream {
            let t = t.unwrap();
            let r = &requests[t.request];
            assert_eq!(t.name, r.name);
            let f = ckpt.shard(t.file).unwrap();
            let (want, shape) = match &r.slice {
                None => (
                    f.tensor_bytes(&t.name).unwrap().into_owned(),
                    f.info(&t.name).unwrap().shape.to_vec(),
                ),
                Some(ix) => {
                    let plan = f.plan_slice(&t.name, ix).unwrap();
                    let mut out = vec![0u8; plan.byte_len()];
                    f.read_slice(&t.name, &plan, &mut out).unwrap();
                    (out, plan.shape().to_vec())
                }
            };
            assert_eq!(t.data(), want.as_slice(), "{source}: request {}", t.request);
            assert_eq!(t.shape, shape);
            assert_eq!(t.dtype, f.info(&t.name).unwrap().dtype);
            order.push(t.request);
        }
        // File order: shard, then the tensor's offset, then the request's position.
        let mut want: Vec<usize> = (0..requests.len()).collect();
        want.sort_by_key(|&k| {
            let shard = ckpt.shard_of(&requests[k].name).unwrap();
            let begin = ckpt.shard(shard).unwrap().info(&requests[k].name).unwrap();
            (shard, begin.data_offsets.0, k)
        });
        assert_eq!(order, want, "{source}");
    }
}

#[test]
fn requests_that_do_not_fit_are_refused_before_anything_is_read() {
    let dir = scratch_dir("requests_that_do_not_fit");
    let index = three_shards(&dir);
    let ckpt = Checkpoint::open(&index, Backend::Read).unwrap();
    for (bad, kind) in [
        (Request::tensor("nope"), ErrorKind::TensorNotFound),
        (
            Request::tensor("s0.w").in_file(2),
            ErrorKind::TensorNotFound,
        ),
        // A shard number past the end: the same kind as for a list of files.
        (
            Request::tensor("s0.w").in_file(3),
            ErrorKind::TensorNotFound,
        ),
        (
            Request::tensor("s0.w").in_file(usize::MAX),
            ErrorKind::TensorNotFound,
        ),
        (
            Request::slice("s0.w", vec![Indexer::range(0, 65)]),
            ErrorKind::InvalidSlice,
        ),
    ] {
        let err = TensorStream::open(
            Source::Checkpoint(&ckpt),
            Some(&[Request::tensor("s0.b"), bad]),
            StreamOptions::default(),
        )
        .err()
        .unwrap();
        assert_eq!(err.kind(), kind, "{err}");
    }
    let files = [ckpt.shard(0).unwrap().clone()];
    let err = TensorStream::open(
        Source::Files(&files),
        Some(&[Request::tensor("s0.w").in_file(1)]),
        StreamOptions::default(),
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::TensorNotFound);
    assert!(err.to_string().contains("file #1"), "{err}");
}

/// The fields of a `BudgetExceeded` error.
fn budget(err: &Error) -> (String, u64, u64, u64) {
    match err.innermost() {
        Error::BudgetExceeded {
            tensor,
            held,
            bound,
            next,
        } => (tensor.clone(), *held, *bound, *next),
        other => panic!("not BudgetExceeded: {other}"),
    }
}

#[test]
fn a_caller_that_holds_the_budget_gets_an_error_instead_of_a_hang() {
    let dir = scratch_dir("a_caller_that_holds_the_budget");
    let path = dir.join("s.safetensors");
    write_sample(&path);
    let f = Arc::new(SafeFile::open(&path, Backend::Read).unwrap());
    // t0, t1 and t2 fit under 100,000 together; t3 (300,000) needs nothing else held.
    let mut stream = TensorStream::new(f.clone(), None, 100_000).unwrap();
    let held: Vec<_> = stream.by_ref().take(3).map(Result::unwrap).collect();
    let err = stream.next().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BudgetExceeded);
    assert_eq!(budget(&err), ("t3".into(), 75_096, 100_000, 300_000));
    let text = err.to_string();
    for hint in [
        "drop delivered tensors",
        "max_inflight_bytes",
        "wait_for_release",
    ] {
        assert!(text.contains(hint), "{text}");
    }
    // Recoverable: dropping what it holds and asking again goes on with t3, then the rest.
    drop(held);
    let rest: Vec<_> = stream.by_ref().map(|t| t.unwrap().name.clone()).collect();
    assert_eq!(rest, ["t3", "t4", "t5", "t6"]);
    assert_eq!(stream.inflight_bytes(), 0);

    // Two tensors that fit the bound alone but not together.
    let tensors = [vec![1u8; 60_000], vec![2u8; 60_000]];
    let two = dir.join("two.safetensors");
    let shape = [60_000];
    serialize_to_file(
        [
            ("a", TensorView::new(Dtype::U8, &shape, &tensors[0])),
            ("b", TensorView::new(Dtype::U8, &shape, &tensors[1])),
        ],
        None,
        &two,
    )
    .unwrap();
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let files = [Arc::new(SafeFile::open(&two, backend).unwrap())];
        let options = StreamOptions {
            max_inflight_bytes: 100_000,
            ..StreamOptions::default()
        };
        let mut stream = TensorStream::open(Source::Files(&files), None, options).unwrap();
        let a = stream.next().unwrap().unwrap();
        let err = stream.next().unwrap().unwrap_err();
        assert_eq!(budget(&err), ("b".into(), 60_000, 100_000, 60_000));
        assert!(err.to_string().contains("two.safetensors"), "{err}");
        assert_eq!(a.data(), &tensors[0][..]);
        // Asking again while still holding it is the same error, not an end.
        let again = stream.next().unwrap().unwrap_err();
        assert_eq!(budget(&again), budget(&err));
        // Dropping what it holds and asking again, in the same stream, goes on with `b`.
        drop(a);
        assert_eq!(stream.next().unwrap().unwrap().data(), &tensors[1][..]);
        assert!(stream.next().is_none());
    }
}

#[test]
fn wait_for_release_waits_for_other_threads_to_drop_tensors() {
    let dir = scratch_dir("wait_for_release_waits");
    let path = dir.join("s.safetensors");
    write_sample(&path);
    let f = Arc::new(SafeFile::open(&path, Backend::Read).unwrap());
    let files = [f.clone()];
    let options = StreamOptions {
        max_inflight_bytes: 100_000,
        wait_for_release: true,
    };
    let stream = TensorStream::open(Source::Files(&files), None, options).unwrap();
    // The caller keeps nothing: a worker checks each tensor and drops it, whenever it gets to
    // it; `next` waits for it where the budget is short.
    let (tx, rx) = mpsc::channel::<safetensors_core::StreamTensor>();
    let worker = std::thread::spawn(move || {
        let mut names = Vec::new();
        for t in rx {
            assert_eq!(t.data(), f.tensor_bytes(&t.name).unwrap().as_ref());
            names.push(t.name.clone());
        }
        names
    });
    let mut stream = stream;
    for t in stream.by_ref() {
        tx.send(t.unwrap()).unwrap();
    }
    drop(tx);
    let names = worker.join().unwrap();
    assert_eq!(names.len(), LENS.len());
    let peak = stream.peak_inflight_bytes();
    assert!(peak <= 300_000, "peak {peak}");
    assert_eq!(stream.inflight_bytes(), 0);
}

#[test]
fn a_shard_that_shrinks_mid_stream_ends_it_with_io_naming_the_shard() {
    let dir = scratch_dir("a_shard_that_shrinks");
    let index = three_shards(&dir);
    for backend in [Backend::Read, Backend::Direct] {
        let ckpt = Checkpoint::open(&index, backend).unwrap();
        let options = StreamOptions {
            max_inflight_bytes: 1,
            ..StreamOptions::default()
        };
        let mut stream = TensorStream::open(Source::Checkpoint(&ckpt), None, options).unwrap();
        // Bound 1: one tensor at a time, so nothing of shard 1 is read before the cut.
        let first = stream.next().unwrap().unwrap();
        assert_eq!(first.file, 0);
        let shard = ckpt.shard(1).unwrap();
        let cut = shard.header().data_start() + 1000;
        common::truncate(shard.path(), cut as u64);
        drop(first);
        let mut err = None;
        for t in stream.by_ref() {
            match t {
                Ok(t) => assert_eq!(t.file, 0, "{}", t.name),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let err = err.expect("an error");
        assert_eq!(err.kind(), ErrorKind::Io, "{backend:?}: {err}");
        assert!(err.to_string().contains("model-1.safetensors"), "{err}");
        assert_eq!(stream.inflight_bytes(), 0, "everything is freed");
        three_shards(&dir);
    }
}

#[test]
fn a_tensor_larger_than_a_read_piece_arrives_whole_with_every_backend() {
    // Whole tensors are read in 64 MiB pieces: one of 150 MiB + 7 bytes that starts off a block
    // boundary (after a 3-byte tensor) crosses pieces and blocks at odd places.
    let dir = scratch_dir("a_tensor_larger_than_a_piece");
    let path = dir.join("big.safetensors");
    let big_len = (150 << 20) + 7;
    let small: Vec<u8> = vec![1, 2, 3];
    let big: Vec<u8> = (0..big_len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761) as u8 ^ (i >> 20) as u8)
        .collect();
    serialize_to_file(
        [
            ("a", TensorView::new(Dtype::U8, &[3], &small)),
            ("b", TensorView::new(Dtype::U8, &[big_len], &big)),
        ],
        None,
        &path,
    )
    .unwrap();
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let f = Arc::new(SafeFile::open(&path, backend).unwrap());
        let mut count = 0;
        for t in TensorStream::new(f, None, 1 << 20).unwrap() {
            let t = t.unwrap();
            let want: &[u8] = if t.name == "a" { &small } else { &big };
            assert!(
                t.data() == want,
                "{backend:?}: the bytes of `{}` differ",
                t.name
            );
            count += 1;
        }
        assert_eq!(count, 2, "{backend:?}");
    }
}
