//! Streaming uploads on CUDA: each tensor handed to the caller as it lands in device memory
//! (`safetensors_core::upload::landing` runs the readers and the order), so that an engine can
//! transform it on its own stream while the rest is still in flight; into a new allocation, the
//! caller's, or a bounded device scratch ring.
//!
//! Marks are events recorded on the copy stream (one per group of tensors that became complete
//! together, shared by them) and, in a scratch ring with a consumer stream, on that stream after
//! the caller's callback returned: a region is refilled only once that event has completed. The
//! events come from a pool that the `Uploader` keeps, so a steady stream of uploads creates none.
//!
//! The callback runs on the calling thread with the caller's own current context (the library
//! makes its context current only around its own driver calls), never concurrently with itself,
//! and may call the library, except uploads through the same `Uploader`, which would wait for
//! the very upload that is calling them: those are refused with an error.

use std::cell::RefCell;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::upload::landing::{DeliverWhen, Landing, LandingTarget, StreamLayout};
use safetensors_core::upload::{UploadPlan, UploadStats};
use safetensors_core::{Error, Result, SafeFile};

use crate::driver::call;
use crate::memory::{DeviceBuffer, Event};
use crate::pinned::GpuTarget;
use crate::uploader::Uploader;

impl LandingTarget for GpuTarget<'_> {
    type Mark = Event;

    fn mark(&self) -> Result<Event> {
        let pool = self.events.ok_or_else(|| Error::Internal {
            message: "a streaming upload ran on a target without an event pool".into(),
        })?;
        let _current = self.gpu.enter()?;
        pool.record(self.stream)
    }

    fn wait_mark(&self, mark: &Event) -> Result<()> {
        let _current = self.gpu.enter()?;
        // SAFETY: an event of the pool, recorded by `mark` or on the consumer's stream.
        call("cuEventSynchronize", || unsafe {
            cu::event::synchronize(mark.0)
        })
    }

    fn recycle(&self, mark: Event) {
        if let Some(pool) = self.events {
            pool.give(mark);
        }
    }
}

/// One tensor handed to the caller: its index in the plan, where its bytes are, and the event
/// (a `CUevent`) recorded on the copy stream after its last copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LandedTensor {
    pub index: usize,
    pub data: u64,
    pub event: u64,
}

/// How a streaming upload hands each tensor over.
pub struct Delivery<'a> {
    /// As soon as its last copy is enqueued (the receiver orders its work after `event`),
    /// instead of once it has landed.
    pub when_enqueued: bool,
    /// A stream of this device's primary context that is made to wait for each tensor's event
    /// before it is handed over, so that whatever the receiver enqueues there sees its bytes.
    /// In a scratch ring, an event recorded there after the receiver returns tells when the
    /// tensor's region may be refilled.
    pub consumer: Option<u64>,
    /// Receives the tensors in plan order, on the calling thread, one at a time; an error
    /// stops the upload and is returned.
    pub sink: &'a mut dyn FnMut(&LandedTensor) -> Result<()>,
}

