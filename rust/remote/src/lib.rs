//! Remote safetensors files: `s3://bucket/key` on any S3-compatible store and `http://` or
//! `https://` URLs, opened as a [`SafeFile`] in memory filled by concurrent ranged GETs.
//!
//! Apache Arrow's `object_store` crate speaks the protocols (S3 signing, credentials from the
//! environment, retries with backoff); this crate decides what is fetched and checks every
//! answer. It runs on one small runtime of its own ([`runtime`]), never the caller's.
//!
//! What opening does ([`open`]):
//! 1. one ranged GET of the object's first bytes ([`RemoteOptions::first_read`], 1 MiB by
//!    default), which holds most headers whole, and a second ranged GET only when the header is
//!    longer; the header is validated with every rule a local file gets, against the object's
//!    length, before any data is fetched or allocated;
//! 2. the object's version is pinned: its ETag (or, without one, its modification time) from
//!    that first answer; every later GET is conditional on it (`If-Match`), and every answer is
//!    checked against it, so an object replaced while being read is an `Io` error naming the
//!    URL, never bytes of two versions;
//! 3. the rest of the object is fetched with concurrent ranged GETs ([`RemoteOptions::concurrency`]
//!    at a time, [`RemoteOptions::part_size`] each), each answer's status, `Content-Range` and
//!    body length checked against what was asked;
//! 4. the bytes become a file in memory ([`SafeFile::from_memory`]), validated again, so that
//!    everything that works on a file in memory works on a remote one.
//!
//! Every failure is an [`Error::Io`] naming the URL (without its credentials: URLs that carry
//! any are refused, see [`location`]). docs/remote.md is the user's page.
//!
//! ```no_run
//! use safetensors_core::OpenOptions;
//! use safetensors_remote::{open, RemoteOptions};
//! let file = open("s3://models/gpt2/model.safetensors", &RemoteOptions::default(),
//!                 OpenOptions::default())?;
//! let bytes = file.tensor_bytes("wte.weight")?;
//! # Ok::<(), safetensors_core::Error>(())
//! ```
//!
//! Without the `store` feature (a build configured with `-DSAFETENSORS_REMOTE=OFF`) the crate
//! has the same entry points, the options included, and every open is an `Io` error naming
//! the URL and saying that this build cannot open remote files ([`BUILT`] is false): the
//! bindings call it the same way in every build.
#![deny(missing_docs)]

#[cfg(feature = "store")]
mod cache;
#[cfg(feature = "store")]
mod credential_process;
#[cfg(feature = "store")]
mod error;
#[cfg(feature = "store")]
mod fetch;
#[cfg(feature = "store")]
mod get;
#[cfg(feature = "store")]
mod location;
#[cfg(not(feature = "store"))]
mod not_built;
#[cfg(feature = "store")]
mod on_demand;
mod options;
#[cfg(feature = "store")]
mod process;
#[cfg(feature = "store")]
mod profile;
#[cfg(feature = "store")]
pub mod runtime;
#[cfg(feature = "store")]
mod secrets;
#[cfg(feature = "store")]
mod transport;

#[cfg(feature = "store")]
use safetensors_core::{
    Checkpoint, CheckpointOptions, OpenOptions, Result, SafeFile, ShardOpener, MAX_INDEX_SIZE,
};

#[cfg(feature = "store")]
pub use cache::default_cache_dir;
#[cfg(feature = "store")]
pub use fetch::Object;
#[cfg(not(feature = "store"))]
pub use not_built::{open, open_checkpoint};
pub use options::{MillisOptions, RemoteOptions, DEFAULT_CACHE_LIMIT, MIN_PART_SIZE};
pub use safetensors_core::is_url;

/// Whether this build opens remote files (the `store` feature; CMake's `SAFETENSORS_REMOTE`).
pub const BUILT: bool = cfg!(feature = "store");

