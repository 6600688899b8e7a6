//! Uploads to the GPU (bridge and glue): `UploadJob` is what an upload reads, planned from the
//! same requests as prefetch and streams; `Uploader` runs it; streaming uploads hand each tensor
//! to a C++ function as it lands. Saves go the other way: device memory into a writer. The driver
//! side is `cuda/device.rs`, over `rust/cuda` in every build: without the `cuda` feature that
//! crate answers every entry point with a `Cuda` error saying so, so the C++ API is the same in
//! every build.

use std::sync::Arc;

use safetensors_core::upload::UploadPlan;
use safetensors_core::SafeFile;

use crate::status::handed_over;
use crate::status::{guard, Status};
use crate::stream::{RequestList, Source};
use ffi::UploadPlacement;

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        include!("safetensors/ffi/src/stream.rs.h");
        include!("safetensors/ffi/src/writer.rs.h");
        type Status = crate::status::ffi::Status;
        type Source = crate::stream::Source;
        type RequestList = crate::stream::RequestList;
        type StreamingWriter = crate::writer::StreamingWriter;
    }

    /// Where one uploaded tensor lives in the destination (every placement of a job crosses
    /// in one call).
    #[derive(Debug, Clone)]
    struct UploadPlacement {
        name: String,
        shape: Vec<usize>,
        offset: u64,
        len: u64,
        dtype: u8,
    }

    extern "Rust" {
        /// What an upload reads and where each tensor lands.
        type UploadJob;
        /// The upload of `requests` of `source` (the same requests prefetch and streams take):
        /// tensors placed in request order (every tensor: in name order, as `keys()` lists
        /// them), each on a multiple of `alignment` bytes. Null on failure.
        fn plan_upload(
            source: &Source,
            requests: &RequestList,
            alignment: usize,
            status: &mut Status,
        ) -> *mut UploadJob;
        /// The one rule for the alignment of an upload's placements, the core's
        /// (`upload::alignment`): 0 is the default, 256; else a power of two (`InvalidSlice`).
        /// Multi-rank device loads, which place tensors in C++, ask it.
        fn upload_alignment(alignment: usize, status: &mut Status) -> usize;
        /// Bytes the destination needs.
        fn total_bytes(self: &UploadJob) -> usize;
        /// Where every tensor goes, in the order added.
        fn placements(self: &UploadJob) -> Vec<UploadPlacement>;

        /// Uploads jobs to one GPU through a pinned staging ring.
        type Uploader;
        /// An uploader for `device` (0 for a default slots, slot_bytes or readers). Null on
        /// failure.
        fn new_uploader(
            device: usize,
            slots: usize,
            slot_bytes: usize,
            readers: usize,
            status: &mut Status,
        ) -> *mut Uploader;
        /// Uploads into a new allocation (complete on return); the caller owns the address.
        fn upload(self: &Uploader, job: &UploadJob, status: &mut Status) -> u64;
        /// Enqueues the upload into `dst` on `stream` and returns.
        fn upload_into(
            self: &Uploader,
            job: &UploadJob,
            dst: u64,
            capacity: usize,
            stream: u64,
            status: &mut Status,
        );
        /// Waits for every copy this uploader enqueued.
        fn synchronize(self: &Uploader, status: &mut Status);
        /// Pinned host memory held by the staging ring.
        fn staging_bytes(self: &Uploader) -> usize;

        /// Uploads through the process's shared uploader for `device` (made on first use, its
        /// staging allocated as uploads need it) into a new allocation, complete on return.
        fn cuda_shared_upload(device: usize, job: &UploadJob, status: &mut Status) -> u64;
        /// Whether this build has the CUDA path.
        fn cuda_built() -> bool;
        /// Number of CUDA devices, or why there are none.
        fn cuda_device_count(status: &mut Status) -> usize;
        /// A device's name.
        fn cuda_device_name(device: usize, status: &mut Status) -> String;
        /// Frees device memory returned by `upload`.
        fn cuda_free(device: usize, ptr: u64, status: &mut Status);
        /// Copies device memory to the host (synchronous).
        fn cuda_download(device: usize, src: u64, dst: &mut [u8], status: &mut Status);
        /// Seconds for one copy of `bytes` from pinned memory to the device.
        fn cuda_pinned_copy_seconds(device: usize, bytes: usize, status: &mut Status) -> f64;
        /// Unpins the staging memory `device` keeps idle between uploads; the bytes unpinned.
        fn cuda_release_staging(device: usize, status: &mut Status) -> usize;
        /// Writes every tensor `writer` declared from device memory of `device`: tensor `i`
        /// (declaration order) from address `ptrs[i]`, through `slots` pinned staging slots of
        /// `slot_bytes` each (0: 4 slots of 16 MiB). The writer is not finished.
        fn cuda_save(
            writer: &StreamingWriter,
            device: usize,
            ptrs: &[u64],
            slots: usize,
            slot_bytes: usize,
            status: &mut Status,
        );

        /// One rank's device staging for a multi-rank load: a destination allocation, a
        /// pinned staging buffer, a device scratch buffer and a stream.
        type DeviceStage;
        /// A stage on `device` whose destination holds `total` bytes. Null on failure.
        fn new_device_stage(device: usize, total: usize, status: &mut Status) -> *mut DeviceStage;
        /// The destination's device address (0 once handed over by `finish`).
        fn destination(self: &DeviceStage) -> u64;
        /// The stream every copy is ordered on.
        fn stream(self: &DeviceStage) -> u64;
        /// The next pinned staging buffer (`len` bytes; two take turns), once the copies out of
        /// it are done (empty on failure). `unsafe` only because cxx requires it to spell the
        /// lifetime.
        unsafe fn host<'a>(
            self: &'a mut DeviceStage,
            len: usize,
            status: &mut Status,
        ) -> &'a mut [u8];
        /// Enqueues staged bytes `[src_offset, +len)` to destination offset `dst_offset`.
        fn host_to_destination(
            self: &mut DeviceStage,
            src_offset: usize,
            len: usize,
            dst_offset: usize,
            status: &mut Status,
        );
        /// A device scratch buffer of at least `len` bytes, by address.
        fn scratch(self: &mut DeviceStage, len: usize, status: &mut Status) -> u64;
        /// Enqueues the first `len` staged bytes into the scratch buffer.
        fn host_to_scratch(self: &mut DeviceStage, len: usize, status: &mut Status);
        /// Enqueues scratch bytes `[src_offset, +len)` to destination offset `dst_offset`.
        fn scratch_to_destination(
            self: &mut DeviceStage,
            src_offset: usize,
            len: usize,
            dst_offset: usize,
            status: &mut Status,
        );
        /// Waits for every copy and hands the destination over, by address.
        fn finish(self: &mut DeviceStage, status: &mut Status) -> u64;
    }

    /// How a streaming upload hands each tensor to C++: `call` is the address of a C++
    /// function `bool(std::uintptr_t context, const LandedTensor*) noexcept`, called on the
    /// calling thread with `context`, in request order, one tensor at a time; it returns false
    /// to stop the upload (C++ keeps why). `enqueued`: call it once the tensor's copies are
    /// enqueued rather than once they completed. `consumer` (when `has_consumer`): a stream
    /// made to wait for each tensor's event first (see `safetensors_cuda::Delivery`).
    #[derive(Debug, Clone, Copy)]
    struct LandingSink {
        call: usize,
        context: usize,
        enqueued: bool,
        has_consumer: bool,
        consumer: u64,
    }

    /// One tensor handed over: its index in the job, its device address, and the `CUevent`
    /// recorded on the copy stream after its last copy (valid until the call returns).
    #[derive(Debug, Clone, Copy)]
    struct LandedTensor {
        index: usize,
        data: u64,
        event: u64,
    }

    extern "Rust" {
        /// Uploads into a new allocation, handing each tensor to `sink` as it lands; complete
        /// on return. The caller owns the address.
        ///
        /// # Safety
        /// `sink.call` is such a C++ function and `sink.context` what it expects.
        unsafe fn upload_landing(
            self: &Uploader,
            job: &UploadJob,
            sink: &LandingSink,
            status: &mut Status,
        ) -> u64;
        /// Uploads into `dst` with copies on `stream`, handing each tensor to `sink` as it
        /// lands; every copy has completed on return.
        ///
        /// # Safety
        /// As `upload_landing`.
        unsafe fn upload_into_landing(
            self: &Uploader,
            job: &UploadJob,
            dst: u64,
            capacity: usize,
            stream: u64,
            sink: &LandingSink,
            status: &mut Status,
        );
        /// Uploads through a device scratch ring of about `scratch_bytes`, handing each tensor
        /// to `sink` as it lands there; returns the ring's size (freed on return).
        ///
        /// # Safety
        /// As `upload_landing`.
        unsafe fn upload_scratch(
            self: &Uploader,
            job: &UploadJob,
            scratch_bytes: usize,
            sink: &LandingSink,
            status: &mut Status,
        ) -> usize;
    }

    impl Box<UploadJob> {}
    impl Box<Uploader> {}
    impl Box<DeviceStage> {}
}

