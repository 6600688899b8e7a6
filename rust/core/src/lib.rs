//! The safetensors format: parse, validate, write and slice, exactly as the reference
//! implementation (HF safetensors 0.8.0) does, with checked arithmetic throughout and duplicate
//! keys refused.
//!
//! Pure Rust, no FFI: the C++ bridge (`rust/cxx`) is a thin layer over this crate.
//!
//! Where each behaviour lives:
//! - `format.rs`: the format's constants (length prefix, header size limit, `__metadata__`);
//! - `header/`: parsing and validating a header (`mod.rs`: the checks in order; `canonical.rs`
//!   and `general.rs`: the two JSON parsers; `builder.rs`: what they fill; `names.rs`: the name index);
//! - `byte_len.rs`: the tensor byte-length rule (dtype × shape) every layer applies;
//! - `error.rs`: the one error enum and its messages; `dtype.rs`: the element types;
//! - `fallible.rs`: fallible allocation for sizes a file or a caller chooses;
//! - `file.rs` (with `direct.rs`): opening files and reading bytes; `view.rs`: files in memory;
//! - `slice.rs`: slice plans; `writer.rs` (with `writer/`): writing, at once or in pieces, one
//!   file or a sharded checkpoint;
//! - `checkpoint/`: sharded checkpoints (the index file, shard paths, lazy shards);
//! - `convert/`: dtype conversion and dequantization;
//! - `distributed/`: tensor-parallel rules and multi-rank plans; `upload.rs`: the staged upload
//!   ring (CUDA lives in `rust/cuda`); `request.rs` (what to read, from a file, a checkpoint or
//!   several files), `prefetch.rs` and `stream.rs`: cold loads;
//! - `url.rs`: which strings are URLs and what of them messages show (remote reading itself is
//!   the `safetensors-remote` crate, `rust/remote`);
//! - what the bindings (the C API, the C++ bridge) take from the core rather than decide:
//!   `lookup.rs` (a name given as bytes that is not UTF-8 is `TensorNotFound`), `lent.rs`
//!   (memory a caller lends to a file, and its release), `overlap.rs` (output buffers that
//!   overlap what a call reads are refused), `listing.rs` (metadata and names handed out by
//!   position); a writer's declarations are `writer/declare.rs`.
//!
//! ```
//! use safetensors_core::{serialize, Dtype, SafeTensors, TensorView};
//!
//! let weights: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|f| f.to_le_bytes()).collect();
//! let bytes = serialize([("w", TensorView::new(Dtype::F32, &[2, 2], &weights))], None)?;
//! let file = SafeTensors::deserialize(&bytes)?;
//! assert_eq!(file.tensor("w")?.data, &weights[..]);
//! # Ok::<(), safetensors_core::Error>(())
//! ```
#![deny(missing_docs)]

mod byte_len;
mod checkpoint;
pub mod convert;
mod direct;
pub mod distributed;
mod dtype;
mod error;
pub mod fallible;
mod file;
mod format;
mod header;
mod lent;
mod listing;
mod lookup;
mod open;
mod overlap;
mod prefetch;
mod request;
pub mod residency;
mod slice;
mod stream;
pub mod tsan;
pub mod upload;
mod url;
mod view;
mod writer;

pub use byte_len::{check_data_len, tensor_byte_len};
pub use checkpoint::{
    Checkpoint, CheckpointOptions, Found, NameIter, NameList, ShardOpener, MAX_INDEX_SIZE,
};
pub use direct::{AlignedBuf, DIRECT_ALIGN};
pub use dtype::{Dtype, UnknownDtype};
pub use error::{Error, ErrorKind, HeaderContents, PieceProblem, Result, TextField};
pub use file::{read_many, Backend, MemoryBytes, OpenOptions, Populate, RangeSource, SafeFile};
pub use format::{LENGTH_PREFIX_SIZE, MAX_HEADER_SIZE, MAX_RANK, METADATA_KEY};
pub use header::{read_header_len, test_hooks, Header, Placement, TensorInfo};
pub use lent::{LentBytes, Release};
pub use listing::{MetadataList, SortedNames};
pub use lookup::{name_to_find, tensor_not_found};
pub use overlap::{refuse_overlap, AddressRange};
pub use prefetch::{advise, Advice, Plan, Prefetch, PrefetchOptions, MAX_REQUEST_BYTES};
pub use request::{Request, Source};
pub use slice::{Indexer, Placed, Runs, SlicePlan};
pub use stream::{StreamOptions, StreamTensor, TensorStream};
pub use url::{is_url, push_url_segment, redact_url, url_scheme, url_text};
pub use view::{SafeTensors, TensorView};
pub use writer::{
    dtype_to_write, plan_shards, serialize, serialize_to_file, text_to_write, write_atomically,
    write_atomically_with, CheckpointWriter, Declarations, Durability, PreparedFile, ShardOptions,
    ShardPlan, ShardedWriter, StreamWriter, TensorSpec, WriteOptions, DEFAULT_MAX_SHARD_SIZE,
    MAX_ALIGNMENT,
};
