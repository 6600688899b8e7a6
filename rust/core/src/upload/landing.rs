//! Streaming delivery: each tensor of an upload handed to the caller as soon as it has landed on
//! the device (or as soon as its last copy is submitted), in plan order, while the readers go
//! on; optionally through a bounded scratch ring instead of one destination that holds them all.
//!
//! Readers submit chunks out of order. A tensor is announced once every chunk covering it has
//! been submitted: under one lock, each submitted chunk extends the contiguous prefix of
//! submitted chunks, and the tensors that end inside the new prefix are announced together with
//! one mark (on CUDA, an event recorded on the copy stream), made right after the submission
//! that extended the prefix, so it follows every copy they need. The calling thread takes the
//! announcements in order and hands them over (after waiting for the mark, unless asked not to):
//! one thread, so deliveries never overlap.
//!
//! A scratch ring of `lap` bytes holds each tensor at `virtual offset % lap`: the plan is laid out
//! again so that no tensor straddles a multiple of `lap` (the ring is at least as large as the
//! largest tensor), and `lap` is a multiple of the chunk size, so no chunk does either. Chunk `k`
//! overwrites what lay one lap earlier, so before filling it a reader waits until every tensor
//! there has been released: delivered, and the work the caller enqueued on it done (the release
//! mark the delivery returned, e.g. an event on the consumer's stream, has completed); and until
//! the chunk one lap earlier has been submitted, so that its copy (padding included) runs before
//! this one on the in-order copy stream instead of overwriting it. Device memory is then exactly
//! `lap` bytes, whatever the size of the upload.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Condvar, Mutex};

use super::{lock, Placement, Ring, UploadPlan, UploadStats, UploadTarget};
use crate::error::{Error, Result};
use crate::file::SafeFile;

/// How one run cuts and places its chunks, and whom it tells (see [`super::landing`]).
pub(super) struct RunShape<'a> {
    /// Bytes per chunk.
    pub(super) chunk: u64,
    /// In a scratch ring of this many bytes (a multiple of `chunk`), destination offset `o`
    /// lands at `o % lap`.
    pub(super) lap: Option<u64>,
    pub(super) progress: Option<&'a dyn Progress>,
    /// The run waits for its copies before returning: zero-copy spans may be offered.
    pub(super) direct: bool,
    /// An error of the calling thread's part is the run's error, before any reader's (a
    /// reader's then only says that the run stopped).
    pub(super) main_error_first: bool,
}

/// A target that can mark how far its copies have been submitted, for streaming delivery.
pub trait LandingTarget: UploadTarget {
    /// Completes once every copy submitted before it was made has completed (an event recorded
    /// on the copy stream), or stands for work a delivery enqueued (a release mark).
    type Mark: Send;
    /// Marks the end of the copies submitted so far. Called by one thread at a time, from any
    /// thread (reader or caller).
    fn mark(&self) -> Result<Self::Mark>;
    /// Blocks until `mark` has completed.
    fn wait_mark(&self, mark: &Self::Mark) -> Result<()>;
    /// Takes back a mark nothing refers to any more (the CUDA path reuses its event).
    fn recycle(&self, mark: Self::Mark) {
        drop(mark);
    }
}

/// When a streaming upload hands a tensor over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverWhen {
    /// Once its bytes are on the device (its mark has completed).
    Landed,
    /// As soon as its last copy is submitted: the receiver orders its work after the mark.
    Submitted,
}

/// Where a streaming upload puts each tensor: the plan's own layout in one destination, or a
/// scratch ring (see the module documentation).
#[derive(Debug, Clone)]
pub struct StreamLayout {
    /// The plan, laid out in virtual offsets (the plan itself for a destination).
    plan: UploadPlan,
    chunk: u64,
    lap: Option<u64>,
}

impl StreamLayout {
    /// Tensors where `plan` puts them, in chunks of `chunk` bytes (the ring's slot size).
    pub fn destination(plan: &UploadPlan, chunk: usize) -> StreamLayout {
        StreamLayout {
            plan: plan.clone(),
            chunk: chunk.max(1) as u64,
            lap: None,
        }
    }

