//! Warming the page cache for a plan (whole file, some tensors, slices) before a load, with
//! several threads and large requests in file order, and access hints for the mapped backend.
//!
//! Why read and not only `posix_fadvise(WILLNEED)`: the hint is asynchronous and the kernel caps
//! its readahead, so it alone gives no progress to report and no guarantee; a `pread` of each
//! request puts exactly those pages in the cache and tells us when they are there. The hint is
//! still issued first for each request, so the device sees the next request's I/O early.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::slice::SlicePlan;

/// What to warm: byte ranges of one file's data buffer, built from tensors and slices.
///
/// ```no_run
/// use safetensors_core::{Backend, Plan, SafeFile};
/// let f = SafeFile::open("model.safetensors", Backend::Mmap)?;
/// let mut plan = Plan::new(&f);
/// plan.add_tensor(&f, "wte.weight")?;
/// plan.prefetch(Default::default())?.wait()?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Plan {
    path: PathBuf,
    data_start: u64,
    data_len: u64,
    ranges: Vec<(u64, u64)>,
}

impl Plan {
    /// An empty plan for `file`.
    pub fn new(file: &SafeFile) -> Plan {
        Plan {
            path: file.path().to_path_buf(),
            data_start: file.header().data_start() as u64,
            data_len: file.header().data_len() as u64,
            ranges: Vec::new(),
        }
    }

    /// A plan for every tensor byte of `file`.
    pub fn whole(file: &SafeFile) -> Plan {
        let mut plan = Plan::new(file);
        plan.add_range(0, plan.data_len);
        plan
    }

    /// Adds tensor `name`.
    pub fn add_tensor(&mut self, file: &SafeFile, name: &str) -> Result<()> {
        let (begin, end) = file.info(name)?.data_offsets;
        self.add_range(begin as u64, (end - begin) as u64);
        Ok(())
    }

    /// Adds the bytes a slice of tensor `name` selects (only those).
    pub fn add_slice(&mut self, file: &SafeFile, name: &str, slice: &SlicePlan) -> Result<()> {
        let begin = file.info(name)?.data_offsets.0 as u64;
        for (offset, len) in slice.runs() {
            self.add_range(begin + offset as u64, len as u64);
        }
        Ok(())
    }

    /// Adds `len` bytes of the data buffer from `offset` (clamped to the buffer).
    pub fn add_range(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.data_len);
        if offset < end {
            self.ranges.push((offset, end - offset));
        }
    }

    /// The plan's ranges, relative to the data buffer, sorted and merged.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut sorted = self.ranges.clone();
        sorted.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
        for (offset, len) in sorted {
            match out.last_mut() {
                Some((o, l)) if offset <= *o + *l => *l = (*l).max(offset + len - *o),
                _ => out.push((offset, len)),
            }
        }
        out
    }

    /// Bytes the plan covers.
    pub fn total_bytes(&self) -> u64 {
        self.ranges().iter().map(|r| r.1).sum()
    }

    /// Starts warming the plan's bytes in the background; see [`Prefetch`].
    pub fn prefetch(&self, options: PrefetchOptions) -> Result<Prefetch> {
        Prefetch::start(self, options).map_err(|e| e.in_file(&self.path))
    }
}

/// How a prefetch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchOptions {
    /// Reader threads (at least 1). Default 4: enough to keep a virtual disk's queue busy.
    pub threads: usize,
    /// Bytes per request (rounded up to 64 KiB). Default 16 MiB.
    pub request_bytes: usize,
}

impl Default for PrefetchOptions {
    fn default() -> Self {
        PrefetchOptions {
            threads: 4,
            request_bytes: 16 << 20,
        }
    }
}

