//! The direct backend: `O_DIRECT` reads give exactly the mapped bytes for every offset, length
//! and destination alignment, also straight into aligned buffers (`read_data_aligned`); and a
//! filesystem that refuses `O_DIRECT`, at open or at the first read, falls back to `pread` and
//! says so, with the same bytes and error kinds on every fixture and hostile-corpus file.
//!
//! The refusals are made by the backend's test hook (`SAFETENSORS_TEST_REFUSE_O_DIRECT`, see
//! `direct.rs`): this kernel accepts `O_DIRECT` even on tmpfs. The hook is an environment
//! variable, so the tests that use it run this very test program again, as a child with the
//! variable set, instead of changing the environment of threads running other tests.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{python, run_interop, scratch_dir};
use safetensors_core::{
    serialize_to_file, AlignedBuf, Backend, Dtype, ErrorKind, SafeFile, TensorView, DIRECT_ALIGN,
};

/// The direct backend's test hook.
const HOOK: &str = "SAFETENSORS_TEST_REFUSE_O_DIRECT";

/// Tensor lengths around the alignment and the bounce buffer's 8 MiB.
const LENS: [usize; 8] = [
    1,
    7,
    4095,
    4096,
    4097,
    65_536 + 3,
    (8 << 20) + 4099,
    3 << 20,
];

fn write_sample(path: &Path) -> Vec<Vec<u8>> {
    let datas: Vec<Vec<u8>> = LENS
        .iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| (i * 31 + t * 7 + i / 4093) as u8).collect())
        .collect();
    let names: Vec<String> = (0..LENS.len()).map(|i| format!("t{i}")).collect();
    let shapes: Vec<[usize; 1]> = LENS.iter().map(|&n| [n]).collect();
    let views = (0..LENS.len()).map(|i| {
        (
            names[i].as_str(),
            TensorView::new(Dtype::U8, &shapes[i], &datas[i]),
        )
    });
    serialize_to_file(views, None, path).unwrap();
    datas
}

/// Whether the filesystem holding `path` accepts an `O_DIRECT` open.
fn accepts_direct(path: &Path) -> bool {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; the descriptor is closed right away.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECT) };
    if fd >= 0 {
        // SAFETY: `fd` is ours.
        unsafe { libc::close(fd) };
    }
    fd >= 0
}

#[test]
fn direct_backend_reads_the_same_bytes_as_the_mapping_at_every_alignment() {
    let dir = scratch_dir("direct_backend_reads_the_same_bytes");
    let path = dir.join("d.safetensors");
    let datas = write_sample(&path);
    let f = SafeFile::open(&path, Backend::Direct).unwrap();
    let m = SafeFile::open(&path, Backend::Mmap).unwrap();
    if accepts_direct(&path) && hook().is_none() {
        assert_eq!(f.direct_fallback(), None);
    } else {
        println!(
            "note: {} refuses O_DIRECT; checking the fallback",
            dir.display()
        );
    }
    for (i, want) in datas.iter().enumerate() {
        assert_eq!(
            f.tensor_bytes(&format!("t{i}")).unwrap().as_ref(),
            &want[..]
        );
    }
    assert_eq!(f.bytes_read(), LENS.iter().sum::<usize>() as u64);
    // Ranges starting on, before and after a block boundary of the file, into destinations that
    // are page aligned (the zero-copy path) and not.
    let data = m.mapped_data().unwrap().unwrap();
    let start = m.header().data_start();
    let first_block = (DIRECT_ALIGN - start % DIRECT_ALIGN) % DIRECT_ALIGN;
    let mut backing = vec![0u8; (9 << 20) + 3 * DIRECT_ALIGN];
    let aligned = backing.as_ptr().align_offset(DIRECT_ALIGN);
    for off in [
        first_block,
        first_block + 1,
        first_block + DIRECT_ALIGN - 1,
        0,
        5,
    ] {
        for len in [1, DIRECT_ALIGN, 3 * DIRECT_ALIGN + 17, (8 << 20) + 1] {
            for shift in [0, 1] {
                let dst = &mut backing[aligned + shift..aligned + shift + len];
                f.read_data(off as u64, dst).unwrap();
                assert_eq!(
                    dst,
                    &data[off..off + len],
                    "offset {off} len {len} shift {shift}"
                );
            }
        }
    }
    // The last bytes of the file: the final block is short.
    let tail = data.len() - 5;
    let mut last = [0u8; 5];
    f.read_data(tail as u64, &mut last).unwrap();
    assert_eq!(last, data[tail..]);
}

