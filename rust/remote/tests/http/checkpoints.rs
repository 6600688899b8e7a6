//! Remote checkpoints over HTTP: an index fetched whole and checked as a local one, its shards
//! the objects next to it (by their literal names), opened on first use, on demand or whole.

use super::*;

/// A checkpoint of two shards and its index in `dir`; returns the tensors' bytes by name.
fn write_checkpoint(dir: &Path, extra_shard: Option<&str>) -> Vec<(String, Vec<u8>)> {
    let a: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i ^ 0x5a5a).to_le_bytes())
        .collect();
    let b: Vec<u8> = (0..40u8).collect();
    let c: Vec<u8> = (0..16u8).rev().collect();
    let one = serialize([("a", TensorView::new(Dtype::U32, &[200_000], &a))], None).unwrap();
    let two = serialize(
        [
            ("b", TensorView::new(Dtype::U8, &[5, 8], &b)),
            ("c", TensorView::new(Dtype::U8, &[16], &c)),
        ],
        None,
    )
    .unwrap();
    std::fs::write(dir.join("model-1.safetensors"), one).unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/model-2.safetensors"), two).unwrap();
    let third = extra_shard.map_or(String::new(), |s| format!(r#", "d": "{s}""#));
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        format!(
            r#"{{"metadata": {{"total_size": "800056"}}, "weight_map": {{"a": "model-1.safetensors", "b": "./sub/model-2.safetensors", "c": "sub//model-2.safetensors"{third}}}}}"#
        ),
    )
    .unwrap();
    vec![("a".into(), a), ("b".into(), b), ("c".into(), c)]
}

#[test]
fn a_remote_index_opens_its_shards_next_to_it_on_first_use() {
    let Some(s) = serve("ckpt", &sample()) else {
        return;
    };
    let want = write_checkpoint(&s.root.0, None);
    let u = url(s.server.port, "model.safetensors.index.json");
    for remote in [many_parts(), on_demand(many_parts())] {
        let ckpt = safetensors_remote::open_checkpoint(&u, &remote, Default::default()).unwrap();
        assert_eq!(ckpt.names(), ["a", "b", "c"]);
        assert_eq!(ckpt.shard_count(), 2);
        assert_eq!(ckpt.metadata().unwrap()["total_size"], "800056");
        assert_eq!(
            ckpt.shard_path(1).unwrap(),
            Path::new(&url(s.server.port, "sub/model-2.safetensors"))
        );
        assert_eq!(ckpt.shards_opened(), 0);
        for (name, bytes) in &want {
            let (file, _) = ckpt.locate(name).unwrap();
            assert_eq!(
                &*file.tensor_bytes(name).unwrap(),
                bytes.as_slice(),
                "{name}"
            );
        }
        assert_eq!(ckpt.shards_opened(), 2);
    }
    // A single remote file is a checkpoint of one shard.
    let one = safetensors_remote::open_checkpoint(
        &url(s.server.port, "model-1.safetensors"),
        &on_demand(many_parts()),
        Default::default(),
    )
    .unwrap();
    assert_eq!(one.names(), ["a"]);
    assert_eq!(
        &*one.locate("a").unwrap().0.tensor_bytes("a").unwrap(),
        want[0].1.as_slice()
    );
}

#[test]
fn a_remote_index_is_checked_as_a_local_one_is() {
    let Some(s) = serve("ckpt-bad", &sample()) else {
        return;
    };
    // A shard the server does not have: ShardMissing when first used, naming the index.
    write_checkpoint(&s.root.0, Some("absent.safetensors"));
    let u = url(s.server.port, "model.safetensors.index.json");
    let ckpt = safetensors_remote::open_checkpoint(&u, &many_parts(), Default::default()).unwrap();
    let e = ckpt.locate("d").err().expect("refused");
    assert_eq!(e.kind(), ErrorKind::ShardMissing, "{e}");
    assert!(e.to_string().contains("absent.safetensors"), "{e}");
    // A shard path leaving the index's directory: refused at open, as locally.
    write_checkpoint(&s.root.0, Some("../escape.safetensors"));
    let e = safetensors_remote::open_checkpoint(&u, &many_parts(), Default::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::InvalidShardPath, "{e}");
    assert!(e.to_string().contains(&u), "{e}");
    // A shard that lacks a tensor the index gives it: ShardMissing when first opened.
    write_checkpoint(&s.root.0, Some("model-1.safetensors"));
    std::fs::write(
        s.root.0.join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "model-1.safetensors", "b": "sub/model-2.safetensors", "c": "model-1.safetensors"}}"#,
    )
    .unwrap();
    let ckpt = safetensors_remote::open_checkpoint(&u, &many_parts(), Default::default()).unwrap();
    let e = ckpt.locate("a").err().expect("refused");
    assert_eq!(e.kind(), ErrorKind::ShardMissing, "{e}");
    // A missing index: Io naming the URL.
    let gone = url(s.server.port, "absent.index.json");
    let e = safetensors_remote::open_checkpoint(&gone, &many_parts(), Default::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.to_string().contains(&gone) && e.to_string().contains("404"),
        "{e}"
    );
}

