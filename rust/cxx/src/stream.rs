//! Glue for cold reads: which backend a file uses and whether the direct backend fell back.

use safetensors_core::Backend;

use crate::File;

impl File {
    pub fn backend_code(&self) -> u8 {
        match self.core().backend() {
            Backend::Mmap => 0,
            Backend::Read => 1,
            Backend::Direct => 2,
        }
    }

    pub fn direct_fallback(&self) -> &str {
        self.core().direct_fallback().unwrap_or("")
    }
}
