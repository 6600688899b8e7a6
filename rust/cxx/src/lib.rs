//! The C++ bridge: one `#[cxx::bridge]` module and thin glue over `safetensors-core`.
//!
//! Users never see these types: `include/safetensors/*.hpp` wraps them in the public C++20 API.
//!
//! No call across this bridge throws or panics, so that the headers work in programs built
//! without exceptions (`-fno-exceptions`), where cxx's `Result` would abort the process:
//! - every fallible function takes a `&mut Status` last, runs inside [`guard`] (which also turns
//!   a panic into an `Internal` error), and reports its outcome there: `ok`, or the error's
//!   numeric kind and message. On failure it returns a harmless placeholder (0, empty, null);
//!   functions that make a Rust object return it as a raw pointer, null on failure, which C++
//!   adopts with `rust::Box::from_raw`;
//! - every infallible accessor is total: an index out of range gives an empty value, never a
//!   panic (the C++ wrappers only pass valid indices anyway).

mod checkpoint;
mod convert;
mod cuda;
mod distributed;
mod file;
mod status;
mod stream;
mod version;
mod writer;

use std::collections::BTreeMap;

use safetensors_core::{Dtype, ErrorKind};
// The C API (include/safetensors.h) lives in the same archive as this bridge, so that a program
// using both links one copy of the core and of Rust's standard library. Naming the crate links
// it in; its `#[no_mangle]` functions are then part of this staticlib.
use safetensors_capi as _;

pub use checkpoint::{open_checkpoint, Checkpoint};
pub use convert::{
    convert_tensor, dequantize_fp8_blocks, dequantize_mxfp4, mxfp4_output_shape, tensor_byte_len,
};
pub use cuda::{
    cuda_built, cuda_device_count, cuda_device_name, cuda_download, cuda_free,
    cuda_pinned_copy_seconds, cuda_shared_upload, new_device_stage, new_upload_job, new_uploader,
    DeviceStage, UploadJob, Uploader,
};
pub use distributed::{new_dist_plan_builder, tp_indices, DistPlan, DistPlanBuilder};
pub use file::{open_file, open_memory, File, SlicePlan};
pub(crate) use status::guard;
pub use stream::{
    advise_file, direct_align, new_request_list, prefetch_checkpoint, prefetch_file,
    stream_checkpoint, stream_file, PrefetchJob, RequestList, StreamTensor, TensorStream,
};
pub use writer::{new_writer, Writer};

#[cxx::bridge(namespace = "safetensors::ffi")]
mod ffi {
    // ---- shared structs ------------------------------------------------------------------

    /// How a fallible call ended. C++ passes a fresh one (`ok` false) to every fallible call,
    /// which sets `ok`, or the error's kind (`safetensors::ErrorKind`'s value) and message.
    #[derive(Debug, Default)]
    struct Status {
        ok: bool,
        kind: u8,
        message: String,
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

    /// One dimension of a slice request: `kind` 0 selects `start`; 1 is the range
    /// `start:stop:step`, with `has_start`/`has_stop` false for an omitted bound.
    #[derive(Debug, Clone, Copy)]
    struct SliceIndex {
        kind: u8,
        start: i64,
        stop: i64,
        step: i64,
        has_start: bool,
        has_stop: bool,
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

    /// A contiguous byte run, relative to the start of the file's data buffer.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct ByteRun {
        offset: u64,
        length: u64,
    }

    // ---- files (glue in file.rs; cold-read queries in stream.rs) ---------------------------