#[test]
fn an_on_demand_read_of_a_hung_connection_ends_at_the_deadline_and_the_file_reads_again() {
    let bytes = sample();
    let Some(s) = serve("on-demand-hang", &bytes) else {
        return;
    };
    // The header's two GETs pass; the third hangs. Every later one passes again.
    let p = proxy(s.server.port, "hang-once", 2);
    let u = url(p.port, "model.safetensors");
    let options = RemoteOptions {
        deadline: Some(Duration::from_secs(2)),
        request_timeout: Duration::from_secs(60),
        ..on_demand(impatient())
    };
    let f = open(&u, &options, OpenOptions::default()).unwrap();
    let started = std::time::Instant::now();
    let e = f.tensor_bytes("small").expect_err("refused");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains(&u) && text.contains("deadline"), "{text}");
    // The failed read left nothing behind: the next one is whole and right.
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    assert_eq!(
        f.tensor_bytes("big").unwrap(),
        local.tensor_bytes("big").unwrap()
    );
}

#[test]
fn a_remote_shard_is_the_object_of_its_literal_name_next_to_the_index() {
    let Some(s) = serve("ckpt-names", &sample()) else {
        return;
    };
    // The checkpoint in `dir/`, a file of the same tensor names above it, and a shard whose
    // name holds characters that mean something in a URL.
    let dir = s.root.0.join("dir");
    std::fs::create_dir_all(&dir).unwrap();
    let want = write_checkpoint(&dir, None);
    std::fs::copy(
        dir.join("model-1.safetensors"),
        dir.join("a b%41+é.safetensors"),
    )
    .unwrap();
    let outside = serialize([("a", TensorView::new(Dtype::U8, &[3], &[9, 9, 9]))], None).unwrap();
    std::fs::write(s.root.0.join("escape.safetensors"), outside).unwrap();
    let u = url(s.server.port, "dir/model.safetensors.index.json");
    let index = |shard: &str| {
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            format!(r#"{{"weight_map": {{"a": "{shard}"}}}}"#),
        )
        .unwrap();
    };
    // Names that a URL would read as a climb out of `dir/` are plain (missing) names there.
    for climb in ["%2e%2e/escape.safetensors", r"..\\escape.safetensors"] {
        index(climb);
        let ckpt =
            safetensors_remote::open_checkpoint(&u, &many_parts(), Default::default()).unwrap();
        let e = ckpt.locate("a").err().expect("refused");
        assert_eq!(e.kind(), ErrorKind::ShardMissing, "{climb}: {e}");
    }
    // A name with a space, a percent sign, a plus and a non-ASCII letter is that file.
    index("a b%41+é.safetensors");
    for remote in [many_parts(), on_demand(many_parts())] {
        let ckpt = safetensors_remote::open_checkpoint(&u, &remote, Default::default()).unwrap();
        let (file, _) = ckpt.locate("a").unwrap();
        assert_eq!(&*file.tensor_bytes("a").unwrap(), want[0].1.as_slice());
    }
    // An index URL whose path spells its `/` encoded is still the index in `dir/`, and its
    // shards are next to it there, not next to the URL's last literal `/`.
    index("model-1.safetensors");
    std::fs::copy(
        s.root.0.join("escape.safetensors"),
        s.root.0.join("model-1.safetensors"),
    )
    .unwrap();
    let encoded = url(s.server.port, "dir%2Fmodel.safetensors.index.json");
    let ckpt =
        safetensors_remote::open_checkpoint(&encoded, &many_parts(), Default::default()).unwrap();
    assert_eq!(
        ckpt.shard_path(0).unwrap(),
        Path::new(&url(s.server.port, "dir/model-1.safetensors"))
    );
    let (file, _) = ckpt.locate("a").unwrap();
    assert_eq!(&*file.tensor_bytes("a").unwrap(), want[0].1.as_slice());
}
