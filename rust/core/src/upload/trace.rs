//! An upload's timeline, when asked for ([`PipelineOptions::trace`](super::PipelineOptions),
//! `SAFETENSORS_UPLOAD_TRACE`): for each chunk, when its first stripe was claimed, when its slot
//! was ready (the previous copy out of it done), when its last stripe was filled and when its
//! copy was submitted, on the host's clock in nanoseconds from the run's start; for the run,
//! when the readers started, the destination's allocation and the end; and, where the target
//! can tell (CUDA events with timing, in trace mode only), when each copy started and ended on
//! the device, on the same origin. What the GPU benchmarks read to see where a load's time goes:
//! [`Timeline::summary`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// One chunk's moments, in nanoseconds from the run's start (0: did not happen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkTimes {
    /// Its first stripe claimed by a reader.
    pub claimed: u64,
    /// Its slot ready to fill (the slot's previous copy waited for, the slot sized).
    pub ready: u64,
    /// Its last stripe filled.
    pub filled: u64,
    /// Its copy submitted.
    pub submitted: u64,
    /// Bytes of the destination it covers.
    pub bytes: u64,
    /// Copied straight from the file's pages (zero-copy), not staged.
    pub zero_copy: bool,
}

/// A copy as the device ran it: destination bytes `[dst, dst + bytes)`, started and ended at
/// these nanoseconds from the run's start (the device's clock, aligned on the run's start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCopy {
    /// First destination byte.
    pub dst: u64,
    /// Bytes.
    pub bytes: u64,
    /// Start and end, nanoseconds from the run's start.
    pub start: u64,
    /// See `start`.
    pub end: u64,
}

/// One run's timeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Each chunk's moments, by number.
    pub chunks: Vec<ChunkTimes>,
    /// When the readers were started (the run handed to them).
    pub readers_started: u64,
    /// The destination's allocation, when it overlapped the reads: its start and end.
    pub alloc: Option<(u64, u64)>,
    /// The run's end (every copy submitted; with `Ring::upload`, complete).
    pub end: u64,
    /// Bytes per stripe.
    pub stripe_bytes: u64,
    /// Readers of the run.
    pub readers: usize,
    /// The copies as the device ran them, when the target could tell.
    pub device: Vec<DeviceCopy>,
    /// The instant the run started (what every time here counts from).
    pub origin: Option<Instant>,
}

/// What a timeline says, in the units the benchmarks print.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TraceSummary {
    /// Time the link carried copies ÷ time from its first copy's start to its last copy's end.
    pub link_busy: f64,
    /// From the run's start to the first copy's start.
    pub first_copy_ms: f64,
    /// From the last chunk filled to the last copy's end: the pipeline's drain.
    pub drain_ms: f64,
    /// Staged bytes ÷ time from the readers' start to the last fill.
    pub fill_gbps: f64,
    /// The destination's allocation.
    pub alloc_ms: f64,
    /// The whole run.
    pub total_ms: f64,
    /// Whether the copy times are the device's (else: submissions, the host's view).
    pub device_times: bool,
    /// Chunks copied zero-copy.
    pub zero_copy_chunks: usize,
}

impl Timeline {
    /// The summary: from the device's copy times when there are some, else from submissions.
    pub fn summary(&self) -> TraceSummary {
        let ms = |ns: u64| ns as f64 / 1e6;
        let copies: Vec<(u64, u64)> = if self.device.is_empty() {
            self.chunks
                .iter()
                .filter(|c| c.submitted > 0)
                .map(|c| (c.submitted, c.submitted))
                .collect()
        } else {
            self.device.iter().map(|c| (c.start, c.end)).collect()
        };
        let first = copies.iter().map(|c| c.0).min().unwrap_or(0);
        let last = copies.iter().map(|c| c.1).max().unwrap_or(0);
        let busy = busy_time(&copies);
        let last_fill = self.chunks.iter().map(|c| c.filled).max().unwrap_or(0);
        let staged: u64 = self
            .chunks
            .iter()
            .filter(|c| !c.zero_copy)
            .map(|c| c.bytes)
            .sum();
        let fill_ns = last_fill.saturating_sub(self.readers_started);
        TraceSummary {
            link_busy: if last > first {
                busy as f64 / (last - first) as f64
            } else {
                0.0
            },
            first_copy_ms: ms(first),
            drain_ms: ms(last.saturating_sub(last_fill)),
            fill_gbps: if fill_ns > 0 {
                staged as f64 / fill_ns as f64
            } else {
                0.0
            },
            alloc_ms: self.alloc.map_or(0.0, |(a, b)| ms(b.saturating_sub(a))),
            total_ms: ms(self.end),
            device_times: !self.device.is_empty(),
            zero_copy_chunks: self.chunks.iter().filter(|c| c.zero_copy).count(),
        }
    }

