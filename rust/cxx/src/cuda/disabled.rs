//! A build without CUDA: every CUDA entry point of the bridge is a `Cuda` error saying so.

use safetensors_core::Error;

use super::ffi::LandingSink;
use super::UploadJob;
use crate::status::{guard, Fallback, Status};

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
pub fn cuda_release_staging(_: usize, s: &mut Status) -> usize {
    unavailable(s)
}

pub fn cuda_save(
    _: &crate::writer::StreamingWriter,
    _: usize,
    _: &[u64],
    _: usize,
    _: usize,
    s: &mut Status,
) {
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
