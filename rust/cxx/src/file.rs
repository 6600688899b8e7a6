//! `File`: an open safetensors file as C++ sees it (its bridge and glue), with the metadata
//! map, slice plans, and the direct backend's aligned reads.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

use safetensors_core::{
    Error, Indexer, MetadataList, OpenOptions, SafeFile, SortedNames, TensorInfo,
};

use crate::status::{guard, lent, lent_mut, Bytes, BytesMut, Fallback, Sizes, Status};
use crate::status::{handed_over, native_path};
mod direct;
mod slice_plan;

pub use direct::direct_align;
pub(crate) use slice_plan::indexers;

use ffi::{Backend, NamesMut, Populate, SliceIndices, TensorMeta};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        type Status = crate::status::ffi::Status;
        type Bytes = crate::status::ffi::Bytes;
        type BytesMut = crate::status::ffi::BytesMut;
        type Sizes = crate::status::ffi::Sizes;
    }

    /// How a file's tensor bytes are reached: `safetensors::Backend`'s values.
    #[derive(Debug)]
    #[repr(u8)]
    enum Backend {
        Mmap = 0,
        Read = 1,
        Direct = 2,
    }

    /// When a mapped file's pages are brought in: `safetensors::Populate`'s values.
    #[derive(Debug)]
    #[repr(u8)]
    enum Populate {
        Lazy = 0,
        AtOpen = 1,
        Background = 2,
    }

    /// One tensor: position in file order, dtype index, data offsets, and where its shape is in
    /// `File::dims` (so that C++ reads it without another call).
    #[derive(Debug, Clone, Copy, Default)]
    struct TensorMeta {
        index: usize,
        dtype: u8,
        begin: usize,
        end: usize,
        shape_start: usize,
        shape_len: usize,
    }

    /// What one dimension of a selection takes.
    #[derive(Debug)]
    #[repr(u8)]
    enum SliceKind {
        /// The position `start` (the dimension is dropped).
        Select = 0,
        /// The range `start:stop:step`.
        Range = 1,
    }

    /// One dimension of a slice request: `Select` takes `start`; `Range` is `start:stop:step`,
    /// with `has_start`/`has_stop` false for an omitted bound.
    #[derive(Debug, Clone, Copy)]
    struct SliceIndex {
        kind: SliceKind,
        start: i64,
        stop: i64,
        step: i64,
        has_start: bool,
        has_stop: bool,
    }

    /// A contiguous byte run, relative to the start of the file's data buffer.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct ByteRun {
        offset: u64,
        length: u64,
    }

    /// Slice indices C++ lends for one call (see `Bytes` in the status bridge).
    #[derive(Debug, Clone, Copy)]
    struct SliceIndices {
        data: *const SliceIndex,
        len: usize,
    }

    /// Room for byte runs, which a call fills.
    #[derive(Debug)]
    struct ByteRunsMut {
        data: *mut ByteRun,
        len: usize,
    }

    /// Room for names, which a call fills with spans of names that live as long as the file.
    #[derive(Debug)]
    struct NamesMut {
        data: *mut Bytes,
        len: usize,
    }

    extern "Rust" {
        /// A metadata map as sorted (key, value) pairs, walked by index.
        #[derive(ExternType)]
        type Metadata;
        /// Number of entries.
        fn len(self: &Metadata) -> usize;
        /// Key `i` in sorted order ("" out of range).
        fn key(self: &Metadata, i: usize) -> &str;
        /// Value of key `i` ("" out of range).
        fn value(self: &Metadata, i: usize) -> &str;

        /// An open safetensors file (mapped, or read on demand).
        #[derive(ExternType)]
        type File;

        /// Opens and validates `path` (raw bytes of a native path) with `backend`;
        /// `allow_trailing_bytes` accepts bytes after the last tensor; `populate` and
        /// `huge_pages` are the mapping's controls. Null on failure.
        fn open_file(
            path: Bytes,
            backend: Backend,
            allow_trailing_bytes: bool,
            populate: Populate,
            huge_pages: bool,
            status: &mut Status,
        ) -> *mut File;
        /// Validates a complete file in memory. The File borrows `data` and owns `owner`, which
        /// keeps it alive: `release` (the address of a C function `void(void*)`, or 0 for no
        /// owner) is called with `owner` once, when the last user of the bytes (the File, a
        /// stream, a prefetch, an upload) lets go, on whichever thread that is. Until then the
        /// bytes stay alive, unmoved and unchanged. `name` is for messages. On failure,
        /// `release(owner)` has been called before the call returns.
        unsafe fn open_memory(
            data: Bytes,
            name: Bytes,
            allow_trailing_bytes: bool,
            release: usize,
            owner: usize,
            status: &mut Status,
        ) -> *mut File;
        /// Bytes after the last tensor (0 unless allowed at open).
        fn trailing_bytes(self: &File) -> u64;

        /// Number of tensors.
        fn tensor_count(self: &File) -> usize;
        /// The tensor named `name`, or a `TensorNotFound` error naming the file.
        fn find(self: &File, name: Bytes, status: &mut Status) -> TensorMeta;
        /// Position of `name` in file order, or -1.
        fn position(self: &File, name: Bytes) -> isize;
        /// The tensor at `index` in file order (all zero when out of range).
        fn meta_at(self: &File, index: usize) -> TensorMeta;
        /// Name of the tensor at `index` in file order.
        fn name_at(self: &File, index: usize) -> &str;
        /// Every tensor's dimensions back to back; `TensorMeta::shape_start/len` index it. They
        /// live as long as the file.
        fn dims(self: &File) -> Sizes;
        /// Tensor names in byte-wise order, from the `first`-th on, as many as `out` holds and
        /// there are: many per call. The order is computed once and read only on the Rust side,
        /// so C++ never reads memory whose publication it cannot see (see `File::sorted`).
        fn sorted_names(self: &File, first: usize, out: NamesMut);
        /// Whether the header has a `__metadata__` map (`null` counts as absent).
        fn has_metadata(self: &File) -> bool;
        /// The `__metadata__` entries (none when absent).
        fn metadata(self: &File) -> &Metadata;
        /// Every byte of the file in memory, from the length prefix on, when mapped or in
        /// memory (mapped now if its mapping was deferred, which can fail); empty with the read
        /// and direct backends. The data buffer starts `8 + header_len()` bytes in. The bytes
        /// live as long as the file.
        fn mapped_file(self: &File, status: &mut Status) -> Bytes;
        /// Whether the file is mapped, or will be at its first access of tensor bytes (the
        /// mapped backend, and bytes in memory).
        fn is_mapped(self: &File) -> bool;
        /// The header length `N`.
        fn header_len(self: &File) -> usize;
        /// Length of the data buffer.
        fn data_len(self: &File) -> usize;
        /// Copies data-buffer bytes `[offset, offset + dst.len())` into `dst`.
        fn read_data(self: &File, offset: u64, dst: BytesMut, status: &mut Status);
        /// Copies all of the tensor at `index` into `dst`, which holds exactly its bytes.
        fn read_tensor_at(self: &File, index: usize, dst: BytesMut, status: &mut Status);
        /// Data bytes fetched by the read backend so far.
        fn bytes_read(self: &File) -> u64;
        /// Plans a slice of the tensor at `index` in file order. Null on failure.
        fn plan_slice(
            self: &File,
            index: usize,
            indexers: SliceIndices,
            status: &mut Status,
        ) -> *mut SlicePlan;
        /// Copies the bytes `plan` selects into `dst` (exactly `plan.byte_len()` bytes).
        fn read_slice(self: &File, plan: &SlicePlan, dst: BytesMut, status: &mut Status);

        /// The backend (bytes in memory: `Mmap`).
        fn backend(self: &File) -> Backend;
        /// With the direct backend, why reads fell back to `pread` ("" while they bypass the
        /// page cache, and for the other backends).
        fn direct_fallback(self: &File) -> &str;

        /// A planned slice: the new shape and the byte runs, no data.
        #[derive(ExternType)]
        type SlicePlan;
        /// Shape of the slice (living as long as the plan).
        fn shape(self: &SlicePlan) -> Sizes;
        /// Bytes in the slice.
        fn byte_len(self: &SlicePlan) -> usize;
        /// Number of runs, touching runs merged, as `write_runs` writes them.
        fn run_count(self: &SlicePlan, status: &mut Status) -> usize;
        /// Writes the runs, in order, relative to the data buffer, into `out`, which has room
        /// for exactly `run_count()` of them (else `Internal`).
        fn write_runs(self: &SlicePlan, out: ByteRunsMut, status: &mut Status);
        /// Whether the slice is at most one contiguous run.
        fn contiguous(self: &SlicePlan) -> bool;
        /// Where the first run starts, relative to the data buffer (0 when empty).
        fn first_offset(self: &SlicePlan) -> u64;

        /// Alignment of the direct backend's reads (offsets, lengths and memory).
        fn direct_align() -> usize;
        /// Bytes `read_data_aligned` needs for data bytes `[offset, offset + len)`.
        fn aligned_len(self: &File, offset: u64, len: usize, status: &mut Status) -> usize;
        /// Reads data bytes `[offset, offset + len)` into the aligned `dst` (straight from the
        /// disk with the direct backend) and returns where they start in it.
        fn read_data_aligned(
            self: &File,
            offset: u64,
            len: usize,
            dst: BytesMut,
            status: &mut Status,
        ) -> usize;
    }

    // Objects handed over by address (null on failure) are adopted by C++ as `rust::Box`es:
    // their `Box` glue is generated here, as no signature names it.
    impl Box<File> {}
    impl Box<SlicePlan> {}
}

