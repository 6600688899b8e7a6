//! How a fallible bridge call reports its outcome: through the `Status` C++ passes in, never by
//! throwing (cxx's `Result` becomes a C++ exception, or an abort in programs built without
//! exceptions) and never by panicking (a panic that reaches the bridge aborts the host). Also
//! the names the core gives dtypes and error kinds, which C++ checks its enumerations against.

use std::panic::{catch_unwind, AssertUnwindSafe};

use safetensors_core::{Dtype, Error, ErrorKind};

pub use ffi::{Bytes, BytesMut, Sizes, SizesMut, Status};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    /// How a fallible call ended. C++ passes a fresh one (`ok` false) to every fallible call,
    /// which sets `ok`, or the error's kind (`safetensors::ErrorKind`'s value) and message.
    #[derive(Debug, Default)]
    struct Status {
        ok: bool,
        kind: u8,
        message: String,
    }

    // Spans lent across the bridge as a pointer and a length rather than as `&[T]`: a bridge
    // with no slice or `Vec` in its signatures generates a header without `rust::Slice` and
    // `rust::Vec`, whose `<ranges>` and `<algorithm>` every translation unit of the reading
    // headers would otherwise compile. `data` may be null when `len` is 0. A span C++ passes
    // in is lent for the length of the call; one a Rust object returns lives as long as the
    // object.

    /// Bytes to read.
    #[derive(Debug, Clone, Copy)]
    struct Bytes {
        data: *const u8,
        len: usize,
    }

    /// Bytes to write.
    #[derive(Debug)]
    struct BytesMut {
        data: *mut u8,
        len: usize,
    }

    /// Sizes to read (a shape, or every tensor's dimensions).
    #[derive(Debug, Clone, Copy)]
    struct Sizes {
        data: *const usize,
        len: usize,
    }

    /// Sizes to write.
    #[derive(Debug)]
    struct SizesMut {
        data: *mut usize,
        len: usize,
    }

    extern "Rust" {
        /// Header spelling of dtype index `dtype` ("" when out of range).
        fn dtype_name(dtype: u8) -> &'static str;
        /// Bits per element of dtype index `dtype` (0 when out of range).
        fn dtype_bits(dtype: u8) -> usize;
        /// Name of error kind `kind` ("" when out of range).
        fn error_kind_name(kind: u8) -> &'static str;
    }
}

fn dtype_name(dtype: u8) -> &'static str {
    Dtype::from_index(dtype).map_or("", Dtype::name)
}

fn dtype_bits(dtype: u8) -> usize {
    Dtype::from_index(dtype).map_or(0, Dtype::bits)
}

fn error_kind_name(kind: u8) -> &'static str {
    ErrorKind::ALL
        .get(usize::from(kind))
        .map_or("", |k| k.name())
}

/// `data[..len]` as a slice (empty when `len` is 0, whatever `data` is, and when `data` is null:
/// C++ has no span of a null pointer and a nonzero length, and an empty read or write is the
/// harmless answer to one).
///
/// # Safety
/// `data` points at `len` initialised values that stay alive and unchanged for `'a`.
pub(crate) unsafe fn lent<'a, T>(data: *const T, len: usize) -> &'a [T] {
    if len == 0 || data.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(data, len) }
    }
}

/// `data[..len]` as a mutable slice (empty when `len` is 0 or `data` is null, as for `lent`).
///
/// # Safety
/// `data` points at `len` values that stay alive, and that nothing else reads or writes, for
/// `'a`.
pub(crate) unsafe fn lent_mut<'a, T>(data: *mut T, len: usize) -> &'a mut [T] {
    if len == 0 || data.is_null() {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(data, len) }
    }
}

/// `of` and `get` for the spans C++ reads or lends to read (`Bytes`, `Sizes`), and `get` for
/// those it lends to write (`BytesMut`, `SizesMut`).
macro_rules! spans {
    ($($read:ident, $write:ident: $t:ty;)*) => {$(
        impl ffi::$read {
            /// A span of `items`, for a call that reads them (or for C++ to read as long as they
            /// live).
            pub(crate) fn of(items: &[$t]) -> Self {
                Self {
                    data: items.as_ptr(),
                    len: items.len(),
                }
            }

            /// The items.
            ///
            /// # Safety
            /// The span is one C++ lent for this call (`data` null or pointing at `len` values
            /// that nothing changes during it), or made by `of` from values still alive.
            pub(crate) unsafe fn get(&self) -> &[$t] {
                // SAFETY: the caller's contract.
                unsafe { lent(self.data, self.len) }
            }
        }

        impl ffi::$write {
            /// The items.
            ///
            /// # Safety
            /// The span is one C++ lent for this call (`data` null or pointing at `len` values
            /// that nothing else reads or writes during it).
            pub(crate) unsafe fn get(&mut self) -> &mut [$t] {
                // SAFETY: the caller's contract.
                unsafe { lent_mut(self.data, self.len) }
            }
        }
    )*};
}

spans! {
    Bytes, BytesMut: u8;
    Sizes, SizesMut: usize;
}

