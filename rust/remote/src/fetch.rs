//! Reading a remote object: the header in one or two ranged GETs, the version pinned, then
//! byte runs fetched with concurrent ranged GETs, every answer checked against what was asked.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use safetensors_core::{fallible, read_header_len, Error, Header, Result, SafeFile};

use crate::error::{changed, remote, store_error, NOT_PARTIAL};
use crate::location::locate;
use crate::options::RemoteOptions;
use crate::runtime;

/// A remote object whose header has been read and validated, and whose version is pinned.
pub struct Object {
    name: String,
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
}

impl Getter {
    /// Fetches `range` of the object into `dst` (exactly `range`'s length), checking the
    /// answer against `pin` (when there is one yet). Returns the answer's metadata.
    pub(crate) async fn get_into(
        &self,
        range: Range<u64>,
        pin: Option<&Pin>,
        dst: &mut [u8],
    ) -> Result<ObjectMeta> {
        let options = match pin {
            Some(p) => p.get_options(range.clone()),
            None => GetOptions {
                range: Some(GetRange::Bounded(range.clone())),
                ..GetOptions::default()
            },
        };
        let answer = self
            .store
            .get_opts(&self.path, options)
            .await
            .map_err(|e| store_error(&self.name, "GET", e))?;
        if let Some(p) = pin {
            p.check(&self.name, &answer.meta)?;
        }
        let meta = answer.meta.clone();
        let got = answer.range.clone();
        // object_store checked the status (206) and that `Content-Range` is the range asked
        // (clamped to the object's end for the first, speculative read); the body is ours to
        // check: never more or fewer bytes than that range.
        let want = got.end.saturating_sub(got.start);
        if got.start != range.start || want > dst.len() as u64 {
            return Err(self.wrong(&range, &format!("Content-Range says bytes {got:?}")));
        }
        let mut at = 0usize;
        let mut body = answer.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| store_error(&self.name, "GET", e))?;
            let end = at
                .checked_add(chunk.len())
                .filter(|&end| end as u64 <= want)
                .ok_or_else(|| {
                    self.wrong(
                        &range,
                        "the body is longer than its Content-Range (HTTP 206)",
                    )
                })?;
            dst[at..end].copy_from_slice(&chunk);
            at = end;
        }
        if (at as u64) != want {
            return Err(self.wrong(
                &range,
                &format!("the body ended after {at} of {want} bytes (HTTP 206)"),
            ));
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
    /// Reads and validates the header of the object at `url` and pins its version.
    pub fn open(url: &str, options: &RemoteOptions, allow_trailing_bytes: bool) -> Result<Object> {
        let options = options.sane();
        // A deadline too far to be an instant (`Duration::MAX` for "none") is none.
        let deadline_at = options.deadline.and_then(|d| Instant::now().checked_add(d));
        let location = locate(url, &options)?;
        let getter = Getter {
            name: location.name.clone().into(),
            store: location.store.clone(),
            path: location.path.clone(),
        };
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
        let mut bytes = fallible::filled(len, 0u8, &format!("the object {}", self.name))?;
        let have = self.head.len().min(len);
        bytes[..have].copy_from_slice(&self.head[..have]);
        let rest: Range<u64> = have as u64..len as u64;
        let parts = parts(std::slice::from_ref(&rest), self.options.part_size as u64);
        let getter = Getter {
            name: self.name.clone().into(),
            store: self.store.clone(),
            path: self.path.clone(),
        };
        let pin = self.pin.clone();
        let concurrency = self.options.concurrency;
        let left = self
            .deadline_at
            .map(|at| at.saturating_duration_since(Instant::now()));
        runtime::run(&self.name, left, async move {
            fetch_parts(&getter, &pin, &parts, concurrency, &mut bytes, 0).await?;
            Ok(bytes)
        })
    }
}

impl Object {
    /// The object as a file whose tensor bytes are fetched when read ([`RemoteOptions::on_demand`]):
    /// the validated header, and a source that fetches the pinned version's byte runs.
    pub fn on_demand(self, options: safetensors_core::OpenOptions) -> Result<SafeFile> {
        let getter = Getter {
            name: self.name.clone().into(),
            store: self.store.clone(),
            path: self.path.clone(),
        };
        let len = self.len();
        let name = self.name.clone();
        let source = crate::on_demand::OnDemand::new(getter, self.pin, self.options, self.head);
        let head = source.head().to_vec();
        SafeFile::from_source(name, &head, len, Box::new(source), options)
    }
}

/// The whole of a small object (a checkpoint's index): one GET, refused when the object is
/// longer than `cap` bytes (before its body is read) and checked to be as long as it says.
pub fn fetch_small(url: &str, remote: &RemoteOptions, cap: u64, what: &str) -> Result<Vec<u8>> {
    let options = remote.sane();
    let location = locate(url, &options)?;
    let name: Arc<str> = location.name.clone().into();
    let what = what.to_owned();
    runtime::run(&location.name.clone(), options.deadline, async move {
        let answer = location
            .store
            .get_opts(&location.path, GetOptions::default())
            .await
            .map_err(|e| store_error(&name, "GET", e))?;
        let size = answer.meta.size;
        if size > cap {
            return Err(remote_error(
                &name,
                io::ErrorKind::InvalidData,
                format!("{what} is {size} bytes; the limit is {cap}"),
            ));
        }
        let mut out = Vec::new();
        fallible::reserve(&mut out, size as usize, &what)?;
        let mut body = answer.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| store_error(&name, "GET", e))?;
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
