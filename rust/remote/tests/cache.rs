//! The local cache of whole remote files (`RemoteOptions::cache`), against nginx on loopback,
//! counting what nginx served (its access log): a file fetched whole is written there and a
//! later open maps it after one GET; a new version, or an entry corrupt or truncated, is
//! fetched again; the cache keeps within its bound, least recently used first; processes
//! opening one object at once fetch it once; names hold no query; a cache that cannot be used
//! is an `Io` error naming it.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{access_log, nginx, same_as_bytes, Scratch, Server};
use safetensors_core::{serialize, Dtype, ErrorKind, OpenOptions, TensorView};
use safetensors_remote::{default_cache_dir, open, RemoteOptions};

/// A file of `n` u32s and a small tensor, its bytes depending on `seed`.
fn sample(n: u32, seed: u32) -> Vec<u8> {
    let w: Vec<u8> = (0..n)
        .flat_map(|i| (i.wrapping_mul(7) ^ seed).to_le_bytes())
        .collect();
    let b: Vec<u8> = (0..16u8).map(|i| i ^ seed as u8).collect();
    serialize(
        [
            ("w", TensorView::new(Dtype::U32, &[n as usize], &w)),
            ("b", TensorView::new(Dtype::U8, &[4, 4], &b)),
        ],
        None,
    )
    .unwrap()
}

struct Served {
    root: Scratch,
    work: Scratch,
    server: Server,
}

fn serve(tag: &str, files: &[(&str, &[u8])]) -> Option<Served> {
    let root = Scratch::new(&format!("{tag}-root"));
    let work = Scratch::new(&format!("{tag}-nginx"));
    for (name, bytes) in files {
        std::fs::write(root.0.join(name), bytes).unwrap();
    }
    match nginx(&root.0, &work.0) {
        Ok(server) => Some(Served { root, work, server }),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

impl Served {
    fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.server.port)
    }

    /// The requests served so far, and the body bytes they sent. nginx logs a request after
    /// its answer is sent, so the log is read until it has stayed the same for 100 ms.
    fn served(&self) -> (usize, u64) {
        let read = || {
            let log = access_log(&self.work.0);
            (log.len(), log.iter().map(|(_, _, n)| n).sum())
        };
        let mut seen = read();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = read();
            if now == seen {
                return now;
            }
            seen = now;
        }
    }
}

/// Small first reads and parts: the header in one GET of 4 KiB, the data in many.
fn cached_in(dir: &Path) -> RemoteOptions {
    RemoteOptions {
        first_read: 4096,
        part_size: 64 * 1024,
        cache: Some(dir.to_owned()),
        ..RemoteOptions::default()
    }
}

/// The cache's files with this suffix.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(suffix))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn a_file_fetched_whole_is_cached_and_a_later_open_maps_it_after_one_get() {
    let bytes = sample(100_000, 1);
    let Some(s) = serve("cache-hit", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-hit-dir");
    let cache = dir.0.join("nested/cache");
    let url = s.url("model.safetensors");
    let first = open(&url, &cached_in(&cache), OpenOptions::default()).unwrap();
    same_as_bytes(&first, &bytes);
    assert_eq!(first.path(), Path::new(&url));
    let (requests, sent) = s.served();
    assert!(requests > 2, "{requests}");
    assert_eq!(sent, bytes.len() as u64, "the whole file, once");
    let data = files(&cache, ".safetensors");
    assert_eq!(data.len(), 1, "{data:?}");
    assert_eq!(std::fs::read(&data[0]).unwrap(), bytes);
    assert_eq!(files(&cache, ".tmp"), Vec::<PathBuf>::new());

    // Again: one GET of the first 4 KiB (the version check), then the cached copy, mapped.
    let again = open(&url, &cached_in(&cache), OpenOptions::default()).unwrap();
    assert!(again.is_in_memory());
    same_as_bytes(&again, &bytes);
    let (requests_after, sent_after) = s.served();
    assert_eq!(requests_after, requests + 1);
    assert_eq!(sent_after - sent, 4096);
    // An on-demand open maps the cached copy too.
    let lazy = RemoteOptions {
        on_demand: true,
        ..cached_in(&cache)
    };
    let f = open(&url, &lazy, OpenOptions::default()).unwrap();
    assert!(f.is_in_memory());
    same_as_bytes(&f, &bytes);
    assert_eq!(s.served().0, requests + 2);
}

