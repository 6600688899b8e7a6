//! Warming the page cache for a plan (whole files, a checkpoint, some tensors, slices, ranges)
//! before a load, with several threads and large requests in file order, and access hints for
//! the mapped backend.
//!
//! Why read and not only `posix_fadvise(WILLNEED)`: the hint is asynchronous and the kernel caps
//! its readahead, so it alone gives no progress to report and no guarantee; a `pread` of each
//! request puts exactly those pages in the cache and tells us when they are there. The hint is
//! still issued first for each request, so the device sees the next request's I/O early.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::fallible;
use crate::file::SafeFile;
use crate::open::{reopen, Identity};
use crate::request::{resolve, Request, Source};
use crate::slice::SlicePlan;

/// What to warm: byte ranges of the data buffers of one or more files, built from tensors,
/// slices and ranges. Files are warmed in the order they joined the plan (the source's order for
/// [`Plan::of`]), each one's ranges in offset order.
///
/// ```no_run
/// use safetensors_core::{Backend, Checkpoint, Plan, Request, SafeFile, Source};
/// let f = SafeFile::open("model.safetensors", Backend::Mmap)?;
/// let mut plan = Plan::new(&f);
/// plan.add_tensor(&f, "wte.weight")?;
/// plan.prefetch(Default::default())?.wait()?;
///
/// // A whole checkpoint, or some of its tensors, in one call.
/// let ckpt = Checkpoint::open("model.safetensors.index.json", Backend::Mmap)?;
/// Plan::of(Source::Checkpoint(&ckpt), None)?.prefetch(Default::default())?.wait()?;
/// let some = [Request::tensor("lm_head.weight")];
/// Plan::of(Source::Checkpoint(&ckpt), Some(&some))?.prefetch(Default::default())?.wait()?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
///
/// A plan holds paths and data offsets only: prefetching reads each file through a descriptor
/// of its own, opened by path when a reader thread reaches it, and needs no view. Files still
/// have to be opened and validated once to build a plan (where a tensor lies is in its header);
/// [`Plan::of`] opens a checkpoint's shards through the checkpoint, which keeps them.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    files: Vec<PlanFile>,
}

#[derive(Debug, Clone)]
struct PlanFile {
    path: PathBuf,
    /// The file the plan was made from: a reader that opens `path` and finds another file
    /// reports it instead of warming that one.
    identity: Option<Identity>,
    data_start: u64,
    data_len: u64,
    /// Sorted, merged: no two overlap or touch.
    ranges: Vec<(u64, u64)>,
}

/// The runs of one selection closer than this are warmed as one range: the kernel reads and
/// advises whole pages, so a strided selection costs a range per group of pages it touches, not
/// a range (and a request) per element.
const PAGE: u64 = 4096;

impl PlanFile {
    /// Adds `[offset, offset + len)` (clamped to the data buffer), merged with every range it
    /// overlaps, touches or comes within `bridge` bytes of. Ranges mostly arrive in order, so
    /// this is mostly an append or an extension of the last range.
    fn add_range(&mut self, offset: u64, len: u64, bridge: u64) -> Result<()> {
        let end = offset.saturating_add(len).min(self.data_len);
        if offset >= end {
            return Ok(());
        }
        let near = |r: &(u64, u64)| r.0 + r.1 + bridge >= offset;
        let i = match self.ranges.last() {
            Some(last) if !near(last) => self.ranges.len(),
            _ => self.ranges.partition_point(|r| !near(r)),
        };
        let j = i + self.ranges[i..].partition_point(|r| r.0 <= end.saturating_add(bridge));
        if i == j {
            fallible::reserve(&mut self.ranges, 1, "a prefetch plan's ranges")?;
            self.ranges.insert(i, (offset, end - offset));
        } else {
            let start = offset.min(self.ranges[i].0);
            let (o, l) = self.ranges[j - 1];
            self.ranges[i] = (start, end.max(o + l) - start);
            self.ranges.drain(i + 1..j);
        }
        Ok(())
    }
}

impl Plan {
    /// An empty plan for `file` (its first file; see [`Plan::add_range`]).
    pub fn new(file: &SafeFile) -> Plan {
        let mut plan = Plan::default();
        plan.add_file(file);
        plan
    }

    /// A plan for every tensor byte of `file`.
    pub fn whole(file: &SafeFile) -> Plan {
        let mut plan = Plan::new(file);
        plan.add_range(0, u64::MAX);
        plan
    }

    /// A plan for `requests` of `source` (`None`: every tensor of every file, or every tensor
    /// a checkpoint's index lists), in one call: the files in the source's order, each one's
    /// bytes in offset order. Opens the checkpoint shards it touches (see [`Source`]).
    ///
    /// Files in memory ([`SafeFile::from_memory`]) have nothing to warm and are left out.
    pub fn of(source: Source<'_>, requests: Option<&[Request]>) -> Result<Plan> {
        let mut plan = Plan::default();
        for item in resolve(source, requests)? {
            if item.source.is_in_memory() {
                continue;
            }
            let slot = plan.add_file(&item.source);
            let bridge = if item.slice.is_some() { PAGE } else { 0 };
            for (offset, len) in item.runs() {
                plan.files[slot].add_range(offset, len, bridge)?;
            }
        }
        Ok(plan)
    }

