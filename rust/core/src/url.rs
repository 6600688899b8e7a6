//! The two rules about URLs that every layer shares, with or without remote support built in
//! (`rust/remote` reads them; the C++ API and the CLI ask through the bridge): which strings
//! are URLs, and what of a URL a message may show.

/// Whether `s` names a remote object rather than a local path: it starts with `s3://`,
/// `http://` or `https://` (the scheme in any case). Anything else is a local path.
///
/// ```
/// assert!(safetensors_core::is_url("s3://bucket/model.safetensors"));
/// assert!(!safetensors_core::is_url("models/http:/x.safetensors"));
/// ```
pub fn is_url(s: &str) -> bool {
    url_scheme(s).is_some()
}

/// The scheme of a URL [`is_url`] accepts, lower-cased: `s3`, `http` or `https`.
pub fn url_scheme(s: &str) -> Option<&'static str> {
    let (scheme, _) = s.split_once("://")?;
    ["s3", "http", "https"]
        .into_iter()
        .find(|known| scheme.eq_ignore_ascii_case(known))
}

/// `url` as messages show it: scheme, host, port and path, without user information (which
/// may hold a password), query (which may hold a signature) or fragment, at most 300 bytes.
///
/// ```
/// let shown = safetensors_core::redact_url("https://u:secret@host:8443/m.safetensors?sig=x");
/// assert_eq!(shown, "https://host:8443/m.safetensors");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    // User information ends at the authority's last `@`.
    let host = authority.rsplit('@').next().unwrap_or("");
    let mut shown = format!("{scheme}://{host}{path}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_by_their_scheme_only() {
        assert!(is_url("s3://bucket/key"));
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
        ] {
            assert_eq!(redact_url(url), shown);
        }
        assert!(redact_url(&"x".repeat(1000)).len() <= 303);
    }
}
