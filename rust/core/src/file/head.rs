//! Reading a file's header: the first block read at once, the rest exactly, or the header
//! parsed in the mapping when it is too large to copy; every source validated by
//! [`parse_allowing`] against the length of the whole input.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::LENGTH_PREFIX_SIZE;
use crate::header::{read_header_len, Header};

/// How much of the file is read first: four pages, which hold the length prefix and most
/// headers whole (gpt2's 14 KB, a 100-tensor shard's). The rest of the header, when there is
/// more, is read exactly. One `pread` instead of two saved ~1 µs of a ~50 µs open; copying
/// the extra bytes of a small header costs far less.
pub(super) const FIRST_READ: usize = 16 * 1024;

/// Largest header the mapped backend copies out with `pread` rather than parsing it in the
/// mapping: reading is cheaper than faulting in the mapping's first pages (measured ~10 µs of a
/// ~70 µs open), until the copy itself costs more.
pub(super) const HEADER_COPY_LIMIT: usize = 256 * 1024;

/// The first block of the file ([`FIRST_READ`] bytes, fewer when the file is shorter).
pub(super) fn read_head(file: &File, path: &Path, len: u64) -> Result<Vec<u8>> {
    let first = len.min(FIRST_READ as u64) as usize;
    let mut head = vec![0u8; first];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| header_read_failed(path, e))?;
    Ok(head)
}

/// An error of reading the header of `path`: running out of file there means it shrank after
/// its length was measured (std's own text, "failed to fill whole buffer", says nothing).
pub(super) fn header_read_failed(path: &Path, e: io::Error) -> Error {
    let e = if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(
            e.kind(),
            "the file became shorter while its header was read; was it truncated or replaced \
             meanwhile?",
        )
    } else {
        e
    };
    Error::io(path, "read", e)
}

/// Extends `head` (the file's first bytes) to `needed` bytes.
pub(super) fn read_rest(file: &File, path: &Path, head: &mut Vec<u8>, needed: usize) -> Result<()> {
    let have = head.len();
    if needed > have {
        head.resize(needed, 0);
        file.read_exact_at(&mut head[have..], have as u64)
            .map_err(|e| header_read_failed(path, e))?;
    }
    Ok(())
}

/// Reads and validates the header with positioned reads: first a small block, then, only once
/// the length prefix has passed its checks (so a hostile length allocates nothing), the rest.
pub(super) fn read_header(
    file: &File,
    path: &Path,
    len: u64,
    allow_trailing: bool,
) -> Result<(Header, u64)> {
    #[cfg(test)]
    super::tests::before_map(path);
    let mut head = read_head(file, path, len)?;
    let header_len = read_header_len(&head, len)?;
    read_rest(file, path, &mut head, LENGTH_PREFIX_SIZE + header_len)?;
    parse_allowing(&head, len, allow_trailing)
}

/// Parses and validates the header in `head` (at least its first `8 + N` bytes) of an input of
/// `len` bytes, returning it with the count of bytes after the last tensor. Bytes left over are
/// `MetadataIncompleteBuffer` unless `allow_trailing`: that check is the format's last, so
/// every other one has passed when it fails, and the header is then validated again against
/// the length it describes (the reparse costs only the files that need it).
pub(crate) fn parse_allowing(head: &[u8], len: u64, allow_trailing: bool) -> Result<(Header, u64)> {
    match Header::parse_prefix(head, len) {
        Ok(header) => Ok((header, 0)),
        Err(Error::MetadataIncompleteBuffer { expected, actual })
            if allow_trailing && actual > expected =>
        {
            let header = Header::parse_prefix(head, expected)?;
            Ok((header, actual - expected))
        }
        Err(e) => Err(e),
    }
}
