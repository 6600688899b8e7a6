//! The staged upload pipeline against a destination in host memory: every byte must land at the
//! offset the plan gives it, whatever the ring size, chunk size, reader count and timing.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::hang::without_hanging;
use common::scratch_dir;
use safetensors_core::upload::{Ring, RingOptions, UploadPlan, UploadTarget};
use safetensors_core::{
    serialize_to_file, Backend, Dtype, ErrorKind, Indexer, SafeFile, TensorView,
};

/// A destination in host memory whose copies happen late: `submit` only records the copy (and
/// its destination), and `wait` performs it from the slot as it is then. A pipeline that
/// refilled a slot before waiting for its copy would therefore upload the wrong bytes.
struct HostTarget {
    dst: Dst,
    submits: AtomicUsize,
    fail_at: Option<usize>,
    /// The n-th call of `wait` that has a copy to do fails (and leaves the copy pending).
    fail_wait_at: Option<usize>,
    waits: AtomicUsize,
    jitter: bool,
    /// Slots alive (allocated and not yet dropped), shared with every slot.
    live: Arc<AtomicUsize>,
}

/// A destination's bytes, shared with the slots whose copies into it are pending.
type Dst = Arc<Mutex<Vec<u8>>>;

struct HostSlot {
    buf: Vec<u8>,
    pending: Option<(Dst, usize, u64)>,
    live: Arc<AtomicUsize>,
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        assert!(
            self.pending.is_none(),
            "a slot was freed with its copy pending"
        );
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl HostTarget {
    fn new(len: u64) -> HostTarget {
        HostTarget {
            dst: Arc::new(Mutex::new(vec![0xAB; len as usize])),
            submits: AtomicUsize::new(0),
            fail_at: None,
            fail_wait_at: None,
            waits: AtomicUsize::new(0),
            jitter: false,
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.dst.lock().unwrap().clone()
    }
}

impl UploadTarget for HostTarget {
    type Slot = HostSlot;

    fn new_slot(&self, bytes: usize) -> safetensors_core::Result<HostSlot> {
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(HostSlot {
            buf: vec![0xCD; bytes],
            pending: None,
            live: self.live.clone(),
        })
    }

    fn buffer<'s>(&self, slot: &'s mut HostSlot) -> &'s mut [u8] {
        &mut slot.buf
    }

    fn submit(
        &self,
        slot: &mut HostSlot,
        len: usize,
        dst_offset: u64,
    ) -> safetensors_core::Result<()> {
        let n = self.submits.fetch_add(1, Ordering::SeqCst);
        if Some(n) == self.fail_at {
            return Err(safetensors_core::Error::Cuda {
                message: format!("injected failure at copy {n}"),
            });
        }
        assert!(
            slot.pending.is_none(),
            "a slot was submitted twice without a wait"
        );
        slot.pending = Some((self.dst.clone(), len, dst_offset));
        if self.jitter {
            std::thread::sleep(Duration::from_micros((n as u64 * 7919) % 300));
        }
        Ok(())
    }

    fn wait(&self, slot: &mut HostSlot) -> safetensors_core::Result<()> {
        if slot.pending.is_some() {
            let n = self.waits.fetch_add(1, Ordering::SeqCst);
            if Some(n) == self.fail_wait_at {
                return Err(safetensors_core::Error::Cuda {
                    message: format!("injected failure at wait {n}"),
                });
            }
        }
        if let Some((dst, len, at)) = slot.pending.take() {
            let mut dst = dst.lock().unwrap();
            dst[at as usize..at as usize + len].copy_from_slice(&slot.buf[..len]);
        }
        Ok(())
    }
}

/// Two files of tensors of assorted sizes and dtypes (odd sizes, so alignment padding shows).
fn files(dir: &Path) -> Vec<SafeFile> {
    let mut out = Vec::new();
    for f in 0..2u8 {
        let specs: Vec<(String, Dtype, Vec<usize>)> = (0..9)
            .map(|i| {
                let d = [Dtype::F32, Dtype::U8, Dtype::BF16, Dtype::F64][i % 4];
                (format!("t{i}"), d, vec![3 + i * 5, 7 + f as usize])
            })
            .collect();
        let data: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(i, (_, d, s))| {
                let n = d.byte_size(s.iter().product()).unwrap();
                (0..n)
                    .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8 ^ (f * 101)))
                    .collect()
            })
            .collect();
        let views: Vec<(&str, TensorView)> = specs
            .iter()
            .zip(&data)
            .map(|((n, d, s), b)| (n.as_str(), TensorView::new(*d, s, b)))
            .collect();
        let path = dir.join(format!("f{f}.safetensors"));
        serialize_to_file(views, None, &path).unwrap();
        out.push(
            SafeFile::open(&path, if f == 0 { Backend::Mmap } else { Backend::Read }).unwrap(),
        );
    }
    out
}