    /// The timeline and its summary as one line of JSON (what `SAFETENSORS_UPLOAD_TRACE`
    /// appends to its file).
    pub fn to_json(&self) -> String {
        let s = self.summary();
        let chunks: Vec<serde_json::Value> = self
            .chunks
            .iter()
            .map(|c| {
                serde_json::json!([
                    c.claimed,
                    c.ready,
                    c.filled,
                    c.submitted,
                    c.bytes,
                    c.zero_copy
                ])
            })
            .collect();
        let device: Vec<serde_json::Value> = self
            .device
            .iter()
            .map(|c| serde_json::json!([c.dst, c.bytes, c.start, c.end]))
            .collect();
        serde_json::json!({
            "summary": {
                "link_busy": s.link_busy,
                "first_copy_ms": s.first_copy_ms,
                "drain_ms": s.drain_ms,
                "fill_gbps": s.fill_gbps,
                "alloc_ms": s.alloc_ms,
                "total_ms": s.total_ms,
                "device_times": s.device_times,
                "zero_copy_chunks": s.zero_copy_chunks,
            },
            "stripe_bytes": self.stripe_bytes,
            "readers": self.readers,
            "readers_started_ns": self.readers_started,
            "alloc_ns": self.alloc.map(|(a, b)| [a, b]),
            "end_ns": self.end,
            "chunk_fields": ["claimed_ns", "ready_ns", "filled_ns", "submitted_ns", "bytes", "zero_copy"],
            "chunks": chunks,
            "device_fields": ["dst", "bytes", "start_ns", "end_ns"],
            "device": device,
        })
        .to_string()
    }
}

/// The time covered by the union of `spans`.
fn busy_time(spans: &[(u64, u64)]) -> u64 {
    let mut sorted = spans.to_vec();
    sorted.sort_unstable();
    let mut busy = 0;
    let mut reach = 0;
    for (a, b) in sorted {
        let a = a.max(reach);
        if b > a {
            busy += b - a;
            reach = b;
        }
    }
    busy
}

/// Which moment of a chunk.
#[derive(Debug, Clone, Copy)]
pub(super) enum Moment {
    Claimed = 0,
    Ready = 1,
    Filled = 2,
    Submitted = 3,
}

/// Records one run's timeline from any reader thread.
pub(super) struct Recorder {
    start: Instant,
    moments: Vec<[AtomicU64; 4]>,
    zero_copy: Vec<AtomicU64>,
    rest: Mutex<Timeline>,
}

impl Recorder {
    pub(super) fn new(chunks: usize) -> Recorder {
        Recorder {
            start: Instant::now(),
            moments: (0..chunks).map(|_| Default::default()).collect(),
            zero_copy: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
            rest: Mutex::new(Timeline::default()),
        }
    }

    /// Nanoseconds since the run's start (at least 1, so that 0 means "never").
    pub(super) fn now(&self) -> u64 {
        (self.start.elapsed().as_nanos() as u64).max(1)
    }

    /// The moment of chunk `k`, the first time it happens.
    pub(super) fn mark(&self, k: usize, moment: Moment) {
        if let Some(m) = self.moments.get(k) {
            let _ = m[moment as usize].compare_exchange(
                0,
                self.now(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    pub(super) fn zero_copy(&self, k: usize) {
        if let Some(z) = self.zero_copy.get(k) {
            z.store(1, Ordering::Relaxed);
        }
    }

    pub(super) fn edit(&self, f: impl FnOnce(&mut Timeline, u64)) {
        let now = self.now();
        f(
            &mut self.rest.lock().unwrap_or_else(|p| p.into_inner()),
            now,
        );
    }

    /// The timeline, with each chunk's size from `bytes_of`.
    pub(super) fn finish(self, bytes_of: impl Fn(usize) -> u64) -> Timeline {
        let end = self.now();
        let mut t = self.rest.into_inner().unwrap_or_else(|p| p.into_inner());
        t.end = end;
        t.origin = Some(self.start);
        t.chunks = self
            .moments
            .iter()
            .zip(&self.zero_copy)
            .enumerate()
            .map(|(k, (m, z))| ChunkTimes {
                claimed: m[0].load(Ordering::Relaxed),
                ready: m[1].load(Ordering::Relaxed),
                filled: m[2].load(Ordering::Relaxed),
                submitted: m[3].load(Ordering::Relaxed),
                bytes: bytes_of(k),
                zero_copy: z.load(Ordering::Relaxed) != 0,
            })
            .collect();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_counts_overlaps_once() {
        assert_eq!(busy_time(&[(0, 10), (5, 15), (20, 30)]), 25);
        assert_eq!(busy_time(&[]), 0);
    }

    #[test]
    fn a_summary_reads_the_device_copies() {
        let t = Timeline {
            chunks: vec![
                ChunkTimes {
                    filled: 2_000_000,
                    bytes: 1 << 20,
                    ..Default::default()
                },
                ChunkTimes {
                    filled: 3_000_000,
                    bytes: 1 << 20,
                    ..Default::default()
                },
            ],
            readers_started: 1_000_000,
            device: vec![
                DeviceCopy {
                    dst: 0,
                    bytes: 1 << 20,
                    start: 2_000_000,
                    end: 3_000_000,
                },
                DeviceCopy {
                    dst: 1 << 20,
                    bytes: 1 << 20,
                    start: 3_500_000,
                    end: 4_000_000,
                },
            ],
            end: 4_100_000,
            ..Default::default()
        };
        let s = t.summary();
        assert!((s.link_busy - 0.75).abs() < 1e-9, "{s:?}");
        assert!((s.first_copy_ms - 2.0).abs() < 1e-9);
        assert!((s.drain_ms - 1.0).abs() < 1e-9);
        assert!(s.device_times);
        assert!(t.to_json().contains("\"link_busy\":0.75"));
    }
}