#[test]
fn on_demand_and_header_only_opens_write_nothing_into_the_cache() {
    let bytes = sample(50_000, 2);
    let Some(s) = serve("cache-lazy", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-lazy-dir");
    let url = s.url("model.safetensors");
    let header_only = RemoteOptions {
        header_only: true,
        ..cached_in(&dir.0.join("h"))
    };
    open(&url, &header_only, OpenOptions::default()).unwrap();
    assert!(
        !dir.0.join("h").exists(),
        "a header-only open made the cache"
    );
    let lazy = RemoteOptions {
        on_demand: true,
        ..cached_in(&dir.0)
    };
    let f = open(&url, &lazy, OpenOptions::default()).unwrap();
    assert!(!f.is_in_memory());
    same_as_bytes(&f, &bytes);
    assert_eq!(files(&dir.0, ".safetensors"), Vec::<PathBuf>::new());
}

#[test]
fn a_new_version_is_fetched_again() {
    let old = sample(30_000, 3);
    let Some(s) = serve("cache-version", &[("model.safetensors", &old)]) else {
        return;
    };
    let dir = Scratch::new("cache-version-dir");
    let url = s.url("model.safetensors");
    same_as_bytes(
        &open(&url, &cached_in(&dir.0), OpenOptions::default()).unwrap(),
        &old,
    );
    // Another version: other bytes of the same length, another modification time (nginx's
    // ETag is made of both).
    let new = sample(30_000, 4);
    let path = s.root.0.join("model.safetensors");
    std::fs::write(&path, &new).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let (_, before) = s.served();
    same_as_bytes(
        &open(&url, &cached_in(&dir.0), OpenOptions::default()).unwrap(),
        &new,
    );
    assert_eq!(
        s.served().1 - before,
        new.len() as u64,
        "fetched whole again"
    );
    assert_eq!(files(&dir.0, ".safetensors").len(), 2);
}

#[test]
fn a_corrupt_or_truncated_entry_is_fetched_again_never_trusted() {
    let bytes = sample(100_000, 5);
    let Some(s) = serve("cache-corrupt", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-corrupt-dir");
    let url = s.url("model.safetensors");
    open(&url, &cached_in(&dir.0), OpenOptions::default()).unwrap();
    let data = files(&dir.0, ".safetensors").remove(0);
    type Spoil = fn(&Path);
    let spoils: [(&str, Spoil); 5] = [
        ("truncated", |p| {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_len(1000).unwrap();
        }),
        ("a byte of the data changed in place", |p| {
            let mut f = std::fs::File::options().write(true).open(p).unwrap();
            f.seek(SeekFrom::Start(300_000)).unwrap();
            f.write_all(&[0xAB]).unwrap();
        }),
        ("a byte of the header changed", |p| {
            let mut f = std::fs::File::options().write(true).open(p).unwrap();
            f.seek(SeekFrom::Start(20)).unwrap();
            f.write_all(b"#").unwrap();
        }),
        ("replaced by another file", |p| {
            std::fs::write(p.with_extension("other"), sample(100_000, 6)).unwrap();
            std::fs::rename(p.with_extension("other"), p).unwrap();
        }),
        ("removed", |p| std::fs::remove_file(p).unwrap()),
    ];
    for (what, spoil) in spoils {
        // A write in the same tick of the kernel's clock as the cache's own rename would leave
        // the change time as it was (see src/cache/entry.rs); edits come later than that.
        std::thread::sleep(Duration::from_millis(30));
        spoil(&data);
        let (_, before) = s.served();
        let f = open(&url, &cached_in(&dir.0), OpenOptions::default()).unwrap();
        same_as_bytes(&f, &bytes);
        assert_eq!(
            s.served().1 - before,
            bytes.len() as u64,
            "{what}: not fetched again"
        );
        assert_eq!(std::fs::read(&data).unwrap(), bytes, "{what}");
    }
}

#[test]
fn the_cache_keeps_within_its_bound_least_recently_used_first() {
    let (a, b, c) = (sample(50_000, 7), sample(50_000, 8), sample(50_000, 9));
    let Some(s) = serve(
        "cache-bound",
        &[
            ("a.safetensors", &a),
            ("b.safetensors", &b),
            ("c.safetensors", &c),
        ],
    ) else {
        return;
    };
    let dir = Scratch::new("cache-bound-dir");
    // Room for two of the three.
    let options = RemoteOptions {
        cache_limit: 2 * a.len() as u64 + 100,
        ..cached_in(&dir.0)
    };
    let opened = |name: &str| open(&s.url(name), &options, OpenOptions::default()).unwrap();
    opened("a.safetensors");
    std::thread::sleep(Duration::from_millis(20));
    opened("b.safetensors");
    std::thread::sleep(Duration::from_millis(20));
    // a used again: b is now the least recently used.
    opened("a.safetensors");
    std::thread::sleep(Duration::from_millis(20));
    opened("c.safetensors");
    let kept: Vec<Vec<u8>> = files(&dir.0, ".safetensors")
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(kept.len(), 2);
    assert!(kept.contains(&a) && kept.contains(&c) && !kept.contains(&b));
    assert_eq!(files(&dir.0, ".meta").len(), 2);
    // A file larger than the bound is read, and not cached.
    let tiny = RemoteOptions {
        cache_limit: 1000,
        ..cached_in(&dir.0)
    };
    same_as_bytes(
        &open(&s.url("b.safetensors"), &tiny, OpenOptions::default()).unwrap(),
        &b,
    );
    assert_eq!(files(&dir.0, ".safetensors").len(), 2);
}

#[test]
fn names_hold_no_query_and_signed_urls_of_one_object_share_its_entry() {
    let bytes = sample(20_000, 10);
    let Some(s) = serve("cache-names", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-names-dir");
    for signature in ["Signature0123456789abc", "Signature9876543210xyz"] {
        let url = format!("{}?X-Amz-Signature={signature}", s.url("model.safetensors"));
        same_as_bytes(
            &open(&url, &cached_in(&dir.0), OpenOptions::default()).unwrap(),
            &bytes,
        );
    }
    assert_eq!(files(&dir.0, ".safetensors").len(), 1);
    for entry in std::fs::read_dir(&dir.0).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!name.contains("Signature"), "{name}");
        if name.ends_with(".meta") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            assert!(!text.contains("Signature") && !text.contains('?'), "{text}");
        }
    }
}

