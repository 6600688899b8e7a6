//! Files in memory, and checkpoints as they exist in the wild: lenient checkpoints (an index
//! listing tensors its shard lacks, shards carrying copies assigned elsewhere) and files with
//! bytes after the last tensor. Strict stays the default; each test checks both faces.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::scratch_dir;
use safetensors_core::{
    serialize, Backend, Checkpoint, CheckpointOptions, Dtype, ErrorKind, OpenOptions, Populate,
    SafeFile, TensorView,
};

fn file_of(names: &[&str], fill: u8) -> Vec<u8> {
    let data = [fill; 4];
    serialize(
        names
            .iter()
            .map(|n| (*n, TensorView::new(Dtype::U8, &[4], &data))),
        None,
    )
    .unwrap()
}

fn write_index(dir: &Path, weight_map: &[(&str, &str)]) -> std::path::PathBuf {
    let map: Vec<String> = weight_map
        .iter()
        .map(|(t, s)| format!("\"{t}\":\"{s}\""))
        .collect();
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, format!("{{\"weight_map\":{{{}}}}}", map.join(","))).unwrap();
    path
}

const LENIENT: CheckpointOptions = CheckpointOptions {
    backend: Backend::Mmap,
    lenient: true,
    allow_trailing_bytes: false,
    populate: Populate::Lazy,
    huge_pages: false,
};

#[test]
fn a_file_in_memory_reads_like_the_file_and_borrows_its_bytes() {
    let bytes: Arc<[u8]> = file_of(&["a", "b"], 7).into();
    let f =
        SafeFile::from_memory("<memory>", Box::new(bytes.clone()), OpenOptions::default()).unwrap();
    assert!(f.is_in_memory());
    assert_eq!(f.header().sorted_names(), ["a", "b"]);
    let view = f.view("b").unwrap().unwrap();
    assert_eq!(view.data, &[7; 4]);
    // Zero copy: the view points into the caller's buffer.
    let inside = bytes.as_ptr_range();
    assert!(inside.contains(&view.data.as_ptr()));
    let mut out = [0u8; 2];
    f.read_data(6, &mut out).unwrap();
    assert_eq!(out, [7, 7]);
    assert_eq!(
        f.read_data(7, &mut out).unwrap_err().kind(),
        ErrorKind::InvalidSlice,
        "reads stay inside the data buffer (a range past it is the caller's mistake)"
    );
}

#[test]
fn a_truncated_buffer_in_memory_is_the_files_error_naming_the_buffer() {
    let bytes = file_of(&["a"], 1);
    let short = bytes[..bytes.len() - 1].to_vec();
    let e = SafeFile::from_memory("download.bin", Box::new(short), OpenOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer);
    assert!(e.to_string().contains("download.bin"), "{e}");
}

