//! Publishing under failure and interruption, step by step: for each way a new checkpoint can
//! replace an old one in a directory (the same shard names, other names, one file for a set and
//! the reverse), each operation of the sequence in turn is made to fail (EXDEV, ENOSPC, EPERM,
//! or EIO from there on, the rollback included) or stops the sequence as a crash would (the seam
//! of `faults.rs`). After each, the directory must open as the old checkpoint with the old bytes
//! or as the new one with the new bytes, by its index and by its one file (as transformers looks
//! first), never neither and never a mix; a failure before the commit must leave it exactly as
//! it was with the writer able to finish again, and a save after any of it must leave exactly
//! the new checkpoint.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::faults::{plan, Fault};
use super::{ShardOptions, ShardedWriter, TensorSpec};
use crate::checkpoint::Checkpoint;
use crate::dtype::Dtype;
use crate::error::ErrorKind;
use crate::file::Backend;

const TENSORS: usize = 4;
const TENSOR_BYTES: usize = 100;

/// Tensor name -> bytes.
type Contents = BTreeMap<String, Vec<u8>>;

struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "st-publish-{}-{what}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn specs() -> Vec<TensorSpec> {
    (0..TENSORS)
        .map(|k| TensorSpec::new(format!("t{k}"), Dtype::U8, &[TENSOR_BYTES]))
        .collect()
}

/// The bytes of generation `generation` of the checkpoint: every tensor differs between
/// generations, so that a mix shows.
fn contents(generation: u8) -> Contents {
    (0..TENSORS)
        .map(|k| {
            (
                format!("t{k}"),
                vec![generation * 16 + k as u8; TENSOR_BYTES],
            )
        })
        .collect()
}

/// A writer of `generation` with shards of at most `max` bytes (100: four shards, 200: two,
/// 1000: one file), every byte written.
fn writer(dir: &Path, generation: u8, max: u64) -> ShardedWriter {
    let w = ShardedWriter::create(
        dir,
        &specs(),
        None,
        ShardOptions {
            max_shard_size: max,
            ..ShardOptions::default()
        },
    )
    .unwrap();
    for (name, bytes) in contents(generation) {
        w.write(&name, &bytes).unwrap();
    }
    w
}

fn save(dir: &Path, generation: u8, max: u64) {
    plan(Fault::None);
    writer(dir, generation, max).finish().unwrap();
    plan(Fault::None);
}

fn read(path: &Path) -> Option<Contents> {
    let ckpt = Checkpoint::open(path, Backend::Read).ok()?;
    let mut out = Contents::new();
    for name in ckpt.names() {
        let (file, _) = ckpt.locate(name).ok()?;
        out.insert(name.to_owned(), file.tensor_bytes(name).ok()?.to_vec());
    }
    Some(out)
}

/// What the directory opens as: by its index, else its one file; and by its one file, else its
/// index (transformers' order).
fn opened(dir: &Path) -> [Option<Contents>; 2] {
    let index = dir.join("model.safetensors.index.json");
    let single = dir.join("model.safetensors");
    let by_index = if index.exists() {
        read(&index)
    } else if single.exists() {
        read(&single)
    } else {
        None
    };
    let by_file = if single.exists() {
        read(&single)
    } else if index.exists() {
        read(&index)
    } else {
        None
    };
    [by_index, by_file]
}

/// Every file of the directory with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// The files of a snapshot but the hidden temporary files of writers.
fn visible(mut files: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    files.retain(|name, _| !name.starts_with(".st-"));
    files
}

/// Asserts that the directory opens as the old or the new checkpoint both ways; returns
/// whether it opens as the new one by its index.
fn whole(dir: &Path, old: &Contents, new: &Contents, case: &str) -> bool {
    let [by_index, by_file] = opened(dir);
    for (how, got) in [("by index", &by_index), ("by file", &by_file)] {
        let got = got.as_ref().unwrap_or_else(|| {
            panic!(
                "{case}: the directory opens as nothing {how}: {:?}",
                names(dir)
            )
        });
        assert!(
            got == old || got == new,
            "{case}: {how}, a mix of old and new: {:?}",
            names(dir)
        );
    }
    by_index.as_ref() == Some(new)
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = snapshot(dir).into_keys().collect();
    n.sort();
    n
}

