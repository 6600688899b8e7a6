//! Reading a remote object: the header in one or two ranged GETs, the version pinned, then
//! byte runs fetched with concurrent ranged GETs, every answer checked against what was asked.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectMeta, ObjectStore};
use safetensors_core::{fallible, read_header_len, Error, Header, Result, SafeFile};

use crate::error::{store_error, NOT_PARTIAL};
use crate::get::{backoff, parts, remote_error, retryable, Getter, Pin};
use crate::location::locate;
use crate::options::RemoteOptions;
use crate::runtime;

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
