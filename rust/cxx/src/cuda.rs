//! Glue for uploads to the GPU: `UploadJob` collects what to upload (from files and shards),
//! `Uploader` runs it, streaming uploads hand each tensor to a C++ function as it lands. Without
//! the `cuda` feature every CUDA entry point returns a `Cuda` error saying so, so the C++ API is
//! the same in every build.

use std::sync::Arc;

#[cfg(feature = "cuda")]
use safetensors_core::upload::RingOptions;
use safetensors_core::upload::UploadPlan;
use safetensors_core::{Error, Indexer, SafeFile};

use crate::checkpoint::Checkpoint;
use crate::ffi::Status;
use crate::ffi::{LandingSink, SliceIndex, UploadPlacement};
use crate::file::{indexer, File};
use crate::guard;

/// Tensors and slices to upload, with the files they come from.
pub struct UploadJob {
    plan: UploadPlan,
    files: Vec<Arc<SafeFile>>,
}

pub fn new_upload_job(alignment: usize) -> Box<UploadJob> {
    Box::new(UploadJob {
        plan: UploadPlan::new(alignment),
        files: Vec::new(),
    })
}

impl UploadJob {
    /// The source number of `file`, adding it on first use, and the file.
    fn source(&mut self, file: &File) -> (usize, Arc<SafeFile>) {
        let shared = file.shared();
        match self.files.iter().position(|f| Arc::ptr_eq(f, &shared)) {
            Some(i) => (i, shared),
            None => {
                self.files.push(shared.clone());
                (self.files.len() - 1, shared)
            }
        }
    }

    /// Every tensor of `file`, in sorted-name order (what C++ `keys()` lists): one bridge call
    /// for a whole file instead of one per tensor.
    pub fn add_file(&mut self, file: &File, status: &mut Status) {
        guard(status, || {
            let (source, f) = self.source(file);
            for name in f.header().sorted_names() {
                self.plan.add_tensor(source, &f, name)?;
            }
            Ok(())
        })
    }

    /// Every tensor of a checkpoint, in its `keys()` order, each from its shard.
    pub fn add_checkpoint(&mut self, ckpt: &Checkpoint, status: &mut Status) {
        guard(status, || {
            for name in ckpt.core().names() {
                let shard = ckpt.core().shard_of(name)?;
                let (source, f) = self.source(ckpt.shard(shard)?);
                self.plan.add_tensor(source, &f, name)?;
            }
            Ok(())
        })
    }

    pub fn add_tensor(&mut self, file: &File, name: &[u8], status: &mut Status) {
        guard(status, || {
            let (source, f) = self.source(file);
            self.plan
                .add_tensor(source, &f, &utf8_name(name)?)
                .map(drop)
        })
    }

    pub fn add_slice(
        &mut self,
        file: &File,
        name: &[u8],
        indices: &[SliceIndex],
        status: &mut Status,
    ) {
        guard(status, || {
            let (source, f) = self.source(file);
            let indexers: Vec<Indexer> = indices.iter().map(indexer).collect();
            self.plan
                .add_slice(source, &f, &utf8_name(name)?, &indexers)
                .map(drop)
        })
    }

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

    #[cfg(feature = "cuda")]
    fn file_refs(&self) -> Vec<&SafeFile> {
        self.files.iter().map(|f| f.as_ref()).collect()
    }
}

fn utf8_name(name: &[u8]) -> Result<String, Error> {
    String::from_utf8(name.to_vec()).map_err(|_| Error::TensorNotFound {
        name: String::from_utf8_lossy(name).into_owned(),
    })
}

#[cfg(feature = "cuda")]
fn ring_options(slots: usize, slot_bytes: usize, readers: usize) -> RingOptions {
    let d = RingOptions::default();
    RingOptions {
        slots: if slots == 0 { d.slots } else { slots },
        slot_bytes: if slot_bytes == 0 {
            d.slot_bytes
        } else {
            slot_bytes
        },
        readers: if readers == 0 { d.readers } else { readers },
    }
}

#[cfg(feature = "cuda")]
mod enabled {
    use super::*;
    use crate::handed_over;

    pub struct Uploader(safetensors_cuda::Uploader);

