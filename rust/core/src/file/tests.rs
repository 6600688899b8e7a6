//! The mapped open against a file another process resizes between its `fstat` and its mapping
//! (a test hook runs in that window).

use std::cell::RefCell;
use std::path::Path;

use super::{Backend, SafeFile};
use crate::{serialize, Dtype, ErrorKind, TensorView};

type Hook = Box<dyn Fn(&Path)>;

thread_local! {
    /// Runs between the `fstat` of an mmap open and the mapping: the window in which
    /// another process may change the file's length.
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
fn mapped_open_validates_against_the_mapping_not_an_earlier_fstat() {
    let dir = scratch("shrink");
    let path = dir.join("a.safetensors");
    let data = vec![7u8; 64 * 1024];
    let bytes = serialize(
        [("w", TensorView::new(Dtype::U8, &[data.len()], &data))],
        None,
    )
    .unwrap();
    for keep in [bytes.len() - 1, bytes.len() / 2, 100, 7, 0] {
        std::fs::write(&path, &bytes).unwrap();
        // Another process shrinks the file in place after the open measured it.
        let result = with_hook(
            move |p| {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(keep as u64).unwrap();
            },
            || SafeFile::open(&path, Backend::Mmap),
        );
        let err = match result {
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
            ),
            "shrunk to {keep}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mapped_open_of_a_file_that_grew_sees_the_trailing_bytes() {
    let dir = scratch("grow");
    let path = dir.join("a.safetensors");
    let bytes = serialize([("w", TensorView::new(Dtype::U8, &[16], &[1; 16]))], None).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let err = with_hook(
        |p| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
            f.write_all(&[0; 8]).unwrap();
        },
        || SafeFile::open(&path, Backend::Mmap),
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::MetadataIncompleteBuffer, "{err}");
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
