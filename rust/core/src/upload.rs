//! Staged uploads: tensors (or slices), from one or more files, into one destination buffer,
//! through a small ring of staging buffers filled by several reader threads.
//!
//! The destination is abstract ([`UploadTarget`]): the CUDA path (`rust/cuda`) implements it with
//! pinned host memory, a non-blocking stream and events; the tests implement it over host
//! memory and check that every byte lands where the plan says. Host memory stays bounded by the
//! ring (`slots × slot_bytes`) whatever the size of the model.
//!
//! How it runs: the destination range `[0, plan.total())` is cut into chunks of one slot each.
//! Reader threads claim chunks in order; chunk `k` uses slot `k % slots`, waits until chunk
//! `k - slots` has been submitted from that slot and its copy has completed, fills the slot from
//! the files (`pread`, or a copy from the mapping), and submits one asynchronous copy of the
//! whole chunk. Bytes of the destination that no tensor covers (alignment padding) are zeroed.
//!
//! Streaming delivery (each tensor handed over as it lands, optionally through a bounded device
//! scratch ring) runs the same readers with two hooks: see [`landing`].

pub mod landing;
mod plan;

use plan::Piece;
pub use plan::{Placement, UploadPlan};

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::slice::SlicePlan;

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
    /// Runs on each reader thread before its first call (CUDA makes its context current).
    fn enter_thread(&self) -> Result<()> {
        Ok(())
    }
    /// Runs on each reader thread after its last call, even after an error (CUDA restores the
    /// context the thread had).
    fn leave_thread(&self) {}
}

/// Sizes of the staging ring and how many threads fill it.
///
/// Sizing for a PCIe Gen5 x16 link (about 50 GB/s host to device) on a 16-core host: one
/// reader copies file bytes (from the page cache, with `pread` or from the mapping) into
/// pinned memory at roughly 6-10 GB/s, so keeping the link busy takes 50 / 6 ≈ 8 readers
/// filling at once: half of 16 cores, leaving the rest to the caller and the kernel's page
/// cache work. While 8 slots are being filled, the copy engine must still have queued work, or
/// it idles between fills: a 16 MiB chunk crosses the link in 16 MiB / 50 GB/s ≈ 0.34 ms,
/// while one fill takes 16 MiB / 6 GB/s ≈ 2.8 ms, so 4 extra slots (submitted, waiting for or
/// in the copy engine) cover the jitter of 8 fills finishing at different times. Hence the
/// defaults: readers = clamp(cores / 2, 1, 8), slots = readers + 4, 16 MiB each (192 MiB of
/// pinned memory on a 16-core host; 80 MiB on 2 cores). Chunks much smaller than 16 MiB pay
/// the per-copy launch and event cost (~10 µs) too often; much larger ones lengthen the
/// pipeline's fill and drain at the start and end of every upload.
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

struct SlotState<S> {
    /// The chunk of the current run allowed to use this slot next.
    turn: usize,
    /// Set (under this lock, so no waiter can miss it) when a reader of the current run failed.
    aborted: bool,
    /// The staging buffer, allocated on first use in a lazy ring, and its size.
    slot: Option<S>,
    capacity: usize,
}

/// A ring of staging buffers, reusable across uploads to the same device, and safe to share
/// between threads: runs take turns (the copy engine is one link; two runs at once would only
/// split it), so each run numbers its chunks from 0 against the ring's slots on its own.
pub struct Ring<S> {
    slots: Vec<(Mutex<SlotState<S>>, Condvar)>,
    slot_bytes: usize,
    readers: usize,
    /// Held for the whole of a run (and of `wait_all`): one run owns the slots' turns at a time.
    running: Mutex<()>,
}

