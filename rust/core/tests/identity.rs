//! A path opened twice is the same file or an error, and descriptors stay bounded: checkpoint
//! shards (read and direct backends) and prefetch threads open paths again and must find the
//! file they validated; a checkpoint of many shards reads under a small descriptor limit with
//! every backend; a failed `O_DIRECT` open for want of descriptors is an error, not a
//! "filesystem refused O_DIRECT" fallback.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::scratch_dir;
use common::sharded::{pattern, write_sharded, Spec};
use safetensors_core::{
    serialize_to_file, Backend, Checkpoint, Dtype, ErrorKind, Plan, PrefetchOptions, SafeFile,
    Source, StreamOptions, TensorStream, TensorView,
};

fn write_u8(path: &Path, name: &str, fill: u8, len: usize) {
    let data = vec![fill; len];
    serialize_to_file(
        [(name, TensorView::new(Dtype::U8, &[len], &data))],
        None,
        path,
    )
    .unwrap();
}

/// Puts another file (same name, shape and size, other bytes) at `path` by renaming it over.
fn replace_by_rename(path: &Path, fill: u8, len: usize) {
    let other = path.with_extension("new");
    write_u8(&other, "w", fill, len);
    std::fs::rename(&other, path).unwrap();
}

/// A checkpoint index with one shard, `model-0.safetensors`, holding `w` (U8, 10,000 bytes).
fn one_shard(dir: &Path) -> std::path::PathBuf {
    write_sharded(dir, &[vec![("w".to_string(), Dtype::U8, vec![10_000])]])
}

fn is_replaced(e: &safetensors_core::Error) -> bool {
    e.kind() == ErrorKind::Io
        && e.to_string()
            .contains("replaced or changed since it was opened")
}

#[test]
fn a_shard_renamed_over_is_an_error_never_the_new_files_bytes() {
    let dir = scratch_dir("identity_shard_renamed");
    for backend in [Backend::Read, Backend::Direct] {
        let index = one_shard(&dir);
        let path = dir.join("model-0.safetensors");
        let ckpt = Checkpoint::open(&index, backend).unwrap();
        let (file, info) = ckpt.locate("w").unwrap();
        let mut out = vec![0u8; 10_000];
        file.read_data(info.data_offsets.0 as u64, &mut out)
            .unwrap();
        assert_eq!(out, pattern(1, 10_000));
        replace_by_rename(&path, 2, 10_000);
        let err = file.read_data(0, &mut out).unwrap_err();
        assert!(is_replaced(&err), "{backend:?}: {err}");
        assert!(err.to_string().contains("model-0.safetensors"), "{err}");
        // Streams read through the same shard: the same error.
        let stream_err = TensorStream::open(Source::Checkpoint(&ckpt), None, Default::default())
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err();
        assert!(is_replaced(&stream_err), "{backend:?}: {stream_err}");
    }
}

#[test]
fn a_shard_rewritten_in_place_is_an_error_never_the_new_bytes() {
    let dir = scratch_dir("identity_shard_rewritten");
    for backend in [Backend::Read, Backend::Direct] {
        let index = one_shard(&dir);
        let path = dir.join("model-0.safetensors");
        let ckpt = Checkpoint::open(&index, backend).unwrap();
        let (file, _) = ckpt.locate("w").unwrap();
        // Same inode, same size, other bytes and another modification time.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut bytes = std::fs::read(&path).unwrap();
        let start = file.header().data_start();
        bytes[start..].fill(9);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
            .unwrap();
        let mut out = vec![0u8; 100];
        let err = file.read_data(0, &mut out).unwrap_err();
        assert!(is_replaced(&err), "{backend:?}: {err}");
    }
}

#[test]
fn a_file_renamed_over_before_its_prefetch_runs_is_reported_not_warmed() {
    let dir = scratch_dir("identity_prefetch");
    let path = dir.join("p.safetensors");
    write_u8(&path, "w", 1, 100_000);
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let f = SafeFile::open(&path, backend).unwrap();
        let plan = Plan::whole(&f);
        replace_by_rename(&path, 2, 100_000);
        let err = plan
            .prefetch(PrefetchOptions::default())
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(is_replaced(&err), "{backend:?}: {err}");
    }
}

/// How many shards the descriptor test writes, and the limit its child runs under: under the
/// old direct backend (two descriptors held per shard) the limit ran out at about a third.
const SHARDS: usize = 150;
const LIMIT: u64 = 96;

