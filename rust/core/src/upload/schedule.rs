//! One run of a ring: the readers' shared queue of stripes, the slot protocol that lets several
//! readers fill one chunk, the zero-copy feeder's claims, and how a run stops on the first error.
//!
//! A run's work is the sequence of its chunks' stripes, claimed in order from one counter. For
//! chunk `k` in slot `j = k % slots`:
//! 1. a reader with a stripe of `k` waits until the slot's `turn` is `k` (chunk `k - slots`
//!    submitted from it);
//! 2. the first such reader makes the slot ready (in a scratch ring, waits for room there; waits
//!    for the slot's last copy; sizes the buffer) while the others wait on the slot's condvar;
//! 3. each reader fills its stripe without the lock (stripes are disjoint parts of the buffer,
//!    which nobody moves or frees until every stripe is in and the copy has run);
//! 4. the reader that fills the last stripe submits the chunk's copy and passes the turn to
//!    chunk `k + slots`.
//!
//! Claims are in order and a reader waits only for a chunk older than all it holds, so the oldest
//! unfinished chunk always has readers on it: no wait can close a circle. The feeder (the
//! reader numbered 0, when the target copies zero-copy) claims whole chunks instead when the
//! queue's front is a chunk's first stripe, hands them to the target, and passes their slots'
//! turns on; when the target declines, it stages them itself.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::fill::{direct_span, fill, Sources};
use super::landing::{Progress, RunShape};
use super::trace::{Moment, Recorder};
use super::{lock, Ring, SlotState, UploadPlan, UploadStats, UploadTarget};
use crate::error::{Error, Result};
use crate::file::SafeFile;

/// One run's shared state.
pub(super) struct Job<'a> {
    /// What the readers copy from, and where to.
    pub(super) src: Sources<'a>,
    total: u64,
    chunk: u64,
    lap: Option<u64>,
    chunks: usize,
    /// Size of a newly allocated slot.
    want: usize,
    /// Bytes per stripe (at most `chunk`), stripes in a whole chunk, stripes in all.
    stripe: u64,
    per_chunk: usize,
    items: usize,
    /// The next stripe to claim.
    next: AtomicUsize,
    failed: AtomicBool,
    progress: Option<&'a dyn Progress>,
    trace: Option<&'a Recorder>,
    /// Reader 0 offers chunks to the target's zero-copy path, this many at a time.
    direct_chunks: usize,
    zero_copy_chunks: AtomicUsize,
}

impl Job<'_> {
    fn chunk_len(&self, k: usize) -> u64 {
        (self.total - k as u64 * self.chunk).min(self.chunk)
    }

    fn stripes_of(&self, k: usize) -> usize {
        self.chunk_len(k).div_ceil(self.stripe) as usize
    }

    /// Stripe `s` of chunk `k`, for item `i`.
    fn item(&self, i: usize) -> (usize, usize) {
        (i / self.per_chunk, i % self.per_chunk)
    }

    /// The first item of chunk `k` (`items` past the last chunk).
    fn first_item(&self, k: usize) -> usize {
        if k >= self.chunks {
            self.items
        } else {
            k * self.per_chunk
        }
    }

    fn mark(&self, k: usize, moment: Moment) {
        if let Some(t) = self.trace {
            t.mark(k, moment);
        }
    }
}

