//! The caller's arguments, checked before use: handles and out-pointers that must not be NULL,
//! byte ranges (a NULL pointer is only allowed with a length of 0), arrays, paths, names and
//! flags. A careless argument is an `Internal` error naming the call and the parameter, never
//! a dereference of NULL. An output buffer is lent to Rust only after the core's overlap rule
//! (`safetensors_core::refuse_overlap`) has refused one that overlaps what the call reads.
//!
//! What this layer hands back to C: strings as [`st_str`] (a pointer and a length, never NULL,
//! never NUL-terminated unless said), and pointers to nothing (an empty name, the shape of a
//! scalar, the bytes of an empty tensor) as valid static addresses rather than NULL or Rust's
//! dangling pointers, so that any language may form an empty slice from them.

use std::ffi::{c_char, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use safetensors_core::AddressRange;

use crate::status::{Fail, Res};

/// A string the library hands out: `len` bytes at `ptr`, not NUL-terminated (tensor names may
/// hold NUL bytes; print one with `printf("%.*s", (int)s.len, s.ptr)`). `ptr` is never NULL.
/// Valid for as long as the object it came from, as each call says.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct st_str {
    /// The first byte.
    pub ptr: *const c_char,
    /// The number of bytes.
    pub len: usize,
}

/// The address handed out for empty byte strings and empty tensors: valid, never read.
static NOTHING: [u8; 8] = [0; 8];
/// The address handed out for the shape of a scalar.
static NO_DIMS: [usize; 1] = [0];

impl st_str {
    pub(crate) fn of(bytes: &[u8]) -> st_str {
        st_str {
            ptr: bytes_ptr(bytes).cast(),
            len: bytes.len(),
        }
    }

    pub(crate) fn empty() -> st_str {
        st_str::of(&[])
    }
}

/// The address of `bytes`, or a valid static one when there are none.
pub(crate) fn bytes_ptr(bytes: &[u8]) -> *const c_void {
    if bytes.is_empty() {
        NOTHING.as_ptr().cast()
    } else {
        bytes.as_ptr().cast()
    }
}

/// The address of a shape, or a valid static one for a scalar.
pub(crate) fn dims_ptr(dims: &[usize]) -> *const usize {
    if dims.is_empty() {
        NO_DIMS.as_ptr()
    } else {
        dims.as_ptr()
    }
}

/// One entry point, named in the messages about its arguments.
#[derive(Clone, Copy)]
pub(crate) struct Call(pub &'static str);

impl Call {
    pub(crate) fn null(&self, what: &str) -> Fail {
        Fail::careless(format!("{}: `{what}` is NULL", self.0))
    }

    /// A handle the caller passes.
    ///
    /// # Safety
    /// `p` is NULL or points to a live object of type `T` made by this library.
    pub(crate) unsafe fn handle<'a, T>(&self, p: *const T, what: &str) -> Res<&'a T> {
        // SAFETY: the caller's promise.
        unsafe { p.as_ref() }.ok_or_else(|| self.null(what))
    }

    /// A handle the caller passes for exclusive use (a stream's `next`).
    ///
    /// # Safety
    /// As [`Call::handle`], and no other call uses the object at the same time.
    pub(crate) unsafe fn handle_mut<'a, T>(&self, p: *mut T, what: &str) -> Res<&'a mut T> {
        // SAFETY: the caller's promise.
        unsafe { p.as_mut() }.ok_or_else(|| self.null(what))
    }

    /// Where the call writes a result. Checked before the call does anything, so that a NULL
    /// out-pointer never strands an object the call made.
    ///
    /// # Safety
    /// `p` is NULL or points to writable memory for a `T`.
    pub(crate) unsafe fn out<'a, T>(&self, p: *mut T, what: &str) -> Res<&'a mut T> {
        // SAFETY: the caller's promise; `T` is plain data, so its old contents need no drop.
        unsafe { p.as_mut() }.ok_or_else(|| self.null(what))
    }

    /// `len` bytes at `p` (NULL only with `len` 0).
    ///
    /// # Safety
    /// `p` is NULL or points to `len` readable bytes that stay unchanged during the call.
    pub(crate) unsafe fn bytes<'a>(
        &self,
        p: *const c_void,
        len: usize,
        what: &str,
    ) -> Res<&'a [u8]> {
        if len == 0 {
            return Ok(&[]);
        }
        if p.is_null() {
            return Err(self.null(what));
        }
        self.fits::<u8>(len, what)?;
        // SAFETY: the caller's promise; non-NULL, and the length fits a slice.
        Ok(unsafe { std::slice::from_raw_parts(p.cast(), len) })
    }

    /// The output buffer `dst`, `len` writable bytes (NULL only with `len` 0), lent as a slice
    /// once it is known to overlap none of `reads`, what the call reads: Rust may not hold a
    /// mutable slice over bytes it also reads (the core's rule and message,
    /// `safetensors_core::refuse_overlap`, as C++'s).
    ///
    /// # Safety
    /// `dst` is NULL or points to `len` writable bytes no one else uses during the call.
    pub(crate) unsafe fn output<'a>(
        &self,
        reads: &[AddressRange],
        dst: *mut c_void,
        len: usize,
    ) -> Res<&'a mut [u8]> {
        for &src in reads {
            safetensors_core::refuse_overlap(self.0, src, AddressRange::at(dst, len))?;
        }
        // SAFETY: the caller's promise; it overlaps nothing the call reads (checked above).
        unsafe { self.bytes_mut(dst, len, "dst") }
    }

    /// `len` writable bytes at `p` (NULL only with `len` 0), which the caller has checked
    /// overlap nothing the call reads ([`Call::output`] does both).
    ///
    /// # Safety
    /// `p` is NULL or points to `len` writable bytes no one else uses during the call.
    pub(crate) unsafe fn bytes_mut<'a>(
        &self,
        p: *mut c_void,
        len: usize,
        what: &str,
    ) -> Res<&'a mut [u8]> {
        if len == 0 {
            return Ok(&mut []);
        }
        if p.is_null() {
            return Err(self.null(what));
        }
        self.fits::<u8>(len, what)?;
        // SAFETY: the caller's promise; non-NULL, and the length fits a slice.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.cast(), len) })
    }

    /// `n` elements at `p` (NULL only with `n` 0).
    ///
    /// # Safety
    /// `p` is NULL or points to `n` initialized elements that stay unchanged during the call.
    pub(crate) unsafe fn array<'a, T>(&self, p: *const T, n: usize, what: &str) -> Res<&'a [T]> {
        if n == 0 {
            return Ok(&[]);
        }
        if p.is_null() {
            return Err(self.null(what));
        }
        self.fits::<T>(n, what)?;
        // SAFETY: the caller's promise; non-NULL, and the size fits a slice.
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// A slice may not span more than `isize::MAX` bytes: a larger count is a careless one.
    fn fits<T>(&self, n: usize, what: &str) -> Res<()> {
        let ok = n
            .checked_mul(std::mem::size_of::<T>().max(1))
            .is_some_and(|b| b <= isize::MAX as usize);
        if ok {
            Ok(())
        } else {
            Err(Fail::careless(format!(
                "{}: `{what}` claims {n} elements, more than any buffer holds",
                self.0
            )))
        }
    }

    /// A NUL-terminated path (its bytes as they are: paths need not be UTF-8).
    ///
    /// # Safety
    /// `p` is NULL or points to a NUL-terminated string.
    pub(crate) unsafe fn path<'a>(&self, p: *const c_char, what: &str) -> Res<&'a Path> {
        if p.is_null() {
            return Err(self.null(what));
        }
        // SAFETY: the caller's promise.
        let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
        Ok(Path::new(std::ffi::OsStr::from_bytes(bytes)))
    }

    /// A name given as `len` bytes at `p` (it may hold NUL bytes).
    ///
    /// # Safety
    /// As [`Call::bytes`].
    pub(crate) unsafe fn name<'a>(
        &self,
        p: *const c_char,
        len: usize,
        what: &str,
    ) -> Res<&'a [u8]> {
        // SAFETY: the caller's promise.
        unsafe { self.bytes(p.cast(), len, what) }
    }

    /// Refuses flag bits this library does not know (they may mean something to a newer one).
    pub(crate) fn flags(&self, flags: u32, known: u32) -> Res<()> {
        if flags & !known == 0 {
            return Ok(());
        }
        Err(Fail::careless(format!(
            "{}: unknown flag bits {:#x} (this library knows {known:#x}; is the header newer than \
             the library?)",
            self.0,
            flags & !known
        )))
    }

    /// An index below `len` (`what` says into what).
    pub(crate) fn index(&self, i: usize, len: usize, what: &str) -> Res<usize> {
        if i < len {
            return Ok(i);
        }
        Err(Fail::careless(format!(
            "{}: index {i} is out of range: {what} has {len}",
            self.0
        )))
    }
}

