//! The store and object path a URL names.
//!
//! Which strings are URLs, and what of them messages show, are the core's rules
//! (`safetensors_core::is_url`, `redact_url`), shared with builds without remote support.
//!
//! User information in a URL (`https://user:pass@host/...`) is refused: it would travel with
//! every request and redirect. A query string is accepted on `http(s)://` URLs (a pre-signed
//! URL: `X-Amz-Signature`, `sig`, a SAS): it travels with every request of that object and no
//! other (see `transport::Signed`), its values are registered as secrets before anything else
//! happens, and names in messages never show it (`redact_url`). S3 credentials come from the
//! environment and the AWS shared files (see docs/remote.md).

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, RetryConfig};
use safetensors_core::{push_url_segment, redact_url, url_scheme, Result};
use url::Url;

use crate::credential_process::ProcessCredentials;
use crate::error::{invalid_url, store_error};
use crate::options::RemoteOptions;
use crate::secrets;
use crate::transport::{Connector, Signed};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    S3,
    Gcs,
    Azure,
    Http,
}

fn scheme_of(s: &str) -> Option<Scheme> {
    match url_scheme(s)? {
        "s3" => Some(Scheme::S3),
        "gs" => Some(Scheme::Gcs),
        "az" => Some(Scheme::Azure),
        _ => Some(Scheme::Http),
    }
}

/// The storage account of an Azure Blob URL without a query
/// (`https://ACCOUNT.blob.core.windows.net/CONTAINER/BLOB`), read through the Azure store with
/// the environment's credentials; with a query (a SAS) it stays a pre-signed HTTP URL.
fn azure_account(parsed: &Url) -> Option<&str> {
    if parsed.scheme() != "https" || parsed.query().is_some() || parsed.port().is_some() {
        return None;
    }
    let host = parsed.host_str()?;
    let account = host
        .get(..host.len().checked_sub(".blob.core.windows.net".len())?)
        .filter(|_| {
            host.to_ascii_lowercase()
                .ends_with(".blob.core.windows.net")
        })?;
    (!account.is_empty() && !account.contains('.')).then_some(account)
}

