//! Host memory: the mapping controls of `OpenOptions` (populate at open or in the background,
//! huge pages), locking and releasing a file's pages (`residency`), and loads of every tensor
//! into one allocation (`UploadPlan::read_into`). What the kernel did is read back from
//! `/proc/self/smaps` (the mapping's resident and locked bytes, its flags) and `mincore`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::scratch_dir;
use safetensors_core::upload::UploadPlan;
use safetensors_core::{
    residency, serialize_to_file, Backend, Dtype, ErrorKind, Indexer, OpenOptions, Plan, Populate,
    Request, SafeFile, Source, TensorView,
};

const MIB: usize = 1 << 20;

/// What `/proc/self/smaps` says of the mapping that holds an address.
#[derive(Debug, Default)]
struct Vma {
    path: String,
    rss: u64,
    locked: u64,
    flags: Vec<String>,
}

fn vma_of(addr: usize) -> Option<Vma> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut vma = Vma::default();
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                if inside {
                    return Some(vma);
                }
                inside = lo <= addr && addr < hi;
                vma.path = line.split_whitespace().nth(5).unwrap_or("").to_owned();
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = |l: &str| -> u64 {
            l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
        };
        if line.starts_with("Rss:") {
            vma.rss = kib(line);
        } else if line.starts_with("Locked:") {
            vma.locked = kib(line);
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            vma.flags = flags.split_whitespace().map(str::to_owned).collect();
        }
    }
    inside.then_some(vma)
}

/// Bytes of `data` whose pages are in the page cache (`mincore`).
fn cached_bytes(data: &[u8]) -> usize {
    let page = 4096usize;
    let base = data.as_ptr() as usize;
    let start = base - base % page;
    let len = base + data.len() - start;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: the range is inside a live mapping; mincore only reports on it.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 == 1).count() * page
}

/// A file of two tensors, `a` (`len` bytes of a pattern) and `b` (4 KiB), synced so that its
/// page-cache pages are clean (only clean pages can be dropped).
fn sample(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    let path = dir.join("m.safetensors");
    let a: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let b = vec![9u8; 4096];
    serialize_to_file(
        [
            ("a", TensorView::new(Dtype::U8, &[len], &a)),
            ("b", TensorView::new(Dtype::U8, &[4096], &b)),
        ],
        None,
        &path,
    )
    .unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    (path, a)
}

fn open(path: &Path, populate: Populate, huge_pages: bool) -> SafeFile {
    let options = OpenOptions {
        populate,
        huge_pages,
        ..OpenOptions::default()
    };
    SafeFile::open_with(path, options).unwrap()
}

fn mapped(f: &SafeFile) -> &[u8] {
    f.mapped_data().unwrap().unwrap()
}

fn whole(f: &SafeFile) -> Plan {
    Plan::whole(f)
}

fn tensor_plan(f: &SafeFile, name: &str) -> Plan {
    let mut plan = Plan::new(f);
    plan.add_tensor(f, name).unwrap();
    plan
}

fn touch(data: &[u8]) -> u64 {
    // Volatile reads: a release build would otherwise drop a sum nobody uses, touching nothing.
    let sum = data
        .iter()
        .step_by(4096)
        // SAFETY: `b` is a live reference into `data`.
        .map(|b| u64::from(unsafe { std::ptr::read_volatile(b) }))
        .sum();
    std::hint::black_box(sum)
}

#[test]
fn populate_at_open_maps_every_page_before_the_open_returns() {
    let dir = scratch_dir("host_memory_populate_at_open");
    let (path, _) = sample(&dir, 8 * MIB);
    let lazy = open(&path, Populate::Lazy, false);
    let untouched = vma_of(mapped(&lazy).as_ptr() as usize).unwrap().rss;
    assert!(
        untouched < MIB as u64,
        "a lazy mapping holds {untouched} bytes before any access"
    );
    let eager = open(&path, Populate::AtOpen, false);
    let rss = vma_of(mapped(&eager).as_ptr() as usize).unwrap().rss;
    assert!(
        rss >= 8 * MIB as u64,
        "populated at open: {rss} bytes resident"
    );
}

