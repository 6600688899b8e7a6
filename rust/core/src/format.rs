//! The format's fixed numbers and names: the length prefix, the header size limit, the reserved
//! metadata key, and the start of a git-lfs pointer file (a common stand-in for a real file).
//!
//! Constants only, importing nothing, so that the reader (`header/`), the writer and the error
//! messages can all name them without depending on one another.

/// Size in bytes of the little-endian `u64` header length that starts every file.
pub const LENGTH_PREFIX_SIZE: usize = 8;

/// Largest header the format allows, in bytes (exactly this many is allowed).
pub const MAX_HEADER_SIZE: usize = 100_000_000;

/// Most dimensions a tensor of a file may have: a deliberate limit of this library, where the
/// reference (HF safetensors 0.8.0) has none but the header size. NumPy refuses more than 64
/// dimensions (32 before 2.0), and no model format we know of comes near 1024. Without a limit a
/// 100 MB header holds one tensor of rank 50 million: 400 MB per copy of its shape, which the
/// C++ API copies into every `TensorInfo`, `Selection` and view (2.8 GB for one slice of it),
/// each a `std::vector` that throws `std::bad_alloc`, untyped, where memory is short. With it, a
/// shape costs at most 8 KiB wherever it goes. Readers refuse a longer shape while parsing
/// (keeping at most this many dimensions plus one), and the writer refuses to write one, both
/// with `TensorInvalidInfo`.
pub const MAX_RANK: usize = 1024;

/// Reserved key for the free-form string map.
pub const METADATA_KEY: &str = "__metadata__";

/// What a git-lfs pointer file starts with: a common "model" that is not one.
pub(crate) const LFS_POINTER_PREFIX: &[u8] = b"version https://git-lfs";
