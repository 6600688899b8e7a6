//! The direct backend's side of `File`: which backend a file reads with, whether `O_DIRECT`
//! fell back, and aligned reads (cold reads at the disk's speed).

use safetensors_core::DIRECT_ALIGN;

use super::ffi::Backend;
use super::File;
use crate::status::{guard, BytesMut, Status};

impl File {
    pub fn backend(&self) -> Backend {
        match self.core().backend() {
            safetensors_core::Backend::Mmap => Backend::Mmap,
            safetensors_core::Backend::Read => Backend::Read,
            safetensors_core::Backend::Direct => Backend::Direct,
        }
    }

    pub fn direct_fallback(&self) -> &str {
        self.core().direct_fallback().unwrap_or("")
    }

    pub fn aligned_len(&self, offset: u64, len: usize, status: &mut Status) -> usize {
        guard(status, || self.core().aligned_len(offset, len))
    }

    pub fn read_data_aligned(
        &self,
        offset: u64,
        len: usize,
        mut dst: BytesMut,
        status: &mut Status,
    ) -> usize {
        // SAFETY: C++ lends `dst` for this call (a buffer of its own, `aligned_bytes`).
        let dst = unsafe { dst.get() };
        guard(status, || self.core().read_data_aligned(offset, len, dst))
    }
}

pub fn direct_align() -> usize {
    DIRECT_ALIGN
}
