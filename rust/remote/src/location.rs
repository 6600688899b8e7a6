//! The store and object path a URL names.
//!
//! Which strings are URLs, and what of them messages show, are the core's rules
//! (`safetensors_core::is_url`, `redact_url`), shared with builds without remote support.
//!
//! URLs that carry secrets are refused: user information (`https://user:pass@host/...`) and
//! query strings (pre-signed URLs) would otherwise be sent where they should not be and end up
//! in error messages. S3 credentials come from the environment (see docs/remote.md).

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, RetryConfig};
use safetensors_core::{push_url_segment, redact_url, url_scheme, Result};
use url::Url;

use crate::error::{invalid_url, store_error};
use crate::options::RemoteOptions;
use crate::secrets;
use crate::transport::Connector;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    S3,
    Http,
}

fn scheme_of(s: &str) -> Option<Scheme> {
    match url_scheme(s)? {
        "s3" => Some(Scheme::S3),
        _ => Some(Scheme::Http),
    }
}

/// A remote object: the store that reaches it, its path there, and its name for messages.
pub(crate) struct Location {
    pub(crate) name: String,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) path: ObjectPath,
}

/// The store and path for `url`, or an `Io` error naming the (redacted) URL.
pub(crate) fn locate(url: &str, options: &RemoteOptions) -> Result<Location> {
    // Whatever of the URL is secret never shows, in this open's messages or any later one.
    secrets::register_url(url);
    let name = redact_url(url);
    let scheme = scheme_of(url).ok_or_else(|| {
        invalid_url(
            &name,
            "not a remote URL: it should start with s3://, http:// or https://",
        )
    })?;
    let parsed =
        Url::parse(url).map_err(|e| invalid_url(&name, &format!("not a valid URL ({e})")))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid_url(
            &name,
            "credentials in a URL are refused (they would travel and be shown with it); for \
             s3:// set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid_url(
            &name,
            "URLs with a query or fragment (such as pre-signed URLs) are not supported yet",
        ));
    }
    let Some(host) = parsed.host_str().filter(|h| !h.is_empty()) else {
        return Err(invalid_url(
            &name,
            "the URL names no host (or, for s3://, no bucket)",
        ));
    };
    let path = ObjectPath::from_url_path(parsed.path())
        .map_err(|e| invalid_url(&name, &format!("not a valid object path ({e})")))?;
    if path.as_ref().is_empty() {
        return Err(invalid_url(
            &name,
            "the URL names no object (its path is empty)",
        ));
    }
    // object_store's own retries are off: `fetch.rs` retries, so that every retry is a new
    // request whose answer gets every check (object_store's retry of a broken body would
    // splice in an answer checked for its ETag only).
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 0,
        retry_timeout: options.request_timeout,
    };
    let connector = Connector::new(options.request_timeout, options.connect_timeout);
    let store: Arc<dyn ObjectStore> = match scheme {
        Scheme::S3 => {
            // Region, endpoint, path-style addressing, `AWS_ALLOW_HTTP` and credentials come
            // from the usual AWS_* variables; the timeouts are set through the same config keys
            // so that those variables' client settings are kept.
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(host);
            for var in ["AWS_ENDPOINT", "AWS_ENDPOINT_URL"] {
                if let Ok(endpoint) = std::env::var(var) {
                    secrets::register_url(&endpoint);
                }
            }
            builder = with_profile(builder);
            let builder = builder
                .with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                    millis(options.request_timeout),
                )
                .with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                    millis(options.connect_timeout),
                )
                .with_retry(retry)
                .with_http_connector(connector);
            Arc::new(builder.build().map_err(|e| store_error(&name, "open", e))?)
        }
        Scheme::Http => {
            let base = &parsed[..url::Position::BeforePath];
            let client = ClientOptions::new()
                // The user wrote http:// (https:// is verified TLS, the default). A redirect
                // never leaves https for http (see `transport`).
                .with_allow_http(true)
                .with_timeout(options.request_timeout)
                .with_connect_timeout(options.connect_timeout);
            let builder = HttpBuilder::new()
                .with_url(base)
                .with_client_options(client)
                .with_retry(retry)
                .with_http_connector(connector);
            Arc::new(builder.build().map_err(|e| store_error(&name, "open", e))?)
        }
    };
    Ok(Location { name, store, path })
}

