//! The sharded writer: huggingface_hub's split and names, the index as `json.dump(indent=2)`
//! writes it, the result read back by `Checkpoint`, and what the directory holds before, during
//! and after a save (the earlier checkpoint's files, unfinished and failed saves).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::scratch_dir;
use common::sharded::pattern;
use safetensors_core::{
    plan_shards, serialize_to_file, Backend, Checkpoint, Dtype, ErrorKind, SafeFile, ShardOptions,
    ShardedWriter, TensorSpec, TensorView,
};

fn specs() -> Vec<TensorSpec> {
    // Sizes 400, 100, 2400, 100, 800, 0, 300 bytes, declared in this order.
    vec![
        TensorSpec::new("embed", Dtype::F32, &[100]),
        TensorSpec::new("layers.0.w", Dtype::BF16, &[50]),
        TensorSpec::new("layers.0.big", Dtype::F64, &[300]),
        TensorSpec::new("layers.1.w", Dtype::U8, &[100]),
        TensorSpec::new("layers.1.v", Dtype::I32, &[200]),
        TensorSpec::new("empty", Dtype::F16, &[0]),
        TensorSpec::new("head", Dtype::I8, &[300]),
    ]
}

fn data_of(specs: &[TensorSpec]) -> Vec<Vec<u8>> {
    specs
        .iter()
        .enumerate()
        .map(|(k, s)| pattern(k, s.dtype.byte_size(s.shape.iter().product()).unwrap()))
        .collect()
}

fn options(max: u64) -> ShardOptions {
    ShardOptions {
        max_shard_size: max,
        ..ShardOptions::default()
    }
}

fn save(dir: &Path, specs: &[TensorSpec], max: u64, meta: Option<&BTreeMap<String, String>>) {
    let data = data_of(specs);
    let mut w = ShardedWriter::create(dir, specs, meta, options(max)).unwrap();
    // Back to front, in pieces.
    for (k, s) in specs.iter().enumerate().rev() {
        for (i, piece) in data[k].chunks(64).enumerate().rev() {
            w.write_at(&s.name, (i * 64) as u64, piece).unwrap();
        }
    }
    w.finish().unwrap();
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn shards_index_and_names_are_huggingface_hubs_and_read_back() {
    let dir = scratch_dir("sharded_roundtrip");
    let specs = specs();
    let data = data_of(&specs);
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    save(&dir, &specs, 1000, Some(&meta));
    // 2400 gets a shard of its own while 400+100 stays open; +100 makes 600; 800 closes it;
    // 800+0 stays; 300 would make 1100 and closes it.
    let plan = plan_shards(&[400, 100, 2400, 100, 800, 0, 300], 1000, "model").unwrap();
    let groups: Vec<Vec<usize>> = plan.shards.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(groups, vec![vec![2], vec![0, 1, 3], vec![4, 5], vec![6]]);
    assert_eq!(
        listing(&dir),
        [
            "model-00001-of-00004.safetensors",
            "model-00002-of-00004.safetensors",
            "model-00003-of-00004.safetensors",
            "model-00004-of-00004.safetensors",
            "model.safetensors.index.json",
        ]
    );
    let index = fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap();
    assert_eq!(
        index,
        "{\n  \"metadata\": {\n    \"total_size\": 4100,\n    \"format\": \"pt\"\n  },\n  \
         \"weight_map\": {\n    \"layers.0.big\": \"model-00001-of-00004.safetensors\",\n    \
         \"embed\": \"model-00002-of-00004.safetensors\",\n    \"layers.0.w\": \
         \"model-00002-of-00004.safetensors\",\n    \"layers.1.w\": \
         \"model-00002-of-00004.safetensors\",\n    \"layers.1.v\": \
         \"model-00003-of-00004.safetensors\",\n    \"empty\": \
         \"model-00003-of-00004.safetensors\",\n    \"head\": \
         \"model-00004-of-00004.safetensors\"\n  }\n}"
    );
    let ckpt = Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Mmap).unwrap();
    assert_eq!(ckpt.metadata().unwrap().get("total_size").unwrap(), "4100");
    for (k, s) in specs.iter().enumerate() {
        let (file, info) = ckpt.locate(&s.name).unwrap();
        assert_eq!(info.dtype, s.dtype);
        assert_eq!(info.shape, s.shape);
        assert_eq!(
            file.tensor_bytes(&s.name).unwrap().as_ref(),
            data[k],
            "{}",
            s.name
        );
    }
    // Each shard carries the metadata too.
    let shard =
        SafeFile::open(dir.join("model-00002-of-00004.safetensors"), Backend::Mmap).unwrap();
    assert_eq!(
        shard.header().metadata().unwrap().get("format").unwrap(),
        "pt"
    );
}

