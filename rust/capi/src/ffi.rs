//! The few things every entry point repeats, once (the part of rustls-ffi's `ffi.rs` this crate
//! needs): catching a panic before it reaches C, handing an object out as a pointer the caller
//! owns and taking it back in its `st_*_free`, and static NUL-terminated names. This file
//! depends on nothing else of the crate, so that `status.rs` (the outcome of a call) and
//! `args.rs` (the arguments) both build on it without depending on each other both ways.

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// Runs `body`, catching a panic, whose text (if any) it returns instead: unwinding into C
/// aborts the process, so nothing may. The one panic boundary: `status::run` (calls that
/// report an outcome) and `status::quietly` (the frees) are built on it.
pub(crate) fn catch<R>(body: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(body)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    })
}

/// `object` handed to the caller, who frees it with its `st_*_free` ([`free_box`]).
pub(crate) fn hand_out<T>(object: T) -> *mut T {
    Box::into_raw(Box::new(object))
}

/// Takes back and drops an object [`hand_out`] gave (NULL is ignored), never unwinding.
///
/// # Safety
/// `p` is NULL or a pointer `hand_out::<T>` returned, not freed before.
pub(crate) unsafe fn free_box<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: the caller's promise: ours, freed once.
        let _ = catch(|| drop(unsafe { Box::from_raw(p) }));
    }
}

/// `name` as a static NUL-terminated string (names of kinds and dtypes): made once per name.
pub(crate) fn static_c_str(name: &'static str) -> *const c_char {
    static NAMES: Mutex<Option<HashMap<&'static str, &'static CStr>>> = Mutex::new(None);
    let interned = catch(|| {
        // Announced as a hand-over (`tsan::lock`): a name made on one thread is read by the
        // caller's code on every other.
        let mut names = safetensors_core::tsan::lock(&NAMES);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_with_its_text() {
        assert_eq!(catch(|| 7), Ok(7));
        assert_eq!(catch(|| -> () { panic!("boom") }), Err("boom".to_string()));
        let n = 3;
        assert_eq!(
            catch(|| -> () { panic!("n = {n}") }),
            Err("n = 3".to_string())
        );
    }

    #[test]
    fn handed_out_objects_are_freed_once_and_null_is_ignored() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Counted;
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let p = hand_out(Counted);
        // SAFETY: `p` from `hand_out`, freed once; NULL is ignored.
        unsafe {
            free_box(p);
            free_box(std::ptr::null_mut::<Counted>());
        }
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn static_names_are_interned_and_nul_terminated() {
        let a = static_c_str("F32");
        assert_eq!(a, static_c_str("F32"));
        // SAFETY: a static NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(a) }.to_str(), Ok("F32"));
    }
}
