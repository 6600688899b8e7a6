//! The CUDA side of the bridge's uploads: `safetensors_cuda` behind the bridge's types, in
//! every build (a build without CUDA gets that crate's "not built" answer from each call).

use safetensors_core::upload::RingOptions;
use safetensors_core::Error;

use safetensors_cuda::{save_from_device, DeviceSource};

use super::ffi::{LandedTensor, LandingSink};
use super::UploadJob;
use crate::status::handed_over;
use crate::status::{guard, Status};
use crate::writer::StreamingWriter;

pub struct Uploader(safetensors_cuda::Uploader);

pub fn new_uploader(
    device: usize,
    slots: usize,
    slot_bytes: usize,
    readers: usize,
    status: &mut Status,
) -> *mut Uploader {
    guard(status, || {
        safetensors_cuda::Uploader::new(
            device,
            RingOptions::with_counts(slots, slot_bytes, readers),
        )
        .map(|u| handed_over(Uploader(u)))
    })
}

impl Uploader {
    pub fn upload(&self, job: &UploadJob, status: &mut Status) -> u64 {
        guard(status, || {
            self.0
                .upload(&job.file_refs(), &job.plan)
                .map(|b| b.release())
        })
    }

    pub fn upload_into(
        &self,
        job: &UploadJob,
        dst: u64,
        capacity: usize,
        stream: u64,
        status: &mut Status,
    ) {
        guard(status, || {
            self.0
                .upload_into(&job.file_refs(), &job.plan, dst, capacity, stream)
                .map(drop)
        })
    }

    pub fn synchronize(&self, status: &mut Status) {
        guard(status, || self.0.synchronize())
    }

    pub fn staging_bytes(&self) -> usize {
        self.0.staging_bytes()
    }

    /// # Safety
    /// `sink` names a C++ function as the bridge declaration says.
    pub unsafe fn upload_landing(
        &self,
        job: &UploadJob,
        sink: &LandingSink,
        status: &mut Status,
    ) -> u64 {
        guard(status, || {
            // SAFETY: the caller's promise.
            let mut to_cxx = unsafe { cxx_sink(sink) };
            self.0
                .upload_landing(&job.file_refs(), &job.plan, delivery(sink, &mut to_cxx))
                .map(|b| b.release())
        })
    }

    /// # Safety
    /// As `upload_landing`.
    pub unsafe fn upload_into_landing(
        &self,
        job: &UploadJob,
        dst: u64,
        capacity: usize,
        stream: u64,
        sink: &LandingSink,
        status: &mut Status,
    ) {
        guard(status, || {
            // SAFETY: the caller's promise.
            let mut to_cxx = unsafe { cxx_sink(sink) };
            let delivery = delivery(sink, &mut to_cxx);
            self.0
                .upload_into_landing(&job.file_refs(), &job.plan, dst, capacity, stream, delivery)
                .map(drop)
        })
    }

    /// # Safety
    /// As `upload_landing`.
    pub unsafe fn upload_scratch(
        &self,
        job: &UploadJob,
        scratch_bytes: usize,
        sink: &LandingSink,
        status: &mut Status,
    ) -> usize {
        guard(status, || {
            // SAFETY: the caller's promise.
            let mut to_cxx = unsafe { cxx_sink(sink) };
            let delivery = delivery(sink, &mut to_cxx);
            self.0
                .upload_scratch(&job.file_refs(), &job.plan, scratch_bytes as u64, delivery)
                .map(|bytes| bytes as usize)
        })
    }
}

/// The C++ function a `LandingSink` names.
type SinkFn = unsafe extern "C" fn(usize, *const LandedTensor) -> bool;

/// Calls the C++ function of `sink` for each tensor. It cannot unwind (it is `noexcept` and
/// catches what the user's callback throws); `false` means the callback stopped the upload,
/// and C++ reports its own reason instead of the `Internal` error returned here.
///
/// # Safety
/// `sink.call` is the address of such a function, and `sink.context` the argument it expects.
unsafe fn cxx_sink(
    sink: &LandingSink,
) -> impl FnMut(&safetensors_cuda::LandedTensor) -> Result<(), Error> + '_ {
    move |t| {
        if sink.call == 0 {
            return Err(Error::Internal {
                message: "a streaming upload was given no landing callback".into(),
            });
        }
        // SAFETY: the caller's promise: a function address of this signature.
        let call = unsafe { std::mem::transmute::<usize, SinkFn>(sink.call) };
        let landed = LandedTensor {
            index: t.index,
            data: t.data,
            event: t.event,
        };
        // SAFETY: as above; `landed` outlives the call.
        if unsafe { call(sink.context, &landed) } {
            Ok(())
        } else {
            Err(Error::Internal {
                message: "the landing callback stopped the upload".into(),
            })
        }
    }
}

