//! The staged upload pipeline against a host-memory device: every byte must land at the offset
//! the plan gives it, whatever the ring size, chunk size, reader count and timing.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::scratch_dir;
use safetensors_core::upload::{Device, Ring, RingOptions, UploadPlan};
use safetensors_core::{
    serialize_to_file, Backend, Dtype, ErrorKind, Indexer, SafeFile, TensorView,
};

/// A destination in host memory whose copies happen late: `submit` only records the copy, and
/// `wait` performs it from the slot as it is then. A pipeline that refilled a slot before
/// waiting for its copy would therefore upload the wrong bytes.
struct HostDevice {
    dst: Mutex<Vec<u8>>,
    submits: AtomicUsize,
    fail_at: Option<usize>,
    jitter: bool,
}

struct HostSlot {
    buf: Vec<u8>,
    pending: Option<(usize, u64)>,
}

impl HostDevice {
    fn new(len: u64) -> HostDevice {
        HostDevice {
            dst: Mutex::new(vec![0xAB; len as usize]),
            submits: AtomicUsize::new(0),
            fail_at: None,
            jitter: false,
        }
    }
}

impl Device for HostDevice {
    type Slot = HostSlot;

    fn new_slot(&self, bytes: usize) -> safetensors_core::Result<HostSlot> {
        Ok(HostSlot {
            buf: vec![0xCD; bytes],
            pending: None,
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
        slot.pending = Some((len, dst_offset));
        if self.jitter {
            std::thread::sleep(Duration::from_micros((n as u64 * 7919) % 300));
        }
        Ok(())
    }

    fn wait(&self, slot: &mut HostSlot) -> safetensors_core::Result<()> {
        if let Some((len, at)) = slot.pending.take() {
            let mut dst = self.dst.lock().unwrap();
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
        let device = HostDevice {
            jitter: true,
            ..HostDevice::new(plan.total())
        };
        let ring = Ring::new(
            &device,
            RingOptions {
                slots,
                slot_bytes,
                readers,
            },
        )
        .unwrap();
        assert_eq!(ring.staging_bytes(), slots * slot_bytes.max(4096));
        let stats = ring.run(&device, &refs, &plan).unwrap();
        ring.wait_all(&device).unwrap();
        assert_eq!(stats.bytes, plan.total());
        let got = device.dst.into_inner().unwrap();
        assert!(
            got == expected,
            "slots {slots}, slot {slot_bytes}, readers {readers}: bytes differ"
        );
        assert_eq!(device.submits.load(Ordering::SeqCst), stats.chunks);
    }
}

#[test]
fn a_ring_is_reusable_across_uploads() {
    let dir = scratch_dir("upload_reuse");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    let (plan, expected) = plan_and_expected(&files, 256);
    let device = HostDevice::new(plan.total());
    let ring = Ring::new(
        &device,
        RingOptions {
            slots: 3,
            slot_bytes: 4096,
            readers: 2,
        },
    )
    .unwrap();
    for _ in 0..3 {
        device.dst.lock().unwrap().fill(0x11);
        ring.run(&device, &refs, &plan).unwrap();
        ring.wait_all(&device).unwrap();
        assert!(*device.dst.lock().unwrap() == expected);
    }
}

#[test]
fn a_failed_copy_stops_the_upload_with_its_error() {
    let dir = scratch_dir("upload_failure");
    let files = files(&dir);
    let refs: Vec<&SafeFile> = files.iter().collect();
    let (plan, _) = plan_and_expected(&files, 256);
    for readers in [1, 4] {
        let device = HostDevice {
            fail_at: Some(3),
            ..HostDevice::new(plan.total())
        };
        let ring = Ring::new(
            &device,
            RingOptions {
                slots: 2,
                slot_bytes: 4096,
                readers,
            },
        )
        .unwrap();
        let err = ring.run(&device, &refs, &plan).unwrap_err();
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
    let device = HostDevice::new(plan.total());
    let ring = Ring::new(
        &device,
        RingOptions {
            slots: 2,
            slot_bytes: 4096,
            readers: 2,
        },
    )
    .unwrap();
    let refs: Vec<&SafeFile> = files.iter().collect();
    assert_eq!(
        ring.run(&device, &refs, &plan).unwrap_err().kind(),
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
    let device = HostDevice::new(plan.total());
    let ring = Ring::new(
        &device,
        RingOptions {
            slots: 2,
            slot_bytes: 64 << 10,
            readers: 2,
        },
    )
    .unwrap();
    let stats = ring.run(&device, &[&file], &plan).unwrap();
    ring.wait_all(&device).unwrap();
    assert_eq!(stats.chunks, 128);
    assert_eq!(ring.staging_bytes(), 128 << 10);
    assert!(*device.dst.lock().unwrap() == big);
}
