//! How every request reaches a server: the HTTP transport under every store (`object_store`
//! builds the requests, signs them and reads the answers; this sends them). It owns three rules:
//!
//! - **Redirects by policy** ([`may_follow`]): a GET or HEAD follows at most
//!   [`MAX_REDIRECTS`] redirects (301, 302, 303, 307, 308); to `https` always; to plain `http`
//!   only when the request began as `http` and the redirect stays on the same origin or goes
//!   from a loopback host to a loopback host (a local mirror); never to another scheme. A
//!   redirect to another origin carries only the headers that describe the request
//!   ([`CROSS_ORIGIN_HEADERS`]: the range and the version conditions): never `Authorization`,
//!   `x-amz-security-token`, a signature's other headers, or a cookie. A refused redirect is an
//!   error naming both URLs (redacted).
//! - **One connection pool per endpoint settings, per process, bounded**: every store made with
//!   the same settings (every shard of a checkpoint, every file of a server) shares one client
//!   and its pool; at most [`MAX_CONNECTIONS`] requests of one client are in flight at once (a
//!   request holds its slot until its body is read or dropped), so a process never holds more
//!   sockets than that per endpoint, however many files it opens. A child made by `fork` gets
//!   clients of its own (see [`crate::process`]).
//! - **A signed URL's query travels with its object only** ([`Signed`]): a store's paths have
//!   no query, so the store made for a pre-signed URL (`?X-Amz-Signature=...`, `?sig=...`, a
//!   SAS) asks for the object's path and this transport sends the request to the address the
//!   URL gave, path and query as written (a signature is computed over them). Requests for
//!   any other path, and a redirect's target, are sent as they are: a redirect names its own
//!   address, signed or not, and the policy above applies to it.
//! - **A server that is busy or failing** (5xx, 429, 408) is an error of this transport
//!   ([`ServerStatus`], with the status and the start of the answer), which `fetch.rs` retries
//!   as it retries a broken connection: object_store's own retries are off, so that every
//!   retry is a fresh request whose answer gets every check (see `fetch.rs`).

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use object_store::{ClientConfigKey, ClientOptions};
use safetensors_core::redact_url;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::process::PerProcess;

/// Redirects one request follows at most.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// Requests of one client (one endpoint's settings) in flight at once, per process.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// The headers a redirect to another origin carries: what the request asks for, nothing that
/// says who asks.
pub(crate) const CROSS_ORIGIN_HEADERS: [HeaderName; 7] = [
    header::RANGE,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::USER_AGENT,
    header::ACCEPT,
];

/// Bytes of a failing server's answer kept for the message.
const STATUS_TEXT: usize = 1024;

/// The settings a client is made with: stores with equal settings share one client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Settings {
    timeout: Duration,
    connect_timeout: Duration,
    allow_http: bool,
    allow_invalid_certificates: bool,
    proxy_url: Option<String>,
    proxy_ca_certificate: Option<String>,
    proxy_excludes: Option<String>,
    user_agent: Option<String>,
}

/// Makes every store's client this module's [`Transport`].
#[derive(Debug)]
pub(crate) struct Connector {
    timeout: Duration,
    connect_timeout: Duration,
    signed: Option<Signed>,
}

impl Connector {
    pub(crate) fn new(timeout: Duration, connect_timeout: Duration) -> Connector {
        Connector {
            timeout,
            connect_timeout,
            signed: None,
        }
    }

    /// The connector of a store made for one signed object: see [`Signed`].
    pub(crate) fn signed(self, signed: Option<Signed>) -> Connector {
        Connector { signed, ..self }
    }
}

/// The address of a signed object (a pre-signed URL): the store requests `store_path`, and the
/// transport sends that request to `path_and_query` instead, as the URL wrote them.
#[derive(Clone)]
pub(crate) struct Signed {
    /// The path the store asks for the object by (no query: a store's paths have none).
    pub(crate) store_path: String,
    /// The path and query the URL gave: what is sent.
    pub(crate) path_and_query: String,
}

impl fmt::Debug for Signed {
    // Never the query: a Debug print of a store must not show a signature.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signed")
            .field("store_path", &self.store_path)
            .finish_non_exhaustive()
    }
}