impl Fallback for TensorMeta {
    fn fallback() -> Self {
        TensorMeta::default()
    }
}

/// A metadata map as the sorted pairs C++ walks by index (out of range: ""): the core's
/// listing of it, in the core's order.
pub struct Metadata(MetadataList);

impl Metadata {
    pub(crate) fn new(map: Option<&BTreeMap<String, String>>) -> Metadata {
        Metadata(MetadataList::of(map))
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn key(&self, i: usize) -> &str {
        self.0.get(i).map_or("", |(k, _)| k)
    }
    pub fn value(&self, i: usize) -> &str {
        self.0.get(i).map_or("", |(_, v)| v)
    }
}

/// An open file plus what C++ asks for repeatedly, prepared once. Shared with a checkpoint when
/// it is one of its shards.
pub struct File {
    inner: Arc<SafeFile>,
    metadata: Metadata,
    sorted: SortedNames,
}

/// A planned slice of one tensor.
pub struct SlicePlan {
    /// Shared with the multi-rank plans it is handed to (see `Need::slice`).
    plan: Arc<safetensors_core::SlicePlan>,
    index: usize,
    begin: usize,
}

/// The core's backend; a value that names none (C++ can `static_cast` any byte) is an error,
/// never a silent choice of one.
pub(crate) fn backend(b: Backend) -> Result<safetensors_core::Backend, Error> {
    match b {
        Backend::Mmap => Ok(safetensors_core::Backend::Mmap),
        Backend::Read => Ok(safetensors_core::Backend::Read),
        Backend::Direct => Ok(safetensors_core::Backend::Direct),
        Backend { repr } => Err(Error::InvalidSlice {
            tensor: String::new(),
            reason: format!("backend value {repr} is not Mmap (0), Read (1) or Direct (2)"),
        }),
    }
}

/// The core's `Populate`; a value that names none is an error, as for `backend`.
pub(crate) fn populate(p: Populate) -> Result<safetensors_core::Populate, Error> {
    match p {
        Populate::Lazy => Ok(safetensors_core::Populate::Lazy),
        Populate::AtOpen => Ok(safetensors_core::Populate::AtOpen),
        Populate::Background => Ok(safetensors_core::Populate::Background),
        Populate { repr } => Err(Error::InvalidSlice {
            tensor: String::new(),
            reason: format!("populate value {repr} is not Lazy (0), AtOpen (1) or Background (2)"),
        }),
    }
}

impl File {
    pub(crate) fn wrap(inner: Arc<SafeFile>) -> File {
        let metadata = Metadata::new(inner.header().metadata());
        File {
            inner,
            metadata,
            sorted: SortedNames::new(),
        }
    }
}

/// Opens `path` with `backend`, accepting trailing bytes when asked, with the mapping's controls.
pub fn open_file(
    path: Bytes,
    backend: Backend,
    allow_trailing_bytes: bool,
    populate: Populate,
    huge_pages: bool,
    status: &mut Status,
) -> *mut File {
    // SAFETY: C++ lends the path's bytes for this call (`detail::bytes`).
    let path = unsafe { path.get() };
    guard(status, || {
        let options = OpenOptions {
            backend: self::backend(backend)?,
            allow_trailing_bytes,
            populate: self::populate(populate)?,
            huge_pages,
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
    data: Bytes,
    name: Bytes,
    allow_trailing_bytes: bool,
    release: usize,
    owner: usize,
    status: &mut Status,
) -> *mut File {
    // SAFETY: C++ lends the name for this call; `data` is kept as its address and length only
    // (see `Lent`).
    let name = unsafe { name.get() };
    // Taken first, so that the owner is released on every path, errors included.
    let owner = (release != 0).then(|| Owner {
        // SAFETY: the caller passes the address of such a function (see above).
        release: unsafe { std::mem::transmute::<usize, extern "C" fn(*mut c_void)>(release) },
        context: owner as *mut c_void,
    });
    guard(status, || {
        let lent = Lent {
            ptr: data.data,
            len: data.len,
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

    pub fn find(&self, name: Bytes, status: &mut Status) -> TensorMeta {
        // SAFETY: C++ lends the name for this call (`detail::bytes`).
        let name = unsafe { name.get() };
        guard(status, || {
            let index = usize::try_from(self.index_of(name))
                .map_err(|_| safetensors_core::tensor_not_found(name, self.inner.path()))?;
            Ok(self.meta_at(index))
        })
    }

    pub fn position(&self, name: Bytes) -> isize {
        // SAFETY: C++ lends the name for this call (`detail::bytes`).
        self.index_of(unsafe { name.get() })
    }

    /// Position of `name` in file order, or -1.
    pub(crate) fn index_of(&self, name: &[u8]) -> isize {
        self.inner
            .header()
            .position_bytes(name)
            .map_or(-1, |i| i as isize)
    }

    pub fn meta_at(&self, index: usize) -> TensorMeta {
        match self.inner.header().placement(index) {
            Some(p) => TensorMeta {
                index,
                dtype: p.dtype as u8,
                begin: p.data_offsets.0,
                end: p.data_offsets.1,
                shape_start: p.shape_span.0,
                shape_len: p.shape_span.1,
            },
            None => TensorMeta {
                index,
                ..TensorMeta::default()
            },
        }
    }

    pub fn dims(&self) -> Sizes {
        Sizes::of(self.inner.header().dims())
    }

    pub fn name_at(&self, index: usize) -> &str {
        self.inner.header().name_at(index).unwrap_or("")
    }

    pub fn sorted_names(&self, first: usize, out: NamesMut) {
        // The core's name order, sorted once and published inside this (uninstrumented)
        // library. Handing C++ the names, which were written before the file was shared, in
        // room of its own, rather than the cached slice, keeps ThreadSanitizer builds of C++
        // engines free of false reports.
        let order = self.sorted.order(self.inner.header());
        // SAFETY: C++ lends the room for this call (`NamesMut`).
        let room = unsafe { lent_mut(out.data, out.len) };
        for (slot, &i) in room.iter_mut().zip(order.iter().skip(first)) {
            *slot = Bytes::of(self.name_at(i as usize).as_bytes());
        }
    }

    pub fn has_metadata(&self) -> bool {
        self.inner.header().metadata().is_some()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn mapped_file(&self, status: &mut Status) -> Bytes {
        guard(status, || {
            Ok(Bytes::of(self.inner.mapped_file()?.unwrap_or(&[])))
        })
    }

    pub fn is_mapped(&self) -> bool {
        self.inner.backend() == safetensors_core::Backend::Mmap
    }

    pub fn header_len(&self) -> usize {
        self.inner.header().header_len()
    }

    pub fn data_len(&self) -> usize {
        self.inner.header().data_len()
    }

    pub fn read_data(&self, offset: u64, mut dst: BytesMut, status: &mut Status) {
        // SAFETY: C++ lends `dst` for this call, outside the file's memory (`refuse_overlap`).
        let dst = unsafe { dst.get() };
        guard(status, || self.inner.read_data(offset, dst))
    }

    pub fn read_tensor_at(&self, index: usize, mut dst: BytesMut, status: &mut Status) {
        // SAFETY: C++ lends `dst` for this call, outside the file's memory (`refuse_overlap`).
        let dst = unsafe { dst.get() };
        guard(status, || {
            self.inner.read_tensor(&self.tensor_at(index)?, dst)
        })
    }

    pub fn bytes_read(&self) -> u64 {
        self.inner.bytes_read()
    }

    pub fn plan_slice(
        &self,
        index: usize,
        indexers: SliceIndices,
        status: &mut Status,
    ) -> *mut SlicePlan {
        // SAFETY: C++ lends the indices for this call.
        let indexers = unsafe { lent(indexers.data, indexers.len) };
        guard(status, || {
            let info = self.tensor_at(index)?;
            let indexers = self::indexers(indexers)?;
            self.plan_of(index, &info, &indexers)
        })
    }

    /// The plan of `indexers` over the tensor `info` at `index`, handed over to C++.
    pub(crate) fn plan_of(
        &self,
        index: usize,
        info: &TensorInfo<'_>,
        indexers: &[Indexer],
    ) -> Result<*mut SlicePlan, Error> {
        let plan = safetensors_core::SlicePlan::new(info, indexers)
            .map_err(|e| e.in_file(self.inner.path()))?;
        Ok(handed_over(SlicePlan {
            plan: Arc::new(plan),
            index,
            begin: info.data_offsets.0,
        }))
    }

    pub fn read_slice(&self, plan: &SlicePlan, mut dst: BytesMut, status: &mut Status) {
        // SAFETY: C++ lends `dst` for this call, outside the file's memory (`refuse_overlap`).
        let dst = unsafe { dst.get() };
        guard(status, || {
            let info = self.tensor_at(plan.index)?;
            self.inner.read_slice_of(&info, &plan.plan, dst)
        })
    }

    pub(crate) fn tensor_at(&self, index: usize) -> Result<TensorInfo<'_>, Error> {
        self.inner
            .header()
            .at(index)
            .ok_or_else(|| Error::TensorNotFound {
                name: format!("#{index}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use safetensors_core::ErrorKind;

    use super::ffi::{SliceIndex, SliceKind};
    use super::slice_plan::indexer;
    use super::*;
    use crate::status::outcome;

    /// What a C++ `static_cast` can make of any byte: a code that names nothing.
    #[test]
    fn a_backend_or_slice_kind_that_names_none_is_an_error_not_a_guess() {
        for repr in [3u8, 7, 255] {
            let err = outcome(|s| {
                open_file(
                    Bytes::of(b"/nonexistent"),
                    Backend { repr },
                    false,
                    Populate::Lazy,
                    false,
                    s,
                )
            })
            .map(|_| ())
            .unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidSlice as u8, "{}", err.message);
            assert!(
                err.message.contains(&format!("backend value {repr}")),
                "{}",
                err.message
            );
            let err = outcome(|s| {
                open_file(
                    Bytes::of(b"/nonexistent"),
                    Backend::Read,
                    false,
                    Populate { repr },
                    false,
                    s,
                )
            })
            .map(|_| ())
            .unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidSlice as u8, "{}", err.message);
            assert!(
                err.message.contains(&format!("populate value {repr}")),
                "{}",
                err.message
            );
        }
        let odd = SliceIndex {
            kind: SliceKind { repr: 2 },
            start: 0,
            stop: 0,
            step: 1,
            has_start: true,
            has_stop: false,
        };
        let err = indexer(&odd).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSlice);
        assert!(err.to_string().contains("kind 2"), "{err}");
        // The codes that do name something still work.
        let range = SliceIndex {
            kind: SliceKind::Range,
            ..odd
        };
        assert_eq!(indexers(&[range]).unwrap().len(), 1);
    }
}
