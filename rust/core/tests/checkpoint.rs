//! Sharded checkpoints: the index is the authority, shards open lazily and once, and every
//! inconsistency is a typed error.

mod common;

use std::path::Path;

use common::scratch_dir;
use safetensors_core::{serialize_to_file, Backend, Checkpoint, Dtype, ErrorKind, TensorView};

/// Writes `shards` (file name → tensor names, each U8 [4] filled with its shard number) and an
/// index mapping `weight_map` entries.
fn write_checkpoint(dir: &Path, shards: &[(&str, &[&str])], weight_map: &[(&str, &str)]) {
    for (i, (file, names)) in shards.iter().enumerate() {
        let data = [i as u8; 4];
        let views: Vec<(&str, TensorView)> = names
            .iter()
            .map(|n| (*n, TensorView::new(Dtype::U8, &[4], &data)))
            .collect();
        serialize_to_file(views, None, dir.join(file)).unwrap();
    }
    let map: Vec<String> = weight_map
        .iter()
        .map(|(t, s)| format!("\"{t}\":\"{s}\""))
        .collect();
    let index = format!(
        "{{\"metadata\":{{\"total_size\":{},\"format\":\"pt\"}},\"weight_map\":{{{}}}}}",
        weight_map.len() * 4,
        map.join(",")
    );
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
}

fn three_shards(dir: &Path) {
    write_checkpoint(
        dir,
        &[
            ("a.safetensors", &["w0", "w1"]),
            ("b.safetensors", &["w2"]),
            ("c.safetensors", &["w3", "w4"]),
        ],
        &[
            ("w0", "a.safetensors"),
            ("w1", "a.safetensors"),
            ("w2", "b.safetensors"),
            ("w3", "c.safetensors"),
            ("w4", "c.safetensors"),
        ],
    );
}

#[test]
fn reads_tensors_across_shards_opening_each_shard_once_and_lazily() {
    let dir = scratch_dir("reads_tensors_across_shards");
    three_shards(&dir);
    for backend in [Backend::Mmap, Backend::Read] {
        let c = Checkpoint::open(dir.join("model.safetensors.index.json"), backend).unwrap();
        assert_eq!(c.names(), ["w0", "w1", "w2", "w3", "w4"]);
        assert_eq!(c.shard_count(), 3);
        assert_eq!(c.shards_opened(), 0, "opening the index opens no shard");
        let meta = c.metadata().unwrap();
        assert_eq!(meta["total_size"], "20");
        assert_eq!(meta["format"], "pt");
        let (file, info) = c.locate("w3").unwrap();
        assert_eq!(info.shape, &[4]);
        assert_eq!(file.tensor_bytes("w3").unwrap().as_ref(), &[2u8; 4]);
        assert_eq!(c.shards_opened(), 1);
        assert!(c.shard_is_open(2) && !c.shard_is_open(0));
        for _ in 0..3 {
            c.locate("w4").unwrap();
            c.locate("w0").unwrap();
        }
        assert_eq!(c.shards_opened(), 2, "each shard opens once");
        assert_eq!(c.shard_of("w2").unwrap(), 1);
        assert_eq!(
            c.shard_of("nope").unwrap_err().kind(),
            ErrorKind::TensorNotFound
        );
    }
}

#[test]
fn shards_open_once_under_concurrent_first_use() {
    let dir = scratch_dir("shards_open_once_concurrently");
    three_shards(&dir);
    let c = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap).unwrap();
    std::thread::scope(|s| {
        for t in 0..8 {
            let c = &c;
            s.spawn(move || {
                for i in 0..50 {
                    let name = format!("w{}", (t + i) % 5);
                    assert_eq!(c.locate(&name).unwrap().1.shape, &[4]);
                }
            });
        }
    });
    assert_eq!(c.shards_opened(), 3);
}

