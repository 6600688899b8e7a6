//! Staged uploads: tensors (or slices), from one or more files, into one destination buffer,
//! through a small ring of staging buffers filled by several reader threads.
//!
//! The destination is abstract ([`UploadTarget`]): the CUDA path (`rust/cuda`) implements it with
//! pinned host memory, a non-blocking stream and events; the tests implement it over host
//! memory and check that every byte lands where the plan says. Host memory stays bounded by the
//! ring (`slots × slot_bytes`) whatever the size of the model.
//!
//! How it runs (`schedule.rs`): the destination range `[0, plan.total())` is cut into chunks of
//! one slot each, and each chunk into stripes ([`PipelineOptions::stripe_bytes`], 2 MiB by
//! default). The readers, threads the ring keeps for its life (`readers.rs`), claim stripes in
//! order from one counter, so that every reader works on the oldest chunk not yet filled and
//! chunks complete one after another at the readers' combined rate, rather than in rounds of
//! one chunk per reader. Chunk `k` uses slot `k % slots`: the first reader to reach it waits
//! until chunk `k - slots` has been submitted from that slot and its copy has completed; the
//! readers fill their stripes (`pread`, or a copy from the mapping; `fill.rs`), and the one that
//! fills the chunk's last stripe submits one asynchronous copy of the whole chunk. Bytes of the
//! destination that no tensor covers (alignment padding) are zeroed.
//!
//! A target may also copy spans straight out of the files' pages (zero-copy,
//! [`UploadTarget::copy_direct`]): one reader then takes whole chunks from the same counter when
//! it meets one at the front of the queue, so that staging and zero-copy share the work in
//! order, each taking more when it is faster.
//!
//! Streaming delivery (each tensor handed over as it lands, optionally through a bounded device
//! scratch ring) runs the same readers with two hooks: see [`landing`]. A run can record its
//! timeline: see [`trace`].

mod fill;
pub mod landing;
mod plan;
mod readers;
mod schedule;
pub mod trace;

pub use fill::{DirectRun, DirectSpan};
pub use plan::{alignment, place, Placement, UploadPlan, DEFAULT_ALIGNMENT};
pub use readers::on_reader_thread;
pub use trace::{ChunkTimes, DeviceCopy, Timeline, TraceSummary};

pub(crate) use fill::{carve, read_grouped};

use std::sync::{Condvar, Mutex};

use crate::error::Result;
use crate::file::SafeFile;
use landing::RunShape;

/// Where an upload goes: staging buffers the readers fill, and asynchronous copies out of them
/// into the destination (the CUDA path: pinned memory, events, a stream and a device pointer).
pub trait UploadTarget: Sync {
    /// A staging buffer plus whatever tracks its last copy (an event). Dropping a slot frees
    /// it; the ring drops a slot only after [`UploadTarget::wait`] returned `Ok` for it.
    type Slot: Send;
    /// A staging buffer of `bytes` bytes.
    fn new_slot(&self, bytes: usize) -> Result<Self::Slot>;
    /// The host memory of a slot.
    fn buffer<'s>(&self, slot: &'s mut Self::Slot) -> &'s mut [u8];
    /// Starts copying the first `len` bytes of the slot to `dst_offset`; may return before the
    /// copy is done. On error the slot must still be safe to wait on and reuse: a copy that
    /// was enqueued is either tracked or waited for before returning.
    fn submit(&self, slot: &mut Self::Slot, len: usize, dst_offset: u64) -> Result<()>;
    /// Blocks until the slot's last submitted copy is done (immediately if none).
    fn wait(&self, slot: &mut Self::Slot) -> Result<()>;
    /// Runs on each reader thread before its first call of a run (CUDA makes its context
    /// current; on the ring's own reader threads, once for the thread's life).
    fn enter_thread(&self) -> Result<()> {
        Ok(())
    }
    /// Runs on each reader thread after its last call of a run, even after an error (CUDA
    /// restores the context a thread not of the ring had).
    fn leave_thread(&self) {}
    /// Whether to offer spans to [`UploadTarget::copy_direct`] in this run (asked once per run;
    /// only runs that wait for their copies before returning, [`Ring::upload`], ask).
    fn takes_direct(&self) -> bool {
        false
    }
    /// Chunks a zero-copy span covers at most (the feeder claims that many at once).
    fn direct_chunks(&self) -> usize {
        1
    }
    /// Copies the destination bytes of `span` straight from the files (bytes no run covers are
    /// zeros), without staging: `Ok(true)` once every copy is submitted, `Ok(false)` when it
    /// cannot (the ring then stages the span). The copies must be complete, and whatever they
    /// held released, when [`UploadTarget::finish_direct`] returns.
    fn copy_direct(&self, span: &DirectSpan<'_>) -> Result<bool> {
        let _ = span;
        Ok(false)
    }
    /// Waits for every copy [`UploadTarget::copy_direct`] submitted and releases what they held;
    /// called once the run's readers are done, even after an error.
    fn finish_direct(&self) -> Result<()> {
        Ok(())
    }
}

