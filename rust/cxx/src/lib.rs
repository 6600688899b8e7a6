//! The C++ bridge: one `#[cxx::bridge]` per area, each beside its glue, over
//! `safetensors-core` (and `safetensors-cuda` with the `cuda` feature, `safetensors-remote` with
//! the `remote` feature).
//!
//! Users never see these types: `include/safetensors/*.hpp` wraps them in the public C++20 API.
//! Each bridge generates its own header (`safetensors/ffi/src/<area>.rs.h`), so a public header
//! includes only the areas it uses. Types one area shares with another are declared once and
//! reused (`type Status = crate::status::ffi::Status;`), as cxx's "Reusing existing binding
//! types" describes; codes that cross are shared enums, checked on the Rust side (a value C++
//! made with `static_cast` that names none is an error, never a silent choice).
//!
//! No call across a bridge throws or panics, so that the headers work in programs built
//! without exceptions (`-fno-exceptions`), where cxx's `Result` would abort the process:
//! - every fallible function takes a `&mut Status` last, runs inside `guard` (which also turns
//!   a panic into an `Internal` error), and reports its outcome there: `ok`, or the error's
//!   numeric kind and message. On failure it returns a harmless placeholder (0, empty, null);
//!   functions that make a Rust object return it as a raw pointer, null on failure, which C++
//!   adopts with `rust::Box::from_raw`;
//! - every infallible accessor is total: an index out of range gives an empty value, never a
//!   panic (the C++ wrappers only pass valid indices anyway).
//!
//! The bridges the reading headers include (status, file, checkpoint, convert, remote) take no
//! slice and return no `Vec`: spans cross as shared structs of a pointer and a length (`Bytes`,
//! `Sizes`, ... in `status.rs`), so that their generated headers need none of `rust::Slice`'s and
//! `rust::Vec`'s standard headers (`<ranges>`, `<algorithm>`), which every C++ file that reads
//! tensors would otherwise compile.
//!
//! The areas, in the order their imports run (each uses only those before it):
//! - `status.rs`: `Status`, `guard`, the spans that cross (`Bytes`, `Sizes`, ...), paths as
//!   bytes, the names of dtypes and error kinds;
//! - `file.rs`: `File` (an open file: lookups, reads, slices, aligned reads), `Metadata`,
//!   `SlicePlan`;
//! - `checkpoint.rs`: `Checkpoint`;
//! - `writer.rs`: `Writer`; `convert.rs`: dtype conversion and dequantization;
//! - `stream.rs`: `Source` (a file or a checkpoint), `RequestList`, prefetch, advice, streams;
//! - `cuda.rs` (with `cuda/`): uploads; `memory.rs`: host loads into one allocation, locking
//!   and releasing pages (it reuses `cuda.rs`'s placements); `distributed.rs`: tensor-parallel
//!   rules, load plans;
//! - `remote.rs` (with `remote/`): remote files (`s3://`, `http(s)://`) opened into memory;
//! - `version.rs`: the versioned symbol.

pub mod checkpoint;
pub mod convert;
pub mod cuda;
pub mod distributed;
pub mod file;
pub mod memory;
pub mod remote;
pub mod status;
pub mod stream;
mod version;
pub mod writer;
