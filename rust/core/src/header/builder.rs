//! What both JSON parsers fill: the name and dimension arenas, one [`Entry`] per tensor, the
//! metadata, and the first duplicate key seen. `Header` is made from it (`finish` in `mod.rs`).

use std::collections::BTreeMap;

use serde::de;

use crate::dtype::Dtype;
use crate::error::Error;

/// One tensor's entry as a parser records it and the header stores it: its name and shape
/// as spans of the arenas.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) name_start: u32,
    pub(super) name_len: u32,
    pub(super) shape_start: u32,
    pub(super) shape_len: u32,
    pub(super) dtype: Dtype,
    pub(super) begin: usize,
    pub(super) end: usize,
}

/// The header as parsed, before it is sorted, indexed and validated.
pub(super) struct Builder {
    pub(super) names: String,
    pub(super) shapes: Vec<usize>,
    pub(super) entries: Vec<Entry>,
    pub(super) metadata: Option<BTreeMap<String, String>>,
    pub(super) metadata_seen: bool,
    /// First duplicate found inside `__metadata__`, or `__metadata__` itself repeated.
    pub(super) duplicate: Option<Error>,
    /// Most dimensions the whole header can hold: each takes a digit and a separator.
    pub(super) max_dims: usize,
}

impl Builder {
    pub(super) fn for_len(len: usize) -> Builder {
        Builder {
            names: String::with_capacity(len / 3),
            shapes: Vec::with_capacity(len / 48),
            entries: Vec::with_capacity(len / 96),
            metadata: None,
            metadata_seen: false,
            duplicate: None,
            max_dims: len / 2 + 1,
        }
    }

    pub(super) fn note_duplicate(&mut self, key: String, in_metadata: bool) {
        if self.duplicate.is_none() {
            self.duplicate = Some(Error::DuplicateKey { key, in_metadata });
        }
    }
}

/// Makes room for one more dimension. Like `Vec`'s doubling, but never past `max`, the most
/// the header can hold: for a header that is one huge shape (rank ~5e7 in 100 MB) the arena ends
/// at its exact size instead of at the next power of two, keeping the peak near 4 bytes of
/// arena per header byte (8 per dimension of at least 2 bytes of text).
pub(super) fn grow_dims(dims: &mut Vec<usize>, max: usize) {
    if dims.len() == dims.capacity() {
        let want = (dims.capacity() * 2).clamp(dims.len() + 1, max.max(dims.len() + 1));
        dims.reserve_exact(want - dims.len());
    }
}

/// Arena offsets are stored as `u32`: the header is at most 1e8 bytes, so every name and
/// every dimension count fits.
pub(super) fn arena_u32<E: de::Error>(n: usize) -> std::result::Result<u32, E> {
    u32::try_from(n).map_err(|_| E::custom("header too large to index"))
}