/// What an upload moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UploadStats {
    /// Bytes copied to the destination, padding included.
    pub bytes: u64,
    /// Chunks (one copy each).
    pub chunks: usize,
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
                };
                (Mutex::new(state), Condvar::new())
            })
            .collect();
        Ring {
            slots,
            slot_bytes: options.slot_bytes.max(4096),
            readers: options.readers.clamp(1, MAX_READERS),
            running: Mutex::new(()),
        }
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
        let _running = lock(&self.running);
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
        let _running = lock(&self.running);
        let run = self.run_locked(target, files, plan, self.plain_shape(), &mut || Ok(()));
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
        }
    }

    /// The slot size: the chunk size of uploads into one destination.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// One run: reader threads fill and submit the chunks while the calling thread runs
    /// `on_main` (a streaming delivery; nothing otherwise), then joins them. An error of
    /// `on_main` stops the readers.
    fn run_locked<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        files: &[&SafeFile],
        plan: &UploadPlan,
        shape: RunShape<'_>,
        on_main: &mut dyn FnMut() -> Result<()>,
    ) -> Result<UploadStats> {
        let chunk = shape.chunk.max(1);
        let chunks = plan.total.div_ceil(chunk) as usize;
        // Each chunk's pieces, found by binary search over pieces sorted by destination.
        let mut pieces = plan.pieces.clone();
        pieces.sort_by_key(|p| p.dst);
        // Source numbers are the caller's own, not a checkpoint index's: the bridge numbers the
        // files as it adds them, so from C++ a number without a file is a defect here, and a Rust
        // caller gets one only by running the plan on other files than it was made for. Either
        // way a broken contract, hence `Internal`.
        if let Some(bad) = pieces.iter().find(|p| p.source >= files.len()) {
            return Err(Error::Internal {
                message: format!(
                    "the upload plan reads source {} but only {} files were given",
                    bad.source,
                    files.len()
                ),
            });
        }
        // This run numbers its chunks from 0; the run lock keeps other runs off the turns.
        for (i, (state, _)) in self.slots.iter().enumerate() {
            let mut st = lock(state);
            st.turn = i;
            st.aborted = false;
        }
        // Never a slot larger than the plan needs (lazy rings allocate on first use).
        let want = (plan.total.min(chunk) as usize)
            .next_multiple_of(4096)
            .max(4096);
        let job = Job {
            files,
            pieces: &pieces,
            slices: &plan.slices,
            total: plan.total,
            chunk,
            lap: shape.lap,
            chunks,
            want: want.min(self.slot_bytes),
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            progress: shape.progress,
        };
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let readers = self.readers.min(chunks.max(1));
        std::thread::scope(|scope| {
            let readers: Vec<_> = (0..readers)
                .map(|_| {
                    scope.spawn(|| {
                        let result = catch_unwind(AssertUnwindSafe(|| {
                            target
                                .enter_thread()
                                .and_then(|()| self.read_chunks(target, &job))
                        }));
                        target.leave_thread();
                        match result {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => {
                                lock(&first_error).get_or_insert(e);
                                self.abort(&job);
                            }
                            // The other readers and a streaming delivery must not wait for this
                            // one's chunks; the join below passes the panic on.
                            Err(panic) => {
                                self.abort(&job);
                                resume_unwind(panic);
                            }
                        }
                    })
                })
                .collect();
            // A panic here (a streaming delivery's) must stop the readers too, or the scope
            // would wait for them forever; it is passed on once they are joined.
            let main = catch_unwind(AssertUnwindSafe(&mut *on_main));
            if !matches!(main, Ok(Ok(()))) {
                self.abort(&job);
            }
            let main_panic = match main {
                Ok(Ok(())) => None,
                Ok(Err(e)) => {
                    lock(&first_error).get_or_insert(e);
                    None
                }
                Err(panic) => Some(panic),
            };
            // Joined explicitly (pthread_join) rather than by the end of the scope (a futex wait):
            // C++ programs built with ThreadSanitizer see the join, so what the readers wrote (an
            // error, say) is ordered before the caller reads it.
            for reader in readers {
                if let Err(panic) = reader.join() {
                    resume_unwind(panic); // as the scope itself would
                }
            }
            if let Some(panic) = main_panic {
                resume_unwind(panic);
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(UploadStats {
                bytes: plan.total,
                chunks,
            }),
        }
    }

    /// Stops the run: every waiter sees `aborted` under its slot's lock, so a wake-up cannot
    /// fall between a waiter's check and its wait.
    fn abort(&self, job: &Job<'_>) {
        job.failed.store(true, Ordering::SeqCst);
        for (state, cv) in &self.slots {
            lock(state).aborted = true;
            cv.notify_all();
        }
        if let Some(progress) = job.progress {
            progress.abort();
        }
    }

    fn read_chunks<T: UploadTarget<Slot = S>>(&self, target: &T, job: &Job<'_>) -> Result<()> {
        loop {
            let k = job.next.fetch_add(1, Ordering::SeqCst);
            if k >= job.chunks || job.failed.load(Ordering::SeqCst) {
                return Ok(());
            }
            // Before taking the slot: a reader waiting here for room in a scratch ring must not
            // hold a lock that `abort` needs.
            if let Some(progress) = job.progress {
                if !progress.room_for(k)? {
                    return Ok(());
                }
            }
            if !self.fill_and_submit(target, job, k)? {
                return Ok(());
            }
            if let Some(progress) = job.progress {
                progress.submitted(k)?;
            }
        }
    }

    /// Chunk `k`, once its slot's turn has come: fills the slot and submits its copy; `false`
    /// when the run was stopped meanwhile. Returns with the slot's lock released.
    fn fill_and_submit<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        job: &Job<'_>,
        k: usize,
    ) -> Result<bool> {
        let ring = self.slots.len();
        let (state, turn_changed) = &self.slots[k % ring];
        let mut st = lock(state);
        while st.turn != k && !st.aborted {
            st = turn_changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.aborted {
            return Ok(false);
        }
        let st = &mut *st;
        if let Some(slot) = st.slot.as_mut() {
            target.wait(slot)?;
        }
        let start = k as u64 * job.chunk;
        let len = (job.total - start).min(job.chunk) as usize;
        if st.capacity < len {
            // The old buffer's copy is done (waited above): dropping it frees it.
            st.slot = None;
            st.capacity = 0;
            let cap = job.want.max(len);
            st.slot = Some(target.new_slot(cap)?);
            st.capacity = cap;
        }
        let slot = st.slot.as_mut().expect("allocated above");
        fill(target.buffer(slot), start, len, job)?;
        // A chunk never straddles the end of a scratch ring (its size is a multiple of the
        // chunk size), so one copy still carries it.
        target.submit(slot, len, job.lap.map_or(start, |lap| start % lap))?;
        st.turn = k + ring;
        turn_changed.notify_all();
        Ok(true)
    }

    /// Blocks until every submitted copy is done. Waits on every slot even after an error (a
    /// caller frees the destination on error, which must not happen under a pending copy) and
    /// returns the first error.
    pub fn wait_all<T: UploadTarget<Slot = S>>(&self, target: &T) -> Result<()> {
        let _running = lock(&self.running);
        self.wait_all_locked(target)
    }

    fn wait_all_locked<T: UploadTarget<Slot = S>>(&self, target: &T) -> Result<()> {
        let mut first = Ok(());
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

/// How one run cuts and places its chunks, and whom it tells (see [`landing`]).
struct RunShape<'a> {
    /// Bytes per chunk.
    chunk: u64,
    /// In a scratch ring of this many bytes (a multiple of `chunk`), destination offset `o`
    /// lands at `o % lap`.
    lap: Option<u64>,
    progress: Option<&'a dyn landing::Progress>,
}

/// One run's shared state.
struct Job<'a> {
    files: &'a [&'a SafeFile],
    pieces: &'a [Piece],
    slices: &'a [SlicePlan],
    total: u64,
    chunk: u64,
    lap: Option<u64>,
    chunks: usize,
    /// Size of a newly allocated slot.
    want: usize,
    next: AtomicUsize,
    failed: AtomicBool,
    progress: Option<&'a dyn landing::Progress>,
}

