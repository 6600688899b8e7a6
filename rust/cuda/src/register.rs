//! Zero-copy uploads out of the page cache: the feeder that copies spans of a mapped file to the
//! device straight from the file's pages, registered with the driver (`cuMemHostRegister`,
//! read-only), instead of copying them through a pinned staging slot first. Each byte then
//! crosses host memory once (the DMA's read) instead of three times (the readers' read and
//! write, the DMA's read), which is what the staged path's ceiling on the H200 came from
//! (0.84-0.86× of the link with every CPU copy design; the DMA from the registered mapping
//! streamed at 0.86× with no CPU copy at all; docs/gpu.md).
//!
//! How (the core's ring offers the feeder whole spans of chunks from the readers' own queue,
//! `UploadTarget::copy_direct`):
//! 1. the span's runs, by file, as page-aligned ranges of the file's mapping; parts already
//!    registered for an earlier span are reused, the rest registered now, read-only;
//! 2. one `cuMemcpyHtoDAsync` per run (cut where registrations meet), padding zeroed with
//!    `cuMemsetD8Async`, on the upload's stream, then an event (a mark);
//! 3. a registration is unregistered once the mark of the last span that used it has completed:
//!    when the window needs room, or when the upload ends (`finish`);
//! 4. at most `window_bytes` are registered at once: the page cache the feeder pins is bounded.
//!
//! Any failure to register falls back to staging for that span (the ring's readers take it), so
//! the bytes never depend on the driver accepting a registration; a failure that will repeat
//! (the driver or the device cannot register read-only memory) turns zero-copy off for the
//! uploader. Only whole uploads (`Uploader::upload`) use it: they wait for every copy before
//! returning, so the mapping outlives every copy out of it and no registration survives the call.
//! A file truncated during an upload leaves registered pages valid memory (stale bytes at worst),
//! where a CPU copy would fault.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::upload::{parse_bytes, DirectSpan};
use safetensors_core::{Error, Result};

use crate::driver::{call, Gpu};
use crate::memory::{Event, EventPool};
use crate::trace::DeviceTrace;

/// The smallest average run (tensor, or part of one) a zero-copy span may have: each run is a
/// copy of its own (a staged chunk is one copy whatever it holds), and a copy's launch costs
/// ~5-10 µs on a device, so a span of small tensors (biases, norms; a 20,000-tensor file) is
/// staged instead.
const MIN_AVERAGE_RUN: u64 = 256 << 10;

/// Whether and how an uploader copies straight from the page cache.
///
/// [`ZeroCopy::from_env`] (what uploaders start with) reads `SAFETENSORS_ZERO_COPY` (`1` on,
/// `0` off; off by default until a GPU run decides, docs/gpu.md), `SAFETENSORS_ZERO_COPY_WINDOW`
/// and `SAFETENSORS_ZERO_COPY_SPAN` (bytes; suffix `K` or `M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCopy {
    /// Copy spans of mapped files straight from their pages.
    pub enabled: bool,
    /// Bytes registered at most at once.
    pub window_bytes: usize,
    /// Bytes a span covers at most (whole chunks: at least one).
    pub span_bytes: usize,
}

impl Default for ZeroCopy {
    fn default() -> Self {
        ZeroCopy::from_env()
    }
}

impl ZeroCopy {
    /// 4 spans of 64 MiB: the design's window (256 MiB of page cache pinned at most), and spans
    /// long enough that a registration's fixed cost is small beside its copies.
    pub const WINDOW: usize = 256 << 20;
    /// See [`ZeroCopy::WINDOW`].
    pub const SPAN: usize = 64 << 20;

    /// The defaults as the environment overrides them.
    pub fn from_env() -> ZeroCopy {
        let bytes = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| parse_bytes(&v))
                .filter(|&n| n > 0)
                .unwrap_or(default)
        };
        ZeroCopy {
            enabled: std::env::var("SAFETENSORS_ZERO_COPY").is_ok_and(|v| v == "1"),
            window_bytes: bytes("SAFETENSORS_ZERO_COPY_WINDOW", ZeroCopy::WINDOW),
            span_bytes: bytes("SAFETENSORS_ZERO_COPY_SPAN", ZeroCopy::SPAN),
        }
    }
}

/// What the feeder did since the uploader was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Spans copied zero-copy.
    pub spans: u64,
    /// Spans left to staging: a registration the driver refused, or a span larger than the
    /// window.
    pub fallbacks: u64,
    /// Spans left to staging because their tensors are small (see `MIN_AVERAGE_RUN`).
    pub small_runs: u64,
    /// Successful registrations and unregistrations.
    pub registrations: u64,
    /// See `registrations`.
    pub unregistrations: u64,
    /// Unregistrations the driver refused: those pages stay pinned, and zero-copy was turned
    /// off for the uploader (a driver that cannot unpin what it pinned is not fed more).
    pub unregister_failures: u64,
}