/// Sizes of the staging ring and how many threads fill it.
///
/// Sizing for a PCIe Gen5 x16 link (about 50 GB/s host to device) on a 16-core host: one
/// reader copies file bytes (from the page cache, with `pread` or from the mapping) into
/// pinned memory at roughly 6-10 GB/s, so keeping the link busy takes 50 / 6 ≈ 8 readers
/// filling at once: half of 16 cores, leaving the rest to the caller and the kernel's page
/// cache work. With readers sharing every chunk in stripes, a 16 MiB chunk fills in
/// 16 MiB / 47 GB/s ≈ 0.35 ms and crosses the link in ≈ 0.34 ms, so the link waits for the
/// first chunk about that long and drains for one chunk at the end; 4 slots more than readers
/// keep copies queued through the jitter of the fills. Hence the defaults: readers =
/// clamp(cores / 2, 1, 8), slots = readers + 4, 16 MiB each (192 MiB of pinned memory on a
/// 16-core host; 80 MiB on 2 cores). Chunks much smaller than 16 MiB pay the per-copy launch
/// and event cost (~10 µs) too often; much larger ones lengthen the pipeline's fill and drain
/// at the start and end of every upload. (Before stripes, each reader filled a whole chunk
/// alone, so the first copy waited for readers × 16 MiB and the last drained as long: a fixed
/// ~4.5 ms per load on the H200, docs/gpu.md.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// Number of staging buffers (more than `readers`, so that copies stay queued while every
    /// reader fills); at most [`MAX_SLOTS`].
    pub slots: usize,
    /// Bytes in each staging buffer.
    pub slot_bytes: usize,
    /// Reader threads; at most [`MAX_READERS`].
    pub readers: usize,
}

/// The most staging buffers a ring holds (larger counts are clamped): a count taken from a
/// careless option must not become an allocation that aborts the process.
pub const MAX_SLOTS: usize = 1024;
/// The most reader threads a ring starts (larger counts are clamped), for the same reason.
pub const MAX_READERS: usize = 64;

impl RingOptions {
    /// The options as both bindings take them: each count 0 for its default (larger counts
    /// are clamped where the ring is made, [`MAX_SLOTS`], [`MAX_READERS`]).
    pub fn with_counts(slots: usize, slot_bytes: usize, readers: usize) -> RingOptions {
        let d = RingOptions::default();
        let pick = |v: usize, default: usize| if v == 0 { default } else { v };
        RingOptions {
            slots: pick(slots, d.slots),
            slot_bytes: pick(slot_bytes, d.slot_bytes),
            readers: pick(readers, d.readers),
        }
    }
}

impl Default for RingOptions {
    /// See the type's documentation for the arithmetic.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let readers = (cores / 2).clamp(1, 8);
        RingOptions {
            slots: readers + 4,
            slot_bytes: 16 << 20,
            readers,
        }
    }
}

/// How the readers share a run's work and what a run records, beside [`RingOptions`]'s sizes.
/// [`PipelineOptions::default`] reads the environment, so that a program (a benchmark, the GPU
/// kit's probe) can choose without new arguments:
/// - `SAFETENSORS_UPLOAD_STRIPE=<bytes>` (suffix `K` or `M` for KiB or MiB): stripe size; `0`
///   for whole chunks, one reader each (the schedule before stripes);
/// - `SAFETENSORS_UPLOAD_TRACE=<anything but 0>`: record each run's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Bytes a reader fills at a time; every chunk is cut into stripes of this size (the last
    /// one shorter), which readers claim in order. 0, or at least the chunk size: one reader
    /// fills each chunk whole. Not a multiple of 4 KiB: rounded up to one.
    pub stripe_bytes: usize,
    /// Record each run's [`Timeline`] ([`Ring::take_trace`]).
    pub trace: bool,
    /// A floor under fill time, in nanoseconds per MiB (0: none): each stripe takes at least
    /// this long, as from a source slower than the page cache. For tests of the schedule, whose
    /// timing must not depend on how busy the machine's cores are (a reader that sleeps needs no
    /// core), and never set by the defaults.
    pub min_fill_ns_per_mib: u64,
}

/// The default stripe: 2 MiB, InstantTensor's stripe (48.5 GB/s to an H200 from tmpfs with 32
/// threads); small enough that eight readers fill a 16 MiB chunk together, large enough that a
/// stripe's claim and bookkeeping (~1 µs) is nothing beside its copy (~200 µs).
pub const DEFAULT_STRIPE: usize = 2 << 20;

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions::from_env()
    }
}