    /// Adds `file` to the plan (no bytes yet) unless it is there; returns its position among
    /// the plan's files. Files are known by path.
    pub fn add_file(&mut self, file: &SafeFile) -> usize {
        // From the end: plans are mostly built file by file.
        if let Some(i) = self.files.iter().rposition(|f| f.path == file.path()) {
            return i;
        }
        self.files.push(PlanFile {
            path: file.path().to_path_buf(),
            identity: file.identity(),
            data_start: file.header().data_start() as u64,
            data_len: file.header().data_len() as u64,
            ranges: Vec::new(),
        });
        self.files.len() - 1
    }

    /// Adds tensor `name` of `file` (adding the file if needed).
    pub fn add_tensor(&mut self, file: &SafeFile, name: &str) -> Result<()> {
        let (begin, end) = file.info(name)?.data_offsets;
        let slot = self.add_file(file);
        self.files[slot].add_range(begin as u64, (end - begin) as u64, 0)
    }

    /// Adds the pages a slice of tensor `name` of `file` selects: its runs, those closer than a
    /// page merged into one range (with the bytes between them).
    pub fn add_slice(&mut self, file: &SafeFile, name: &str, slice: &SlicePlan) -> Result<()> {
        let begin = file.info(name)?.data_offsets.0 as u64;
        let slot = self.add_file(file);
        for (offset, len) in slice.runs() {
            self.files[slot].add_range(begin + offset as u64, len as u64, PAGE)?;
        }
        Ok(())
    }

    /// Adds `len` bytes of the first file's data buffer from `offset` (clamped to the buffer);
    /// nothing when the plan has no file. (A range that merges with none grows the plan by one
    /// entry; one the plan has no memory for is left out, the plan being a hint.)
    pub fn add_range(&mut self, offset: u64, len: u64) {
        if let Some(f) = self.files.first_mut() {
            let _ = f.add_range(offset, len, 0);
        }
    }

    /// Adds `len` bytes of `file`'s data buffer from `offset` (clamped to the buffer), as
    /// [`Plan::add_range`] does.
    pub fn add_range_in(&mut self, file: &SafeFile, offset: u64, len: u64) {
        let slot = self.add_file(file);
        let _ = self.files[slot].add_range(offset, len, 0);
    }

    /// The first file's ranges, relative to its data buffer, sorted and merged.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.file_ranges(0)
    }

    /// Number of files in the plan.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Path of the plan's file `i`.
    pub fn file_path(&self, i: usize) -> Option<&Path> {
        self.files.get(i).map(|f| f.path.as_path())
    }

    /// The ranges of the plan's file `i`, relative to its data buffer, sorted and merged.
    pub fn file_ranges(&self, i: usize) -> Vec<(u64, u64)> {
        self.files
            .get(i)
            .map(|f| f.ranges.clone())
            .unwrap_or_default()
    }

    /// Bytes the plan covers, in every file.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().flat_map(|f| &f.ranges).map(|r| r.1).sum()
    }

    /// Starts warming the plan's bytes in the background; see [`Prefetch`].
    pub fn prefetch(&self, options: PrefetchOptions) -> Result<Prefetch> {
        Prefetch::start(self, options)
    }
}

/// The largest request a prefetch makes (larger `request_bytes` are clamped to it): bigger
/// requests gain nothing on any disk we measured, and each reader thread holds one such buffer.
pub const MAX_REQUEST_BYTES: usize = 256 << 20;

/// Requests are whole multiples of this many bytes (except a range's last).
const REQUEST_GRAIN: usize = 64 << 10;

/// How a prefetch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchOptions {
    /// Reader threads (at least 1). Default 4: enough to keep a virtual disk's queue busy.
    pub threads: usize,
    /// Bytes per request, rounded up to 64 KiB and at most [`MAX_REQUEST_BYTES`]: each reader
    /// thread holds one buffer of this size (or of the largest request, when smaller). Default
    /// 16 MiB.
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

/// One read of the prefetch: `len` bytes of file `file` at file offset `at`.
#[derive(Clone, Copy)]
struct Read {
    file: usize,
    at: u64,
    len: usize,
}