fn delivery<'a>(
    sink: &LandingSink,
    to_cxx: &'a mut dyn FnMut(&safetensors_cuda::LandedTensor) -> Result<(), Error>,
) -> safetensors_cuda::Delivery<'a> {
    safetensors_cuda::Delivery {
        when_enqueued: sink.enqueued,
        consumer: sink.has_consumer.then_some(sink.consumer),
        sink: to_cxx,
    }
}

pub fn cuda_shared_upload(device: usize, job: &UploadJob, status: &mut Status) -> u64 {
    guard(status, || {
        safetensors_cuda::Uploader::shared(device)?
            .upload(&job.file_refs(), &job.plan)
            .map(|b| b.release())
    })
}

pub fn cuda_built() -> bool {
    safetensors_cuda::BUILT
}

pub fn cuda_device_count(status: &mut Status) -> usize {
    guard(status, safetensors_cuda::device_count)
}

pub fn cuda_device_name(device: usize, status: &mut Status) -> String {
    guard(status, || safetensors_cuda::Gpu::open(device)?.name())
}

pub fn cuda_free(device: usize, ptr: u64, status: &mut Status) {
    guard(status, || safetensors_cuda::free(device, ptr))
}

pub fn cuda_download(device: usize, src: u64, dst: &mut [u8], status: &mut Status) {
    guard(status, || {
        safetensors_cuda::Gpu::open(device)?.download(src, dst)
    })
}

pub fn cuda_pinned_copy_seconds(device: usize, bytes: usize, status: &mut Status) -> f64 {
    guard(status, || {
        safetensors_cuda::Gpu::open(device)?.pinned_copy_seconds(bytes)
    })
}

pub fn cuda_release_staging(device: usize, status: &mut Status) -> usize {
    guard(status, || Ok(safetensors_cuda::release_idle(device)))
}

pub fn cuda_save(
    writer: &StreamingWriter,
    device: usize,
    ptrs: &[u64],
    slots: usize,
    slot_bytes: usize,
    status: &mut Status,
) {
    guard(status, || {
        let declared = writer.declared()?;
        if declared.len() != ptrs.len() {
            return Err(Error::Internal {
                message: format!(
                    "a save from the GPU got {} device addresses for {} declared tensors",
                    ptrs.len(),
                    declared.len()
                ),
            });
        }
        let sources: Vec<DeviceSource<'_>> = declared
            .iter()
            .zip(ptrs)
            .map(|((name, len), &ptr)| DeviceSource {
                name,
                ptr,
                len: *len,
            })
            .collect();
        let d = RingOptions::default();
        let slots = if slots == 0 { SAVE_SLOTS } else { slots };
        let slot_bytes = if slot_bytes == 0 {
            d.slot_bytes
        } else {
            slot_bytes
        };
        let gpu = safetensors_cuda::Gpu::open(device)?;
        save_from_device(&gpu, &sources, slots, slot_bytes, |i, offset, bytes| {
            writer.write_index(i, offset, bytes)
        })
    })
}

/// Staging slots of a save from the GPU by default: with the ring's 16 MiB slots, 64 MiB of
/// pinned memory, enough to keep a copy engine and a disk busy at once.
const SAVE_SLOTS: usize = 4;

/// One rank's device staging for a multi-rank load (`safetensors_cuda::Stager`).
pub struct DeviceStage(safetensors_cuda::Stager);

pub fn new_device_stage(device: usize, total: usize, status: &mut Status) -> *mut DeviceStage {
    guard(status, || {
        safetensors_cuda::Stager::new(device, total).map(|s| handed_over(DeviceStage(s)))
    })
}

impl DeviceStage {
    pub fn destination(&self) -> u64 {
        self.0.destination()
    }
    pub fn stream(&self) -> u64 {
        self.0.stream()
    }
    /// # Safety
    /// None: the bridge needs `unsafe` to name the lifetime.
    pub unsafe fn host<'a>(&'a mut self, len: usize, status: &mut Status) -> &'a mut [u8] {
        guard(status, || self.0.host(len))
    }
    pub fn host_to_destination(
        &mut self,
        src_offset: usize,
        len: usize,
        dst_offset: usize,
        status: &mut Status,
    ) {
        guard(status, || {
            self.0.host_to_destination(src_offset, len, dst_offset)
        })
    }
    pub fn scratch(&mut self, len: usize, status: &mut Status) -> u64 {
        guard(status, || self.0.scratch(len))
    }
    pub fn host_to_scratch(&mut self, len: usize, status: &mut Status) {
        guard(status, || self.0.host_to_scratch(len))
    }
    pub fn scratch_to_destination(
        &mut self,
        src_offset: usize,
        len: usize,
        dst_offset: usize,
        status: &mut Status,
    ) {
        guard(status, || {
            self.0.scratch_to_destination(src_offset, len, dst_offset)
        })
    }
    pub fn finish(&mut self, status: &mut Status) -> u64 {
        guard(status, || self.0.finish())
    }
}
