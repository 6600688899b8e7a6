//! The direct backend: `O_DIRECT` reads give exactly the mapped bytes for every offset, length
//! and destination alignment, and a filesystem that refuses `O_DIRECT` falls back to `pread`
//! and says so.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::scratch_dir;
use safetensors_core::{serialize_to_file, Backend, Dtype, SafeFile, TensorView, DIRECT_ALIGN};

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
    if accepts_direct(&path) {
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
    let data = m.mapped_data().unwrap();
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
