//! Prefetching a plan: after `posix_fadvise(DONTNEED)` the file is not cached (per `mincore`);
//! after prefetching a plan (of one file, or across a checkpoint's shards) its bytes are
//! resident and the rest mostly is not; progress adds up; plans cover files in file order.

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use common::scratch_dir;
use common::sharded::{write_sharded, Spec};
use safetensors_core::{
    advise, serialize_to_file, Advice, Backend, Checkpoint, Dtype, ErrorKind, Indexer, Plan,
    PrefetchOptions, Request, SafeFile, Source, TensorView,
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
    common::truncate(&path, 5 * MIB as u64);
    let err = plan
        .prefetch(PrefetchOptions::default())
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(err.kind(), safetensors_core::ErrorKind::Io);
    assert!(err.to_string().contains("p.safetensors"), "{err}");
}

#[test]
fn any_request_size_and_thread_count_warm_the_whole_plan() {
    // Sizes that would overflow a rounding to 64 KiB, or ask for one buffer per thread far
    // larger than the file: clamped, the plan is still read whole, in bounded memory.
    let dir = scratch_dir("prefetch_any_options");
    let path = dir.join("o.safetensors");
    write_sample(&path);
    let f = SafeFile::open(&path, Backend::Read).unwrap();
    for (threads, request_bytes) in [
        (usize::MAX, usize::MAX),
        (0, 0),
        (1, usize::MAX - (64 << 10) + 2),
        (64, 1),
        (2, 8 << 30),
    ] {
        let p = Plan::whole(&f)
            .prefetch(PrefetchOptions {
                threads,
                request_bytes,
            })
            .unwrap();
        p.wait().unwrap();
        assert_eq!(
            p.bytes_done(),
            p.total_bytes(),
            "{threads} threads, {request_bytes}"
        );
        assert_eq!(p.total_bytes(), 24 * MIB as u64);
    }
}

