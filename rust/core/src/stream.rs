//! Host streaming: every tensor of a file (or a chosen subset) delivered in file order as soon as
//! its bytes are read, with at most `max_inflight_bytes` of buffers alive at once.
//!
//! A background thread reads ahead; each delivered [`StreamTensor`] owns its buffer, and dropping
//! it returns its bytes to the budget. A tensor larger than the bound is still delivered: the
//! reader waits until nothing else is alive and then reads it alone, so the peak is
//! `max(max_inflight_bytes, largest tensor)`. Works with every backend (the mapped one copies out
//! of the mapping, so the budget bounds the copies, not the page cache).

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::file::SafeFile;

#[derive(Default)]
struct Budget {
    state: Mutex<BudgetState>,
    freed: Condvar,
}

#[derive(Default)]
struct BudgetState {
    alive: u64,
    peak: u64,
    cancelled: bool,
}

impl Budget {
    /// Waits until `len` more bytes fit under `bound` (or nothing is alive, for a tensor larger
    /// than the bound); false when the stream was cancelled.
    fn acquire(&self, len: u64, bound: u64) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        while !s.cancelled && s.alive > 0 && s.alive + len > bound {
            s = match self.freed.wait(s) {
                Ok(s) => s,
                Err(_) => return false,
            };
        }
        if s.cancelled {
            return false;
        }
        s.alive += len;
        s.peak = s.peak.max(s.alive);
        true
    }

    fn release(&self, len: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.alive -= len;
        }
        self.freed.notify_all();
    }

    fn cancel(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.cancelled = true;
        }
        self.freed.notify_all();
    }
}

/// One delivered tensor; owns its bytes. Dropping it returns them to the stream's budget.
pub struct StreamTensor {
    /// Position in file order.
    pub index: usize,
    /// The tensor's name.
    pub name: String,
    data: Vec<u8>,
    budget: Arc<Budget>,
}

impl StreamTensor {
    /// The tensor's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for StreamTensor {
    fn drop(&mut self) {
        self.budget.release(self.data.len() as u64);
    }
}

/// Tensors in file order with bounded buffers; an iterator of `Result<StreamTensor>`.
///
/// ```no_run
/// use std::sync::Arc;
/// use safetensors_core::{Backend, SafeFile, TensorStream};
/// let f = Arc::new(SafeFile::open("model.safetensors", Backend::Direct)?);
/// for t in TensorStream::new(f, None, 256 << 20)? {
///     let t = t?;                       // transform t.data() here; dropping t frees its budget
/// }
/// # Ok::<(), safetensors_core::Error>(())
/// ```
///
/// The caller makes room by dropping tensors: asking for the next one while holding more than
/// the bound minus its size (or, before a tensor larger than the bound, holding anything) blocks
/// until another thread drops what it holds. Known limit: a single thread that holds on never
/// wakes; hold at most the bound you chose.
///
/// After an error the stream ends (and frees everything). Dropping the stream early cancels the
/// reads not yet started and returns once the one in progress (at most one tensor) is done.
pub struct TensorStream {
    rx: Option<Receiver<Result<StreamTensor>>>,
    budget: Arc<Budget>,
    reader: Option<JoinHandle<()>>,
    failed: bool,
}

impl TensorStream {
    /// Streams the tensors at `positions` (file-order indices; `None` for all) of `file`, in
    /// file order, with at most `max_inflight_bytes` alive (see the module comment).
    pub fn new(
        file: Arc<SafeFile>,
        positions: Option<Vec<usize>>,
        max_inflight_bytes: u64,
    ) -> Result<TensorStream> {
        let count = file.header().len();
        let mut order = positions.unwrap_or_else(|| (0..count).collect());
        order.sort_unstable();
        order.dedup();
        if let Some(&bad) = order.iter().find(|&&i| i >= count) {
            return Err(Error::TensorNotFound {
                name: format!("#{bad}"),
            }
            .in_file(file.path()));
        }
        let budget = Arc::new(Budget::default());
        // Delivery is bounded by the budget, not the channel; one slot per tensor never blocks.
        let (tx, rx) = sync_channel(order.len().max(1));
        let b = budget.clone();
        let path = file.path().to_path_buf();
        let reader = std::thread::Builder::new()
            .name("st-stream".into())
            .spawn(move || {
                for i in order {
                    let Some(info) = file.header().at(i) else {
                        return;
                    };
                    let (begin, end) = info.data_offsets;
                    let len = (end - begin) as u64;
                    if !b.acquire(len, max_inflight_bytes) {
                        return;
                    }
                    let t = StreamTensor {
                        index: i,
                        name: info.name.to_owned(),
                        data: Vec::new(),
                        budget: b.clone(),
                    };
                    let item = read_into(&file, t, begin, end - begin);
                    let stop = item.is_err();
                    if tx.send(item).is_err() || stop {
                        return;
                    }
                }
            })
            .map_err(|e| Error::io(&path, "start a stream thread", e))?;
        Ok(TensorStream {
            rx: Some(rx),
            budget,
            reader: Some(reader),
            failed: false,
        })
    }

    /// The most bytes of delivered-but-alive and being-read buffers so far (instrumentation).
    pub fn peak_inflight_bytes(&self) -> u64 {
        self.budget.state.lock().map_or(0, |s| s.peak)
    }

    /// Bytes alive now.
    pub fn inflight_bytes(&self) -> u64 {
        self.budget.state.lock().map_or(0, |s| s.alive)
    }
}

/// Fills `t` with `len` bytes from data offset `begin`; on failure its budget is returned when
/// `t` drops.
fn read_into(
    file: &SafeFile,
    mut t: StreamTensor,
    begin: usize,
    len: usize,
) -> Result<StreamTensor> {
    if t.data.try_reserve_exact(len).is_err() {
        return Err(Error::io(
            file.path(),
            "allocate a stream buffer",
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("{len} bytes for tensor `{}`", t.name),
            ),
        ));
    }
    // Counted against the budget at its full length before the read starts.
    t.data.resize(len, 0);
    file.read_data(begin as u64, &mut t.data)?;
    Ok(t)
}

impl Iterator for TensorStream {
    type Item = Result<StreamTensor>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.rx.as_ref()?.recv().ok()?;
        if item.is_err() {
            self.failed = true;
            self.shutdown();
        }
        Some(item)
    }
}

impl TensorStream {
    fn shutdown(&mut self) {
        self.budget.cancel();
        // Dropping the receiver frees tensors read but not yet taken, and makes the reader's
        // next send fail, so it stops.
        self.rx = None;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for TensorStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}
