//! The device's side of an upload's timeline (`SAFETENSORS_UPLOAD_TRACE`, the core's
//! `upload::trace`): in trace mode only, an event with timing is recorded on the copy stream at
//! the run's start and before and after each copy (or each zero-copy span's copies), and once
//! the upload is complete `cuEventElapsedTime` turns them into each copy's start and end on the
//! device's clock, from the run's start. Outside trace mode nothing here runs: the pipeline's
//! events stay without timing, as the driver recommends for events that only order work.

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use safetensors_core::upload::{DeviceCopy, Timeline};
use safetensors_core::Result;

use crate::driver::call;

/// A timing event (blocking sync, timing enabled), destroyed on drop (in its context, current
/// on the thread that drops it: the uploader's call).
struct TimingEvent(sys::CUevent);

impl TimingEvent {
    fn recorded(stream: sys::CUstream) -> Result<TimingEvent> {
        let mut event = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        // SAFETY: writes one event handle; the caller's context is current.
        call("cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut event, flags).result()
        })?;
        let event = TimingEvent(event);
        // SAFETY: an event of the current context, on a stream of it.
        call("cuEventRecord", || unsafe {
            cu::event::record(event.0, stream)
        })?;
        Ok(event)
    }
}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        // SAFETY: created by `recorded`, destroyed once; a pending record completes harmlessly.
        let _ = call("cuEventDestroy", || unsafe { cu::event::destroy(self.0) });
    }
}

// SAFETY: an event handle may be used from any thread with its context current.
unsafe impl Send for TimingEvent {}

/// One traced run's events.
pub(crate) struct DeviceTrace {
    stream: sys::CUstream,
    start: TimingEvent,
    /// When the start event was recorded, on the host's clock: the device's times are moved
    /// onto the run's origin by the host's time between the two (the stream is idle then, so
    /// the device stamps the start event as soon as it is recorded).
    recorded: Instant,
    /// Held across a copy and its two events, so that no other thread's copy falls between
    /// them on the stream; each copy's destination, bytes and events.
    copies: Mutex<Vec<(u64, u64, TimingEvent, TimingEvent)>>,
}

// SAFETY: the stream and events are plain handles used with the device's context current.
unsafe impl Sync for DeviceTrace {}

impl DeviceTrace {
    /// Starts a trace of copies on `stream` (the context current).
    pub(crate) fn start(stream: sys::CUstream) -> Result<DeviceTrace> {
        let recorded = Instant::now();
        Ok(DeviceTrace {
            stream,
            recorded,
            start: TimingEvent::recorded(stream)?,
            copies: Mutex::new(Vec::new()),
        })
    }

    /// Runs `copy` (which enqueues the copies of destination bytes `[dst, dst + bytes)` on the
    /// stream) between two timing events.
    pub(crate) fn around<T>(
        &self,
        dst: u64,
        bytes: u64,
        copy: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let before = TimingEvent::recorded(self.stream)?;
        let result = copy()?;
        let after = TimingEvent::recorded(self.stream)?;
        copies.push((dst, bytes, before, after));
        Ok(result)
    }

    /// Once every copy is complete: each copy's start and end, in nanoseconds from the start
    /// event, into `timeline` (sorted by start).
    pub(crate) fn finish(self, timeline: &mut Timeline) -> Result<()> {
        // The start event came before the run's origin: its distance, signed.
        let lead = timeline.origin.map_or(0.0, |origin| {
            if origin >= self.recorded {
                -((origin - self.recorded).as_nanos() as f64)
            } else {
                (self.recorded - origin).as_nanos() as f64
            }
        });
        let ns = |e: &TimingEvent| -> Result<u64> {
            // SAFETY: both events were recorded on the stream and have completed.
            let ms = call("cuEventElapsedTime", || unsafe {
                cu::event::elapsed(self.start.0, e.0)
            })?;
            Ok((f64::from(ms) * 1e6 + lead).max(0.0) as u64)
        };
        let copies = self.copies.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut device = Vec::with_capacity(copies.len());
        for (dst, bytes, before, after) in &copies {
            device.push(DeviceCopy {
                dst: *dst,
                bytes: *bytes,
                start: ns(before)?,
                end: ns(after)?,
            });
        }
        device.sort_by_key(|c| c.start);
        timeline.device = device;
        Ok(())
    }
}

/// Where `SAFETENSORS_UPLOAD_TRACE` (as it was when the uploader was made) sends each traced
/// upload's timeline: a file to append one line of JSON to, when the value is a path (not `1`).
pub(crate) fn trace_file() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("SAFETENSORS_UPLOAD_TRACE")?;
    (!path.is_empty() && path != "0" && path != "1").then(|| path.into())
}

/// Appends `timeline` to `path` as one line of JSON. A trace is a diagnostic: a file that cannot
/// be written loses the line, not the upload.
pub(crate) fn append(path: &std::path::Path, timeline: &Timeline) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{}", timeline.to_json());
    }
}