thread_local! {
    /// The uploaders whose streaming uploads run on this thread (their addresses), innermost
    /// last: a callback may start an upload through another uploader, whose callback may in
    /// turn call back into any of them.
    static DELIVERING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Marks the calling thread as delivering `uploader`'s tensors until dropped.
struct Delivering;

impl Delivering {
    fn enter(uploader: &Uploader) -> Delivering {
        DELIVERING.with(|d| d.borrow_mut().push(uploader as *const Uploader as usize));
        Delivering
    }
}

impl Drop for Delivering {
    fn drop(&mut self) {
        DELIVERING.with(|d| d.borrow_mut().pop());
    }
}

impl Uploader {
    /// Refuses an upload (or wait) through this uploader from its own landing callback: it
    /// would wait for the upload that is running the callback.
    pub(crate) fn not_from_own_callback(&self) -> Result<()> {
        let me = self as *const Uploader as usize;
        if DELIVERING.with(|d| d.borrow().contains(&me)) {
            return Err(Error::Cuda {
                message: "an upload or synchronize through an Uploader whose landing callback \
                          is running (on this thread, perhaps further out in a chain of \
                          callbacks) would wait for the upload that called it: use another \
                          Uploader (or the one-shot calls) from the callback"
                    .into(),
            });
        }
        Ok(())
    }

    /// Uploads `plan` into a new allocation, handing each tensor over as it lands (see
    /// [`Delivery`]); every copy has completed on return. On an error, the allocation is freed
    /// once the copies and the work enqueued on the consumer stream by then have completed, or
    /// leaked if that cannot be known.
    pub fn upload_landing(
        &self,
        files: &[&SafeFile],
        plan: &UploadPlan,
        delivery: Delivery<'_>,
    ) -> Result<DeviceBuffer> {
        self.not_from_own_callback()?;
        self.check_delivery(&delivery, false)?;
        let consumer = delivery.consumer;
        let buffer = self.gpu.alloc(plan.total() as usize)?;
        let layout = StreamLayout::destination(plan, self.ring.slot_bytes());
        match self.stream_layout(self.stream.handle, buffer.ptr(), files, &layout, delivery) {
            Ok(_) => Ok(buffer),
            Err(e) => {
                self.free_after_failure(buffer, consumer);
                Err(e)
            }
        }
    }

    /// Uploads `plan` into the caller's `dst` with copies on the caller's `stream` (checked as
    /// [`Uploader::upload_into`] checks them), handing each tensor over as it lands; every copy
    /// has completed on return, successful or not.
    pub fn upload_into_landing(
        &self,
        files: &[&SafeFile],
        plan: &UploadPlan,
        dst: u64,
        capacity: usize,
        stream: u64,
        delivery: Delivery<'_>,
    ) -> Result<UploadStats> {
        self.not_from_own_callback()?;
        self.check_into(plan, dst, capacity, stream)?;
        self.check_delivery(&delivery, false)?;
        let layout = StreamLayout::destination(plan, self.ring.slot_bytes());
        self.stream_layout(stream as sys::CUstream, dst, files, &layout, delivery)
    }

    /// Uploads `plan` through a device scratch ring of about `scratch_bytes` (see
    /// [`StreamLayout::scratch`] for its exact size), handing each tensor over as it lands
    /// there. A region is refilled only once the receiver has returned and, with a consumer
    /// stream, once the work enqueued there by then has completed. Returns the ring's size;
    /// it is freed before returning.
    pub fn upload_scratch(
        &self,
        files: &[&SafeFile],
        plan: &UploadPlan,
        scratch_bytes: u64,
        delivery: Delivery<'_>,
    ) -> Result<u64> {
        self.not_from_own_callback()?;
        self.check_delivery(&delivery, true)?;
        let consumer = delivery.consumer;
        let layout = StreamLayout::scratch(plan, scratch_bytes, self.ring.slot_bytes())?;
        let bytes = layout.device_bytes();
        let scratch = self.gpu.alloc(bytes as usize)?;
        match self.stream_layout(self.stream.handle, scratch.ptr(), files, &layout, delivery) {
            Ok(_) => Ok(bytes),
            Err(e) => {
                self.free_after_failure(scratch, consumer);
                Err(e)
            }
        }
    }

    /// Refuses what cannot work before anything is enqueued: a consumer stream another device
    /// or context owns, and tensors handed over before they land in a scratch ring with no
    /// consumer stream (the region would be refilled while the receiver's work still reads it).
    fn check_delivery(&self, delivery: &Delivery<'_>, scratch: bool) -> Result<()> {
        if scratch && delivery.when_enqueued && delivery.consumer.is_none() {
            return Err(Error::Cuda {
                message: "tensors handed over as soon as their copies are enqueued, through a \
                          scratch ring, need a consumer stream: the library must know when the \
                          work on each region is done before refilling it (set consumer_stream, \
                          or deliver them once landed)"
                    .into(),
            });
        }
        if let Some(consumer) = delivery.consumer {
            let _current = self.gpu.enter()?;
            // The per-thread default stream is fine here: the library uses it only from the
            // calling thread, as the caller does.
            if consumer != 2 {
                self.gpu.check_stream(consumer)?;
            }
        }
        Ok(())
    }

    /// Frees `buffer` after a failed upload, once the copies into it (on this uploader's
    /// stream) and the work enqueued on the consumer stream by now have completed; leaks it
    /// when that cannot be known (freeing memory a copy or the receiver's work may still use
    /// would be worse). Never `cuCtxSynchronize`: it would wait for every stream of the
    /// context, the caller's others too, a deadlock if one of them waits for work the caller
    /// enqueues only after this call returns. Work the receiver ordered elsewhere on the
    /// tensors is its own to finish before its callback returns (`cuda.hpp` says so).
    fn free_after_failure(&self, buffer: DeviceBuffer, consumer: Option<u64>) {
        let done = self.gpu.enter().and_then(|_current| {
            self.stream.synchronize()?;
            match consumer {
                // SAFETY: the caller's stream, checked, and valid while its call runs.
                Some(c) => call("cuStreamSynchronize", || unsafe {
                    cu::stream::synchronize(c as sys::CUstream)
                }),
                None => Ok(()),
            }
        });
        if done.is_err() {
            let _ = buffer.release();
        }
    }

    /// Runs the streaming upload of `layout` into `base` with copies on `stream`.
    fn stream_layout(
        &self,
        stream: sys::CUstream,
        base: u64,
        files: &[&SafeFile],
        layout: &StreamLayout,
        delivery: Delivery<'_>,
    ) -> Result<UploadStats> {
        let target = GpuTarget {
            events: Some(&self.events),
            ..GpuTarget::new(&self.gpu, stream, base)
        };
        let _delivering = Delivering::enter(self);
        let when = if delivery.when_enqueued {
            DeliverWhen::Submitted
        } else {
            DeliverWhen::Landed
        };
        let consumer = delivery.consumer.map(|c| c as sys::CUstream);
        let release = layout.is_scratch() && consumer.is_some();
        let sink = delivery.sink;
        self.ring
            .stream(&target, files, layout, when, &mut |landing: &Landing<
                '_,
                Event,
            >| {
                if let Some(consumer) = consumer {
                    let _current = self.gpu.enter()?;
                    // SAFETY: the caller's stream (checked) and an event of the pool.
                    call("cuStreamWaitEvent", || unsafe {
                        sys::cuStreamWaitEvent(consumer, landing.mark.0, 0).result()
                    })?;
                }
                // The caller's own context is current while its callback runs.
                for index in landing.tensors.clone() {
                    sink(&LandedTensor {
                        index,
                        data: base + landing.offset(index),
                        event: landing.mark.0 as u64,
                    })?;
                }
                match consumer {
                    Some(consumer) if release => {
                        let _current = self.gpu.enter()?;
                        self.events.record(consumer).map(Some)
                    }
                    _ => Ok(None),
                }
            })
    }
}