/// A plan of every tensor of both files plus two slices, and the bytes it must produce.
fn plan_and_expected(files: &[SafeFile], alignment: usize) -> (UploadPlan, Vec<u8>) {
    let mut plan = UploadPlan::new(alignment);
    let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();
    for (source, f) in files.iter().enumerate() {
        for name in f.header().sorted_names() {
            let p = plan.add_tensor(source, f, name).unwrap().clone();
            expected.push((p.offset, f.tensor_bytes(name).unwrap().into_owned()));
        }
    }
    let slice = [
        Indexer::range(1, 4),
        Indexer::Range {
            start: Some(0),
            stop: None,
            step: 2,
        },
    ];
    let p = plan.add_slice(1, &files[1], "t7", &slice).unwrap().clone();
    let sp = files[1].plan_slice("t7", &slice).unwrap();
    let mut bytes = vec![0u8; sp.byte_len()];
    files[1].read_slice("t7", &sp, &mut bytes).unwrap();
    assert_eq!(p.shape, sp.shape());
    expected.push((p.offset, bytes));
    let mut out = vec![0u8; plan.total() as usize];
    for (at, b) in expected {
        out[at as usize..at as usize + b.len()].copy_from_slice(&b);
    }
    (plan, out)
}

#[test]
fn every_byte_lands_at_its_planned_offset() {
    let dir = scratch_dir("upload_every_byte");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    for (slots, slot_bytes, readers, alignment) in [
        (4, 4096, 4, 256),
        (2, 4096, 1, 1),
        (3, 5000, 2, 64),
        (1, 4096, 3, 256),
        (4, 1 << 20, 4, 256),
    ] {
        let (plan, expected) = plan_and_expected(&files, alignment);
        for p in plan.placements() {
            assert_eq!(p.offset % alignment as u64, 0, "{p:?}");
        }
        let target = HostTarget {
            jitter: true,
            ..HostTarget::new(plan.total())
        };
        let ring = Ring::new(
            &target,
            RingOptions {
                slots,
                slot_bytes,
                readers,
            },
        )
        .unwrap();
        assert_eq!(ring.staging_bytes(), slots * slot_bytes.max(4096));
        let stats = ring.run(&target, &refs, &plan).unwrap();
        ring.wait_all(&target).unwrap();
        assert_eq!(stats.bytes, plan.total());
        let got = target.bytes();
        assert!(
            got == expected,
            "slots {slots}, slot {slot_bytes}, readers {readers}: bytes differ"
        );
        assert_eq!(target.submits.load(Ordering::SeqCst), stats.chunks);
    }
}

#[test]
fn a_ring_is_reusable_across_uploads() {
    let dir = scratch_dir("upload_reuse");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    let (plan, expected) = plan_and_expected(&files, 256);
    let target = HostTarget::new(plan.total());
    let ring = Ring::new(
        &target,
        RingOptions {
            slots: 3,
            slot_bytes: 4096,
            readers: 2,
        },
    )
    .unwrap();
    for _ in 0..3 {
        target.dst.lock().unwrap().fill(0x11);
        ring.run(&target, &refs, &plan).unwrap();
        ring.wait_all(&target).unwrap();
        assert!(*target.dst.lock().unwrap() == expected);
    }
}

#[test]
fn careless_ring_sizes_are_clamped_not_an_abort() {
    // usize::MAX slots or readers would be an allocation (or thread count) that aborts the
    // process; they are clamped, and the upload still lands every byte.
    let dir = scratch_dir("upload_careless_sizes");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    let (plan, expected) = plan_and_expected(&files, 256);
    let target = HostTarget::new(plan.total());
    let ring = Ring::lazy(RingOptions {
        slots: usize::MAX,
        slot_bytes: 4096,
        readers: usize::MAX,
    });
    ring.run(&target, &refs, &plan).unwrap();
    ring.wait_all(&target).unwrap();
    assert!(*target.dst.lock().unwrap() == expected);
    assert!(ring.staging_bytes() <= safetensors_core::upload::MAX_SLOTS * 4096);
}

#[test]
fn a_failed_copy_stops_the_upload_with_its_error() {
    let dir = scratch_dir("upload_failure");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    let (plan, _) = plan_and_expected(&files, 256);
    for readers in [1, 4] {
        let target = HostTarget {
            fail_at: Some(3),
            ..HostTarget::new(plan.total())
        };
        let ring = Ring::new(
            &target,
            RingOptions {
                slots: 2,
                slot_bytes: 4096,
                readers,
            },
        )
        .unwrap();
        let err = ring.upload(&target, &refs, &plan).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cuda);
        assert!(err.to_string().contains("injected failure"), "{err}");
    }
}

