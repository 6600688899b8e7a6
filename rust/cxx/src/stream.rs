//! Cold reads as C++ asks for them: what to read from (a `Source`: one file, or a checkpoint's
//! shards), what to read (a `RequestList`, the same for prefetch, streams and uploads), prefetch
//! and advice, and host streams of tensors delivered in file order.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use safetensors_core::{
    Error, Indexer, Plan, Prefetch, PrefetchOptions, Request, SafeFile, StreamOptions,
};

use crate::checkpoint::Checkpoint;
use crate::file::{indexers, File};
use crate::status::handed_over;
use crate::status::{guard, part, Status};
use ffi::{Advice, RequestSpan, SliceIndex};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        include!("safetensors/ffi/src/file.rs.h");
        include!("safetensors/ffi/src/checkpoint.rs.h");
        type Status = crate::status::ffi::Status;
        type SliceIndex = crate::file::ffi::SliceIndex;
        type File = crate::file::File;
        type Checkpoint = crate::checkpoint::Checkpoint;
    }

    /// An access-pattern hint for a mapped file (`madvise`): `safetensors::Advice`'s values.
    #[derive(Debug)]
    #[repr(u8)]
    enum Advice {
        WillNeed = 0,
        Sequential = 1,
        Random = 2,
    }

    /// One request of a prefetch, a piece of advice or a stream, in the buffers that cross with
    /// it (every request of a call crosses at once): the tensor's name is bytes
    /// `[name_start, name_start + name_len)` of the names; when `sliced`, its slice is indices
    /// `[slice_start, slice_start + slice_len)`; when `pinned`, it must come from file (shard)
    /// `file`.
    #[derive(Debug, Clone, Copy)]
    struct RequestSpan {
        name_start: usize,
        name_len: usize,
        pinned: bool,
        file: usize,
        sliced: bool,
        slice_start: usize,
        slice_len: usize,
    }

    extern "Rust" {
        /// What a prefetch, a stream or an upload reads from: one file, or a checkpoint's
        /// shards. Made for one call; it holds the file (or the checkpoint) it names.
        #[derive(ExternType)]
        type Source;
        /// One file.
        fn source_of_file(file: &File) -> Box<Source>;
        /// A checkpoint's shards, numbered as the checkpoint numbers them.
        fn source_of_checkpoint(ckpt: &Checkpoint) -> Box<Source>;

        /// What a prefetch, advice, stream or upload reads: every tensor, or requests.
        #[derive(ExternType)]
        type RequestList;
        /// Every tensor (`all`), or the requests `spans` describe. Null on failure.
        fn new_request_list(
            all: bool,
            spans: &[RequestSpan],
            names: &[u8],
            indices: &[SliceIndex],
            status: &mut Status,
        ) -> *mut RequestList;

        /// A prefetch in progress; dropping it cancels what has not started.
        type PrefetchJob;
        /// Starts warming `requests` of `source` with `threads` threads and requests of
        /// `request_bytes`. Null on failure.
        fn prefetch(
            source: &Source,
            requests: &RequestList,
            threads: usize,
            request_bytes: usize,
            status: &mut Status,
        ) -> *mut PrefetchJob;
        /// Bytes warmed so far.
        fn bytes_done(self: &PrefetchJob) -> u64;
        /// Bytes the prefetch covers.
        fn total_bytes(self: &PrefetchJob) -> u64;
        /// Waits for the end; the first error, every time it is asked (from any thread).
        fn wait(self: &PrefetchJob, status: &mut Status);

        /// `advice` for `requests` of `source`'s mapped files; nothing for the other backends.
        fn advise(source: &Source, requests: &RequestList, advice: Advice, status: &mut Status);

        /// Tensors delivered in file order with bounded buffers.
        type TensorStream;
        /// Streams `requests` of `source` (the core announces each hand-over of a read tensor
        /// to a ThreadSanitizer build of the program itself). Null on failure.
        fn stream(
            source: &Source,
            requests: &RequestList,
            max_inflight_bytes: u64,
            wait_for_release: bool,
            status: &mut Status,
        ) -> *mut TensorStream;
        /// The next tensor; null at the end (status ok) or on the error that ends the stream.
        fn next_tensor(self: &mut TensorStream, status: &mut Status) -> *mut StreamTensor;
        /// Tensors (or slices) the stream delivers in all.
        fn tensor_count(self: &TensorStream) -> usize;
        /// Bytes the stream delivers in all.
        fn total_bytes(self: &TensorStream) -> u64;
        /// The most bytes alive at once so far (instrumentation).
        fn peak_inflight_bytes(self: &TensorStream) -> u64;
        /// Bytes alive now.
        fn inflight_bytes(self: &TensorStream) -> u64;

        /// One delivered tensor; owns its bytes, returned to the budget when dropped.
        type StreamTensor;
        /// Position in the request list (for every tensor: in delivery order).
        fn request(self: &StreamTensor) -> usize;
        /// The file (shard) it came from, in the source's numbering.
        fn file(self: &StreamTensor) -> usize;
        /// Its position in that file, in offset order.
        fn index(self: &StreamTensor) -> usize;
        fn name(self: &StreamTensor) -> &str;
        /// Dtype index.
        fn dtype(self: &StreamTensor) -> u8;
        /// Shape of what was delivered (the slice's for a slice).
        fn shape(self: &StreamTensor) -> &[usize];
        fn data(self: &StreamTensor) -> &[u8];
        /// Path of the file it came from (raw bytes).
        fn path(self: &StreamTensor) -> &[u8];

    }

    impl Box<Source> {}
    impl Box<RequestList> {}
    impl Box<PrefetchJob> {}
    impl Box<TensorStream> {}
    impl Box<StreamTensor> {}
}

