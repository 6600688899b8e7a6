//! Secrets never leave their request: every message of every failure path, with credentials
//! from the environment, from the AWS shared files, in a URL (user information, a signed
//! query string) and in an endpoint URL, holds none of them; a redirect to another host
//! carries no credential; `[profile default]` in the config file is read.
//!
//! Against s3s-fs and nginx on loopback, with the fault proxy (tests/remote/fault_proxy.py)
//! between. One test, because the configuration is the process's environment, which tests
//! running in parallel threads would otherwise fight over.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{nginx, proxy, proxy_with, s3, Scratch};
use safetensors_core::{serialize, CheckpointOptions, Dtype, OpenOptions, TensorView};
use safetensors_remote::{open, open_checkpoint, RemoteOptions};

const ENV_KEY: &str = "AKIDENVIRONMENTKEY01";
const ENV_SECRET: &str = "envSecret/0123456789+abcdefABCDEF";
const ENV_TOKEN: &str = "envSessionToken-0123456789-abcdef";
const FILE_KEY: &str = "AKIDSHAREDFILESKEY02";
const FILE_SECRET: &str = "fileSecret/9876543210+ZYXWVU";
const FILE_TOKEN: &str = "fileSessionToken-9876543210-zyx";
const URL_PASSWORD: &str = "urlPass/wo?rd#9876";
const ENDPOINT_PASSWORD: &str = "endpointPassword-24680";
const SIGNATURE: &str = "presignedSignature1357924680";
/// The credentials the server itself accepts (never the ones above).
const SERVER_KEY: &str = "AKIDSERVERONLY";
const SERVER_SECRET: &str = "serverSecret-0000000000";

fn sample() -> Vec<u8> {
    let w: Vec<u8> = (0..50_000u32).flat_map(|i| i.to_le_bytes()).collect();
    serialize([("w", TensorView::new(Dtype::U32, &[50_000], &w))], None).unwrap()
}

fn impatient() -> RemoteOptions {
    RemoteOptions {
        max_retries: 1,
        request_timeout: Duration::from_millis(1500),
        connect_timeout: Duration::from_millis(1500),
        ..RemoteOptions::default()
    }
}

/// Every message collected, and what produced it.
#[derive(Default)]
struct Messages(Vec<(String, String)>);

impl Messages {
    /// Records the error of `what`, which must fail.
    fn failed<T>(&mut self, what: &str, result: safetensors_core::Result<T>) {
        match result {
            Ok(_) => panic!("{what}: succeeded, but should have failed"),
            Err(e) => self.0.push((what.to_owned(), e.to_string())),
        }
    }

    fn assert_clean(&self, secrets: &[&str]) {
        assert!(self.0.len() >= 10, "only {} failure paths", self.0.len());
        for (what, text) in &self.0 {
            eprintln!("{what}: {text}");
            for secret in secrets {
                assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
            }
            // Not even a recognisable part of a secret (the part before a `/`).
            for secret in secrets {
                for piece in secret.split(['/', '?', '#', '+']).filter(|p| p.len() >= 8) {
                    assert!(!text.contains(piece), "{what} shows {piece:?}: {text}");
                }
            }
        }
    }
}

fn set_environment_credentials() {
    std::env::set_var("AWS_ACCESS_KEY_ID", ENV_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", ENV_SECRET);
    std::env::set_var("AWS_SESSION_TOKEN", ENV_TOKEN);
    std::env::set_var("AWS_REGION", "us-east-1");
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::remove_var("AWS_VIRTUAL_HOSTED_STYLE_REQUEST");
    std::env::remove_var("AWS_PROFILE");
}

fn clear_environment_credentials() {
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ALLOW_HTTP",
    ] {
        std::env::remove_var(var);
    }
}

