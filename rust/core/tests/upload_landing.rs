//! Streaming delivery (`Ring::stream`) against a copy stream in host memory whose copies run late:
//! each tensor is handed over once, in plan order, only after every copy covering it; a scratch
//! ring never outgrows its bound and a region is overwritten only after the consumer released
//! it; failures anywhere end the upload with every copy and release waited for.

mod common;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::hang::without_hanging;
use common::scratch_dir;
use safetensors_core::upload::landing::{DeliverWhen, LandingTarget, StreamLayout};
use safetensors_core::upload::{Ring, RingOptions, UploadPlan, UploadTarget};
use safetensors_core::{
    serialize_to_file, Backend, Dtype, Error, ErrorKind, Indexer, SafeFile, TensorView,
};

/// Device memory and one in-order copy stream in host memory. `submit` only queues a copy,
/// which reads its staging buffer when it runs; copies run when someone waits for them (their
/// slot, or a mark after them), so a pipeline that refilled a slot or delivered a tensor too
/// early would see the wrong bytes.
struct Device {
    bytes: Vec<u8>,
    queue: VecDeque<QueuedCopy>,
    /// Copies queued and run so far (sequence numbers from 1).
    queued: u64,
    ran: u64,
    /// Consumer work (see `Mark::Consumer`), run in order when its release mark is waited for.
    consumer: VecDeque<ConsumerJob>,
    consumer_queued: u64,
    consumer_ran: u64,
    /// What each consumer job read, by tensor.
    consumed: Vec<Option<Vec<u8>>>,
}

struct QueuedCopy {
    seq: u64,
    src: *const u8,
    len: usize,
    at: usize,
}

// SAFETY: `src` points into a staging buffer that the ring leaves untouched until the copy ran
// (it waits for the slot first, which the test target checks).
unsafe impl Send for QueuedCopy {}

/// A consumer's work on a delivered tensor: once the copies before `after` ran, read `len`
/// device bytes at `at`.
struct ConsumerJob {
    after: u64,
    tensor: usize,
    at: usize,
    len: usize,
}

impl Device {
    fn run_copies_to(&mut self, seq: u64) {
        while self.ran < seq {
            let c = self.queue.pop_front().expect("a copy to run");
            // SAFETY: see `QueuedCopy`.
            let src = unsafe { std::slice::from_raw_parts(c.src, c.len) };
            self.bytes[c.at..c.at + c.len].copy_from_slice(src);
            self.ran = c.seq;
        }
    }

    fn run_consumer_to(&mut self, id: u64) {
        while self.consumer_ran < id {
            let job = self.consumer.pop_front().expect("consumer work to run");
            self.run_copies_to(job.after);
            self.consumed[job.tensor] = Some(self.bytes[job.at..job.at + job.len].to_vec());
            self.consumer_ran += 1;
        }
    }
}

#[derive(Debug)]
enum Mark {
    /// After the copies queued so far.
    Copies(u64),
    /// After the consumer work queued so far.
    Consumer(u64),
}

struct LateTarget {
    device: Arc<Mutex<Device>>,
    submits: AtomicUsize,
    marks: AtomicUsize,
    fail_submit_at: Option<usize>,
    fail_mark_at: Option<usize>,
    jitter: bool,
    /// The first copy to this device offset is queued only after this pause.
    slow_copy_to: Mutex<Option<(u64, Duration)>>,
    live_slots: Arc<AtomicUsize>,
    live_marks: AtomicUsize,
}

struct LateSlot {
    buf: Box<[u8]>,
    /// The slot's last copy.
    seq: u64,
    device: Arc<Mutex<Device>>,
    live: Arc<AtomicUsize>,
}