#[test]
fn a_single_file_is_a_checkpoint_of_one_shard() {
    let dir = scratch_dir("single_file_checkpoint");
    three_shards(&dir);
    let c = Checkpoint::open(dir.join("a.safetensors"), Backend::Mmap).unwrap();
    assert_eq!(c.names(), ["w0", "w1"]);
    assert_eq!(c.shard_count(), 1);
    assert_eq!(c.locate("w1").unwrap().1.data_offsets, (4, 8));
}

#[test]
fn a_missing_shard_file_is_reported_at_open() {
    let dir = scratch_dir("missing_shard_file");
    three_shards(&dir);
    std::fs::remove_file(dir.join("b.safetensors")).unwrap();
    let err = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap)
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::ShardMissing);
    assert!(
        err.to_string().contains("b.safetensors") && err.to_string().contains("index.json"),
        "{err}"
    );
}

#[test]
fn a_tensor_listed_but_absent_from_its_shard_is_reported() {
    let dir = scratch_dir("listed_but_absent");
    write_checkpoint(
        &dir,
        &[("a.safetensors", &["w0"]), ("b.safetensors", &["w1"])],
        &[
            ("w0", "a.safetensors"),
            ("w1", "b.safetensors"),
            ("ghost", "b.safetensors"),
        ],
    );
    let c = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap).unwrap();
    assert!(c.locate("w0").is_ok());
    let err = c.locate("w1").err().unwrap();
    assert_eq!(err.kind(), ErrorKind::ShardMissing);
    assert!(err.to_string().contains("`ghost`"), "{err}");
}

#[test]
fn a_tensor_claimed_by_another_shard_is_reported() {
    let dir = scratch_dir("claimed_by_another");
    write_checkpoint(
        &dir,
        &[
            ("a.safetensors", &["w0", "w1"]),
            ("b.safetensors", &["w1b"]),
        ],
        &[
            ("w0", "a.safetensors"),
            ("w1", "b.safetensors"),
            ("w1b", "b.safetensors"),
        ],
    );
    let c = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap).unwrap();
    let err = c.locate("w0").err().unwrap();
    assert_eq!(err.kind(), ErrorKind::ShardMismatch);
    assert!(
        err.to_string().contains("`w1`")
            && err.to_string().contains("assigns it to `b.safetensors`"),
        "{err}"
    );
}

#[test]
fn tensors_the_index_does_not_list_stay_invisible() {
    let dir = scratch_dir("unlisted_tensors");
    write_checkpoint(
        &dir,
        &[("a.safetensors", &["w0", "extra"])],
        &[("w0", "a.safetensors")],
    );
    let c = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap).unwrap();
    assert_eq!(c.names(), ["w0"]);
    assert!(c.locate("w0").is_ok());
    assert_eq!(
        c.locate("extra").err().unwrap().kind(),
        ErrorKind::TensorNotFound
    );
}

#[test]
fn shard_paths_escaping_the_directory_are_refused() {
    for bad in [
        "../a.safetensors",
        "/tmp/a.safetensors",
        "sub/../../a.safetensors",
        "",
    ] {
        let dir = scratch_dir("escaping_paths");
        three_shards(&dir);
        let index = format!("{{\"weight_map\":{{\"w0\":\"{bad}\"}}}}");
        std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
        let err = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap)
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidShardPath, "{bad}: {err}");
    }
}

#[test]
fn malformed_indexes_are_refused() {
    let dir = scratch_dir("malformed_indexes");
    three_shards(&dir);
    let cases = [
        ("[]", ErrorKind::InvalidIndex),
        ("{\"metadata\":{}}", ErrorKind::InvalidIndex),
        ("{\"weight_map\":{\"w0\":3}}", ErrorKind::InvalidIndex),
        ("{\"weight_map\":[]}", ErrorKind::InvalidIndex),
        ("{\"weight_map\":{}", ErrorKind::InvalidIndex),
        (
            "{\"weight_map\":{\"w0\":\"a.safetensors\",\"w0\":\"a.safetensors\"}}",
            ErrorKind::DuplicateKey,
        ),
    ];
    for (json, kind) in cases {
        std::fs::write(dir.join("bad.index.json"), json).unwrap();
        let err = Checkpoint::open(dir.join("bad.index.json"), Backend::Mmap)
            .err()
            .unwrap();
        assert_eq!(err.kind(), kind, "{json}: {err}");
        assert!(err.to_string().contains("bad.index.json"), "{err}");
    }
    let err = Checkpoint::open(dir.join("missing.index.json"), Backend::Mmap)
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Io);
}

