//! Checkpoints and process-wide state: the current directory changing after open, the number
//! of open descriptors, and shard files replaced behind an open checkpoint. These tests change
//! or count process-wide things, so they live in their own test binary and take turns.

mod common;

use std::path::Path;
use std::sync::Mutex;

use common::scratch_dir;
use safetensors_core::{serialize_to_file, Backend, Checkpoint, Dtype, ErrorKind, TensorView};

static TURN: Mutex<()> = Mutex::new(());

fn shard(path: &Path, names: &[String], fill: u8) {
    let data = [fill; 4];
    let views: Vec<(&str, TensorView)> = names
        .iter()
        .map(|n| (n.as_str(), TensorView::new(Dtype::U8, &[4], &data)))
        .collect();
    serialize_to_file(views, None, path).unwrap();
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Restores the current directory when dropped, even if the test fails.
struct Cwd(std::path::PathBuf);

impl Drop for Cwd {
    fn drop(&mut self) {
        let _ = std::env::set_current_dir(&self.0);
    }
}

#[test]
fn a_relative_index_path_keeps_its_shards_after_a_chdir() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let root = scratch_dir("relative_index_chdir");
    // Two directories with the same layout and different contents.
    for (side, fill) in [("x", 1u8), ("y", 2u8)] {
        let dir = root.join(side).join("ckpt");
        std::fs::create_dir_all(&dir).unwrap();
        shard(&dir.join("a.safetensors"), &["w".into()], fill);
        std::fs::write(
            dir.join("m.index.json"),
            r#"{"weight_map":{"w":"a.safetensors"}}"#,
        )
        .unwrap();
    }
    let _restore = Cwd(std::env::current_dir().unwrap());
    for backend in [Backend::Mmap, Backend::Read] {
        std::env::set_current_dir(root.join("x")).unwrap();
        let c = Checkpoint::open("ckpt/m.index.json", backend).unwrap();
        std::env::set_current_dir(root.join("y")).unwrap();
        let (file, _) = c.locate("w").unwrap();
        assert_eq!(
            file.tensor_bytes("w").unwrap().as_ref(),
            [1; 4],
            "{backend:?}: read the shard of the directory changed into"
        );
        assert!(c.shard_path(0).unwrap().is_absolute());
    }
}

#[test]
fn the_read_backend_keeps_no_descriptor_per_shard() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch_dir("descriptor_per_shard");
    const SHARDS: usize = 300;
    let mut map = Vec::new();
    for i in 0..SHARDS {
        let name = format!("w{i:04}");
        let file = format!("s{i:04}.safetensors");
        shard(&dir.join(&file), std::slice::from_ref(&name), i as u8);
        map.push(format!("\"{name}\":\"{file}\""));
    }
    std::fs::write(
        dir.join("m.index.json"),
        format!("{{\"weight_map\":{{{}}}}}", map.join(",")),
    )
    .unwrap();
    let c = Checkpoint::open(dir.join("m.index.json"), Backend::Read).unwrap();
    let before = open_descriptors();
    for i in 0..SHARDS {
        let name = format!("w{i:04}");
        let (file, _) = c.locate(&name).unwrap();
        assert_eq!(file.tensor_bytes(&name).unwrap().as_ref(), [i as u8; 4]);
    }
    assert_eq!(c.shards_opened(), SHARDS);
    let after = open_descriptors();
    assert!(
        after <= before + 4,
        "{SHARDS} open shards hold {} descriptors",
        after.saturating_sub(before)
    );
}

#[test]
fn a_shard_replaced_after_open_is_an_error_not_other_data() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch_dir("replaced_shard");
    let names = ["w".to_string()];
    shard(&dir.join("a.safetensors"), &names, 1);
    std::fs::write(
        dir.join("m.index.json"),
        r#"{"weight_map":{"w":"a.safetensors"}}"#,
    )
    .unwrap();
    let c = Checkpoint::open(dir.join("m.index.json"), Backend::Read).unwrap();
    let (file, _) = c.locate("w").unwrap();
    assert_eq!(file.tensor_bytes("w").unwrap().as_ref(), [1; 4]);
    // Same layout, other bytes, renamed over the shard (as every writer replaces files).
    shard(&dir.join("a.safetensors"), &names, 9);
    let err = file.tensor_bytes("w").err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("replaced"), "{err}");
}