/// The child's part: raises nothing, lowers `RLIMIT_NOFILE` to [`LIMIT`], then reads every
/// tensor of the checkpoint in `ST_TEST_CHECKPOINT`, streamed and looked up, with `backend`.
fn read_all_under_the_limit(index: &Path) {
    let limit = libc::rlimit {
        rlim_cur: LIMIT,
        rlim_max: LIMIT,
    };
    // SAFETY: a plain system call with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let ckpt = Checkpoint::open(index, backend).unwrap();
        let options = StreamOptions {
            max_inflight_bytes: 1 << 20,
            ..StreamOptions::default()
        };
        let mut k = 0;
        for t in TensorStream::open(Source::Checkpoint(&ckpt), None, options).unwrap() {
            let t = t.unwrap_or_else(|e| panic!("{backend:?}, tensor {k}: {e}"));
            k += 1;
            assert_eq!(t.data(), &pattern(k, 8192)[..], "{backend:?} {}", t.name);
        }
        assert_eq!(k, SHARDS, "{backend:?}");
        for i in 0..SHARDS {
            let name = format!("t{i}");
            let bytes = ckpt.shard(i).unwrap().tensor_bytes(&name).unwrap();
            assert_eq!(&bytes[..], &pattern(i + 1, 8192)[..], "{backend:?} {name}");
        }
        println!("{backend:?}: read {SHARDS} shards under a limit of {LIMIT} descriptors");
    }
}

#[test]
fn a_checkpoint_of_many_shards_reads_under_a_small_descriptor_limit_with_every_backend() {
    if let Some(index) = std::env::var_os("ST_TEST_MANY_SHARDS") {
        read_all_under_the_limit(Path::new(&index));
        return;
    }
    let dir = scratch_dir("identity_many_shards");
    let shards: Vec<Vec<Spec>> = (0..SHARDS)
        .map(|i| vec![(format!("t{i}"), Dtype::U8, vec![8192])])
        .collect();
    let index = write_sharded(&dir, &shards);
    let name =
        "a_checkpoint_of_many_shards_reads_under_a_small_descriptor_limit_with_every_backend";
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("ST_TEST_MANY_SHARDS", &index)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Direct: read 150 shards"), "{text}");
}

/// The child's part: uses up every descriptor but one, so that the direct backend's first open
/// succeeds and its `O_DIRECT` open finds none left.
fn open_direct_with_one_descriptor_left(path: &Path) {
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
        }
    }
    held.pop();
    match SafeFile::open(path, Backend::Direct) {
        Ok(f) => panic!(
            "opened with one descriptor; fallback: {:?}",
            f.direct_fallback()
        ),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Io, "{e}");
            assert!(!e.to_string().contains("refused O_DIRECT"), "{e}");
            println!("refused as it should be: {e}");
        }
    }
    drop(held);
    let f = SafeFile::open(path, Backend::Direct).unwrap();
    assert_eq!(f.direct_fallback(), None);
}

#[test]
fn running_out_of_descriptors_is_an_error_not_a_refusal_of_o_direct() {
    if let Some(path) = std::env::var_os("ST_TEST_ONE_DESCRIPTOR") {
        open_direct_with_one_descriptor_left(Path::new(&path));
        return;
    }
    let dir = scratch_dir("identity_emfile");
    let path = dir.join("d.safetensors");
    write_u8(&path, "w", 3, 10_000);
    let name = "running_out_of_descriptors_is_an_error_not_a_refusal_of_o_direct";
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("ST_TEST_ONE_DESCRIPTOR", &path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("refused as it should be"), "{text}");
}

#[test]
fn a_direct_file_holds_its_descriptors_and_a_direct_shard_holds_none() {
    let dir = scratch_dir("identity_fd_count");
    let index = one_shard(&dir);
    let path = dir.join("model-0.safetensors");
    // Descriptors of this process open on `path` (other tests' files do not count).
    let open_on_path = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target == &path)
            .count()
    };
    assert_eq!(open_on_path(), 0);
    let files: Vec<Arc<SafeFile>> = (0..8)
        .map(|_| Arc::new(SafeFile::open(&path, Backend::Direct).unwrap()))
        .collect();
    assert_eq!(open_on_path(), 16, "two descriptors per direct file");
    drop(files);
    assert_eq!(open_on_path(), 0);
    let shards: Vec<Checkpoint> = (0..8)
        .map(|_| {
            let c = Checkpoint::open(&index, Backend::Direct).unwrap();
            assert_eq!(c.shard(0).unwrap().tensor_bytes("w").unwrap().len(), 10_000);
            c
        })
        .collect();
    assert_eq!(open_on_path(), 0, "no descriptor held per shard");
    drop(shards);
}