impl PipelineOptions {
    /// The defaults, as the environment overrides them (see the type's documentation).
    pub fn from_env() -> PipelineOptions {
        let stripe_bytes = std::env::var("SAFETENSORS_UPLOAD_STRIPE")
            .ok()
            .and_then(|v| parse_bytes(&v))
            .unwrap_or(DEFAULT_STRIPE);
        let trace =
            std::env::var("SAFETENSORS_UPLOAD_TRACE").is_ok_and(|v| !v.is_empty() && v != "0");
        PipelineOptions {
            stripe_bytes,
            trace,
            min_fill_ns_per_mib: 0,
        }
    }
}

/// `text` as a byte count: digits, optionally followed by `K` (KiB) or `M` (MiB).
pub fn parse_bytes(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, ""),
    };
    let n: usize = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        _ => return None,
    };
    n.checked_mul(scale)
}

struct SlotState<S> {
    /// The chunk of the current run allowed to use this slot next.
    turn: usize,
    /// Set (under this lock, so no waiter can miss it) when a reader of the current run failed.
    aborted: bool,
    /// The staging buffer, allocated on first use in a lazy ring, and its size.
    slot: Option<S>,
    capacity: usize,
    /// The chunk whose stripes are being filled (its slot made ready), the stripes of it not yet
    /// filled, and where the buffer is meanwhile (stripes are filled without the lock).
    filling: Option<usize>,
    left: usize,
    base: usize,
    /// A reader is making the slot ready for `turn` (waiting for its previous copy).
    preparing: bool,
}

/// A ring of staging buffers and the threads that fill them, reusable across uploads to the
/// same device, and safe to share between threads: runs take turns (the copy engine is one
/// link; two runs at once would only split it), so each run numbers its chunks from 0 against
/// the ring's slots on its own.
pub struct Ring<S> {
    slots: Vec<(Mutex<SlotState<S>>, Condvar)>,
    slot_bytes: usize,
    readers: usize,
    pipeline: PipelineOptions,
    /// Held for the whole of a run (and of `wait_all`): one run owns the slots' turns at a time.
    running: Mutex<()>,
    threads: readers::Readers,
    /// The last run's timeline, when tracing.
    trace: Mutex<Option<Timeline>>,
}

/// What an upload moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UploadStats {
    /// Bytes copied to the destination, padding included.
    pub bytes: u64,
    /// Chunks (one copy each when staged).
    pub chunks: usize,
    /// Of `chunks`, those copied straight from the files (zero-copy).
    pub zero_copy_chunks: usize,
}

impl<S: Send> Ring<S> {
    /// Allocates every staging buffer on `target` now (a dedicated uploader: no allocation,
    /// which on CUDA synchronises the device, happens during a later upload).
    pub fn new<T: UploadTarget<Slot = S>>(target: &T, options: RingOptions) -> Result<Ring<S>> {
        let ring = Ring::lazy(options);
        for (state, _) in &ring.slots {
            let mut st = lock(state);
            st.slot = Some(target.new_slot(ring.slot_bytes)?);
            st.capacity = ring.slot_bytes;
        }
        Ok(ring)
    }

    /// A ring that allocates a staging buffer only when a chunk first needs it, no larger than
    /// the upload needs (a 1 KiB tensor stages through 4 KiB, not `slot_bytes`), and grows it
    /// when a later upload needs more. For uploaders shared by one-shot calls.
    pub fn lazy(options: RingOptions) -> Ring<S> {
        let count = options.slots.clamp(1, MAX_SLOTS);
        let slots = (0..count)
            .map(|i| {
                let state = SlotState {
                    turn: i,
                    aborted: false,
                    slot: None,
                    capacity: 0,
                    filling: None,
                    left: 0,
                    base: 0,
                    preparing: false,
                };
                (Mutex::new(state), Condvar::new())
            })
            .collect();
        Ring {
            slots,
            slot_bytes: options.slot_bytes.max(4096),
            readers: options.readers.clamp(1, MAX_READERS),
            pipeline: PipelineOptions::from_env(),
            running: Mutex::new(()),
            threads: readers::Readers::new(),
            trace: Mutex::new(None),
        }
    }

    /// The ring with `pipeline` instead of the environment's defaults.
    pub fn with_pipeline(mut self, pipeline: PipelineOptions) -> Ring<S> {
        self.pipeline = pipeline;
        self
    }

    /// How the readers share the work.
    pub fn pipeline(&self) -> PipelineOptions {
        self.pipeline
    }