#[test]
fn background_population_fills_the_mapping_and_lets_the_file_close() {
    let dir = scratch_dir("host_memory_background");
    let (path, a) = sample(&dir, 8 * MIB);
    let f = open(&path, Populate::Background, false);
    let at = mapped(&f).as_ptr() as usize;
    let start = Instant::now();
    loop {
        let rss = vma_of(at).unwrap().rss;
        if rss >= 8 * MIB as u64 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "after a minute only {rss} bytes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
    // A file closed while its population runs is unmapped all the same, soon after.
    let g = open(&path, Populate::Background, false);
    let at = mapped(&g).as_ptr() as usize;
    drop(g);
    let start = Instant::now();
    let ours = path.to_str().unwrap().to_owned();
    while vma_of(at).is_some_and(|v| v.path == ours) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the mapping outlived its file"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn huge_pages_are_advised_on_the_mapping() {
    let dir = scratch_dir("host_memory_huge_pages");
    let (path, a) = sample(&dir, 4 * MIB);
    let plain = open(&path, Populate::Lazy, false);
    let flags = vma_of(mapped(&plain).as_ptr() as usize).unwrap().flags;
    assert!(!flags.contains(&"hg".to_owned()), "{flags:?}");
    let huge = open(&path, Populate::Lazy, true);
    assert_eq!(&*huge.tensor_bytes("a").unwrap(), &a[..]);
    if Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        let flags = vma_of(mapped(&huge).as_ptr() as usize).unwrap().flags;
        assert!(
            flags.contains(&"hg".to_owned()),
            "no MADV_HUGEPAGE: {flags:?}"
        );
    } else {
        eprintln!("this kernel has no transparent huge pages: only the open was checked");
    }
}

#[test]
fn mapping_controls_are_ignored_without_a_mapping() {
    let dir = scratch_dir("host_memory_ignored");
    let (path, a) = sample(&dir, MIB);
    for backend in [Backend::Read, Backend::Direct] {
        for populate in [Populate::AtOpen, Populate::Background] {
            let options = OpenOptions {
                backend,
                populate,
                huge_pages: true,
                ..OpenOptions::default()
            };
            let f = SafeFile::open_with(&path, options).unwrap();
            assert_eq!(
                &*f.tensor_bytes("a").unwrap(),
                &a[..],
                "{backend:?} {populate:?}"
            );
            assert!(f.mapped_data().unwrap().is_none());
        }
    }
}

#[test]
fn lock_keeps_pages_resident_until_unlocked() {
    let dir = scratch_dir("host_memory_lock");
    let (path, a) = sample(&dir, MIB);
    let f = open(&path, Populate::Lazy, false);
    let at = mapped(&f).as_ptr() as usize;
    assert_eq!(vma_of(at).unwrap().locked, 0);
    residency::lock(&f, &tensor_plan(&f, "a")).unwrap();
    let locked = vma_of(at).unwrap().locked;
    // Whole pages: the tensor's, plus at most one page at each end.
    assert!(
        (MIB as u64..=MIB as u64 + 8192).contains(&locked),
        "locked {locked} bytes"
    );
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
    residency::unlock(&f, &tensor_plan(&f, "a")).unwrap();
    assert_eq!(vma_of(at).unwrap().locked, 0);
}

#[test]
fn release_drops_the_pages_and_later_reads_are_still_right() {
    let dir = scratch_dir("host_memory_release");
    let (path, a) = sample(&dir, 8 * MIB);
    let f = open(&path, Populate::Lazy, false);
    let at = mapped(&f).as_ptr() as usize;
    touch(mapped(&f));
    assert!(vma_of(at).unwrap().rss >= 8 * MIB as u64);
    let other = open(&path, Populate::Lazy, false);
    assert!(cached_bytes(mapped(&other)) >= 8 * MIB, "read, so cached");
    residency::release(&f, &whole(&f)).unwrap();
    let rss = vma_of(at).unwrap().rss;
    assert!(rss < 64 * 1024, "{rss} bytes still resident after release");
    let cached = cached_bytes(mapped(&other));
    assert!(
        cached < MIB,
        "{cached} bytes still in the page cache after release"
    );
    // Read again, from the disk: the same bytes.
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
    assert_eq!(&*f.tensor_bytes("b").unwrap(), &[9u8; 4096][..]);
}

#[test]
fn release_of_one_tensor_leaves_the_others_mapped() {
    let dir = scratch_dir("host_memory_release_one");
    let (path, a) = sample(&dir, 8 * MIB);
    let f = open(&path, Populate::AtOpen, false);
    let at = mapped(&f).as_ptr() as usize;
    let before = vma_of(at).unwrap().rss;
    residency::release(&f, &tensor_plan(&f, "b")).unwrap();
    let after = vma_of(at).unwrap().rss;
    assert!(
        before - after <= 3 * 4096,
        "released {} bytes for a 4 KiB tensor",
        before - after
    );
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
}

#[test]
fn release_with_the_read_backend_drops_the_page_cache_only() {
    let dir = scratch_dir("host_memory_release_read");
    let (path, a) = sample(&dir, 4 * MIB);
    let f = SafeFile::open(&path, Backend::Read).unwrap();
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
    let probe = open(&path, Populate::Lazy, false);
    assert!(cached_bytes(mapped(&probe)) >= 4 * MIB);
    residency::release(&f, &whole(&f)).unwrap();
    assert!(cached_bytes(mapped(&probe)) < MIB);
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
}