struct Registration {
    len: usize,
    /// The mark after the last span's copies out of it (0: none).
    last_use: u64,
}

#[derive(Default)]
struct FeedState {
    /// By host address: page-aligned, disjoint.
    regs: BTreeMap<usize, Registration>,
    /// Addresses in the order registered: the oldest is released first.
    order: VecDeque<usize>,
    bytes: usize,
    /// Marks not yet known complete, oldest first, by number.
    marks: VecDeque<(u64, Event)>,
    next_mark: u64,
}

/// An uploader's zero-copy feeder (see the module documentation).
pub(crate) struct Feeder {
    config: ZeroCopy,
    page: usize,
    state: Mutex<FeedState>,
    /// Set once registration failed in a way that will repeat: zero-copy stays off.
    off: AtomicBool,
    spans: AtomicU64,
    fallbacks: AtomicU64,
    small_runs: AtomicU64,
    registrations: AtomicU64,
    unregistrations: AtomicU64,
    unregister_failures: AtomicU64,
}

// SAFETY: the state is behind its mutex; addresses are kept as integers.
unsafe impl Sync for Feeder {}
unsafe impl Send for Feeder {}

/// Why zero-copy cannot run on `gpu` at all, checked once: the device's attributes, and the
/// platforms it was tried on (x86-64 with 4 KiB pages; file mappings were reported to wedge
/// host-to-device copies on 64 KiB-page kernels).
fn unsupported(gpu: &Gpu) -> Option<&'static str> {
    if !cfg!(target_arch = "x86_64") {
        return Some("zero-copy uploads are tried on x86-64 only");
    }
    // SAFETY: sysconf has no preconditions.
    if unsafe { libc::sysconf(libc::_SC_PAGESIZE) } != 4096 {
        return Some("zero-copy uploads need 4 KiB pages");
    }
    use sys::CUdevice_attribute as A;
    let attr = |a| gpu.attribute(a).unwrap_or(0);
    if attr(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED) == 0 {
        return Some("the device cannot register host memory");
    }
    if attr(A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED) == 0 {
        return Some("the device cannot register read-only host memory");
    }
    None
}

impl Feeder {
    /// A feeder for `gpu`, or `None` when zero-copy is off or cannot run there.
    pub(crate) fn new(gpu: &Gpu, config: ZeroCopy) -> Option<Feeder> {
        if !config.enabled || unsupported(gpu).is_some() {
            return None;
        }
        Some(Feeder {
            config,
            page: 4096,
            state: Mutex::new(FeedState {
                next_mark: 1,
                ..FeedState::default()
            }),
            off: AtomicBool::new(false),
            spans: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            small_runs: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            unregistrations: AtomicU64::new(0),
            unregister_failures: AtomicU64::new(0),
        })
    }

    pub(crate) fn config(&self) -> ZeroCopy {
        self.config
    }

    pub(crate) fn is_on(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }

    /// Chunks of `chunk` bytes a span covers.
    pub(crate) fn span_chunks(&self, chunk: usize) -> usize {
        (self.config.span_bytes / chunk.max(1)).max(1)
    }

