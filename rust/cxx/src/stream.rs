//! Glue for cold reads: which backend a file uses and whether the direct backend fell back;
//! requests as C++ sends them; prefetch, advice and streams over a file or a checkpoint; aligned
//! reads for the direct backend's views.

use std::ffi::c_void;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;

use safetensors_core::{
    Advice, Backend, Error, HandOver, Indexer, Plan, Prefetch, PrefetchOptions, Request, Source,
    StreamOptions, DIRECT_ALIGN,
};

use crate::checkpoint::Checkpoint;
use crate::ffi::{RequestSpan, SliceIndex, Status};
use crate::file::indexer;
use crate::{guard, handed_over, File};

impl File {
    pub fn backend_code(&self) -> u8 {
        match self.core().backend() {
            Backend::Mmap => 0,
            Backend::Read => 1,
            Backend::Direct => 2,
        }
    }

    pub fn direct_fallback(&self) -> &str {
        self.core().direct_fallback().unwrap_or("")
    }

    pub fn aligned_len(&self, offset: u64, len: usize, status: &mut Status) -> usize {
        guard(status, || self.core().aligned_len(offset, len))
    }

    pub fn read_data_aligned(
        &self,
        offset: u64,
        len: usize,
        dst: &mut [u8],
        status: &mut Status,
    ) -> usize {
        guard(status, || self.core().read_data_aligned(offset, len, dst))
    }
}

pub fn direct_align() -> usize {
    DIRECT_ALIGN
}

// ---- requests --------------------------------------------------------------------------------

/// One request as C++ sent it: the name as bytes (a name that is not UTF-8 matches no tensor).
struct Wanted {
    name: Vec<u8>,
    file: Option<usize>,
    slice: Option<Vec<Indexer>>,
}

/// Every tensor of a source, or requests.
pub struct RequestList {
    all: bool,
    wanted: Vec<Wanted>,
}

