//! Hand-overs a C++ program's ThreadSanitizer cannot see. The core is not instrumented, so when
//! one thread hands memory to another through a lock of the core's (a `Mutex` of std: atomics
//! and futexes the sanitizer never sees), a sanitized program that reaches the same memory
//! from both threads is told they race: the first thread's `malloc` or `pread` into a buffer and
//! the second's `realloc` or `pread` into it, with nothing ordering them. Where the process has
//! the sanitizer's runtime (it exports `__tsan_acquire` and `__tsan_release`, found once with
//! `dlsym`), a lock that hands memory between threads announces itself: [`acquire`] just after
//! taking it, [`release`] just before giving it back, as the sanitizer's own mutex interceptors
//! would. Everywhere else both are a load of a cached null and nothing more.
//!
//! Where hand-overs are too many to announce (the remote runtime: tokio's workers and its HTTP
//! client pass buffers, tasks and connections among themselves), the runtime's threads ask the
//! sanitizer to ignore them instead ([`ignore_this_thread`], `__tsan_ignore_thread_begin`), until
//! they end ([`stop_ignoring_this_thread`]).

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};

type Annotate = unsafe extern "C" fn(*mut c_void);
type Annotate0 = unsafe extern "C" fn();

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

/// Tells the sanitizer to ignore every memory access of the calling thread from now on: for the
/// threads of an uninstrumented runtime of the library's own (remote reads: tokio and its HTTP
/// client), which hand memory between one another and to the caller through atomics the
/// sanitizer never sees, so that a sanitized program would be told of hundreds of races that
/// are not. The caller's own accesses are still checked. Nothing without the sanitizer.
///
/// A thread that calls this must call [`stop_ignoring_this_thread`] before it ends: the
/// sanitizer stops the program when a thread ends with its accesses still ignored.
pub fn ignore_this_thread() {
    static BEGIN: OnceLock<Option<Annotate0>> = OnceLock::new();
    call0(&BEGIN, c"__tsan_ignore_thread_begin");
}

/// Ends what [`ignore_this_thread`] began, on the same thread, just before it ends.
pub fn stop_ignoring_this_thread() {
    static END: OnceLock<Option<Annotate0>> = OnceLock::new();
    call0(&END, c"__tsan_ignore_thread_end");
}

/// Calls the sanitizer's argument-less annotation `name`, looked up once, where it exists.
fn call0(found: &OnceLock<Option<Annotate0>>, name: &std::ffi::CStr) {
    let f = found.get_or_init(|| {
        // SAFETY: as in `hooks`: a found symbol is the sanitizer's `void f(void)`.
        unsafe {
            let f = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
            (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, Annotate0>(f))
        }
    });
    if let Some(f) = f {
        // SAFETY: the sanitizer's annotation for the calling thread, which takes no argument.
        unsafe { f() }
    }
}

/// Just before giving back the lock whose address is `token`.
pub fn release<T>(token: &T) {
    if let Some((_, release)) = hooks() {
        // SAFETY: as in `acquire`.
        unsafe { release(std::ptr::from_ref(token).cast_mut().cast()) }
    }
}

/// `m` locked and the lock announced ([`acquire`] once taken, [`release`] as the guard drops),
/// for a lock of the core's that guards memory several threads write (a streaming writer's
/// piece lists, which grow on whichever thread writes). A poisoned lock is taken all the same:
/// no code of the core panics while holding one.
pub fn lock<T>(m: &Mutex<T>) -> Locked<'_, T> {
    let guard = m.lock().unwrap_or_else(|p| p.into_inner());
    acquire(m);
    Locked {
        guard,
        token: std::ptr::from_ref(m).cast(),
    }
}

/// A lock taken with [`lock`]: released to the sanitizer just before the lock itself.
pub struct Locked<'a, T> {
    guard: MutexGuard<'a, T>,
    token: *const u8,
}

impl<T> Drop for Locked<'_, T> {
    fn drop(&mut self) {
        // SAFETY of the token: only its address is used, as the sanitizer's token.
        if let Some((_, release)) = hooks() {
            // SAFETY: the sanitizer's annotation takes any address as a synchronisation token.
            unsafe { release(self.token.cast_mut().cast()) }
        }
    }
}

impl<T> std::ops::Deref for Locked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for Locked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_the_sanitizer_runtime_the_annotations_do_nothing() {
        // This test program has no ThreadSanitizer runtime: no hooks, and the calls return.
        assert!(super::hooks().is_none());
        let token = 5u32;
        super::ignore_this_thread();
        super::stop_ignoring_this_thread();
        super::acquire(&token);
        super::release(&token);
        let m = std::sync::Mutex::new(1);
        *super::lock(&m) += 1;
        assert_eq!(*super::lock(&m), 2);
    }
}