#[test]
fn direct_backend_falls_back_to_pread_where_the_filesystem_refuses() {
    // tmpfs refuses O_DIRECT at open.
    let shm = Path::new("/dev/shm");
    let dir = shm.join(format!("safetensors-direct-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        println!("skipped: /dev/shm is not writable here");
        return;
    }
    let path = dir.join("f.safetensors");
    let datas = write_sample(&path);
    if accepts_direct(&path) {
        let _ = std::fs::remove_dir_all(&dir);
        println!("skipped: /dev/shm accepts O_DIRECT on this kernel, nothing to fall back from");
        return;
    }
    let f = SafeFile::open(&path, Backend::Direct).unwrap();
    let why = f.direct_fallback().map(str::to_owned);
    for (i, want) in datas.iter().enumerate() {
        assert_eq!(
            f.tensor_bytes(&format!("t{i}")).unwrap().as_ref(),
            &want[..]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let why = why.expect("the fallback is recorded");
    assert!(why.contains("O_DIRECT") && why.contains("pread"), "{why}");
}

/// The test hook's mode in this process, when set.
fn hook() -> Option<String> {
    std::env::var(HOOK)
        .ok()
        .filter(|m| m == "open" || m == "read")
}

/// An aligned buffer of `len` bytes.
fn aligned(len: usize) -> AlignedBuf {
    AlignedBuf::new(len).unwrap()
}

/// `read_data_aligned` gives the mapped bytes at the offset it returns, for offsets and lengths
/// on, before and after block boundaries (spans that begin in the header and end past the end of
/// the file included), into aligned destinations and not. Returns how many ranges it checked.
fn check_aligned_reads(f: &SafeFile, m: &SafeFile) -> usize {
    let data = m.mapped_data().unwrap().unwrap();
    let start = f.header().data_start();
    let file = std::fs::read(f.path()).unwrap();
    let first_block = (DIRECT_ALIGN - start % DIRECT_ALIGN) % DIRECT_ALIGN;
    let n = data.len();
    let offsets = [
        0,
        1,
        first_block.saturating_sub(1),
        first_block,
        first_block + 1,
        first_block + DIRECT_ALIGN - 1,
        n / 2,
        n.saturating_sub(4097),
        n.saturating_sub(5),
        n,
    ];
    let lens = [
        0,
        1,
        7,
        4095,
        4096,
        4097,
        3 * DIRECT_ALIGN + 17,
        (1 << 20) + 3,
    ];
    let mut checked = 0;
    for off in offsets {
        for len in lens {
            if off + len > n {
                continue;
            }
            let span = f.aligned_len(off as u64, len).unwrap();
            assert!(
                span >= len && span <= len + 2 * DIRECT_ALIGN,
                "{off}+{len}: {span}"
            );
            let mut buf = aligned(span);
            let head = f
                .read_data_aligned(off as u64, len, buf.as_mut_slice())
                .unwrap();
            assert_eq!(head, (start + off) % DIRECT_ALIGN, "{off}+{len}");
            assert_eq!(
                &buf.as_slice()[head..head + len],
                &data[off..off + len],
                "{off}+{len} with {:?}",
                f.backend()
            );
            if f.backend() == Backend::Direct && f.direct_fallback().is_none() && len > 0 {
                // The whole span came from the file, with no bounce copy: the header's end
                // or the neighbouring tensors are there too, up to the end of the file.
                let at = start + off - head;
                let upto = span.min(file.len() - at);
                assert_eq!(&buf.as_slice()[..upto], &file[at..at + upto], "{off}+{len}");
            }
            // A destination that is not aligned: the same bytes at the same place.
            let mut backing = vec![0u8; span + DIRECT_ALIGN + 1];
            let shift = backing.as_ptr().align_offset(DIRECT_ALIGN) + 1;
            let dst = &mut backing[shift..shift + span];
            assert_eq!(f.read_data_aligned(off as u64, len, dst).unwrap(), head);
            assert_eq!(&dst[head..head + len], &data[off..off + len]);
            checked += 1;
        }
    }
    checked
}

#[test]
fn aligned_reads_land_in_the_callers_buffer_with_every_backend() {
    let dir = scratch_dir("aligned_reads_land");
    let path = dir.join("a.safetensors");
    write_sample(&path);
    let m = SafeFile::open(&path, Backend::Mmap).unwrap();
    // The cases below need a data buffer that starts inside a block and a file that ends
    // inside one.
    assert_ne!(m.header().data_start() % DIRECT_ALIGN, 0);
    assert_ne!(m.header().file_len() % DIRECT_ALIGN, 0);
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let f = SafeFile::open(&path, backend).unwrap();
        assert!(check_aligned_reads(&f, &m) > 60, "{backend:?}");
        // Too short a destination, and a range outside the data buffer.
        let (begin, end) = f.info("t3").unwrap().data_offsets;
        let need = f.aligned_len(begin as u64, end - begin).unwrap();
        let mut short = aligned(need - 1);
        let err = f
            .read_data_aligned(begin as u64, end - begin, short.as_mut_slice())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{err}");
        assert!(err.to_string().contains("a.safetensors"), "{err}");
        let n = f.header().data_len() as u64;
        for (off, len) in [(n, 1), (n - 1, 2), (u64::MAX, 1), (u64::MAX - 3, 4)] {
            // The caller's range is wrong, not the file: InvalidSlice, naming the file.
            let err = f.aligned_len(off, len).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{off}+{len}: {err}");
            assert!(err.to_string().contains("a.safetensors"), "{err}");
            let mut buf = aligned(3 * DIRECT_ALIGN);
            let err = f
                .read_data_aligned(off, len, buf.as_mut_slice())
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{off}+{len}: {err}");
            let mut dst = vec![0u8; len];
            let err = f.read_data(off, &mut dst).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{off}+{len}: {err}");
            assert!(err.to_string().contains("outside the"), "{err}");
        }
    }
}

#[test]
fn aligned_reads_of_a_file_that_shrank_are_io_errors_never_other_bytes() {
    let dir = scratch_dir("aligned_reads_of_a_file_that_shrank");
    let path = dir.join("a.safetensors");
    let datas = write_sample(&path);
    // Not the mapped backend: touching a mapping past the end of a shrunk file is a SIGBUS.
    for backend in [Backend::Read, Backend::Direct] {
        write_sample(&path);
        let f = SafeFile::open(&path, backend).unwrap();
        let (b7, e7) = f.info("t7").unwrap().data_offsets;
        let cut = f.header().data_start() + b7 + 1000;
        common::truncate(&path, cut as u64);
        // Cut inside t7: its read fails; t6, before the cut, still reads.
        let mut buf = aligned(f.aligned_len(b7 as u64, e7 - b7).unwrap());
        let err = f
            .read_data_aligned(b7 as u64, e7 - b7, buf.as_mut_slice())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "{backend:?}: {err}");
        assert!(err.to_string().contains("shorter"), "{err}");
        let (b6, e6) = f.info("t6").unwrap().data_offsets;
        let mut buf = aligned(f.aligned_len(b6 as u64, e6 - b6).unwrap());
        let head = f
            .read_data_aligned(b6 as u64, e6 - b6, buf.as_mut_slice())
            .unwrap();
        assert_eq!(&buf.as_slice()[head..head + e6 - b6], &datas[6][..]);
    }
}

/// The name of the test the hook's children run.
const EVERY_FILE: &str = "every_fixture_and_hostile_file_reads_the_same_with_the_direct_backend";

/// Runs [`EVERY_FILE`] in a child process with the hook set to `mode`.
fn run_with_hook(mode: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", EVERY_FILE, "--nocapture", "--test-threads=1"])
        .env(HOOK, mode)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "with {HOOK}={mode}:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    assert!(
        text.contains(&format!("refusing O_DIRECT at {mode}")),
        "{text}"
    );
}