#[test]
fn an_index_whose_metadata_is_null_has_none_as_a_file_with_null_metadata() {
    let dir = scratch_dir("index_metadata_null");
    three_shards(&dir);
    let index = dir.join("model.safetensors.index.json");
    let weight_map = r#""weight_map": {"w0": "a.safetensors"}"#;
    for (metadata, present) in [
        (r#""metadata": null, "#, false),
        ("", false),
        (r#""metadata": {}, "#, true),
    ] {
        std::fs::write(&index, format!("{{{metadata}{weight_map}}}")).unwrap();
        let c = Checkpoint::open(&index, Backend::Mmap).unwrap();
        assert_eq!(c.metadata().is_some(), present, "{metadata}");
    }
    // A repeated key is still refused, also when the first is null.
    std::fs::write(
        &index,
        format!(r#"{{"metadata": null, "metadata": {{}}, {weight_map}}}"#),
    )
    .unwrap();
    let err = Checkpoint::open(&index, Backend::Mmap).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidIndex, "{err}");
}

/// A [`ShardOpener`] that has no shards: it records where it was asked to look.
struct NoShards(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl safetensors_core::ShardOpener for NoShards {
    fn open_shard(
        &self,
        location: &str,
        _: safetensors_core::OpenOptions,
    ) -> safetensors_core::Result<safetensors_core::SafeFile> {
        self.0.lock().unwrap().push(location.to_owned());
        Err(safetensors_core::Error::io(
            Path::new(location),
            "open",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ))
    }
}

#[test]
fn an_index_that_is_not_a_file_names_each_shard_literally_under_its_base() {
    // Characters a URL would read as something else are escaped, so that every shard is the
    // object of exactly its name next to the index: `%2e%2e` and `..\` would otherwise climb
    // out of the index's directory, `?` and `#` end the path, `%41` name another object.
    let shards = [
        (
            "plain",
            "model-00001-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
        ),
        ("dot", "./sub//m_1~.safetensors", "sub/m_1~.safetensors"),
        (
            "climb",
            "%2e%2e/secret.safetensors",
            "%252e%252e/secret.safetensors",
        ),
        (
            "back",
            "..\\\\secret.safetensors",
            "..%5Csecret.safetensors",
        ),
        ("query", "m?x=1#y.safetensors", "m%3Fx%3D1%23y.safetensors"),
        (
            "other",
            "a b%41é.safetensors",
            "a%20b%2541%C3%A9.safetensors",
        ),
    ];
    let map: Vec<String> = shards
        .iter()
        .map(|(t, s, _)| format!("\"{t}\":\"{s}\""))
        .collect();
    let index = format!("{{\"weight_map\":{{{}}}}}", map.join(","));
    let base = "https://example.com/models/gpt2/";
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let opener = Box::new(NoShards(seen.clone()));
    let c = Checkpoint::from_index_bytes(
        "https://example.com/models/gpt2/model.safetensors.index.json",
        index.as_bytes(),
        base,
        opener,
        Default::default(),
    )
    .unwrap();
    for (tensor, shard, escaped) in shards {
        let i = c.shard_of(tensor).unwrap();
        let want = format!("{base}{escaped}");
        assert_eq!(c.shard_path(i).unwrap(), Path::new(&want), "{shard}");
        let e = c.locate(tensor).err().expect("no shards");
        assert_eq!(e.kind(), ErrorKind::ShardMissing, "{e}");
        // The error names the shard as the index spells it.
        assert!(e.to_string().contains(&shard.replace("\\\\", "\\")), "{e}");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), shards.len());
    assert!(seen.iter().all(|l| l.starts_with(base)), "{seen:?}");
}