/// The next `[from, to)` of the destination bytes `rest` starts at `*at`: the gap before it
/// zeroed, `rest` and `*at` moved past it.
pub(crate) fn carve<'a>(
    from: u64,
    to: u64,
    rest: &mut &'a mut [u8],
    at: &mut u64,
) -> Result<&'a mut [u8]> {
    let (skip, len) = match (from.checked_sub(*at), to.checked_sub(from)) {
        (Some(skip), Some(len)) if skip + len <= rest.len() as u64 => (skip as usize, len as usize),
        _ => {
            return Err(Error::Internal {
                message: format!(
                    "a load's piece [{from}, {to}) is out of order in its chunk (at {at})"
                ),
            })
        }
    };
    let (gap, tail) = std::mem::take(rest).split_at_mut(skip);
    gap.fill(0);
    let (mine, tail) = tail.split_at_mut(len);
    *rest = tail;
    *at = to;
    Ok(mine)
}

/// [`fill`] for jobs with files that read in batches ([`SafeFile::reads_in_batches`]: remote
/// files read on demand): the chunk's reads of each such file are handed to it together (one
/// round of concurrent ranged GETs, runs closer than a part coalesced) rather than one round
/// trip per tensor or slice run. Reads of one file that overlap (a tensor requested twice) are
/// made one by one.
fn fill_in_batches(buf: &mut [u8], start: u64, len: usize, job: &Job<'_>) -> Result<()> {
    let end = start + len as u64;
    let mut rest: &mut [u8] = &mut buf[..len];
    let mut at = start;
    // Each read as (file, source offset, its bytes of `buf`), carved in destination order.
    let mut reads: Vec<(usize, u64, &mut [u8])> = Vec::new();
    let pieces = job.pieces;
    let first = pieces.partition_point(|p| p.dst + p.len <= start);
    for p in pieces[first..].iter().take_while(|p| p.dst < end) {
        let lo = p.dst.max(start);
        let hi = (p.dst + p.len).min(end);
        match p.slice.and_then(|k| job.slices.get(k)) {
            None => {
                let dst = carve(lo, hi, &mut rest, &mut at)?;
                crate::fallible::push(
                    &mut reads,
                    (p.source, p.src + (lo - p.dst), dst),
                    "a chunk's reads",
                )?;
            }
            Some(plan) => {
                for (src, out, n) in
                    plan.runs_in_result((lo - p.dst) as usize, (hi - p.dst) as usize)
                {
                    let to = p.dst + out as u64;
                    let dst = carve(to, to + n as u64, &mut rest, &mut at)?;
                    crate::fallible::push(
                        &mut reads,
                        (p.source, p.src + src as u64, dst),
                        "a chunk's reads",
                    )?;
                }
            }
        }
    }
    rest.fill(0);
    read_grouped(job.files, &mut reads)
}