#[test]
fn when_the_filesystem_refuses_o_direct_at_open_every_file_reads_the_same() {
    run_with_hook("open");
}

#[test]
fn when_the_filesystem_refuses_the_first_o_direct_read_every_file_reads_the_same() {
    run_with_hook("read");
}

/// Fixtures made here: tensors around the alignment and the bounce buffer's size, every dtype,
/// an empty file; with the files Python writes when a Python with safetensors is available.
fn fixtures(dir: &Path) -> Vec<PathBuf> {
    write_sample(&dir.join("lens.safetensors"));
    let tensors: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Dtype::ALL
        .iter()
        .map(|&d| {
            let len = d.byte_size(4 * 1030).unwrap();
            let data = (0..len).map(|j| (j * 7 + d as usize) as u8).collect();
            (format!("t.{d}"), vec![4, 1030], d, data)
        })
        .collect();
    serialize_to_file(
        tensors
            .iter()
            .map(|(n, s, d, b)| (n.as_str(), TensorView::new(*d, s, b))),
        None,
        dir.join("dtypes.safetensors"),
    )
    .unwrap();
    serialize_to_file(
        std::iter::empty::<(&str, TensorView)>(),
        None,
        dir.join("empty.safetensors"),
    )
    .unwrap();
    let mut files: Vec<PathBuf> = ["lens", "dtypes", "empty"]
        .iter()
        .map(|n| dir.join(format!("{n}.safetensors")))
        .collect();
    match python() {
        Ok(py) => {
            let out = dir.join("python");
            assert_eq!(run_interop(&py, "write", &out), 0);
            for e in std::fs::read_dir(&out).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "safetensors") {
                    files.push(p);
                }
            }
        }
        Err(why) => println!("note: no Python-written files ({why})"),
    }
    files
}

