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

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// One value of `T` per process, made on first use by `make`, once: threads of one process that
/// ask at the same moment wait for the one making it (a runtime made twice would start worker
/// threads only to stop them again).
pub(crate) struct PerProcess<T: 'static> {
    current: AtomicPtr<Slot<T>>,
    /// The process whose value is being made now (0: none). A child made by `fork` while its
    /// parent was making one sees the parent's number, not its own, and makes its own.
    making: AtomicU32,
    make: fn() -> T,
}

struct Slot<T> {
    pid: u32,
    value: T,
}

/// Gives the claim to make a value back if `make` unwinds, so that another thread may try.
struct Claim<'a>(&'a AtomicU32);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    pub(crate) const fn new(make: fn() -> T) -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            making: AtomicU32::new(0),
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
            let other = self.making.load(Ordering::Acquire);
            if other == pid {
                // Another thread of this process is making it: wait for its publication.
                std::thread::yield_now();
                continue;
            }
            if self
                .making
                .compare_exchange(other, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            let claim = Claim(&self.making);
            // Made and published by another thread between the first look and the claim?
            let seen = self.current.load(Ordering::Acquire);
            // SAFETY: as above.
            if let Some(slot) = unsafe { seen.as_ref() } {
                if slot.pid == pid {
                    return &slot.value;
                }
            }
            let fresh = Box::into_raw(Box::new(Slot {
                pid,
                value: (self.make)(),
            }));
            // Only the holder of this process's claim publishes for this process.
            self.current.store(fresh, Ordering::Release);
            drop(claim);
            // SAFETY: just published, never freed (as above).
            return unsafe { &(*fresh).value };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PerProcess;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static MADE: AtomicUsize = AtomicUsize::new(0);

    fn make() -> usize {
        // Slow enough that the other threads arrive while this one is making it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        MADE.fetch_add(1, Ordering::SeqCst)
    }

    static VALUE: PerProcess<usize> = PerProcess::new(make);

    #[test]
    fn threads_asking_at_once_get_the_one_value_made_once() {
        let barrier = std::sync::Barrier::new(8);
        let got: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        std::ptr::from_ref(VALUE.get()) as usize
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(MADE.load(Ordering::SeqCst), 1, "made more than once");
        assert!(
            got.iter().all(|&p| p == got[0]),
            "threads got different values"
        );
    }
}
