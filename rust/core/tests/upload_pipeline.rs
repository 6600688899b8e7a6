//! The pipeline's schedule against a destination behind a modelled link: copies wait their turn
//! on one link at a set bandwidth, in submission order, as a PCIe link and its copy engine
//! serve them, and the test reads when each started and ended. What striping and persistent
//! readers promise (docs/gpu.md): the link busy from its first copy to its last, the first copy
//! after one round of stripes instead of a round of whole chunks, every byte where the plan
//! says, the reader threads kept between runs; and what zero-copy spans promise: bytes exact
//! whether the target takes a span or declines it.
//!
//! Fills are paced ([`PipelineOptions::min_fill_ns_per_mib`]): each stripe takes at least a set
//! time, sleeping, so that the schedule and not the machine's load decides the timings checked
//! here (a sleeping reader needs no core); the link is slower than the readers together.

mod common;

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::hang::without_hanging;
use common::scratch_dir;
use safetensors_core::upload::{
    on_reader_thread, DirectSpan, PipelineOptions, Ring, RingOptions, UploadPlan, UploadTarget,
};
use safetensors_core::{serialize_to_file, Backend, Dtype, ErrorKind, SafeFile, TensorView};

/// A copy's completion.
#[derive(Default)]
struct Done {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    fn set(&self) {
        *self.done.lock().unwrap() = true;
        self.cv.notify_all();
    }
    fn wait(&self) {
        let mut d = self.done.lock().unwrap();
        while !*d {
            d = self.cv.wait(d).unwrap();
        }
    }
}

/// A copy queued on the link: `len` bytes from host address `src` (0: zeros) to `dst`, queued
/// at `at` from the link's origin.
struct Copy {
    src: usize,
    len: usize,
    dst: u64,
    at: Duration,
    done: Arc<Done>,
}

struct LinkState {
    queue: VecDeque<Copy>,
    stop: bool,
    /// Each copy's start and end, from the target's origin.
    spans: Vec<(Duration, Duration)>,
}

/// The link: one thread that runs queued copies in order, each taking `len / bandwidth` on the
/// link's clock.
struct Link {
    state: Mutex<LinkState>,
    cv: Condvar,
    ns_per_byte: f64,
    origin: Instant,
    dst: Mutex<Vec<u8>>,
}

fn link_thread(link: Arc<Link>) {
    let mut free_at = Duration::ZERO;
    loop {
        let copy = {
            let mut st = link.state.lock().unwrap();
            loop {
                if let Some(c) = st.queue.pop_front() {
                    break c;
                }
                if st.stop {
                    return;
                }
                st = link.cv.wait(st).unwrap();
            }
        };
        // On the link's own clock: a copy starts when it was queued or when the link is free,
        // whichever is later, however late this thread wakes (a busy machine delays the bytes'
        // arrival, never the schedule).
        let start = copy.at.max(free_at);
        let end = start + Duration::from_nanos((copy.len as f64 * link.ns_per_byte) as u64);
        free_at = end;
        {
            let mut dst = link.dst.lock().unwrap();
            let out = &mut dst[copy.dst as usize..copy.dst as usize + copy.len];
            if copy.src == 0 {
                out.fill(0);
            } else {
                // SAFETY: the submitter keeps these bytes untouched until the copy is done.
                out.copy_from_slice(unsafe {
                    std::slice::from_raw_parts(copy.src as *const u8, copy.len)
                });
            }
        }
        if let Some(wait) = end.checked_sub(link.origin.elapsed()) {
            std::thread::sleep(wait);
        }
        link.state.lock().unwrap().spans.push((start, end));
        copy.done.set();
    }
}

/// A destination behind a [`Link`]; optionally copies spans straight from mapped files.
struct LinkTarget {
    link: Arc<Link>,
    thread: Option<JoinHandle<()>>,
    /// Zero-copy: spans of this many chunks are offered; every `decline`-th is refused.
    direct_chunks: usize,
    decline: usize,
    offered: AtomicUsize,
    taken: AtomicUsize,
    direct_pending: Mutex<Vec<Arc<Done>>>,
    /// Threads that ran the readers, and whether they were the ring's own.
    readers: Mutex<HashSet<(std::thread::ThreadId, bool)>>,
}

