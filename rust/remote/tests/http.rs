//! Remote files over HTTP against a real server (nginx on loopback, started here), and against
//! the fault proxy (tests/remote/fault_proxy.py) between them: what is fetched, the version pin,
//! and every broken answer a typed `Io` error naming the URL.

#[path = "http/checkpoints.rs"]
mod checkpoints;
#[path = "http/faults.rs"]
mod faults;

use faults::impatient;
mod common;

use std::path::Path;
use std::time::Duration;

use common::{access_log, nginx, proxy, proxy_with, same_tensors, Scratch, Server};
use safetensors_core::{serialize, Dtype, ErrorKind, OpenOptions, SafeFile, TensorView};
use safetensors_remote::{open, open_header, RemoteOptions};

/// A file of a few tensors, one of them several parts long, with metadata.
fn sample() -> Vec<u8> {
    let big: Vec<u8> = (0..300_000u32)
        .flat_map(|i| (i * 7).to_le_bytes())
        .collect();
    let small: Vec<u8> = (0..10u8).collect();
    let half: Vec<u8> = (0..64u16).flat_map(|i| (i * 3).to_le_bytes()).collect();
    let metadata: std::collections::BTreeMap<String, String> =
        [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect();
    serialize(
        [
            ("big", TensorView::new(Dtype::U32, &[300_000], &big)),
            ("small", TensorView::new(Dtype::U8, &[2, 5], &small)),
            ("half", TensorView::new(Dtype::F16, &[8, 8], &half)),
        ],
        Some(&metadata),
    )
    .unwrap()
}

/// Small parts and a small first read, so that a header read takes two GETs and the data many.
fn many_parts() -> RemoteOptions {
    RemoteOptions {
        first_read: 64,
        part_size: 64 * 1024,
        concurrency: 4,
        ..RemoteOptions::default()
    }
}

/// nginx serving a directory holding `model.safetensors` (the sample), or a skip.
struct Served {
    root: Scratch,
    work: Scratch,
    server: Server,
}

fn serve(tag: &str, bytes: &[u8]) -> Option<Served> {
    let root = Scratch::new(&format!("{tag}-root"));
    let work = Scratch::new(&format!("{tag}-nginx"));
    std::fs::write(root.0.join("model.safetensors"), bytes).unwrap();
    match nginx(&root.0, &work.0) {
        Ok(server) => Some(Served { root, work, server }),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

fn url(port: u16, name: &str) -> String {
    format!("http://127.0.0.1:{port}/{name}")
}

#[test]
fn reads_every_tensor_as_the_local_file_has_it() {
    let bytes = sample();
    let Some(s) = serve("every", &bytes) else {
        return;
    };
    let local =
        SafeFile::from_memory("local", Box::new(bytes.clone()), OpenOptions::default()).unwrap();
    for options in [RemoteOptions::default(), many_parts()] {
        let remote = open(
            &url(s.server.port, "model.safetensors"),
            &options,
            OpenOptions::default(),
        )
        .unwrap();
        assert!(remote.is_in_memory());
        assert_eq!(
            remote.path(),
            Path::new(&url(s.server.port, "model.safetensors"))
        );
        same_tensors(&remote, &local);
    }
}

#[test]
fn header_only_open_fetches_the_header_and_validates_it() {
    let bytes = sample();
    let Some(s) = serve("header", &bytes) else {
        return;
    };
    let object = open_header(
        &url(s.server.port, "model.safetensors"),
        &many_parts(),
        OpenOptions::default(),
    )
    .unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    // The first read (64 bytes) was short of the header: a second read fetched exactly the rest.
    assert_eq!(object.head(), &bytes[..8 + n]);
    assert_eq!(object.len(), bytes.len() as u64);
    assert_eq!(object.header().len(), 3);
}

#[test]
fn a_header_only_file_describes_tensors_and_refuses_reads() {
    let bytes = sample();
    let Some(s) = serve("header-file", &bytes) else {
        return;
    };
    let options = RemoteOptions {
        header_only: true,
        ..many_parts()
    };
    let u = url(s.server.port, "model.safetensors");
    let f = open(&u, &options, OpenOptions::default()).unwrap();
    assert_eq!(f.info("big").unwrap().shape, &[300_000]);
    assert_eq!(f.header().metadata().unwrap()["format"], "pt");
    assert!(!f.is_in_memory() && f.mapped_data().unwrap().is_none());
    let e = f.tensor_bytes("small").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.to_string().contains(&u) && e.to_string().contains("header"),
        "{e}"
    );
    let mut dst = [0u8; 4];
    assert_eq!(f.read_data(0, &mut dst).unwrap_err().kind(), ErrorKind::Io);
}

#[test]
fn a_missing_object_is_an_io_error_naming_the_url() {
    let Some(s) = serve("missing", &sample()) else {
        return;
    };
    let u = url(s.server.port, "absent.safetensors");
    let e = open(&u, &RemoteOptions::default(), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains(&u) && text.contains("404"), "{text}");
}

#[test]
fn an_object_replaced_after_its_header_was_read_is_refused() {
    let bytes = sample();
    let Some(s) = serve("replaced", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    let object = open_header(&u, &many_parts(), OpenOptions::default()).unwrap();
    // Another version at the same path: same length, other bytes, another modification time
    // (nginx's ETag is made of the length and that time).
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    let path = s.root.0.join("model.safetensors");
    std::fs::write(&path, &other).unwrap();
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let e = object.fetch_all().expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains(&u) && text.contains("changed"), "{text}");
}

#[test]
fn hostile_files_over_http_get_the_kinds_they_get_from_disk() {
    let corpus = Scratch::new("hostile-corpus");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile/make_corpus.py");
    let made = std::process::Command::new("python3")
        .arg(script)
        .arg(&corpus.0)
        .output()
        .expect("python3 runs make_corpus.py");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let work = Scratch::new("hostile-nginx");
    let server = match nginx(&corpus.0, &work.0) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let manifest = std::fs::read_to_string(corpus.0.join("manifest.tsv")).unwrap();
    let mut checked = 0;
    for line in manifest.lines() {
        let name = line.split('\t').next().unwrap();
        let path = corpus.0.join(name);
        // Directories, FIFOs and missing paths are file-system cases, with nothing to serve.
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let local = SafeFile::open(&path, safetensors_core::Backend::Read);
        let u = url(server.port, name);
        let remote = open(&u, &many_parts(), OpenOptions::default());
        match (local, remote) {
            (Ok(l), Ok(r)) => same_tensors(&r, &l),
            (Err(l), Err(r)) => {
                assert_eq!(r.kind(), l.kind(), "{name}: from disk {l}; over HTTP {r}");
                assert!(r.to_string().contains(&u), "{name}: {r}");
            }
            (l, r) => panic!(
                "{name}: from disk {:?}, over HTTP {:?}",
                l.map(|_| "opened").map_err(|e| e.to_string()),
                r.map(|_| "opened").map_err(|e| e.to_string())
            ),
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} corpus files checked");
}

fn on_demand(options: RemoteOptions) -> RemoteOptions {
    RemoteOptions {
        on_demand: true,
        ..options
    }
}

/// nginx's log once it holds at least `n` requests (it writes each after the answer).
fn logged(s: &Served, n: usize) -> Vec<(String, u16, u64)> {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let log = access_log(&s.work.0);
        if log.len() >= n || std::time::Instant::now() > until {
            return log;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_on_demand_file_fetches_exactly_what_is_read() {
    let bytes = sample();
    let Some(s) = serve("on-demand-exact", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    let f = open(&u, &on_demand(many_parts()), OpenOptions::default()).unwrap();
    assert!(!f.is_in_memory() && f.mapped_data().unwrap().is_none());
    // The open: the first read (64 bytes) and the rest of the header; no data.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let opened = logged(&s, 2);
    assert_eq!(opened.len(), 2, "{opened:?}");
    assert_eq!(opened[1].2, 8 + n - 64, "{opened:?}");
    let local =
        SafeFile::from_memory("local", Box::new(bytes.clone()), OpenOptions::default()).unwrap();
    // One small tensor: one GET of its 10 bytes.
    assert_eq!(
        f.tensor_bytes("small").unwrap(),
        local.tensor_bytes("small").unwrap()
    );
    let log = logged(&s, 3);
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!((log[2].1, log[2].2), (206, 10), "{log:?}");
    // Four elements of the 1.2 MB tensor: 16 bytes fetched, not the tensor.
    let (b, _) = f.info("big").unwrap().data_offsets;
    let mut four = [0u8; 16];
    f.read_data(b as u64 + 4000, &mut four).unwrap();
    let mut want = [0u8; 16];
    local.read_data(b as u64 + 4000, &mut want).unwrap();
    assert_eq!(four, want);
    let log = logged(&s, 4);
    assert_eq!(log.len(), 4, "{log:?}");
    assert_eq!((log[3].1, log[3].2), (206, 16), "{log:?}");
    // The whole big tensor: parts of 64 KiB, together its size.
    let big = f.tensor_bytes("big").unwrap();
    assert_eq!(big, local.tensor_bytes("big").unwrap());
    let log = logged(&s, 4 + 19);
    let fetched: u64 = log[4..].iter().map(|l| l.2).sum();
    assert_eq!(fetched, 1_200_000, "{log:?}");
    assert!(
        log[4..].iter().all(|l| l.1 == 206 && l.2 <= 64 * 1024),
        "{log:?}"
    );
}

#[test]
fn an_on_demand_file_reads_as_the_local_file_does() {
    use safetensors_core::Indexer;
    let bytes = sample();
    let Some(s) = serve("on-demand-same", &bytes) else {
        return;
    };
    let local =
        SafeFile::from_memory("local", Box::new(bytes.clone()), OpenOptions::default()).unwrap();
    for options in [on_demand(RemoteOptions::default()), on_demand(many_parts())] {
        let f = open(
            &url(s.server.port, "model.safetensors"),
            &options,
            OpenOptions::default(),
        )
        .unwrap();
        same_tensors(&f, &local);
        // A strided slice: its runs coalesced into spans, fetched, and scattered back.
        for idx in [
            vec![Indexer::Range {
                start: Some(3),
                stop: Some(299_990),
                step: 7,
            }],
            vec![
                Indexer::Range {
                    start: Some(1),
                    stop: Some(7),
                    step: 2,
                },
                Indexer::Select(5),
            ],
        ] {
            let name = if idx.len() == 1 { "big" } else { "half" };
            let plan = f.plan_slice(name, &idx).unwrap();
            let mut got = vec![0u8; plan.byte_len()];
            f.read_slice(name, &plan, &mut got).unwrap();
            let mut want = vec![0u8; plan.byte_len()];
            local.read_slice(name, &plan, &mut want).unwrap();
            assert!(got == want, "{name}: slice differs");
        }
    }
}

#[test]
fn an_on_demand_file_replaced_after_open_is_refused_on_read() {
    let bytes = sample();
    let Some(s) = serve("on-demand-replaced", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    let f = open(&u, &on_demand(many_parts()), OpenOptions::default()).unwrap();
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    let path = s.root.0.join("model.safetensors");
    std::fs::write(&path, &other).unwrap();
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let e = f.tensor_bytes("small").expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains(&u) && text.contains("changed"), "{text}");
}

#[test]
fn an_on_demand_read_of_a_broken_answer_is_refused_naming_the_url() {
    // The header's two reads pass; every later GET comes back short, wrong, or whole.
    for (what, says) in [
        ("short", "body ended after"),
        ("range", "Requested"),
        ("whole", "not 206"),
        ("html", "not 206"),
    ] {
        let Some(s) = serve(&format!("on-demand-{what}"), &sample()) else {
            return;
        };
        let p = proxy(s.server.port, what, 2);
        let u = url(p.port, "model.safetensors");
        let f = open(&u, &on_demand(impatient()), OpenOptions::default()).unwrap();
        let e = f.tensor_bytes("big").expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e}");
        let text = e.to_string();
        assert!(text.contains(&u) && text.contains(says), "{what}: {text}");
    }
}

#[test]
fn a_deadline_too_far_to_be_an_instant_is_no_limit() {
    let bytes = sample();
    let Some(s) = serve("far-deadline", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    for remote in [many_parts(), on_demand(many_parts())] {
        let remote = RemoteOptions {
            deadline: Some(Duration::MAX),
            ..remote
        };
        let f = open(&u, &remote, OpenOptions::default()).unwrap();
        same_tensors(&f, &local);
    }
}

#[test]
fn a_part_size_below_the_floor_counts_as_the_floor() {
    let bytes = sample();
    let Some(s) = serve("tiny-parts", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    // Parts of one byte would be 1.2 million GETs for the big tensor: the deadline bounds
    // how long this test takes if they were made.
    let tiny = RemoteOptions {
        part_size: 1,
        deadline: Some(Duration::from_secs(20)),
        ..many_parts()
    };
    let f = open(&u, &on_demand(tiny), OpenOptions::default()).unwrap();
    let opened = logged(&s, 2).len();
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    assert_eq!(
        f.tensor_bytes("big").unwrap(),
        local.tensor_bytes("big").unwrap()
    );
    let parts = 1_200_000usize.div_ceil(safetensors_remote::MIN_PART_SIZE);
    let log = logged(&s, opened + parts);
    let fetched: u64 = log[opened..].iter().map(|l| l.2).sum();
    assert_eq!((log.len() - opened, fetched), (parts, 1_200_000), "{log:?}");
}

#[test]
fn an_unbounded_concurrency_reads_as_any_other() {
    let bytes = sample();
    let Some(s) = serve("huge-concurrency", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    // `usize::MAX` for "as many as there are parts", whole and on demand.
    for remote in [many_parts(), on_demand(many_parts())] {
        let remote = RemoteOptions {
            concurrency: usize::MAX,
            ..remote
        };
        let f = open(&u, &remote, OpenOptions::default()).unwrap();
        same_tensors(&f, &local);
    }
}

#[test]
fn a_body_broken_off_is_completed_by_a_checked_retry() {
    // The third GET (a data part) breaks off halfway; its retry asks for the rest only, and the
    // bytes are the file's, whole and on demand.
    let bytes = sample();
    let local =
        SafeFile::from_memory("local", Box::new(bytes.clone()), OpenOptions::default()).unwrap();
    for demand in [false, true] {
        let Some(s) = serve(&format!("cut-{demand}"), &bytes) else {
            return;
        };
        let p = proxy(s.server.port, "cut", 2);
        let options = RemoteOptions {
            concurrency: 1,
            max_retries: 2,
            on_demand: demand,
            ..many_parts()
        };
        let remote = open(
            &url(p.port, "model.safetensors"),
            &options,
            OpenOptions::default(),
        )
        .unwrap();
        same_tensors(&remote, &local);
        // The retry asked for the second half of the broken part, not the whole part again.
        let ranges: Vec<String> = access_log(&s.work.0)
            .into_iter()
            .map(|(range, _, _)| range)
            .collect();
        let broken = &ranges[2];
        let (a, b) = broken.trim_start_matches("bytes=").split_once('-').unwrap();
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        let rest = format!("bytes={}-{b}", a + (b + 1 - a) / 2);
        assert_eq!(ranges[3], rest, "demand {demand}: {ranges:?}");
    }
}

#[test]
fn a_retry_answered_with_other_bytes_is_refused() {
    // The third GET breaks off halfway; the next answer (its retry) names other bytes than
    // asked (Content-Range shifted by one). Before, the retry's answer was checked for its ETag only
    // and spliced in: the tensor came back with its second half wrong and no error.
    for demand in [false, true] {
        let Some(s) = serve(&format!("cut-range-{demand}"), &sample()) else {
            return;
        };
        let p = proxy(s.server.port, "cut-range", 2);
        let u = url(p.port, "model.safetensors");
        let options = RemoteOptions {
            concurrency: 1,
            max_retries: 2,
            on_demand: demand,
            ..many_parts()
        };
        // (Before, the bytes came back, wrong: the test fails without printing them.)
        let e = match open(&u, &options, OpenOptions::default()) {
            Err(e) => e,
            Ok(f) => match f.tensor_bytes("big") {
                Err(e) => e,
                Ok(_) => panic!("wrong bytes, not an error"),
            },
        };
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let text = e.to_string();
        assert!(text.contains(&u), "{text}");
        assert!(text.contains("Requested"), "demand {demand}: {text}");
    }
}

#[test]
fn a_redirect_between_loopback_hosts_is_followed() {
    let bytes = sample();
    let Some(s) = serve("redirect-loopback", &bytes) else {
        return;
    };
    let to = format!("http://localhost:{}", s.server.port);
    let p = proxy_with(s.server.port, "redirect-to", 0, &["--to", &to]);
    let remote = open(
        &url(p.port, "model.safetensors"),
        &many_parts(),
        OpenOptions::default(),
    )
    .unwrap();
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    same_tensors(&remote, &local);
}

#[test]
fn a_plain_http_redirect_to_another_host_is_refused() {
    let Some(s) = serve("redirect-away", &sample()) else {
        return;
    };
    // Never connected to: the policy refuses the hop first.
    let p = proxy_with(
        s.server.port,
        "redirect-to",
        0,
        &["--to", "http://192.0.2.1:9"],
    );
    let u = url(p.port, "model.safetensors");
    let e = open(&u, &impatient(), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("redirect") && text.contains("http://192.0.2.1:9/model.safetensors"),
        "{text}"
    );
}

#[test]
fn a_forked_child_reads_remote_files() {
    let bytes = sample();
    let Some(s) = serve("fork", &bytes) else {
        return;
    };
    let u = url(s.server.port, "model.safetensors");
    // The parent's runtime and connections exist before the fork; a file opened on demand in
    // the parent is read in the child too.
    let before = open(&u, &many_parts(), OpenOptions::default()).unwrap();
    let lazy = open(&u, &on_demand(many_parts()), OpenOptions::default()).unwrap();
    let want = before.tensor_bytes("big").unwrap().to_vec();
    // SAFETY: the child only runs this library's code and exits with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let whole = open(&u, &many_parts(), OpenOptions::default()).unwrap();
            let read = lazy.tensor_bytes("big").unwrap();
            whole.tensor_bytes("big").unwrap().to_vec() == want && read.to_vec() == want
        }))
        .unwrap_or(false);
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    // Before, the child hung for ever: wait at most a minute, then fail.
    let start = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child without blocking.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed: {status}"
    );
    // The parent's own runtime still serves it.
    assert_eq!(lazy.tensor_bytes("big").unwrap().to_vec(), want);
}
