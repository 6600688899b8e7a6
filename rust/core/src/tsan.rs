//! Hand-overs a C++ program's ThreadSanitizer cannot see. The core is not instrumented, so when
//! one thread hands memory to another through a lock of the core's (a `Mutex` of std: atomics
//! and futexes the sanitizer never sees), a sanitized program that reaches the same memory
//! from both threads is told they race: the first thread's `malloc` or `pread` into a buffer and
//! the second's `realloc` or `pread` into it, with nothing ordering them. Where the process has
//! the sanitizer's runtime (it exports `__tsan_acquire` and `__tsan_release`, found once with
//! `dlsym`), a lock that hands memory between threads announces itself: [`acquire`] just after
//! taking it, [`release`] just before giving it back, as the sanitizer's own mutex interceptors
//! would. Everywhere else both are a load of a cached null and nothing more.

use std::ffi::c_void;
use std::sync::OnceLock;

type Annotate = unsafe extern "C" fn(*mut c_void);

fn hooks() -> Option<(Annotate, Annotate)> {
    static HOOKS: OnceLock<Option<(Annotate, Annotate)>> = OnceLock::new();
    *HOOKS.get_or_init(|| {
        // SAFETY: dlsym with the default handle and NUL-terminated names only looks up symbols;
        // a found symbol is the sanitizer's `void f(void*)`, the type it is cast to.
        unsafe {
            let a = libc::dlsym(libc::RTLD_DEFAULT, c"__tsan_acquire".as_ptr());
            let r = libc::dlsym(libc::RTLD_DEFAULT, c"__tsan_release".as_ptr());
            if a.is_null() || r.is_null() {
                None
            } else {
                Some((
                    std::mem::transmute::<*mut c_void, Annotate>(a),
                    std::mem::transmute::<*mut c_void, Annotate>(r),
                ))
            }
        }
    })
}

/// Just after taking the lock whose address is `token`: this thread sees what every thread that
/// gave it back before did.
pub fn acquire<T>(token: &T) {
    if let Some((acquire, _)) = hooks() {
        // SAFETY: the sanitizer's annotation takes any address as a synchronisation token.
        unsafe { acquire(std::ptr::from_ref(token).cast_mut().cast()) }
    }
}

/// Just before giving back the lock whose address is `token`.
pub fn release<T>(token: &T) {
    if let Some((_, release)) = hooks() {
        // SAFETY: as in `acquire`.
        unsafe { release(std::ptr::from_ref(token).cast_mut().cast()) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_the_sanitizer_runtime_the_annotations_do_nothing() {
        // This test program has no ThreadSanitizer runtime: no hooks, and the calls return.
        assert!(super::hooks().is_none());
        let token = 5u32;
        super::acquire(&token);
        super::release(&token);
    }
}
