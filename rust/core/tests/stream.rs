//! Host streaming: every tensor's bytes equal `tensor_bytes`, in file order, with every backend;
//! the in-flight bound holds (instrumented); early drop and errors end the stream cleanly.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::scratch_dir;
use safetensors_core::{
    serialize_to_file, Backend, Dtype, ErrorKind, SafeFile, TensorStream, TensorView,
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
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut as u64)
            .unwrap();
        drop(first);
        let err = stream.next().unwrap().err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Io, "{backend:?}");
        assert!(stream.next().is_none(), "the stream ends after an error");
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