#[test]
fn a_file_that_shrinks_mid_upload_is_an_io_error() {
    let dir = scratch_dir("upload_shrinks");
    let files = files(&dir);
    let (plan, _) = plan_and_expected(&files, 256);
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("f1.safetensors"))
        .unwrap()
        .set_len(100)
        .unwrap();
    let target = HostTarget::new(plan.total());
    let ring = Ring::new(
        &target,
        RingOptions {
            slots: 2,
            slot_bytes: 4096,
            readers: 2,
        },
    )
    .unwrap();
    let refs: Vec<&SafeFile> = files.iter().collect();
    assert_eq!(
        ring.upload(&target, &refs, &plan).unwrap_err().kind(),
        ErrorKind::Io
    );
}

#[test]
fn plans_refuse_unknown_tensors_and_bad_slices() {
    let dir = scratch_dir("upload_plan_errors");
    let files = files(&dir);
    let mut plan = UploadPlan::new(256);
    assert_eq!(
        plan.add_tensor(0, &files[0], "nope").unwrap_err().kind(),
        ErrorKind::TensorNotFound
    );
    let err = plan
        .add_slice(0, &files[0], "t1", &[Indexer::Select(99)])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidSlice);
    assert_eq!(plan.total(), 0);
    assert!(plan.placements().is_empty());
}

#[test]
fn a_plan_run_on_fewer_files_than_it_reads_is_an_internal_error() {
    let dir = scratch_dir("upload_missing_source");
    let files = files(&dir);
    let mut plan = UploadPlan::new(256);
    plan.add_tensor(1, &files[1], "t1").unwrap();
    let target = HostTarget::new(plan.total());
    let ring = Ring::lazy(RingOptions::default());
    let err = ring.upload(&target, &[&files[0]], &plan).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.to_string().contains("reads source 1"), "{err}");
}

#[test]
fn staging_memory_stays_bounded_by_the_ring() {
    // A plan far larger than the ring uploads through the same few staging buffers.
    let dir = scratch_dir("upload_bounded");
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
    let path = dir.join("big.safetensors");
    serialize_to_file(
        [("big", TensorView::new(Dtype::U8, &[big.len()], &big))],
        None,
        &path,
    )
    .unwrap();
    let file = SafeFile::open(&path, Backend::Read).unwrap();
    let mut plan = UploadPlan::new(256);
    plan.add_tensor(0, &file, "big").unwrap();
    let target = HostTarget::new(plan.total());
    let ring = Ring::new(
        &target,
        RingOptions {
            slots: 2,
            slot_bytes: 64 << 10,
            readers: 2,
        },
    )
    .unwrap();
    let stats = ring.run(&target, &[&file], &plan).unwrap();
    ring.wait_all(&target).unwrap();
    assert_eq!(stats.chunks, 128);
    assert_eq!(ring.staging_bytes(), 128 << 10);
    assert!(target.bytes() == big);
}

/// A file holding one U8 tensor of `n` bytes, and those bytes.
fn one_tensor_file(dir: &Path, n: usize) -> (SafeFile, Vec<u8>) {
    let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let path = dir.join("one.safetensors");
    serialize_to_file(
        [("x", TensorView::new(Dtype::U8, &[n], &bytes))],
        None,
        &path,
    )
    .unwrap();
    (SafeFile::open(&path, Backend::Read).unwrap(), bytes)
}

#[test]
fn sixteen_threads_share_one_ring() {
    // Each run numbers its chunks from 0 against the same slots: runs must take turns, and
    // every thread's destination must get exactly its bytes.
    let dir = scratch_dir("upload_shared_ring");
    let files = Arc::new(files(&dir));
    let (plan, expected) = plan_and_expected(&files, 256);
    let (plan, expected) = (Arc::new(plan), Arc::new(expected));
    let ring = Arc::new(Ring::lazy(RingOptions {
        slots: 3,
        slot_bytes: 4096,
        readers: 4,
    }));
    without_hanging("16 threads sharing one ring", move || {
        std::thread::scope(|scope| {
            for t in 0..16 {
                let (files, plan, expected, ring) = (&files, &plan, &expected, &ring);
                scope.spawn(move || {
                    let refs: Vec<&SafeFile> = files.iter().collect();
                    for round in 0..3 {
                        let target = HostTarget {
                            jitter: t % 4 == 0,
                            ..HostTarget::new(plan.total())
                        };
                        ring.run(&target, &refs, plan).unwrap();
                        ring.wait_all(&target).unwrap();
                        assert!(
                            target.bytes() == **expected,
                            "thread {t}, round {round}: bytes differ"
                        );
                    }
                });
            }
        });
    });
}