impl Signed {
    /// `uri` sent to the signed address when it asks for the signed object's path (and has no
    /// query of its own), else unchanged.
    fn apply(&self, uri: Uri) -> Result<Uri, HttpError> {
        if uri.path() != self.store_path || uri.query().is_some() {
            return Ok(uri);
        }
        let mut parts = uri.into_parts();
        parts.path_and_query = Some(
            self.path_and_query
                .parse()
                .map_err(|e| HttpError::new(HttpErrorKind::Unknown, e))?,
        );
        Uri::from_parts(parts).map_err(|e| HttpError::new(HttpErrorKind::Unknown, e))
    }
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let value = |key| options.get_config_value(&key);
        let yes = |key| value(key).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let settings = Settings {
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            allow_http: yes(ClientConfigKey::AllowHttp),
            allow_invalid_certificates: yes(ClientConfigKey::AllowInvalidCertificates),
            proxy_url: value(ClientConfigKey::ProxyUrl),
            proxy_ca_certificate: value(ClientConfigKey::ProxyCaCertificate),
            proxy_excludes: value(ClientConfigKey::ProxyExcludes),
            user_agent: value(ClientConfigKey::UserAgent),
        };
        // Made now, so that a setting reqwest refuses (a bad proxy URL) fails the open.
        shared(&settings).map_err(|e| object_store::Error::Generic {
            store: "HTTP",
            source: Box::new(e),
        })?;
        Ok(HttpClient::new(Transport {
            settings,
            signed: self.signed.clone(),
        }))
    }
}

/// One client and its bound.
#[derive(Clone)]
struct Shared {
    client: reqwest::Client,
    slots: Arc<Semaphore>,
}

type Clients = Mutex<HashMap<Settings, Shared>>;

static CLIENTS: PerProcess<Clients> = PerProcess::new(Clients::default);

/// This process's client for `settings`, made on first use.
fn shared(settings: &Settings) -> Result<Shared, HttpError> {
    let mut clients = CLIENTS
        .get()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = clients.get(settings) {
        return Ok(found.clone());
    }
    let made = Shared {
        client: client(settings).map_err(|e| HttpError::new(HttpErrorKind::Unknown, e))?,
        slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    };
    clients.insert(settings.clone(), made.clone());
    Ok(made)
}

fn client(s: &Settings) -> reqwest::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(s.timeout)
        .connect_timeout(s.connect_timeout)
        .pool_max_idle_per_host(MAX_CONNECTIONS)
        // As object_store's own client: HTTP/1.1 (one request per connection, the parallel
        // ranged GETs on parallel connections), no transparent decompression (lengths must be
        // the object's).
        .http1_only()
        .no_gzip()
        .no_brotli()
        .no_deflate()
        .no_zstd()
        .https_only(!s.allow_http)
        .danger_accept_invalid_certs(s.allow_invalid_certificates)
        .user_agent(
            s.user_agent
                .clone()
                .unwrap_or_else(|| format!("safetensors-cpp/{}", env!("CARGO_PKG_VERSION"))),
        );
    if let Some(url) = &s.proxy_url {
        let mut proxy = reqwest::Proxy::all(url)?;
        if let Some(excludes) = &s.proxy_excludes {
            proxy = proxy.no_proxy(reqwest::NoProxy::from_string(excludes));
        }
        if let Some(pem) = &s.proxy_ca_certificate {
            builder = builder.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes())?);
        }
        builder = builder.proxy(proxy);
    }
    builder.build()
}

/// The HTTP service of every store: one process-wide client per settings, redirects by policy,
/// failing servers as errors.
#[derive(Debug)]
struct Transport {
    settings: Settings,
    signed: Option<Signed>,
}

