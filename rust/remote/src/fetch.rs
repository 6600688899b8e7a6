//! Reading a remote object: the header in one or two ranged GETs, the version pinned, then
//! byte runs fetched with concurrent ranged GETs, every answer checked against what was asked.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use safetensors_core::{fallible, read_header_len, Error, Header, Result, SafeFile};

use crate::error::{changed, remote, store_error, NOT_PARTIAL};
use crate::location::{locate, Location};
use crate::options::RemoteOptions;
use crate::runtime;
use crate::transport::{Refused, ServerStatus};

/// A remote object whose header has been read and validated, and whose version is pinned.
pub struct Object {
    name: String,
    /// What the object is, for the cache: its URL without query or user information, and for
    /// `s3://` the endpoint (see `Location::identity`).
    identity: String,
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    options: RemoteOptions,
    pin: Pin,
    header: Header,
    trailing: u64,
    /// The object's first bytes: the length prefix, the header, and what the first read
    /// fetched beyond it.
    head: Vec<u8>,
    /// When [`RemoteOptions::deadline`] runs out: it bounds the header reads and the data
    /// fetch together, counted from the start of [`Object::open`].
    deadline_at: Option<Instant>,
}

/// Bytes past the header a file read on demand keeps from its first read.
pub(crate) const KEPT_PAST_HEADER: usize = 64 << 10;

/// The version every GET after the first must find: the ETag when the server gives one, else
/// the modification time; and the length.
///
/// A weak ETag (`W/"..."`) promises equivalent content, not identical bytes, and `If-Match`
/// compares strongly (RFC 9110, 13.1.1), so a conforming server answers 412 to every GET
/// conditional on one. With a weak tag the GETs are conditional on the modification time
/// instead, and every answer's tag must still be the pinned one by weak comparison (8.8.3.2:
/// the same opaque tag, either of them weak or not).
#[derive(Clone)]
pub(crate) struct Pin {
    meta: ObjectMeta,
}

impl Pin {
    /// Conditions for a GET of `range`: `If-Match` the ETag, or `If-Unmodified-Since` the
    /// modification time when there is no ETag (and neither when the server gave neither: then
    /// only the length is checked, see docs/remote.md).
    fn get_options(&self, range: Range<u64>) -> GetOptions {
        let since = self.meta.last_modified;
        let strong = self.meta.e_tag.as_deref().filter(|t| !is_weak(t));
        GetOptions {
            range: Some(GetRange::Bounded(range)),
            if_match: strong.map(str::to_owned),
            if_unmodified_since: (strong.is_none() && since.timestamp() != 0).then_some(since),
            ..GetOptions::default()
        }
    }

    /// Whether an answer is about the pinned version.
    fn check(&self, name: &str, got: &ObjectMeta) -> Result<()> {
        if got.e_tag.as_deref().map(opaque_tag) != self.meta.e_tag.as_deref().map(opaque_tag) {
            return Err(changed(
                name,
                &format!(
                    "its ETag was {} and is now {}",
                    etag_text(&self.meta.e_tag),
                    etag_text(&got.e_tag)
                ),
            ));
        }
        if got.size != self.meta.size {
            return Err(changed(
                name,
                &format!("it had {} bytes and now has {}", self.meta.size, got.size),
            ));
        }
        let strong = self.meta.e_tag.as_deref().is_some_and(|t| !is_weak(t));
        if !strong && got.last_modified != self.meta.last_modified {
            return Err(changed(name, "its modification time differs"));
        }
        Ok(())
    }
}

/// Whether an entity tag is weak (`W/"..."`; the prefix is case-sensitive, RFC 9110 8.8.3).
fn is_weak(tag: &str) -> bool {
    tag.starts_with("W/")
}