#[test]
fn a_failure_wakes_every_waiting_reader() {
    // Many readers queue on few slots; one fails. Every waiter must see the failure (it is
    // published under each slot's lock), or the upload hangs. A race: repeated to find it.
    let dir = scratch_dir("upload_failure_wakes");
    let files = Arc::new(files(&dir));
    let (plan, _) = plan_and_expected(&files, 256);
    without_hanging("waiters after a failure", move || {
        let refs: Vec<&SafeFile> = files.iter().collect();
        let ring = Ring::lazy(RingOptions {
            slots: 2,
            slot_bytes: 4096,
            readers: 8,
        });
        for i in 0..300 {
            let target = HostTarget {
                fail_at: Some(i % 4),
                ..HostTarget::new(plan.total())
            };
            let err = ring.upload(&target, &refs, &plan).unwrap_err();
            assert!(err.to_string().contains("injected failure"), "{err}");
        }
    });
}

#[test]
fn wait_all_waits_on_every_slot_after_a_failed_wait() {
    // Four chunks in four slots; waiting for the first fails. The other three copies must
    // still be waited for (a caller frees the destination after an error), and the failed
    // one stays tracked so a later wait completes it.
    let dir = scratch_dir("upload_wait_all");
    let (file, bytes) = one_tensor_file(&dir, 4 * 4096);
    let mut plan = UploadPlan::new(256);
    plan.add_tensor(0, &file, "x").unwrap();
    let target = HostTarget {
        fail_wait_at: Some(0),
        ..HostTarget::new(plan.total())
    };
    let ring = Ring::new(
        &target,
        RingOptions {
            slots: 4,
            slot_bytes: 4096,
            readers: 1,
        },
    )
    .unwrap();
    assert_eq!(ring.run(&target, &[&file], &plan).unwrap().chunks, 4);
    let err = ring.wait_all(&target).unwrap_err();
    assert!(
        err.to_string().contains("injected failure at wait 0"),
        "{err}"
    );
    let got = target.bytes();
    assert!(
        got[4096..] == bytes[4096..],
        "copies after the failed wait were not waited for"
    );
    assert!(got[..4096].iter().all(|&b| b == 0xAB));
    ring.wait_all(&target).unwrap();
    assert!(target.bytes() == bytes);
}

#[test]
fn a_failed_upload_leaves_the_ring_reusable() {
    let dir = scratch_dir("upload_fail_then_reuse");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    let (plan, expected) = plan_and_expected(&files, 256);
    let target = HostTarget {
        fail_at: Some(2),
        ..HostTarget::new(plan.total())
    };
    let ring = Ring::new(
        &target,
        RingOptions {
            slots: 3,
            slot_bytes: 4096,
            readers: 3,
        },
    )
    .unwrap();
    let err = ring.upload(&target, &refs, &plan).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cuda);
    for _ in 0..2 {
        target.dst.lock().unwrap().fill(0);
        ring.upload(&target, &refs, &plan).unwrap();
        assert!(target.bytes() == expected);
    }
    drop(ring);
    assert_eq!(target.live.load(Ordering::SeqCst), 0, "slots leaked");
}

#[test]
fn a_lazy_ring_stages_no_more_than_the_plan_needs() {
    let dir = scratch_dir("upload_lazy");
    let (file, bytes) = one_tensor_file(&dir, 1000);
    let mut plan = UploadPlan::new(256);
    plan.add_tensor(0, &file, "x").unwrap();
    let target = HostTarget::new(plan.total());
    let ring = Ring::lazy(RingOptions {
        slots: 4,
        slot_bytes: 1 << 20,
        readers: 4,
    });
    assert_eq!(ring.staging_bytes(), 0);
    ring.upload(&target, &[&file], &plan).unwrap();
    assert!(target.bytes() == bytes);
    // One chunk, so one slot, of one page rather than 1 MiB.
    assert_eq!(ring.staging_bytes(), 4096);
    assert_eq!(target.live.load(Ordering::SeqCst), 1);
    // A larger upload grows the slots it uses, freeing the small one.
    let (big, big_bytes) = one_tensor_file(&dir, 3 << 20);
    let mut plan = UploadPlan::new(256);
    plan.add_tensor(0, &big, "x").unwrap();
    let target2 = HostTarget {
        live: target.live.clone(),
        ..HostTarget::new(plan.total())
    };
    ring.upload(&target2, &[&big], &plan).unwrap();
    assert!(target2.bytes() == big_bytes);
    assert_eq!(ring.staging_bytes(), 3 << 20);
    assert_eq!(target.live.load(Ordering::SeqCst), 3);
}

