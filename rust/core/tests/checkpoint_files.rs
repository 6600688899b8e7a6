//! Checkpoints against odd files and odd spellings: special files as the index, shard paths
//! written several ways or naming directories, shards the process cannot `stat`, and index
//! metadata given back exactly as written.

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::scratch_dir;
use safetensors_core::{
    serialize_to_file, Backend, Checkpoint, Dtype, Error, ErrorKind, TensorView,
};

/// Writes shard `file` holding U8 [4] tensors `names`, each filled with `fill`.
fn shard(dir: &Path, file: &str, names: &[&str], fill: u8) {
    let data = [fill; 4];
    let views: Vec<(&str, TensorView)> = names
        .iter()
        .map(|n| (*n, TensorView::new(Dtype::U8, &[4], &data)))
        .collect();
    serialize_to_file(views, None, dir.join(file)).unwrap();
}

fn open_err(path: &Path) -> Error {
    Checkpoint::open(path, Backend::Mmap).err().unwrap()
}

/// Runs `f` on another thread and fails the test if it has not returned after a minute: the
/// bug this guards against is an open that never returns, which would otherwise hang the suite.
fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

#[test]
fn a_fifo_index_is_refused_without_blocking() {
    let dir = scratch_dir("fifo_index");
    let fifo = dir.join("model.safetensors.index.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for backend in [Backend::Mmap, Backend::Read] {
        let path = fifo.clone();
        let err = returns("opening a FIFO index", move || {
            Checkpoint::open(&path, backend).err().unwrap()
        });
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}

#[test]
fn endless_and_directory_indexes_are_refused() {
    let dir = scratch_dir("endless_index");
    // An index that is /dev/zero, by name or through a symlink, would be read without end.
    let err = returns("reading /dev/zero as an index", || {
        Checkpoint::from_index("/dev/zero", Backend::Mmap)
            .err()
            .unwrap()
    });
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    let link = dir.join("zero.index.json");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let err = returns("reading /dev/zero as an index", move || open_err(&link));
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let sub = dir.join("sub.index.json");
    std::fs::create_dir(&sub).unwrap();
    let err = open_err(&sub);
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("a directory"), "{err}");
}

#[test]
fn an_index_named_in_upper_case_is_read_as_an_index() {
    let dir = scratch_dir("upper_case_index");
    shard(&dir, "a.safetensors", &["w"], 1);
    for name in ["model.safetensors.index.JSON", "model.Index.Json"] {
        std::fs::write(dir.join(name), r#"{"weight_map":{"w":"a.safetensors"}}"#).unwrap();
        let c = Checkpoint::open(dir.join(name), Backend::Mmap).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.names(), ["w"]);
        assert_eq!(
            c.locate("w").unwrap().0.tensor_bytes("w").unwrap().as_ref(),
            [1; 4]
        );
    }
}

#[test]
fn one_shard_spelled_two_ways_is_one_shard() {
    let dir = scratch_dir("two_spellings");
    std::fs::create_dir(dir.join("sub")).unwrap();
    shard(&dir, "a.safetensors", &["w0", "w1"], 1);
    shard(&dir, "sub/b.safetensors", &["w2", "w3"], 2);
    let index = r#"{"weight_map":{"w0":"a.safetensors","w1":"./a.safetensors",
        "w2":"sub/b.safetensors","w3":"./sub//./b.safetensors"}}"#;
    std::fs::write(dir.join("m.index.json"), index).unwrap();
    for backend in [Backend::Mmap, Backend::Read] {
        let c = Checkpoint::open(dir.join("m.index.json"), backend).unwrap();
        assert_eq!(c.shard_count(), 2);
        for (name, fill) in [("w0", 1), ("w1", 1), ("w2", 2), ("w3", 2)] {
            let (file, _) = c.locate(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(file.tensor_bytes(name).unwrap().as_ref(), [fill; 4]);
        }
    }
}

#[test]
fn a_shard_path_holding_a_nul_is_invalid() {
    // JSON can spell U+0000; no file name can hold it, so this is the index's fault (not an
    // `Io` error about a path the message cannot even show whole).
    let dir = scratch_dir("nul_shard");
    shard(&dir, "a.safetensors", &["w"], 1);
    let index = r#"{"weight_map":{"w":"a.safetensors\u0000x"}}"#;
    std::fs::write(dir.join("m.index.json"), index).unwrap();
    let err = open_err(&dir.join("m.index.json"));
    assert_eq!(err.kind(), ErrorKind::InvalidShardPath, "{err}");
}