#[test]
fn a_cache_that_cannot_be_used_is_an_io_error_naming_it() {
    let bytes = sample(1000, 11);
    let Some(s) = serve("cache-bad", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-bad-dir");
    let file = dir.0.join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let url = s.url("model.safetensors");
    let e = open(&url, &cached_in(&file), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&url) && text.contains(&*file.to_string_lossy()),
        "{text}"
    );
}

// A directory others can write into could hold an entry planted for the object (its key is a
// digest of the URL and the public version): refused, and so is an entry that is no regular
// file (a FIFO would hang the open).
#[test]
fn a_cache_others_can_write_is_refused_and_odd_entries_are_never_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let bytes = sample(1000, 14);
    let Some(s) = serve("cache-open", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let url = s.url("model.safetensors");
    let dir = Scratch::new("cache-open-dir");
    let shared = dir.0.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = open(&url, &cached_in(&shared), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("others can write"), "{e}");
    // A private cache whose entry's files were replaced by a FIFO and a symbolic link: the
    // open neither hangs nor trusts them, and fetches the object again.
    let private = dir.0.join("private");
    std::fs::create_dir(&private).unwrap();
    let first = open(&url, &cached_in(&private), OpenOptions::default()).unwrap();
    same_as_bytes(&first, &bytes);
    drop(first);
    let meta = files(&private, ".meta").pop().expect("a meta file");
    let data = files(&private, ".safetensors").pop().expect("a data file");
    std::fs::remove_file(&meta).unwrap();
    let fifo = std::ffi::CString::new(meta.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let again = open(&url, &cached_in(&private), OpenOptions::default()).unwrap();
    same_as_bytes(&again, &bytes);
    drop(again);
    std::fs::remove_file(&data).unwrap();
    std::os::unix::fs::symlink(dir.0.join("elsewhere"), &data).unwrap();
    let third = open(&url, &cached_in(&private), OpenOptions::default()).unwrap();
    same_as_bytes(&third, &bytes);
}

#[test]
fn an_open_waiting_for_another_fetch_ends_at_its_deadline() {
    let bytes = sample(1000, 12);
    let Some(s) = serve("cache-wait", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-wait-dir");
    let url = s.url("model.safetensors");
    open(&url, &cached_in(&dir.0), OpenOptions::default()).unwrap();
    // Another "process" holds the entry's lock (a lock file is its own open file description).
    let lock = files(&dir.0, ".lock").remove(0);
    let held = std::fs::File::open(&lock).unwrap();
    // SAFETY: our own descriptor.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let options = RemoteOptions {
        deadline: Some(Duration::from_millis(300)),
        ..cached_in(&dir.0)
    };
    let start = std::time::Instant::now();
    let e = open(&url, &options, OpenOptions::default())
        .err()
        .expect("timed out");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("still fetching"), "{e}");
    drop(held);
    same_as_bytes(
        &open(&url, &options, OpenOptions::default()).unwrap(),
        &bytes,
    );
}

