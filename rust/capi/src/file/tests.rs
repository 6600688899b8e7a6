//! `st_file` from Rust, as C calls it: opening, lookups, reads and their errors.

use std::sync::atomic::{AtomicUsize, Ordering};

use safetensors_core::{serialize, Dtype, TensorView};

use super::*;
use crate::slice::{st_file_slice, st_slice_free, st_slice_read};
use crate::status::{st_error_clear, ST_ERR_INTERNAL, ST_ERR_INVALID_SLICE, ST_FAILED, ST_OK};

fn error() -> st_error {
    st_error {
        kind: -1,
        message: std::ptr::null_mut(),
        message_len: 0,
    }
}

fn message(err: &st_error) -> String {
    // SAFETY: a message the library wrote, `message_len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(err.message.cast::<u8>(), err.message_len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn file_bytes() -> Vec<u8> {
    let data: Vec<u8> = (0u8..16).collect();
    serialize([("w", TensorView::new(Dtype::U8, &[16], &data))], None).unwrap()
}

static RELEASED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_release(owner: *mut c_void) {
    RELEASED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the tests pass a leaked `Box<Vec<u8>>`.
    drop(unsafe { Box::from_raw(owner.cast::<Vec<u8>>()) });
}

/// Lends `bytes` to a new file with an owner that counts its releases.
unsafe fn lend(bytes: Vec<u8>, out: &mut *mut st_file, err: &mut st_error) -> c_int {
    let owner = Box::into_raw(Box::new(bytes));
    // SAFETY: the vector lives until `count_release` frees it.
    let (ptr, len) = unsafe { ((*owner).as_ptr(), (*owner).len()) };
    // SAFETY: valid arguments.
    unsafe {
        st_file_open_memory(
            ptr.cast(),
            len,
            std::ptr::null(),
            0,
            Some(count_release),
            owner.cast(),
            out,
            err,
        )
    }
}

#[test]
fn the_owner_of_lent_bytes_is_released_once_after_the_last_reader_or_on_failure() {
    // The only test touching RELEASED, so that counts are exact.
    let mut err = error();
    let mut file = std::ptr::null_mut();
    let mut bytes = file_bytes();
    bytes.pop(); // one byte short: refused
                 // SAFETY: valid arguments throughout.
    unsafe {
        assert_eq!(lend(bytes, &mut file, &mut err), ST_FAILED);
        assert_eq!(
            RELEASED.load(Ordering::SeqCst),
            1,
            "released before returning"
        );
        assert!(file.is_null());
        assert_eq!(lend(file_bytes(), &mut file, &mut err), ST_OK);
        let mut slice = std::ptr::null_mut();
        let rc = st_file_slice(
            file,
            c"w".as_ptr(),
            1,
            std::ptr::null(),
            0,
            &mut slice,
            &mut err,
        );
        assert_eq!(rc, ST_OK);
        st_file_free(file);
        assert_eq!(
            RELEASED.load(Ordering::SeqCst),
            1,
            "the slice still reads the bytes"
        );
        let mut out = [0u8; 16];
        assert_eq!(
            st_slice_read(slice, out.as_mut_ptr().cast(), 16, &mut err),
            ST_OK
        );
        assert_eq!(out[15], 15);
        st_slice_free(slice);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 2);
        st_error_clear(&mut err);
    }
}

#[test]
fn an_output_overlapping_the_file_in_memory_is_refused_before_a_byte_moves() {
    let mut bytes = file_bytes();
    let before = bytes.clone();
    let mut err = error();
    let mut file = std::ptr::null_mut();
    // SAFETY: the bytes outlive the file (freed below); every pointer is valid.
    unsafe {
        let rc = st_file_open_memory(
            bytes.as_ptr().cast(),
            bytes.len(),
            std::ptr::null(),
            0,
            None,
            std::ptr::null_mut(),
            &mut file,
            &mut err,
        );
        assert_eq!(rc, ST_OK);
        let dst = bytes.as_mut_ptr().add(bytes.len() - 16);
        let rc = st_file_read(file, c"w".as_ptr(), 1, dst.cast(), 16, &mut err);
        assert_eq!((rc, err.kind), (ST_FAILED, ST_ERR_INVALID_SLICE));
        assert!(message(&err).contains("overlaps"), "{}", message(&err));
        st_file_free(file);
        st_error_clear(&mut err);
    }
    assert_eq!(bytes, before);
}

#[test]
fn careless_calls_name_the_call_and_the_parameter() {
    let mut err = error();
    let mut desc = std::mem::MaybeUninit::<st_file_desc>::uninit();
    // SAFETY: NULL handles are what is tested; the out-pointer is valid.
    unsafe {
        let rc = st_file_describe(std::ptr::null(), desc.as_mut_ptr(), &mut err);
        assert_eq!((rc, err.kind), (ST_FAILED, ST_ERR_INTERNAL));
        assert_eq!(message(&err), "st_file_describe: `file` is NULL");
        let rc = st_file_open(
            c"/nonexistent".as_ptr(),
            0x8000_0000,
            &mut std::ptr::null_mut(),
            &mut err,
        );
        assert_eq!((rc, err.kind), (ST_FAILED, ST_ERR_INTERNAL));
        assert!(
            message(&err).contains("unknown flag bits 0x80000000"),
            "{}",
            message(&err)
        );
        st_error_clear(&mut err);
    }
}