#[async_trait::async_trait]
impl HttpService for Transport {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let shared = shared(&self.settings)?;
        // The semaphore is never closed, so acquiring only waits.
        let slot = shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| HttpError::new(HttpErrorKind::Unknown, e))?;
        let (parts, body) = request.into_parts();
        let followable = parts.method == Method::GET || parts.method == Method::HEAD;
        let mut uri = match &self.signed {
            Some(signed) => signed.apply(parts.uri)?,
            None => parts.uri,
        };
        let first = uri.clone();
        let mut headers = parts.headers;
        let mut hops = 0;
        loop {
            let mut request = http::Request::new(body.clone());
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = uri.clone();
            *request.headers_mut() = headers.clone();
            let answer = shared.client.call(request).await?;
            let status = answer.status();
            if followable && is_redirect(status) {
                // Without a Location, object_store reports the bare redirect itself.
                if let Some(location) = answer.headers().get(header::LOCATION) {
                    let next = resolve(&uri, location.as_bytes())?;
                    if hops == MAX_REDIRECTS {
                        return Err(refused(
                            &first,
                            &next,
                            &format!("too many redirects (more than {MAX_REDIRECTS})"),
                        ));
                    }
                    // A redirect to a signed address: its signature is cut out of every message
                    // from now on, as the URL's own is.
                    crate::secrets::register_url(&next.to_string());
                    may_follow(&first, &uri, &next).map_err(|why| refused(&first, &next, why))?;
                    if !same_origin(&uri, &next) {
                        headers = cross_origin(&headers);
                    }
                    uri = next;
                    hops += 1;
                    continue;
                }
            }
            if status.is_server_error()
                || status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::REQUEST_TIMEOUT
            {
                return Err(HttpError::new(
                    HttpErrorKind::Unknown,
                    ServerStatus::read(answer).await,
                ));
            }
            if status.is_client_error() {
                // A refusal's body is read into its error whole by the store: at most
                // `STATUS_TEXT` bytes of it are kept, so that a hostile server cannot fill
                // memory with an endless 403.
                let (parts, body) = answer.into_parts();
                let text = bounded_text(body).await;
                return Ok(HttpResponse::from_parts(
                    parts,
                    HttpResponseBody::from(text),
                ));
            }
            let (parts, body) = answer.into_parts();
            let body = HttpResponseBody::new(Slotted { body, _slot: slot });
            return Ok(HttpResponse::from_parts(parts, body));
        }
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// The URL a `Location` names, relative ones resolved against the URL that answered.
fn resolve(base: &Uri, location: &[u8]) -> Result<Uri, HttpError> {
    let bad = || {
        HttpError::new(
            HttpErrorKind::Unknown,
            Refused(format!(
                "{} answered with a redirect to a location that is not a URL",
                shown(base)
            )),
        )
    };
    let text = std::str::from_utf8(location).map_err(|_| bad())?;
    let base = url::Url::parse(&base.to_string()).map_err(|_| bad())?;
    let next = base.join(text).map_err(|_| bad())?;
    next.as_str().parse::<Uri>().map_err(|_| bad())
}

/// Whether a request that began at `first`, now at `from`, may follow a redirect to `to`.
pub(crate) fn may_follow(first: &Uri, from: &Uri, to: &Uri) -> Result<(), &'static str> {
    match to.scheme_str() {
        Some("https") => Ok(()),
        Some("http") => {
            if first.scheme_str() != Some("http") {
                Err(
                    "a redirect may not leave https for plain http (the bytes would travel in \
                     clear, unauthenticated)",
                )
            } else if same_origin(from, to) || (is_loopback(from) && is_loopback(to)) {
                Ok(())
            } else {
                Err(
                    "a plain-http redirect is followed only on the same origin or between \
                     loopback hosts; serve the object over https",
                )
            }
        }
        _ => Err("a redirect may only lead to an https (or, from http, an http) URL"),
    }
}

fn same_origin(a: &Uri, b: &Uri) -> bool {
    a.scheme_str() == b.scheme_str()
        && a.host().map(str::to_ascii_lowercase) == b.host().map(str::to_ascii_lowercase)
        && a.port_u16().or(default_port(a)) == b.port_u16().or(default_port(b))
}

fn default_port(u: &Uri) -> Option<u16> {
    match u.scheme_str() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    }
}