struct LinkSlot {
    buf: Vec<u8>,
    pending: Option<Arc<Done>>,
}

impl Drop for LinkSlot {
    fn drop(&mut self) {
        assert!(
            self.pending.is_none(),
            "a slot was freed with its copy pending"
        );
    }
}

impl LinkTarget {
    /// A link at `gbps` (10^9 bytes per second) to a destination of `len` bytes.
    fn new(len: u64, gbps: f64) -> LinkTarget {
        let link = Arc::new(Link {
            state: Mutex::new(LinkState {
                queue: VecDeque::new(),
                stop: false,
                spans: Vec::new(),
            }),
            cv: Condvar::new(),
            ns_per_byte: 1.0 / gbps,
            origin: Instant::now(),
            dst: Mutex::new(vec![0xAB; len as usize]),
        });
        let thread = {
            let link = link.clone();
            std::thread::spawn(move || link_thread(link))
        };
        LinkTarget {
            link,
            thread: Some(thread),
            direct_chunks: 0,
            decline: 0,
            offered: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            direct_pending: Mutex::new(Vec::new()),
            readers: Mutex::new(HashSet::new()),
        }
    }

    fn enqueue(&self, src: usize, len: usize, dst: u64) -> Arc<Done> {
        let done = Arc::new(Done::default());
        let at = self.link.origin.elapsed();
        self.link.state.lock().unwrap().queue.push_back(Copy {
            src,
            len,
            dst,
            at,
            done: done.clone(),
        });
        self.link.cv.notify_all();
        done
    }

    fn bytes(&self) -> Vec<u8> {
        self.link.dst.lock().unwrap().clone()
    }

    /// The copies' (start, end), and the instant the spans are measured from.
    fn spans(&self) -> Vec<(Duration, Duration)> {
        self.link.state.lock().unwrap().spans.clone()
    }

    fn reset(&self) {
        self.link.state.lock().unwrap().spans.clear();
        self.link.dst.lock().unwrap().fill(0xAB);
    }
}

impl Drop for LinkTarget {
    fn drop(&mut self) {
        self.link.state.lock().unwrap().stop = true;
        self.link.cv.notify_all();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl UploadTarget for LinkTarget {
    type Slot = LinkSlot;

    fn new_slot(&self, bytes: usize) -> safetensors_core::Result<LinkSlot> {
        Ok(LinkSlot {
            buf: vec![0xCD; bytes],
            pending: None,
        })
    }

    fn buffer<'s>(&self, slot: &'s mut LinkSlot) -> &'s mut [u8] {
        &mut slot.buf
    }

    fn submit(&self, slot: &mut LinkSlot, len: usize, dst: u64) -> safetensors_core::Result<()> {
        assert!(
            slot.pending.is_none(),
            "a slot was submitted twice without a wait"
        );
        slot.pending = Some(self.enqueue(slot.buf.as_ptr() as usize, len, dst));
        Ok(())
    }

    fn wait(&self, slot: &mut LinkSlot) -> safetensors_core::Result<()> {
        if let Some(done) = slot.pending.take() {
            done.wait();
        }
        Ok(())
    }

    fn enter_thread(&self) -> safetensors_core::Result<()> {
        self.readers
            .lock()
            .unwrap()
            .insert((std::thread::current().id(), on_reader_thread()));
        Ok(())
    }

    fn takes_direct(&self) -> bool {
        self.direct_chunks > 0
    }

    fn direct_chunks(&self) -> usize {
        self.direct_chunks
    }