/// An entity tag without its weakness prefix: what weak comparison compares.
fn opaque_tag(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

fn etag_text(e: &Option<String>) -> String {
    match e {
        Some(t) => format!("{:?}", t.chars().take(80).collect::<String>()),
        None => "absent".to_owned(),
    }
}

/// What one ranged GET needs, shared by the concurrent ones.
#[derive(Clone)]
pub(crate) struct Getter {
    pub(crate) name: Arc<str>,
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    /// Retries of one GET ([`RemoteOptions::max_retries`]).
    retries: usize,
}

/// How far a GET got: what its first answer said, and how many bytes of it arrived checked.
#[derive(Default)]
struct Progress {
    /// The first answer's metadata: the version every retry must find.
    meta: Option<ObjectMeta>,
    /// The end of the range the first answer holds (a speculative first read is clamped to the
    /// object's end).
    end: Option<u64>,
    /// Bytes written into the destination, each inside an answer checked as a whole.
    bytes: usize,
}

impl Getter {
    pub(crate) fn new(location: &Location, options: &RemoteOptions) -> Getter {
        Getter {
            name: location.name.clone().into(),
            store: location.store.clone(),
            path: location.path.clone(),
            retries: options.max_retries,
        }
    }

    /// Fetches `range` of the object into `dst` (exactly `range`'s length), checking the
    /// answer against `pin` (when there is one yet). Returns the answer's metadata.
    ///
    /// A failure worth another try (a broken connection or body, a timeout, a busy or failing
    /// server: see [`retryable`]) is retried up to [`RemoteOptions::max_retries`] times, with
    /// backoff, for the bytes still missing: each retry is a new request, conditional on the
    /// version of the first answer, and its answer gets every check the first one got (status
    /// 206, `Content-Range` exactly the bytes asked, the version, the body's length). Nothing is
    /// taken from an answer that fails a check, and such an answer is not retried: a server
    /// that sends the wrong bytes once is not asked again.
    pub(crate) async fn get_into(
        &self,
        range: Range<u64>,
        pin: Option<&Pin>,
        dst: &mut [u8],
    ) -> Result<ObjectMeta> {
        let mut progress = Progress::default();
        let mut tries = 0usize;
        loop {
            let start = range.start + progress.bytes as u64;
            let end = progress.end.unwrap_or(range.end);
            let first = progress.meta.clone().map(|meta| Pin { meta });
            let now = pin.or(first.as_ref());
            if let (Some(meta), true) = (&progress.meta, start >= end) {
                return Ok(meta.clone());
            }
            let room = ((end - range.start) as usize).min(dst.len());
            let slot = &mut dst[progress.bytes..room];
            match self.attempt(start..end, now, slot, &mut progress).await {
                Ok(meta) => return Ok(meta),
                Err((e, again)) if again && tries < self.retries => {
                    tries += 1;
                    tokio::time::sleep(backoff(tries)).await;
                    drop(e);
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// One GET of `range` into `dst`, every check made on its answer; `progress` records what
    /// arrived. An error says whether another try may succeed.
    async fn attempt(
        &self,
        range: Range<u64>,
        pin: Option<&Pin>,
        dst: &mut [u8],
        progress: &mut Progress,
    ) -> std::result::Result<ObjectMeta, (Error, bool)> {
        let options = match pin {
            Some(p) => p.get_options(range.clone()),
            None => GetOptions {
                range: Some(GetRange::Bounded(range.clone())),
                ..GetOptions::default()
            },
        };
        let answer = match self.store.get_opts(&self.path, options).await {
            Ok(answer) => answer,
            Err(e) => {
                let again = retryable(&e);
                return Err((store_error(&self.name, "GET", e), again));
            }
        };
        if let Some(p) = pin {
            p.check(&self.name, &answer.meta).map_err(|e| (e, false))?;
        }
        let meta = answer.meta.clone();
        let got = answer.range.clone();
        // object_store checked the status (206) and that `Content-Range` is the range asked
        // (clamped to the object's end for the first, speculative read); the body is ours to
        // check: never more or fewer bytes than that range.
        let want = got.end.saturating_sub(got.start);
        if got.start != range.start || want > dst.len() as u64 {
            let what = format!("Content-Range says bytes {got:?}");
            return Err((self.wrong(&range, &what), false));
        }
        if progress.meta.is_none() {
            progress.meta = Some(meta.clone());
            progress.end = Some(got.end);
        }
        let mut at = 0usize;
        let mut body = answer.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    let again = retryable(&e);
                    return Err((store_error(&self.name, "GET", e), again));
                }
            };
            let Some(end) = at
                .checked_add(chunk.len())
                .filter(|&end| end as u64 <= want)
            else {
                let what = "the body is longer than its Content-Range (HTTP 206)";
                return Err((self.wrong(&range, what), false));
            };
            dst[at..end].copy_from_slice(&chunk);
            at = end;
            progress.bytes += chunk.len();
        }
        if (at as u64) != want {
            let what = format!("the body ended after {at} of {want} bytes (HTTP 206)");
            return Err((self.wrong(&range, &what), false));
        }
        Ok(meta)
    }

    fn wrong(&self, asked: &Range<u64>, what: &str) -> Error {
        remote(
            &self.name,
            "GET",
            io::ErrorKind::InvalidData,
            format!(
                "the server's answer to a GET of bytes {}..{} is wrong: {what}; nothing of it \
                 was used",
                asked.start, asked.end
            ),
        )
    }
}

impl Object {
    fn getter(&self) -> Getter {
        Getter {
            name: self.name.clone().into(),
            store: self.store.clone(),
            path: self.path.clone(),
            retries: self.options.max_retries,
        }
    }

    /// Reads and validates the header of the object at `url` and pins its version.
    pub fn open(url: &str, options: &RemoteOptions, allow_trailing_bytes: bool) -> Result<Object> {
        let options = options.sane();
        // A deadline too far to be an instant (`Duration::MAX` for "none") is none.
        let deadline_at = options.deadline.and_then(|d| Instant::now().checked_add(d));
        let location = locate(url, &options)?;
        let getter = Getter::new(&location, &options);
        let first = options.first_read as u64;
        let name = location.name.clone();
        let (pin, head) = runtime::run(&name, options.deadline, async move {
            let (meta, mut head) = first_read(&getter, first).await?;
            let pin = Pin { meta };
            let len = pin.meta.size;
            let n = read_header_len(&head, len)
                .map_err(|e| e.in_file(getter.name.as_ref().as_ref()))?;
            let needed = safetensors_core::LENGTH_PREFIX_SIZE as u64 + n as u64;
            let have = head.len() as u64;
            if needed > have {
                // `n` passed the length checks (at most the format's limit and inside the
                // object), so this allocation is bounded by them.
                fallible::reserve(&mut head, (needed - have) as usize, "a remote header")?;
                head.resize(needed as usize, 0);
                getter
                    .get_into(have..needed, Some(&pin), &mut head[have as usize..])
                    .await?;
            }
            Ok((pin, head))
        })?;
        let (header, trailing) =
            SafeFile::validate_header(&head, pin.meta.size, allow_trailing_bytes)
                .map_err(|e| e.in_file(name.as_ref()))?;
        Ok(Object {
            name: location.name,
            identity: location.identity,
            store: location.store,
            path: location.path,
            options,
            pin,
            header,
            trailing,
            head,
            deadline_at,
        })
    }

    /// The URL, as errors name it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes after the last tensor (0 unless allowed at open).
    pub fn trailing_bytes(&self) -> u64 {
        self.trailing
    }

    /// The object's length in bytes.
    pub fn len(&self) -> u64 {
        self.pin.meta.size
    }

    /// Whether the object is empty (never, once its header validated).
    pub fn is_empty(&self) -> bool {
        self.pin.meta.size == 0
    }

    /// The object's first bytes: its length prefix and header, and whatever else the first
    /// read fetched.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The whole object, fetched with concurrent ranged GETs of the pinned version (the bytes
    /// the header reads fetched are reused, not fetched again).
    pub fn fetch_all(self) -> Result<Vec<u8>> {
        let len = usize::try_from(self.len()).map_err(|_| {
            fallible::out_of_memory(&format!("the object {}", self.name), self.len())
        })?;
        let bytes = fallible::filled(len, 0u8, &format!("the object {}", self.name))?;
        self.fetch_into(bytes)
    }

    /// [`Object::fetch_all`] into `dst`, exactly as long as the object (memory, or a file
    /// being written into the cache), returned filled.
    pub(crate) fn fetch_into<B>(&self, mut dst: B) -> Result<B>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        let len = dst.as_mut().len();
        if len as u64 != self.len() {
            return Err(Error::Internal {
                message: format!(
                    "a buffer of {len} bytes for the {} bytes of {}",
                    self.len(),
                    self.name
                ),
            });
        }
        let have = self.head.len().min(len);
        dst.as_mut()[..have].copy_from_slice(&self.head[..have]);
        let rest: Range<u64> = have as u64..len as u64;
        let parts = parts(std::slice::from_ref(&rest), self.options.part_size as u64);
        let getter = self.getter();
        let pin = self.pin.clone();
        let concurrency = self.options.concurrency;
        let left = self
            .deadline_at
            .map(|at| at.saturating_duration_since(Instant::now()));
        runtime::run(&self.name, left, async move {
            fetch_parts(&getter, &pin, &parts, concurrency, dst.as_mut(), 0).await?;
            Ok(dst)
        })
    }

    /// The options the object was opened with (made sane).
    pub(crate) fn options(&self) -> &RemoteOptions {
        &self.options
    }

    /// What the object is, for the cache (see `Location::identity`).
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// The pinned version as one line of text, for the cache: the ETag and the modification
    /// time as the server gave them, and the length; `None` when the server gave neither an
    /// ETag nor a modification time (then nothing tells one version from another of the same
    /// length, and the object is not cached).
    pub(crate) fn version(&self) -> Option<String> {
        let meta = &self.pin.meta;
        let since = meta.last_modified.timestamp_nanos_opt().unwrap_or(0);
        if meta.e_tag.is_none() && since == 0 {
            return None;
        }
        Some(format!(
            "etag={:?} modified={since} length={}",
            meta.e_tag, meta.size
        ))
    }

    /// When the deadline of the open runs out, if it has one.
    pub(crate) fn deadline_at(&self) -> Option<Instant> {
        self.deadline_at
    }
}

impl Object {
    /// The object as a file whose tensor bytes are fetched when read ([`RemoteOptions::on_demand`]):
    /// the validated header, and a source that fetches the pinned version's byte runs.
    pub fn on_demand(self, options: safetensors_core::OpenOptions) -> Result<SafeFile> {
        let getter = self.getter();
        let len = self.len();
        let name = self.name.clone();
        let mut head = self.head;
        // The header's bytes, and at most KEPT_PAST_HEADER of what the first read fetched past
        // them: the first small tensors are served without a GET, and a checkpoint of hundreds
        // of shards opened on demand does not hold a whole first read (1 MiB by default) each.
        let header_end = read_header_len(&head, len)
            .map_or(head.len(), |n| safetensors_core::LENGTH_PREFIX_SIZE + n);
        head.truncate(header_end.saturating_add(KEPT_PAST_HEADER).min(head.len()));
        head.shrink_to_fit();
        let source = crate::on_demand::OnDemand::new(getter, self.pin, self.options, head);
        let head = source.head().to_vec();
        SafeFile::from_source(name, &head, len, Box::new(source), options)
    }
}

/// The whole of a small object (a checkpoint's index): one GET, refused when the object is
/// longer than `cap` bytes (before its body is read) and checked to be as long as it says. A
/// GET that fails before its answer is retried as a ranged GET would be; a body that breaks
/// off is completed by ranged GETs of the same version, with every check of [`Getter::get_into`].
pub fn fetch_small(url: &str, remote: &RemoteOptions, cap: u64, what: &str) -> Result<Vec<u8>> {
    let options = remote.sane();
    let location = locate(url, &options)?;
    let getter = Getter::new(&location, &options);
    let what = what.to_owned();
    runtime::run(&location.name, options.deadline, async move {
        let name = getter.name.clone();
        let mut tries = 0usize;
        let answer = loop {
            match getter
                .store
                .get_opts(&getter.path, GetOptions::default())
                .await
            {
                Ok(answer) => break answer,
                Err(e) if retryable(&e) && tries < getter.retries => {
                    tries += 1;
                    tokio::time::sleep(backoff(tries)).await;
                }
                Err(e) => return Err(store_error(&name, "GET", e)),
            }
        };
        let size = answer.meta.size;
        if size > cap {
            return Err(remote_error(
                &name,
                io::ErrorKind::InvalidData,
                format!("{what} is {size} bytes; the limit is {cap}"),
            ));
        }
        let pin = Pin {
            meta: answer.meta.clone(),
        };
        let mut out = Vec::new();
        fallible::reserve(&mut out, size as usize, &what)?;
        let mut body = answer.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) if retryable(&e) && getter.retries > 0 => {
                    // The rest, as ranged GETs of the version this answer is.
                    let have = out.len();
                    out.resize(size as usize, 0);
                    getter
                        .get_into(have as u64..size, Some(&pin), &mut out[have..])
                        .await?;
                    return Ok(out);
                }
                Err(e) => return Err(store_error(&name, "GET", e)),
            };
            if out.len() as u64 + chunk.len() as u64 > size {
                return Err(remote_error(
                    &name,
                    io::ErrorKind::InvalidData,
                    format!("the body is longer than the {size} bytes the server announced"),
                ));
            }
            out.extend_from_slice(&chunk);
        }
        if out.len() as u64 != size {
            return Err(remote_error(
                &name,
                io::ErrorKind::InvalidData,
                format!("the body ended after {} of {size} bytes", out.len()),
            ));
        }
        Ok(out)
    })
}