#[test]
fn one_shard_is_a_plain_file_and_replaces_an_earlier_sharded_save() {
    let dir = scratch_dir("sharded_one");
    let specs = specs();
    save(&dir, &specs, 1000, None);
    fs::write(dir.join("model.safetensors.bak"), b"keep").unwrap();
    fs::write(dir.join("other-00001-of-00002.safetensors"), b"keep").unwrap();
    save(&dir, &specs, 1 << 30, None);
    assert_eq!(
        listing(&dir),
        [
            "model.safetensors",
            "model.safetensors.bak",
            "other-00001-of-00002.safetensors"
        ]
    );
    let ckpt = Checkpoint::open(dir.join("model.safetensors"), Backend::Mmap).unwrap();
    assert_eq!(ckpt.len(), specs.len());
    // And back: the sharded save removes the single file (transformers would prefer it).
    save(&dir, &specs, 1000, None);
    assert!(!dir.join("model.safetensors").exists());
    assert!(dir.join("model.safetensors.index.json").exists());
    // Fewer shards than before: the extra old ones go.
    save(&dir, &specs, 3000, None);
    assert_eq!(
        listing(&dir),
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.bak",
            "model.safetensors.index.json",
            "other-00001-of-00002.safetensors",
        ]
    );
    Checkpoint::open(dir.join("model.safetensors.index.json"), Backend::Read)
        .unwrap()
        .locate("head")
        .unwrap();
}

#[test]
fn an_unfinished_or_incomplete_save_changes_nothing_in_the_directory() {
    let dir = scratch_dir("sharded_unfinished");
    let specs = specs();
    save(&dir, &specs, 1000, None);
    let before: Vec<(String, Vec<u8>)> = listing(&dir)
        .into_iter()
        .map(|n| {
            let bytes = fs::read(dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect();
    let other = vec![
        TensorSpec::new("x", Dtype::U8, &[600]),
        TensorSpec::new("y", Dtype::U8, &[600]),
    ];
    // Dropped half written.
    {
        let w = ShardedWriter::create(&dir, &other, None, options(1000)).unwrap();
        w.write("x", &[1; 600]).unwrap();
    }
    // Finished with a tensor missing: an error naming it, and nothing published.
    let mut w = ShardedWriter::create(&dir, &other, None, options(1000)).unwrap();
    w.write("x", &[1; 600]).unwrap();
    w.write_at("y", 0, &[1; 599]).unwrap();
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer, "{e}");
    assert!(e.to_string().contains("`y`"), "{e}");
    let after: Vec<(String, Vec<u8>)> = listing(&dir)
        .into_iter()
        .map(|n| {
            let bytes = fs::read(dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect();
    assert_eq!(before, after);
}

#[test]
fn bad_prefixes_and_an_index_path_that_is_a_directory_are_refused_up_front() {
    let dir = scratch_dir("sharded_refused");
    let specs = specs();
    for prefix in ["", ".", "..", "a/b", "../m"] {
        let e = ShardedWriter::create(
            &dir,
            &specs,
            None,
            ShardOptions {
                prefix: prefix.into(),
                ..options(1000)
            },
        )
        .err()
        .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidShardPath, "{prefix:?}: {e}");
    }
    fs::create_dir(dir.join("model.safetensors.index.json")).unwrap();
    let e = ShardedWriter::create(&dir, &specs, None, options(1000))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert_eq!(listing(&dir), ["model.safetensors.index.json"]);
    // Duplicate names across what would be different shards.
    let dup = vec![
        TensorSpec::new("a", Dtype::U8, &[900]),
        TensorSpec::new("a", Dtype::U8, &[900]),
    ];
    let e = ShardedWriter::create(&dir, &dup, None, options(1000))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::DuplicateKey, "{e}");
}

#[test]
fn a_single_file_save_replaces_the_index_of_a_file_named_as_a_shard() {
    // An earlier checkpoint's index names a shard; the new one-file save must not leave that
    // index pointing at files it did not write.
    let dir = scratch_dir("sharded_old_index");
    serialize_to_file(
        [("w", TensorView::new(Dtype::U8, &[1], &[9]))],
        None,
        dir.join("model-00001-of-00001.safetensors"),
    )
    .unwrap();
    fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map":{"w":"model-00001-of-00001.safetensors"}}"#,
    )
    .unwrap();
    save(&dir, &specs(), 1 << 30, None);
    assert_eq!(listing(&dir), ["model.safetensors"]);
}

/// Tensor name -> bytes of the checkpoint `path` opens.
fn contents(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let ckpt = Checkpoint::open(path, Backend::Read).unwrap();
    ckpt.names()
        .iter()
        .map(|n| {
            let (file, _) = ckpt.locate(n).unwrap();
            (n.to_owned(), file.tensor_bytes(n).unwrap().to_vec())
        })
        .collect()
}

/// A writer of `specs` with every byte written, each byte of the data changed by `xor`.
fn filled(dir: &Path, specs: &[TensorSpec], max: u64, xor: u8) -> ShardedWriter {
    let w = ShardedWriter::create(dir, specs, None, options(max)).unwrap();
    for (k, s) in specs.iter().enumerate() {
        let bytes: Vec<u8> = data_of(specs)[k].iter().map(|b| b ^ xor).collect();
        w.write(&s.name, &bytes).unwrap();
    }
    w
}

fn visible(dir: &Path) -> Vec<String> {
    listing(dir)
        .into_iter()
        .filter(|n| !n.starts_with(".st-"))
        .collect()
}

#[test]
fn a_save_over_the_same_shard_names_reads_back_the_new_bytes_and_leaves_no_backup() {
    let dir = scratch_dir("sharded_same_names");
    let specs = specs();
    save(&dir, &specs, 1000, None);
    let names = listing(&dir);
    let mut w = filled(&dir, &specs, 1000, 0xff);
    w.finish().unwrap();
    assert_eq!(listing(&dir), names);
    let got = contents(&dir.join("model.safetensors.index.json"));
    for (k, s) in specs.iter().enumerate() {
        let want: Vec<u8> = data_of(&specs)[k].iter().map(|b| b ^ 0xff).collect();
        assert_eq!(got[&s.name], want, "{}", s.name);
    }
}

#[test]
fn a_publish_that_fails_half_way_keeps_the_earlier_checkpoint_and_the_writer() {
    // The earlier checkpoint has 2 shards, the new one 4: a directory where the third new shard
    // goes stops the publish after two shards are in place.
    let dir = scratch_dir("sharded_half_way");
    let specs = specs();
    save(&dir, &specs, 3000, None);
    let index = dir.join("model.safetensors.index.json");
    let before: Vec<(String, Vec<u8>)> = listing(&dir)
        .into_iter()
        .map(|n| (n.clone(), fs::read(dir.join(&n)).unwrap()))
        .collect();
    let old = contents(&index);
    let mut w = filled(&dir, &specs, 1000, 0x55);
    fs::create_dir(dir.join("model-00003-of-00004.safetensors")).unwrap();
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("model-00003-of-00004"), "{e}");
    assert!(e.to_string().contains("nothing was published"), "{e}");
    fs::remove_dir(dir.join("model-00003-of-00004.safetensors")).unwrap();
    let after: Vec<(String, Vec<u8>)> = visible(&dir)
        .into_iter()
        .map(|n| (n.clone(), fs::read(dir.join(&n)).unwrap()))
        .collect();
    assert_eq!(after, before);
    assert_eq!(contents(&index), old);
    // The writer is as it was: it finishes now.
    w.finish().unwrap();
    assert_eq!(listing(&dir).len(), 5, "{:?}", listing(&dir));
    let new = contents(&index);
    assert_eq!(new.len(), specs.len());
    assert_ne!(new, old);
    assert_eq!(
        w.finish().unwrap_err().kind(),
        ErrorKind::Internal,
        "a published writer is done"
    );
}

#[test]
fn a_finish_with_bytes_missing_can_be_finished_once_they_are_written() {
    let dir = scratch_dir("sharded_missing_then_done");
    let specs = specs();
    let data = data_of(&specs);
    let mut w = ShardedWriter::create(&dir, &specs, None, options(1000)).unwrap();
    for (k, s) in specs.iter().enumerate().skip(1) {
        w.write(&s.name, &data[k]).unwrap();
    }
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer, "{e}");
    assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
    w.write(&specs[0].name, &data[0]).unwrap();
    w.finish().unwrap();
    assert_eq!(
        contents(&dir.join("model.safetensors.index.json"))[&specs[0].name],
        data[0]
    );
}