/// A file of one U8 tensor `a` of `len` bytes of `byte`, synced (clean pages), at `path`.
fn filled(path: &Path, len: usize, byte: u8) {
    let a = vec![byte; len];
    serialize_to_file([("a", TensorView::new(Dtype::U8, &[len], &a))], None, path).unwrap();
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

/// Whether this kernel takes `MADV_PAGEOUT` (Linux 5.4 and later).
fn pageout_advised() -> bool {
    let page = 4096;
    // SAFETY: a private anonymous page of our own, advised and unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let rc = libc::madvise(p, page, libc::MADV_PAGEOUT);
        libc::munmap(p, page);
        rc == 0
    }
}

/// A new version published over `path` by an atomic rename (as `write_atomically` and the
/// tool's `metadata --set` publish), read through a mapping so that its pages are cached; the
/// new file's mapping is returned.
fn publish_over(path: &Path, len: usize) -> SafeFile {
    let staged = path.with_extension("staged");
    filled(&staged, len, 0x5A);
    let newer = open(&staged, Populate::Lazy, false);
    touch(mapped(&newer));
    std::fs::rename(&staged, path).unwrap();
    assert!(
        cached_bytes(mapped(&newer)) >= len,
        "the new file is cached"
    );
    newer
}

/// Publishing a new version renames it over the old one while a program still holds the old
/// one open: releasing the old file's pages after its load is routine then, and must neither
/// fail (the path now names another file) nor touch the new file's pages.
#[test]
fn release_after_the_file_is_renamed_over_drops_its_pages_and_leaves_the_new_file_alone() {
    let dir = scratch_dir("host_memory_release_renamed");
    let (path, a) = sample(&dir, 8 * MIB);
    let f = open(&path, Populate::Lazy, false);
    let at = mapped(&f).as_ptr() as usize;
    touch(mapped(&f));
    let newer = publish_over(&path, 8 * MIB);
    residency::release(&f, &whole(&f)).unwrap();
    let rss = vma_of(at).unwrap().rss;
    assert!(rss < 64 * 1024, "{rss} bytes still resident after release");
    // The replaced file's cached pages went with the mapping (no path reaches them any more),
    // where the kernel reclaims on advice (Linux 5.4 and later).
    let cached = cached_bytes(mapped(&f));
    assert!(
        cached < MIB || !pageout_advised(),
        "{cached} bytes of the replaced file still cached"
    );
    let kept = cached_bytes(mapped(&newer));
    assert!(
        kept >= 8 * MIB,
        "the new file lost its cache: {kept} bytes left"
    );
    // The old file's bytes, read again from the file that was opened.
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
    assert_eq!(
        &*newer.tensor_bytes("a").unwrap(),
        &vec![0x5Au8; 8 * MIB][..]
    );
}

/// The same with a file removed since it was opened, and with the read backend (no mapping:
/// nothing of the old file is reachable, and the new file is never touched).
#[test]
fn release_after_the_file_is_removed_or_replaced_is_no_error_with_any_backend() {
    let dir = scratch_dir("host_memory_release_removed");
    let (path, a) = sample(&dir, 4 * MIB);
    let f = open(&path, Populate::Lazy, false);
    touch(mapped(&f));
    std::fs::remove_file(&path).unwrap();
    residency::release(&f, &whole(&f)).unwrap();
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);

    let (path, a) = sample(&dir, 4 * MIB);
    let f = SafeFile::open(&path, Backend::Read).unwrap();
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
    let newer = publish_over(&path, 4 * MIB);
    residency::release(&f, &whole(&f)).unwrap();
    assert!(
        cached_bytes(mapped(&newer)) >= 4 * MIB,
        "the new file lost its cache"
    );
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
}

/// A caller's buffer is anonymous memory: `MADV_DONTNEED` would zero it. Released, it must be
/// left exactly as it was.
#[test]
fn release_never_touches_bytes_in_memory() {
    let dir = scratch_dir("host_memory_release_memory");
    let (path, a) = sample(&dir, 8 * MIB);
    let bytes = std::fs::read(&path).unwrap();
    let f = SafeFile::from_memory("<memory>", Box::new(bytes), OpenOptions::default()).unwrap();
    residency::lock(&f, &whole(&f)).unwrap();
    residency::release(&f, &whole(&f)).unwrap();
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
}