/// A native path from the raw bytes C++ passes (`path.native()`), byte for byte. Every bridge
/// entry that takes a path uses this: a lossy UTF-8 conversion would turn each byte of a
/// Latin-1 name into three and name another file.
pub(crate) fn native_path(bytes: &[u8]) -> &std::path::Path {
    use std::os::unix::ffi::OsStrExt;
    std::path::Path::new(std::ffi::OsStr::from_bytes(bytes))
}

/// `items[start..start + len]`, or an `Internal` error: the span of one name (or shape) among
/// the flat buffers a C++ header built for one call.
pub(crate) fn part<T>(items: &[T], start: usize, len: usize) -> Result<&[T], Error> {
    start
        .checked_add(len)
        .and_then(|end| items.get(start..end))
        .ok_or_else(|| Error::Internal {
            message: format!(
                "a span [{start}, +{len}) lies outside its buffer of {}",
                items.len()
            ),
        })
}

/// A Rust object handed to C++ by address; C++ adopts it with `rust::Box::from_raw`.
pub(crate) fn handed_over<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// What a fallible bridge function returns when it fails: C++ reads the status first and never
/// uses this value.
pub(crate) trait Fallback {
    fn fallback() -> Self;
}

/// `Fallback` as `Default` for the listed types (bridges of other areas implement it for their
/// own shared structs).
macro_rules! fallback_default {
    ($($t:ty),*) => {
        $(impl Fallback for $t {
            fn fallback() -> Self {
                Default::default()
            }
        })*
    };
}

fallback_default!((), bool, u64, usize, f64, String);

impl<T> Fallback for Vec<T> {
    fn fallback() -> Self {
        Vec::new()
    }
}

impl<T> Fallback for *mut T {
    fn fallback() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> Fallback for *const T {
    fn fallback() -> Self {
        std::ptr::null()
    }
}

impl Fallback for ffi::Bytes {
    fn fallback() -> Self {
        Self::of(&[])
    }
}

impl Fallback for ffi::Sizes {
    fn fallback() -> Self {
        Self::of(&[])
    }
}

impl<T> Fallback for &mut [T] {
    fn fallback() -> Self {
        &mut []
    }
}

impl<T> Fallback for &[T] {
    fn fallback() -> Self {
        &[]
    }
}

/// Runs `f` and records how it ended in `status`: `ok`, or the error's kind and message (a
/// panic becomes an `Internal` error instead of aborting the host process). On failure the
/// result is `T`'s placeholder.
pub(crate) fn guard<T: Fallback>(status: &mut Status, f: impl FnOnce() -> Result<T, Error>) -> T {
    let outcome = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::Internal { message: what })
    });
    match outcome {
        Ok(value) => {
            status.ok = true;
            value
        }
        Err(e) => {
            status.ok = false;
            status.kind = e.kind() as u8;
            status.message = e.to_string();
            T::fallback()
        }
    }
}

/// Runs a bridge call the way C++ does, for tests: its value, or the status it failed with.
#[cfg(test)]
pub(crate) fn outcome<T>(call: impl FnOnce(&mut Status) -> T) -> Result<T, Status> {
    let mut status = Status::default();
    let value = call(&mut status);
    if status.ok {
        Ok(value)
    } else {
        Err(status)
    }
}

/// Adopts an object a bridge call handed over by address, as C++ does (`rust::Box::from_raw`).
#[cfg(test)]
pub(crate) fn adopt<T>(ptr: *mut T) -> Box<T> {
    assert!(!ptr.is_null());
    // SAFETY: bridge functions hand over objects made by `handed_over` (`Box::into_raw`).
    unsafe { Box::from_raw(ptr) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors_core::ErrorKind;

    #[test]
    fn errors_cross_as_kind_and_whole_message() {
        let mut status = Status::default();
        let r: usize = guard(&mut status, || {
            Err(Error::TensorNotFound {
                name: "a\0b".into(),
            })
        });
        assert_eq!(r, 0);
        assert!(!status.ok);
        assert_eq!(status.kind, ErrorKind::TensorNotFound as u8);
        // The message crosses with its length: a NUL in it is kept (C++ escapes it for what()).
        assert_eq!(status.message, "tensor `a\0b` not found");
    }

    #[test]
    fn success_sets_ok_and_returns_the_value() {
        let mut status = Status::default();
        assert_eq!(guard(&mut status, || Ok(7u64)), 7);
        assert!(status.ok);
    }

    #[test]
    fn lookups_out_of_range_are_empty() {
        assert_eq!(dtype_name(200), "");
        assert_eq!(dtype_bits(22), 0);
        assert_eq!(error_kind_name(255), "");
        assert_eq!(dtype_name(17), "F32");
    }

    #[test]
    fn panics_become_internal_errors_and_null_results() {
        let mut status = Status::default();
        let p: *mut u8 = guard(&mut status, || panic!("boom"));
        assert!(p.is_null());
        assert!(!status.ok);
        assert_eq!(status.kind, ErrorKind::Internal as u8);
        assert!(status.message.contains("boom"), "{}", status.message);
    }
}
