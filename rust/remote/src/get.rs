//! Ranged GETs of one pinned version of an object: the pin every answer after the first must
//! match ([`Pin`]), one GET into a caller's slice with every answer checked and the missing
//! bytes retried ([`Getter`]), which failures are worth a retry, and the cutting of byte runs
//! into the GETs to make ([`parts`]). Used by whole reads (`fetch.rs`) and reads on demand
//! (`on_demand.rs`) alike.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use safetensors_core::{Error, Result};

use crate::error::{changed, remote, store_error};
use crate::location::Location;
use crate::options::RemoteOptions;
use crate::transport::{Refused, ServerStatus};

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
    pub(crate) meta: ObjectMeta,
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
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) path: ObjectPath,
    /// Retries of one GET ([`RemoteOptions::max_retries`]).
    pub(crate) retries: usize,
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

pub(crate) fn remote_error(name: &str, kind: io::ErrorKind, message: String) -> Error {
    remote(name, "GET", kind, message)
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