pub fn new_request_list(
    all: bool,
    spans: &[RequestSpan],
    names: &[u8],
    indices: &[SliceIndex],
    status: &mut Status,
) -> *mut RequestList {
    guard(status, || {
        let wanted = spans
            .iter()
            .map(|s| {
                let name = part(names, s.name_start, s.name_len)?.to_vec();
                let slice = match s.sliced {
                    true => Some(
                        part(indices, s.slice_start, s.slice_len)?
                            .iter()
                            .map(indexer)
                            .collect(),
                    ),
                    false => None,
                };
                Ok(Wanted {
                    name,
                    file: s.pinned.then_some(s.file),
                    slice,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(handed_over(RequestList { all, wanted }))
    })
}

/// `items[start..start + len]`, or an `Internal` error (the C++ header builds the spans).
fn part<T>(items: &[T], start: usize, len: usize) -> Result<&[T], Error> {
    start
        .checked_add(len)
        .and_then(|end| items.get(start..end))
        .ok_or_else(|| Error::Internal {
            message: format!(
                "a request span [{start}, +{len}) lies outside its buffer of {}",
                items.len()
            ),
        })
}

impl RequestList {
    /// The core's requests (`None`: every tensor). A name that is not UTF-8 is `TensorNotFound`
    /// in `at` (a lossy conversion could name another tensor).
    fn core(&self, at: &Path) -> Result<Option<Vec<Request>>, Error> {
        if self.all {
            return Ok(None);
        }
        let requests = self
            .wanted
            .iter()
            .map(|w| {
                let name = std::str::from_utf8(&w.name).map_err(|_| {
                    Error::TensorNotFound {
                        name: String::from_utf8_lossy(&w.name).into_owned(),
                    }
                    .in_file(at)
                })?;
                Ok(Request {
                    name: name.to_owned(),
                    file: w.file,
                    slice: w.slice.clone(),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Some(requests))
    }
}

impl Checkpoint {
    pub fn request_shards(&self, requests: &RequestList) -> Vec<usize> {
        let count = self.shard_count();
        if requests.all {
            return (0..count).collect();
        }
        let mut shards: Vec<usize> = requests
            .wanted
            .iter()
            .flat_map(|w| {
                let listed = std::str::from_utf8(&w.name)
                    .ok()
                    .and_then(|n| self.core().shard_of(n).ok());
                listed.into_iter().chain(w.file.filter(|&f| f < count))
            })
            .collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }
}

// ---- prefetch and advice ---------------------------------------------------------------------

/// A prefetch and its outcome, kept so that every `wait` (from any thread) reports it.
pub struct PrefetchJob {
    inner: Prefetch,
    outcome: Mutex<Option<Result<(), (u8, String)>>>,
}

fn start_prefetch(
    source: Source<'_>,
    at: &Path,
    requests: &RequestList,
    threads: usize,
    request_bytes: usize,
) -> Result<*mut PrefetchJob, Error> {
    let requests = requests.core(at)?;
    let options = PrefetchOptions {
        threads,
        request_bytes,
    };
    let inner = Plan::of(source, requests.as_deref())?.prefetch(options)?;
    Ok(handed_over(PrefetchJob {
        inner,
        outcome: Mutex::new(None),
    }))
}

pub fn prefetch_file(
    file: &File,
    requests: &RequestList,
    threads: usize,
    request_bytes: usize,
    status: &mut Status,
) -> *mut PrefetchJob {
    guard(status, || {
        let files = [file.shared()];
        let at = file.core().path();
        start_prefetch(Source::Files(&files), at, requests, threads, request_bytes)
    })
}

pub fn prefetch_checkpoint(
    ckpt: &Checkpoint,
    requests: &RequestList,
    threads: usize,
    request_bytes: usize,
    status: &mut Status,
) -> *mut PrefetchJob {
    guard(status, || {
        let at = ckpt.core().path();
        start_prefetch(
            Source::Checkpoint(ckpt.core()),
            at,
            requests,
            threads,
            request_bytes,
        )
    })
}

impl PrefetchJob {
    pub fn bytes_done(&self) -> u64 {
        self.inner.bytes_done()
    }

    pub fn total_bytes(&self) -> u64 {
        self.inner.total_bytes()
    }

    /// The core hands its error over once; this keeps it, as kind and message, for every
    /// later `wait`. Waiters beside the first wait for it on the lock.
    pub fn wait(&self, status: &mut Status) {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        let known = outcome.get_or_insert_with(|| {
            let mut first = Status::default();
            guard(&mut first, || self.inner.wait());
            match first.ok {
                true => Ok(()),
                false => Err((first.kind, first.message)),
            }
        });
        match known {
            Ok(()) => status.ok = true,
            Err((kind, message)) => {
                status.ok = false;
                status.kind = *kind;
                status.message = message.clone();
            }
        }
    }
}

pub fn advise_file(file: &File, requests: &RequestList, advice: u8, status: &mut Status) {
    guard(status, || {
        let core = file.core();
        let files = [file.shared()];
        let requests = requests.core(core.path())?;
        let plan = Plan::of(Source::Files(&files), requests.as_deref())?;
        let advice = match advice {
            0 => Advice::WillNeed,
            1 => Advice::Sequential,
            _ => Advice::Random,
        };
        safetensors_core::advise(core, &plan, advice)
    })
}

// ---- streams ---------------------------------------------------------------------------------

/// A stream of tensors for C++.
pub struct TensorStream {
    inner: safetensors_core::TensorStream,
}

/// One delivered tensor for C++; dropping it returns its bytes to the stream's budget.
pub struct StreamTensor {
    inner: safetensors_core::StreamTensor,
}

/// Calls C functions `void(void*)` given by address, with a token: what C++ asks each side of a
/// hand-over to do (the reader thread on giving, the consumer on taking).
struct Announce {
    give: extern "C" fn(*mut c_void),
    take: extern "C" fn(*mut c_void),
    token: usize,
}

/// Opens the stream, with the hand-over announced when C++ asks for it.
///
/// # Safety
/// `announce` and `receive` are both 0, or both the address of a C function taking one pointer,
/// callable from any thread for as long as the stream lives, and `token` is what they expect
/// (see `stream_file`).
unsafe fn open_stream(
    source: Source<'_>,
    at: &Path,
    requests: &RequestList,
    options: StreamOptions,
    (announce, receive, token): (usize, usize, usize),
) -> Result<*mut TensorStream, Error> {
    let requests = requests.core(at)?;
    let requests = requests.as_deref();
    let inner = if announce == 0 || receive == 0 {
        safetensors_core::TensorStream::open(source, requests, options)?
    } else {
        // SAFETY: the caller passes the addresses of such functions (see above).
        let a = unsafe {
            Announce {
                give: std::mem::transmute::<usize, extern "C" fn(*mut c_void)>(announce),
                take: std::mem::transmute::<usize, extern "C" fn(*mut c_void)>(receive),
                token,
            }
        };
        let handoff = move |h: HandOver| match h {
            HandOver::Given => (a.give)(a.token as *mut c_void),
            HandOver::Taken => (a.take)(a.token as *mut c_void),
        };
        safetensors_core::TensorStream::open_with_handoff(source, requests, options, handoff)?
    };
    Ok(handed_over(TensorStream { inner }))
}

fn stream_options(max_inflight_bytes: u64, wait_for_release: bool) -> StreamOptions {
    StreamOptions {
        max_inflight_bytes,
        wait_for_release,
    }
}

/// # Safety
/// See [`open_stream`]: `announce` and `receive` are 0 or C functions `void(void*)`. The C++
/// header passes, for both, a function that acquires and releases a ThreadSanitizer token (only
/// in programs built with it), and the address of that token, which outlives the stream.
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_file(
    file: &File,
    requests: &RequestList,
    max_inflight_bytes: u64,
    wait_for_release: bool,
    announce: usize,
    receive: usize,
    token: usize,
    status: &mut Status,
) -> *mut TensorStream {
    guard(status, || {
        let files = [file.shared()];
        let options = stream_options(max_inflight_bytes, wait_for_release);
        let at = file.core().path();
        // SAFETY: passed on from this function's own contract.
        unsafe {
            open_stream(
                Source::Files(&files),
                at,
                requests,
                options,
                (announce, receive, token),
            )
        }
    })
}

/// # Safety
/// As [`stream_file`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_checkpoint(
    ckpt: &Checkpoint,
    requests: &RequestList,
    max_inflight_bytes: u64,
    wait_for_release: bool,
    announce: usize,
    receive: usize,
    token: usize,
    status: &mut Status,
) -> *mut TensorStream {
    guard(status, || {
        let options = stream_options(max_inflight_bytes, wait_for_release);
        let source = Source::Checkpoint(ckpt.core());
        // SAFETY: passed on from this function's own contract.
        unsafe {
            open_stream(
                source,
                ckpt.core().path(),
                requests,
                options,
                (announce, receive, token),
            )
        }
    })
}

impl TensorStream {
    pub fn next_tensor(&mut self, status: &mut Status) -> *mut StreamTensor {
        guard(status, || match self.inner.next() {
            None => Ok(std::ptr::null_mut()),
            Some(Err(e)) => Err(e),
            Some(Ok(inner)) => Ok(handed_over(StreamTensor { inner })),
        })
    }

    pub fn tensor_count(&self) -> usize {
        self.inner.len()
    }

    pub fn total_bytes(&self) -> u64 {
        self.inner.total_bytes()
    }

    pub fn peak_inflight_bytes(&self) -> u64 {
        self.inner.peak_inflight_bytes()
    }

    pub fn inflight_bytes(&self) -> u64 {
        self.inner.inflight_bytes()
    }
}

impl StreamTensor {
    pub fn request(&self) -> usize {
        self.inner.request
    }

    pub fn file(&self) -> usize {
        self.inner.file
    }

    pub fn index(&self) -> usize {
        self.inner.index
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn dtype(&self) -> u8 {
        self.inner.dtype as u8
    }

    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    pub fn data(&self) -> &[u8] {
        self.inner.data()
    }

    pub fn path(&self) -> &[u8] {
        self.inner.path().as_os_str().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use safetensors_core::{serialize_to_file, Dtype, ErrorKind, TensorView};

    use super::*;
    use crate::status::{adopt, outcome};

    fn span(name: (usize, usize), slice: Option<(usize, usize)>) -> RequestSpan {
        RequestSpan {
            name_start: name.0,
            name_len: name.1,
            pinned: false,
            file: 0,
            sliced: slice.is_some(),
            slice_start: slice.map_or(0, |s| s.0),
            slice_len: slice.map_or(0, |s| s.1),
        }
    }

    fn sample(name: &str) -> (std::path::PathBuf, Box<File>) {
        let dir = std::env::temp_dir().join(format!("st-cxx-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.safetensors");
        let data = [7u8; 300];
        serialize_to_file(
            [("w", TensorView::new(Dtype::U8, &[300], &data))],
            None,
            &path,
        )
        .unwrap();
        let file =
            adopt(outcome(|s| crate::open_file(path.as_os_str().as_bytes(), 1, false, s)).unwrap());
        (dir, file)
    }

    #[test]
    fn spans_outside_their_buffers_are_internal_errors_not_panics() {
        let err = outcome(|s| new_request_list(false, &[span((2, 5), None)], b"abc", &[], s))
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Internal as u8, "{}", err.message);
        let err = outcome(|s| {
            new_request_list(false, &[span((0, 1), Some((usize::MAX, 2)))], b"w", &[], s)
        })
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Internal as u8, "{}", err.message);
    }

    #[test]
    fn a_name_that_is_not_utf8_is_not_found_in_the_file() {
        let (dir, file) = sample("not_utf8");
        let list = adopt(
            outcome(|s| new_request_list(false, &[span((0, 2), None)], b"w\xff", &[], s)).unwrap(),
        );
        let err = outcome(|s| prefetch_file(&file, &list, 1, 0, s)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::TensorNotFound as u8);
        assert!(err.message.contains("s.safetensors"), "{}", err.message);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_wait_reports_the_prefetch_error() {
        let (dir, file) = sample("every_wait");
        let all = adopt(outcome(|s| new_request_list(true, &[], &[], &[], s)).unwrap());
        std::fs::remove_file(dir.join("s.safetensors")).unwrap();
        let job = adopt(outcome(|s| prefetch_file(&file, &all, 2, 0, s)).unwrap());
        for _ in 0..3 {
            let err = outcome(|s| job.wait(s)).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Io as u8, "{}", err.message);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stream_delivers_and_then_ends() {
        let (dir, file) = sample("stream_ends");
        let all = adopt(outcome(|s| new_request_list(true, &[], &[], &[], s)).unwrap());
        // SAFETY: no announcement.
        let mut stream =
            adopt(outcome(|s| unsafe { stream_file(&file, &all, 1, false, 0, 0, 0, s) }).unwrap());
        let t = adopt(outcome(|s| stream.next_tensor(s)).unwrap());
        assert_eq!(
            (t.name(), t.data().len(), t.shape()),
            ("w", 300, &[300][..])
        );
        assert!(outcome(|s| stream.next_tensor(s)).unwrap().is_null());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