    pub fn new_uploader(
        device: usize,
        slots: usize,
        slot_bytes: usize,
        readers: usize,
        status: &mut Status,
    ) -> *mut Uploader {
        guard(status, || {
            safetensors_cuda::Uploader::new(device, ring_options(slots, slot_bytes, readers))
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
                    .upload_into_landing(
                        &job.file_refs(),
                        &job.plan,
                        dst,
                        capacity,
                        stream,
                        delivery,
                    )
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
    type SinkFn = unsafe extern "C" fn(usize, *const crate::ffi::LandedTensor) -> bool;

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
            let landed = crate::ffi::LandedTensor {
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
        true
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
}

#[cfg(not(feature = "cuda"))]
mod enabled {
    use super::*;
    use crate::status::Fallback;

    /// Never constructed in a build without CUDA.
    pub struct Uploader(());

    /// Every CUDA entry point of a build without CUDA: a `Cuda` error saying so.
    fn unavailable<T: Fallback>(status: &mut Status) -> T {
        guard(status, || {
            Err(Error::Cuda {
                message: "this build of the safetensors library has no CUDA support (configure \
                          with -DSAFETENSORS_CUDA=ON)"
                    .into(),
            })
        })
    }

    pub fn new_uploader(_: usize, _: usize, _: usize, _: usize, s: &mut Status) -> *mut Uploader {
        unavailable(s)
    }

    impl Uploader {
        pub fn upload(&self, _: &UploadJob, s: &mut Status) -> u64 {
            unavailable(s)
        }
        pub fn upload_into(&self, _: &UploadJob, _: u64, _: usize, _: u64, s: &mut Status) {
            unavailable(s)
        }
        pub fn synchronize(&self, s: &mut Status) {
            unavailable(s)
        }
        pub fn staging_bytes(&self) -> usize {
            0
        }
        /// # Safety
        /// None: nothing is called.
        pub unsafe fn upload_landing(&self, _: &UploadJob, _: &LandingSink, s: &mut Status) -> u64 {
            unavailable(s)
        }
        /// # Safety
        /// None: nothing is called.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn upload_into_landing(
            &self,
            _: &UploadJob,
            _: u64,
            _: usize,
            _: u64,
            _: &LandingSink,
            s: &mut Status,
        ) {
            unavailable(s)
        }
        /// # Safety
        /// None: nothing is called.
        pub unsafe fn upload_scratch(
            &self,
            _: &UploadJob,
            _: usize,
            _: &LandingSink,
            s: &mut Status,
        ) -> usize {
            unavailable(s)
        }
    }

    pub fn cuda_shared_upload(_: usize, _: &UploadJob, s: &mut Status) -> u64 {
        unavailable(s)
    }
    pub fn cuda_built() -> bool {
        false
    }
    pub fn cuda_device_count(s: &mut Status) -> usize {
        unavailable(s)
    }
    pub fn cuda_device_name(_: usize, s: &mut Status) -> String {
        unavailable(s)
    }
    pub fn cuda_free(_: usize, _: u64, s: &mut Status) {
        unavailable(s)
    }
    pub fn cuda_download(_: usize, _: u64, _: &mut [u8], s: &mut Status) {
        unavailable(s)
    }
    pub fn cuda_pinned_copy_seconds(_: usize, _: usize, s: &mut Status) -> f64 {
        unavailable(s)
    }

    /// Never constructed in a build without CUDA.
    pub struct DeviceStage(());

    pub fn new_device_stage(_: usize, _: usize, s: &mut Status) -> *mut DeviceStage {
        unavailable(s)
    }

    impl DeviceStage {
        pub fn destination(&self) -> u64 {
            0
        }
        pub fn stream(&self) -> u64 {
            0
        }
        /// # Safety
        /// None: the bridge needs `unsafe` to name the lifetime.
        pub unsafe fn host<'a>(&'a mut self, _: usize, s: &mut Status) -> &'a mut [u8] {
            unavailable(s)
        }
        pub fn host_to_destination(&mut self, _: usize, _: usize, _: usize, s: &mut Status) {
            unavailable(s)
        }
        pub fn scratch(&mut self, _: usize, s: &mut Status) -> u64 {
            unavailable(s)
        }
        pub fn host_to_scratch(&mut self, _: usize, s: &mut Status) {
            unavailable(s)
        }
        pub fn scratch_to_destination(&mut self, _: usize, _: usize, _: usize, s: &mut Status) {
            unavailable(s)
        }
        pub fn finish(&mut self, s: &mut Status) -> u64 {
            unavailable(s)
        }
    }
}

pub use enabled::*;