fn is_loopback(u: &Uri) -> bool {
    let Some(host) = u.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `headers` as a redirect to another origin may carry them.
fn cross_origin(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for name in &CROSS_ORIGIN_HEADERS {
        for value in headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

fn shown(u: &Uri) -> String {
    redact_url(&u.to_string())
}

fn refused(first: &Uri, to: &Uri, why: &str) -> HttpError {
    HttpError::new(
        HttpErrorKind::Unknown,
        Refused(format!(
            "the redirect from {} to {} is refused: {why}",
            shown(first),
            shown(to)
        )),
    )
}

/// A redirect the policy refuses.
#[derive(Debug)]
pub(crate) struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// A server that answered 5xx, 429 or 408: worth another try later.
#[derive(Debug)]
pub(crate) struct ServerStatus {
    pub(crate) status: StatusCode,
    text: String,
}

impl ServerStatus {
    async fn read(answer: HttpResponse) -> ServerStatus {
        let status = answer.status();
        let text = bounded_text(answer.into_body()).await;
        ServerStatus {
            status,
            text: String::from_utf8_lossy(&text).into_owned(),
        }
    }
}

/// The first `STATUS_TEXT` bytes of an answer's body (what arrived of them when it breaks off);
/// the rest is never read.
async fn bounded_text(body: HttpResponseBody) -> Vec<u8> {
    let mut text = Vec::new();
    let mut body = body.bytes_stream();
    while let Some(Ok(chunk)) = body.next().await {
        text.extend_from_slice(&chunk[..chunk.len().min(STATUS_TEXT - text.len())]);
        if text.len() >= STATUS_TEXT {
            break;
        }
    }
    text
}

impl fmt::Display for ServerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {}", self.status)?;
        if !self.text.trim().is_empty() {
            write!(f, ": {}", self.text)?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerStatus {}

/// An answer's body holding its request's slot until it is read or dropped.
struct Slotted {
    body: HttpResponseBody,
    _slot: OwnedSemaphorePermit,
}

impl Body for Slotted {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn redirects_follow_the_policy() {
        let ok = |first: &str, from: &str, to: &str| may_follow(&uri(first), &uri(from), &uri(to));
        // To https: always.
        assert!(ok("https://a/x", "https://a/x", "https://b/y").is_ok());
        assert!(ok("http://a/x", "http://a/x", "https://b/y").is_ok());
        // From https to http: never, wherever.
        assert!(ok("https://a/x", "https://a/x", "http://a/x").is_err());
        assert!(ok(
            "https://127.0.0.1/x",
            "https://127.0.0.1/x",
            "http://127.0.0.1/y"
        )
        .is_err());
        assert!(ok("https://a/x", "https://b/x", "http://b/y").is_err());
        // From http to http: the same origin, or loopback to loopback.
        assert!(ok("http://a/x", "http://a/x", "http://a:80/y").is_ok());
        assert!(ok("http://a/x", "http://a/x", "http://b/y").is_err());
        assert!(ok("http://a/x", "http://a/x", "http://a:8080/y").is_err());
        assert!(ok(
            "http://127.0.0.1:1/x",
            "http://127.0.0.1:1/x",
            "http://localhost:2/y"
        )
        .is_ok());
        assert!(ok("http://[::1]:1/x", "http://[::1]:1/x", "http://127.0.0.2/y").is_ok());
        assert!(ok(
            "http://127.0.0.1/x",
            "http://127.0.0.1/x",
            "http://10.0.0.1/y"
        )
        .is_err());
        // Never another scheme.
        assert!(ok("https://a/x", "https://a/x", "ftp://a/x").is_err());
        assert!(ok("http://a/x", "http://a/x", "ftp://h/etc/passwd").is_err());
    }

    #[test]
    fn another_origin_gets_no_credentials() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 sig".parse().unwrap(),
        );
        h.insert("x-amz-security-token", "token".parse().unwrap());
        h.insert("x-amz-date", "20261129T000000Z".parse().unwrap());
        h.insert(header::COOKIE, "session=1".parse().unwrap());
        h.insert(header::PROXY_AUTHORIZATION, "Basic x".parse().unwrap());
        h.insert(header::RANGE, "bytes=0-9".parse().unwrap());
        h.insert(header::IF_MATCH, "\"e\"".parse().unwrap());
        let kept = cross_origin(&h);
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["range", "if-match"]);
    }

    #[test]
    fn a_signed_objects_query_goes_to_its_path_only() {
        let signed = Signed {
            store_path: "/models/m.safetensors".into(),
            path_and_query: "/models/m.safetensors?sig=abc%2Bdef&se=2030".into(),
        };
        let sent = signed
            .apply(uri("https://h:8443/models/m.safetensors"))
            .unwrap();
        assert_eq!(
            sent.to_string(),
            "https://h:8443/models/m.safetensors?sig=abc%2Bdef&se=2030"
        );
        // Another object of the same server, and a request with a query of its own: unchanged.
        for other in [
            "https://h:8443/models/other.safetensors",
            "https://h:8443/models/m.safetensors?x=1",
        ] {
            assert_eq!(signed.apply(uri(other)).unwrap().to_string(), other);
        }
        assert!(!format!("{signed:?}").contains("sig="));
    }

    #[test]
    fn locations_resolve_against_the_url_that_answered() {
        let base = uri("https://a:8443/models/x.safetensors");
        assert_eq!(
            resolve(&base, b"/other/y").unwrap().to_string(),
            "https://a:8443/other/y"
        );
        assert_eq!(
            resolve(&base, b"y").unwrap().to_string(),
            "https://a:8443/models/y"
        );
        assert_eq!(
            resolve(&base, b"http://b/z").unwrap().to_string(),
            "http://b/z"
        );
        assert!(resolve(&base, b"\xff").is_err());
    }
}
