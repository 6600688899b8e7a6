//! Sharded checkpoints written for the tests: shard files and a `model.safetensors.index.json`
//! listing every tensor, each tensor's bytes a pattern of its own.

use std::path::{Path, PathBuf};

use safetensors_core::{serialize_to_file, Dtype, TensorView};

/// One tensor to write: name, dtype, shape.
pub type Spec = (String, Dtype, Vec<usize>);

/// The bytes of the `k`-th tensor written, `len` long: different for every tensor and offset.
pub fn pattern(k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(131) + k * 17 + j / 251) as u8)
        .collect()
}

/// Writes `shards[i]` to `model-<i>.safetensors` in `dir` and an index listing them shard by
/// shard (so the checkpoint numbers the shards in this order); returns the index's path.
pub fn write_sharded(dir: &Path, shards: &[Vec<Spec>]) -> PathBuf {
    let mut k = 0;
    let mut map = Vec::new();
    for (i, specs) in shards.iter().enumerate() {
        let file = format!("model-{i}.safetensors");
        let datas: Vec<Vec<u8>> = specs
            .iter()
            .map(|(_, d, s)| {
                k += 1;
                pattern(k, d.byte_size(s.iter().product()).unwrap())
            })
            .collect();
        serialize_to_file(
            specs
                .iter()
                .zip(&datas)
                .map(|((n, d, s), b)| (n.as_str(), TensorView::new(*d, s, b))),
            None,
            dir.join(&file),
        )
        .unwrap();
        map.extend(specs.iter().map(|(n, _, _)| format!("\"{n}\":\"{file}\"")));
    }
    let index = dir.join("model.safetensors.index.json");
    let json = format!("{{\"metadata\":{{}},\"weight_map\":{{{}}}}}", map.join(","));
    std::fs::write(&index, json).unwrap();
    index
}