    /// Tensors in a device scratch ring of about `scratch_bytes`: grown to the largest tensor,
    /// then rounded up to a multiple of the chunk size, which is the ring's slot size
    /// (`slot_bytes`) or less when the ring is smaller, rounded down to the plan's alignment.
    /// So [`StreamLayout::device_bytes`] is less than max(`scratch_bytes`, largest tensor) +
    /// one chunk.
    pub fn scratch(
        plan: &UploadPlan,
        scratch_bytes: u64,
        slot_bytes: usize,
    ) -> Result<StreamLayout> {
        let too_big = || Error::Cuda {
            message: format!(
                "a device scratch ring of {scratch_bytes} bytes (or a layout in it) does not fit \
                 in 64 bits"
            ),
        };
        let align = plan.alignment;
        if align > slot_bytes.max(1) as u64 {
            // Chunks are whole multiples of the alignment; one larger than a staging slot would
            // grow every pinned slot to it, past the bound the ring promises.
            return Err(Error::Cuda {
                message: format!(
                    "a scratch ring is refilled in chunks of at most one staging slot ({slot_bytes} \
                     bytes), and the alignment ({align} bytes) is larger: use a smaller \
                     UploadOptions::alignment or larger UploadOptions::slot_bytes"
                ),
            });
        }
        let largest = plan.placements.iter().map(|p| p.len).max().unwrap_or(0);
        let want = scratch_bytes.max(largest).max(1);
        let chunk = ((slot_bytes.max(1) as u64).min(want) / align * align).max(align);
        let lap = want.checked_next_multiple_of(chunk).ok_or_else(too_big)?;
        let mut virtual_plan = UploadPlan::new(align as usize);
        let mut shift = Vec::with_capacity(plan.placements.len());
        let mut cursor = 0u64;
        for p in &plan.placements {
            let mut at = cursor.checked_next_multiple_of(align).ok_or_else(too_big)?;
            let end = at.checked_add(p.len).ok_or_else(too_big)?;
            if p.len > 0 && at / lap != (end - 1) / lap {
                at = (at / lap + 1).checked_mul(lap).ok_or_else(too_big)?;
            }
            cursor = at.checked_add(p.len).ok_or_else(too_big)?;
            shift.push(at - p.offset);
            virtual_plan.placements.push(Placement {
                offset: at,
                ..p.clone()
            });
        }
        virtual_plan.pieces = plan
            .pieces
            .iter()
            .map(|piece| super::plan::Piece {
                dst: piece.dst + shift[piece.placement],
                ..*piece
            })
            .collect();
        virtual_plan.slices = plan.slices.clone();
        virtual_plan.total = cursor;
        Ok(StreamLayout {
            plan: virtual_plan,
            chunk,
            lap: Some(lap),
        })
    }

    /// Device bytes the upload writes: the scratch ring's size, or the plan's total.
    pub fn device_bytes(&self) -> u64 {
        self.lap.unwrap_or(self.plan.total)
    }

    /// Bytes per chunk (one copy each).
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Whether tensors go through a scratch ring.
    pub fn is_scratch(&self) -> bool {
        self.lap.is_some()
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.plan.placements.len()
    }

    /// `true` when there is no tensor.
    pub fn is_empty(&self) -> bool {
        self.plan.placements.is_empty()
    }

    /// Where tensor `tensor` (its index in the plan) lands, from the start of the destination or
    /// of the scratch ring.
    pub fn offset(&self, tensor: usize) -> u64 {
        let at = self.plan.placements[tensor].offset;
        self.lap.map_or(at, |lap| at % lap)
    }
}

/// Tensors whose copies are all submitted, handed over together.
pub struct Landing<'a, M> {
    /// Their indices in the plan, in order.
    pub tensors: Range<usize>,
    /// Follows their last copy: completed already when delivering [`DeliverWhen::Landed`].
    pub mark: &'a M,
    layout: &'a StreamLayout,
}

impl<M> Landing<'_, M> {
    /// Where tensor `tensor` is, from the start of the destination or of the scratch ring.
    pub fn offset(&self, tensor: usize) -> u64 {
        self.layout.offset(tensor)
    }
}

/// What a delivery gives back: `None` when the tensors it was handed may be overwritten at once
/// (consumed synchronously, or not in a scratch ring), else a mark that completes once the work
/// it enqueued on them is done.
pub type Release<M> = Option<M>;

/// What hands tensors over: called with each [`Landing`], it returns their [`Release`].
pub type Deliver<'d, M> = dyn FnMut(&Landing<'_, M>) -> Result<Release<M>> + 'd;

