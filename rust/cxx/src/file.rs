//! Glue for `File`: an open safetensors file as C++ sees it.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use safetensors_core::{fallible, Backend, Error, Indexer, OpenOptions, SafeFile, TensorInfo};

use crate::ffi::{ByteRun, SliceIndex, Status};
use crate::{guard, handed_over, native_path, Metadata, TensorMeta};

/// An open file plus what C++ asks for repeatedly, prepared once. Shared with a checkpoint when
/// it is one of its shards.
pub struct File {
    inner: Arc<SafeFile>,
    metadata: Metadata,
    sorted: OnceLock<Vec<u32>>,
}

/// A planned slice of one tensor.
pub struct SlicePlan {
    plan: safetensors_core::SlicePlan,
    index: usize,
    begin: usize,
}

pub(crate) fn backend(code: u8) -> Backend {
    match code {
        0 => Backend::Mmap,
        2 => Backend::Direct,
        _ => Backend::Read,
    }
}

impl File {
    pub(crate) fn wrap(inner: Arc<SafeFile>) -> File {
        let metadata = Metadata::new(inner.header().metadata());
        File {
            inner,
            metadata,
            sorted: OnceLock::new(),
        }
    }
}

/// Opens `path` with backend 0 (mmap), 1 (read) or 2 (direct), accepting trailing bytes when
/// asked.
pub fn open_file(
    path: &[u8],
    backend_code: u8,
    allow_trailing_bytes: bool,
    status: &mut Status,
) -> *mut File {
    guard(status, || {
        let options = OpenOptions {
            backend: backend(backend_code),
            allow_trailing_bytes,
        };
        let inner = SafeFile::open_with(native_path(path), options)?;
        Ok(handed_over(File::wrap(Arc::new(inner))))
    })
}

/// C++ memory lent to a `File` (see `open_memory`): an address and a length, read only, and
/// the C++ owner that keeps them alive, released when the core drops the bytes. The core holds
/// its files in `Arc`s (streams, prefetches and uploads keep theirs), so the bytes live exactly
/// as long as the last reader, whichever object the user drops first.
struct Lent {
    ptr: *const u8,
    len: usize,
    /// Never read: held so that it is released when the bytes are dropped.
    _owner: Option<Owner>,
}

/// A C++ owner: `release(context)` lets it go.
struct Owner {
    release: extern "C" fn(*mut c_void),
    context: *mut c_void,
}

impl Drop for Owner {
    fn drop(&mut self) {
        (self.release)(self.context);
    }
}

// SAFETY: the bytes are only read, and `open_memory`'s contract keeps them alive and unchanged
// until the owner is released, whichever thread uses or releases them (C++'s release drops a
// `std::shared_ptr`, which any thread may do).
unsafe impl Send for Lent {}
unsafe impl Sync for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: see `open_memory`: the caller keeps `len` bytes at `ptr` alive and unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Validates a complete file held by C++ and borrows it (no copy), like a mapping.
///
/// # Safety
/// `data` must stay alive, unmoved and unmodified until `release(owner)` is called (with no
/// owner, `release` 0, until the returned `File` and everything that shares its core file, such
/// as streams and prefetches, is dropped). `release` is 0 or the address of an
/// `extern "C" void(void*)` that may be called once from any thread. The only caller,
/// `SafeOpen::from_bytes` in `include/safetensors/safe_open.hpp`, passes a heap copy of the
/// caller's keep-alive `std::shared_ptr` and a function that deletes it.
pub unsafe fn open_memory(
    data: &[u8],
    name: &[u8],
    allow_trailing_bytes: bool,
    release: usize,
    owner: usize,
    status: &mut Status,
) -> *mut File {
    // Taken first, so that the owner is released on every path, errors included.
    let owner = (release != 0).then(|| Owner {
        // SAFETY: the caller passes the address of such a function (see above).
        release: unsafe { std::mem::transmute::<usize, extern "C" fn(*mut c_void)>(release) },
        context: owner as *mut c_void,
    });
    guard(status, || {
        let lent = Lent {
            ptr: data.as_ptr(),
            len: data.len(),
            _owner: owner,
        };
        let options = OpenOptions {
            allow_trailing_bytes,
            ..OpenOptions::default()
        };
        let inner = SafeFile::from_memory(native_path(name), Box::new(lent), options)?;
        Ok(handed_over(File::wrap(Arc::new(inner))))
    })
}

fn meta(
    index: usize,
    info: &TensorInfo<'_>,
    (shape_start, shape_len): (usize, usize),
) -> TensorMeta {
    TensorMeta {
        index,
        dtype: info.dtype as u8,
        begin: info.data_offsets.0,
        end: info.data_offsets.1,
        shape_start,
        shape_len,
    }
}

impl File {
    /// The core file, shared, for the other glue modules.
    pub fn shared(&self) -> Arc<SafeFile> {
        self.inner.clone()
    }

    /// The core file, borrowed.
    pub(crate) fn core(&self) -> &SafeFile {
        &self.inner
    }

    pub fn tensor_count(&self) -> usize {
        self.inner.header().len()
    }

    pub fn trailing_bytes(&self) -> u64 {
        self.inner.trailing_bytes()
    }

