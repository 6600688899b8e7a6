//! Device memory and the handles that order work on it: allocations ([`DeviceBuffer`]), streams,
//! and the pool of events that streaming uploads mark tensors with.

use std::sync::{Arc, Mutex};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::{Error, Result};

use crate::driver::{call, Current, Gpu};

impl Gpu {
    /// Allocates `bytes` of device memory (at least 1).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        let _current = self.enter()?;
        // SAFETY: the context is current.
        let ptr = call("cuMemAlloc", || unsafe { cu::malloc_sync(bytes.max(1)) }).map_err(|e| {
            Error::Cuda {
                message: format!(
                    "{e} (allocating {bytes} bytes on CUDA device {})",
                    self.ordinal()
                ),
            }
        })?;
        Ok(DeviceBuffer {
            gpu: self.clone(),
            ptr,
            len: bytes,
        })
    }
}

/// A device allocation, freed on drop unless released.
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    pub(crate) ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives up ownership: the caller frees the address with `cuMemFree`. The memory stays
    /// valid for the life of the process (the device's primary context is never released).
    pub fn release(mut self) -> u64 {
        std::mem::replace(&mut self.ptr, 0)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            if let Ok(_current) = self.gpu.enter() {
                // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
                let _ = call("cuMemFree", || unsafe { cu::free_sync(self.ptr) });
            }
        }
    }
}

/// Frees device memory that a caller took over with [`DeviceBuffer::release`].
pub fn free(ordinal: usize, ptr: u64) -> Result<()> {
    let gpu = Gpu::open(ordinal)?;
    let _current = gpu.enter()?;
    // SAFETY: the caller passes an address from this library's allocation on this device.
    call("cuMemFree", || unsafe { cu::free_sync(ptr) })
}

/// A non-blocking stream, destroyed on drop (in its context, which outlives it).
pub(crate) struct Stream {
    pub(crate) handle: sys::CUstream,
    ctx: sys::CUcontext,
}

impl Stream {
    pub(crate) fn new(gpu: &Gpu) -> Result<Stream> {
        let _current = gpu.enter()?;
        call("cuStreamCreate", || {
            cu::stream::create(cu::stream::StreamKind::NonBlocking)
        })
        .map(|handle| Stream {
            handle,
            ctx: gpu.ctx,
        })
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: a stream we created and have not destroyed.
        call("cuStreamSynchronize", || unsafe {
            cu::stream::synchronize(self.handle)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_current) = Current::enter(self.ctx) {
            // Copies still queued would be lost with the stream.
            let _ = self.synchronize();
            // SAFETY: created by `Stream::new` and destroyed once.
            let _ = call("cuStreamDestroy", || unsafe {
                cu::stream::destroy(self.handle)
            });
        }
    }
}

/// A CUDA event of the pool (a landing or release mark).
pub struct Event(pub(crate) sys::CUevent);

// SAFETY: an event handle may be used from any thread with its context current.
unsafe impl Send for Event {}

/// Events for marks, reused across uploads; destroyed with the uploader, in its context.
pub(crate) struct EventPool {
    free: Mutex<Vec<Event>>,
    ctx: sys::CUcontext,
}

impl EventPool {
    pub(crate) fn new(ctx: sys::CUcontext) -> EventPool {
        EventPool {
            free: Mutex::new(Vec::new()),
            ctx,
        }
    }

    /// An event, made in the pool's context (which the caller has made current).
    pub(crate) fn take(&self) -> Result<Event> {
        if let Some(e) = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(e);
        }
        // Blocking sync: a thread waiting for a tensor to land sleeps rather than spins.
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        call("cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut event, flags).result()
        })?;
        Ok(Event(event))
    }

    /// Takes an event back. A record still pending on it is harmless: the next record
    /// replaces it, and waits already enqueued on it keep the one they saw.
    pub(crate) fn give(&self, event: Event) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// An event recorded on `stream` now.
    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<Event> {
        let event = self.take()?;
        // SAFETY: an event of this context, on a stream of this context.
        match call("cuEventRecord", || unsafe {
            cu::event::record(event.0, stream)
        }) {
            Ok(()) => Ok(event),
            Err(e) => {
                self.give(event);
                Err(e)
            }
        }
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        let Ok(_current) = Current::enter(self.ctx) else {
            return;
        };
        for event in self
            .free
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            // SAFETY: created by `take`, destroyed once; a pending record completes harmlessly.
            let _ = call("cuEventDestroy", || unsafe { cu::event::destroy(event.0) });
        }
    }
}
