//! The C API of the safetensors library: the `extern "C"` functions `include/safetensors.h`
//! declares, a thin layer over `safetensors-core` (and `safetensors-cuda` with the `cuda`
//! feature). The header is generated from this crate by cbindgen (`rust/capi/cbindgen.toml`);
//! the doc comments here are the header's documentation.
//!
//! These functions are linked into the same static library as the C++ bridge (`rust/cxx`
//! depends on this crate), so a program using both APIs has one copy of the core and of Rust's
//! standard library, and `libsafetensors.so` exports both (`cmake/safetensors.map`).
//!
//! The bindings translate; the core decides. This crate turns C arguments into core types and
//! core results into C ones, and holds no rule of the format or of the library's behaviour:
//! which names are found (`safetensors_core::name_to_find`), what a writer accepts
//! (`Declarations`, `CheckpointWriter`), lent memory (`LentBytes`), overlapping outputs
//! (`refuse_overlap`), the orders things are listed in (`MetadataList`, `SortedNames`) are all
//! the core's, shared with the C++ bridge. What is left here:
//! - every entry point returns `ST_OK` or `ST_FAILED`, and fills the caller's `st_error` (when
//!   not NULL) with the error's kind and message (`status.rs`); it never unwinds into C: a
//!   panic becomes an `Internal` error (the one boundary, `ffi::catch`);
//! - it checks its arguments before using them (`args.rs`): a NULL handle or out-pointer, a
//!   NULL buffer with a length, unknown flags or enumerators are `Internal` errors naming the
//!   call and the parameter, and zeroed option fields mean the defaults;
//! - objects are handed out as `Box` pointers and freed by their `st_*_free` (NULL ignored;
//!   `ffi::hand_out`, `ffi::free_box`); whatever reads holds what it reads from (slices,
//!   streams, plans keep their files); pointers into an object (names, shapes, zero-copy bytes)
//!   are valid while it lives.
//!
//! Safety: every `unsafe extern "C" fn` here trusts its caller for what C cannot check, as the
//! header documents: handles are live objects of this library of the right type, pointers with
//! a length point to that many bytes, out-pointers are writable.
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

// In the order the header declares them (cbindgen follows these declarations), each group
// apart so that rustfmt keeps the order.
mod status;

mod version;

mod dtype;

mod tensor;

mod file;

mod checkpoint;

mod slice;

mod convert;

mod write;

mod writer;

mod stream;

mod cuda;

mod remote;

mod args;

mod ffi;

pub use args::st_str;
pub use checkpoint::*;
pub use convert::*;
pub use cuda::*;
pub use dtype::*;
pub use file::*;
pub use remote::*;
pub use slice::*;
pub use status::{st_error, st_error_clear, st_error_kind_name, ST_FAILED, ST_OK};
pub use status::{
    ST_ERR_BUDGET_EXCEEDED, ST_ERR_CUDA, ST_ERR_DUPLICATE_KEY, ST_ERR_HEADER_TOO_LARGE,
    ST_ERR_HEADER_TOO_SMALL, ST_ERR_INTERNAL, ST_ERR_INVALID_HEADER,
    ST_ERR_INVALID_HEADER_DESERIALIZATION, ST_ERR_INVALID_HEADER_LENGTH, ST_ERR_INVALID_INDEX,
    ST_ERR_INVALID_OFFSET, ST_ERR_INVALID_SHARD_PATH, ST_ERR_INVALID_SLICE,
    ST_ERR_INVALID_TENSOR_NAME, ST_ERR_IO, ST_ERR_METADATA_INCOMPLETE_BUFFER,
    ST_ERR_MISALIGNED_SLICE, ST_ERR_SHARD_MISMATCH, ST_ERR_SHARD_MISSING,
    ST_ERR_TENSOR_INVALID_INFO, ST_ERR_TENSOR_NOT_FOUND, ST_ERR_TYPE_MISMATCH,
    ST_ERR_VALIDATION_OVERFLOW,
};
pub use stream::*;
pub use tensor::st_tensor;
pub use version::*;
pub use write::*;
pub use writer::*;
