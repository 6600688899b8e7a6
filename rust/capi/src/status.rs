//! How every call reports its outcome: an `int` status (`ST_OK` or `ST_FAILED`) and, when the
//! caller passes one, an [`st_error`] filled with the error's kind and message. No global or
//! thread-local "last error": the error travels with the call that failed. Nothing unwinds into
//! C: every entry point runs inside [`run`] (or [`quietly`], for the frees), which turn a panic
//! into an `Internal` error through the one boundary, `ffi::catch`.

use std::ffi::c_char;
use std::os::raw::c_int;

use safetensors_core::{Error, ErrorKind};

use crate::ffi::{catch, static_c_str};

/// What a call that succeeded returns.
pub const ST_OK: c_int = 0;
/// What a call that failed returns; its `st_error`, when given, says why.
pub const ST_FAILED: c_int = -1;

/// `st_error.kind`: the file is shorter than the 8-byte length prefix. The `ST_ERR_*` values are
/// the numbers of C++'s `safetensors::ErrorKind` and Rust's `ErrorKind` (append only).
pub const ST_ERR_HEADER_TOO_SMALL: i32 = 0;
/// The length prefix announces more than 100,000,000 bytes (or a write would).
pub const ST_ERR_HEADER_TOO_LARGE: i32 = 1;
/// The header runs past the end of the file.
pub const ST_ERR_INVALID_HEADER_LENGTH: i32 = 2;
/// The header is not UTF-8 (or metadata given to the writer is not).
pub const ST_ERR_INVALID_HEADER: i32 = 3;
/// The header is not JSON of the safetensors schema.
pub const ST_ERR_INVALID_HEADER_DESERIALIZATION: i32 = 4;
/// Tensor offsets leave a gap, overlap, or end before they begin.
pub const ST_ERR_INVALID_OFFSET: i32 = 5;
/// A shape's element count or bit size does not fit in 64 bits.
pub const ST_ERR_VALIDATION_OVERFLOW: i32 = 6;
/// A sub-byte tensor or slice does not start and end on a byte boundary.
pub const ST_ERR_MISALIGNED_SLICE: i32 = 7;
/// A tensor's byte length disagrees with dtype × shape (or it has more than 1024 dimensions).
pub const ST_ERR_TENSOR_INVALID_INFO: i32 = 8;
/// Bytes missing after the tensors, or left over.
pub const ST_ERR_METADATA_INCOMPLETE_BUFFER: i32 = 9;
/// No tensor by that name.
pub const ST_ERR_TENSOR_NOT_FOUND: i32 = 10;
/// A tensor name or metadata key appears twice.
pub const ST_ERR_DUPLICATE_KEY: i32 = 11;
/// `__metadata__` as a tensor name, or a name that is not UTF-8.
pub const ST_ERR_INVALID_TENSOR_NAME: i32 = 12;
/// A slice that does not fit, or a buffer of the wrong size or overlapping what a call reads.
pub const ST_ERR_INVALID_SLICE: i32 = 13;
/// Opening, reading or writing failed (or memory for a buffer a file sizes was refused).
pub const ST_ERR_IO: i32 = 14;
/// A checkpoint index is not `{"weight_map": {...}}` JSON.
pub const ST_ERR_INVALID_INDEX: i32 = 15;
/// A shard file, or a tensor the index puts in it, is missing.
pub const ST_ERR_SHARD_MISSING: i32 = 16;
/// A shard holds a tensor that the index assigns to another shard.
pub const ST_ERR_SHARD_MISMATCH: i32 = 17;
/// A shard path leaves the index's directory.
pub const ST_ERR_INVALID_SHARD_PATH: i32 = 18;
/// CUDA is unavailable (no driver, no device, or a build without CUDA), or a CUDA call failed.
pub const ST_ERR_CUDA: i32 = 19;
/// A defect in this library (please report it), or a careless call: a NULL handle or
/// out-pointer, unknown flag bits, an index out of range.
pub const ST_ERR_INTERNAL: i32 = 20;
/// A conversion that makes no sense, or a dtype value that names no dtype.
pub const ST_ERR_TYPE_MISMATCH: i32 = 21;
/// A bounded stream cannot go on until the caller frees tensors it was given.
pub const ST_ERR_BUDGET_EXCEEDED: i32 = 22;