impl Drop for LateSlot {
    fn drop(&mut self) {
        // Not while a failed assertion unwinds (a second panic would abort the test run).
        let ran = self.device.lock().map_or(u64::MAX, |d| d.ran);
        assert!(
            std::thread::panicking() || ran >= self.seq,
            "a staging buffer was freed with its copy pending"
        );
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LateTarget {
    fn new(device_bytes: u64, tensors: usize) -> LateTarget {
        LateTarget {
            device: Arc::new(Mutex::new(Device {
                bytes: vec![0xAB; device_bytes as usize],
                queue: VecDeque::new(),
                queued: 0,
                ran: 0,
                consumer: VecDeque::new(),
                consumer_queued: 0,
                consumer_ran: 0,
                consumed: vec![None; tensors],
            })),
            submits: AtomicUsize::new(0),
            marks: AtomicUsize::new(0),
            fail_submit_at: None,
            fail_mark_at: None,
            jitter: false,
            slow_copy_to: Mutex::new(None),
            live_slots: Arc::new(AtomicUsize::new(0)),
            live_marks: AtomicUsize::new(0),
        }
    }

    /// Queues consumer work on `tensor` (at `at`, `len` bytes, ordered after `landing`) and
    /// returns the release mark that completes with it.
    fn consume(&self, landing: &Mark, tensor: usize, at: u64, len: u64) -> Mark {
        let Mark::Copies(after) = *landing else {
            panic!("a landing mark marks copies")
        };
        let mut d = self.device.lock().unwrap();
        d.consumer.push_back(ConsumerJob {
            after,
            tensor,
            at: at as usize,
            len: len as usize,
        });
        d.consumer_queued += 1;
        self.live_marks.fetch_add(1, Ordering::SeqCst);
        Mark::Consumer(d.consumer_queued)
    }

    /// Device bytes `[at, at + len)` once the copies before `mark` ran (a stream wait, then a
    /// read).
    fn read_after(&self, mark: &Mark, at: u64, len: u64) -> Vec<u8> {
        let Mark::Copies(after) = *mark else {
            panic!("a landing mark marks copies")
        };
        let mut d = self.device.lock().unwrap();
        d.run_copies_to(after);
        d.bytes[at as usize..(at + len) as usize].to_vec()
    }

    fn read_now(&self, at: u64, len: u64) -> Vec<u8> {
        self.device.lock().unwrap().bytes[at as usize..(at + len) as usize].to_vec()
    }
}

fn injected(what: &str, n: usize) -> Error {
    Error::Cuda {
        message: format!("injected failure at {what} {n}"),
    }
}

impl UploadTarget for LateTarget {
    type Slot = LateSlot;

    fn new_slot(&self, bytes: usize) -> safetensors_core::Result<LateSlot> {
        self.live_slots.fetch_add(1, Ordering::SeqCst);
        Ok(LateSlot {
            buf: vec![0xCD; bytes].into_boxed_slice(),
            seq: 0,
            device: self.device.clone(),
            live: self.live_slots.clone(),
        })
    }

    fn buffer<'s>(&self, slot: &'s mut LateSlot) -> &'s mut [u8] {
        assert!(
            self.device.lock().unwrap().ran >= slot.seq,
            "a staging buffer was refilled before its copy ran"
        );
        &mut slot.buf
    }

    fn submit(&self, slot: &mut LateSlot, len: usize, dst: u64) -> safetensors_core::Result<()> {
        let n = self.submits.fetch_add(1, Ordering::SeqCst);
        if Some(n) == self.fail_submit_at {
            return Err(injected("copy", n));
        }
        if self.jitter {
            // Before queueing: readers then enqueue their chunks out of order.
            std::thread::sleep(Duration::from_micros((n as u64 * 7919) % 300));
        }
        let pause = {
            let mut slow = self.slow_copy_to.lock().unwrap();
            match *slow {
                Some((at, pause)) if at == dst => slow.take().map(|_| pause),
                _ => None,
            }
        };
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
        let mut d = self.device.lock().unwrap();
        assert!(
            dst as usize + len <= d.bytes.len(),
            "a copy past the device memory"
        );
        d.queued += 1;
        let seq = d.queued;
        d.queue.push_back(QueuedCopy {
            seq,
            src: slot.buf.as_ptr(),
            len,
            at: dst as usize,
        });
        slot.seq = seq;
        Ok(())
    }

    fn wait(&self, slot: &mut LateSlot) -> safetensors_core::Result<()> {
        self.device.lock().unwrap().run_copies_to(slot.seq);
        Ok(())
    }
}

impl LandingTarget for LateTarget {
    type Mark = Mark;

    fn mark(&self) -> safetensors_core::Result<Mark> {
        let n = self.marks.fetch_add(1, Ordering::SeqCst);
        if Some(n) == self.fail_mark_at {
            return Err(injected("mark", n));
        }
        self.live_marks.fetch_add(1, Ordering::SeqCst);
        Ok(Mark::Copies(self.device.lock().unwrap().queued))
    }