#[test]
fn trailing_bytes_are_refused_by_default_and_counted_when_allowed() {
    let dir = scratch_dir("quirks_trailing");
    let mut bytes = file_of(&["a"], 3);
    bytes.extend_from_slice(b"trailing!");
    let path = dir.join("t.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    for backend in [Backend::Mmap, Backend::Read] {
        let e = SafeFile::open(&path, backend).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer, "{e}");
        let allow = OpenOptions {
            backend,
            allow_trailing_bytes: true,
            ..OpenOptions::default()
        };
        let f = SafeFile::open_with(&path, allow).unwrap();
        assert_eq!(f.trailing_bytes(), 9, "{backend:?}");
        assert_eq!(&*f.tensor_bytes("a").unwrap(), &[3; 4]);
        assert_eq!(f.header().data_len(), 4, "trailing bytes are not data");
        let mut past = [0u8; 1];
        assert!(f.read_data(4, &mut past).is_err(), "no read reaches them");
    }
    let allow = OpenOptions {
        allow_trailing_bytes: true,
        ..OpenOptions::default()
    };
    let f = SafeFile::from_memory("m", Box::new(bytes.clone()), allow).unwrap();
    assert_eq!(f.trailing_bytes(), 9);
    let e = SafeFile::from_memory("m", Box::new(bytes), OpenOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer);
    // A clean file reports none; missing bytes stay an error even when trailing ones are allowed.
    let clean = file_of(&["a"], 3);
    let f = SafeFile::from_memory("m", Box::new(clean.clone()), allow).unwrap();
    assert_eq!(f.trailing_bytes(), 0);
    let short = clean[..clean.len() - 2].to_vec();
    let e = SafeFile::from_memory("m", Box::new(short), allow)
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lenient_checkpoint_reports_a_listed_tensor_its_shard_lacks_only_when_asked() {
    let dir = scratch_dir("quirks_missing");
    std::fs::write(dir.join("a.safetensors"), file_of(&["w0"], 1)).unwrap();
    std::fs::write(dir.join("b.safetensors"), file_of(&["w2"], 2)).unwrap();
    let index = write_index(
        &dir,
        &[
            ("w0", "a.safetensors"),
            ("w1", "a.safetensors"),
            ("w2", "b.safetensors"),
        ],
    );
    // Strict (the default): the shard does not open.
    let strict = Checkpoint::open(&index, Backend::Mmap).unwrap();
    let e = strict.locate("w0").err().unwrap();
    assert_eq!(e.kind(), ErrorKind::ShardMissing, "{e}");
    for backend in [Backend::Mmap, Backend::Read] {
        let c = Checkpoint::open_with(&index, CheckpointOptions { backend, ..LENIENT }).unwrap();
        assert_eq!(c.names(), ["w0", "w1", "w2"], "the index is the list");
        let (file, info) = c.locate("w0").unwrap();
        assert_eq!(&*file.tensor_bytes(info.name).unwrap(), &[1; 4]);
        let e = c.locate("w1").err().unwrap();
        assert_eq!(e.kind(), ErrorKind::ShardMissing);
        assert!(e.to_string().contains("w1") && e.to_string().contains("a.safetensors"));
        assert_eq!(c.missing().unwrap(), [("w1".to_string(), 0)]);
        assert_eq!(c.shards_opened(), 2, "missing() opens every shard");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lenient_checkpoint_ignores_copies_in_shards_the_index_does_not_assign() {
    let dir = scratch_dir("quirks_copies");
    // b.safetensors carries a stale copy of w0 (filled with 9); the index assigns w0 to a.
    std::fs::write(dir.join("a.safetensors"), file_of(&["w0"], 1)).unwrap();
    std::fs::write(dir.join("b.safetensors"), file_of(&["w0", "w2"], 9)).unwrap();
    let index = write_index(&dir, &[("w0", "a.safetensors"), ("w2", "b.safetensors")]);
    let strict = Checkpoint::open(&index, Backend::Mmap).unwrap();
    assert_eq!(
        strict.locate("w2").err().unwrap().kind(),
        ErrorKind::ShardMismatch
    );
    let c = Checkpoint::open_with(&index, LENIENT).unwrap();
    let (file, info) = c.locate("w2").unwrap();
    assert_eq!(&*file.tensor_bytes(info.name).unwrap(), &[9; 4]);
    let (file, info) = c.locate("w0").unwrap();
    assert_eq!(
        &*file.tensor_bytes(info.name).unwrap(),
        &[1; 4],
        "the index's shard wins"
    );
    assert!(c.missing().unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lenient_checkpoint_still_refuses_a_missing_shard_file_at_open() {
    let dir = scratch_dir("quirks_no_shard");
    let index = write_index(&dir, &[("w0", "gone.safetensors")]);
    let e = Checkpoint::open_with(&index, LENIENT).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::ShardMissing);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checkpoint_shards_with_trailing_bytes_open_only_when_allowed_and_are_reported() {
    let dir = scratch_dir("quirks_ckpt_trailing");
    let mut a = file_of(&["w0"], 1);
    a.extend_from_slice(&[0; 5]);
    std::fs::write(dir.join("a.safetensors"), &a).unwrap();
    std::fs::write(dir.join("b.safetensors"), file_of(&["w1"], 2)).unwrap();
    let index = write_index(&dir, &[("w0", "a.safetensors"), ("w1", "b.safetensors")]);
    let strict = Checkpoint::open(&index, Backend::Mmap).unwrap();
    assert_eq!(
        strict.locate("w0").err().unwrap().kind(),
        ErrorKind::MetadataIncompleteBuffer
    );
    let allow = CheckpointOptions {
        allow_trailing_bytes: true,
        ..CheckpointOptions::default()
    };
    let c = Checkpoint::open_with(&index, allow).unwrap();
    assert_eq!(c.trailing_bytes().unwrap(), [(0, 5)]);
    let (file, info) = c.locate("w0").unwrap();
    assert_eq!(&*file.tensor_bytes(info.name).unwrap(), &[1; 4]);
    // A single file opened as a checkpoint gets the option too.
    let single = Checkpoint::open_with(dir.join("a.safetensors"), allow).unwrap();
    assert_eq!(single.trailing_bytes().unwrap(), [(0, 5)]);
    assert_eq!(
        Checkpoint::open(dir.join("a.safetensors"), Backend::Mmap)
            .err()
            .unwrap()
            .kind(),
        ErrorKind::MetadataIncompleteBuffer
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
