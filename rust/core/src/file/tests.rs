//! The mapped open against a file another process resizes between its `fstat` and its mapping
//! (a test hook runs in that window).

use std::cell::RefCell;
use std::path::Path;

use super::{Backend, OpenOptions, Populate, SafeFile};
use crate::{serialize, Dtype, ErrorKind, TensorView};

/// A mapped open that maps at once (`AtOpen`), and one that maps at the first access of tensor
/// bytes (the default).
const MAPPED: [Populate; 2] = [Populate::AtOpen, Populate::Lazy];

fn open_mapped(path: &Path, populate: Populate) -> crate::Result<SafeFile> {
    SafeFile::open_with(
        path,
        OpenOptions {
            backend: Backend::Mmap,
            populate,
            ..OpenOptions::default()
        },
    )
}

type Hook = Box<dyn Fn(&Path)>;

thread_local! {
    /// Runs between the `fstat` of an mmap open and the mapping (with the read and direct
    /// backends: and the header's read): the window in which another process may change the
    /// file's length.
    static BEFORE_MAP: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

pub(super) fn before_map(path: &Path) {
    BEFORE_MAP.with(|h| {
        if let Some(hook) = h.borrow().as_ref() {
            hook(path);
        }
    });
}

fn with_hook<T>(hook: impl Fn(&Path) + 'static, f: impl FnOnce() -> T) -> T {
    BEFORE_MAP.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    let out = f();
    BEFORE_MAP.with(|h| *h.borrow_mut() = None);
    out
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("st-core-file-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_file_shrunk_before_its_header_is_read_says_so() {
    let dir = scratch("shrink-read");
    let path = dir.join("a.safetensors");
    let data = vec![7u8; 64 * 1024];
    let bytes = serialize(
        [("w", TensorView::new(Dtype::U8, &[data.len()], &data))],
        None,
    )
    .unwrap();
    for backend in [Backend::Read, Backend::Direct] {
        std::fs::write(&path, &bytes).unwrap();
        let err = with_hook(
            |p| {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(20).unwrap();
            },
            || SafeFile::open(&path, backend),
        )
        .err()
        .unwrap_or_else(|| panic!("{backend:?}: a file shrunk under its open opened"));
        assert_eq!(err.kind(), ErrorKind::Io, "{backend:?}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("became shorter") && text.contains("a.safetensors"),
            "{backend:?}: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mapped_open_validates_against_the_mapping_not_an_earlier_fstat() {
    let dir = scratch("shrink");
    let path = dir.join("a.safetensors");
    let data = vec![7u8; 64 * 1024];
    let bytes = serialize(
        [("w", TensorView::new(Dtype::U8, &[data.len()], &data))],
        None,
    )
    .unwrap();
    for populate in MAPPED {
        for keep in [bytes.len() - 1, bytes.len() / 2, 100, 7, 0] {
            std::fs::write(&path, &bytes).unwrap();
            // Another process shrinks the file in place after the open measured it.
            let result = with_hook(
                move |p| {
                    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                    f.set_len(keep as u64).unwrap();
                },
                || open_mapped(&path, populate),
            );
            let err = match result {
                // A deferred mapping (validated, like the read backend, against the length at
                // open) is checked when it is made: the view is an error, never bytes past
                // the end of the mapping.
                Ok(file) if populate == Populate::Lazy => match file.view("w") {
                    Ok(v) => panic!(
                        "a view of a file shrunk to {keep} bytes: {:?} bytes",
                        v.map(|v| v.data.len())
                    ),
                    Err(e) => {
                        assert!(e.to_string().contains("became shorter"), "{keep}: {e}");
                        e
                    }
                },
                Ok(file) => {
                    // Before the fix the open succeeded and this view ran past the mapping.
                    let view = file.view("w").map(|v| v.map(|v| v.data.len()));
                    panic!("opened a file shrunk to {keep} bytes; view: {view:?}");
                }
                Err(e) => e,
            };
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::MetadataIncompleteBuffer
                        | ErrorKind::InvalidHeaderLength
                        | ErrorKind::HeaderTooSmall
                ) || (populate == Populate::Lazy && err.kind() == ErrorKind::Io),
                "{populate:?}, shrunk to {keep}: {err}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mapped_open_of_a_file_that_grew_sees_the_trailing_bytes() {
    let dir = scratch("grow");
    let path = dir.join("a.safetensors");
    let bytes = serialize([("w", TensorView::new(Dtype::U8, &[16], &[1; 16]))], None).unwrap();
    for populate in MAPPED {
        std::fs::write(&path, &bytes).unwrap();
        let result = with_hook(
            |p| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
                f.write_all(&[0; 8]).unwrap();
            },
            || open_mapped(&path, populate),
        );
        match populate {
            // Mapped first: the header is checked against the mapping, trailing bytes and all.
            Populate::AtOpen => {
                let err = result.err().unwrap();
                assert_eq!(err.kind(), ErrorKind::MetadataIncompleteBuffer, "{err}");
            }
            // Checked against the length at open (before the append), as the read backend is;
            // the later mapping covers every tensor, so the views are the file's bytes.
            _ => {
                let file = result.unwrap();
                assert_eq!(file.view("w").unwrap().unwrap().data, &[1; 16]);
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_mapped_file_is_mapped_at_its_first_access_of_tensor_bytes() {
    let dir = scratch("lazy");
    let path = dir.join("a.safetensors");
    let a: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let b = vec![9u8; 8];
    let bytes = serialize(
        [
            ("a", TensorView::new(Dtype::U8, &[a.len()], &a)),
            ("b", TensorView::new(Dtype::U8, &[b.len()], &b)),
        ],
        None,
    )
    .unwrap();
    std::fs::write(&path, &bytes).unwrap();
    // Populated opens map at open; the default open maps nothing until bytes are asked for.
    let populated = open_mapped(&path, Populate::AtOpen).unwrap();
    assert!(populated.is_mapped_now());
    let file = open_mapped(&path, Populate::Lazy).unwrap();
    assert!(!file.is_mapped_now());
    assert_eq!(file.info("a").unwrap().shape, &[4096]);
    let first = crate::Indexer::Range {
        start: Some(0),
        stop: Some(8),
        step: 1,
    };
    let plan = file.plan_slice("a", &[first]).unwrap();
    assert_eq!(plan.byte_len(), 8);
    assert!(!file.is_mapped_now(), "header-only work mapped the file");

    // Many threads' first accesses map it once: every view borrows the same mapping.
    let file = std::sync::Arc::new(file);
    let seen: Vec<(usize, Vec<u8>)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let file = file.clone();
                s.spawn(move || {
                    let v = file.view("a").unwrap().unwrap();
                    (v.data.as_ptr() as usize, v.data.to_vec())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(file.is_mapped_now());
    for (ptr, data) in &seen {
        assert_eq!(*ptr, seen[0].0);
        assert_eq!(data, &a);
    }
    let mut out = vec![0u8; 8];
    file.read_data(4096, &mut out).unwrap();
    assert_eq!(out, b);
    assert_eq!(file.tensor_bytes("b").unwrap().as_ref(), &b[..]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_cut_anywhere_before_its_first_access_is_io_until_it_is_whole_again() {
    // Emptied, cut to its header, cut by one byte: each is an `Io` error naming the file and
    // saying it became shorter, on every access; the descriptor is kept, so that once the file
    // has its bytes again (rewritten in place) the next access maps it. Trailing bytes cut away
    // are no loss: the tensors are whole.
    use std::os::unix::fs::FileExt as _;
    let dir = scratch("cut");
    let path = dir.join("a.safetensors");
    let bytes = serialize([("w", TensorView::new(Dtype::U8, &[64], &[5; 64]))], None).unwrap();
    let data_start = bytes.len() - 64;
    for cut in [0, 7, data_start, bytes.len() - 1] {
        std::fs::write(&path, &bytes).unwrap();
        let file = open_mapped(&path, Populate::Lazy).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut as u64)
            .unwrap();
        for _ in 0..2 {
            let e = file.view("w").unwrap_err();
            let text = e.to_string();
            assert_eq!(e.kind(), ErrorKind::Io, "{cut}: {text}");
            assert!(text.contains("became shorter"), "{cut}: {text}");
            assert!(text.contains("a.safetensors"), "{cut}: {text}");
        }
        assert!(!file.is_mapped_now());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&bytes, 0)
            .unwrap();
        assert_eq!(file.view("w").unwrap().unwrap().data, &[5; 64], "{cut}");
    }
    let mut trailing = bytes.clone();
    trailing.extend_from_slice(&[0; 100]);
    std::fs::write(&path, &trailing).unwrap();
    let options = OpenOptions {
        allow_trailing_bytes: true,
        ..OpenOptions::default()
    };
    let file = SafeFile::open_with(&path, options).unwrap();
    assert_eq!(file.trailing_bytes(), 100);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(bytes.len() as u64)
        .unwrap();
    assert_eq!(file.view("w").unwrap().unwrap().data, &[5; 64]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_replaced_before_its_first_access_is_still_the_file_that_was_opened() {
    // Writers (ours among them) replace a file by renaming a new one over it: a server that
    // opened the old one must read the old one's bytes, never the new file's under the old
    // header.
    let dir = scratch("replaced");
    let path = dir.join("a.safetensors");
    let old = serialize([("w", TensorView::new(Dtype::U8, &[64], &[1; 64]))], None).unwrap();
    let new = serialize([("w", TensorView::new(Dtype::U8, &[32], &[2; 32]))], None).unwrap();
    std::fs::write(&path, &old).unwrap();
    let file = open_mapped(&path, Populate::Lazy).unwrap();
    let next = dir.join("next.safetensors");
    std::fs::write(&next, &new).unwrap();
    std::fs::rename(&next, &path).unwrap();
    assert_eq!(file.view("w").unwrap().unwrap().data, &[1; 64]);
    // Removed altogether: the same.
    let other = open_mapped(&path, Populate::Lazy).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(other.view("w").unwrap().unwrap().data, &[2; 32]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_backend_reads_a_large_tensor_exactly_and_a_shrunk_one_as_io() {
    // Large enough to be split across threads where there are cores for them (file/parallel.rs),
    // and not a multiple of a page.
    let dir = scratch("parallel");
    let path = dir.join("big.safetensors");
    let data: Vec<u8> = (0..(9u64 << 20) + 4097)
        .map(|i| ((i * 2_654_435_761) >> 11) as u8)
        .collect();
    let bytes = serialize(
        [("w", TensorView::new(Dtype::U8, &[data.len()], &data))],
        None,
    )
    .unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let file = SafeFile::open(&path, Backend::Read).unwrap();
    assert!(file.tensor_bytes("w").unwrap()[..] == data[..]);
    // Another process cuts the file short while it is open: a typed error, not short data.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(bytes.len() as u64 - 3 * 4096).unwrap();
    let err = file.tensor_bytes("w").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(
        err.to_string().contains("shorter than its header says"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn many_reads_across_files_and_backends_give_each_its_bytes_and_the_first_error() {
    // Enough bytes together to be read on several threads, each read under the size a single
    // read is split at, one of them longer than a piece (file/parallel.rs), from two files.
    let dir = scratch("many");
    let pattern = |n: u64, seed: u64| -> Vec<u8> {
        (0..n)
            .map(|i| (((i + seed) * 2_654_435_761) >> 11) as u8)
            .collect()
    };
    let (a, b) = (pattern((3 << 20) + 4097, 1), pattern(5 << 20, 2));
    let mut files = Vec::new();
    for (name, data) in [("a", &a), ("b", &b)] {
        let path = dir.join(format!("{name}.safetensors"));
        let bytes = serialize(
            [("w", TensorView::new(Dtype::U8, &[data.len()], data))],
            None,
        )
        .unwrap();
        std::fs::write(&path, &bytes).unwrap();
        files.push(path);
    }
    for backend in [Backend::Mmap, Backend::Read] {
        let fa = SafeFile::open(&files[0], backend).unwrap();
        let fb = SafeFile::open(&files[1], backend).unwrap();
        // (file, offset, length): in file order and out of it, one empty, one over a piece.
        let wanted: [(usize, u64, usize); 6] = [
            (0, 0, 1 << 20),
            (1, 7, (1 << 20) + 3),
            (0, (2 << 20) + 1, (1 << 20) + 4096),
            (1, 3 << 20, 1),
            (0, 5, 0),
            (1, 4 << 20, 1 << 20),
        ];
        let mut bufs: Vec<Vec<u8>> = wanted.iter().map(|w| vec![0xEE; w.2]).collect();
        let mut reads: Vec<(&SafeFile, u64, &mut [u8])> = wanted
            .iter()
            .zip(bufs.iter_mut())
            .map(|(w, buf)| (if w.0 == 0 { &fa } else { &fb }, w.1, &mut buf[..]))
            .collect();
        super::read_many(&mut reads).unwrap();
        for (w, got) in wanted.iter().zip(&bufs) {
            let src = if w.0 == 0 { &a } else { &b };
            let at = w.1 as usize;
            assert!(got[..] == src[at..at + w.2], "{backend:?}: {w:?}");
        }
        // Too few bytes to share out: each read whole on this thread.
        let (mut x, mut y) = (vec![0u8; 4099], vec![0u8; 3]);
        let mut reads: Vec<(&SafeFile, u64, &mut [u8])> =
            vec![(&fb, 11, &mut x[..]), (&fa, 70_000, &mut y[..])];
        super::read_many(&mut reads).unwrap();
        assert!(
            x[..] == b[11..11 + 4099] && y[..] == a[70_000..70_003],
            "{backend:?}"
        );
        // A range past a file's end: refused before anything is read.
        let mut past = vec![0u8; 1 << 20];
        let mut whole = vec![0u8; 5 << 20];
        let mut reads: Vec<(&SafeFile, u64, &mut [u8])> = vec![
            (&fb, 0, &mut whole[..]),
            (&fa, (3 << 20) + 1, &mut past[..]),
        ];
        let err = super::read_many(&mut reads).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{backend:?}: {err}");
        assert!(
            whole.iter().all(|&x| x == 0),
            "{backend:?}: read before the check"
        );
        // An empty read out of range is refused too, whatever else the batch holds.
        let mut none: [u8; 0] = [];
        let mut reads: Vec<(&SafeFile, u64, &mut [u8])> =
            vec![(&fb, 0, &mut whole[..]), (&fa, u64::MAX, &mut none[..])];
        assert_eq!(
            super::read_many(&mut reads).unwrap_err().kind(),
            ErrorKind::InvalidSlice
        );
    }
    // A held file cut short after its open: the pieces past the cut fail on whichever thread
    // reads them, and the read is a typed error, not short data.
    let fb = SafeFile::open(&files[1], Backend::Read).unwrap();
    let cut = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[1])
        .unwrap();
    cut.set_len(2 << 20).unwrap();
    let mut whole = vec![0u8; 5 << 20];
    let mut reads: Vec<(&SafeFile, u64, &mut [u8])> = vec![(&fb, 0, &mut whole[..])];
    let err = super::read_many(&mut reads).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_are_mapped_at_open_once_many_descriptors_are_in_use() {
    // Under a quarter of the limit, and under the ceiling whatever the limit.
    assert!(super::may_defer(3, 1024));
    assert!(super::may_defer(255, 1024));
    assert!(!super::may_defer(256, 1024));
    assert!(super::may_defer(15, 64));
    assert!(!super::may_defer(16, 64));
    assert!(!super::may_defer(3, 0));
    assert!(!super::may_defer(-1, 1024));
    assert!(super::may_defer(255, libc::RLIM_INFINITY));
    assert!(!super::may_defer(256, libc::RLIM_INFINITY));
    assert!(!super::may_defer(1 << 20, libc::RLIM_INFINITY));
}