    fn wait_mark(&self, mark: &Mark) -> safetensors_core::Result<()> {
        let mut d = self.device.lock().unwrap();
        match *mark {
            Mark::Copies(seq) => d.run_copies_to(seq),
            Mark::Consumer(id) => d.run_consumer_to(id),
        }
        Ok(())
    }

    fn recycle(&self, _: Mark) {
        self.live_marks.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A file of `n` tensors of 0 to 300 bytes in assorted dtypes, plus three of 9-20 KiB that span
/// several 4 KiB chunks.
fn many_tensors(dir: &Path, n: usize) -> SafeFile {
    let mut specs: Vec<(String, Dtype, Vec<usize>)> = (0..n)
        .map(|i| {
            let d = [Dtype::U8, Dtype::F32, Dtype::BF16][i % 3];
            (format!("t{i:05}"), d, vec![(i * 37) % 101, 1 + i % 3])
        })
        .collect();
    for (i, len) in [9000usize, 20000, 12345].into_iter().enumerate() {
        specs.push((format!("big{i}"), Dtype::U8, vec![len]));
    }
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| {
            let len = d.byte_size(s.iter().product()).unwrap();
            (0..len)
                .map(|j| (j as u8).wrapping_mul(13).wrapping_add(i as u8))
                .collect()
        })
        .collect();
    let views: Vec<(&str, TensorView)> = specs
        .iter()
        .zip(&data)
        .map(|((name, d, s), b)| (name.as_str(), TensorView::new(*d, s, b)))
        .collect();
    let path = dir.join("many.safetensors");
    serialize_to_file(views, None, &path).unwrap();
    SafeFile::open(&path, Backend::Read).unwrap()
}

/// Every tensor of `file` in sorted order, then two slices, and each one's expected bytes.
fn plan_with_slices(file: &SafeFile) -> (UploadPlan, Vec<Vec<u8>>) {
    let mut plan = UploadPlan::new(256);
    let mut expected = Vec::new();
    for name in file.header().sorted_names() {
        plan.add_tensor(0, file, name).unwrap();
        expected.push(file.tensor_bytes(name).unwrap().into_owned());
    }
    for (name, sel) in [
        ("big1", [Indexer::range(100, 9000)]),
        ("t00010", [Indexer::range(1, 3)]),
    ] {
        plan.add_slice(0, file, name, &sel).unwrap();
        let sp = file.plan_slice(name, &sel).unwrap();
        let mut bytes = vec![0u8; sp.byte_len()];
        file.read_slice(name, &sp, &mut bytes).unwrap();
        expected.push(bytes);
    }
    (plan, expected)
}

fn small_ring(slots: usize, readers: usize) -> Ring<LateSlot> {
    Ring::lazy(RingOptions {
        slots,
        slot_bytes: 4096,
        readers,
    })
}

#[test]
fn every_tensor_is_handed_over_once_in_plan_order_after_its_copies() {
    let dir = scratch_dir("landing_every_tensor");
    let file = many_tensors(&dir, 2000);
    let (plan, expected) = plan_with_slices(&file);
    assert!(plan.total() > 60 * 4096, "chunks must hold several tensors");
    for (readers, when) in [
        (1, DeliverWhen::Landed),
        (4, DeliverWhen::Landed),
        (8, DeliverWhen::Submitted),
        (3, DeliverWhen::Submitted),
    ] {
        let layout = StreamLayout::destination(&plan, 4096);
        let target = LateTarget {
            jitter: readers == 4,
            ..LateTarget::new(layout.device_bytes(), plan.placements().len())
        };
        let ring = small_ring(readers + 2, readers);
        let mut next = 0usize;
        ring.stream(&target, &[&file], &layout, when, &mut |landing| {
            for i in landing.tensors.clone() {
                assert_eq!(i, next, "out of order");
                next += 1;
                let (at, len) = (landing.offset(i), expected[i].len() as u64);
                assert_eq!(at, plan.placements()[i].offset);
                let got = match when {
                    // Landed: the bytes are there now, without waiting for anything.
                    DeliverWhen::Landed => target.read_now(at, len),
                    // Submitted: they are there once the copies before the mark ran.
                    DeliverWhen::Submitted => target.read_after(landing.mark, at, len),
                };
                assert!(
                    got == expected[i],
                    "tensor {i}: wrong bytes when handed over"
                );
            }
            Ok(None)
        })
        .unwrap();
        assert_eq!(next, expected.len(), "readers {readers}: not every tensor");
        let d = target.device.lock().unwrap();
        assert_eq!(d.ran, d.queued, "copies left pending on return");
        assert_eq!(target.live_marks.load(Ordering::SeqCst), 0, "marks leaked");
    }
}

/// Streams `plan` through a scratch ring of `scratch` bytes whose consumer reads each tensor
/// late (once its release mark is waited for), and checks what it read.
fn stream_through_scratch(
    file: &SafeFile,
    plan: &UploadPlan,
    expected: &[Vec<u8>],
    scratch: u64,
    readers: usize,
    when: DeliverWhen,
) {
    let layout = StreamLayout::scratch(plan, scratch, 4096).unwrap();
    let largest = expected.iter().map(Vec::len).max().unwrap() as u64;
    assert!(layout.device_bytes() >= scratch.max(largest));
    assert!(layout.device_bytes() < scratch.max(largest) + layout.chunk());
    assert_eq!(layout.device_bytes() % layout.chunk(), 0);
    // The target's device memory is exactly the ring: a copy past it panics.
    let target = LateTarget {
        jitter: readers > 2,
        ..LateTarget::new(layout.device_bytes(), expected.len())
    };
    let ring = small_ring(readers + 1, readers);
    let mut delivered = 0usize;
    ring.stream(&target, &[file], &layout, when, &mut |landing| {
        let mut release = None;
        for i in landing.tensors.clone() {
            let (at, len) = (landing.offset(i), expected[i].len() as u64);
            assert!(at + len <= layout.device_bytes());
            assert_eq!(at % 256, 0, "a tensor off the alignment");
            if let Some(old) = release.replace(target.consume(landing.mark, i, at, len)) {
                target.recycle(old); // the last job's mark stands for every earlier one
            }
            delivered += 1;
        }
        Ok(release)
    })
    .unwrap();
    assert_eq!(delivered, expected.len());
    let d = target.device.lock().unwrap();
    assert_eq!(d.consumer_ran, d.consumer_queued, "releases not waited for");
    for (i, want) in expected.iter().enumerate() {
        let got = d.consumed[i].as_ref().expect("consumed");
        assert!(
            got == want,
            "scratch {scratch}, readers {readers}, {when:?}: tensor {i} was overwritten before \
             its consumer read it"
        );
    }
    drop(d);
    assert_eq!(target.live_marks.load(Ordering::SeqCst), 0, "marks leaked");
}

#[test]
fn a_scratch_ring_reuses_a_region_only_once_its_consumer_released_it() {
    let dir = scratch_dir("landing_scratch");
    let file = Arc::new(many_tensors(&dir, 2000));
    let (plan, expected) = plan_with_slices(&file);
    without_hanging("scratch rings", move || {
        // Smaller than the largest tensor (20000 bytes: the ring grows to it), a few chunks, and
        // not a multiple of anything.
        for (scratch, readers, when) in [
            (1u64, 1, DeliverWhen::Landed),
            (16 << 10, 4, DeliverWhen::Submitted),
            (24 << 10, 8, DeliverWhen::Landed),
            (50_001, 3, DeliverWhen::Submitted),
        ] {
            stream_through_scratch(&file, &plan, &expected, scratch, readers, when);
        }
    });
}

#[test]
fn a_scratch_ring_refuses_an_alignment_larger_than_a_staging_slot() {
    let dir = scratch_dir("landing_scratch_alignment");
    let file = many_tensors(&dir, 5);
    let mut plan = UploadPlan::new(8192);
    for name in file.header().sorted_names() {
        plan.add_tensor(0, &file, name).unwrap();
    }
    let err = StreamLayout::scratch(&plan, 1 << 20, 4096).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Cuda);
    assert!(err.to_string().contains("alignment"), "{err}");
    assert!(StreamLayout::scratch(&plan, 1 << 20, 8192).is_ok());
}