    pub fn find(&self, name: &[u8], status: &mut Status) -> TensorMeta {
        guard(status, || {
            let index = usize::try_from(self.position(name)).map_err(|_| {
                Error::TensorNotFound {
                    name: String::from_utf8_lossy(name).into_owned(),
                }
                .in_file(self.inner.path())
            })?;
            Ok(self.meta_at(index))
        })
    }

    pub fn position(&self, name: &[u8]) -> isize {
        self.inner
            .header()
            .position_bytes(name)
            .map_or(-1, |i| i as isize)
    }

    pub fn meta_at(&self, index: usize) -> TensorMeta {
        let header = self.inner.header();
        match (header.at(index), header.shape_span(index)) {
            (Some(info), Some(span)) => meta(index, &info, span),
            _ => TensorMeta {
                index,
                ..TensorMeta::default()
            },
        }
    }

    pub fn dims(&self) -> &[usize] {
        self.inner.header().dims()
    }

    pub fn name_at(&self, index: usize) -> &str {
        self.inner.header().at(index).map_or("", |t| t.name)
    }

    pub fn sorted_name(&self, k: usize) -> &str {
        // The cached order is published by a `OnceLock` inside this (uninstrumented) library.
        // Handing C++ the names, which were written before the file was shared, rather than the
        // cached slice keeps ThreadSanitizer builds of C++ engines free of false reports.
        let order = self
            .sorted
            .get_or_init(|| self.inner.header().sorted_positions());
        order.get(k).map_or("", |&i| self.name_at(i as usize))
    }

    pub fn has_metadata(&self) -> bool {
        self.inner.header().metadata().is_some()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn mapped_data(&self) -> &[u8] {
        self.inner.mapped_data().unwrap_or(&[])
    }

    pub fn is_mapped(&self) -> bool {
        self.inner.mapped_data().is_some()
    }

    pub fn header_len(&self) -> usize {
        self.inner.header().header_len()
    }

    pub fn data_len(&self) -> usize {
        self.inner.header().data_len()
    }

    pub fn read_data(&self, offset: u64, dst: &mut [u8], status: &mut Status) {
        guard(status, || self.inner.read_data(offset, dst))
    }

    pub fn bytes_read(&self) -> u64 {
        self.inner.bytes_read()
    }

    pub fn plan_slice(
        &self,
        index: usize,
        indexers: &[SliceIndex],
        status: &mut Status,
    ) -> *mut SlicePlan {
        guard(status, || {
            let info = self.tensor_at(index)?;
            let indexers: Vec<Indexer> = indexers.iter().map(indexer).collect();
            let plan = safetensors_core::SlicePlan::new(&info, &indexers)
                .map_err(|e| e.in_file(self.inner.path()))?;
            Ok(handed_over(SlicePlan {
                plan,
                index,
                begin: info.data_offsets.0,
            }))
        })
    }

    pub fn read_slice(&self, plan: &SlicePlan, dst: &mut [u8], status: &mut Status) {
        guard(status, || {
            let info = self.tensor_at(plan.index)?;
            self.inner.read_slice_of(&info, &plan.plan, dst)
        })
    }

    fn tensor_at(&self, index: usize) -> Result<TensorInfo<'_>, Error> {
        self.inner
            .header()
            .at(index)
            .ok_or_else(|| Error::TensorNotFound {
                name: format!("#{index}"),
            })
    }
}

pub(crate) fn indexer(i: &SliceIndex) -> Indexer {
    match i.kind {
        0 => Indexer::Select(i.start),
        _ => Indexer::Range {
            start: i.has_start.then_some(i.start),
            stop: i.has_stop.then_some(i.stop),
            step: i.step,
        },
    }
}

impl SlicePlan {
    /// Position in file order of the tensor this plan slices.
    pub(crate) fn tensor_index(&self) -> usize {
        self.index
    }

    pub fn shape(&self) -> &[usize] {
        self.plan.shape()
    }

    pub fn byte_len(&self) -> usize {
        self.plan.byte_len()
    }

    /// Runs relative to the start of the data buffer.
    pub fn runs(&self, status: &mut Status) -> Vec<ByteRun> {
        guard(status, || {
            // As many runs as elements for a strided selection: grown fallibly.
            let mut out = Vec::new();
            for (offset, len) in self.plan.runs() {
                let run = ByteRun {
                    offset: (self.begin + offset) as u64,
                    length: len as u64,
                };
                fallible::push(&mut out, run, "a selection's runs")?;
            }
            Ok(out)
        })
    }

    /// The first run's offset, relative to the data buffer (0 for an empty selection).
    pub fn first_offset(&self) -> u64 {
        self.plan
            .extent()
            .map_or(0, |(lo, _)| (self.begin + lo) as u64)
    }

    /// The core's plan.
    pub(crate) fn core(&self) -> &safetensors_core::SlicePlan {
        &self.plan
    }

    /// Whether the slice is at most one contiguous run (so a view into the mapping can serve it).
    pub fn contiguous(&self) -> bool {
        let mut runs = self.plan.runs();
        runs.next();
        runs.next().is_none()
    }
}
