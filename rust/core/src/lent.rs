//! Memory a caller outside Rust lends to a file (C's `st_file_open_memory`, C++'s
//! `SafeOpen::from_bytes`), borrowed without a copy: this module owns the one unsafe contract
//! of that loan, and the release of the lender's owner exactly once.
//!
//! The core holds its files in `Arc`s (slices, streams, prefetches and uploads keep theirs), so
//! the bytes must live exactly as long as the last reader, whichever object the user drops
//! first, and the lender must hear when that is, from whichever thread drops it. The lender's
//! "let go" is a C function and a context pointer, the one shape both C callers and the C++
//! wrapper (a heap copy of a `std::shared_ptr` and a function that deletes it) can hand over.

use std::ffi::c_void;

use crate::file::MemoryBytes;

/// A lender's owner of lent bytes: `release(context)` is called exactly once, when this is
/// dropped, from the thread that drops it.
pub struct Release {
    release: unsafe extern "C" fn(*mut c_void),
    context: *mut c_void,
}

impl Release {
    /// An owner released by `release(context)`.
    ///
    /// Made before the call that lends the bytes checks anything, so that the owner is released
    /// on every path out of it, errors included.
    ///
    /// # Safety
    /// `release(context)` may be called once, from any thread.
    pub unsafe fn new(release: unsafe extern "C" fn(*mut c_void), context: *mut c_void) -> Release {
        Release { release, context }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        // SAFETY: `Release::new`'s contract: a function to call once with `context`.
        unsafe { (self.release)(self.context) }
    }
}

// SAFETY: `Release::new`'s contract allows the call from any thread; the context is only passed
// back to the lender's function.
unsafe impl Send for Release {}
// SAFETY: nothing is reachable through a shared `&Release`.
unsafe impl Sync for Release {}

/// Bytes a caller lends to a file: read in place until the file and every reader made from it
/// are dropped, then the owner (if any) is released.
pub struct LentBytes {
    ptr: *const u8,
    len: usize,
    /// Never read: released when the bytes are dropped.
    _owner: Option<Release>,
}

impl LentBytes {
    /// `len` bytes at `ptr`, and their owner.
    ///
    /// # Safety
    /// With `len` above 0, `ptr` points to `len` readable bytes that stay alive and unchanged
    /// until `owner` is released (with no owner: until every reader is dropped), whichever
    /// thread reads them.
    pub unsafe fn new(ptr: *const u8, len: usize, owner: Option<Release>) -> LentBytes {
        LentBytes {
            ptr,
            len,
            _owner: owner,
        }
    }

    /// The bytes as a file in memory holds them ([`crate::SafeFile::from_memory`]).
    pub fn into_memory(self) -> MemoryBytes {
        Box::new(self)
    }
}

// SAFETY: the bytes are only read, and `LentBytes::new`'s contract keeps them alive and
// unchanged for readers on any thread; the owner is `Send` and `Sync`.
unsafe impl Send for LentBytes {}
// SAFETY: as above.
unsafe impl Sync for LentBytes {}

impl AsRef<[u8]> for LentBytes {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            // An empty loan may come with any pointer, NULL included, which a slice may not.
            return &[];
        }
        // SAFETY: `LentBytes::new`'s contract: `len` bytes at `ptr`, alive and unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::{serialize, Dtype, ErrorKind, OpenOptions, SafeFile, TensorView};

    unsafe extern "C" fn count(context: *mut c_void) {
        // SAFETY: the tests pass a leaked `Arc<AtomicUsize>`.
        let n = unsafe { Arc::from_raw(context.cast::<AtomicUsize>()) };
        n.fetch_add(1, Ordering::SeqCst);
    }

    fn owner(n: &Arc<AtomicUsize>) -> Release {
        let context = Arc::into_raw(n.clone()).cast_mut().cast();
        // SAFETY: `count` takes its `Arc` back once.
        unsafe { Release::new(count, context) }
    }

    #[test]
    fn the_owner_is_released_once_after_the_last_reader() {
        let data = [1u8, 2, 3, 4];
        let bytes = serialize([("w", TensorView::new(Dtype::U8, &[4], &data))], None).unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        // SAFETY: `bytes` outlives the file and its readers (dropped below, before it).
        let lent = unsafe { LentBytes::new(bytes.as_ptr(), bytes.len(), Some(owner(&n))) };
        let file = Arc::new(
            SafeFile::from_memory("m", lent.into_memory(), OpenOptions::default()).unwrap(),
        );
        let reader = file.clone();
        drop(file);
        assert_eq!(n.load(Ordering::SeqCst), 0);
        let moved = std::thread::spawn(move || {
            assert_eq!(reader.tensor_bytes("w").unwrap().as_ref(), data);
        });
        moved.join().unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_refused_file_releases_its_owner_before_the_error_returns() {
        let n = Arc::new(AtomicUsize::new(0));
        let junk = [0u8; 3];
        // SAFETY: `junk` outlives the call.
        let lent = unsafe { LentBytes::new(junk.as_ptr(), junk.len(), Some(owner(&n))) };
        let e = SafeFile::from_memory("m", lent.into_memory(), OpenOptions::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::HeaderTooSmall);
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_empty_loan_may_have_a_null_pointer() {
        // SAFETY: nothing is read from an empty loan.
        let lent = unsafe { LentBytes::new(std::ptr::null(), 0, None) };
        assert!(lent.as_ref().is_empty());
    }
}
