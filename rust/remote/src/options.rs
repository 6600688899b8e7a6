//! How remote objects are read: concurrency, part size, timeouts, retries and the deadline.

use std::path::PathBuf;
use std::time::Duration;

/// The smallest part one GET asks for. A read keeps some bookkeeping for each of its parts (its
/// range, and for a whole object's fetch a pending request), and each part is a round trip:
/// parts of a few bytes would make a read of a large tensor millions of requests and hold
/// many times its size in bookkeeping.
pub const MIN_PART_SIZE: usize = 4096;

/// The default of [`RemoteOptions::cache_limit`]: 128 GiB.
pub const DEFAULT_CACHE_LIMIT: u64 = 128 << 30;

/// Options for [`crate::open`]. The defaults suit a model on S3 or a CDN from a machine with a
/// fast link; docs/remote.md says when to change them.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteOptions {
    /// Ranged GETs in flight at once (at least 1). Default 16.
    pub concurrency: usize,
    /// Bytes one GET asks for (adjacent byte runs are coalesced, then cut into parts of this
    /// size); less than [`MIN_PART_SIZE`] counts as that. Default 8 MiB.
    pub part_size: usize,
    /// Bytes the first GET asks for: the 8-byte length prefix and, speculatively, the header
    /// and the first tensors. A header longer than this costs a second GET. Default 1 MiB.
    pub first_read: usize,
    /// Longest one request may take, body included, before it is retried. Default 30 s.
    pub request_timeout: Duration,
    /// Longest a connection may take to open. Default 5 s.
    pub connect_timeout: Duration,
    /// Retries of a failed request (connection errors, timeouts, 5xx, 429), with exponential
    /// backoff from 100 ms. Default 3.
    pub max_retries: usize,
    /// Longest the whole operation (an open: header and data, counted from its start; with
    /// [`RemoteOptions::on_demand`], the open and then each read on its own) may take;
    /// `None` for no limit beyond each request's timeout and retries. Default `None`.
    pub deadline: Option<Duration>,
    /// Fetch and validate the header only: tensors can be listed and described, and every
    /// read of their bytes is an `Io` error saying so. For tools that describe a file
    /// (`safetensors inspect`). Default false.
    pub header_only: bool,
    /// Fetch tensor bytes when they are read rather than the whole object at open: the open
    /// fetches the header only, and each read (a tensor, a slice's byte runs, a stream's or an
    /// upload's pieces) fetches exactly its bytes with concurrent ranged GETs of the pinned
    /// version. Memory is what the reads ask for, not the object's size. Default false (the
    /// whole object is fetched at open and held in memory).
    pub on_demand: bool,
    /// A local cache of whole remote files: the directory, or an empty path for the user's
    /// cache directory ([`crate::default_cache_dir`]); `None` (the default) for no cache. A file
    /// fetched whole is written there (atomically, under a name made from its URL without
    /// query or user information, and its version) and mapped; a later open of the same URL
    /// and version maps that copy after one ranged GET that checks the version. An on-demand
    /// open maps a copy the cache holds, but fetches nothing into it; a header-only open never
    /// touches it. docs/remote.md says more.
    pub cache: Option<PathBuf>,
    /// Bytes the cache may hold: after a file is added, the least recently used ones are
    /// removed until the rest fit; a file larger than this is not cached. Default
    /// [`DEFAULT_CACHE_LIMIT`].
    pub cache_limit: u64,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            concurrency: 16,
            part_size: 8 << 20,
            first_read: 1 << 20,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_retries: 3,
            deadline: None,
            header_only: false,
            on_demand: false,
            cache: None,
            cache_limit: DEFAULT_CACHE_LIMIT,
        }
    }
}

#[cfg(feature = "store")]
impl RemoteOptions {
    /// The options with every count at least 1, parts of at least [`MIN_PART_SIZE`], and a
    /// first read that holds the length prefix.
    pub(crate) fn sane(&self) -> RemoteOptions {
        RemoteOptions {
            concurrency: self.concurrency.max(1),
            part_size: self.part_size.max(MIN_PART_SIZE),
            first_read: self.first_read.max(safetensors_core::LENGTH_PREFIX_SIZE),
            ..self.clone()
        }
    }
}

