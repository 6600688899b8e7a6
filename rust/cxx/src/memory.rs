//! Host memory as C++ asks for it (bridge and glue): loads of what a request list reads into one
//! allocation the C++ side makes (`HostLoad`: the core's `UploadPlan`, read into host memory),
//! and the residency of a source's pages: locked, unlocked, or released after a load.

use std::sync::Arc;

use safetensors_core::upload::UploadPlan;
use safetensors_core::{residency, Error, Plan, SafeFile};

use crate::status::handed_over;
use crate::status::{guard, Status};
use crate::stream::{RequestList, Source};
use ffi::{Residency, UploadPlacement};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        include!("safetensors/ffi/src/stream.rs.h");
        include!("safetensors/ffi/src/cuda.rs.h");
        type Status = crate::status::ffi::Status;
        type Source = crate::stream::Source;
        type RequestList = crate::stream::RequestList;
        type UploadPlacement = crate::cuda::ffi::UploadPlacement;
    }

    /// What to do with the pages a request list reads: `safetensors::lock_pages`,
    /// `unlock_pages`, `release_pages`.
    #[derive(Debug)]
    #[repr(u8)]
    enum Residency {
        Lock = 0,
        Unlock = 1,
        Release = 2,
    }

    extern "Rust" {
        /// What a host load reads and where each tensor lands in its allocation.
        type HostLoad;
        /// The load of `requests` of `source` (the requests prefetch, streams and uploads take):
        /// tensors placed in request order (every tensor: in name order, as `keys()` lists
        /// them), each on a multiple of `alignment` bytes. Null on failure.
        fn plan_load(
            source: &Source,
            requests: &RequestList,
            alignment: usize,
            status: &mut Status,
        ) -> *mut HostLoad;
        /// Bytes the allocation needs.
        fn total_bytes(self: &HostLoad) -> usize;
        /// Where every tensor goes, in the order placed.
        fn placements(self: &HostLoad) -> Vec<UploadPlacement>;
        /// Reads every tensor into `dst` (exactly `total_bytes()` long), padding zeroed.
        fn read_into(self: &HostLoad, dst: &mut [u8], status: &mut Status);

        /// Locks, unlocks or releases the pages `requests` of `source` read.
        fn residency(source: &Source, requests: &RequestList, what: Residency, status: &mut Status);
    }

    impl Box<HostLoad> {}
}

/// A planned host load and the files it reads.
pub struct HostLoad {
    plan: UploadPlan,
    files: Vec<Arc<SafeFile>>,
}

pub fn plan_load(
    source: &Source,
    requests: &RequestList,
    alignment: usize,
    status: &mut Status,
) -> *mut HostLoad {
    guard(status, || {
        let requests = requests.core(source.path())?;
        let (plan, files) = source.with(|s| UploadPlan::of(s, requests.as_deref(), alignment))?;
        Ok(handed_over(HostLoad { plan, files }))
    })
}

impl HostLoad {
    pub fn total_bytes(&self) -> usize {
        // A plan whose total does not fit in memory cannot be allocated: C++ reports it when
        // the allocation fails, so saturating here loses nothing.
        usize::try_from(self.plan.total()).unwrap_or(usize::MAX)
    }

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

    pub fn read_into(&self, dst: &mut [u8], status: &mut Status) {
        guard(status, || self.plan.read_into(&self.files, dst))
    }
}

pub fn residency(source: &Source, requests: &RequestList, what: Residency, status: &mut Status) {
    guard(status, || {
        let act = match what {
            Residency::Lock => residency::lock,
            Residency::Unlock => residency::unlock,
            Residency::Release => residency::release,
            Residency { repr } => {
                return Err(Error::InvalidSlice {
                    tensor: String::new(),
                    reason: format!(
                        "residency value {repr} is not Lock (0), Unlock (1) or Release (2)"
                    ),
                })
            }
        };
        let requests = requests.core(source.path())?;
        let plan = source.with(|s| Plan::of(s, requests.as_deref()))?;
        source.each_file(|file| act(file, &plan))
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use safetensors_core::{serialize_to_file, Dtype, ErrorKind, TensorView};

    use super::*;
    use crate::file::ffi::{Backend, Populate};
    use crate::status::{adopt, outcome};
    use crate::stream::{new_request_list, source_of_file};

    #[test]
    fn residency_that_names_none_is_an_error_not_a_guess() {
        let dir = std::env::temp_dir().join(format!("st-cxx-{}-residency", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.safetensors");
        let data = [3u8; 64];
        serialize_to_file(
            [("w", TensorView::new(Dtype::U8, &[64], &data))],
            None,
            &path,
        )
        .unwrap();
        let file = adopt(
            outcome(|s| {
                crate::file::open_file(
                    crate::status::Bytes::of(path.as_os_str().as_bytes()),
                    Backend::Mmap,
                    false,
                    Populate::Lazy,
                    false,
                    s,
                )
            })
            .unwrap(),
        );
        let all = adopt(outcome(|s| new_request_list(true, &[], &[], &[], s)).unwrap());
        let source = source_of_file(&file);
        let err = outcome(|s| residency(&source, &all, Residency { repr: 7 }, s)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidSlice as u8, "{}", err.message);
        assert!(err.message.contains("residency value 7"), "{}", err.message);
        outcome(|s| residency(&source, &all, Residency::Release, s)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
