//! State that belongs to one process: the library's runtime and its HTTP clients.
//!
//! A child made by `fork` inherits the parent's memory but none of its threads: a runtime whose
//! workers stayed behind never runs a task again, and a pooled connection is a socket the
//! parent still speaks on (two processes writing requests into one stream would mix them). So
//! each value here is made for the process that first asks for it, and a child asking again
//! gets a value of its own. The parent's value is left untouched in the child (never dropped:
//! dropping a runtime waits for worker threads that do not exist there, and dropping a
//! connection could write on the parent's socket).
//!
//! Lock-free on purpose: a lock held by another thread of the parent at the moment of the fork
//! would stay held forever in the child.

use std::sync::atomic::{AtomicPtr, Ordering};

/// One value of `T` per process, made on first use by `make`.
pub(crate) struct PerProcess<T: 'static> {
    current: AtomicPtr<Slot<T>>,
    make: fn() -> T,
}

struct Slot<T> {
    pid: u32,
    value: T,
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    pub(crate) const fn new(make: fn() -> T) -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            make,
        }
    }

    /// This process's value, made now if this process has none yet.
    pub(crate) fn get(&'static self) -> &'static T {
        let pid = std::process::id();
        loop {
            let seen = self.current.load(Ordering::Acquire);
            // SAFETY: a published slot is never freed (a slot of an earlier process is leaked
            // on purpose, see the module comment), so the reference lives as long as `self`.
            if let Some(slot) = unsafe { seen.as_ref() } {
                if slot.pid == pid {
                    return &slot.value;
                }
            }
            let fresh = Box::into_raw(Box::new(Slot {
                pid,
                value: (self.make)(),
            }));
            match self
                .current
                .compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: just published, never freed (as above).
                Ok(_) => return unsafe { &(*fresh).value },
                Err(_) => {
                    // Another thread of this process published first: use its value, and drop
                    // ours, which no one else has seen.
                    // SAFETY: `fresh` came from `Box::into_raw` above and was never shared.
                    drop(unsafe { Box::from_raw(fresh) });
                }
            }
        }
    }
}
