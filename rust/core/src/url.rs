//! The rules about URLs that every layer shares, with or without remote support built in
//! (`rust/remote` reads them; the C++ API and the CLI ask through the bridge): which strings
//! are URLs, what of a URL a message may show, and how a name becomes one segment of a URL's
//! path.

use std::path::Path;

use crate::error::{Error, Result};

/// Whether `s` names a remote object rather than a local path: it starts with `s3://`,
/// `gs://`, `az://`, `http://` or `https://` (the scheme in any case). Anything else is a local
/// path.
///
/// ```
/// assert!(safetensors_core::is_url("s3://bucket/model.safetensors"));
/// assert!(!safetensors_core::is_url("models/http:/x.safetensors"));
/// ```
pub fn is_url(s: &str) -> bool {
    url_scheme(s).is_some()
}

/// The scheme of a URL [`is_url`] accepts, lower-cased: `s3`, `gs`, `az`, `http` or `https`.
pub fn url_scheme(s: &str) -> Option<&'static str> {
    let (scheme, _) = s.split_once("://")?;
    ["s3", "gs", "az", "http", "https"]
        .into_iter()
        .find(|known| scheme.eq_ignore_ascii_case(known))
}

/// `url` as messages show it: scheme, host, port and path, without user information (which
/// may hold a password), query (which may hold a signature) or fragment, at most 300 bytes.
///
/// User information is everything up to the text's last `@`: a password may hold `/`, `?` or
/// `#` unencoded, and then no parser can tell where the authority ends, so the rule never
/// relies on one. Where the part cut off holds such a character (a password with `/`, or an
/// `@` in the path), the cut shows as `<redacted>@`, so that the name never seems to be another
/// URL's. When a `?` or `#` comes before that `@`, nothing tells a password holding `?` from a
/// query holding `@` (a signed URL's credential, `X-Goog-Credential=svc@project...`): either
/// way what follows may be a secret, so only the scheme shows, as `scheme://<redacted>`.
///
/// ```
/// let shown = safetensors_core::redact_url("https://u:secret@host:8443/m.safetensors?sig=x");
/// assert_eq!(shown, "https://host:8443/m.safetensors");
/// let shown = safetensors_core::redact_url("s3://KEY:se/cr?et@bucket/m.safetensors");
/// assert_eq!(shown, "s3://<redacted>");
/// let shown = safetensors_core::redact_url("https://h/m?a=x@y&X-Amz-Signature=abc");
/// assert_eq!(shown, "https://<redacted>");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if let (Some(end), Some(at)) = (rest.find(['?', '#']), rest.rfind('@')) {
        if end < at {
            return format!("{scheme}://<redacted>");
        }
    }
    let (cut, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let marker = match cut {
        Some(info) if info.contains(['/', '?', '#']) => "<redacted>@",
        _ => "",
    };
    let mut shown = format!("{scheme}://{marker}{rest}");
    if shown.len() > 300 {
        let mut end = 300;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push_str("...");
    }
    shown
}

/// `bytes` as the URL text they are, or an `Io` error showing them lossily (and redacted): a
/// URL is UTF-8 text, and reading other bytes lossily would name another object (`\xff`
/// becoming U+FFFD). For layers that receive URLs as bytes (C strings, paths).
///
/// ```
/// assert_eq!(safetensors_core::url_text(b"s3://b/m.safetensors").unwrap(), "s3://b/m.safetensors");
/// assert!(safetensors_core::url_text(b"s3://b/m\xff.safetensors").is_err());
/// ```
pub fn url_text(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|_| {
        let shown = redact_url(&String::from_utf8_lossy(bytes));
        Error::io(
            Path::new(&shown),
            "open",
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a URL must be UTF-8 text (percent-encode any other byte, as %FF)",
            ),
        )
    })
}

/// Appends `name` to a URL's path as one segment that means exactly that name: every byte but
/// the unreserved ones (RFC 3986: letters, digits, `-._~`) percent-encoded. Left as they are,
/// names would be read as URL syntax: `%2e%2e` and (in `http` URLs) `..\` climb a directory,
/// `/` adds one, `?` and `#` end the path, and `%41` names another object.
///
/// ```
/// let mut url = "https://host/models/".to_owned();
/// safetensors_core::push_url_segment(&mut url, "%2e%2e a?.safetensors");
/// assert_eq!(url, "https://host/models/%252e%252e%20a%3F.safetensors");
/// ```
pub fn push_url_segment(url: &mut String, name: &str) {
    for &b in name.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            url.push(char::from(b));
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_by_their_scheme_only() {
        assert!(is_url("s3://bucket/key"));
        assert!(is_url("gs://bucket/key"));
        assert!(is_url("AZ://container/blob"));
        assert!(!is_url("abfs://container/blob"));
        assert!(is_url("HTTPS://host/x.safetensors"));
        assert!(is_url("http://127.0.0.1:8080/a"));
        assert!(!is_url("model.safetensors"));
        assert!(!is_url("/data/s3:/bucket"));
        assert!(!is_url("file:///tmp/x"));
        assert!(!is_url("dir/http://x"));
        assert!(!is_url("ftp://host/x"));
    }

    #[test]
    fn redaction_drops_credentials_query_and_fragment() {
        for (url, shown) in [
            (
                "https://alice:hunter2@example.com:8443/m.safetensors?X-Amz-Signature=abc#f",
                "https://example.com:8443/m.safetensors",
            ),
            ("http://user:hunter2@[bad/x", "http://[bad/x"),
            ("s3://bucket/a/b", "s3://bucket/a/b"),
            ("http://a@b@host", "http://host"),
            ("https://host?token=hunter2", "https://host"),
            // A password holding `/`: no parser finds the authority's end.
            (
                "s3://AKID:wJal/rXU@bucket/k.safetensors",
                "s3://<redacted>@bucket/k.safetensors",
            ),
            ("https://tok/en@host/m", "https://<redacted>@host/m"),
            // A `?` or `#` before the last `@`: a password holding it, or a query holding an
            // `@`; either way only the scheme shows.
            (
                "s3://AKID:wJal/rXU?tn#FE@bucket/k.safetensors",
                "s3://<redacted>",
            ),
            (
                "https://h/m?a=x@y&X-Amz-Signature=abc",
                "https://<redacted>",
            ),
            ("https://h/m#x@y", "https://<redacted>"),
            ("https://u:p@host/m?q=1#f", "https://host/m"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        assert!(redact_url(&"x".repeat(1000)).len() <= 303);
        for url in [
            "https://u:hunter2/x@h/m",
            "https://u:hunter2?x@h/m",
            "https://u:hunter2#x@h/m",
            "s3://u:hunter2@b/m?sig=hunter2",
            "https://h/m?a=x@y&X-Amz-Signature=hunter2",
            "https://h/m?X-Goog-Credential=svc@proj&X-Goog-Signature=hunter2",
            "https://u:p@h/m?c=a@b&sig=hunter2",
        ] {
            assert!(!redact_url(url).contains("hunter2"), "{url}");
        }
    }
}