/// Compares the direct backend with the mapped one on `path`: the same error kind, or the same
/// bytes for every tensor, read whole and through `read_data_aligned`, first one way then the
/// other (under the `read` hook, whichever comes first is refused). Checks what
/// `direct_fallback` says against the hook. Returns the error kind's name, or "OK".
fn same_as_mapped(path: &Path, hook: Option<&str>) -> String {
    let m = SafeFile::open(path, Backend::Mmap);
    let d = [
        SafeFile::open(path, Backend::Direct),
        SafeFile::open(path, Backend::Direct),
    ];
    let (m, [d0, d1]) = match (m, d) {
        (Err(e), [a, b]) => {
            for d in [a, b] {
                let got = d.err().map(|e| e.kind());
                assert_eq!(got, Some(e.kind()), "{}", path.display());
            }
            return e.kind().name().to_owned();
        }
        (Ok(m), [Ok(a), Ok(b)]) => (m, [a, b]),
        (Ok(_), [a, b]) => panic!(
            "{}: mapped opens, direct gives {:?} / {:?}",
            path.display(),
            a.err(),
            b.err()
        ),
    };
    for (order, d) in [d0, d1].iter().enumerate() {
        for info in m.header().iter() {
            let (begin, end) = info.data_offsets;
            let want = &m.mapped_data().unwrap().unwrap()[begin..end];
            let aligned_read = || {
                let mut buf = aligned(d.aligned_len(begin as u64, end - begin).unwrap());
                let head = d
                    .read_data_aligned(begin as u64, end - begin, buf.as_mut_slice())
                    .unwrap();
                assert_eq!(
                    &buf.as_slice()[head..head + want.len()],
                    want,
                    "{}",
                    info.name
                );
            };
            if order == 1 {
                aligned_read();
            }
            assert_eq!(d.tensor_bytes(info.name).unwrap().as_ref(), want);
            if order == 0 {
                aligned_read();
            }
        }
        let read_some = m.header().iter().any(|t| t.byte_len() > 0);
        match (hook, d.direct_fallback()) {
            (Some("open"), Some(why)) => {
                assert!(why.contains("at open") && why.contains("pread"), "{why}")
            }
            (Some("read"), Some(why)) if read_some => {
                assert!(why.contains("read") && why.contains("pread"), "{why}")
            }
            (Some("read"), None) if !read_some => {}
            (None, None) => {}
            (None, Some(why)) if !accepts_direct(path) => println!("note: {why}"),
            (hook, why) => panic!("{}: hook {hook:?}, fallback {why:?}", path.display()),
        }
    }
    "OK".to_owned()
}

/// Run by the tests above with the hook set, and on its own with real `O_DIRECT`.
#[test]
fn every_fixture_and_hostile_file_reads_the_same_with_the_direct_backend() {
    let hook = hook();
    let tag = hook.as_deref().unwrap_or("none");
    if let Some(mode) = &hook {
        println!("refusing O_DIRECT at {mode}");
    }
    let dir = scratch_dir(&format!("direct_same_{tag}"));
    let mut checked = 0;
    for path in fixtures(&dir) {
        assert_eq!(same_as_mapped(&path, hook.as_deref()), "OK");
        checked += 1;
    }
    // Aligned reads at every offset class, under the hook too.
    let lens = dir.join("lens.safetensors");
    let m = SafeFile::open(&lens, Backend::Mmap).unwrap();
    assert!(check_aligned_reads(&SafeFile::open(&lens, Backend::Direct).unwrap(), &m) > 60);
    let corpus = common::hostile_corpus(&format!("direct_hostile_{tag}"));
    let manifest = std::fs::read_to_string(corpus.join("manifest.tsv")).unwrap();
    for line in manifest.lines() {
        let mut cols = line.split('\t');
        let (name, want) = (cols.next().unwrap(), cols.next().unwrap());
        assert_eq!(
            same_as_mapped(&corpus.join(name), hook.as_deref()),
            want,
            "{name}"
        );
        checked += 1;
    }
    assert!(checked > 100, "{checked}");
}
