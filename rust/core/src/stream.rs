//! Host streaming: tensors (or slices) of a file, a checkpoint or a list of files delivered in
//! file order as soon as their bytes are read, with at most `max_inflight_bytes` of buffers
//! alive at once.
//!
//! A background thread reads ahead; each delivered [`StreamTensor`] owns its buffer, and dropping
//! it returns its bytes to the budget. A tensor larger than the bound is still delivered: the
//! reader waits until nothing else is alive and then reads it alone, so the peak is
//! `max(max_inflight_bytes, largest tensor)`. Works with every backend (the mapped one copies out
//! of the mapping, so the budget bounds the copies, not the page cache).
//!
//! With the direct backend a whole tensor of at least one block is read with `O_DIRECT` straight
//! into an aligned buffer ([`SafeFile::read_data_aligned`]): no bounce buffer and no copy, which
//! is what lets a stream read at the disk's speed. That buffer also holds the rest of the
//! 4096-byte blocks at the tensor's two ends (at most 8 KiB more); the budget counts tensor
//! bytes, as it does for every backend (whose buffers also round up to whole pages), so the
//! bound and the peak keep their meaning across backends.
//!
//! Why `next` can fail rather than wait: when the reader waits for budget, nothing is queued, and
//! every byte alive is in a tensor already delivered, only the caller can make room. A caller
//! that keeps its tensors on the thread that asks for more would wait forever, so by default
//! `next` says so at once ([`Error::BudgetExceeded`]). Consumers that hand tensors to other
//! threads, which drop them later, set [`StreamOptions::wait_for_release`] and `next` waits.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::direct::AlignedBuf;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::request::{resolve, Item, Request, Source};

mod read;
use read::read_all;

/// How a [`TensorStream`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// Most bytes of buffers alive at once: read, queued and delivered-but-not-dropped. A
    /// tensor larger than this is read alone, once nothing else is alive. Default 256 MiB.
    pub max_inflight_bytes: u64,
    /// When the stream cannot go on until delivered tensors are dropped: `false` (the default)
    /// makes `next` return [`Error::BudgetExceeded`] at once; `true` makes it wait, for callers
    /// whose other threads drop the tensors (a caller that holds them itself then waits
    /// forever).
    pub wait_for_release: bool,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            max_inflight_bytes: 256 << 20,
            wait_for_release: false,
        }
    }
}

/// What the reader thread and the consumer share.
struct Shared {
    state: Mutex<State>,
    /// Signalled on every change: bytes released, a tensor queued, the reader waiting or done,
    /// cancellation.
    changed: Condvar,
    bound: u64,
}

#[derive(Default)]
struct State {
    /// Bytes of buffers alive: being read, queued, or delivered and not dropped.
    alive: u64,
    peak: u64,
    cancelled: bool,
    /// Read and not yet taken by `next`.
    ready: VecDeque<Result<StreamTensor>>,
    /// The item the reader waits to have budget for.
    waiting: Option<usize>,
    /// The reader has stopped (everything sent, an error sent, or cancelled).
    done: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; a poisoned lock still holds consistent counts.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(s).unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `len` more bytes may be alive now: they fit under the bound, or nothing else is
    /// alive (a tensor larger than the bound), or they are none.
    fn fits(&self, s: &State, len: u64) -> bool {
        len == 0 || s.alive == 0 || s.alive.saturating_add(len) <= self.bound
    }

    /// Waits until item `item` of `len` bytes fits; false when the stream was cancelled.
    fn acquire(&self, item: usize, len: u64) -> bool {
        let mut s = self.lock();
        while !s.cancelled && !self.fits(&s, len) {
            if s.waiting != Some(item) {
                s.waiting = Some(item);
                self.changed.notify_all();
            }
            s = self.wait(s);
        }
        s.waiting = None;
        if s.cancelled {
            return false;
        }
        s.alive += len;
        s.peak = s.peak.max(s.alive);
        true
    }