/// The operations of publishing generation 2 with `new_max` over generation 1 saved with
/// `old_max` (none: an empty directory), and the position of the commit among them.
fn operations(old_max: Option<u64>, new_max: u64) -> (Vec<String>, usize) {
    let dir = Scratch::new("count");
    if let Some(max) = old_max {
        save(&dir.0, 1, max);
    }
    let mut w = writer(&dir.0, 2, new_max);
    plan(Fault::None);
    w.finish().unwrap();
    let ops = plan(Fault::None);
    let commit = ops
        .iter()
        .rposition(|op| {
            [
                "rename the new index into place",
                "remove the earlier index",
                "rename a new shard into place",
            ]
            .contains(&op.as_str())
        })
        .unwrap();
    (ops, commit)
}

/// Every fault at every operation of one replacement.
fn every_fault(what: &str, old_max: Option<u64>, new_max: u64) {
    let (ops, commit) = operations(old_max, new_max);
    let (old, new) = (contents(1), contents(2));
    let clean = {
        let dir = Scratch::new("clean");
        save(&dir.0, 2, new_max);
        snapshot(&dir.0)
    };
    for (k, op) in ops.iter().enumerate() {
        for fault in [
            Fault::FailAt(k, libc::EXDEV),
            Fault::FailAt(k, libc::ENOSPC),
            Fault::FailAt(k, libc::EPERM),
            Fault::FailFrom(k, libc::EIO),
            Fault::CrashAfter(k),
        ] {
            let case = format!("{what}: {fault:?} at `{op}`");
            let dir = Scratch::new("fault");
            let dir = &dir.0;
            if let Some(max) = old_max {
                save(dir, 1, max);
            }
            let before = snapshot(dir);
            let mut w = std::mem::ManuallyDrop::new(writer(dir, 2, new_max));
            plan(fault);
            let result = w.finish();
            plan(Fault::None);
            // Nothing of a writer runs after a crash, not even its destructor.
            if !matches!(fault, Fault::CrashAfter(_)) {
                let e = result.expect_err(&case);
                assert_eq!(e.kind(), ErrorKind::Io, "{case}: {e}");
            }
            let is_new = old_max.is_none() || whole(dir, &old, &new, &case);
            match fault {
                Fault::FailAt(..) if k <= commit => {
                    // Rolled back: exactly as before (the new files staged, hidden), and the
                    // writer finishes now.
                    let now = visible(snapshot(dir));
                    assert!(
                        now == before,
                        "{case}: {:?} after, {:?} before",
                        now.keys(),
                        before.keys()
                    );
                    w.finish()
                        .unwrap_or_else(|e| panic!("{case}: finishing again: {e}"));
                    let now = snapshot(dir);
                    assert!(now == clean, "{case}: finished again: {:?}", now.keys());
                    // SAFETY: not used again.
                    unsafe { std::mem::ManuallyDrop::drop(&mut w) };
                    continue;
                }
                Fault::FailAt(..) => {
                    // Published; only cleaning up failed, and the writer is done.
                    assert!(is_new, "{case}");
                    assert_eq!(
                        w.finish().unwrap_err().kind(),
                        ErrorKind::Internal,
                        "{case}"
                    );
                }
                Fault::FailFrom(..) if k <= commit => {
                    assert!(!is_new || old_max.is_none(), "{case}");
                }
                _ => {}
            }
            if !matches!(fault, Fault::CrashAfter(_)) {
                // SAFETY: not used again.
                unsafe { std::mem::ManuallyDrop::drop(&mut w) };
            }
            // Whatever happened, a save now leaves exactly the new checkpoint, apart from backups
            // and hidden files that an interruption left and nothing names.
            save(dir, 2, new_max);
            let mut after = visible(snapshot(dir));
            after.retain(|name, _| !name.starts_with("st-backup-"));
            assert!(after == clean, "{case}: saved again: {:?}", after.keys());
            assert_eq!(
                opened(dir),
                [Some(new.clone()), Some(new.clone())],
                "{case}"
            );
        }
    }
}

