//! The caller's arguments, checked before use: handles and out-pointers that must not be NULL,
//! byte ranges (a NULL pointer is only allowed with a length of 0), arrays, paths, names and
//! flags. A careless argument is an `Internal` error naming the call and the parameter, never
//! a dereference of NULL.
//!
//! What this layer hands back to C: strings as [`st_str`] (a pointer and a length, never NULL,
//! never NUL-terminated unless said), and pointers to nothing (an empty name, the shape of a
//! scalar, the bytes of an empty tensor) as valid static addresses rather than NULL or Rust's
//! dangling pointers, so that any language may form an empty slice from them.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;

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

/// `name` as a static NUL-terminated string (names of kinds and dtypes): made once per name.
pub(crate) fn static_c_str(name: &'static str) -> *const c_char {
    static NAMES: Mutex<Option<HashMap<&'static str, &'static CStr>>> = Mutex::new(None);
    let interned = std::panic::catch_unwind(|| {
        let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
        let names = names.get_or_insert_with(HashMap::new);
        names
            .entry(name)
            .or_insert_with(|| {
                // The names are our own identifiers: none holds a NUL.
                let c = CString::new(name).unwrap_or_default();
                Box::leak(c.into_boxed_c_str())
            })
            .as_ptr()
    });
    // Nothing unwinds into C, even from a call that cannot fail.
    interned.unwrap_or(c"".as_ptr())
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

    /// `len` writable bytes at `p` (NULL only with `len` 0). Callers check first that they do
    /// not overlap anything the call reads ([`refuse_overlap`]): Rust may not hold a mutable
    /// slice over bytes it also reads.
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

/// Refuses an output buffer `dst` that overlaps `src`, the bytes the call reads: the rule of
/// C++'s `detail::refuse_overlap`, with its message and kind (`InvalidSlice`), checked before
/// any byte is written (and before Rust forms a mutable slice over `dst`).
pub(crate) fn refuse_overlap(
    call: Call,
    src: (usize, usize),
    dst: (*const c_void, usize),
) -> Res<()> {
    let (a0, alen) = src;
    let (b0, blen) = (dst.0 as usize, dst.1);
    if alen == 0 || blen == 0 {
        return Ok(());
    }
    let overlaps = if a0 >= b0 {
        a0 - b0 < blen
    } else {
        b0 - a0 < alen
    };
    if !overlaps {
        return Ok(());
    }
    Err(Fail::Said(
        safetensors_core::ErrorKind::InvalidSlice,
        format!(
            "{}: the destination ({blen} bytes) overlaps the bytes it reads ({alen} bytes); write \
             into a separate buffer",
            call.0
        ),
    ))
}

/// The address range of `bytes`, for [`refuse_overlap`].
pub(crate) fn span(bytes: &[u8]) -> (usize, usize) {
    (bytes.as_ptr() as usize, bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_any_shared_byte() {
        let c = Call("t");
        let buf = [0u8; 16];
        let base = buf.as_ptr() as usize;
        let at = |o: usize| (buf[o..].as_ptr().cast::<c_void>(), 4usize);
        assert!(refuse_overlap(c, (base, 8), at(7)).is_err());
        assert!(refuse_overlap(c, (base, 8), at(8)).is_ok());
        assert!(refuse_overlap(c, (base + 4, 4), at(1)).is_err());
        assert!(refuse_overlap(c, (base + 4, 4), at(0)).is_ok());
        assert!(refuse_overlap(c, (base, 0), at(0)).is_ok());
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