/// The requests the logging proxy saw: each one's headers, lower-cased names.
fn logged_headers(log: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            // {"method": ..., "path": ..., "headers": {...}}: the proxy writes JSON with
            // string values only; read the header object's pairs.
            let headers = line.split("\"headers\": {").nth(1).unwrap_or("");
            headers
                .trim_end_matches('}')
                .split("\", \"")
                .filter_map(|pair| {
                    let (k, v) = pair.split_once("\": \"")?;
                    Some((
                        k.trim_matches('"').to_ascii_lowercase(),
                        v.trim_matches('"').to_owned(),
                    ))
                })
                .collect()
        })
        .collect()
}

#[test]
fn secrets_never_leave_their_request() {
    let root = Scratch::new("secrets-root");
    let bucket = root.0.join("models");
    std::fs::create_dir_all(&bucket).unwrap();
    std::fs::write(bucket.join("model.safetensors"), sample()).unwrap();
    let server = match s3(&root.0, SERVER_KEY, SERVER_SECRET) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let web = Scratch::new("secrets-web");
    std::fs::write(web.0.join("model.safetensors"), sample()).unwrap();
    let work = Scratch::new("secrets-nginx");
    let Ok(nginx) = nginx(&web.0, &work.0) else {
        eprintln!("SKIPPED: nginx");
        return;
    };
    let home = Scratch::new("secrets-home");
    std::env::set_var("HOME", &home.0);
    std::env::remove_var("AWS_SHARED_CREDENTIALS_FILE");
    std::env::remove_var("AWS_CONFIG_FILE");
    let mut messages = Messages::default();
    let s3_url = "s3://models/model.safetensors";

    // 1. Credentials from the environment, sent to a server that echoes every header of the
    // request it refuses (the access key id and the session token among them).
    set_environment_credentials();
    let echo = proxy(server.port, "echo403", 0);
    std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", echo.port));
    messages.failed(
        "env: 403 echo",
        open(s3_url, &impatient(), OpenOptions::default()),
    );
    let index = "s3://models/model.safetensors.index.json";
    messages.failed(
        "env: 403 echo of an index",
        open_checkpoint(index, &impatient(), CheckpointOptions::default()),
    );
    // A server failing with 503, retried, then refused.
    let failing = proxy(server.port, "status500", 0);
    std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", failing.port));
    messages.failed(
        "env: 503",
        open(s3_url, &impatient(), OpenOptions::default()),
    );
    // An endpoint with a password in it, nothing listening there.
    let closed = common::free_port();
    std::env::set_var(
        "AWS_ENDPOINT",
        format!("http://admin:{ENDPOINT_PASSWORD}@127.0.0.1:{closed}"),
    );
    messages.failed(
        "env: endpoint password, refused connection",
        open(s3_url, &impatient(), OpenOptions::default()),
    );
    // The real server, which refuses these credentials (its own 403 text).
    std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", server.port));
    messages.failed(
        "env: wrong credentials",
        open(s3_url, &impatient(), OpenOptions::default()),
    );

    // 2. A redirect to another host carries no credential: the endpoint redirects to a logging
    // proxy on another loopback name, which sees the request as it arrives.
    let log = home.0.join("redirected.jsonl");
    let logging = proxy_with(server.port, "none", 0, &["--log", log.to_str().unwrap()]);
    let to = format!("http://localhost:{}", logging.port);
    let redirector = proxy_with(server.port, "redirect-to", 0, &["--to", &to]);
    std::env::set_var(
        "AWS_ENDPOINT",
        format!("http://127.0.0.1:{}", redirector.port),
    );
    messages.failed(
        "env: redirected to another host",
        open(s3_url, &impatient(), OpenOptions::default()),
    );
    let seen = logged_headers(&log);
    assert!(!seen.is_empty(), "the redirect was not followed");
    for headers in &seen {
        for name in [
            "authorization",
            "x-amz-security-token",
            "x-amz-date",
            "cookie",
        ] {
            assert!(
                !headers.contains_key(name),
                "{name} went to another host: {headers:?}"
            );
        }
        assert!(headers.contains_key("range"), "{headers:?}");
    }

    // 3. Credentials from the AWS shared files only; the endpoint from `[profile default]`
    // in the config file (before, ignored: the signed GETs went to AWS instead).
    clear_environment_credentials();
    let aws = home.0.join(".aws");
    std::fs::create_dir_all(&aws).unwrap();
    std::fs::write(
        aws.join("credentials"),
        format!(
            "[default]\naws_access_key_id = {FILE_KEY}\naws_secret_access_key = {FILE_SECRET}\n\
             aws_session_token = {FILE_TOKEN}\n"
        ),
    )
    .unwrap();
    let log = home.0.join("profile.jsonl");
    let echo = proxy_with(server.port, "echo403", 0, &["--log", log.to_str().unwrap()]);
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile default]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:{}\n",
            echo.port
        ),
    )
    .unwrap();
    messages.failed(
        "files: 403 echo",
        open(s3_url, &impatient(), OpenOptions::default()),
    );
    let seen = logged_headers(&log);
    assert!(
        !seen.is_empty(),
        "[profile default]'s endpoint_url was not used"
    );
    assert!(
        seen[0]
            .get("authorization")
            .is_some_and(|a| a.contains(FILE_KEY)),
        "not signed with the shared files' key: {:?}",
        seen[0]
    );
    // An endpoint with a password in the profile.
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = us-east-1\nendpoint_url = http://admin:{ENDPOINT_PASSWORD}@127.0.0.1:{closed}\n"
        ),
    )
    .unwrap();
    messages.failed(
        "files: endpoint password, refused connection",
        open(s3_url, &impatient(), OpenOptions::default()),
    );

    // 4. Secrets in the URL itself: user information holding `/`, `?` and `#` (no parser finds
    // the authority's end), and a signed query string.
    let with_password = format!(
        "http://user:{URL_PASSWORD}@127.0.0.1:{}/model.safetensors",
        nginx.port
    );
    messages.failed(
        "URL password",
        open(&with_password, &impatient(), OpenOptions::default()),
    );
    let s3_password = format!("s3://{FILE_KEY}:{URL_PASSWORD}@models/model.safetensors");
    messages.failed(
        "s3 URL password",
        open(&s3_password, &impatient(), OpenOptions::default()),
    );
    // A signed URL (accepted) refused by a server that echoes the request, its query included.
    let echoing = proxy(nginx.port, "echo403", 0);
    let signed = format!(
        "http://127.0.0.1:{}/model.safetensors?X-Amz-Signature={SIGNATURE}&X-Amz-Credential={FILE_KEY}",
        echoing.port
    );
    messages.failed(
        "signed query, 403 echo",
        open(&signed, &impatient(), OpenOptions::default()),
    );
    let missing_signed = format!(
        "http://127.0.0.1:{}/missing.safetensors?sig={SIGNATURE}",
        nginx.port
    );
    messages.failed(
        "signed query, missing object",
        open(&missing_signed, &impatient(), OpenOptions::default()),
    );
    // A redirect the policy refuses, and one that times out.
    let away = proxy_with(
        nginx.port,
        "redirect-to",
        0,
        &["--to", "http://192.0.2.1:9"],
    );
    let away_url = format!(
        "http://user:{URL_PASSWORD}@127.0.0.1:{}/model.safetensors",
        away.port
    );
    messages.failed(
        "refused redirect",
        open(&away_url, &impatient(), OpenOptions::default()),
    );
    let hung = proxy(nginx.port, "hang", 0);
    std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", hung.port));
    std::env::set_var("AWS_ACCESS_KEY_ID", ENV_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", ENV_SECRET);
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    messages.failed(
        "timed out",
        open(s3_url, &impatient(), OpenOptions::default()),
    );

    clear_environment_credentials();
    messages.assert_clean(&[
        ENV_KEY,
        FILE_KEY,
        ENV_SECRET,
        ENV_TOKEN,
        FILE_SECRET,
        FILE_TOKEN,
        URL_PASSWORD,
        ENDPOINT_PASSWORD,
        SIGNATURE,
    ]);
}