#[test]
fn a_synchronous_consumer_releases_its_region_on_return() {
    let dir = scratch_dir("landing_scratch_sync");
    let file = many_tensors(&dir, 500);
    let (plan, expected) = plan_with_slices(&file);
    let layout = StreamLayout::scratch(&plan, 8192, 4096).unwrap();
    assert_eq!(
        layout.device_bytes(),
        20480,
        "the largest tensor, in whole chunks"
    );
    let target = LateTarget::new(layout.device_bytes(), expected.len());
    let ring = small_ring(3, 3);
    let mut delivered = 0;
    ring.stream(
        &target,
        &[&file],
        &layout,
        DeliverWhen::Landed,
        &mut |landing| {
            for i in landing.tensors.clone() {
                let got = target.read_now(landing.offset(i), expected[i].len() as u64);
                assert!(got == expected[i], "tensor {i}");
                delivered += 1;
            }
            Ok(None)
        },
    )
    .unwrap();
    assert_eq!(delivered, expected.len());
}

#[test]
fn a_late_chunk_of_one_lap_never_lands_over_the_next_lap() {
    // Scratch ring of 5 chunks: big0 [0, 9000) fills lap 0 with padding up to 20480, big1 (20000
    // bytes) fills lap 1. Lap 0's last chunk (padding at 16384) is queued late; once big0 is
    // released, lap 1's chunks may go ahead, but the one at 16384 must not be queued before
    // it, or the late padding lands over big1's tail.
    let dir = scratch_dir("landing_late_lap");
    let file = many_tensors(&dir, 50);
    let (plan, expected) = plan_with_slices(&file);
    let layout = StreamLayout::scratch(&plan, 8192, 4096).unwrap();
    assert_eq!(
        (layout.offset(0), layout.offset(1)),
        (0, 0),
        "big0 and big1 at the ring's start"
    );
    let target = LateTarget {
        slow_copy_to: Mutex::new(Some((16384, Duration::from_millis(30)))),
        ..LateTarget::new(layout.device_bytes(), expected.len())
    };
    let ring = small_ring(3, 3);
    ring.stream(
        &target,
        &[&file],
        &layout,
        DeliverWhen::Landed,
        &mut |landing| {
            for i in landing.tensors.clone() {
                let got = target.read_now(landing.offset(i), expected[i].len() as u64);
                assert!(
                    got == expected[i],
                    "tensor {i} was overwritten by an earlier lap"
                );
            }
            Ok(None)
        },
    )
    .unwrap();
}