#[test]
fn the_default_cache_directory_follows_xdg() {
    // The only test of this program that reads these variables.
    std::env::set_var("XDG_CACHE_HOME", "/var/tmp/xdg");
    assert_eq!(
        default_cache_dir(),
        Some(PathBuf::from("/var/tmp/xdg/safetensors"))
    );
    std::env::set_var("XDG_CACHE_HOME", "relative/ignored");
    std::env::set_var("HOME", "/home/someone");
    assert_eq!(
        default_cache_dir(),
        Some(PathBuf::from("/home/someone/.cache/safetensors"))
    );
}

/// The child of [`processes_opening_one_object_at_once_fetch_it_once`]: opens the URL it is
/// given through the cache it is given, and checks every byte.
#[test]
#[ignore = "run by processes_opening_one_object_at_once_fetch_it_once"]
fn cache_child() {
    let (Ok(url), Ok(dir)) = (
        std::env::var("CACHE_CHILD_URL"),
        std::env::var("CACHE_CHILD_DIR"),
    ) else {
        return;
    };
    let f = open(&url, &cached_in(Path::new(&dir)), OpenOptions::default()).unwrap();
    same_as_bytes(&f, &sample(500_000, 13));
}

#[test]
fn processes_opening_one_object_at_once_fetch_it_once() {
    let bytes = sample(500_000, 13);
    let Some(s) = serve("cache-processes", &[("model.safetensors", &bytes)]) else {
        return;
    };
    let dir = Scratch::new("cache-processes-dir");
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&me)
                .args(["--exact", "cache_child", "--ignored", "--nocapture"])
                .env("CACHE_CHILD_URL", s.url("model.safetensors"))
                .env("CACHE_CHILD_DIR", &dir.0)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    // Each child's first GET (4 KiB, its version check), and the rest of the object once.
    let (_, sent) = s.served();
    assert_eq!(sent, 4 * 4096 + (bytes.len() as u64 - 4096));
    assert_eq!(files(&dir.0, ".safetensors").len(), 1);
}
