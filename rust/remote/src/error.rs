//! Remote failures as the library's errors: every one an [`Error::Io`] whose path is the
//! object's URL (redacted, see `location.rs`), with a message a user can act on.
//!
//! `Io` is the kind a local file gets for the same events (cannot open, read failed, file
//! replaced while open), so callers handle local and remote files alike. Texts that come from
//! `object_store` (which may quote a server's answer, or a request's URL) pass through
//! [`scrub`], the one redaction point ([`crate::secrets`]): every credential the process holds
//! is cut out, whitespace is folded and the length is bounded.

use std::io;
use std::path::Path;

use safetensors_core::Error;

/// An `Io` error about the object `name`.
pub(crate) fn remote(name: &str, op: &'static str, kind: io::ErrorKind, message: String) -> Error {
    Error::io(Path::new(name), op, io::Error::new(kind, scrub(&message)))
}

/// A URL that cannot be used.
pub(crate) fn invalid_url(name: &str, why: &str) -> Error {
    remote(name, "open", io::ErrorKind::InvalidInput, why.to_owned())
}

/// The object changed since its header was read.
pub(crate) fn changed(name: &str, what: &str) -> Error {
    remote(
        name,
        "GET",
        io::ErrorKind::Other,
        format!(
            "the object changed while it was being read ({what}); no bytes of the new version \
             were used: open it again to read the new version"
        ),
    )
}

/// What messages say when a server answers a ranged GET without a range (HTTP 200 rather than
/// 206 Partial Content): a server without range support, or an error page in place of the data.
pub(crate) const NOT_PARTIAL: &str =
    "the server answered a ranged GET with a whole response (HTTP 200, not 206 Partial Content)";

/// An `object_store` failure, with the chain of its causes (a timeout is only said there).
pub(crate) fn store_error(name: &str, op: &'static str, e: object_store::Error) -> Error {
    use object_store::Error as E;
    let (kind, summary) = match &e {
        // The rest of the text (the request, the server's 404 page) adds nothing.
        E::NotFound { .. } => {
            let what = "no such object (HTTP 404 Not Found)".to_owned();
            return remote(name, op, io::ErrorKind::NotFound, what);
        }
        E::Precondition { .. } => {
            return changed(name, "the server refused the pinned version: HTTP 412");
        }
        E::PermissionDenied { .. } | E::Unauthenticated { .. } if name.starts_with("s3://") => (
            io::ErrorKind::PermissionDenied,
            "access denied (check the credentials in the AWS_* environment variables)",
        ),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => (
            io::ErrorKind::PermissionDenied,
            "access denied (HTTP 401 or 403: a pre-signed URL may have expired, or be signed \
             for another object or method)",
        ),
        E::NotSupported { .. } => (io::ErrorKind::InvalidData, NOT_PARTIAL),
        _ => (io::ErrorKind::Other, "request failed"),
    };
    let mut text = format!("{summary}: {e}");
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    remote(name, op, kind, text)
}

/// A shard's error, when the checkpoint's index was opened by a signed URL: a shard refused
/// access says that shards are requested without the index's query (a signature is good for
/// one object only), so that the user knows to make the shards readable another way.
pub(crate) fn unsigned_shard(e: Error, signed_index: bool) -> Error {
    match e {
        Error::Io { path, op, source }
            if signed_index && source.kind() == io::ErrorKind::PermissionDenied =>
        {
            // The hint first: the server's part may be cut at the message's bound.
            let hint = format!(
                "the shard refused access; the index was opened by a signed URL, and its query \
                 (a signature for the index alone) is not sent with shards, which are other \
                 objects: make the shards readable without a signature, or open each by its own \
                 signed URL ({source})"
            );
            Error::io(&path, op, io::Error::new(source.kind(), scrub(&hint)))
        }
        e => e,
    }
}

/// Longest message kept from a server or library text.
const MAX_MESSAGE: usize = 600;

/// `text` as a message may hold it: every secret cut out, whitespace folded, at most
/// [`MAX_MESSAGE`] bytes (see [`crate::secrets`], the one redaction point).
pub(crate) fn scrub(text: &str) -> String {
    crate::secrets::scrub(text, MAX_MESSAGE)
}