/// The ring's hooks into a run (see `Ring::read_chunks`).
pub(super) trait Progress: Sync {
    /// Blocks until chunk `k` may overwrite its bytes of the destination; `false` once the run
    /// was stopped.
    fn room_for(&self, k: usize) -> Result<bool>;
    /// Chunk `k` was submitted.
    fn submitted(&self, k: usize) -> Result<()>;
    /// The run stops: wake every waiter.
    fn abort(&self);
}

struct FlowState<M> {
    /// Chunks submitted, by number; `prefix` counts those submitted from 0 without a gap.
    submitted: Vec<bool>,
    prefix: usize,
    /// Tensors announced (their copies all submitted), from 0.
    announced: usize,
    /// Announced and not yet delivered, oldest first.
    landings: VecDeque<(Range<usize>, M)>,
    /// Delivered: the tensors before `.0` are released once `.1` (if any) has completed.
    releases: VecDeque<(usize, Release<M>)>,
    /// A reader is waiting for the front release (one at a time keeps releases in order).
    releasing: bool,
    /// Tensors released, from 0: their scratch bytes may be overwritten.
    released: usize,
    failed: bool,
}

/// One streaming run's shared state between the readers and the delivering thread.
struct Flow<'a, T: LandingTarget> {
    target: &'a T,
    layout: &'a StreamLayout,
    chunks: usize,
    state: Mutex<FlowState<T::Mark>>,
    changed: Condvar,
}

impl<'a, T: LandingTarget> Flow<'a, T> {
    fn new(target: &'a T, layout: &'a StreamLayout) -> Result<Self> {
        let chunks = layout.plan.total.div_ceil(layout.chunk) as usize;
        // A flag per chunk: with one-byte chunks (a tiny scratch ring and alignment 1), one per
        // byte of the upload, so it is asked for fallibly.
        let submitted = crate::fallible::filled(chunks, false, "an upload's chunk flags")?;
        Ok(Flow {
            target,
            layout,
            chunks,
            state: Mutex::new(FlowState {
                submitted,
                prefix: 0,
                announced: 0,
                landings: VecDeque::new(),
                releases: VecDeque::new(),
                releasing: false,
                released: 0,
                failed: false,
            }),
            changed: Condvar::new(),
        })
    }

    fn placements(&self) -> &[Placement] {
        &self.layout.plan.placements
    }

    /// Announces the tensors that end inside the submitted prefix, with one mark after their
    /// copies. Under the lock, so that marks are made in the order of the announcements.
    fn announce(&self, st: &mut FlowState<T::Mark>) -> Result<()> {
        let covered = (st.prefix as u64 * self.layout.chunk).min(self.layout.plan.total);
        let first = st.announced;
        let placements = self.placements();
        while st.announced < placements.len() {
            let p = &placements[st.announced];
            if p.offset + p.len > covered {
                break;
            }
            st.announced += 1;
        }
        if st.announced > first {
            let mark = self.target.mark()?;
            st.landings.push_back((first..st.announced, mark));
            self.changed.notify_all();
        }
        Ok(())
    }

    /// The first byte (virtual) not yet released: every byte before it may be overwritten.
    fn free_below(&self, st: &FlowState<T::Mark>) -> u64 {
        self.placements()
            .get(st.released)
            .map_or(u64::MAX, |p| p.offset)
    }

    fn wait<'g>(
        &self,
        st: std::sync::MutexGuard<'g, FlowState<T::Mark>>,
    ) -> std::sync::MutexGuard<'g, FlowState<T::Mark>> {
        self.changed.wait(st).unwrap_or_else(|p| p.into_inner())
    }

    /// On the calling thread: hands every announcement over in order, until all are delivered
    /// or the run fails (a reader's error is the readers' to report).
    fn deliver_all(&self, when: DeliverWhen, deliver: &mut Deliver<'_, T::Mark>) -> Result<()> {
        loop {
            let (tensors, mark) = {
                let mut st = lock(&self.state);
                loop {
                    if st.failed {
                        return Ok(());
                    }
                    if let Some(next) = st.landings.pop_front() {
                        break next;
                    }
                    if st.announced == self.placements().len() {
                        return Ok(());
                    }
                    st = self.wait(st);
                }
            };
            let landed = match when {
                DeliverWhen::Landed => self.target.wait_mark(&mark),
                DeliverWhen::Submitted => Ok(()),
            };
            let end = tensors.end;
            let release = landed.and_then(|()| {
                deliver(&Landing {
                    tensors,
                    mark: &mark,
                    layout: self.layout,
                })
            });
            self.target.recycle(mark);
            let release = release?;
            lock(&self.state).releases.push_back((end, release));
            self.changed.notify_all();
        }
    }

    /// After the run: waits for every release mark left (the caller frees the scratch ring
    /// next) and takes back the marks of tensors never delivered. Returns the first error.
    fn drain(&self) -> Result<()> {
        let mut st = lock(&self.state);
        let mut first = Ok(());
        for (_, mark) in st.landings.drain(..) {
            self.target.recycle(mark);
        }
        for (_, release) in st.releases.drain(..) {
            if let Some(mark) = release {
                let r = self.target.wait_mark(&mark);
                self.target.recycle(mark);
                if first.is_ok() {
                    first = r;
                }
            }
        }
        first
    }
}