#[test]
fn the_same_shard_names_replaced_under_every_fault() {
    every_fault("4 shards over 4", Some(100), 100);
}

#[test]
fn other_shard_names_replaced_under_every_fault() {
    every_fault("4 shards over 2", Some(200), 100);
}

#[test]
fn a_set_replacing_one_file_under_every_fault() {
    every_fault("4 shards over 1 file", Some(1000), 100);
}

#[test]
fn one_file_replacing_a_set_under_every_fault() {
    every_fault("1 file over 4 shards", Some(100), 1000);
}

#[test]
fn one_file_replacing_one_file_and_a_first_save_under_every_fault() {
    every_fault("1 file over 1 file", Some(1000), 1000);
    every_fault("4 shards in an empty directory", None, 100);
}

#[test]
fn the_same_names_back_up_and_repoint_before_any_old_name_changes() {
    let (ops, _) = operations(Some(100), 100);
    let first_place = ops
        .iter()
        .position(|op| op == "rename a new shard into place")
        .unwrap();
    assert_eq!(
        ops[..first_place],
        [
            "back up a file of the earlier checkpoint",
            "back up a file of the earlier checkpoint",
            "back up a file of the earlier checkpoint",
            "back up a file of the earlier checkpoint",
            "back up the earlier index",
            "write a copy of the earlier index",
            "point the earlier index at the backups",
        ]
    );
    // With other names nothing is backed up: the new shards take free names.
    let (ops, _) = operations(Some(200), 100);
    assert!(!ops.iter().any(|op| op.starts_with("back up")), "{ops:?}");
}

#[test]
fn a_refused_hard_link_says_why_and_what_to_do_and_changes_nothing() {
    let dir = Scratch::new("exdev");
    save(&dir.0, 1, 100);
    let before = snapshot(&dir.0);
    for errno in [libc::EXDEV, libc::EPERM, libc::EOPNOTSUPP, libc::EMLINK] {
        let mut w = writer(&dir.0, 2, 100);
        plan(Fault::FailAt(1, errno));
        let e = w.finish().unwrap_err();
        plan(Fault::None);
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let text = e.to_string();
        for words in [
            "hard link",
            "save to a new directory",
            "nothing was published",
        ] {
            assert!(text.contains(words), "{words:?} not in {text}");
        }
        assert_eq!(snapshot(&dir.0), before);
    }
}

#[test]
fn a_crash_while_repointed_leaves_the_old_checkpoint_whole_through_its_backups() {
    let dir = Scratch::new("repointed");
    save(&dir.0, 1, 100);
    let (ops, _) = operations(Some(100), 100);
    let repoint = ops
        .iter()
        .position(|op| op == "point the earlier index at the backups")
        .unwrap();
    // Stopped right after two new shards took their names.
    let mut w = writer(&dir.0, 2, 100);
    plan(Fault::CrashAfter(repoint + 2));
    w.finish().unwrap_err();
    plan(Fault::None);
    std::mem::forget(w);
    let index = fs::read_to_string(dir.0.join("model.safetensors.index.json")).unwrap();
    assert_eq!(index.matches("st-backup-").count(), TENSORS, "{index}");
    assert_eq!(opened(&dir.0)[0], Some(contents(1)));
    // The next save clears the backups the index named.
    save(&dir.0, 2, 100);
    assert!(
        !names(&dir.0).iter().any(|n| n.starts_with("st-backup-")),
        "{:?}",
        names(&dir.0)
    );
    assert_eq!(opened(&dir.0)[0], Some(contents(2)));
}
