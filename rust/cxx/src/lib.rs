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

mod file;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use safetensors_core::{Dtype, Error, ErrorKind};

pub use file::{open_file, File};

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

        /// Header spelling of dtype index `dtype` ("" when out of range).
        fn dtype_name(dtype: u8) -> &'static str;
        /// Bits per element of dtype index `dtype` (0 when out of range).
        fn dtype_bits(dtype: u8) -> usize;
        /// Name of error kind `kind` ("" when out of range).
        fn error_kind_name(kind: u8) -> &'static str;
    }
}

pub use ffi::TensorMeta;

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