struct Shared {
    file: File,
    path: PathBuf,
    requests: Vec<(u64, usize)>,
    next: AtomicUsize,
    done: AtomicU64,
    cancel: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// A prefetch in progress: [`Prefetch::bytes_done`] reports progress, [`Prefetch::wait`] the
/// outcome. Dropping it cancels the requests not yet started and waits for the running ones.
pub struct Prefetch {
    shared: Arc<Shared>,
    total: u64,
    threads: Vec<JoinHandle<()>>,
}

impl Prefetch {
    fn start(plan: &Plan, options: PrefetchOptions) -> Result<Prefetch> {
        let file = File::open(&plan.path).map_err(|e| Error::io(&plan.path, "open", e))?;
        let step = options.request_bytes.max(1).div_ceil(64 << 10) * (64 << 10);
        let mut requests = Vec::new();
        for (offset, len) in plan.ranges() {
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(step as u64);
                requests.push((plan.data_start + offset + at, n as usize));
                at += n;
            }
        }
        let total = requests.iter().map(|r| r.1 as u64).sum();
        let shared = Arc::new(Shared {
            file,
            path: plan.path.clone(),
            requests,
            next: AtomicUsize::new(0),
            done: AtomicU64::new(0),
            cancel: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let count = options.threads.clamp(1, 64).min(shared.requests.len());
        let mut threads = Vec::with_capacity(count);
        for _ in 0..count {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("st-prefetch".into())
                .spawn(move || worker(&s, step));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let mut p = Prefetch {
                        shared,
                        total,
                        threads,
                    };
                    p.stop();
                    return Err(Error::io(&plan.path, "start a prefetch thread", e));
                }
            }
        }
        Ok(Prefetch {
            shared,
            total,
            threads,
        })
    }

    /// Bytes of the plan now in the page cache (read by this prefetch).
    pub fn bytes_done(&self) -> u64 {
        self.shared.done.load(Ordering::Relaxed)
    }

    /// Bytes the plan covers.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Waits for every request; the first read error, if any (naming the file).
    pub fn wait(mut self) -> Result<()> {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let err = self.shared.error.lock().map(|mut e| e.take());
        match err {
            Ok(Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    fn stop(&mut self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Claims requests in file order until none are left, the prefetch is cancelled, or one fails.
fn worker(s: &Shared, step: usize) {
    let mut buf = Vec::new();
    if buf.try_reserve_exact(step).is_err() {
        record(s, io::Error::from(io::ErrorKind::OutOfMemory));
        return;
    }
    buf.resize(step, 0u8);
    while !s.cancel.load(Ordering::Relaxed) {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        let Some(&(at, len)) = s.requests.get(i) else {
            return;
        };
        // SAFETY: a plain system call on a descriptor we own; it only hints.
        unsafe {
            libc::posix_fadvise(
                s.file.as_raw_fd(),
                at as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        match s.file.read_exact_at(&mut buf[..len], at) {
            Ok(()) => {
                s.done.fetch_add(len as u64, Ordering::Relaxed);
            }
            Err(e) => {
                record(s, e);
                return;
            }
        }
    }
}

fn record(s: &Shared, e: io::Error) {
    s.cancel.store(true, Ordering::Relaxed);
    if let Ok(mut slot) = s.error.lock() {
        slot.get_or_insert_with(|| Error::io(&s.path, "prefetch", e));
    }
}

/// Access-pattern hints for the mapped backend (`madvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// The plan will be read soon: start reading it in (`MADV_WILLNEED`).
    WillNeed,
    /// Read front to back: larger readahead (`MADV_SEQUENTIAL`).
    Sequential,
    /// Scattered reads: no readahead (`MADV_RANDOM`).
    Random,
}

/// Gives the kernel `advice` for the plan's ranges of `file`'s mapping. A no-op for the read and
/// direct backends (nothing is mapped). Hints that the kernel refuses are reported as `Io`.
pub fn advise(file: &SafeFile, plan: &Plan, advice: Advice) -> Result<()> {
    let Some(data) = file.mapped_data() else {
        return Ok(());
    };
    let flag = match advice {
        Advice::WillNeed => libc::MADV_WILLNEED,
        Advice::Sequential => libc::MADV_SEQUENTIAL,
        Advice::Random => libc::MADV_RANDOM,
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let base = data.as_ptr() as usize;
    for (offset, len) in plan.ranges() {
        let start = base + offset as usize;
        // The mapping starts on a page, so rounding down stays inside it.
        let aligned = start - start % page;
        let span = start + len as usize - aligned;
        // SAFETY: the range lies inside this file's live, read-only mapping; advice does not
        // change its contents.
        let rc = unsafe { libc::madvise(aligned as *mut libc::c_void, span, flag) };
        if rc != 0 {
            return Err(Error::io(
                file.path(),
                "madvise",
                io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}
