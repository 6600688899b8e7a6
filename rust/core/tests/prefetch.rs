//! Prefetching a plan: after `posix_fadvise(DONTNEED)` the file is not cached (per `mincore`);
//! after prefetching a plan its bytes are resident and the rest mostly is not; progress adds up.

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use common::scratch_dir;
use safetensors_core::{
    advise, serialize_to_file, Advice, Backend, Dtype, Indexer, Plan, PrefetchOptions, SafeFile,
    TensorView,
};

const MIB: usize = 1 << 20;

fn write_sample(path: &Path) {
    let datas: Vec<Vec<u8>> = (0..6).map(|t| vec![t as u8 + 1; 4 * MIB]).collect();
    let names: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let shape = [4 * MIB];
    serialize_to_file(
        (0..6).map(|i| {
            (
                names[i].as_str(),
                TensorView::new(Dtype::U8, &shape, &datas[i]),
            )
        }),
        None,
        path,
    )
    .unwrap();
    File::open(path).unwrap().sync_all().unwrap();
}

/// Drops `path` from the page cache (as far as the kernel agrees).
fn evict(path: &Path) {
    let f = File::open(path).unwrap();
    // SAFETY: plain system calls on a descriptor we own.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Per page of `path`, whether it is in the page cache.
fn resident(path: &Path) -> Vec<bool> {
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a fresh read-only shared mapping, unmapped below; mincore does not fault pages in.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let mut v = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0);
        libc::munmap(p, len);
        v.iter().map(|b| b & 1 == 1).collect()
    }
}

/// Fraction of the pages of data bytes `[begin, end)` that are resident.
fn fraction(res: &[bool], data_start: usize, (begin, end): (usize, usize)) -> f64 {
    let p = 4096;
    let first = (data_start + begin).div_ceil(p);
    let last = (data_start + end) / p;
    let n = res[first..last].iter().filter(|&&r| r).count();
    n as f64 / (last - first) as f64
}

#[test]
fn prefetching_a_plan_makes_its_bytes_resident_and_little_else() {
    let dir = scratch_dir("prefetching_a_plan");
    let path = dir.join("p.safetensors");
    write_sample(&path);
    evict(&path);
    if resident(&path).iter().any(|&r| r) {
        println!(
            "skipped: the kernel keeps {} cached after POSIX_FADV_DONTNEED (tmpfs or overlay?)",
            path.display()
        );
        return;
    }
    let f = SafeFile::open(&path, Backend::Read).unwrap();
    let start = f.header().data_start();
    let mut plan = Plan::new(&f);
    plan.add_tensor(&f, "t1").unwrap();
    plan.add_tensor(&f, "t4").unwrap();
    // The first half of t3's rows, through a slice plan.
    let s = f
        .plan_slice(
            "t3",
            &[Indexer::Range {
                start: Some(0),
                stop: Some(2 * MIB as i64),
                step: 1,
            }],
        )
        .unwrap();
    plan.add_slice(&f, "t3", &s).unwrap();
    assert_eq!(plan.total_bytes(), 10 * MIB as u64);
    let p = plan
        .prefetch(PrefetchOptions {
            threads: 3,
            request_bytes: MIB,
        })
        .unwrap();
    assert_eq!(p.total_bytes(), 10 * MIB as u64);
    p.wait().unwrap();
    let res = resident(&path);
    let off = |n: &str| f.info(n).unwrap().data_offsets;
    for name in ["t1", "t4"] {
        assert_eq!(fraction(&res, start, off(name)), 1.0, "{name} resident");
    }
    let (b3, _) = off("t3");
    assert_eq!(
        fraction(&res, start, (b3, b3 + 2 * MIB)),
        1.0,
        "t3's slice resident"
    );
    // Outside the plan, only what readahead drags in (well under half).
    for name in ["t0", "t5"] {
        let frac = fraction(&res, start, off(name));
        assert!(frac < 0.5, "{name}: {frac} of its pages are resident");
    }
    let (_, e3) = off("t3");
    assert!(fraction(&res, start, (b3 + 3 * MIB, e3)) < 0.5);
}

#[test]
fn prefetch_reports_progress_and_a_file_that_shrank() {
    let dir = scratch_dir("prefetch_reports_progress");
    let path = dir.join("p.safetensors");
    write_sample(&path);
    let f = SafeFile::open(&path, Backend::Mmap).unwrap();
    let p = Plan::whole(&f)
        .prefetch(PrefetchOptions {
            threads: 2,
            request_bytes: 3 * MIB,
        })
        .unwrap();
    assert_eq!(p.total_bytes(), 24 * MIB as u64);
    let total = p.total_bytes();
    // bytes_done only grows, and reaches the total when every request is done.
    let mut last = 0;
    loop {
        let now = p.bytes_done();
        assert!(now >= last && now <= total);
        last = now;
        if now == total {
            break;
        }
        std::thread::yield_now();
    }
    p.wait().unwrap();
    advise(&f, &Plan::whole(&f), Advice::Sequential).unwrap();
    advise(&f, &Plan::whole(&f), Advice::WillNeed).unwrap();

    // A file truncated after the plan was made: an Io error naming the file, no hang.
    let plan = Plan::whole(&f);
    drop(f);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(5 * MIB as u64)
        .unwrap();
    let err = plan
        .prefetch(PrefetchOptions::default())
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(err.kind(), safetensors_core::ErrorKind::Io);
    assert!(err.to_string().contains("p.safetensors"), "{err}");
}