/// Refuses an output buffer `dst` that overlaps `src` (address, length), the bytes the call
/// reads: the core's rule (for callers that hold addresses rather than a [`Call::output`]).
pub(crate) fn refuse_overlap(
    call: Call,
    src: (usize, usize),
    dst: (*const c_void, usize),
) -> Res<()> {
    let src = AddressRange {
        start: src.0,
        len: src.1,
    };
    Ok(safetensors_core::refuse_overlap(
        call.0,
        src,
        AddressRange::at(dst.0, dst.1),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_is_lent_only_clear_of_what_the_call_reads() {
        let c = Call("st_t");
        let mut buf = [0u8; 16];
        let src = AddressRange::of(&buf[..8]);
        let at = |o: usize| buf[o..].as_ptr().cast_mut().cast::<c_void>();
        // SAFETY: `buf` is ours and unused during the calls.
        unsafe {
            let e = c.output(&[src], at(7), 4).unwrap_err();
            assert_eq!(e.kind(), safetensors_core::ErrorKind::InvalidSlice);
            assert!(e.message().starts_with("st_t: the destination (4 bytes)"));
            assert_eq!(c.output(&[src], at(8), 4).unwrap().len(), 4);
            assert!(c.output(&[], std::ptr::null_mut(), 1).is_err());
            assert!(c
                .output(&[src], std::ptr::null_mut(), 0)
                .unwrap()
                .is_empty());
        }
        let (p, n) = (buf.as_mut_ptr(), buf.len());
        assert!(refuse_overlap(c, (p as usize, n), (p.cast(), 1)).is_err());
    }

    #[test]
    fn null_is_allowed_only_for_nothing() {
        let c = Call("t");
        // SAFETY: NULL with length 0, or NULL refused.
        unsafe {
            assert!(c.bytes(std::ptr::null(), 0, "p").unwrap().is_empty());
            assert!(c.bytes(std::ptr::null(), 1, "p").is_err());
            assert!(c.array::<u64>(std::ptr::null(), 2, "p").is_err());
            assert!(c.handle::<u8>(std::ptr::null(), "h").is_err());
        }
        let one = [1u64];
        // SAFETY: a count no buffer holds is refused before a slice is formed.
        assert!(unsafe { c.array(one.as_ptr(), usize::MAX / 4, "p") }.is_err());
    }

    #[test]
    fn empty_things_have_valid_addresses() {
        assert!(!st_str::empty().ptr.is_null());
        assert_eq!(dims_ptr(&[]), NO_DIMS.as_ptr());
        assert!(!bytes_ptr(&[]).is_null());
    }
}