    /// Reader threads started so far (they live as long as the ring).
    pub fn reader_threads(&self) -> usize {
        self.threads.started()
    }

    /// The last run's timeline, when tracing ([`PipelineOptions::trace`]); taken, so that the
    /// next call gives the next run's.
    pub fn take_trace(&self) -> Option<Timeline> {
        lock(&self.trace).take()
    }

    /// Bytes of staging memory the ring holds now.
    pub fn staging_bytes(&self) -> usize {
        self.slots.iter().map(|(s, _)| lock(s).capacity).sum()
    }

    /// Copies everything `plan` names from `files` (indexed by the plan's source numbers) into
    /// the target. Returns once every chunk is submitted; call [`Ring::wait_all`] for completion.
    /// Concurrent runs through one ring take turns.
    pub fn run<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        files: &[&SafeFile],
        plan: &UploadPlan,
    ) -> Result<UploadStats> {
        let _running = self.take_turn();
        self.run_locked(target, files, plan, self.plain_shape(), &mut || Ok(()))
    }

    /// [`Ring::run`] then [`Ring::wait_all`] in one turn: on return, successful or not, no copy
    /// of this upload is pending (unless waiting itself failed, which the error says).
    pub fn upload<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        files: &[&SafeFile],
        plan: &UploadPlan,
    ) -> Result<UploadStats> {
        self.upload_while(target, files, plan, &mut || Ok(()))
    }

    /// [`Ring::upload`], with `alongside` run on the calling thread while the readers start
    /// filling: what the first copies need and the readers do not (the CUDA uploader allocates
    /// the destination there, its copies waiting for the address). An error of `alongside`
    /// stops the upload and is the one returned.
    pub fn upload_while<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        files: &[&SafeFile],
        plan: &UploadPlan,
        alongside: &mut dyn FnMut() -> Result<()>,
    ) -> Result<UploadStats> {
        let _running = self.take_turn();
        let shape = RunShape {
            direct: true,
            main_error_first: true,
            ..self.plain_shape()
        };
        let run = self.run_locked(target, files, plan, shape, alongside);
        let waited = self.wait_all_locked(target);
        let stats = run?;
        waited.map(|()| stats)
    }

    /// Chunks of one slot, placed where the plan says, with no streaming hooks.
    fn plain_shape(&self) -> RunShape<'static> {
        RunShape {
            chunk: self.slot_bytes as u64,
            lap: None,
            progress: None,
            direct: false,
            main_error_first: false,
        }
    }

    /// The slot size: the chunk size of uploads into one destination.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Blocks until every submitted copy is done. Waits on every slot even after an error (a
    /// caller frees the destination on error, which must not happen under a pending copy) and
    /// returns the first error.
    pub fn wait_all<T: UploadTarget<Slot = S>>(&self, target: &T) -> Result<()> {
        let _running = self.take_turn();
        self.wait_all_locked(target)
    }

    fn wait_all_locked<T: UploadTarget<Slot = S>>(&self, target: &T) -> Result<()> {
        let mut first = target.finish_direct();
        for (state, _) in &self.slots {
            if let Some(slot) = lock(state).slot.as_mut() {
                let r = target.wait(slot);
                if first.is_ok() {
                    first = r;
                }
            }
        }
        first
    }

    /// Gives the staging buffers back (after [`Ring::wait_all`]).
    pub fn into_slots(self) -> Vec<S> {
        self.slots
            .into_iter()
            .filter_map(|(m, _)| m.into_inner().unwrap_or_else(|p| p.into_inner()).slot)
            .collect()
    }
}

impl<S> Ring<S> {
    /// The ring's turn (see `running`). Runs hand the slots and the reader threads from one
    /// caller's thread to the next through this lock: what the last run waited for (its copies
    /// out of the slots) is ordered before what the next run's readers write there, which a
    /// sanitized C++ program sees only when the hand-over is announced (`crate::tsan`): the
    /// readers, kept between runs, make no driver call of their own that would order them.
    fn take_turn(&self) -> Turn<'_> {
        let guard = lock(&self.running);
        crate::tsan::acquire(&self.running);
        Turn {
            _guard: guard,
            token: &self.running,
        }
    }
}

/// A run's turn on its ring; announces its end before unlocking.
struct Turn<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    token: &'a Mutex<()>,
}

impl Drop for Turn<'_> {
    // Runs before the guard it holds unlocks.
    fn drop(&mut self) {
        crate::tsan::release(self.token);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_take_kib_and_mib() {
        assert_eq!(parse_bytes("2M"), Some(2 << 20));
        assert_eq!(parse_bytes("512K"), Some(512 << 10));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("2G"), None);
        assert_eq!(parse_bytes("x"), None);
    }
}
