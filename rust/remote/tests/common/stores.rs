//! One matrix for the object stores reached through their own APIs (GCS, Azure Blob), run
//! against their emulators: every mode reads what a local copy holds, a missing object and the
//! hostile corpus get the kinds a local file gets, a checkpoint's shards are found next to its
//! index, and an object replaced after its header was read is refused.

use std::path::Path;
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use safetensors_core::{serialize, Dtype, ErrorKind, OpenOptions, SafeFile, TensorView};
use safetensors_remote::{open, open_checkpoint, open_header, RemoteOptions};

use super::{same_as_bytes, Scratch};

/// Writes object `key` (relative to the bucket or container) with these bytes.
type Put = Box<dyn Fn(&str, &[u8])>;

/// Writes objects into a bucket or container of an emulator.
pub struct Uploader {
    put: Put,
}

impl Uploader {
    /// Through a store's own API (object_store's `put`).
    pub fn store(store: Arc<dyn ObjectStore>) -> Uploader {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Uploader {
            put: Box::new(move |key, bytes| {
                let path = ObjectPath::from(key);
                let payload = PutPayload::from(bytes.to_vec());
                runtime
                    .block_on(store.put(&path, payload))
                    .unwrap_or_else(|e| panic!("uploading {key}: {e}"));
            }),
        }
    }

    /// Through `put(key, bytes)`.
    pub fn with(put: impl Fn(&str, &[u8]) + 'static) -> Uploader {
        Uploader { put: Box::new(put) }
    }

    pub fn put(&self, key: &str, bytes: &[u8]) {
        (self.put)(key, bytes)
    }
}

fn sample() -> Vec<u8> {
    let w: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let b: Vec<u8> = (0..24u8).collect();
    serialize(
        [
            ("w", TensorView::new(Dtype::U32, &[1000, 200], &w)),
            ("b", TensorView::new(Dtype::U8, &[24], &b)),
        ],
        None,
    )
    .unwrap()
}

fn parts(on_demand: bool) -> RemoteOptions {
    RemoteOptions {
        first_read: 32,
        part_size: 100_000,
        concurrency: 4,
        max_retries: 0,
        on_demand,
        ..RemoteOptions::default()
    }
}

/// The matrix over `base` (`gs://bucket` or `az://container`, or an https form of either),
/// whose objects `up` writes (keys relative to the bucket or container). `what` names the
/// store in messages.
pub fn matrix(what: &str, base: &str, up: &Uploader) {
    let bytes = sample();
    up.put("model.safetensors", &bytes);
    let url = format!("{base}/model.safetensors");
    for on_demand in [false, true] {
        let remote = open(&url, &parts(on_demand), OpenOptions::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(remote.is_in_memory(), !on_demand, "{what}");
        same_as_bytes(&remote, &bytes);
    }

    // A missing object: `Io`, naming the URL.
    let absent = format!("{base}/absent.safetensors");
    let e = open(&absent, &parts(false), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e}");
    assert!(e.to_string().contains(&absent), "{what}: {e}");

    // A checkpoint: the index's shards next to it, by their names.
    let one = serialize([("a", TensorView::new(Dtype::U8, &[3], &[1, 2, 3]))], None).unwrap();
    up.put("ckpt/model-1.safetensors", &one);
    up.put("ckpt/sub/model-2.safetensors", &bytes);
    up.put(
        "ckpt/model.safetensors.index.json",
        br#"{"weight_map": {"a": "model-1.safetensors", "w": "sub/model-2.safetensors", "b": "sub/model-2.safetensors"}}"#,
    );
    let index = format!("{base}/ckpt/model.safetensors.index.json");
    for on_demand in [false, true] {
        let ckpt = open_checkpoint(&index, &parts(on_demand), Default::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(ckpt.shard_count(), 2, "{what}");
        let (file, _) = ckpt.locate("a").unwrap();
        assert_eq!(&*file.tensor_bytes("a").unwrap(), &[1, 2, 3]);
        let (file, _) = ckpt.locate("w").unwrap();
        same_as_bytes(file, &bytes);
    }

    // The hostile corpus: the kinds a local file gets.
    let corpus = Scratch::new("stores-corpus");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile/make_corpus.py");
    let made = std::process::Command::new("python3")
        .arg(script)
        .arg(&corpus.0)
        .output()
        .unwrap();
    assert!(made.status.success());
    let manifest = std::fs::read_to_string(corpus.0.join("manifest.tsv")).unwrap();
    let mut checked = 0;
    for line in manifest.lines() {
        let name = line.split('\t').next().unwrap();
        let path = corpus.0.join(name);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        up.put(&format!("hostile/{name}"), &std::fs::read(&path).unwrap());
        let local = SafeFile::open(&path, safetensors_core::Backend::Read);
        let url = format!("{base}/hostile/{name}");
        for on_demand in [false, true] {
            let remote = open(&url, &parts(on_demand), OpenOptions::default());
            match (&local, remote) {
                (Ok(l), Ok(r)) => {
                    for info in l.header().iter() {
                        assert_eq!(
                            r.tensor_bytes(info.name).map_err(|e| e.kind()),
                            l.tensor_bytes(info.name).map_err(|e| e.kind()),
                            "{what} {name} {}",
                            info.name
                        );
                    }
                }
                (Err(l), Err(r)) => {
                    assert_eq!(
                        r.kind(),
                        l.kind(),
                        "{what} {name}: from disk {l}; remote {r}"
                    );
                    assert!(r.to_string().contains(&url), "{what} {name}: {r}");
                }
                (l, r) => panic!(
                    "{what} {name}: from disk {}, remote {}",
                    l.is_ok(),
                    r.map(|_| ()).map_err(|e| e.to_string()).is_ok()
                ),
            }
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} corpus files checked");

    // An object replaced after its header was read: its pinned version no longer matches.
    let object = open_header(&url, &parts(false), OpenOptions::default()).unwrap();
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    up.put("model.safetensors", &other);
    let e = object.fetch_all().expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e}");
    assert!(e.to_string().contains("changed"), "{what}: {e}");
}