// ---- what to read from -------------------------------------------------------------------------

/// One file or a checkpoint, held for the call it is made for.
pub struct Source {
    from: From,
}

enum From {
    File(Arc<SafeFile>),
    Checkpoint(Arc<safetensors_core::Checkpoint>),
}

pub fn source_of_file(file: &File) -> Box<Source> {
    Box::new(Source {
        from: From::File(file.shared()),
    })
}

pub fn source_of_checkpoint(ckpt: &Checkpoint) -> Box<Source> {
    Box::new(Source {
        from: From::Checkpoint(ckpt.shared()),
    })
}

impl Source {
    /// Runs `f` with the core's view of this source.
    pub(crate) fn with<T>(&self, f: impl FnOnce(safetensors_core::Source<'_>) -> T) -> T {
        match &self.from {
            From::File(file) => f(safetensors_core::Source::Files(std::slice::from_ref(file))),
            From::Checkpoint(c) => f(safetensors_core::Source::Checkpoint(c)),
        }
    }

    /// The path errors about the whole source name: the file, or the checkpoint's index.
    pub(crate) fn path(&self) -> &Path {
        match &self.from {
            From::File(file) => file.path(),
            From::Checkpoint(c) => c.path(),
        }
    }

    /// Runs `f` on each file of the source that is open: the file, or the checkpoint's shards
    /// opened so far (a plan of the source opens those its requests touch).
    pub(crate) fn each_file(
        &self,
        mut f: impl FnMut(&SafeFile) -> Result<(), Error>,
    ) -> Result<(), Error> {
        match &self.from {
            From::File(file) => f(file),
            From::Checkpoint(c) => (0..c.shard_count())
                .filter(|&i| c.shard_is_open(i))
                .try_for_each(|i| f(c.shard(i)?)),
        }
    }
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
                    true => Some(indexers(part(indices, s.slice_start, s.slice_len)?)?),
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

impl RequestList {
    /// The core's requests (`None`: every tensor). A name that is not UTF-8 is `TensorNotFound`
    /// in `at` (a lossy conversion could name another tensor).
    pub(crate) fn core(&self, at: &Path) -> Result<Option<Vec<Request>>, Error> {
        if self.all {
            return Ok(None);
        }
        let requests = self
            .wanted
            .iter()
            .map(|w| {
                let name = safetensors_core::name_to_find(&w.name, at)?;
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

// ---- prefetch and advice ---------------------------------------------------------------------

/// A prefetch; its `wait` reports the same outcome to every caller (the core keeps it).
pub struct PrefetchJob {
    inner: Prefetch,
}

pub fn prefetch(
    source: &Source,
    requests: &RequestList,
    threads: usize,
    request_bytes: usize,
    status: &mut Status,
) -> *mut PrefetchJob {
    guard(status, || {
        let requests = requests.core(source.path())?;
        let options = PrefetchOptions {
            threads,
            request_bytes,
        };
        let plan = source.with(|s| Plan::of(s, requests.as_deref()))?;
        let inner = plan.prefetch(options)?;
        Ok(handed_over(PrefetchJob { inner }))
    })
}

impl PrefetchJob {
    pub fn bytes_done(&self) -> u64 {
        self.inner.bytes_done()
    }

    pub fn total_bytes(&self) -> u64 {
        self.inner.total_bytes()
    }

    pub fn wait(&self, status: &mut Status) {
        guard(status, || self.inner.wait())
    }
}

pub fn advise(source: &Source, requests: &RequestList, advice: Advice, status: &mut Status) {
    guard(status, || {
        let advice = match advice {
            Advice::WillNeed => safetensors_core::Advice::WillNeed,
            Advice::Sequential => safetensors_core::Advice::Sequential,
            Advice::Random => safetensors_core::Advice::Random,
            Advice { repr } => {
                return Err(Error::InvalidSlice {
                    tensor: String::new(),
                    reason: format!(
                        "advice value {repr} is not WillNeed (0), Sequential (1) or Random (2)"
                    ),
                })
            }
        };
        let requests = requests.core(source.path())?;
        let plan = source.with(|s| Plan::of(s, requests.as_deref()))?;
        source.each_file(|file| safetensors_core::advise(file, &plan, advice))
    })
}

// ---- streams -----------------------------------------------------------------------------------

/// The stream C++ iterates.
pub struct TensorStream {
    inner: safetensors_core::TensorStream,
}

/// One delivered tensor, owning its bytes.
pub struct StreamTensor {
    inner: safetensors_core::StreamTensor,
}

/// Streams `requests` of `source`.
pub fn stream(
    source: &Source,
    requests: &RequestList,
    max_inflight_bytes: u64,
    wait_for_release: bool,
    status: &mut Status,
) -> *mut TensorStream {
    guard(status, || {
        let options = StreamOptions {
            max_inflight_bytes,
            wait_for_release,
        };
        let requests = requests.core(source.path())?;
        let requests = requests.as_deref();
        let inner = source.with(|s| safetensors_core::TensorStream::open(s, requests, options))?;
        Ok(handed_over(TensorStream { inner }))
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
        let file = adopt(
            outcome(|s| {
                crate::file::open_file(
                    crate::status::Bytes::of(path.as_os_str().as_bytes()),
                    crate::file::ffi::Backend::Read,
                    false,
                    crate::file::ffi::Populate::Lazy,
                    false,
                    s,
                )
            })
            .unwrap(),
        );
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
        let err = outcome(|s| prefetch(&source_of_file(&file), &list, 1, 0, s)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::TensorNotFound as u8);
        assert!(err.message.contains("s.safetensors"), "{}", err.message);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_wait_reports_the_prefetch_error() {
        let (dir, file) = sample("every_wait");
        let all = adopt(outcome(|s| new_request_list(true, &[], &[], &[], s)).unwrap());
        std::fs::remove_file(dir.join("s.safetensors")).unwrap();
        let job = adopt(outcome(|s| prefetch(&source_of_file(&file), &all, 2, 0, s)).unwrap());
        for _ in 0..3 {
            let err = outcome(|s| job.wait(s)).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Io as u8, "{}", err.message);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn advice_that_names_none_is_an_error_not_a_guess() {
        let (dir, file) = sample("advice_code");
        let all = adopt(outcome(|s| new_request_list(true, &[], &[], &[], s)).unwrap());
        let err =
            outcome(|s| advise(&source_of_file(&file), &all, Advice { repr: 9 }, s)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidSlice as u8, "{}", err.message);
        assert!(err.message.contains("advice value 9"), "{}", err.message);
        outcome(|s| advise(&source_of_file(&file), &all, Advice::Sequential, s)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stream_delivers_and_then_ends() {
        let (dir, file) = sample("stream_ends");
        let all = adopt(outcome(|s| new_request_list(true, &[], &[], &[], s)).unwrap());
        let mut stream =
            adopt(outcome(|s| stream(&source_of_file(&file), &all, 1, false, s)).unwrap());
        let t = adopt(outcome(|s| stream.next_tensor(s)).unwrap());
        assert_eq!(
            (t.name(), t.data().len(), t.shape()),
            ("w", 300, &[300][..])
        );
        assert!(outcome(|s| stream.next_tensor(s)).unwrap().is_null());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