#[test]
fn every_waiting_thread_and_every_later_wait_gets_the_error() {
    let dir = scratch_dir("wait_from_several_threads");
    let path = dir.join("p.safetensors");
    write_sample(&path);
    let f = SafeFile::open(&path, Backend::Read).unwrap();
    let plan = Plan::whole(&f);
    std::fs::remove_file(&path).unwrap();
    let p = plan.prefetch(PrefetchOptions::default()).unwrap();
    let errors: Vec<String> = std::thread::scope(|s| {
        let waiters: Vec<_> = (0..3)
            .map(|_| s.spawn(|| p.wait().unwrap_err().to_string()))
            .collect();
        waiters.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert!(errors[0].contains("p.safetensors"), "{}", errors[0]);
    assert!(errors.iter().all(|e| *e == errors[0]), "{errors:?}");
    let later = p.wait().unwrap_err();
    assert_eq!(later.kind(), ErrorKind::Io);
    assert_eq!(
        later.to_string(),
        errors[0],
        "sticky, never a later success"
    );
}

#[test]
fn a_file_in_memory_has_nothing_to_warm() {
    let dir = scratch_dir("a_file_in_memory");
    let path = dir.join("p.safetensors");
    write_sample(&path);
    let bytes = std::fs::read(&path).unwrap();
    let f = Arc::new(
        SafeFile::from_memory(
            Path::new("<memory>"),
            Box::new(bytes),
            safetensors_core::OpenOptions::default(),
        )
        .unwrap(),
    );
    let plan = Plan::of(Source::Files(&[f]), None).unwrap();
    assert_eq!(plan.file_count(), 0);
    assert_eq!(plan.total_bytes(), 0);
    plan.prefetch(PrefetchOptions::default())
        .unwrap()
        .wait()
        .unwrap();
}

/// Three shards of four 4 MiB tensors (`s<shard>.t<n>`, U8 of shape [1024, 4096]).
fn three_shards(dir: &Path) -> std::path::PathBuf {
    let spec = |i: usize| -> Vec<Spec> {
        (0..4)
            .map(|t| (format!("s{i}.t{t}"), Dtype::U8, vec![1024, 4 * 1024]))
            .collect()
    };
    write_sharded(dir, &[spec(0), spec(1), spec(2)])
}

#[test]
fn prefetching_part_of_a_checkpoint_makes_its_bytes_resident_across_shards() {
    let dir = scratch_dir("prefetching_part_of_a_checkpoint");
    let index = three_shards(&dir);
    let ckpt = Checkpoint::open(&index, Backend::Read).unwrap();
    let shards: Vec<_> = (0..3)
        .map(|i| ckpt.shard_path(i).unwrap().to_owned())
        .collect();
    for p in &shards {
        evict(p);
        if resident(p).iter().any(|&r| r) {
            println!(
                "skipped: the kernel keeps {} cached after DONTNEED",
                p.display()
            );
            return;
        }
    }
    // Out of file order on purpose: the plan warms shard by shard all the same.
    let requests = [
        Request::slice("s2.t2", vec![Indexer::range(0, 512)]),
        Request::tensor("s0.t1"),
        Request::tensor("s1.t3").in_file(1),
    ];
    let plan = Plan::of(Source::Checkpoint(&ckpt), Some(&requests)).unwrap();
    assert_eq!(plan.file_count(), 3);
    for (i, p) in shards.iter().enumerate() {
        assert_eq!(plan.file_path(i), Some(p.as_path()));
    }
    assert_eq!(plan.total_bytes(), 10 * MIB as u64);
    let p = plan
        .prefetch(PrefetchOptions {
            threads: 4,
            request_bytes: MIB,
        })
        .unwrap();
    assert_eq!(p.total_bytes(), 10 * MIB as u64);
    p.wait().unwrap();
    let warm = [("s0.t1", 4 * MIB), ("s1.t3", 4 * MIB), ("s2.t2", 2 * MIB)];
    for (i, path) in shards.iter().enumerate() {
        let f = ckpt.shard(i).unwrap();
        let res = resident(path);
        let start = f.header().data_start();
        for info in f.header().iter() {
            let (b, e) = info.data_offsets;
            match warm.iter().find(|w| w.0 == info.name) {
                Some(&(_, len)) => {
                    assert_eq!(fraction(&res, start, (b, b + len)), 1.0, "{}", info.name);
                    if len < e - b {
                        let rest = fraction(&res, start, (b + len + MIB, e));
                        assert!(rest < 0.5, "{}: {rest} of the rest", info.name);
                    }
                }
                None => {
                    let frac = fraction(&res, start, (b, e));
                    assert!(
                        frac < 0.5,
                        "{}: {frac} of its pages are resident",
                        info.name
                    );
                }
            }
        }
    }
}

#[test]
fn plans_cover_whole_checkpoints_lists_of_files_and_files_added_one_by_one() {
    let dir = scratch_dir("plans_cover_whole_checkpoints");
    let index = three_shards(&dir);
    let ckpt = Checkpoint::open(&index, Backend::Mmap).unwrap();
    let whole = Plan::of(Source::Checkpoint(&ckpt), None).unwrap();
    assert_eq!(whole.file_count(), 3);
    assert_eq!(whole.total_bytes(), 48 * MIB as u64);
    for i in 0..3 {
        let len = ckpt.shard(i).unwrap().header().data_len() as u64;
        assert_eq!(whole.file_ranges(i), [(0, len)]);
    }
    whole
        .prefetch(PrefetchOptions::default())
        .unwrap()
        .wait()
        .unwrap();

    // The same files as a list: by position, or the first file holding the name.
    let files: Vec<Arc<SafeFile>> = (0..3).map(|i| ckpt.shard(i).unwrap().clone()).collect();
    let list = Plan::of(Source::Files(&files), None).unwrap();
    assert_eq!(list.total_bytes(), 48 * MIB as u64);
    let some = [
        Request::tensor("s2.t0").in_file(2),
        Request::tensor("s1.t0"),
    ];
    let plan = Plan::of(Source::Files(&files), Some(&some)).unwrap();
    assert_eq!(plan.file_count(), 2);
    assert_eq!(plan.file_path(0), Some(files[1].path()));
    assert_eq!(plan.total_bytes(), 8 * MIB as u64);
    // Requests that name no tensor there are refused when planning.
    for bad in [
        Request::tensor("s2.t0").in_file(1),
        Request::tensor("s2.t0").in_file(3),
        Request::tensor("nope"),
    ] {
        let err = Plan::of(Source::Files(&files), Some(std::slice::from_ref(&bad))).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TensorNotFound, "{bad:?}: {err}");
    }
    let err = Plan::of(
        Source::Checkpoint(&ckpt),
        Some(&[Request::tensor("s2.t0").in_file(0)]),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorNotFound, "{err}");
    let err = Plan::of(
        Source::Checkpoint(&ckpt),
        Some(&[Request::slice("s0.t0", vec![Indexer::range(0, 2000)])]),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidSlice, "{err}");

    // Files added one by one: each keeps its own ranges; `ranges` is the first file's.
    let (a, b) = (&files[0], &files[2]);
    let mut plan = Plan::new(a);
    plan.add_tensor(b, "s2.t3").unwrap();
    plan.add_tensor(a, "s0.t2").unwrap();
    plan.add_range_in(b, 0, 10);
    assert_eq!(plan.file_count(), 2);
    assert_eq!(
        plan.ranges(),
        [a.info("s0.t2").unwrap().data_offsets].map(|(x, y)| (x as u64, (y - x) as u64))
    );
    assert_eq!(plan.total_bytes(), 8 * MIB as u64 + 10);

    // A shard deleted after planning: an Io error naming it, no hang.
    let plan = Plan::of(Source::Checkpoint(&ckpt), Some(&[Request::tensor("s1.t1")])).unwrap();
    std::fs::remove_file(ckpt.shard_path(1).unwrap()).unwrap();
    let err = plan
        .prefetch(PrefetchOptions::default())
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.to_string().contains("model-1.safetensors"), "{err}");
}