/// Whether a failed request may succeed if made again: a connection that could not be made or
/// broke (before or during the body), a timeout, or a server that said it is busy or failing
/// ([`ServerStatus`]). Never an answer that was wrong (a check failed), refused (403, 404, 412,
/// a refused redirect) or not what was asked (200 for a range).
pub(crate) fn retryable(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    if matches!(
        e,
        E::NotFound { .. }
            | E::Precondition { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::NotSupported { .. }
            | E::NotModified { .. }
    ) {
        return false;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<ServerStatus>() {
            return true;
        }
        if c.is::<Refused>() {
            return false;
        }
        if let Some(h) = c.downcast_ref::<HttpError>() {
            if matches!(
                h.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

/// The wait before retry `n` (from 1): 100 ms, doubling, at most 12.8 s.
pub(crate) fn backoff(n: usize) -> Duration {
    Duration::from_millis(100 << n.saturating_sub(1).min(7))
}

fn remote_error(name: &str, kind: io::ErrorKind, message: String) -> Error {
    remote(name, "GET", kind, message)
}

/// The first, speculative read: bytes `0..first` (fewer when the object is shorter). An empty
/// object has no such range: servers answer 416 (S3) or 200 with an empty body (nginx). Such an
/// answer, and only such, is followed by a HEAD: an object of 0 bytes then fails as an empty
/// local file does (`HeaderTooSmall`); anything else keeps the GET's error.
async fn first_read(getter: &Getter, first: u64) -> Result<(ObjectMeta, Vec<u8>)> {
    let mut head = fallible::filled(first as usize, 0u8, "a remote header's first read")?;
    match getter.get_into(0..first, None, &mut head).await {
        Ok(meta) => {
            head.truncate(meta.size.min(first) as usize);
            Ok((meta, head))
        }
        Err(e) if may_be_empty(&e) => match getter.store.head(&getter.path).await {
            Ok(meta) if meta.size == 0 => {
                Err(Error::HeaderTooSmall { len: 0 }.in_file(getter.name.as_ref().as_ref()))
            }
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// Whether a first read's error is what servers answer for a range of an empty object.
fn may_be_empty(e: &Error) -> bool {
    let text = e.to_string();
    text.contains(NOT_PARTIAL) || text.contains("416")
}

/// Fetches every part (ranges of the object, sorted and disjoint) into `dst`, which holds the
/// object's bytes from offset `base`, at most `concurrency` GETs at a time.
async fn fetch_parts(
    getter: &Getter,
    pin: &Pin,
    parts: &[Range<u64>],
    concurrency: usize,
    dst: &mut [u8],
    base: u64,
) -> Result<()> {
    // Split `dst` into one disjoint slice per part, so that the GETs fill them concurrently.
    let mut jobs = Vec::with_capacity(parts.len());
    let mut rest = dst;
    let mut at = base;
    for part in parts {
        let skip = usize::try_from(part.start - at).unwrap_or(usize::MAX);
        let len = usize::try_from(part.end - part.start).unwrap_or(usize::MAX);
        if skip > rest.len() || len > rest.len() - skip {
            return Err(Error::Internal {
                message: format!(
                    "a part {part:?} lies outside the buffer for {}",
                    getter.name
                ),
            });
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (mine, tail) = tail.split_at_mut(len);
        rest = tail;
        at = part.end;
        jobs.push((part.clone(), mine));
    }
    // The futures are made first and only then streamed: a closure making them inside the
    // stream would have to be general over the slices' lifetimes, which the spawned task's
    // `Send` bound cannot prove.
    let gets: Vec<_> = jobs
        .into_iter()
        .map(|(range, slot)| getter.get_into(range, Some(pin), slot))
        .collect();
    futures::stream::iter(gets)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<ObjectMeta>>()
        .await?;
    Ok(())
}

/// `runs` (sorted or not, possibly touching or overlapping) coalesced, then cut into parts of
/// at most `part_size` bytes: the GETs to make.
pub(crate) fn parts(runs: &[Range<u64>], part_size: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = runs.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    let step = part_size.max(1);
    let mut out = Vec::new();
    for r in merged {
        let mut start = r.start;
        while start < r.end {
            let end = start.saturating_add(step).min(r.end);
            out.push(start..end);
            start = end;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parts;
    use std::ops::Range;

    #[test]
    fn coalesces_touching_runs_and_cuts_parts() {
        assert_eq!(
            parts(&[0..4, 4..10, 12..13], 4),
            vec![0..4, 4..8, 8..10, 12..13]
        );
        assert_eq!(parts(&[5..9, 0..6], 100), vec![0..9]);
        let empty: Range<u64> = 3..3;
        assert_eq!(
            parts(std::slice::from_ref(&empty), 4),
            Vec::<Range<u64>>::new()
        );
        let all: Range<u64> = 0..u64::MAX;
        assert_eq!(
            parts(std::slice::from_ref(&all), u64::MAX),
            vec![all.clone()]
        );
    }
}
