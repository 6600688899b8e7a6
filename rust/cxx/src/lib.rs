//! The C++ bridge: one `#[cxx::bridge]` module and thin glue over `safetensors-core`.
//!
//! Users never see these types: `include/safetensors/*.hpp` wraps them in the public C++20 API.
//!
//! Two rules hold for every function below, because a panic that reaches the bridge aborts the
//! host process:
//! - every fallible function returns `Result`, runs inside [`guard`] (which turns a panic into
//!   an `Internal` error), and its error text starts with the numeric error kind and a colon,
//!   which the C++ side parses back into `safetensors::ErrorKind`;
//! - every infallible accessor is total: an index out of range gives an empty value, never a
//!   panic (the C++ wrappers only pass valid indices anyway).

mod checkpoint;
mod file;
mod writer;

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use safetensors_core::{Dtype, Error, ErrorKind};

pub use checkpoint::{open_checkpoint, Checkpoint};
pub use file::{open_file, File, SlicePlan};
pub use writer::{new_writer, Writer};

// cxx needs the explicit lifetime on `shard_file`, which clippy would have us elide.
#[allow(clippy::needless_lifetimes)]
#[cxx::bridge(namespace = "safetensors::ffi")]
mod ffi {
    // ---- shared structs ------------------------------------------------------------------

    /// One tensor: position in file order, dtype index, and data offsets. The shape is
    /// fetched separately with `File::shape_at` (a borrowed slice, no copy).
    #[derive(Debug, Clone, Copy)]
    struct TensorMeta {
        index: usize,
        dtype: u8,
        begin: usize,
        end: usize,
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

    /// A contiguous byte run, relative to the start of the file's data buffer.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct ByteRun {
        offset: u64,
        length: u64,
    }

    // ---- Rust functions C++ calls --------------------------------------------------------

    extern "Rust" {
        /// An open safetensors file (mapped, or read on demand).
        type File;

        /// Opens and validates `path` (raw bytes of a native path). `backend`: 0 mmap, 1 read.
        fn open_file(path: &[u8], backend: u8) -> Result<Box<File>>;

        /// Number of tensors.
        fn tensor_count(self: &File) -> usize;
        /// The tensor named `name`, or a `TensorNotFound` error naming the file.
        fn find(self: &File, name: &[u8]) -> Result<TensorMeta>;
        /// Position of `name` in file order, or -1.
        fn position(self: &File, name: &[u8]) -> isize;
        /// The tensor at `index` in file order (all zero when out of range).
        fn meta_at(self: &File, index: usize) -> TensorMeta;
        /// Name of the tensor at `index` in file order.
        fn name_at(self: &File, index: usize) -> &str;
        /// Shape of the tensor at `index` in file order.
        fn shape_at(self: &File, index: usize) -> &[usize];
        /// File-order positions sorted by name, computed once.
        fn sorted_positions(self: &File) -> &[u32];
        /// Whether the header has a `__metadata__` map (`null` counts as absent).
        fn has_metadata(self: &File) -> bool;
        /// Number of metadata entries.
        fn metadata_len(self: &File) -> usize;
        /// Metadata key `i`, in sorted order.
        fn metadata_key(self: &File, i: usize) -> &str;
        /// Metadata value `i`, in sorted key order.
        fn metadata_value(self: &File, i: usize) -> &str;
        /// The data buffer when mapped; empty with the read backend.
        fn mapped_data(self: &File) -> &[u8];
        /// Whether the file is mapped.
        fn is_mapped(self: &File) -> bool;
        /// The header length `N`.
        fn header_len(self: &File) -> usize;
        /// Length of the data buffer.
        fn data_len(self: &File) -> usize;
        /// Copies data-buffer bytes `[offset, offset + dst.len())` into `dst`.
        fn read_data(self: &File, offset: u64, dst: &mut [u8]) -> Result<()>;
        /// Data bytes fetched by the read backend so far.
        fn bytes_read(self: &File) -> u64;
        /// Plans a slice of the tensor at `index` in file order.
        fn plan_slice(self: &File, index: usize, indexers: &[SliceIndex])
            -> Result<Box<SlicePlan>>;
        /// Copies the bytes `plan` selects into `dst` (exactly `plan.byte_len()` bytes).
        fn read_slice(self: &File, plan: &SlicePlan, dst: &mut [u8]) -> Result<()>;

        /// A planned slice: the new shape and the byte runs, no data.
        type SlicePlan;
        /// Shape of the slice.
        fn shape(self: &SlicePlan) -> &[usize];
        /// Bytes in the slice.
        fn byte_len(self: &SlicePlan) -> usize;
        /// The runs, in order, relative to the data buffer; touching runs already merged.
        fn runs(self: &SlicePlan) -> Vec<ByteRun>;
        /// Whether the slice is at most one contiguous run.
        fn contiguous(self: &SlicePlan) -> bool;

        /// Tensors collected for one write; see `rust/cxx/src/writer.rs` for the lifetime rule.
        type Writer;
        /// An empty writer.
        fn new_writer() -> Box<Writer>;
        /// Adds a tensor; `data` must stay alive until the writer is dropped.
        fn add_tensor(
            self: &mut Writer,
            name: &[u8],
            dtype: u8,
            shape: &[usize],
            data: &[u8],
        ) -> Result<()>;
        /// Adds a metadata entry (refuses a repeated key).
        fn add_metadata(self: &mut Writer, key: &[u8], value: &[u8]) -> Result<()>;
        /// Checks everything and returns the length of the file.
        unsafe fn file_len(self: &Writer) -> Result<usize>;
        /// Writes the file into `dst` (exactly `file_len()` bytes).
        unsafe fn write_into(self: &Writer, dst: &mut [u8]) -> Result<()>;
        /// Writes the file atomically at `path`.
        unsafe fn write_file(self: &Writer, path: &[u8]) -> Result<()>;

        /// A sharded checkpoint (an index and its shards) or a single file.
        type Checkpoint;
        /// Opens an index (`.json`) or a single safetensors file.
        fn open_checkpoint(path: &[u8], backend: u8) -> Result<Box<Checkpoint>>;
        /// Number of tensors the index lists.
        fn tensor_count(self: &Checkpoint) -> usize;
        /// Tensor name `i` in sorted order.
        fn name_at(self: &Checkpoint, i: usize) -> &str;
        /// Sorted position of `name`, or -1.
        fn position(self: &Checkpoint, name: &[u8]) -> isize;
        /// The shard holding `name`, or `TensorNotFound`.
        fn shard_of(self: &Checkpoint, name: &[u8]) -> Result<usize>;
        /// Shard `shard`, opened (once) and checked against the index on first use.
        // `unsafe` only because cxx requires it to spell the lifetime; nothing unsafe happens.
        unsafe fn shard_file<'a>(self: &'a Checkpoint, shard: usize) -> Result<&'a File>;
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
        /// Number of metadata entries.
        fn metadata_len(self: &Checkpoint) -> usize;
        /// Metadata key `i`, sorted.
        fn metadata_key(self: &Checkpoint, i: usize) -> &str;
        /// Metadata value `i`, in sorted key order.
        fn metadata_value(self: &Checkpoint, i: usize) -> &str;