#[cfg(feature = "store")]
/// Opens the object at `url` (`s3://`, `http://` or `https://`) as a file in memory: the header
/// first, validated, then the whole object with concurrent ranged GETs (or, with
/// [`RemoteOptions::header_only`], nothing more: see [`SafeFile::header_only`]; with
/// [`RemoteOptions::on_demand`], each read's bytes when it is made: see
/// [`SafeFile::from_source`]; with [`RemoteOptions::cache`], through a local cache of whole
/// files). Errors name the URL.
pub fn open(url: &str, remote: &RemoteOptions, options: OpenOptions) -> Result<SafeFile> {
    let object = Object::open(url, remote, options.allow_trailing_bytes)?;
    let name = object.name().to_owned();
    if remote.header_only {
        return SafeFile::header_only(name, object.head(), object.len(), options);
    }
    // With a cache: its copy, mapped (fetched into it first when whole and missing).
    let object = match cache::open(object, options)? {
        cache::Opened::File(file) => return Ok(file),
        cache::Opened::Uncached(object) => object,
    };
    if remote.on_demand {
        return object.on_demand(options);
    }
    let bytes = object.fetch_all()?;
    SafeFile::from_memory(name, Box::new(bytes), options)
}

#[cfg(feature = "store")]
/// The header only: one or two ranged GETs, the header validated as for a local file, no data
/// fetched. For tools that only describe a file (`safetensors inspect`).
pub fn open_header(url: &str, remote: &RemoteOptions, options: OpenOptions) -> Result<Object> {
    Object::open(url, remote, options.allow_trailing_bytes)
}

#[cfg(feature = "store")]
/// Opens a checkpoint at `url`: an index (a URL whose path ends in `.json`, in any case) whose
/// shards are objects next to it, or a single remote file as a checkpoint of one shard. The
/// index is fetched whole (at most [`MAX_INDEX_SIZE`] bytes) and checked as a local one is;
/// each shard is opened with `remote` (whole, on demand, or header only) on first use and
/// checked against the index. Of `options`, `lenient` and `allow_trailing_bytes` apply; the
/// backend and mapping options do not (remote files are in memory or read on demand). A shard
/// the server does not have is `ShardMissing` when it is first opened.
pub fn open_checkpoint(
    url: &str,
    remote: &RemoteOptions,
    options: CheckpointOptions,
) -> Result<Checkpoint> {
    let open_options = OpenOptions {
        allow_trailing_bytes: options.allow_trailing_bytes,
        ..OpenOptions::default()
    };
    if !names_index(url) {
        return Ok(Checkpoint::of_file(
            open(url, remote, open_options)?,
            options,
        ));
    }
    let text = fetch::fetch_small(url, remote, MAX_INDEX_SIZE, "a checkpoint index")?;
    let base = location::directory_of(url)?;
    let name = safetensors_core::redact_url(url);
    Checkpoint::from_index_bytes(
        &name,
        &text,
        &base,
        Box::new(RemoteShards {
            remote: remote.clone(),
            signed_index: url.contains('?'),
        }),
        options,
    )
}

#[cfg(feature = "store")]
/// Whether a URL names an index: its path (before any query) ends in `.json`, in any case.
fn names_index(url: &str) -> bool {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let last = path.rsplit('/').next().unwrap_or("").as_bytes();
    last.len() >= 5 && last[last.len() - 5..].eq_ignore_ascii_case(b".json")
}

#[cfg(feature = "store")]
/// The shards of a remote checkpoint, opened with the checkpoint's remote options. A shard is
/// another object than the index: an index opened by a signed URL lends its query (a
/// signature good for the index alone) to no shard, so shards are requested without one.
struct RemoteShards {
    remote: RemoteOptions,
    /// Whether the index's URL had a query: a shard refused access then says why.
    signed_index: bool,
}

#[cfg(feature = "store")]
impl ShardOpener for RemoteShards {
    fn open_shard(&self, location: &str, options: OpenOptions) -> Result<SafeFile> {
        open(location, &self.remote, options)
            .map_err(|e| error::unsigned_shard(e, self.signed_index))
    }
}