/// [`RemoteOptions`] as the C and C++ bindings carry them: durations in whole milliseconds, and
/// a deadline of 0 for none, a cache limit of 0 for the default. Both bindings convert through
/// this one type, so that they read the same fields the same way (all but the cache's
/// directory, which they set on the result).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MillisOptions {
    /// [`RemoteOptions::concurrency`].
    pub concurrency: usize,
    /// [`RemoteOptions::part_size`].
    pub part_size: usize,
    /// [`RemoteOptions::first_read`].
    pub first_read: usize,
    /// [`RemoteOptions::request_timeout`] in milliseconds.
    pub request_timeout_ms: u64,
    /// [`RemoteOptions::connect_timeout`] in milliseconds.
    pub connect_timeout_ms: u64,
    /// [`RemoteOptions::max_retries`].
    pub max_retries: usize,
    /// [`RemoteOptions::deadline`] in milliseconds; 0 for none.
    pub deadline_ms: u64,
    /// [`RemoteOptions::header_only`].
    pub header_only: bool,
    /// [`RemoteOptions::on_demand`].
    pub on_demand: bool,
    /// [`RemoteOptions::cache_limit`]; 0 for the default ([`DEFAULT_CACHE_LIMIT`]).
    pub cache_limit: u64,
}

impl From<MillisOptions> for RemoteOptions {
    fn from(o: MillisOptions) -> Self {
        RemoteOptions {
            concurrency: o.concurrency,
            part_size: o.part_size,
            first_read: o.first_read,
            request_timeout: Duration::from_millis(o.request_timeout_ms),
            connect_timeout: Duration::from_millis(o.connect_timeout_ms),
            max_retries: o.max_retries,
            deadline: (o.deadline_ms != 0).then(|| Duration::from_millis(o.deadline_ms)),
            header_only: o.header_only,
            on_demand: o.on_demand,
            cache_limit: match o.cache_limit {
                0 => DEFAULT_CACHE_LIMIT,
                n => n,
            },
            ..RemoteOptions::default()
        }
    }
}

impl From<&RemoteOptions> for MillisOptions {
    /// Durations rounded down to whole milliseconds (saturating); a deadline shorter than one
    /// millisecond becomes one, since 0 means none; likewise a cache limit of 0 (nothing
    /// cached) becomes 1 byte, since 0 means the default.
    fn from(o: &RemoteOptions) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        MillisOptions {
            concurrency: o.concurrency,
            part_size: o.part_size,
            first_read: o.first_read,
            request_timeout_ms: ms(o.request_timeout),
            connect_timeout_ms: ms(o.connect_timeout),
            max_retries: o.max_retries,
            deadline_ms: o.deadline.map_or(0, |d| ms(d).max(1)),
            header_only: o.header_only,
            on_demand: o.on_demand,
            cache_limit: o.cache_limit.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millisecond_options_convert_both_ways() {
        let d = RemoteOptions::default();
        let m = MillisOptions::from(&d);
        assert_eq!(
            (m.request_timeout_ms, m.connect_timeout_ms, m.deadline_ms),
            (30_000, 5_000, 0)
        );
        assert_eq!(RemoteOptions::from(m), d);
        let with = RemoteOptions {
            deadline: Some(Duration::from_millis(1500)),
            on_demand: true,
            ..d.clone()
        };
        let m = MillisOptions::from(&with);
        assert_eq!(m.deadline_ms, 1500);
        assert_eq!(RemoteOptions::from(m), with);
        // 0 means no deadline, so the shortest deadline is one millisecond, never none.
        let tiny = RemoteOptions {
            deadline: Some(Duration::from_micros(10)),
            ..d.clone()
        };
        assert_eq!(MillisOptions::from(&tiny).deadline_ms, 1);
        let huge = RemoteOptions {
            deadline: Some(Duration::MAX),
            ..d.clone()
        };
        assert_eq!(MillisOptions::from(&huge).deadline_ms, u64::MAX);
        // A cache limit of 0 is the default to the bindings; Rust's 0 (cache nothing) crosses
        // as 1 byte, which caches nothing either.
        assert_eq!(m.cache_limit, DEFAULT_CACHE_LIMIT);
        let zero = MillisOptions {
            cache_limit: 0,
            ..m
        };
        assert_eq!(RemoteOptions::from(zero).cache_limit, DEFAULT_CACHE_LIMIT);
        let none = RemoteOptions {
            cache_limit: 0,
            ..d
        };
        assert_eq!(MillisOptions::from(&none).cache_limit, 1);
    }
}