    fn copy_direct(&self, span: &DirectSpan<'_>) -> safetensors_core::Result<bool> {
        let n = self.offered.fetch_add(1, Ordering::SeqCst) + 1;
        if self.decline > 0 && n.is_multiple_of(self.decline) {
            return Ok(false);
        }
        let mut maps = Vec::new();
        for run in &span.runs {
            match run.file.mapped_data()? {
                Some(data) => maps.push(data[run.src as usize..][..run.len as usize].as_ptr()),
                None => return Ok(false), // not mapped: staged
            }
        }
        let mut pending = self.direct_pending.lock().unwrap();
        let mut at = span.start;
        for (run, src) in span.runs.iter().zip(maps) {
            if run.dst > at {
                pending.push(self.enqueue(0, (run.dst - at) as usize, at));
            }
            pending.push(self.enqueue(src as usize, run.len as usize, run.dst));
            at = run.dst + run.len;
        }
        if span.start + span.len > at {
            pending.push(self.enqueue(0, (span.start + span.len - at) as usize, at));
        }
        self.taken.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    fn finish_direct(&self) -> safetensors_core::Result<()> {
        for done in self.direct_pending.lock().unwrap().drain(..) {
            done.wait();
        }
        Ok(())
    }
}

/// A file of `tensors` U8 tensors of `each` bytes (plus one odd-sized one, so that padding
/// shows), opened with `backend`; its plan of every tensor and the bytes the plan produces.
fn model(
    dir: &Path,
    tensors: usize,
    each: usize,
    backend: Backend,
) -> (SafeFile, UploadPlan, Vec<u8>) {
    let data: Vec<Vec<u8>> = (0..=tensors)
        .map(|i| {
            let n = if i == tensors { 4099 } else { each };
            (0..n)
                .map(|j| (j as u8).wrapping_mul(13) ^ i as u8)
                .collect()
        })
        .collect();
    let names: Vec<String> = (0..=tensors).map(|i| format!("t{i:03}")).collect();
    let shapes: Vec<[usize; 1]> = data.iter().map(|d| [d.len()]).collect();
    let views: Vec<(&str, TensorView)> = names
        .iter()
        .zip(&data)
        .zip(&shapes)
        .map(|((n, d), s)| (n.as_str(), TensorView::new(Dtype::U8, s, d)))
        .collect();
    let path = dir.join("model.safetensors");
    serialize_to_file(views, None, &path).unwrap();
    let file = SafeFile::open(&path, backend).unwrap();
    let mut plan = UploadPlan::new(256);
    let mut expected = Vec::new();
    for name in file.header().sorted_names() {
        let p = plan.add_tensor(0, &file, name).unwrap().clone();
        expected.push((p.offset, file.tensor_bytes(name).unwrap().into_owned()));
    }
    let mut out = vec![0u8; plan.total() as usize];
    for (at, b) in expected {
        out[at as usize..at as usize + b.len()].copy_from_slice(&b);
    }
    (file, plan, out)
}

fn pipeline(stripe: usize, pace_ms_per_mib: u64) -> PipelineOptions {
    PipelineOptions {
        stripe_bytes: stripe,
        trace: true,
        min_fill_ns_per_mib: pace_ms_per_mib * 1_000_000,
    }
}

#[test]
fn stripes_land_every_byte_whatever_the_stripe_and_reader_count() {
    let dir = scratch_dir("pipeline_every_byte");
    for backend in [Backend::Mmap, Backend::Read] {
        let (file, plan, expected) = model(&dir, 12, 70_000, backend);
        let target = LinkTarget::new(plan.total(), 1000.0);
        for (stripe, readers, slots) in [
            (0, 3, 4),
            (4096, 1, 2),
            (8192, 4, 3),
            (12_288, 7, 5),
            (1 << 20, 2, 2),
        ] {
            let ring = Ring::lazy(RingOptions {
                slots,
                slot_bytes: 64 << 10,
                readers,
            })
            .with_pipeline(pipeline(stripe, 0));
            for _ in 0..2 {
                target.reset();
                ring.upload(&target, &[&file], &plan).unwrap();
                assert!(
                    target.bytes() == expected,
                    "stripe {stripe}, {readers} readers, {backend:?}"
                );
            }
            let trace = ring.take_trace().expect("traced");
            assert!(trace.chunks.iter().all(|c| c.claimed > 0
                && c.claimed <= c.ready
                && c.ready <= c.filled
                && c.filled <= c.submitted));
        }
    }
}

#[test]
fn a_slow_link_is_busy_from_its_first_copy_to_its_last() {
    // 4 readers, each filling 1 MiB in 20 ms at the fastest (paced: sleeping, so that the
    // tests running beside this one on two cores change little), together 0.2 GB/s; the link
    // carries 0.1 GB/s: the pipeline must never leave it idle between its first copy and its
    // last, and its first copy must start once one round of stripes is in (each reader one
    // 1 MiB stripe of the first 4 MiB chunk: ~20 ms), within two stripe-fill times.
    let dir = scratch_dir("pipeline_slow_link");
    let (file, plan, expected) = model(&dir, 16, 1 << 20, Backend::Mmap);
    let stripe_fill = Duration::from_millis(20);
    let ring = Ring::lazy(RingOptions {
        slots: 6,
        slot_bytes: 4 << 20,
        readers: 4,
    })
    .with_pipeline(pipeline(1 << 20, 20));
    let target = LinkTarget::new(plan.total(), 0.1);
    ring.upload(&target, &[&file], &plan).unwrap(); // threads started, pages warm
    target.reset();
    let t0 = target.link.origin.elapsed();
    ring.upload(&target, &[&file], &plan).unwrap();
    assert!(target.bytes() == expected);
    let spans = target.spans();
    let first = spans.iter().map(|s| s.0).min().unwrap();
    let last = spans.iter().map(|s| s.1).max().unwrap();
    let busy: Duration = spans.iter().map(|s| s.1 - s.0).sum();
    let utilisation = busy.as_secs_f64() / (last - first).as_secs_f64();
    assert!(
        utilisation >= 0.9,
        "the link was busy {utilisation:.3} of the time"
    );
    let lead_in = first - t0;
    assert!(
        lead_in <= 2 * stripe_fill,
        "the first copy started {lead_in:?} after the upload did: more than two stripe fills"
    );
    assert_eq!(spans.len(), plan.total().div_ceil(4 << 20) as usize);
}

#[test]
fn whole_chunks_one_reader_each_make_the_first_copy_wait_for_a_round_of_chunks() {
    // The schedule before stripes (stripe 0): the same upload's first copy waits until one
    // reader has filled a whole 4 MiB chunk alone, four stripe fills (80 ms); what
    // `a_slow_link_is_busy_from_its_first_copy_to_its_last` rules out.
    let dir = scratch_dir("pipeline_whole_chunks");
    let (file, plan, expected) = model(&dir, 16, 1 << 20, Backend::Mmap);
    let ring = Ring::lazy(RingOptions {
        slots: 6,
        slot_bytes: 4 << 20,
        readers: 4,
    })
    .with_pipeline(PipelineOptions {
        stripe_bytes: 0,
        trace: false,
        min_fill_ns_per_mib: 20_000_000,
    });
    let target = LinkTarget::new(plan.total(), 0.1);
    let t0 = target.link.origin.elapsed();
    ring.upload(&target, &[&file], &plan).unwrap();
    assert!(target.bytes() == expected);
    let first = target.spans().iter().map(|s| s.0).min().unwrap();
    assert!(first - t0 >= Duration::from_millis(60), "{:?}", first - t0);
}

#[test]
fn reader_threads_live_as_long_as_the_ring() {
    let dir = scratch_dir("pipeline_threads");
    let (file, plan, expected) = model(&dir, 8, 100_000, Backend::Read);
    let ring = Ring::lazy(RingOptions {
        slots: 4,
        slot_bytes: 64 << 10,
        readers: 3,
    })
    .with_pipeline(pipeline(16 << 10, 0));
    let target = LinkTarget::new(plan.total(), 1000.0);
    assert_eq!(ring.reader_threads(), 0, "none before the first run");
    ring.upload(&target, &[&file], &plan).unwrap();
    for _ in 0..5 {
        target.reset();
        ring.upload(&target, &[&file], &plan).unwrap();
        assert!(target.bytes() == expected);
    }
    assert_eq!(ring.reader_threads(), 3);
    let all: HashSet<_> = target.readers.lock().unwrap().clone();
    // Any of the ring's threads may take any reader's part of a run, but no other thread ever
    // runs one: six uploads, at most three threads.
    assert!(
        all.len() <= 3,
        "{} threads ran the readers of six uploads",
        all.len()
    );
    assert!(
        all.iter().all(|(_, ours)| *ours),
        "on the ring's own threads"
    );
    let caller = std::thread::current().id();
    assert!(all.iter().all(|(id, _)| *id != caller));
}

#[test]
fn zero_copy_spans_and_staged_chunks_share_the_queue_and_land_every_byte() {
    let dir = scratch_dir("pipeline_zero_copy");
    for (backend, decline, readers) in [
        (Backend::Mmap, 0, 3),
        (Backend::Mmap, 2, 3),
        (Backend::Mmap, 3, 1),
        (Backend::Read, 0, 2),
    ] {
        let (file, plan, expected) = model(&dir, 20, 50_000, backend);
        let mut target = LinkTarget::new(plan.total(), 1000.0);
        target.direct_chunks = 2;
        target.decline = decline;
        let ring = Ring::lazy(RingOptions {
            slots: 3,
            slot_bytes: 64 << 10,
            readers,
        })
        .with_pipeline(pipeline(16 << 10, 0));
        let stats = ring.upload(&target, &[&file], &plan).unwrap();
        assert!(
            target.bytes() == expected,
            "{backend:?}, declining every {decline}"
        );
        let taken = target.taken.load(Ordering::SeqCst);
        assert!(stats.zero_copy_chunks <= 2 * taken);
        match backend {
            Backend::Mmap => assert!(taken > 0, "the feeder took spans"),
            _ => assert_eq!(taken, 0, "a file that is not mapped is staged"),
        }
        let trace = ring.take_trace().unwrap();
        assert_eq!(trace.summary().zero_copy_chunks, stats.zero_copy_chunks);
        assert!(stats.zero_copy_chunks < stats.chunks || readers == 1 || decline == 0);
    }
}

#[test]
fn zero_copy_is_offered_only_to_uploads_that_wait_for_their_copies() {
    let dir = scratch_dir("pipeline_zero_copy_run");
    let (file, plan, expected) = model(&dir, 6, 50_000, Backend::Mmap);
    let mut target = LinkTarget::new(plan.total(), 1000.0);
    target.direct_chunks = 1;
    let ring = Ring::lazy(RingOptions {
        slots: 2,
        slot_bytes: 64 << 10,
        readers: 2,
    });
    // `run` returns before its copies are done; the caller may drop the file meanwhile.
    let stats = ring.run(&target, &[&file], &plan).unwrap();
    ring.wait_all(&target).unwrap();
    assert_eq!(stats.zero_copy_chunks, 0);
    assert_eq!(target.offered.load(Ordering::SeqCst), 0);
    assert!(target.bytes() == expected);
}

#[test]
fn an_error_alongside_the_readers_stops_them_and_is_the_one_returned() {
    let dir = scratch_dir("pipeline_alongside");
    let (file, plan, expected) = model(&dir, 16, 1 << 20, Backend::Mmap);
    let ring = Ring::lazy(RingOptions {
        slots: 2,
        slot_bytes: 1 << 20,
        readers: 2,
    })
    .with_pipeline(pipeline(256 << 10, 1));
    let target = LinkTarget::new(plan.total(), 1000.0);
    without_hanging("an upload whose allocation fails", move || {
        let e = ring
            .upload_while(&target, &[&file], &plan, &mut || {
                std::thread::sleep(Duration::from_millis(3));
                Err(safetensors_core::Error::Cuda {
                    message: "no room for the destination".into(),
                })
            })
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cuda);
        assert!(e.to_string().contains("no room"), "{e}");
        drop(expected);
    });
}
