//! Pinned memory kept between uploads. Page-locking is slow and serialises the device (the
//! driver documents `cuMemHostAlloc` as "best used sparingly"), so a staging buffer that no slot
//! holds any more goes to its device's idle list instead of being unpinned, and the next slot of
//! that device, whatever ring, uploader or options it belongs to, takes it from there instead of
//! pinning anew. A one-shot `load` with ring options of its own thus pins its slots once per
//! process, not once per call.
//!
//! Bounded: a device keeps at most [`IDLE_SLOTS`] buffers and [`IDLE_BYTES`] bytes idle (enough
//! for the default ring of a 16-core host, 12 slots of 16 MiB); past that the buffers idle the
//! longest are unpinned first. [`release_idle`] unpins every idle buffer of a device at once.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::{Error, Result};

use crate::driver::{call, Current};

/// The most pinned buffers a device keeps idle between uploads.
pub const IDLE_SLOTS: usize = 16;
/// The most bytes of pinned memory a device keeps idle between uploads.
pub const IDLE_BYTES: usize = 256 << 20;

/// A page-locked host buffer and its event (blocking sync), in one device's primary context.
/// Dropping it unpins the buffer and destroys the event: only once no copy uses either.
pub(crate) struct Pinned {
    pub(crate) host: *mut u8,
    pub(crate) capacity: usize,
    pub(crate) event: sys::CUevent,
    ctx: sys::CUcontext,
}

// SAFETY: the buffer and event are owned by whoever holds the `Pinned`, one thread at a time.
unsafe impl Send for Pinned {}

impl Pinned {
    fn alloc(ctx: sys::CUcontext, bytes: usize) -> Result<Pinned> {
        let _current = Current::enter(ctx)?;
        // Flags 0: page-locked, cached host memory (not write-combined, which CPU writes of file
        // data would pay for).
        // SAFETY: the context is current; the memory is only read after being written.
        let host = call("cuMemHostAlloc", || unsafe { cu::malloc_host(bytes, 0) }).map_err(|e| {
            Error::Cuda {
                message: format!("{e} (allocating {bytes} bytes of pinned staging memory)"),
            }
        })? as *mut u8;
        // From here on, `Drop` frees what was allocated if the event cannot be created.
        let mut pinned = Pinned {
            host,
            capacity: bytes,
            event: std::ptr::null_mut(),
            ctx,
        };
        // Blocking sync: a reader waiting for its slot sleeps rather than spinning.
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: writes one event handle.
        call("cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut pinned.event, flags).result()
        })?;
        Ok(pinned)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let Ok(_current) = Current::enter(self.ctx) else {
            return;
        };
        if !self.event.is_null() {
            // SAFETY: owned here, destroyed once, no copy pending (the holder's promise).
            let _ = call("cuEventDestroy", || unsafe {
                cu::event::destroy(self.event)
            });
        }
        // SAFETY: owned here, freed once, no copy pending (the holder's promise).
        let _ = call("cuMemFreeHost", || unsafe {
            cu::free_host(self.host as *mut c_void)
        });
    }
}

/// Each device's idle buffers (by ordinal), the longest idle first.
static IDLE: Mutex<Vec<(usize, VecDeque<Pinned>)>> = Mutex::new(Vec::new());

/// The idle lists, locked. Buffers pass through them from one thread's ring to another's (ranks
/// on threads of their own, uploaders on several threads), so the lock announces each hand-over
/// to a sanitized C++ program ([`safetensors_core::tsan`]): without that, one thread's `pread`
/// into a buffer and the next thread's, or their growing of the lists, read as races there.
fn idle() -> Idle {
    let guard = IDLE.lock().unwrap_or_else(|p| p.into_inner());
    safetensors_core::tsan::acquire(&IDLE);
    Idle(guard)
}

struct Idle(std::sync::MutexGuard<'static, Vec<(usize, VecDeque<Pinned>)>>);

impl std::ops::Deref for Idle {
    type Target = Vec<(usize, VecDeque<Pinned>)>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Idle {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Idle {
    // Runs before the guard it holds unlocks.
    fn drop(&mut self) {
        safetensors_core::tsan::release(&IDLE);
    }
}

/// A pinned buffer of at least `bytes` for device `ordinal` (primary context `ctx`): an idle one
/// when one fits, else a new one. An idle buffer more than twice `bytes` is left idle: the slot
/// would hold memory its ring does not count, and a small slot kept for long (a one-shot ring's)
/// would keep a large buffer pinned.
pub(crate) fn take(ctx: sys::CUcontext, ordinal: usize, bytes: usize) -> Result<Pinned> {
    let found = {
        let mut idle = idle();
        idle.iter_mut()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, list)| {
                let fits = |p: &Pinned| p.capacity >= bytes && p.capacity / 2 <= bytes;
                let best = list
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| fits(p))
                    .min_by_key(|(_, p)| p.capacity)
                    .map(|(i, _)| i)?;
                list.remove(best)
            })
    };
    match found {
        Some(p) => Ok(p),
        None => {
            // Allocated from the memory of the device's NUMA node, where it has one.
            let _there = crate::numa::PreferNode::new(crate::driver::node_of(ordinal).as_ref());
            Pinned::alloc(ctx, bytes)
        }
    }
}

/// Keeps `pinned` (no copy pending on it) idle for its device's next slot, unpinning what then
/// exceeds the bounds, the longest idle first.
pub(crate) fn give_back(ordinal: usize, pinned: Pinned) {
    let mut unpin = Vec::new();
    {
        let mut idle = idle();
        let at = match idle.iter().position(|(o, _)| *o == ordinal) {
            Some(at) => at,
            None => {
                idle.push((ordinal, VecDeque::new()));
                idle.len() - 1
            }
        };
        let list = &mut idle[at].1;
        list.push_back(pinned);
        let mut bytes: usize = list.iter().map(|p| p.capacity).sum();
        while list.len() > IDLE_SLOTS || bytes > IDLE_BYTES {
            let Some(old) = list.pop_front() else { break };
            bytes -= old.capacity;
            unpin.push(old);
        }
    }
    // Unpinned outside the lock: freeing pinned memory may wait for the device.
    drop(unpin);
}

/// Unpins every buffer `ordinal` keeps idle; returns the bytes unpinned. Slots in use (by an
/// uploader, or the one-shot calls' shared uploader) are not touched.
pub fn release_idle(ordinal: usize) -> usize {
    let list = {
        let mut idle = idle();
        match idle.iter_mut().find(|(o, _)| *o == ordinal) {
            Some((_, list)) => std::mem::take(list),
            None => VecDeque::new(),
        }
    };
    list.iter().map(|p| p.capacity).sum()
}
