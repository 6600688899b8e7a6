//! Aligned reads of the direct backend: `O_DIRECT` spans rounded out to whole blocks, read
//! straight into the caller's aligned buffer.

use std::sync::atomic::Ordering;

use crate::direct::DIRECT_ALIGN;
use crate::error::{Error, Result};

use super::{SafeFile, Storage};

impl SafeFile {
    /// The [`DIRECT_ALIGN`]-aligned span of the file around data bytes `[offset, offset + len)`:
    /// its file offset, its length, and where those bytes start in it. It may begin inside the
    /// header and end past the end of the file.
    fn aligned_span(&self, offset: u64, len: usize) -> Result<(u64, usize, usize)> {
        let outside = || self.outside(offset, len);
        offset
            .checked_add(len as u64)
            .filter(|&end| end <= self.header.data_len() as u64)
            .ok_or_else(outside)?;
        let align = DIRECT_ALIGN as u64;
        let first = (self.header.data_start() as u64)
            .checked_add(offset)
            .ok_or_else(outside)?;
        let start = first - first % align;
        let end = first
            .checked_add(len as u64)
            .and_then(|last| last.checked_next_multiple_of(align))
            .ok_or_else(outside)?;
        let span = usize::try_from(end - start).map_err(|_| outside())?;
        Ok((start, span, (first - start) as usize))
    }

    /// Bytes a destination of [`SafeFile::read_data_aligned`] needs for data bytes
    /// `[offset, offset + len)`: the aligned span around them (at most `len` plus two blocks).
    pub fn aligned_len(&self, offset: u64, len: usize) -> Result<usize> {
        self.aligned_span(offset, len).map(|(_, span, _)| span)
    }

    /// Reads data bytes `[offset, offset + len)` into `dst` and returns where they start in it:
    /// they are `dst[head..head + len]`. `dst` should be aligned to [`DIRECT_ALIGN`] (an
    /// [`crate::AlignedBuf`]) and must be at least [`SafeFile::aligned_len`] long.
    ///
    /// With the direct backend the whole aligned span around the bytes is read with `O_DIRECT`
    /// straight into `dst`, with no bounce buffer: `dst` then also holds the file's neighbouring
    /// bytes (the header's end, other tensors) up to where the file ends. With the other
    /// backends, after a fallback to `pread`, or when `dst` is not aligned, only the requested
    /// bytes are read, to the same place: `head` never depends on the backend, so neither does a
    /// caller's layout, and the rest of `dst` is left as it was.
    ///
    /// ```no_run
    /// use safetensors_core::{AlignedBuf, Backend, SafeFile};
    /// let f = SafeFile::open("model.safetensors", Backend::Direct)?;
    /// let (begin, end) = f.info("wte.weight")?.data_offsets;
    /// let mut buf = AlignedBuf::new(f.aligned_len(begin as u64, end - begin)?)
    ///     .map_err(|e| safetensors_core::Error::io(f.path(), "allocate", e))?;
    /// let head = f.read_data_aligned(begin as u64, end - begin, buf.as_mut_slice())?;
    /// let bytes = &buf.as_slice()[head..head + (end - begin)];
    /// # Ok::<(), safetensors_core::Error>(())
    /// ```
    ///
    /// Errors: `dst` too short is [`Error::WrongBufferLength`]; a range outside the data
    /// buffer, and a file shorter than its header says (it shrank), are `Io`, never other bytes.
    pub fn read_data_aligned(&self, offset: u64, len: usize, dst: &mut [u8]) -> Result<usize> {
        let (start, span, head) = self.aligned_span(offset, len)?;
        if dst.len() < span {
            return Err(Error::WrongBufferLength {
                buffer: "the aligned destination",
                expected: span as u64,
                actual: dst.len() as u64,
            }
            .in_file(&self.path));
        }
        let want = head..head + len;
        if let Storage::Direct(d) = &self.storage {
            if len > 0 && (dst.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
                let op = d.op().map_err(|e| Error::io(&self.path, "open", e))?;
                let got = op
                    .read_span(&mut dst[..span], start)
                    .map_err(|e| self.read_failed(e))?;
                if let Some(got) = got {
                    // Short: the file ends inside the span (its last block), or the filesystem
                    // stopped early. `pread` finishes, and tells a shrunk file by its end.
                    if got < want.end {
                        let from = got.max(head);
                        op.finish(&mut dst[from..want.end], start + from as u64)
                            .map_err(|e| self.read_failed(e))?;
                    }
                    self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
                    return Ok(head);
                }
            }
        }
        self.read_data(offset, &mut dst[want])?;
        Ok(head)
    }
}