    /// Announces a change to the queue of read tensors to a ThreadSanitizer build of the
    /// program (`crate::tsan`; nothing elsewhere), called under the lock just before and just
    /// after the change, on both sides: the reader thread queueing a tensor (once everything in
    /// it was allocated and written) and the consumer taking tensors out (`next`, or dropping
    /// the stream). The sanitizer cannot see this crate's lock, so without this a sanitized
    /// program reading a delivered tensor would be told it races the reader's writes.
    fn announce(&self) {
        crate::tsan::acquire(&self.state);
        crate::tsan::release(&self.state);
    }

    /// Takes `len` bytes of the budget if they fit now (never waits).
    fn try_acquire(&self, len: u64) -> bool {
        let mut s = self.lock();
        if s.cancelled || !self.fits(&s, len) {
            return false;
        }
        s.alive += len;
        s.peak = s.peak.max(s.alive);
        true
    }

    fn cancelled(&self) -> bool {
        self.lock().cancelled
    }

    fn release(&self, len: u64) {
        self.lock().alive -= len;
        self.changed.notify_all();
    }

    /// Queues `item` for `next`; hands it back when the stream was cancelled, for the caller to
    /// drop outside the lock (dropping a tensor takes the lock).
    fn deliver(&self, item: Result<StreamTensor>) -> Option<Result<StreamTensor>> {
        let mut s = self.lock();
        if s.cancelled {
            return Some(item);
        }
        // Under the lock, so that `next` cannot take the item before the hand-over is announced.
        self.announce();
        s.ready.push_back(item);
        self.announce();
        self.changed.notify_all();
        None
    }
}

/// Marks the reader done however it leaves, so that `next` never waits on a reader that is gone.
/// Left by unwinding (a defect), it queues an `Internal` error first: a stream whose reader died
/// must not look like one that delivered everything.
struct Finish(Arc<Shared>);

impl Drop for Finish {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        if std::thread::panicking() && !s.cancelled {
            s.ready.push_back(Err(Error::Internal {
                message: "the stream's reader thread stopped on a defect before the stream ended; \
                          please report it"
                    .into(),
            }));
        }
        s.done = true;
        drop(s);
        self.0.changed.notify_all();
    }
}

/// One delivered tensor (or slice); owns its bytes. Dropping it returns them to the stream's
/// budget.
pub struct StreamTensor {
    /// Position in the request list ([`TensorStream::open`]); for a whole source, and for
    /// [`TensorStream::new`], the position in delivery order.
    pub request: usize,
    /// The file it came from, in the source's numbering (a checkpoint's shard index, or the
    /// position in the list of files; 0 for [`TensorStream::new`]).
    pub file: usize,
    /// The tensor's position in its file, in offset (file) order.
    pub index: usize,
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of what was delivered: the slice's for a slice.
    pub shape: Vec<usize>,
    data: Buffer,
    /// Bytes counted against the budget for it (its full length, also while it is read or
    /// when reading it failed).
    reserved: u64,
    source: Arc<SafeFile>,
    shared: Arc<Shared>,
}

impl StreamTensor {
    /// The delivered bytes: the whole tensor, or the slice's selected bytes packed in row-major
    /// order (what [`SafeFile::read_slice`] gives).
    pub fn data(&self) -> &[u8] {
        match &self.data {
            Buffer::Plain(v) => v,
            Buffer::Aligned { buf, head, len } => &buf.as_slice()[*head..*head + *len],
        }
    }

    /// Path of the file it came from.
    pub fn path(&self) -> &Path {
        self.source.path()
    }
}

impl std::fmt::Debug for StreamTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTensor")
            .field("request", &self.request)
            .field("file", &self.file)
            .field("index", &self.index)
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.data().len())
            .finish()
    }
}

/// A delivered tensor's bytes: a buffer of exactly its length, or (direct backend) the aligned
/// span around it, read straight from the disk, with where the tensor starts in it.
enum Buffer {
    Plain(Vec<u8>),
    Aligned {
        buf: AlignedBuf,
        head: usize,
        len: usize,
    },
}