    pub(crate) fn stats(&self) -> FeedStats {
        FeedStats {
            spans: self.spans.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            small_runs: self.small_runs.load(Ordering::Relaxed),
            registrations: self.registrations.load(Ordering::Relaxed),
            unregistrations: self.unregistrations.load(Ordering::Relaxed),
            unregister_failures: self.unregister_failures.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies `span` to `dst` (the destination's base) on `stream`, straight from the files'
    /// pages: `Ok(false)` when it cannot (a file not mapped, a registration refused, a span
    /// larger than the window), for the ring to stage it.
    pub(crate) fn copy(
        &self,
        span: &DirectSpan<'_>,
        dst: sys::CUdeviceptr,
        stream: sys::CUstream,
        events: &EventPool,
        trace: Option<&DeviceTrace>,
    ) -> Result<bool> {
        if !self.is_on() {
            return Ok(false);
        }
        if span.runs.len() as u64 > span.len / MIN_AVERAGE_RUN + 4 {
            self.small_runs.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        // Each run's host address, and the page-aligned ranges they need, merged.
        let mut runs = Vec::with_capacity(span.runs.len());
        for run in &span.runs {
            let Some(data) = run.file.mapped_data()? else {
                return self.fall_back();
            };
            let Some(bytes) = usize::try_from(run.src)
                .ok()
                .and_then(|at| data.get(at..at.checked_add(run.len as usize)?))
            else {
                return self.fall_back();
            };
            runs.push((bytes.as_ptr() as usize, run.len as usize, run.dst));
        }
        let mut need: Vec<(usize, usize)> = runs
            .iter()
            .filter(|r| r.1 > 0)
            .map(|&(at, len, _)| (at - at % self.page, (at + len).next_multiple_of(self.page)))
            .collect();
        need.sort_unstable();
        let need = merge(need);
        let mut st = self.lock();
        if !self.register(&mut st, &need)? {
            return self.fall_back();
        }
        let copies = || self.enqueue(&st, span, &runs, dst, stream);
        match trace {
            Some(t) => t.around(span.start, span.len, copies)?,
            None => copies()?,
        }
        let mark = st.next_mark;
        st.next_mark += 1;
        let event = events.record(stream)?;
        st.marks.push_back((mark, event));
        // The registrations this span used: those overlapping one of its ranges.
        for &(lo, hi) in &need {
            for (&base, reg) in st.regs.range_mut(..hi).rev() {
                if base + reg.len <= lo {
                    break;
                }
                reg.last_use = mark;
            }
        }
        self.spans.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn fall_back(&self) -> Result<bool> {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        Ok(false)
    }

    /// Registers what of `need` no registration covers yet, making room in the window first:
    /// `Ok(false)` when it cannot (the span larger than the window, or a registration refused).
    fn register(&self, st: &mut FeedState, need: &[(usize, usize)]) -> Result<bool> {
        let gaps = gaps(&st.regs, need);
        let new: usize = gaps.iter().map(|(a, b)| b - a).sum();
        if new > self.config.window_bytes {
            return Ok(false);
        }
        while st.bytes + new > self.config.window_bytes {
            if !self.release_oldest(st, need)? {
                return Ok(false);
            }
        }
        for (lo, hi) in gaps {
            let flags = sys::CU_MEMHOSTREGISTER_READ_ONLY;
            // SAFETY: [lo, hi) lies in a live mapping of the file (the pages around a run of its
            // data: the mapping covers whole pages), which outlives the upload.
            let registered = unsafe { sys::cuMemHostRegister_v2(lo as *mut _, hi - lo, flags) };
            let registered = call("cuMemHostRegister", || registered.result());
            match registered {
                Ok(()) => {
                    self.registrations.fetch_add(1, Ordering::Relaxed);
                    st.regs.insert(
                        lo,
                        Registration {
                            len: hi - lo,
                            last_use: 0,
                        },
                    );
                    st.order.push_back(lo);
                    st.bytes += hi - lo;
                }
                Err(Error::Cuda { message })
                    if message.contains("NOT_SUPPORTED") || message.contains("NOT_PERMITTED") =>
                {
                    // It will fail the same way every time: stay off.
                    self.off.store(true, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Unregisters the oldest registration `need` does not overlap, once the copies out of it
    /// are done; `false` when every registration overlaps `need`.
    fn release_oldest(&self, st: &mut FeedState, need: &[(usize, usize)]) -> Result<bool> {
        let Some(pos) = st.order.iter().position(|&at| {
            let len = st.regs.get(&at).map_or(0, |r| r.len);
            !need.iter().any(|&(lo, hi)| at < hi && lo < at + len)
        }) else {
            return Ok(false);
        };
        let at = st.order.remove(pos).expect("found");
        let reg = st.regs.remove(&at).expect("registered");
        st.bytes -= reg.len;
        self.wait_mark(st, reg.last_use)?;
        self.unregister(at);
        Ok(true)
    }

    /// Waits until mark `mark` has completed (0: none). The copies are on one stream, in
    /// order: every earlier mark has completed too.
    fn wait_mark(&self, st: &FeedState, mark: u64) -> Result<()> {
        if let Some((_, event)) = st.marks.iter().find(|(m, _)| *m == mark) {
            // SAFETY: an event of the pool, recorded after the copies it marks.
            call("cuEventSynchronize", || unsafe {
                cu::event::synchronize(event.0)
            })?;
        }
        Ok(())
    }

    /// Unregisters the range at `at`. A refusal is not the upload's error (its bytes are
    /// right): the pages stay pinned, which nothing here can undo, and zero-copy is turned off
    /// for the uploader, so that it pins no more; `FeedStats` counts it.
    fn unregister(&self, at: usize) {
        // SAFETY: a range this feeder registered, with no copy out of it pending.
        let result = unsafe { sys::cuMemHostUnregister(at as *mut _) };
        match call("cuMemHostUnregister", || result.result()) {
            Ok(()) => {
                self.unregistrations.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.unregister_failures.fetch_add(1, Ordering::Relaxed);
                self.off.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Enqueues the span's copies (runs cut where registrations meet) and the zeroing of its
    /// padding.
    fn enqueue(
        &self,
        st: &FeedState,
        span: &DirectSpan<'_>,
        runs: &[(usize, usize, u64)],
        dst: sys::CUdeviceptr,
        stream: sys::CUstream,
    ) -> Result<()> {
        // Padding between runs: zeroed gap by gap, or, with more than a few gaps, the whole span
        // at once before the copies (one launch; the device writes its own memory at several
        // TB/s, and the copies after it, in stream order, overwrite all but the gaps).
        let gaps = runs
            .iter()
            .scan(span.start, |at, &(_, len, to)| {
                let gap = to > *at;
                *at = to + len as u64;
                Some(gap)
            })
            .filter(|&g| g)
            .count();
        let whole = gaps > 2;
        let mut at = span.start;
        let zero = |from: u64, to: u64| -> Result<()> {
            if to > from {
                // SAFETY: inside the destination, which the plan was sized for.
                call("cuMemsetD8Async", || unsafe {
                    sys::cuMemsetD8Async(dst + from, 0, (to - from) as usize, stream).result()
                })?;
            }
            Ok(())
        };
        if whole {
            zero(span.start, span.start + span.len)?;
        }
        for &(host, len, to) in runs {
            if !whole {
                zero(at, to)?;
            }
            let mut done = 0;
            while done < len {
                let here = host + done;
                let (&base, reg) = st
                    .regs
                    .range(..=here)
                    .next_back()
                    .filter(|(b, r)| here < *b + r.len)
                    .ok_or_else(|| Error::Internal {
                        message: "a zero-copy run lies outside its registration".into(),
                    })?;
                let n = (len - done).min(base + reg.len - here);
                // SAFETY: registered host memory the mapping keeps alive for the upload; the
                // destination range lies inside the allocation the plan was sized for.
                call("cuMemcpyHtoDAsync", || unsafe {
                    sys::cuMemcpyHtoDAsync_v2(dst + to + done as u64, here as *const _, n, stream)
                        .result()
                })?;
                done += n;
            }
            at = to + len as u64;
        }
        if whole {
            return Ok(());
        }
        zero(at, span.start + span.len)
    }

    /// After the upload (the stream synchronized): every registration released, the marks'
    /// events given back. Without knowing that the copies are done (the synchronization
    /// failed, which is the error returned), the registrations stay, their pages pinned for the
    /// process's life, rather than be released under the copy engine.
    pub(crate) fn finish(&self, stream: sys::CUstream, events: &EventPool) -> Result<()> {
        let mut st = self.lock();
        if st.regs.is_empty() && st.marks.is_empty() {
            return Ok(());
        }
        // SAFETY: the upload's own stream (whole uploads only), valid for the call.
        call("cuStreamSynchronize", || unsafe {
            cu::stream::synchronize(stream)
        })?;
        let regs: Vec<usize> = st.regs.keys().copied().collect();
        for at in regs {
            self.unregister(at);
        }
        st.regs.clear();
        st.order.clear();
        st.bytes = 0;
        for (_, event) in st.marks.drain(..) {
            events.give(event);
        }
        Ok(())
    }
}

/// Sorted ranges, overlapping or touching ones merged.
fn merge(sorted: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(sorted.len());
    for (lo, hi) in sorted {
        match out.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The parts of `need` (sorted, disjoint) no registration in `regs` covers.
fn gaps(regs: &BTreeMap<usize, Registration>, need: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(lo, hi) in need {
        let mut at = lo;
        // The registration holding `lo`, if any, then every one starting inside the range.
        let before = regs
            .range(..=lo)
            .next_back()
            .filter(|(b, r)| lo < *b + r.len)
            .map(|(b, r)| (*b, r.len));
        let inside = regs.range(lo + 1..hi).map(|(b, r)| (*b, r.len));
        for (base, len) in before.into_iter().chain(inside) {
            if base > at {
                out.push((at, base));
            }
            at = at.max(base + len);
        }
        if at < hi {
            out.push((at, hi));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_what_no_registration_covers() {
        let mut regs = BTreeMap::new();
        regs.insert(
            4096,
            Registration {
                len: 8192,
                last_use: 0,
            },
        );
        regs.insert(
            20480,
            Registration {
                len: 4096,
                last_use: 0,
            },
        );
        assert_eq!(
            gaps(&regs, &[(0, 32768)]),
            vec![(0, 4096), (12288, 20480), (24576, 32768)]
        );
        assert_eq!(gaps(&regs, &[(8192, 12288)]), vec![]);
        assert_eq!(
            merge(vec![(0, 4096), (4096, 8192), (12288, 16384)]),
            vec![(0, 8192), (12288, 16384)]
        );
    }
}