        /// Header spelling of dtype index `dtype` ("" when out of range).
        fn dtype_name(dtype: u8) -> &'static str;
        /// Bits per element of dtype index `dtype` (0 when out of range).
        fn dtype_bits(dtype: u8) -> usize;
        /// Name of error kind `kind` ("" when out of range).
        fn error_kind_name(kind: u8) -> &'static str;
    }
}

pub use ffi::{ByteRun, SliceIndex, TensorMeta};

/// A metadata map as the sorted pairs C++ walks by index.
pub(crate) fn metadata_pairs(map: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
    map.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// An error on its way to C++: the text is `"<kind>:<message>"`.
#[derive(Debug)]
pub struct BridgeError {
    kind: ErrorKind,
    message: String,
}

impl fmt::Display for BridgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind as u8, self.message)
    }
}

impl From<Error> for BridgeError {
    fn from(e: Error) -> Self {
        BridgeError {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// Runs `f`, converting a panic into an `Internal` error instead of letting it abort the host.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, BridgeError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(BridgeError::from),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(BridgeError {
                kind: ErrorKind::Internal,
                message: format!(
                    "internal error in the safetensors library (please report): {what}"
                ),
            })
        }
    }
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
    fn errors_cross_as_kind_colon_message() {
        let e: BridgeError = Error::TensorNotFound { name: "w".into() }.into();
        assert_eq!(e.to_string(), "10:tensor `w` not found");
    }

    #[test]
    fn guard_turns_panics_into_internal_errors() {
        let r: Result<(), _> = guard(|| panic!("boom"));
        let text = r.unwrap_err().to_string();
        assert!(text.starts_with("20:") && text.contains("boom"), "{text}");
    }

    #[test]
    fn lookups_out_of_range_are_empty() {
        assert_eq!(dtype_name(200), "");
        assert_eq!(dtype_bits(22), 0);
        assert_eq!(error_kind_name(255), "");
        assert_eq!(dtype_name(17), "F32");
    }
}
