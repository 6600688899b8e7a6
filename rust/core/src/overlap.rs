//! Output buffers that overlap what a call reads: this module owns the rule that they are
//! refused (`InvalidSlice`, [`Error::OverlappingOutput`]) before any byte moves, for every call
//! that writes into a caller's buffer (reads of a file in memory, slices, conversions, copies
//! off a device), in C and C++ alike.
//!
//! Why refused rather than handled: Rust may not hold a mutable slice over bytes it also reads
//! (undefined behaviour), and a conversion in place would read bytes it has already
//! overwritten. Handling it takes a staging copy (twice the memory of the largest tensors) or a
//! loop order per dtype pair and offset, and a file in memory must not change under its
//! readers anyway. So the check takes addresses, not slices: it runs before the output is
//! lent to Rust as a slice at all.

use crate::error::{Error, Result};
use crate::file::SafeFile;

/// `len` bytes from the address `start`, as a caller's buffer or the library's memory lies in
/// the address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressRange {
    /// The first byte's address.
    pub start: usize,
    /// Number of bytes.
    pub len: usize,
}

impl AddressRange {
    /// Where `bytes` lie.
    pub fn of(bytes: &[u8]) -> AddressRange {
        AddressRange::at(bytes.as_ptr(), bytes.len())
    }

    /// `len` bytes at `ptr`, which need not be valid (only its address is used).
    pub fn at<T>(ptr: *const T, len: usize) -> AddressRange {
        AddressRange {
            start: ptr as usize,
            len,
        }
    }

    /// The bytes of `file` in memory, which no output may overlap: the whole mapping, or the
    /// whole buffer of a file in memory; nothing for the read and direct backends. A file whose
    /// mapping was deferred is mapped now (`Io` when that fails): the read that asks goes
    /// through the mapping anyway.
    pub fn of_file(file: &SafeFile) -> Result<AddressRange> {
        Ok(file
            .mapped_file()?
            .map_or_else(AddressRange::default, AddressRange::of))
    }

    /// Whether the two ranges share a byte (without forming an address past either one).
    pub fn overlaps(self, other: AddressRange) -> bool {
        if self.len == 0 || other.len == 0 {
            return false;
        }
        if self.start >= other.start {
            self.start - other.start < other.len
        } else {
            other.start - self.start < self.len
        }
    }
}

/// `InvalidSlice` ([`Error::OverlappingOutput`], naming `call`) when the output `dst` overlaps
/// `src`, the bytes the call reads.
///
/// ```
/// use safetensors_core::{refuse_overlap, AddressRange, ErrorKind};
/// let buf = [0u8; 16];
/// let (src, dst) = (AddressRange::of(&buf[..8]), AddressRange::of(&buf[4..]));
/// assert_eq!(refuse_overlap("convert", src, dst).unwrap_err().kind(), ErrorKind::InvalidSlice);
/// assert!(refuse_overlap("convert", src, AddressRange::of(&buf[8..])).is_ok());
/// ```
pub fn refuse_overlap(call: &str, src: AddressRange, dst: AddressRange) -> Result<()> {
    if !src.overlaps(dst) {
        return Ok(());
    }
    Err(Error::OverlappingOutput {
        call: call.to_owned(),
        dst_len: dst.len as u64,
        src_len: src.len as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn overlap_is_any_shared_byte() {
        let buf = [0u8; 16];
        let at = |o: usize, n: usize| AddressRange::of(&buf[o..o + n]);
        assert!(at(0, 8).overlaps(at(7, 4)));
        assert!(!at(0, 8).overlaps(at(8, 4)));
        assert!(at(4, 4).overlaps(at(1, 4)));
        assert!(!at(4, 4).overlaps(at(0, 4)));
        assert!(at(0, 16).overlaps(at(5, 1)));
        assert!(!at(0, 0).overlaps(at(0, 16)));
        assert!(!at(3, 4).overlaps(at(3, 0)));
    }

    #[test]
    fn ranges_at_the_top_of_the_address_space_do_not_wrap() {
        let top = AddressRange {
            start: usize::MAX - 3,
            len: 4,
        };
        assert!(!top.overlaps(AddressRange { start: 0, len: 4 }));
        assert!(top.overlaps(AddressRange {
            start: usize::MAX,
            len: 1
        }));
    }

    #[test]
    fn the_refusal_names_the_call_and_both_sizes() {
        let buf = [0u8; 16];
        let e = refuse_overlap(
            "st_convert",
            AddressRange::of(&buf[..8]),
            AddressRange::of(&buf[4..12]),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSlice);
        assert_eq!(
            e.to_string(),
            "st_convert: the destination (8 bytes) overlaps the bytes it reads (8 bytes); write \
             into a separate buffer"
        );
    }

    #[test]
    fn a_file_read_from_disk_has_no_memory_to_overlap() {
        let bytes = crate::serialize(
            [(
                "w",
                crate::TensorView::new(crate::Dtype::U8, &[4], &[1, 2, 3, 4]),
            )],
            None,
        )
        .unwrap();
        let len = bytes.len();
        let f = SafeFile::from_memory("m", Box::new(bytes), Default::default()).unwrap();
        let r = AddressRange::of_file(&f).unwrap();
        assert_eq!(r.len, len);
        let path = std::env::temp_dir().join(format!("st-overlap-{}", std::process::id()));
        std::fs::write(&path, f.mapped_file().unwrap().unwrap()).unwrap();
        let read = SafeFile::open(&path, crate::Backend::Read).unwrap();
        assert_eq!(
            AddressRange::of_file(&read).unwrap(),
            AddressRange::default()
        );
        std::fs::remove_file(path).unwrap();
    }
}
