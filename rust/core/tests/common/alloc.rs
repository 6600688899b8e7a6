//! A counting global allocator for the tests that measure heap use (`limits.rs`, `rank.rs`,
//! `slice_limits.rs`). Each of those installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: common::alloc::Counting = common::alloc::Counting;
//! ```
//!
//! Only a test binary that installs it counts anything; the others merely compile it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Tracks live and peak heap bytes. A reallocation counts as a new block plus the old one, as
/// the default `GlobalAlloc::realloc` does: the worst case of a copying allocator.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

/// The counters are process-wide: tests that measure take turns, each holding this.
pub fn measuring() -> MutexGuard<'static, ()> {
    static MEASURING: Mutex<()> = Mutex::new(());
    MEASURING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Peak heap growth while `f` runs (hold [`measuring`] around it).
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}