impl StreamTensor {
    /// `item`'s tensor with no bytes yet, holding its budget (returned when it drops).
    fn unread(item: &Item, shared: &Arc<Shared>) -> StreamTensor {
        StreamTensor {
            request: item.request,
            file: item.file,
            index: item.position,
            name: item.name.clone(),
            dtype: item.dtype,
            shape: item.shape.clone(),
            data: Buffer::Plain(Vec::new()),
            reserved: item.len,
            source: item.source.clone(),
            shared: shared.clone(),
        }
    }
}

impl Drop for StreamTensor {
    fn drop(&mut self) {
        self.shared.release(self.reserved);
    }
}

/// Tensors in file order with bounded buffers; an iterator of `Result<StreamTensor>`.
///
/// ```no_run
/// use std::sync::Arc;
/// use safetensors_core::{Backend, Checkpoint, Request, SafeFile, Source, StreamOptions, TensorStream};
/// let f = Arc::new(SafeFile::open("model.safetensors", Backend::Direct)?);
/// for t in TensorStream::new(f, None, 256 << 20)? {
///     let t = t?;                       // transform t.data() here; dropping t frees its budget
/// }
/// let ckpt = Checkpoint::open("model.safetensors.index.json", Backend::Direct)?;
/// for t in TensorStream::open(Source::Checkpoint(&ckpt), None, StreamOptions::default())? {
///     let t = t?;                       // t.name, t.shape, t.file (the shard), t.data()
/// }
/// # Ok::<(), safetensors_core::Error>(())
/// ```
///
/// The caller makes room by dropping tensors. When the next tensor cannot be read until the
/// caller drops some (asking for it while holding more than the bound minus its size, or,
/// before a tensor larger than the bound, holding anything), `next` returns
/// [`Error::BudgetExceeded`] at once, unless [`StreamOptions::wait_for_release`] is set, in which
/// case it waits for other threads to drop what they hold.
///
/// [`Error::BudgetExceeded`] is the one error a stream recovers from: once the caller has
/// dropped what it holds, the next `next` goes on where the stream was (nothing is skipped).
/// Every other error ends the stream (and frees the tensors read but not yet taken), and every
/// later `next` returns that same error again: a stream that failed never looks like one that
/// ended (stop at the first error, as `t?` does). A file that shrinks gives `Io` for the tensor
/// it cuts short, never other bytes (read and direct backends; a mapping of a file cut short
/// faults with `SIGBUS`). Dropping the stream early cancels the
/// reads not yet started and returns once the one in progress reaches the end of its piece
/// (whole tensors are read in pieces of 64 MiB; a slice at once; from a file that reads in
/// batches, a remote one read on demand, pieces of 256 MiB and batches of small tensors of up
/// to 256 MiB, each fetched whole).
pub struct TensorStream {
    shared: Arc<Shared>,
    items: Arc<[Item]>,
    reader: Option<JoinHandle<()>>,
    options: StreamOptions,
    /// Every tensor was delivered: `next` returns `None`.
    ended: bool,
    /// The error that ended the stream, returned again by every later `next`.
    failed: Option<Error>,
}

impl TensorStream {
    /// Streams the tensors at `positions` (file-order indices; `None` for all) of `file`, in
    /// file order, with at most `max_inflight_bytes` alive and the default options otherwise.
    /// Repeated positions are streamed once.
    pub fn new(
        file: Arc<SafeFile>,
        positions: Option<Vec<usize>>,
        max_inflight_bytes: u64,
    ) -> Result<TensorStream> {
        let options = StreamOptions {
            max_inflight_bytes,
            ..StreamOptions::default()
        };
        let files = [file];
        let Some(mut order) = positions else {
            return TensorStream::open(Source::Files(&files), None, options);
        };
        order.sort_unstable();
        order.dedup();
        let header = files[0].header();
        let requests = order
            .into_iter()
            .map(|i| match header.at(i) {
                Some(info) => Ok(Request::tensor(info.name).in_file(0)),
                None => Err(Error::TensorNotFound {
                    name: format!("#{i}"),
                }
                .in_file(files[0].path())),
            })
            .collect::<Result<Vec<_>>>()?;
        TensorStream::open(Source::Files(&files), Some(&requests), options)
    }