/// The AWS shared files' profile ([`crate::profile`]), for what the environment leaves unset:
/// the keys only when neither key variable is set (never half from each), the region and the
/// endpoint each when its variables are unset.
fn with_profile(builder: AmazonS3Builder) -> AmazonS3Builder {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let mut builder = builder;
    let profile = crate::profile::from_files();
    for secret in [
        &profile.access_key_id,
        &profile.secret_access_key,
        &profile.session_token,
    ]
    .into_iter()
    .flatten()
    {
        secrets::register(secret);
    }
    if let Some(endpoint) = &profile.endpoint_url {
        secrets::register_url(endpoint);
    }
    if !set("AWS_ACCESS_KEY_ID") && !set("AWS_SECRET_ACCESS_KEY") {
        if let (Some(id), Some(secret)) = (&profile.access_key_id, &profile.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
            if let Some(token) = &profile.session_token {
                builder = builder.with_token(token);
            }
        }
    }
    if !set("AWS_REGION") && !set("AWS_DEFAULT_REGION") {
        if let Some(region) = &profile.region {
            builder = builder.with_region(region);
        }
    }
    if !set("AWS_ENDPOINT") && !set("AWS_ENDPOINT_URL") {
        if let Some(endpoint) = &profile.endpoint_url {
            if endpoint.starts_with("http://") {
                // The profile names a plain-HTTP endpoint (a local store): allowed, as
                // AWS_ALLOW_HTTP would allow it.
                builder = builder.with_allow_http(true);
            }
            builder = builder.with_endpoint(endpoint);
        }
    }
    builder
}

/// The URL of the directory holding the object `url` names, ending in `/`: its scheme and
/// host, then each segment of its object path but the last, as the store reads them (decoded,
/// after `.` and `..` and, in `http` URLs, `\` are resolved) and encoded again one by one.
/// Cutting the URL's text at its last `/` would not be that directory where the object path
/// holds an encoded `/` (`%2F`) or a `\`.
pub(crate) fn directory_of(url: &str) -> Result<String> {
    let name = redact_url(url);
    let parsed =
        Url::parse(url).map_err(|e| invalid_url(&name, &format!("not a valid URL ({e})")))?;
    let path = ObjectPath::from_url_path(parsed.path())
        .map_err(|e| invalid_url(&name, &format!("not a valid object path ({e})")))?;
    let parts: Vec<_> = path.parts().collect();
    let mut out = parsed[..url::Position::BeforePath].to_owned();
    out.push('/');
    for part in &parts[..parts.len().saturating_sub(1)] {
        push_url_segment(&mut out, part.as_ref());
        out.push('/');
    }
    Ok(out)
}

fn millis(d: std::time::Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_urls_that_carry_secrets_without_showing_them() {
        let o = RemoteOptions::default();
        for url in [
            "https://alice:hunter2@example.com/m.safetensors",
            "https://example.com/m.safetensors?X-Amz-Signature=hunter2",
        ] {
            let e = locate(url, &o).err().expect("refused");
            let text = e.to_string();
            assert!(!text.contains("hunter2"), "{text}");
            assert!(text.contains("https://example.com/m.safetensors"), "{text}");
        }
    }

    #[test]
    fn an_objects_directory_is_what_the_store_reads_its_path_as() {
        for (url, dir) in [
            (
                "http://h:80/models/gpt2/m.index.json",
                "http://h/models/gpt2/",
            ),
            ("http://h/m.index.json", "http://h/"),
            ("https://h/a/./b/../m.index.json", "https://h/a/"),
            (
                "http://h/models%2Fgpt2/m.index.json",
                "http://h/models/gpt2/",
            ),
            ("http://h/models%2Fm.index.json", "http://h/models/"),
            ("http://h/models\\m.index.json", "http://h/models/"),
            ("http://h/a%20b/m.index.json", "http://h/a%20b/"),
            ("s3://bucket/x/y/m.index.json", "s3://bucket/x/y/"),
            ("s3://bucket/x%2Fy/m.index.json", "s3://bucket/x/y/"),
        ] {
            assert_eq!(directory_of(url).unwrap(), dir, "{url}");
        }
    }

    #[test]
    fn refuses_urls_without_an_object() {
        let o = RemoteOptions::default();
        assert!(locate("http://example.com/", &o).is_err());
        assert!(locate("s3:///key", &o).is_err());
        assert!(locate("ftp://example.com/x", &o).is_err());
    }
}