/// Makes `reads` (file number, source offset, destination bytes; destinations disjoint): each
/// file that reads in batches gets its reads in one [`SafeFile::read_batch`] (one by one when
/// two of them overlap in the file, as a tensor requested twice does); other files read them
/// one by one.
pub(crate) fn read_grouped(
    files: &[&SafeFile],
    reads: &mut [(usize, u64, &mut [u8])],
) -> Result<()> {
    let mut sources: Vec<usize> = reads.iter().map(|r| r.0).collect();
    sources.sort_unstable();
    sources.dedup();
    for source in sources {
        let file = files.get(source).ok_or_else(|| Error::Internal {
            message: format!("a load reads source {source} of {}", files.len()),
        })?;
        let mut runs: Vec<(u64, &mut [u8])> = Vec::new();
        for (s, src, dst) in reads.iter_mut() {
            if *s == source {
                crate::fallible::push(&mut runs, (*src, &mut **dst), "a load's reads")?;
            }
        }
        let mut spans: Vec<(u64, u64)> = runs
            .iter()
            .map(|(o, d)| (*o, *o + d.len() as u64))
            .collect();
        spans.sort_unstable();
        if file.reads_in_batches() && spans.windows(2).all(|w| w[0].1 <= w[1].0) {
            file.read_batch(&mut runs)?;
        } else {
            for (src, dst) in runs.iter_mut() {
                file.read_data(*src, dst)?;
            }
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fills `buf[..len]` with destination bytes `[start, start + len)`: source bytes where a piece
/// covers them, zeros elsewhere.
fn fill(buf: &mut [u8], start: u64, len: usize, job: &Job<'_>) -> Result<()> {
    if job.files.iter().any(|f| f.reads_in_batches()) {
        return fill_in_batches(buf, start, len, job);
    }
    let end = start + len as u64;
    let buf = &mut buf[..len];
    let pieces = job.pieces;
    // First piece that ends after `start`.
    let first = pieces.partition_point(|p| p.dst + p.len <= start);
    let mut at = start;
    for p in pieces[first..].iter().take_while(|p| p.dst < end) {
        let lo = p.dst.max(start);
        let hi = (p.dst + p.len).min(end);
        if lo > at {
            buf[(at - start) as usize..(lo - start) as usize].fill(0);
        }
        let file = job.files[p.source];
        match p.slice.and_then(|k| job.slices.get(k)) {
            None => {
                let dst = &mut buf[(lo - start) as usize..(hi - start) as usize];
                file.read_data(p.src + (lo - p.dst), dst)?;
            }
            Some(plan) => {
                let range = plan.runs_in_result((lo - p.dst) as usize, (hi - p.dst) as usize);
                for (src, out, n) in range {
                    let to = (p.dst + out as u64 - start) as usize;
                    file.read_data(p.src + src as u64, &mut buf[to..to + n])?;
                }
            }
        }
        at = hi;
    }
    if at < end {
        buf[(at - start) as usize..].fill(0);
    }
    Ok(())
}
