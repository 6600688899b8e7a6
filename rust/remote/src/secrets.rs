//! The one redaction point: every message about a remote object (errors of every kind, and so
//! what the C API, the C++ API and the CLI's `--json` show) is made by `error::remote`, which
//! passes its text through [`scrub`] before anything else sees it.
//!
//! What is cut out:
//! - every secret the library was handed or read: the credential variables of the environment
//!   (read at each scrub, so a variable set after an open is covered too), and every value
//!   [`register`]ed by the code that reads one (the AWS shared files' keys and tokens, the
//!   user information of an endpoint URL, the values of a URL's query string);
//! - from any URL in the text, its user information, query and fragment (a server or a library
//!   quoting a request URL, a pre-signed URL's signature), by the core's `redact_url` rule.
//!
//! Registered secrets are kept for the life of the process, in a list without locks (a child
//! made by `fork` keeps them and can never find the list locked).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use safetensors_core::redact_url;

/// Values shorter than this are not cut out of texts by value (they would match ordinary words
/// and numbers); inside a URL they are cut out with the rest of its user information or query.
const MIN_SECRET: usize = 6;

/// At most this many registered values; later ones are still cut out of URLs by the URL rule.
/// Each distinct credential counts once, so a process holds a handful.
const MAX_SECRETS: usize = 4096;

/// Environment variables whose values are credentials, of every store the library reads.
const SECRET_VARIABLES: [&str; 16] = [
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN",
    "AZURE_MSI_RESOURCE_ID",
];

struct Node {
    secret: String,
    next: *mut Node,
}

static HEAD: AtomicPtr<Node> = AtomicPtr::new(std::ptr::null_mut());
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The registered secrets, newest first.
fn registered() -> impl Iterator<Item = &'static str> {
    let mut at = HEAD.load(Ordering::Acquire);
    std::iter::from_fn(move || {
        // SAFETY: nodes are published fully made and never freed.
        let node = unsafe { at.as_ref() }?;
        at = node.next;
        Some(node.secret.as_str())
    })
}

/// Remembers `secret` so that no message shows it from now on.
pub(crate) fn register(secret: &str) {
    if secret.len() < MIN_SECRET || registered().any(|s| s == secret) {
        return;
    }
    if COUNT.fetch_add(1, Ordering::Relaxed) >= MAX_SECRETS {
        return;
    }
    let node = Box::into_raw(Box::new(Node {
        secret: secret.to_owned(),
        next: std::ptr::null_mut(),
    }));
    let mut head = HEAD.load(Ordering::Acquire);
    loop {
        // SAFETY: `node` is ours until the exchange below publishes it.
        unsafe { (*node).next = head };
        match HEAD.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

/// Registers what of `url` is secret: its user information (name and password, decoded and as
/// written) and each value of its query string.
pub(crate) fn register_url(url: &str) {
    let Some((_, rest)) = url.split_once("://") else {
        return;
    };
    // Everything up to the last `@` may be user information (a password may hold `/`, `?` or
    // `#`, so the authority cannot be told apart by those).
    if let Some(at) = rest.rfind('@') {
        let info = &rest[..at];
        register(info);
        for part in info.split(':') {
            register(part);
            register(&percent_decoded(part));
        }
    }
    if let Some((_, query)) = rest.split_once('?') {
        let query = query.split('#').next().unwrap_or("");
        for pair in query.split('&') {
            let value = pair.split_once('=').map_or(pair, |(_, v)| v);
            register(value);
            register(&percent_decoded(value));
        }
    }
}

fn percent_decoded(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// `text` with every secret cut out (see the module comment), whitespace folded (servers answer
/// with HTML pages), and at most `max` bytes (cut on a character boundary, `...` appended).
pub(crate) fn scrub(text: &str, max: usize) -> String {
    let mut out = redact_urls(&text.split_whitespace().collect::<Vec<_>>().join(" "));
    let env: Vec<String> = SECRET_VARIABLES
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .collect();
    let mut secrets: Vec<&str> = env.iter().map(String::as_str).collect();
    for s in registered() {
        secrets.push(s);
    }
    secrets.retain(|s| s.len() >= MIN_SECRET);
    // Longest first, so that a secret holding another is cut out whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        if out.contains(secret) {
            out = out.replace(secret, "<redacted>");
        }
    }
    if out.len() > max {
        let mut end = max;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str(" ...");
    }
    out
}

/// `text` with every URL in it (a scheme, `://`, then up to a space or a quoting character) as
/// `redact_url` shows it: no user information, query or fragment.
fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |k| k + 1);
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |k| i + k);
        out.push_str(&rest[..start]);
        let url = &rest[start..end];
        let shown = redact_url(url);
        out.push_str(&shown);
        if url.contains('?') {
            out.push_str("?<redacted>");
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_values_and_url_parts_never_show() {
        register("reg-0123456789-secret");
        register_url("https://bob:pa%2Fss-word@host/x?X-Amz-Signature=sig0123456789&a=b");
        let text = scrub(
            "403: <Token>reg-0123456789-secret</Token> bob:pa/ss-word sig0123456789 \
             GET https://u:p/a?s#s@host:9/k?X-Amz-Signature=zzz9876543210 done",
            600,
        );
        for secret in [
            "reg-0123456789-secret",
            "pa/ss-word",
            "sig0123456789",
            "zzz9876543210",
            "p/a?s#s",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("https://<redacted>?<redacted> done"),
            "{text}"
        );
    }

    #[test]
    fn credentials_of_the_environment_never_show() {
        // A variable no other test of this crate sets or reads.
        std::env::set_var("AWS_CONTAINER_AUTHORIZATION_TOKEN", "tok-0123456789-secret");
        let text = scrub(
            "403 Forbidden: <Error>\n  <Token>tok-0123456789-secret</Token></Error>",
            600,
        );
        std::env::remove_var("AWS_CONTAINER_AUTHORIZATION_TOKEN");
        assert_eq!(
            text,
            "403 Forbidden: <Error> <Token><redacted></Token></Error>"
        );
    }

    #[test]
    fn scrub_bounds_the_length_on_a_character_boundary() {
        let text = scrub(&"é".repeat(1000), 600);
        assert!(
            text.len() <= 604 && text.ends_with(" ..."),
            "{}",
            text.len()
        );
    }
}
