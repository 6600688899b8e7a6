//! The format's fixed numbers and names: the length prefix, the header size limit, the reserved
//! metadata key, and the start of a git-lfs pointer file (a common stand-in for a real file).
//!
//! Constants only, importing nothing, so that the reader (`header/`), the writer and the error
//! messages can all name them without depending on one another.

/// Size in bytes of the little-endian `u64` header length that starts every file.
pub const LENGTH_PREFIX_SIZE: usize = 8;

/// Largest header the format allows, in bytes (exactly this many is allowed).
pub const MAX_HEADER_SIZE: usize = 100_000_000;

/// Reserved key for the free-form string map.
pub const METADATA_KEY: &str = "__metadata__";

/// What a git-lfs pointer file starts with: a common "model" that is not one.
pub(crate) const LFS_POINTER_PREFIX: &[u8] = b"version https://git-lfs";