#[test]
fn locked_pages_cannot_be_released_until_unlocked() {
    let dir = scratch_dir("host_memory_release_locked");
    let (path, a) = sample(&dir, MIB);
    let f = open(&path, Populate::Lazy, false);
    residency::lock(&f, &whole(&f)).unwrap();
    let e = residency::release(&f, &whole(&f)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("unlock them first"), "{e}");
    assert!(e.to_string().contains("m.safetensors"), "{e}");
    residency::unlock(&f, &whole(&f)).unwrap();
    residency::release(&f, &whole(&f)).unwrap();
    assert_eq!(&*f.tensor_bytes("a").unwrap(), &a[..]);
}

/// Run by `a_lock_past_rlimit_memlock_is_io_naming_the_limit` in a child process, which lowers
/// its RLIMIT_MEMLOCK to 64 KiB and, as root, drops its privileges (root may lock past it).
#[test]
#[ignore = "run in a child process by a_lock_past_rlimit_memlock_is_io_naming_the_limit"]
fn child_locks_past_its_limit() {
    let limit = libc::rlimit {
        rlim_cur: 64 * 1024,
        rlim_max: 64 * 1024,
    };
    // SAFETY: plain system calls on this process.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit), 0);
        if libc::geteuid() == 0 && (libc::setgid(65534) != 0 || libc::setuid(65534) != 0) {
            println!("SKIP: cannot drop root's privileges here");
            return;
        }
    }
    let dir = std::env::temp_dir().join(format!("st-memlock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (path, _) = sample(&dir, MIB);
    let f = open(&path, Populate::Lazy, false);
    let e = residency::lock(&f, &tensor_plan(&f, "a")).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    for part in [
        "m.safetensors",
        "mlock",
        "RLIMIT_MEMLOCK (65536 bytes",
        "ulimit -l",
        "CAP_IPC_LOCK",
    ] {
        assert!(text.contains(part), "no `{part}` in: {text}");
    }
    // The small tensor fits under the limit.
    residency::lock(&f, &tensor_plan(&f, "b")).unwrap();
    println!("CHILD OK");
}

#[test]
fn a_lock_past_rlimit_memlock_is_io_naming_the_limit() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_locks_past_its_limit",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("SKIP:") {
        eprintln!("skipped: {text}");
        return;
    }
    assert!(out.status.success() && text.contains("CHILD OK"), "{text}");
}

// ---- loads into one allocation --------------------------------------------------------------

#[test]
fn a_load_reads_every_placement_into_one_buffer_and_zeroes_the_padding() {
    let dir = scratch_dir("host_memory_load");
    let path = dir.join("l.safetensors");
    let x: Vec<u8> = (0..24u8).collect();
    let y = vec![5u8; 7];
    serialize_to_file(
        [
            ("x", TensorView::new(Dtype::U8, &[4, 6], &x)),
            ("y", TensorView::new(Dtype::U8, &[7], &y)),
            ("z", TensorView::new(Dtype::U8, &[0], &[])),
        ],
        None,
        &path,
    )
    .unwrap();
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let files = [Arc::new(SafeFile::open(&path, backend).unwrap())];
        let (plan, sources) = UploadPlan::of(Source::Files(&files), None, 64).unwrap();
        let mut dst = vec![0xAAu8; plan.total() as usize];
        plan.read_into(&sources, &mut dst).unwrap();
        let at = |name: &str| {
            plan.placements()
                .iter()
                .find(|p| p.name == name)
                .unwrap()
                .clone()
        };
        let (px, py) = (at("x"), at("y"));
        assert_eq!(&dst[px.offset as usize..][..24], &x[..], "{backend:?}");
        assert_eq!(&dst[py.offset as usize..][..7], &y[..], "{backend:?}");
        assert_eq!(px.offset % 64, 0);
        assert_eq!(py.offset % 64, 0);
        let covered = |i: usize| {
            plan.placements()
                .iter()
                .any(|p| (p.offset as usize..(p.offset + p.len) as usize).contains(&i))
        };
        assert!(
            (0..dst.len()).filter(|&i| !covered(i)).all(|i| dst[i] == 0),
            "{backend:?}"
        );

        // Slices, in request order: only the selected bytes, packed.
        let want = [
            Request::slice("x", vec![Indexer::range(1, 3), Indexer::range(2, 5)]),
            Request::tensor("y"),
        ];
        let (plan, sources) = UploadPlan::of(Source::Files(&files), Some(&want), 64).unwrap();
        let mut dst = vec![0u8; plan.total() as usize];
        plan.read_into(&sources, &mut dst).unwrap();
        assert_eq!(&dst[..6], &[8, 9, 10, 14, 15, 16]);
        assert_eq!(&dst[64..71], &y[..]);

        let mut short = vec![0u8; plan.total() as usize - 1];
        let e = plan.read_into(&sources, &mut short).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSlice, "{e}");
    }
}