#[test]
fn a_failed_delivery_stops_the_upload_and_waits_for_every_copy_and_release() {
    let dir = scratch_dir("landing_delivery_fails");
    let file = many_tensors(&dir, 600);
    let (plan, expected) = plan_with_slices(&file);
    for scratch in [None, Some(12u64 << 10)] {
        for stop_at in [0usize, 7, 300] {
            let layout = match scratch {
                Some(b) => StreamLayout::scratch(&plan, b, 4096).unwrap(),
                None => StreamLayout::destination(&plan, 4096),
            };
            let target = LateTarget::new(layout.device_bytes(), expected.len());
            let ring = small_ring(4, 4);
            let mut calls = 0;
            let err = ring
                .stream(
                    &target,
                    &[&file],
                    &layout,
                    DeliverWhen::Submitted,
                    &mut |l| {
                        calls += 1;
                        if l.tensors.contains(&stop_at) {
                            return Err(Error::Io {
                                path: "callback".into(),
                                op: "consume",
                                source: std::io::Error::other("stop here").into(),
                            });
                        }
                        let i = l.tensors.end - 1;
                        let len = expected[i].len() as u64;
                        Ok(Some(target.consume(l.mark, i, l.offset(i), len)))
                    },
                )
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Io);
            assert!(err.to_string().contains("stop here"), "{err}");
            let d = target.device.lock().unwrap();
            assert_eq!(
                d.ran, d.queued,
                "copies left pending after a failed delivery"
            );
            assert_eq!(d.consumer_ran, d.consumer_queued, "releases not waited for");
            drop(d);
            assert_eq!(target.live_marks.load(Ordering::SeqCst), 0, "marks leaked");
            // The ring runs the next upload as if nothing happened.
            let mut n = 0;
            ring.stream(&target, &[&file], &layout, DeliverWhen::Landed, &mut |l| {
                for i in l.tensors.clone() {
                    let got = target.read_now(l.offset(i), expected[i].len() as u64);
                    assert!(got == expected[i], "tensor {i} after a failed upload");
                    n += 1;
                }
                Ok(None)
            })
            .unwrap();
            assert_eq!(n, expected.len());
            assert!(calls > 0);
            drop(ring);
            assert_eq!(target.live_slots.load(Ordering::SeqCst), 0, "slots leaked");
        }
    }
}