    extern "Rust" {
        /// A metadata map as sorted (key, value) pairs, walked by index.
        type Metadata;
        /// Number of entries.
        fn len(self: &Metadata) -> usize;
        /// Key `i` in sorted order ("" out of range).
        fn key(self: &Metadata, i: usize) -> &str;
        /// Value of key `i` ("" out of range).
        fn value(self: &Metadata, i: usize) -> &str;

        /// An open safetensors file (mapped, or read on demand).
        type File;

        /// Opens and validates `path` (raw bytes of a native path). `backend`: 0 mmap, 1 read,
        /// 2 direct. `allow_trailing_bytes` accepts bytes after the last tensor. Null on failure.
        fn open_file(
            path: &[u8],
            backend: u8,
            allow_trailing_bytes: bool,
            status: &mut Status,
        ) -> *mut File;
        /// Validates a complete file in memory. The File borrows `data` and owns `owner`, which
        /// keeps it alive: `release` (the address of a C function `void(void*)`, or 0 for no
        /// owner) is called with `owner` once, when the last user of the bytes (the File, a
        /// stream, a prefetch, an upload) lets go, on whichever thread that is. Until then the
        /// bytes stay alive, unmoved and unchanged. `name` is for messages. On failure,
        /// `release(owner)` has been called before the call returns.
        unsafe fn open_memory(
            data: &[u8],
            name: &[u8],
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
        fn find(self: &File, name: &[u8], status: &mut Status) -> TensorMeta;
        /// Position of `name` in file order, or -1.
        fn position(self: &File, name: &[u8]) -> isize;
        /// The tensor at `index` in file order (all zero when out of range).
        fn meta_at(self: &File, index: usize) -> TensorMeta;
        /// Name of the tensor at `index` in file order.
        fn name_at(self: &File, index: usize) -> &str;
        /// Every tensor's dimensions back to back; `TensorMeta::shape_start/len` index it.
        fn dims(self: &File) -> &[usize];
        /// Name of the `k`-th tensor in byte-wise name order ("" out of range). The order is
        /// computed once and read only on the Rust side, so C++ never reads memory whose
        /// publication it cannot see (see `File::sorted`).
        fn sorted_name(self: &File, k: usize) -> &str;
        /// Whether the header has a `__metadata__` map (`null` counts as absent).
        fn has_metadata(self: &File) -> bool;
        /// The `__metadata__` entries (none when absent).
        fn metadata(self: &File) -> &Metadata;
        /// The data buffer when mapped; empty with the read backend.
        fn mapped_data(self: &File) -> &[u8];
        /// Whether the file is mapped.
        fn is_mapped(self: &File) -> bool;
        /// The header length `N`.
        fn header_len(self: &File) -> usize;
        /// Length of the data buffer.
        fn data_len(self: &File) -> usize;
        /// Copies data-buffer bytes `[offset, offset + dst.len())` into `dst`.
        fn read_data(self: &File, offset: u64, dst: &mut [u8], status: &mut Status);
        /// Data bytes fetched by the read backend so far.
        fn bytes_read(self: &File) -> u64;
        /// Plans a slice of the tensor at `index` in file order. Null on failure.
        fn plan_slice(
            self: &File,
            index: usize,
            indexers: &[SliceIndex],
            status: &mut Status,
        ) -> *mut SlicePlan;
        /// Copies the bytes `plan` selects into `dst` (exactly `plan.byte_len()` bytes).
        fn read_slice(self: &File, plan: &SlicePlan, dst: &mut [u8], status: &mut Status);

        /// The backend: 0 mmap, 1 read, 2 direct.
        fn backend_code(self: &File) -> u8;
        /// With the direct backend, why reads fell back to `pread` ("" while they bypass the
        /// page cache, and for the other backends).
        fn direct_fallback(self: &File) -> &str;

        /// A planned slice: the new shape and the byte runs, no data.
        type SlicePlan;
        /// Shape of the slice.
        fn shape(self: &SlicePlan) -> &[usize];
        /// Bytes in the slice.
        fn byte_len(self: &SlicePlan) -> usize;
        /// The runs, in order, relative to the data buffer; touching runs already merged
        /// (`Io` when there are more than memory holds).
        fn runs(self: &SlicePlan, status: &mut Status) -> Vec<ByteRun>;
        /// Whether the slice is at most one contiguous run.
        fn contiguous(self: &SlicePlan) -> bool;
        /// Where the first run starts, relative to the data buffer (0 when empty).
        fn first_offset(self: &SlicePlan) -> u64;
    }

    // ---- writing (glue in writer.rs) -------------------------------------------------------

    extern "Rust" {
        /// Tensors collected for one write; see `rust/cxx/src/writer.rs` for the lifetime rule.
        type Writer;
        /// An empty writer for the file at `target` (empty: bytes in memory), which every error
        /// of the tensors and metadata it is given then names.
        fn new_writer(target: &[u8]) -> Box<Writer>;
        /// Adds a tensor; `data` must stay alive until the writer is dropped.
        fn add_tensor(
            self: &mut Writer,
            name: &[u8],
            dtype: u8,
            shape: &[usize],
            data: &[u8],
            status: &mut Status,
        );
        /// Writes `__metadata__` even if no entry is added.
        fn keep_metadata(self: &mut Writer);
        /// Adds a metadata entry (refuses a repeated key).
        fn add_metadata(self: &mut Writer, key: &[u8], value: &[u8], status: &mut Status);
        /// Checks everything, lays the file out once, and returns its length; `write_into` then
        /// writes that layout.
        unsafe fn prepare(self: &mut Writer, status: &mut Status) -> usize;
        /// Writes the prepared file into `dst` (exactly `prepare`'s length).
        unsafe fn write_into(self: &Writer, dst: &mut [u8], status: &mut Status);
        /// Writes the file atomically at `path`, fsynced when `sync`.
        unsafe fn write_file(self: &Writer, path: &[u8], sync: bool, status: &mut Status);
    }

    // ---- sharded checkpoints (glue in checkpoint.rs) ---------------------------------------

    extern "Rust" {
        /// A sharded checkpoint (an index and its shards) or a single file.
        type Checkpoint;
        /// Opens an index (`.json`) or a single safetensors file. Null on failure.
        fn open_checkpoint(
            path: &[u8],
            backend: u8,
            lenient: bool,
            allow_trailing_bytes: bool,
            status: &mut Status,
        ) -> *mut Checkpoint;
        /// The shard holding `name`, opened, with `ShardMissing` when (lenient) it lacks it.
        fn shard_holding(self: &Checkpoint, name: &[u8], status: &mut Status) -> usize;
        /// Tensors the index lists but their shard lacks, sorted (opens every shard).
        fn missing(self: &Checkpoint, status: &mut Status) -> Vec<String>;
        /// Bytes after the last tensor of shard `shard` (opens it).
        fn shard_trailing_bytes(self: &Checkpoint, shard: usize, status: &mut Status) -> u64;
        /// Number of tensors the index lists.
        fn tensor_count(self: &Checkpoint) -> usize;
        /// Tensor name `i` in sorted order.
        fn name_at(self: &Checkpoint, i: usize) -> &str;
        /// Sorted position of `name`, or -1.
        fn position(self: &Checkpoint, name: &[u8]) -> isize;
        /// The shard holding `name`, or `TensorNotFound`.
        fn shard_of(self: &Checkpoint, name: &[u8], status: &mut Status) -> usize;
        /// Shard `shard`, opened (once) and checked against the index on first use; it lives as
        /// long as the checkpoint. Null on failure.
        fn shard_file(self: &Checkpoint, shard: usize, status: &mut Status) -> *const File;
        /// Number of shard files.
        fn shard_count(self: &Checkpoint) -> usize;
        /// Path of shard `shard` (raw bytes).
        fn shard_path(self: &Checkpoint, shard: usize) -> &[u8];
        /// Whether shard `shard` has been opened.
        fn shard_is_open(self: &Checkpoint, shard: usize) -> bool;
        /// Shard files opened so far.
        fn shards_opened(self: &Checkpoint) -> usize;
        /// Whether the index (or single file) has metadata.
        fn has_metadata(self: &Checkpoint) -> bool;
        /// The index's metadata (or the single file's `__metadata__`).
        fn metadata(self: &Checkpoint) -> &Metadata;
    }

    // ---- GPU uploads (glue in cuda.rs) -----------------------------------------------------

    extern "Rust" {
        /// Tensors and slices to upload, from any files and shards.
        type UploadJob;
        /// An empty job; every tensor will start on a multiple of `alignment` bytes.
        fn new_upload_job(alignment: usize) -> Box<UploadJob>;
        /// Adds every tensor of `file`, in sorted-name order (`keys()`), in one call.
        fn add_file(self: &mut UploadJob, file: &File, status: &mut Status);
        /// Adds every tensor of a checkpoint, in its `keys()` order, in one call.
        fn add_checkpoint(self: &mut UploadJob, ckpt: &Checkpoint, status: &mut Status);
        /// Adds a whole tensor of `file`.
        fn add_tensor(self: &mut UploadJob, file: &File, name: &[u8], status: &mut Status);
        /// Adds a slice of a tensor of `file`.
        fn add_slice(
            self: &mut UploadJob,
            file: &File,
            name: &[u8],
            indices: &[SliceIndex],
            status: &mut Status,
        );
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

        /// One rank's device staging for a multi-rank load: a destination allocation, a
        /// pinned staging buffer, a device scratch buffer and a stream.
        type DeviceStage;
        /// A stage on `device` whose destination holds `total` bytes. Null on failure.
        fn new_device_stage(device: usize, total: usize, status: &mut Status) -> *mut DeviceStage;
        /// The destination's device address (0 once handed over by `finish`).
        fn destination(self: &DeviceStage) -> u64;
        /// The stream every copy is ordered on.
        fn stream(self: &DeviceStage) -> u64;
        /// The pinned staging buffer (`len` bytes), once the copies out of it are done (empty on
        /// failure). `unsafe` only because cxx requires it to spell the lifetime.
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

    // ---- streaming GPU uploads (glue in cuda.rs) -------------------------------------------

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

    // Objects handed over by address (null on failure) are adopted by C++ as `rust::Box`es:
    // their `Box` glue is generated here, as no signature names it.
    impl Box<File> {}
    impl Box<SlicePlan> {}
    impl Box<Checkpoint> {}
    impl Box<Uploader> {}
    impl Box<DeviceStage> {}
    impl Box<DistPlan> {}

    // ---- cold reads: prefetch, advice, streams, aligned reads (glue in stream.rs) ------------

    /// One request of a prefetch, a piece of advice or a stream, in the buffers that cross with
    /// it (every request of a call crosses at once): the tensor's name is bytes
    /// `[name_start, name_start + name_len)` of the names; when `sliced`, its slice is indices
    /// `[slice_start, slice_start + slice_len)`; when `pinned`, it must come from file (shard)
    /// `file`.
    #[derive(Debug, Clone, Copy)]
    struct RequestSpan {
        name_start: usize,
        name_len: usize,
        pinned: bool,
        file: usize,
        sliced: bool,
        slice_start: usize,
        slice_len: usize,
    }

    extern "Rust" {
        /// What a prefetch, advice or stream reads: every tensor, or requests.
        type RequestList;
        /// Every tensor (`all`), or the requests `spans` describe. Null on failure.
        fn new_request_list(
            all: bool,
            spans: &[RequestSpan],
            names: &[u8],
            indices: &[SliceIndex],
            status: &mut Status,
        ) -> *mut RequestList;
        /// The shards `requests` touches (all of them for every tensor), from the index alone:
        /// C++ opens them first, through its own synchronisation (see checkpoint.hpp).
        fn request_shards(self: &Checkpoint, requests: &RequestList) -> Vec<usize>;

        /// A prefetch in progress; dropping it cancels what has not started.
        type PrefetchJob;
        /// Starts warming `requests` of `file` with `threads` threads and requests of
        /// `request_bytes`. Null on failure.
        fn prefetch_file(
            file: &File,
            requests: &RequestList,
            threads: usize,
            request_bytes: usize,
            status: &mut Status,
        ) -> *mut PrefetchJob;
        /// The same over a checkpoint's shards, in shard order.
        fn prefetch_checkpoint(
            ckpt: &Checkpoint,
            requests: &RequestList,
            threads: usize,
            request_bytes: usize,
            status: &mut Status,
        ) -> *mut PrefetchJob;
        /// Bytes warmed so far.
        fn bytes_done(self: &PrefetchJob) -> u64;
        /// Bytes the prefetch covers.
        fn total_bytes(self: &PrefetchJob) -> u64;
        /// Waits for the end; the first error, every time it is asked (from any thread).
        fn wait(self: &PrefetchJob, status: &mut Status);

        /// `madvise` hints (0 will-need, 1 sequential, 2 random) for `requests` of a mapped
        /// file; nothing for the other backends.
        fn advise_file(file: &File, requests: &RequestList, advice: u8, status: &mut Status);

        /// Tensors delivered in file order with bounded buffers.
        type TensorStream;
        /// Streams `requests` of `file`. `announce` and `receive`, when not 0, are addresses of
        /// C functions `void(void*)` called with `token` under the stream's lock: the first by
        /// the reader thread just before and after it queues each tensor, the second by the
        /// consumer just before and after it takes queued tensors (the C++ header passes a
        /// ThreadSanitizer acquire-and-release for both). Null on failure.
        #[allow(clippy::too_many_arguments)]
        unsafe fn stream_file(
            file: &File,
            requests: &RequestList,
            max_inflight_bytes: u64,
            wait_for_release: bool,
            announce: usize,
            receive: usize,
            token: usize,
            status: &mut Status,
        ) -> *mut TensorStream;
        /// The same over a checkpoint's shards.
        #[allow(clippy::too_many_arguments)]
        unsafe fn stream_checkpoint(
            ckpt: &Checkpoint,
            requests: &RequestList,
            max_inflight_bytes: u64,
            wait_for_release: bool,
            announce: usize,
            receive: usize,
            token: usize,
            status: &mut Status,
        ) -> *mut TensorStream;
        /// The next tensor; null at the end (status ok) or on the error that ends the stream.
        fn next_tensor(self: &mut TensorStream, status: &mut Status) -> *mut StreamTensor;
        /// Tensors (or slices) the stream delivers in all.
        fn tensor_count(self: &TensorStream) -> usize;
        /// Bytes the stream delivers in all.
        fn total_bytes(self: &TensorStream) -> u64;
        /// The most bytes alive at once so far (instrumentation).
        fn peak_inflight_bytes(self: &TensorStream) -> u64;
        /// Bytes alive now.
        fn inflight_bytes(self: &TensorStream) -> u64;

        /// One delivered tensor; owns its bytes, returned to the budget when dropped.
        type StreamTensor;
        /// Position in the request list (for every tensor: in delivery order).
        fn request(self: &StreamTensor) -> usize;
        /// The file (shard) it came from, in the source's numbering.
        fn file(self: &StreamTensor) -> usize;
        /// Its position in that file, in offset order.
        fn index(self: &StreamTensor) -> usize;
        fn name(self: &StreamTensor) -> &str;
        /// Dtype index.
        fn dtype(self: &StreamTensor) -> u8;
        /// Shape of what was delivered (the slice's for a slice).
        fn shape(self: &StreamTensor) -> &[usize];
        fn data(self: &StreamTensor) -> &[u8];
        /// Path of the file it came from (raw bytes).
        fn path(self: &StreamTensor) -> &[u8];

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
            dst: &mut [u8],
            status: &mut Status,
        ) -> usize;
    }

    impl Box<RequestList> {}
    impl Box<PrefetchJob> {}
    impl Box<TensorStream> {}
    impl Box<StreamTensor> {}

    // ---- dtypes and error kinds, as the core names them ------------------------------------

    extern "Rust" {
        /// Header spelling of dtype index `dtype` ("" when out of range).
        fn dtype_name(dtype: u8) -> &'static str;
        /// Bits per element of dtype index `dtype` (0 when out of range).
        fn dtype_bits(dtype: u8) -> usize;
        /// Name of error kind `kind` ("" when out of range).
        fn error_kind_name(kind: u8) -> &'static str;
    }

    // ---- dtype conversion and dequantization (glue in convert.rs) --------------------------

    extern "Rust" {
        /// Converts the elements of a `from` tensor of `shape` into `to` (`dst` holds exactly
        /// numel × size(to) bytes).
        fn convert_tensor(
            from: u8,
            shape: &[usize],
            src: &[u8],
            to: u8,
            dst: &mut [u8],
            status: &mut Status,
        );
        /// Bytes a tensor `name` of `dtype` and `shape` takes (the tensor byte-length rule).
        fn tensor_byte_len(name: &[u8], dtype: u8, shape: &[usize], status: &mut Status) -> usize;
        /// DeepSeek-V3 style: a 2-D weight times its per-block scales, into `to`.
        #[allow(clippy::too_many_arguments)]
        fn dequantize_fp8_blocks(
            weight_dtype: u8,
            weight_shape: &[usize],
            weight: &[u8],
            scale_dtype: u8,
            scale_shape: &[usize],
            scale: &[u8],
            block_rows: usize,
            block_cols: usize,
            to: u8,
            dst: &mut [u8],
            status: &mut Status,
        );
        /// Shape of an MXFP4 dequantization: `[..., G, 16]` blocks give `[..., G*32]`.
        fn mxfp4_output_shape(
            blocks_shape: &[usize],
            scales_shape: &[usize],
            status: &mut Status,
        ) -> Vec<usize>;
        /// gpt-oss style MXFP4 blocks and E8M0 scales, into `to`.
        #[allow(clippy::too_many_arguments)]
        fn dequantize_mxfp4(
            blocks_dtype: u8,
            blocks_shape: &[usize],
            blocks: &[u8],
            scales_dtype: u8,
            scales_shape: &[usize],
            scales: &[u8],
            to: u8,
            dst: &mut [u8],
            status: &mut Status,
        );
    }

    // ---- multi-rank loading (glue in distributed.rs) ---------------------------------------

    /// A tensor-parallel rule: `kind` 0 splits dimension `dim` (evenly unless `uneven`);
    /// `kind` 1 takes one attention projection's rows for grouped-query attention (`part` 0–2:
    /// separate q/k/v tensors; 3–5: q/k/v blocks of a fused qkv tensor).
    #[derive(Debug, Clone, Copy)]
    struct TpRule {
        kind: u8,
        dim: usize,
        rank: usize,
        world: usize,
        uneven: bool,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        part: u8,
    }

    /// One step of a distributed load: `reader` reads `[offset, offset + len)` of file `file`'s
    /// data buffer, then broadcasts it when `shared`.
    #[derive(Debug, Clone, Copy)]
    struct DistStep {
        file: usize,
        offset: u64,
        len: u64,
        reader: usize,
        shared: bool,
    }

    /// A request of a rank that may have bytes in a step.
    #[derive(Debug, Clone, Copy)]
    struct DistPart {
        step: usize,
        request: usize,
    }

    /// Bytes a rank copies from a step into one of its results; `next` is where the pieces
    /// after it start.
    #[derive(Debug, Clone, Copy)]
    struct DistPiece {
        step_offset: u64,
        out_offset: u64,
        len: u64,
        next: u64,
    }

    extern "Rust" {
        /// The selection a tensor-parallel rule gives a tensor `name` of `shape`.
        fn tp_indices(
            name: &[u8],
            shape: &[usize],
            rule: &TpRule,
            status: &mut Status,
        ) -> Vec<SliceIndex>;

        /// Every rank's selections, before planning.
        type DistPlanBuilder;
        /// A builder for a world of `world` ranks.
        fn new_dist_plan_builder(world: usize) -> Box<DistPlanBuilder>;
        /// Adds a selection of a tensor of `file` to what `rank` needs.
        fn add_need(
            self: &mut DistPlanBuilder,
            rank: usize,
            file: &File,
            plan: &SlicePlan,
            status: &mut Status,
        );
        /// Plans every rank's reads; no step is longer than `max_step` bytes. Null on failure.
        fn build_plan(
            self: &mut DistPlanBuilder,
            max_step: u64,
            status: &mut Status,
        ) -> *mut DistPlan;

        /// A distributed load plan: the same steps on every rank.
        type DistPlan;
        /// Number of ranks.
        fn world(self: &DistPlan) -> usize;
        /// Number of steps.
        fn step_count(self: &DistPlan) -> usize;
        /// Step `i` (all zero out of range).
        fn step(self: &DistPlan, i: usize) -> DistStep;
        /// The requests of `rank` that may have bytes in each step, ordered by step.
        fn parts(self: &DistPlan, rank: usize, status: &mut Status) -> Vec<DistPart>;
        /// Copies what request `request` of `rank` needs from step `step` (read into
        /// `staging`) into its result `out`.
        fn scatter(
            self: &DistPlan,
            rank: usize,
            step: usize,
            request: usize,
            staging: &[u8],
            out: &mut [u8],
            status: &mut Status,
        );
        /// At most `max` (and at most 4096) of the pieces request `request` of `rank` copies
        /// out of step `step`, from piece position `from` on (0, or the last piece's `next`).
        fn pieces(
            self: &DistPlan,
            rank: usize,
            step: usize,
            request: usize,
            from: u64,
            max: usize,
        ) -> Vec<DistPiece>;
        /// Byte length of each of `rank`'s results.
        fn result_lens(self: &DistPlan, rank: usize) -> Vec<u64>;
        /// Reads step `i` into `dst` (exactly its length).
        fn read_step(self: &DistPlan, i: usize, dst: &mut [u8], status: &mut Status);
        /// Bytes this object has read through `read_step`.
        fn bytes_read_here(self: &DistPlan) -> u64;
        /// The steps this object has read, in order.
        fn reads_here(self: &DistPlan) -> Vec<DistStep>;
        /// Bytes the plan has `rank` read.
        fn planned_bytes_read_by(self: &DistPlan, rank: usize) -> u64;
        /// Bytes the plan reads across all ranks.
        fn planned_bytes_read(self: &DistPlan) -> u64;
        /// Bytes the collective delivers to ranks that need them.
        fn bytes_delivered(self: &DistPlan) -> u64;
        /// Bytes whole-world broadcasts of the shared steps move.
        fn bytes_broadcast(self: &DistPlan) -> u64;
        /// Bytes a naive per-rank load reads (whole tensors on every rank).
        fn naive_bytes_read(self: &DistPlan) -> u64;
    }
}

pub use ffi::{
    ByteRun, DistPart, DistPiece, DistStep, LandedTensor, LandingSink, RequestSpan, SliceIndex,
    Status, TensorMeta, TpRule, UploadPlacement,
};

/// A metadata map as the sorted pairs C++ walks by index (out of range: "").
pub struct Metadata(Vec<(String, String)>);

impl Metadata {
    pub(crate) fn new(map: Option<&BTreeMap<String, String>>) -> Metadata {
        Metadata(
            map.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
        )
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

/// A native path from the raw bytes C++ passes (`path.native()`), byte for byte. Every bridge
/// entry that takes a path uses this: a lossy UTF-8 conversion would turn each byte of a
/// Latin-1 name into three and name another file.
pub(crate) fn native_path(bytes: &[u8]) -> &std::path::Path {
    use std::os::unix::ffi::OsStrExt;
    std::path::Path::new(std::ffi::OsStr::from_bytes(bytes))
}

/// A Rust object handed to C++ by address; C++ adopts it with `rust::Box::from_raw`.
pub(crate) fn handed_over<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

fn dtype_name(dtype: u8) -> &'static str {
    Dtype::from_index(dtype).map_or("", Dtype::name)
}

fn dtype_bits(dtype: u8) -> usize {
    Dtype::from_index(dtype).map_or(0, Dtype::bits)
}

fn error_kind_name(kind: u8) -> &'static str {
    ErrorKind::ALL
        .get(usize::from(kind))
        .map_or("", |k| k.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_out_of_range_are_empty() {
        assert_eq!(dtype_name(200), "");
        assert_eq!(dtype_bits(22), 0);
        assert_eq!(error_kind_name(255), "");
        assert_eq!(dtype_name(17), "F32");
    }
}