impl<S: Send> Ring<S> {
    /// One run: the reader threads fill and submit the chunks while the calling thread runs
    /// `on_main` (a streaming delivery, an allocation; nothing otherwise), and returns once
    /// every reader is done with it. An error of `on_main` stops the readers.
    pub(super) fn run_locked<T: UploadTarget<Slot = S>>(
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
            st.filling = None;
            st.left = 0;
            st.preparing = false;
        }
        // Never a slot larger than the plan needs (lazy rings allocate on first use).
        let want = (plan.total.min(chunk) as usize)
            .next_multiple_of(4096)
            .max(4096);
        let stripe = self.stripe_for(chunk, files);
        let per_chunk = chunk.div_ceil(stripe) as usize;
        let items = match chunks {
            0 => 0,
            n => {
                let last = (plan.total - (n as u64 - 1) * chunk).div_ceil(stripe) as usize;
                (n - 1) * per_chunk + last
            }
        };
        let recorder = self.pipeline.trace.then(|| Recorder::new(chunks));
        let direct = shape.direct
            && shape.lap.is_none()
            && shape.progress.is_none()
            && chunks > 0
            && target.takes_direct();
        let job = Job {
            src: Sources {
                files,
                pieces: &pieces,
                slices: &plan.slices,
            },
            total: plan.total,
            chunk,
            lap: shape.lap,
            chunks,
            want: want.min(self.slot_bytes),
            stripe,
            per_chunk,
            items,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            progress: shape.progress,
            trace: recorder.as_ref(),
            direct_chunks: if direct {
                target.direct_chunks().max(1)
            } else {
                0
            },
            zero_copy_chunks: AtomicUsize::new(0),
        };
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let readers = self.readers.min(items.max(1));
        let work = |reader: usize| {
            let result = catch_unwind(AssertUnwindSafe(|| {
                target
                    .enter_thread()
                    .and_then(|()| self.read_items(target, &job, reader))
            }));
            target.leave_thread();
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    lock(&first_error).get_or_insert(e);
                    self.abort(&job);
                }
                // The other readers and a streaming delivery must not wait for this one's
                // chunks; the pool passes the panic on once every reader is done.
                Err(panic) => {
                    self.abort(&job);
                    resume_unwind(panic);
                }
            }
        };
        if let Some(t) = job.trace {
            t.edit(|tl, now| {
                tl.readers_started = now;
                tl.readers = readers;
                tl.stripe_bytes = stripe;
            });
        }
        let scoped = self.threads.scope(readers, &work, || {
            // A panic here (a streaming delivery's) must stop the readers too, or the scope would
            // wait for them forever; it is passed on once they are done.
            let main = catch_unwind(AssertUnwindSafe(&mut *on_main));
            if !matches!(main, Ok(Ok(()))) {
                self.abort(&job);
            }
            match main {
                Ok(Ok(())) => None,
                // Weighed against the readers' errors once they are done (an error a reader
                // made is not to be dropped here, while readers still run: a sanitized C++
                // program could not see the hand-over); whether one came first is noted.
                Ok(Err(e)) => Some((e, lock(&first_error).is_some())),
                Err(panic) => resume_unwind(panic),
            }
        });
        let zero_copy_chunks = job.zero_copy_chunks.load(Ordering::SeqCst);
        if let Some(rec) = recorder {
            let timeline = rec.finish(|k| (plan.total - k as u64 * chunk).min(chunk));
            *lock(&self.trace) = Some(timeline);
        }
        let main_error = match scoped {
            Ok(main_error) => main_error,
            Err(e) => {
                let path = files.first().map_or(std::path::Path::new(""), |f| f.path());
                return Err(Error::io(path, "start an upload's reader thread for", e));
            }
        };
        let readers_error = first_error.into_inner().unwrap_or_else(|p| p.into_inner());
        // The first error in time, or the caller's part's when the shape says so.
        let error = match (main_error, readers_error) {
            (Some((main, reader_first)), Some(reader)) => {
                Some(if shape.main_error_first || !reader_first {
                    main
                } else {
                    reader
                })
            }
            (Some((main, _)), None) => Some(main),
            (None, reader) => reader,
        };
        match error {
            Some(e) => Err(e),
            None => Ok(UploadStats {
                bytes: plan.total,
                chunks,
                zero_copy_chunks,
            }),
        }
    }

    /// Bytes per stripe for chunks of `chunk` bytes: the pipeline's stripe, a multiple of 4 KiB,
    /// at most a chunk; whole chunks for files read in batches (remote: a chunk's reads go out
    /// together) and when striping is off.
    fn stripe_for(&self, chunk: u64, files: &[&SafeFile]) -> u64 {
        let stripe = self.pipeline.stripe_bytes as u64;
        if stripe == 0 || files.iter().any(|f| f.reads_in_batches()) {
            return chunk;
        }
        stripe.next_multiple_of(4096).min(chunk).max(1)
    }

    /// Stops the run: every waiter sees `aborted` under its slot's lock, so a wake-up cannot
    /// fall between a waiter's check and its wait.
    pub(super) fn abort(&self, job: &Job<'_>) {
        job.failed.store(true, Ordering::SeqCst);
        for (state, cv) in &self.slots {
            lock(state).aborted = true;
            cv.notify_all();
        }
        if let Some(progress) = job.progress {
            progress.abort();
        }
    }

    /// A reader's loop: claims stripes (or, the feeder, whole chunks) until none is left or the
    /// run stopped.
    fn read_items<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        job: &Job<'_>,
        reader: usize,
    ) -> Result<()> {
        loop {
            if job.failed.load(Ordering::SeqCst) {
                return Ok(());
            }
            if reader == 0 && job.direct_chunks > 0 {
                if let Some((first, end)) = self.claim_chunks(job) {
                    if !self.feed(target, job, first, end)? {
                        return Ok(());
                    }
                    continue;
                }
            }
            let i = job.next.fetch_add(1, Ordering::SeqCst);
            if i >= job.items {
                return Ok(());
            }
            let (k, s) = job.item(i);
            if !self.stripe(target, job, k, s)? {
                return Ok(());
            }
        }
    }

    /// The feeder's claim: up to `direct_chunks` whole chunks when the queue's front is the
    /// first stripe of a chunk; `None` when it is not (the feeder then takes a stripe).
    fn claim_chunks(&self, job: &Job<'_>) -> Option<(usize, usize)> {
        loop {
            let at = job.next.load(Ordering::SeqCst);
            if at >= job.items {
                return None;
            }
            let (k, s) = job.item(at);
            if s != 0 {
                return None;
            }
            let end = (k + job.direct_chunks).min(job.chunks);
            let to = job.first_item(end);
            if job
                .next
                .compare_exchange(at, to, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Some((k, end));
            }
        }
    }

    /// Chunks `[first, end)`, claimed whole: copied by the target straight from the files when it
    /// takes them, else staged by this reader alone. `false` once the run stopped.
    fn feed<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        job: &Job<'_>,
        first: usize,
        end: usize,
    ) -> Result<bool> {
        for k in first..end {
            job.mark(k, Moment::Claimed);
        }
        let start = first as u64 * job.chunk;
        let stop = (end as u64 * job.chunk).min(job.total);
        let taken = match direct_span(&job.src, start, stop - start) {
            Some(span) => target.copy_direct(&span)?,
            None => false,
        };
        if !taken {
            for k in first..end {
                for s in 0..job.stripes_of(k) {
                    if !self.stripe(target, job, k, s)? {
                        return Ok(false);
                    }
                }
            }
            return Ok(true);
        }
        job.zero_copy_chunks
            .fetch_add(end - first, Ordering::SeqCst);
        // The chunks used no slot, but their slots' turns pass on, in order, for the chunks
        // one lap later.
        for k in first..end {
            if let Some(t) = job.trace {
                t.zero_copy(k);
                t.mark(k, Moment::Submitted);
            }
            let (state, turn_changed) = &self.slots[k % self.slots.len()];
            let mut st = lock(state);
            while st.turn != k && !st.aborted {
                st = turn_changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.aborted {
                return Ok(false);
            }
            st.turn = k + self.slots.len();
            turn_changed.notify_all();
        }
        Ok(true)
    }

    /// Stripe `s` of chunk `k`: waits for the chunk's turn in its slot (making the slot ready if
    /// first), fills the stripe, and submits the chunk if it was the last stripe in. `false`
    /// when the run was stopped meanwhile. Returns with the slot's lock released.
    fn stripe<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        job: &Job<'_>,
        k: usize,
        s: usize,
    ) -> Result<bool> {
        job.mark(k, Moment::Claimed);
        let ring = self.slots.len();
        let (state, changed) = &self.slots[k % ring];
        let mut st = lock(state);
        loop {
            if st.aborted {
                return Ok(false);
            }
            if st.turn == k && st.filling == Some(k) {
                break;
            }
            if st.turn == k && !st.preparing {
                st.preparing = true;
                // Room in a scratch ring is waited for without the slot's lock: `abort` needs
                // it, and the wait may be long (the caller's consumption).
                let room = match job.progress {
                    Some(progress) => {
                        drop(st);
                        let room = progress.room_for(k);
                        st = lock(state);
                        room
                    }
                    None => Ok(true),
                };
                st.preparing = false;
                if !room? || st.aborted {
                    changed.notify_all();
                    return Ok(false);
                }
                self.prepare(target, job, &mut st, k)?;
                // The slot's last copy is done (seen through the driver's own lock): what the
                // readers write next is ordered after it, for a sanitized C++ program too.
                crate::tsan::release(state);
                changed.notify_all();
                break;
            }
            st = changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let base = st.base;
        drop(st);
        let start = k as u64 * job.chunk;
        let chunk_len = job.chunk_len(k);
        let from = s as u64 * job.stripe;
        let len = (chunk_len - from).min(job.stripe) as usize;
        // SAFETY: `prepare` sized the slot's buffer to at least the chunk and left it in place:
        // it is neither moved nor freed, nor submitted, until every stripe of the chunk is in
        // (`left` reaches 0 below), and stripes are disjoint, so this range is this reader's
        // alone until then.
        let buf =
            unsafe { std::slice::from_raw_parts_mut((base as *mut u8).add(from as usize), len) };
        // What other readers wrote to this slot before (earlier laps) is ordered before this
        // fill, and this fill before the submission, through the slot's lock: announced to a
        // C++ program's ThreadSanitizer, which cannot see it (`crate::tsan`).
        crate::tsan::acquire(state);
        let began = Instant::now();
        let filled = fill(buf, start + from, len, &job.src);
        crate::tsan::release(state);
        filled?;
        if self.pipeline.min_fill_ns_per_mib > 0 {
            let floor = (len as u128 * self.pipeline.min_fill_ns_per_mib as u128) >> 20;
            let floor = Duration::from_nanos(floor.min(u64::MAX as u128) as u64);
            std::thread::sleep(floor.saturating_sub(began.elapsed()));
        }
        let mut st = lock(state);
        st.left -= 1;
        if st.left > 0 {
            return Ok(true);
        }
        if st.aborted {
            return Ok(false);
        }
        crate::tsan::acquire(state);
        job.mark(k, Moment::Filled);
        let st = &mut *st;
        let slot = st.slot.as_mut().expect("made ready");
        // A chunk never straddles the end of a scratch ring (its size is a multiple of the
        // chunk size), so one copy still carries it.
        target.submit(
            slot,
            chunk_len as usize,
            job.lap.map_or(start, |lap| start % lap),
        )?;
        job.mark(k, Moment::Submitted);
        st.filling = None;
        st.turn = k + ring;
        changed.notify_all();
        crate::tsan::release(state);
        if let Some(progress) = job.progress {
            progress.submitted(k)?;
        }
        Ok(true)
    }

    /// Makes slot `st` ready for chunk `k`: its last copy waited for, its buffer large enough.
    fn prepare<T: UploadTarget<Slot = S>>(
        &self,
        target: &T,
        job: &Job<'_>,
        st: &mut SlotState<S>,
        k: usize,
    ) -> Result<()> {
        if let Some(slot) = st.slot.as_mut() {
            target.wait(slot)?;
        }
        let len = job.chunk_len(k) as usize;
        if st.capacity < len {
            // The old buffer's copy is done (waited above): dropping it frees it.
            st.slot = None;
            st.capacity = 0;
            let cap = job.want.max(len);
            st.slot = Some(target.new_slot(cap)?);
            st.capacity = cap;
        }
        let slot = st.slot.as_mut().expect("allocated above");
        st.base = target.buffer(slot).as_mut_ptr() as usize;
        st.filling = Some(k);
        st.left = job.stripes_of(k);
        job.mark(k, Moment::Ready);
        Ok(())
    }
}