#[test]
fn an_alignment_whose_padding_overflows_is_blamed_not_the_shape() {
    let dir = scratch_dir("upload_absurd_alignment");
    let files = files(&dir);
    for alignment in [usize::MAX, 1 << 63] {
        let mut plan = UploadPlan::new(alignment);
        let err = files[0]
            .header()
            .sorted_names()
            .into_iter()
            .try_for_each(|name| plan.add_tensor(0, &files[0], name).map(drop))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValidationOverflow);
        let text = err.to_string();
        assert!(
            text.contains(&format!("the alignment, {alignment} bytes")),
            "{text}"
        );
        assert!(!text.contains("shape"), "{text}");
        // What was placed before the refusal stays as it was.
        assert!(!plan.placements().is_empty());
        assert!(plan
            .placements()
            .iter()
            .all(|p| p.offset % alignment as u64 == 0));
    }
}

/// The upload of requests of a source, run through a host ring: its bytes, tensor by tensor.
fn upload_of(
    source: safetensors_core::Source<'_>,
    requests: Option<&[safetensors_core::Request]>,
) -> safetensors_core::Result<(UploadPlan, Vec<u8>)> {
    let (plan, files) = UploadPlan::of(source, requests, 256)?;
    let refs: Vec<&SafeFile> = files.iter().map(|f| f.as_ref()).collect();
    let target = HostTarget::new(plan.total());
    let ring = Ring::new(&target, RingOptions::default()).unwrap();
    ring.run(&target, &refs, &plan)?;
    ring.wait_all(&target)?;
    Ok((plan, target.bytes()))
}

#[test]
fn uploads_read_what_prefetch_and_streams_read_from_the_same_requests() {
    use common::sharded::{write_sharded, Spec};
    use safetensors_core::{Checkpoint, Request, Source};
    let dir = scratch_dir("upload_of_requests");
    let shards: Vec<Vec<Spec>> = (0..3)
        .map(|s| {
            (0..4)
                .map(|t| (format!("s{s}.t{t}"), Dtype::U8, vec![2 + t, 5 + s]))
                .collect()
        })
        .collect();
    let index = write_sharded(&dir, &shards);
    let ckpt = Checkpoint::open(&index, Backend::Read).unwrap();
    let bytes_of = |name: &str| {
        let (file, _) = ckpt.locate(name).unwrap();
        file.tensor_bytes(name).unwrap().into_owned()
    };
    // Every tensor: placed in name order (as `keys()` lists them), each byte from its shard.
    let (plan, got) = upload_of(Source::Checkpoint(&ckpt), None).unwrap();
    let names: Vec<&str> = plan.placements().iter().map(|p| p.name.as_str()).collect();
    let mut sorted = ckpt.names().to_vec();
    sorted.sort();
    assert_eq!(names, sorted);
    for p in plan.placements() {
        let at = p.offset as usize;
        assert_eq!(
            &got[at..at + p.len as usize],
            &bytes_of(&p.name)[..],
            "{}",
            p.name
        );
    }
    // Requests: in request order, a slice, and a shard pin that holds (shard 2).
    let requests = [
        Request::tensor("s2.t3").in_file(2),
        Request::slice("s0.t1", vec![Indexer::range(1, 3)]),
        Request::tensor("s1.t0"),
    ];
    let (plan, got) = upload_of(Source::Checkpoint(&ckpt), Some(&requests)).unwrap();
    let names: Vec<&str> = plan.placements().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["s2.t3", "s0.t1", "s1.t0"]);
    let sliced = &plan.placements()[1];
    assert_eq!(sliced.shape, [2, 5]);
    let whole = bytes_of("s0.t1");
    let at = sliced.offset as usize;
    assert_eq!(&got[at..at + 10], &whole[5..15]);
    // A pin to a shard that does not hold the tensor is refused, as prefetch and streams do.
    let wrong = [Request::tensor("s2.t3").in_file(0)];
    let err = upload_of(Source::Checkpoint(&ckpt), Some(&wrong)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorNotFound, "{err}");
    // An explicit empty list uploads nothing.
    let (plan, _) = upload_of(Source::Checkpoint(&ckpt), Some(&[])).unwrap();
    assert_eq!((plan.total(), plan.placements().len()), (0, 0));
}