#[test]
fn shard_paths_naming_the_directory_are_invalid() {
    let dir = scratch_dir("directory_shards");
    std::fs::create_dir(dir.join("sub")).unwrap();
    shard(&dir, "a.safetensors", &["w"], 1);
    for bad in [".", "./", "sub", "sub/", "sub/.", "./sub"] {
        let index = format!(r#"{{"weight_map":{{"w":"{bad}"}}}}"#);
        std::fs::write(dir.join("m.index.json"), index).unwrap();
        let err = open_err(&dir.join("m.index.json"));
        assert_eq!(err.kind(), ErrorKind::InvalidShardPath, "{bad}: {err}");
    }
}

#[test]
fn a_shard_that_cannot_be_stat_ed_is_io_with_the_reason_not_missing() {
    let dir = scratch_dir("unstatable_shard");
    std::os::unix::fs::symlink("loop.safetensors", dir.join("loop.safetensors")).unwrap();
    let long = "x".repeat(300);
    let cases = [
        ("loop.safetensors", "symbolic links"),
        (long.as_str(), "too long"),
    ];
    for (name, reason) in cases {
        let index = format!(r#"{{"weight_map":{{"w":"{name}"}}}}"#);
        std::fs::write(dir.join("m.index.json"), index).unwrap();
        let err = open_err(&dir.join("m.index.json"));
        assert_eq!(err.kind(), ErrorKind::Io, "{name}: {err}");
        assert!(err.to_string().contains(reason), "{err}");
    }
    // Only a shard that does not exist is missing.
    std::fs::write(
        dir.join("m.index.json"),
        r#"{"weight_map":{"w":"gone.safetensors"}}"#,
    )
    .unwrap();
    assert_eq!(
        open_err(&dir.join("m.index.json")).kind(),
        ErrorKind::ShardMissing
    );
}

#[test]
fn index_metadata_values_are_given_as_their_exact_json_text() {
    let dir = scratch_dir("metadata_text");
    shard(&dir, "a.safetensors", &["w"], 1);
    let index = r#"{"metadata":{"total_size":1e3,"neg":-0.50,
        "big":123456789012345678901234567890,"o":{"a": [1, 2.0]},"t":true,"n":null,
        "s":"caf\u00e9 \"q\""},"weight_map":{"w":"a.safetensors"}}"#;
    std::fs::write(dir.join("m.index.json"), index).unwrap();
    let c = Checkpoint::open(dir.join("m.index.json"), Backend::Mmap).unwrap();
    let m = c.metadata().unwrap();
    assert_eq!(m["total_size"], "1e3");
    assert_eq!(m["neg"], "-0.50");
    assert_eq!(m["big"], "123456789012345678901234567890");
    assert_eq!(m["o"], r#"{"a": [1, 2.0]}"#);
    assert_eq!(m["t"], "true");
    assert_eq!(m["n"], "null");
    assert_eq!(m["s"], "café \"q\"");
}

#[test]
fn a_repeated_index_metadata_key_is_a_duplicate_key() {
    let dir = scratch_dir("metadata_repeat");
    shard(&dir, "a.safetensors", &["w"], 1);
    let index = r#"{"metadata":{"format":"pt","format":"np"},"weight_map":{"w":"a.safetensors"}}"#;
    std::fs::write(dir.join("m.index.json"), index).unwrap();
    let err = open_err(&dir.join("m.index.json"));
    assert_eq!(err.kind(), ErrorKind::DuplicateKey, "{err}");
    assert!(err.to_string().contains("`format`"), "{err}");
    // The index's object is `metadata`; `__metadata__` belongs to safetensors files only.
    assert!(!err.to_string().contains("__metadata__"), "{err}");
    assert!(err.to_string().contains("m.index.json"), "{err}");
}

#[test]
fn a_shard_deleted_after_open_is_missing_at_first_use() {
    let dir = scratch_dir("deleted_after_open");
    shard(&dir, "a.safetensors", &["w"], 1);
    std::fs::write(
        dir.join("m.index.json"),
        r#"{"weight_map":{"w":"a.safetensors"}}"#,
    )
    .unwrap();
    for backend in [Backend::Mmap, Backend::Read] {
        shard(&dir, "a.safetensors", &["w"], 1);
        let c = Checkpoint::open(dir.join("m.index.json"), backend).unwrap();
        std::fs::remove_file(dir.join("a.safetensors")).unwrap();
        let err = c.locate("w").err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ShardMissing, "{err}");
        assert!(err.to_string().contains("a.safetensors"), "{err}");
    }
}