/// A remote object: the store that reaches it, its path there, and its name for messages.
pub(crate) struct Location {
    pub(crate) name: String,
    /// What the object is, for the cache's names: the URL without user information or query
    /// (two signed URLs of one object are one object), whole (a name in messages is bounded),
    /// and for `s3://` the endpoint and region it is read from (one bucket name on two stores
    /// is two objects).
    pub(crate) identity: String,
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
            "not a remote URL: it should start with s3://, gs://, az://, http:// or https://",
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
    if parsed.fragment().is_some() {
        return Err(invalid_url(
            &name,
            "a URL with a fragment (#...) names no object: remove the fragment",
        ));
    }
    if scheme != Scheme::Http && parsed.query().is_some() {
        return Err(invalid_url(
            &name,
            "an s3://, gs:// or az:// URL takes no query string: a pre-signed URL (or one with a \
             SAS) is an https:// URL (open that), and these reads are signed with the store's \
             credentials",
        ));
    }
    let Some(host) = parsed.host_str().filter(|h| !h.is_empty()) else {
        return Err(invalid_url(
            &name,
            "the URL names no host (or, for s3://, no bucket)",
        ));
    };
    let mut path = ObjectPath::from_url_path(parsed.path())
        .map_err(|e| invalid_url(&name, &format!("not a valid object path ({e})")))?;
    // An Azure Blob URL: the account is the host's first label, the container the path's
    // first segment, the blob the rest.
    let azure_https = match (scheme, azure_account(&parsed)) {
        (Scheme::Http, Some(account)) => {
            let mut parts = path.parts();
            let container = parts.next().map(|c| c.as_ref().to_owned());
            path = ObjectPath::from_iter(parts);
            Some((account.to_owned(), container.unwrap_or_default()))
        }
        _ => None,
    };
    if path.as_ref().is_empty() {
        return Err(invalid_url(
            &name,
            "the URL names no object (its path is empty; an Azure Blob URL names its container \
             first, then the blob)",
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
    let mut identity = parsed[..url::Position::AfterPath].to_owned();
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
            builder = with_profile(builder, options.request_timeout);
            let config = |key| builder.get_config_value(&key).unwrap_or_default();
            identity = format!(
                "{} endpoint={} region={}",
                &parsed[..url::Position::AfterPath],
                redact_url(&config(AmazonS3ConfigKey::Endpoint)),
                config(AmazonS3ConfigKey::Region)
            );
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
        Scheme::Gcs => {
            // Credentials (a service-account key file or key, application default credentials)
            // and `GOOGLE_ALLOW_HTTP` come from the GOOGLE_* variables; the key file may name
            // another endpoint (`gcs_base_url`, an emulator).
            // The timeouts through the config keys, so that those variables' client settings
            // are kept (as for S3).
            let builder = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(host)
                .with_config(
                    GoogleConfigKey::Client(ClientConfigKey::Timeout),
                    millis(options.request_timeout),
                )
                .with_config(
                    GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                    millis(options.connect_timeout),
                )
                .with_retry(retry)
                .with_http_connector(connector);
            for var in ["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_APPLICATION_CREDENTIALS"] {
                if let Ok(file) = std::env::var(var) {
                    identity.push_str(&format!(" {var}={file}"));
                }
            }
            Arc::new(builder.build().map_err(|e| store_error(&name, "open", e))?)
        }
        Scheme::Azure => azure(
            MicrosoftAzureBuilder::from_env().with_container_name(host),
            &mut identity,
            options,
            retry,
            connector,
            &name,
        )?,
        Scheme::Http if azure_https.is_some() => {
            let (account, container) = azure_https.unwrap_or_default();
            azure(
                MicrosoftAzureBuilder::from_env()
                    .with_account(account)
                    .with_container_name(container),
                &mut identity,
                options,
                retry,
                connector,
                &name,
            )?
        }
        Scheme::Http => {
            if let Some(query) = object_query(&parsed) {
                identity.push_str(&query);
            }
            let base = &parsed[..url::Position::BeforePath];
            let signed = match parsed.query() {
                Some(_) => Some(Signed {
                    store_path: store_path(base, &path)
                        .map_err(|e| invalid_url(&name, &format!("not a valid URL ({e})")))?,
                    path_and_query: parsed[url::Position::BeforePath..url::Position::AfterQuery]
                        .to_owned(),
                }),
                None => None,
            };
            let connector = connector.signed(signed);
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
    Ok(Location {
        name,
        identity,
        store,
        path,
    })
}

/// The Azure Blob store `builder` names (account, container and credentials from the AZURE_*
/// variables, or Azurite with `AZURE_STORAGE_USE_EMULATOR=true` at `AZURITE_BLOB_STORAGE_URL`),
/// with the transport's checks; the account and its endpoint join the object's identity.
fn azure(
    builder: MicrosoftAzureBuilder,
    identity: &mut String,
    options: &RemoteOptions,
    retry: RetryConfig,
    connector: Connector,
    name: &str,
) -> Result<Arc<dyn ObjectStore>> {
    let config = |key| builder.get_config_value(&key).unwrap_or_default();
    let emulator = config(AzureConfigKey::UseEmulator) == "true";
    let endpoint = if emulator {
        std::env::var("AZURITE_BLOB_STORAGE_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:10000".into())
    } else {
        config(AzureConfigKey::Endpoint)
    };
    secrets::register_url(&endpoint);
    identity.push_str(&format!(
        " account={} endpoint={}",
        config(AzureConfigKey::AccountName),
        redact_url(&endpoint)
    ));
    // The timeouts through the config keys, so that the variables' client settings are kept
    // (the emulator allows plain HTTP itself).
    let builder = builder
        .with_config(
            AzureConfigKey::Client(ClientConfigKey::Timeout),
            millis(options.request_timeout),
        )
        .with_config(
            AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
            millis(options.connect_timeout),
        )
        .with_retry(retry)
        .with_http_connector(connector);
    Ok(Arc::new(
        builder.build().map_err(|e| store_error(name, "open", e))?,
    ))
}

/// What of a URL's query names the object rather than signs the request, for the cache's
/// identity of the object (`Location::identity`): a server may choose the object by its query
/// (`/download?model=a`), so two URLs differing there are two objects; the parameters of a
/// signature (S3's `X-Amz-*`, GCS's `X-Goog-*`, Azure's SAS `sv`/`se`/`sp`/`sig`/..., a CDN's
/// `Signature`/`Expires`/`Key-Pair-Id`/`Policy`/`token`) change with every signing and are left
/// out, so that a URL signed again finds the same entry. The rest is kept as a SHA-256 digest
/// (`?query-sha256=<hex>`), so that the cache's files never hold a query's values; `None` when
/// nothing of the query is left.
fn object_query(parsed: &Url) -> Option<String> {
    const SIGNING: &[&str] = &[
        "sig",
        "se",
        "sp",
        "sv",
        "sr",
        "st",
        "spr",
        "si",
        "ss",
        "srt",
        "sdd",
        "skoid",
        "sktid",
        "skt",
        "ske",
        "sks",
        "skv",
        "saoid",
        "suoid",
        "scid",
        "signature",
        "expires",
        "key-pair-id",
        "policy",
        "token",
        "hdnts",
        "hmac",
        "verify",
        "x-expires",
    ];
    parsed.query()?;
    let kept: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(k, _)| {
            let k = k.to_ascii_lowercase();
            !(k.starts_with("x-amz-") || k.starts_with("x-goog-") || SIGNING.contains(&k.as_str()))
        })
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        return None;
    }
    let mut text = String::new();
    for (k, v) in &kept {
        text.push_str(&format!("{}={}&", k.len(), k));
        text.push_str(&format!("{}={}&", v.len(), v));
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("?query-sha256={hex}"))
}

/// The path object_store's HTTP store requests `path` by under `base` (its `path_url`: the
/// base URL's segments extended by the object path's, each encoded), for [`Signed`] to match.
fn store_path(base: &str, path: &ObjectPath) -> std::result::Result<String, url::ParseError> {
    let mut url = Url::parse(base)?;
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.extend(path.parts());
    }
    Ok(url.path().to_owned())
}

/// The AWS shared files' profile ([`crate::profile`]), for what the environment leaves unset:
/// the keys only when neither key variable is set (never half from each), else its
/// `credential_process` (given `deadline` to answer), the region and the endpoint each when its
/// variables are unset.
fn with_profile(builder: AmazonS3Builder, deadline: std::time::Duration) -> AmazonS3Builder {
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
        } else if let Some(command) = profile.credential_process.as_ref().filter(|_| {
            profile.access_key_id.is_none()
                && !(set("AWS_WEB_IDENTITY_TOKEN_FILE") && set("AWS_ROLE_ARN"))
        }) {
            // After the keys of the environment, a web identity and the profile's own keys,
            // as the AWS SDKs order them; before container and instance credentials.
            let process = ProcessCredentials::new(command.clone(), deadline);
            builder = builder.with_credentials(Arc::new(process));
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
    fn azure_blob_urls_name_their_account_and_only_without_a_query() {
        let account = |u: &str| azure_account(&Url::parse(u).unwrap()).map(str::to_owned);
        assert_eq!(
            account("https://acct.blob.core.windows.net/models/m.safetensors").as_deref(),
            Some("acct")
        );
        assert_eq!(
            account("https://Acct.BLOB.core.windows.net/c/m").as_deref(),
            Some("acct"),
            "hosts are lower-cased"
        );
        for other in [
            "https://acct.blob.core.windows.net/c/m?sv=2021&sig=abc",
            "http://acct.blob.core.windows.net/c/m",
            "https://acct.blob.core.windows.net:8443/c/m",
            "https://a.b.blob.core.windows.net/c/m",
            "https://blob.core.windows.net/c/m",
            "https://acct.blob.core.windows.net.example.com/c/m",
            "https://example.com/c/m",
        ] {
            assert_eq!(account(other), None, "{other}");
        }
        // The container is the path's first segment; a URL naming only a container names no
        // object.
        let o = RemoteOptions::default();
        let e = locate("https://acct.blob.core.windows.net/models", &o)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("names its container first"), "{e}");
        let e = locate("gs://bucket/m.safetensors?X-Goog-Signature=hunter2", &o)
            .err()
            .expect("refused");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn refuses_urls_that_carry_secrets_without_showing_them() {
        let o = RemoteOptions::default();
        for url in [
            "https://alice:hunter2@example.com/m.safetensors",
            "s3://bucket/m.safetensors?X-Amz-Signature=hunter2",
            "https://example.com/m.safetensors?X-Amz-Signature=hunter2#frag",
        ] {
            let e = locate(url, &o).err().expect("refused");
            let text = e.to_string();
            assert!(!text.contains("hunter2"), "{text}");
            assert!(
                text.contains("https://example.com/m.safetensors")
                    || text.contains("s3://bucket/m.safetensors"),
                "{text}"
            );
        }
    }

    #[test]
    fn the_identity_keeps_what_names_the_object_and_drops_signatures() {
        let o = RemoteOptions::default();
        let id = |url: &str| locate(url, &o).expect("accepted").identity;
        let plain = id("https://h/m.safetensors");
        assert_eq!(plain, "https://h/m.safetensors");
        // Signed again, the same object.
        assert_eq!(
            id("https://h/m.safetensors?X-Amz-Signature=a&X-Amz-Date=1"),
            plain
        );
        assert_eq!(id("https://h/m.safetensors?sv=1&se=2&sp=r&sig=abc"), plain);
        assert_eq!(
            id("https://h/m.safetensors?Expires=9&Signature=z&Key-Pair-Id=k"),
            plain
        );
        // A query choosing the object: another object, and its values never in the identity.
        let a = id("https://h/download?model=alpha&X-Amz-Signature=1");
        let b = id("https://h/download?model=beta&X-Amz-Signature=2");
        assert_ne!(a, b);
        assert_eq!(a, id("https://h/download?model=alpha&X-Amz-Signature=3"));
        assert!(!a.contains("alpha") && a.starts_with("https://h/download?query-sha256="));
    }

    #[test]
    fn a_signed_url_is_a_store_whose_name_shows_no_query() {
        let o = RemoteOptions::default();
        let url =
            "https://example.com/a%20b/m.safetensors?X-Amz-Signature=hunter2&X-Amz-Expires=60";
        let at = locate(url, &o).expect("a signed https URL is accepted");
        assert_eq!(at.name, "https://example.com/a%20b/m.safetensors");
        assert_eq!(at.path.as_ref(), "a b/m.safetensors");
        // The store asks for the path as its `path_url` encodes it; that is what the transport
        // matches before sending the URL's own path and query.
        assert_eq!(
            store_path("https://example.com", &at.path).unwrap(),
            "/a%20b/m.safetensors"
        );
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