#[test]
fn a_failed_copy_or_mark_ends_the_stream_with_its_error() {
    let dir = scratch_dir("landing_reader_fails");
    let file = Arc::new(many_tensors(&dir, 400));
    let (plan, expected) = plan_with_slices(&file);
    let (plan, expected) = (Arc::new(plan), Arc::new(expected));
    without_hanging("failures mid-stream", move || {
        for i in 0..60 {
            let layout = if i % 2 == 0 {
                StreamLayout::destination(&plan, 4096)
            } else {
                StreamLayout::scratch(&plan, 20480, 4096).unwrap()
            };
            let mut target = LateTarget::new(layout.device_bytes(), expected.len());
            let (what, n) = if i % 3 == 0 {
                target.fail_submit_at = Some(i % 17);
                ("copy", i % 17)
            } else {
                // Marks are made per group of tensors completed together: how many depends on
                // how the readers race, so a failure that did not fire is checked as a success.
                target.fail_mark_at = Some(i % 13);
                ("mark", i % 13)
            };
            let ring = small_ring(3, 1 + i % 8);
            let result = ring.stream(&target, &[&file], &layout, DeliverWhen::Landed, &mut |l| {
                let i = l.tensors.end - 1;
                let len = expected[i].len() as u64;
                Ok(Some(target.consume(l.mark, i, l.offset(i), len)))
            });
            let made = match what {
                "copy" => target.submits.load(Ordering::SeqCst),
                _ => target.marks.load(Ordering::SeqCst),
            };
            match result {
                Err(err) => assert!(
                    err.to_string()
                        .contains(&format!("injected failure at {what} {n}")),
                    "{err}"
                ),
                Ok(_) => assert!(
                    made <= n,
                    "the {what} failure at {n} of {made} did not stop it"
                ),
            }
            let d = target.device.lock().unwrap();
            assert_eq!(d.ran, d.queued, "copies left pending");
            assert_eq!(d.consumer_ran, d.consumer_queued, "releases not waited for");
        }
    });
}

#[test]
fn tensors_without_bytes_are_handed_over_too() {
    let dir = scratch_dir("landing_empty");
    let path = dir.join("empty.safetensors");
    let none: [u8; 0] = [];
    let some = [7u8; 5];
    serialize_to_file(
        [
            ("a", TensorView::new(Dtype::F32, &[0, 4], &none)),
            ("b", TensorView::new(Dtype::U8, &[5], &some)),
            ("c", TensorView::new(Dtype::U8, &[0], &none)),
        ],
        None,
        &path,
    )
    .unwrap();
    let file = SafeFile::open(&path, Backend::Mmap).unwrap();
    for names in [vec!["a", "b", "c"], vec!["a", "c"], vec![]] {
        let mut plan = UploadPlan::new(256);
        for n in &names {
            plan.add_tensor(0, &file, n).unwrap();
        }
        for layout in [
            StreamLayout::destination(&plan, 4096),
            StreamLayout::scratch(&plan, 0, 4096).unwrap(),
        ] {
            let target = LateTarget::new(layout.device_bytes(), names.len());
            let ring = small_ring(2, 2);
            let mut seen = Vec::new();
            ring.stream(&target, &[&file], &layout, DeliverWhen::Landed, &mut |l| {
                seen.extend(l.tensors.clone());
                Ok(None)
            })
            .unwrap();
            assert_eq!(seen, (0..names.len()).collect::<Vec<_>>(), "{names:?}");
        }
    }
}

#[test]
fn a_scratch_layout_too_large_for_64_bits_is_an_error() {
    let plan = UploadPlan::new(256);
    let err = StreamLayout::scratch(&plan, u64::MAX - 5, 4096).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cuda);
}