    /// Streams `requests` of `source` (`None`: every tensor of every file, or every tensor a
    /// checkpoint's index lists, as [`crate::Plan::of`] takes them) in file order: file by file
    /// in the source's numbering, data offsets ascending within a file, request order among
    /// equal offsets. Every request is delivered, repeats included. Opens the checkpoint shards
    /// it touches now; errors in the requests (a missing tensor, a slice that does not fit) are
    /// returned here, before anything is read.
    pub fn open(
        source: Source<'_>,
        requests: Option<&[Request]>,
        options: StreamOptions,
    ) -> Result<TensorStream> {
        TensorStream::start(source, requests, options)
    }

    fn start(
        source: Source<'_>,
        requests: Option<&[Request]>,
        options: StreamOptions,
    ) -> Result<TensorStream> {
        let items: Arc<[Item]> = resolve(source, requests)?.into();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            bound: options.max_inflight_bytes,
        });
        let (s, its) = (shared.clone(), items.clone());
        let reader = std::thread::Builder::new()
            .name("st-stream".into())
            .spawn(move || read_all(&s, &its))
            .map_err(|e| {
                let at = items.first().map_or(Path::new(""), |it| it.source.path());
                Error::io(at, "start a stream thread", e)
            })?;
        Ok(TensorStream {
            shared,
            items,
            reader: Some(reader),
            options,
            ended: false,
            failed: None,
        })
    }

    /// How many tensors (or slices) the stream delivers in all.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// `true` when the stream delivers nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes the stream delivers in all.
    pub fn total_bytes(&self) -> u64 {
        // Saturating: requests of one huge tensor repeated could add up past 64 bits.
        self.items
            .iter()
            .fold(0u64, |sum, it| sum.saturating_add(it.len))
    }

    /// The options it runs with.
    pub fn options(&self) -> StreamOptions {
        self.options
    }

    /// The most bytes of delivered-but-alive, queued and being-read buffers so far
    /// (instrumentation): at most `max(max_inflight_bytes, largest tensor)`.
    pub fn peak_inflight_bytes(&self) -> u64 {
        self.shared.lock().peak
    }

    /// Bytes alive now.
    pub fn inflight_bytes(&self) -> u64 {
        self.shared.lock().alive
    }

    /// The error `next` returns when the reader waits for budget that only the caller can free:
    /// nothing queued, the item still does not fit, and no other thread is said to release.
    fn stuck(&self, s: &State) -> Option<Error> {
        let i = s.waiting?;
        let item = self.items.get(i)?;
        if self.options.wait_for_release || self.shared.fits(s, item.len) {
            return None;
        }
        Some(
            Error::BudgetExceeded {
                tensor: item.name.clone(),
                held: s.alive,
                bound: self.shared.bound,
                next: item.len,
            }
            .in_file(item.source.path()),
        )
    }

    fn shutdown(&mut self) {
        self.shared.lock().cancelled = true;
        self.shared.changed.notify_all();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        // Dropped outside the lock: each one takes it to release its bytes.
        let ready = {
            let mut s = self.shared.lock();
            self.shared.announce();
            let ready = std::mem::take(&mut s.ready);
            self.shared.announce();
            ready
        };
        drop(ready);
    }
}

impl Iterator for TensorStream {
    type Item = Result<StreamTensor>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = &self.failed {
            return Some(Err(e.clone()));
        }
        if self.ended {
            return None;
        }
        let mut s = self.shared.lock();
        let out = loop {
            if !s.ready.is_empty() {
                self.shared.announce();
                let item = s.ready.pop_front();
                self.shared.announce();
                break item;
            }
            if s.done {
                break None;
            }
            if let Some(e) = self.stuck(&s) {
                // Recoverable: the reader still waits for budget, and goes on once the caller
                // drops what it holds.
                return Some(Err(e));
            }
            s = self.shared.wait(s);
        };
        drop(s);
        match &out {
            Some(Ok(_)) => {}
            None => {
                self.ended = true;
                self.shutdown();
            }
            Some(Err(e)) => {
                self.failed = Some(e.clone());
                self.shutdown();
            }
        }
        out
    }
}

impl Drop for TensorStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}