struct Shared {
    paths: Vec<PathBuf>,
    identities: Vec<Option<Identity>>,
    requests: Vec<Read>,
    next: AtomicUsize,
    done: AtomicU64,
    cancel: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// A prefetch in progress: [`Prefetch::bytes_done`] reports progress, [`Prefetch::wait`] the
/// outcome. Dropping it cancels the requests not yet started and waits for the running ones.
/// Every method may be called from several threads at once (a progress display beside a
/// waiting thread).
pub struct Prefetch {
    shared: Arc<Shared>,
    total: u64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Prefetch {
    fn start(plan: &Plan, options: PrefetchOptions) -> Result<Prefetch> {
        // Clamped before rounding, so that no requested size can overflow.
        let step = options
            .request_bytes
            .clamp(1, MAX_REQUEST_BYTES)
            .div_ceil(REQUEST_GRAIN)
            * REQUEST_GRAIN;
        let mut requests = Vec::new();
        for (file, f) in plan.files.iter().enumerate() {
            if f.identity.is_none() {
                // Bytes in memory: nothing to warm, and no path to open.
                continue;
            }
            for &(offset, len) in &f.ranges {
                let mut at = 0u64;
                while at < len {
                    let n = (len - at).min(step as u64);
                    let read = Read {
                        file,
                        at: f.data_start + offset + at,
                        len: n as usize,
                    };
                    fallible::push(&mut requests, read, "a prefetch's requests")?;
                    at += n;
                }
            }
        }
        let total = requests.iter().map(|r| r.len as u64).sum();
        // Each thread's buffer: one request, never more than the largest one.
        let buffer = requests.iter().map(|r| r.len).max().unwrap_or(0);
        let shared = Arc::new(Shared {
            paths: plan.files.iter().map(|f| f.path.clone()).collect(),
            identities: plan.files.iter().map(|f| f.identity).collect(),
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
                .spawn(move || worker(&s, buffer));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let p = Prefetch {
                        shared,
                        total,
                        threads: Mutex::new(threads),
                    };
                    p.stop();
                    let at = plan.files.first().map_or(Path::new(""), |f| &f.path);
                    return Err(Error::io(at, "start a prefetch thread", e));
                }
            }
        }
        Ok(Prefetch {
            shared,
            total,
            threads: Mutex::new(threads),
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

    /// Waits for every request; the first error, if any (an `Io` error naming the file that
    /// could not be opened or read). Every call (and every thread waiting beside it) gets the
    /// same outcome: a prefetch that failed never reports success later.
    pub fn wait(&self) -> Result<()> {
        self.join();
        // Announced to a sanitized program's ThreadSanitizer (`tsan::lock`): the error was made on
        // a reader thread and is cloned here, on whichever thread waits.
        let slot = crate::tsan::lock(&self.shared.error);
        match slot.as_ref() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Joins every reader thread (a second caller waits for the first to finish joining).
    fn join(&self) {
        // Announced as the error's lock is: a second waiter that finds the threads joined by the
        // first sees what the readers did through this lock, not through its own join.
        let mut threads = crate::tsan::lock(&self.threads);
        for t in threads.drain(..) {
            let _ = t.join();
        }
    }

    fn stop(&self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
        self.join();
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Claims requests in file order until none are left, the prefetch is cancelled, or one fails.
/// Each thread opens a file when it first reaches it and closes it when it moves on, so a
/// checkpoint of thousands of shards costs at most one descriptor per thread.
fn worker(s: &Shared, buffer: usize) {
    let mut buf = Vec::new();
    if buf.try_reserve_exact(buffer).is_err() {
        let path = s.paths.first().map_or(Path::new(""), |p| p.as_path());
        record(
            s,
            Error::io(
                path,
                "prefetch",
                io::Error::from(io::ErrorKind::OutOfMemory),
            ),
        );
        return;
    }
    buf.resize(buffer, 0u8);
    let mut open: Option<(usize, File)> = None;
    while !s.cancel.load(Ordering::Relaxed) {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        let Some(&r) = s.requests.get(i) else {
            return;
        };
        let file = match open.take() {
            Some((n, f)) if n == r.file => f,
            _ => match open_planned(s, r.file) {
                Ok(f) => f,
                Err(e) => {
                    record(s, e);
                    return;
                }
            },
        };
        // SAFETY: a plain system call on a descriptor we own; it only hints.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                r.at as libc::off_t,
                r.len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        match file.read_exact_at(&mut buf[..r.len], r.at) {
            Ok(()) => {
                s.done.fetch_add(r.len as u64, Ordering::Relaxed);
            }
            Err(e) => {
                record(s, Error::io(&s.paths[r.file], "prefetch", e));
                return;
            }
        }
        open = Some((r.file, file));
    }
}

/// Opens the plan's file `i`, checked to be the file the plan was made from.
fn open_planned(s: &Shared, i: usize) -> Result<File> {
    let path = &s.paths[i];
    match s.identities.get(i).copied().flatten() {
        Some(id) => reopen(path, &id, 0).map_err(|e| Error::io(path, "open", e)),
        None => Err(Error::Internal {
            message: format!("{} has no identity to prefetch by", path.display()),
        }),
    }
}

fn record(s: &Shared, e: Error) {
    s.cancel.store(true, Ordering::Relaxed);
    crate::tsan::lock(&s.error).get_or_insert(e);
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

/// Gives the kernel `advice` for the plan's ranges of `file`'s mapping (nothing when the plan
/// does not cover `file`). A no-op for the read and direct backends (nothing is mapped). Hints
/// that the kernel refuses are reported as `Io`.
pub fn advise(file: &SafeFile, plan: &Plan, advice: Advice) -> Result<()> {
    let Some(entry) = plan.files.iter().find(|f| f.path == file.path()) else {
        return Ok(());
    };
    // Advice is for reading soon: a file not mapped yet is mapped now to take it.
    let Some(data) = file.mapped_data()? else {
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
    for &(offset, len) in &entry.ranges {
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