// The one numbering: every `ST_ERR_*` is the core's `ErrorKind` of that name.
const _: () = {
    let kinds = [
        (ST_ERR_HEADER_TOO_SMALL, ErrorKind::HeaderTooSmall),
        (ST_ERR_HEADER_TOO_LARGE, ErrorKind::HeaderTooLarge),
        (ST_ERR_INVALID_HEADER_LENGTH, ErrorKind::InvalidHeaderLength),
        (ST_ERR_INVALID_HEADER, ErrorKind::InvalidHeader),
        (
            ST_ERR_INVALID_HEADER_DESERIALIZATION,
            ErrorKind::InvalidHeaderDeserialization,
        ),
        (ST_ERR_INVALID_OFFSET, ErrorKind::InvalidOffset),
        (ST_ERR_VALIDATION_OVERFLOW, ErrorKind::ValidationOverflow),
        (ST_ERR_MISALIGNED_SLICE, ErrorKind::MisalignedSlice),
        (ST_ERR_TENSOR_INVALID_INFO, ErrorKind::TensorInvalidInfo),
        (
            ST_ERR_METADATA_INCOMPLETE_BUFFER,
            ErrorKind::MetadataIncompleteBuffer,
        ),
        (ST_ERR_TENSOR_NOT_FOUND, ErrorKind::TensorNotFound),
        (ST_ERR_DUPLICATE_KEY, ErrorKind::DuplicateKey),
        (ST_ERR_INVALID_TENSOR_NAME, ErrorKind::InvalidTensorName),
        (ST_ERR_INVALID_SLICE, ErrorKind::InvalidSlice),
        (ST_ERR_IO, ErrorKind::Io),
        (ST_ERR_INVALID_INDEX, ErrorKind::InvalidIndex),
        (ST_ERR_SHARD_MISSING, ErrorKind::ShardMissing),
        (ST_ERR_SHARD_MISMATCH, ErrorKind::ShardMismatch),
        (ST_ERR_INVALID_SHARD_PATH, ErrorKind::InvalidShardPath),
        (ST_ERR_CUDA, ErrorKind::Cuda),
        (ST_ERR_INTERNAL, ErrorKind::Internal),
        (ST_ERR_TYPE_MISMATCH, ErrorKind::TypeMismatch),
        (ST_ERR_BUDGET_EXCEEDED, ErrorKind::BudgetExceeded),
    ];
    let mut i = 0;
    while i < kinds.len() {
        assert!(kinds[i].0 == kinds[i].1 as i32 && kinds[i].0 == i as i32);
        i += 1;
    }
    assert!(kinds.len() == ErrorKind::ALL.len());
};

/// Why a call failed, filled by the call when the caller passes one (every `st_error*`
/// parameter may be NULL). Caller-owned: start it zeroed (`st_error err = ST_ERROR_INIT;`),
/// and free its message with `st_error_clear`. A call that fails frees the message the struct
/// held before and stores its own, so one `st_error` can serve many calls; a call that
/// succeeds leaves it untouched. Thread-safe by construction: each call writes only the
/// `st_error` it is given.
#[repr(C)]
pub struct st_error {
    /// The error's kind, one of `ST_ERR_*` (the numbers of C++'s `safetensors::ErrorKind`);
    /// meaningful only after a call failed.
    pub kind: i32,
    /// What went wrong, naming the file, the tensor and the sizes involved, NUL-terminated;
    /// a NUL inside the text (tensor names may hold one) is written as the two characters
    /// `\0`, as in C++'s messages. NULL when no call failed yet, or when memory for it was
    /// refused. Owned by this struct: freed by `st_error_clear` or the next failing call.
    pub message: *mut c_char,
    /// Bytes of `message`, without the final NUL.
    pub message_len: usize,
}

/// Frees the message of `err` and zeroes it (it may then be reused). NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn st_error_clear(err: *mut st_error) {
    if err.is_null() {
        return;
    }
    // SAFETY: the caller passes a valid `st_error`, whose message is NULL or ours (malloc).
    unsafe {
        libc::free((*err).message.cast());
        (*err).kind = 0;
        (*err).message = std::ptr::null_mut();
        (*err).message_len = 0;
    }
}

/// The name of an error kind, e.g. `"InvalidOffset"` (C++'s `to_string(ErrorKind)`), as a
/// static NUL-terminated string; `""` for a value that is no kind.
#[no_mangle]
pub extern "C" fn st_error_kind_name(kind: i32) -> *const c_char {
    let name = usize::try_from(kind)
        .ok()
        .and_then(|k| ErrorKind::ALL.get(k))
        .map_or("", |k| k.name());
    static_c_str(name)
}

/// Why a call failed: an error of the core, or one this layer finds in the caller's
/// arguments.
#[derive(Debug)]
pub(crate) enum Fail {
    Core(Error),
    /// An error with this layer's own message (kinds as the core's).
    Said(ErrorKind, String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Core(e)
    }
}

impl Fail {
    /// A careless call (a NULL handle, unknown flags, an index out of range): `Internal`, as
    /// C++ reports a call on a moved-from object.
    pub(crate) fn careless(message: String) -> Fail {
        Fail::Said(ErrorKind::Internal, message)
    }

    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            Fail::Core(e) => e.kind(),
            Fail::Said(kind, _) => *kind,
        }
    }

    pub(crate) fn message(&self) -> String {
        match self {
            Fail::Core(e) => e.to_string(),
            Fail::Said(_, m) => m.clone(),
        }
    }
}