#[test]
fn an_index_the_writer_cannot_read_is_refused_and_left_with_what_it_may_name() {
    let dir = scratch_dir("sharded_unreadable_index");
    let specs = specs();
    fs::write(dir.join("model.safetensors.index.json"), b"{not json").unwrap();
    fs::write(dir.join("model-00001-of-00002.safetensors"), b"keep").unwrap();
    let mut w = filled(&dir, &specs, 1 << 30, 0);
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIndex, "{e}");
    let text = e.to_string();
    assert!(text.contains("model.safetensors.index.json"), "{text}");
    assert!(text.contains("move this file away"), "{text}");
    assert_eq!(
        visible(&dir),
        [
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json"
        ]
    );
    // Moved away, the save goes through, and the files of the prefix go as before.
    fs::rename(
        dir.join("model.safetensors.index.json"),
        dir.join("moved.json"),
    )
    .unwrap();
    w.finish().unwrap();
    assert_eq!(listing(&dir), ["model.safetensors", "moved.json"]);
}

#[test]
fn an_earlier_shard_that_is_a_symlink_the_new_set_would_replace_is_refused() {
    let dir = scratch_dir("sharded_symlinked_shard");
    let specs = specs();
    save(&dir, &specs, 3000, None);
    let shard = dir.join("model-00001-of-00002.safetensors");
    fs::rename(&shard, dir.join("elsewhere.safetensors")).unwrap();
    std::os::unix::fs::symlink("elsewhere.safetensors", &shard).unwrap();
    let old = contents(&dir.join("model.safetensors.index.json"));
    let mut w = filled(&dir, &specs, 3000, 1);
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert_eq!(contents(&dir.join("model.safetensors.index.json")), old);
}