impl<T: LandingTarget> Progress for Flow<'_, T> {
    fn room_for(&self, k: usize) -> Result<bool> {
        let Some(lap) = self.layout.lap else {
            return Ok(true);
        };
        // Chunk k covers [k·chunk, (k+1)·chunk): one lap earlier must be free, and the chunk
        // there submitted.
        let need = ((k as u64 + 1) * self.layout.chunk).saturating_sub(lap);
        let before = k.checked_sub((lap / self.layout.chunk) as usize);
        let mut st = lock(&self.state);
        loop {
            if st.failed {
                return Ok(false);
            }
            if self.free_below(&st) >= need && before.is_none_or(|j| st.submitted[j]) {
                return Ok(true);
            }
            if !st.releasing {
                if let Some((upto, release)) = st.releases.pop_front() {
                    if let Some(mark) = release {
                        st.releasing = true;
                        drop(st);
                        let waited = self.target.wait_mark(&mark);
                        self.target.recycle(mark);
                        st = lock(&self.state);
                        st.releasing = false;
                        self.changed.notify_all();
                        waited?;
                    }
                    st.released = st.released.max(upto);
                    self.changed.notify_all();
                    continue;
                }
            }
            st = self.wait(st);
        }
    }

    fn submitted(&self, k: usize) -> Result<()> {
        let mut st = lock(&self.state);
        st.submitted[k] = true;
        if self.layout.lap.is_some() {
            self.changed.notify_all(); // a reader may wait for this chunk (see `room_for`)
        }
        while st.prefix < self.chunks && st.submitted[st.prefix] {
            st.prefix += 1;
        }
        self.announce(&mut st)
    }

    fn abort(&self) {
        lock(&self.state).failed = true;
        self.changed.notify_all();
    }
}

impl<S: Send> Ring<S> {
    /// Uploads `layout`'s plan from `files` and hands each tensor over as it lands: `deliver`
    /// runs on the calling thread, never concurrently with itself, with the tensors in plan
    /// order ([`DeliverWhen`] says at which point), while the readers go on filling the ring.
    /// An error of `deliver` (or of a reader) stops the upload; successful or not, on return
    /// every copy has completed and every release mark `deliver` returned has been waited for,
    /// so the destination or scratch ring may be freed (unless waiting itself failed, which the
    /// error says).
    pub fn stream<T: LandingTarget<Slot = S>>(
        &self,
        target: &T,
        files: &[&SafeFile],
        layout: &StreamLayout,
        when: DeliverWhen,
        deliver: &mut Deliver<'_, T::Mark>,
    ) -> Result<UploadStats> {
        let _running = self.take_turn();
        let flow = Flow::new(target, layout)?;
        let shape = RunShape {
            chunk: layout.chunk,
            lap: layout.lap,
            progress: Some(&flow),
            direct: false,
            main_error_first: false,
        };
        // Tensors of no bytes at the start (or every tensor, when no byte is copied) need no
        // chunk: announced before the readers start.
        let run = {
            let mut st = lock(&flow.state);
            flow.announce(&mut st)
        }
        .and_then(|()| {
            self.run_locked(target, files, &layout.plan, shape, &mut || {
                flow.deliver_all(when, deliver)
            })
        });
        let waited = self.wait_all_locked(target);
        let drained = flow.drain();
        let stats = run?;
        waited?;
        drained.map(|()| stats)
    }
}