pub(crate) type Res<T> = Result<T, Fail>;

/// Runs the body of an entry point: `ST_OK`, or `ST_FAILED` with `err` filled. A panic becomes
/// an `Internal` error instead of unwinding into C (which would abort the process).
pub(crate) fn run(err: *mut st_error, body: impl FnOnce() -> Res<()>) -> c_int {
    let outcome =
        catch(body).unwrap_or_else(|what| Err(Fail::Core(Error::Internal { message: what })));
    match outcome {
        Ok(()) => ST_OK,
        Err(fail) => {
            // SAFETY: `err` is NULL or the caller's valid `st_error` (the header's contract).
            unsafe { report(err, fail.kind(), &fail.message()) };
            ST_FAILED
        }
    }
}

/// Runs a function that returns nothing (the `*_free` calls): a panic is swallowed, never
/// unwound into C.
pub(crate) fn quietly(body: impl FnOnce()) {
    let _ = catch(body);
}

/// Fills `err` (when not NULL) with `kind` and `message`, NULs written as `\0`.
///
/// # Safety
/// `err` is NULL or points to an `st_error` whose message is NULL or one of ours.
unsafe fn report(err: *mut st_error, kind: ErrorKind, message: &str) {
    if err.is_null() {
        return;
    }
    let text = message.replace('\0', "\\0");
    // malloc, so that `st_error_clear` frees it whatever the caller did to the text.
    // SAFETY: a fresh allocation of `len + 1` bytes, filled below.
    let copy = unsafe { libc::malloc(text.len() + 1) }.cast::<u8>();
    // SAFETY: the caller's valid `st_error` (see above).
    let err = unsafe { &mut *err };
    // SAFETY: NULL or ours.
    unsafe { libc::free(err.message.cast()) };
    err.kind = kind as i32;
    if copy.is_null() {
        err.message = std::ptr::null_mut();
        err.message_len = 0;
        return;
    }
    // SAFETY: `copy` holds `len + 1` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), copy, text.len());
        *copy.add(text.len()) = 0;
    }
    err.message = copy.cast();
    err.message_len = text.len();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(err: &st_error) -> String {
        // SAFETY: a message this module wrote, `message_len` bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(err.message.cast::<u8>(), err.message_len) };
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn zeroed() -> st_error {
        st_error {
            kind: 0,
            message: std::ptr::null_mut(),
            message_len: 0,
        }
    }

    #[test]
    fn a_failure_fills_kind_and_whole_message_with_nul_escaped() {
        let mut err = zeroed();
        let rc = run(&mut err, || {
            Err(Error::TensorNotFound {
                name: "a\0b".into(),
            }
            .into())
        });
        assert_eq!(rc, ST_FAILED);
        assert_eq!(err.kind, ST_ERR_TENSOR_NOT_FOUND);
        assert_eq!(message(&err), "tensor `a\\0b` not found");
        // SAFETY: a message this module wrote is NUL-terminated.
        assert_eq!(unsafe { *err.message.add(err.message_len) }, 0);
        // SAFETY: our own st_error.
        unsafe { st_error_clear(&mut err) };
        assert!(err.message.is_null());
    }

    #[test]
    fn a_later_failure_replaces_the_message_and_success_leaves_it() {
        let mut err = zeroed();
        run(&mut err, || Err(Fail::careless("first".into())));
        assert_eq!(run(&mut err, || Ok(())), ST_OK);
        assert_eq!(message(&err), "first");
        run(&mut err, || {
            Err(Error::Cuda {
                message: "x".into(),
            }
            .into())
        });
        assert_eq!(err.kind, ST_ERR_CUDA);
        assert_eq!(message(&err), "CUDA: x");
        // SAFETY: our own st_error.
        unsafe { st_error_clear(&mut err) };
    }

    #[test]
    fn panics_become_internal_errors() {
        let mut err = zeroed();
        assert_eq!(run(&mut err, || panic!("boom")), ST_FAILED);
        assert_eq!(err.kind, ST_ERR_INTERNAL);
        assert!(message(&err).contains("boom"));
        // SAFETY: our own st_error.
        unsafe { st_error_clear(&mut err) };
        // Without an st_error the status alone says it.
        assert_eq!(run(std::ptr::null_mut(), || panic!("boom")), ST_FAILED);
    }

    #[test]
    fn kinds_are_the_core_numbers_and_names() {
        for (i, kind) in ErrorKind::ALL.iter().enumerate() {
            let name = st_error_kind_name(i as i32);
            // SAFETY: a static NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(name) };
            assert_eq!(name.to_str().unwrap(), kind.name());
        }
        // SAFETY: as above.
        assert!(unsafe { std::ffi::CStr::from_ptr(st_error_kind_name(23)) }
            .to_bytes()
            .is_empty());
        assert_eq!(ST_ERR_BUDGET_EXCEEDED, 22);
        assert_eq!(ST_ERR_INTERNAL, 20);
    }
}