/// An upload's plan and the files it reads.
pub struct UploadJob {
    plan: UploadPlan,
    // Held so that a job keeps its files alive as every reader does.
    files: Vec<Arc<SafeFile>>,
}

pub fn upload_alignment(alignment: usize, status: &mut Status) -> usize {
    guard(status, || safetensors_core::upload::alignment(alignment))
}

pub fn plan_upload(
    source: &Source,
    requests: &RequestList,
    alignment: usize,
    status: &mut Status,
) -> *mut UploadJob {
    guard(status, || {
        let requests = requests.core(source.path())?;
        let (plan, files) = source.with(|s| UploadPlan::of(s, requests.as_deref(), alignment))?;
        Ok(handed_over(UploadJob { plan, files }))
    })
}

impl UploadJob {
    pub fn total_bytes(&self) -> usize {
        self.plan.total() as usize
    }

    /// Every placement in one answer (names and shapes included).
    pub fn placements(&self) -> Vec<UploadPlacement> {
        self.plan
            .placements()
            .iter()
            .map(|p| UploadPlacement {
                name: p.name.clone(),
                shape: p.shape.clone(),
                offset: p.offset,
                len: p.len,
                dtype: p.dtype as u8,
            })
            .collect()
    }

    pub(crate) fn file_refs(&self) -> Vec<&SafeFile> {
        self.files.iter().map(|f| f.as_ref()).collect()
    }
}

#[path = "cuda/device.rs"]
mod device;

pub use device::*;
