//! Pre-signed URLs (`?X-Amz-Signature=...`, `?sig=...`, a SAS): the query travels with every
//! request of its object and with no other, redirects to signed URLs are followed by the
//! policy, and no message of any failure path shows the signature.
//!
//! Against nginx on loopback behind the fault proxy's `signed` mode (tests/remote/fault_proxy.py:
//! a request whose query lacks the signature gets 403 with the request, query included, echoed
//! back, as a store checking signatures answers).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{nginx, proxy, proxy_with, same_as_bytes, Scratch, Server};
use safetensors_core::{serialize, CheckpointOptions, Dtype, ErrorKind, OpenOptions, TensorView};
use safetensors_remote::{open, open_checkpoint, RemoteOptions};

/// The signature the signing proxy accepts: long enough to be cut out by value too.
const SIGNATURE: &str = "sig=Pr3s1gnedSignature0246813579";
/// The value alone, as a server might quote it.
const SIGNATURE_VALUE: &str = "Pr3s1gnedSignature0246813579";

fn sample(n: u32) -> Vec<u8> {
    let w: Vec<u8> = (0..n).flat_map(|i| (i * 3).to_le_bytes()).collect();
    let b: Vec<u8> = (0..64u8).collect();
    serialize(
        [
            ("w", TensorView::new(Dtype::U32, &[n as usize], &w)),
            ("b", TensorView::new(Dtype::U8, &[8, 8], &b)),
        ],
        None,
    )
    .unwrap()
}

fn impatient() -> RemoteOptions {
    RemoteOptions {
        max_retries: 1,
        request_timeout: Duration::from_millis(1500),
        connect_timeout: Duration::from_millis(1500),
        ..RemoteOptions::default()
    }
}

struct Served {
    root: Scratch,
    _work: Scratch,
    server: Server,
}

fn serve(tag: &str) -> Option<Served> {
    let root = Scratch::new(&format!("{tag}-root"));
    let work = Scratch::new(&format!("{tag}-nginx"));
    std::fs::write(root.0.join("model.safetensors"), sample(100_000)).unwrap();
    match nginx(&root.0, &work.0) {
        Ok(server) => Some(Served {
            root,
            _work: work,
            server,
        }),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

/// The signing proxy in front of `upstream`, logging every request to `log`.
fn signing(upstream: u16, log: &Path) -> Server {
    proxy_with(
        upstream,
        "signed",
        0,
        &["--query", SIGNATURE, "--log", log.to_str().unwrap()],
    )
}

/// The paths (query included) of the requests the proxy logged.
fn logged_paths(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let after = line.split("\"path\": \"").nth(1).unwrap_or("");
            after.split('"').next().unwrap_or("").to_owned()
        })
        .collect()
}

#[test]
fn a_signed_url_sends_its_query_with_every_request_of_its_object() {
    let Some(s) = serve("signed-every") else {
        return;
    };
    let log = s.root.0.join("requests.jsonl");
    let p = signing(s.server.port, &log);
    let url = format!(
        "http://127.0.0.1:{}/model.safetensors?X-Amz-Expires=60&{SIGNATURE}",
        p.port
    );
    let small_parts = RemoteOptions {
        first_read: 64,
        part_size: 64 * 1024,
        ..RemoteOptions::default()
    };
    for options in [
        small_parts.clone(),
        RemoteOptions {
            on_demand: true,
            ..small_parts
        },
    ] {
        let f = open(&url, &options, OpenOptions::default()).unwrap();
        // The name is the URL without its query.
        assert_eq!(
            f.path(),
            Path::new(&format!("http://127.0.0.1:{}/model.safetensors", p.port))
        );
        same_as_bytes(&f, &sample(100_000));
    }
    let paths = logged_paths(&log);
    // The header in two GETs, 400 KB in parts of 64 KiB, twice over: many requests, each signed.
    assert!(paths.len() > 10, "{paths:?}");
    for path in &paths {
        assert_eq!(
            path,
            &format!("/model.safetensors?X-Amz-Expires=60&{SIGNATURE}"),
            "a request went without the URL's query, or with another"
        );
    }
}

#[test]
fn a_redirect_to_a_signed_url_is_followed() {
    let Some(s) = serve("signed-redirect") else {
        return;
    };
    let log = s.root.0.join("requests.jsonl");
    let signer = signing(s.server.port, &log);
    // A loopback mirror that redirects to the signing server (the request's path and query
    // appended), as a hub redirects to a signed CDN URL.
    let to = format!("http://localhost:{}", signer.port);
    let hub = proxy_with(s.server.port, "redirect-to", 0, &["--to", &to]);
    let url = format!(
        "http://127.0.0.1:{}/model.safetensors?{SIGNATURE}",
        hub.port
    );
    let f = open(&url, &impatient(), OpenOptions::default()).unwrap();
    same_as_bytes(&f, &sample(100_000));
    assert!(
        !logged_paths(&log).is_empty(),
        "the redirect was not followed"
    );
}

#[test]
fn a_signed_index_lends_its_query_to_no_shard() {
    let Some(s) = serve("signed-index") else {
        return;
    };
    std::fs::write(s.root.0.join("a.safetensors"), sample(1000)).unwrap();
    let index = r#"{"metadata": {}, "weight_map": {"w": "a.safetensors", "b": "a.safetensors"}}"#;
    std::fs::write(s.root.0.join("model.safetensors.index.json"), index).unwrap();
    let log = s.root.0.join("requests.jsonl");
    let p = signing(s.server.port, &log);
    let url = format!(
        "http://127.0.0.1:{}/model.safetensors.index.json?{SIGNATURE}",
        p.port
    );
    let ckpt = open_checkpoint(&url, &impatient(), CheckpointOptions::default()).unwrap();
    assert_eq!(
        ckpt.shard_path(0),
        Some(Path::new(&format!(
            "http://127.0.0.1:{}/a.safetensors",
            p.port
        )))
    );
    // The shard is another object: asked for without the index's signature, and refused by
    // a store that wants one; the message says why, and shows no signature.
    let e = ckpt.locate("w").err().expect("the shard is refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains("signed URL"), "{text}");
    assert!(!text.contains(SIGNATURE_VALUE), "{text}");
    let paths = logged_paths(&log);
    assert_eq!(
        paths[0],
        format!("/model.safetensors.index.json?{SIGNATURE}")
    );
    assert!(
        paths[1..].iter().all(|p| p == "/a.safetensors"),
        "a shard was asked for with the index's query: {paths:?}"
    );
}

#[test]
fn no_failure_of_a_signed_url_shows_its_signature() {
    let Some(s) = serve("signed-failures") else {
        return;
    };
    let nginx_port = s.server.port;
    let signed = |port: u16, name: &str| format!("http://127.0.0.1:{port}/{name}?{SIGNATURE}");
    let mut messages: Vec<(String, String)> = Vec::new();
    let mut failed = |what: &str, e: Option<safetensors_core::Error>| match e {
        Some(e) => messages.push((what.to_owned(), e.to_string())),
        None => panic!("{what}: succeeded, but should have failed"),
    };
    let whole = impatient();
    let on_demand = RemoteOptions {
        on_demand: true,
        ..impatient()
    };

    // A store that refuses the signature, echoing the request (its query) in its 403.
    let log = s.root.0.join("refused.jsonl");
    let refusing = proxy_with(
        nginx_port,
        "signed",
        0,
        &["--query", "sig=another", "--log", log.to_str().unwrap()],
    );
    let u = signed(refusing.port, "model.safetensors");
    failed("403 echo", open(&u, &whole, OpenOptions::default()).err());
    let u = signed(refusing.port, "model.safetensors.index.json");
    failed(
        "403 echo of an index",
        open_checkpoint(&u, &whole, CheckpointOptions::default()).err(),
    );
    // No such object.
    let u = signed(nginx_port, "absent.safetensors");
    failed("404", open(&u, &whole, OpenOptions::default()).err());
    // A query holding an `@` before the signature (a credential naming an account, as
    // `X-Goog-Credential=svc@project` does): nothing may be mistaken for user information.
    let u =
        format!("http://127.0.0.1:{nginx_port}/absent.safetensors?cred=svc@project&{SIGNATURE}");
    failed(
        "404, an @ in the query",
        open(&u, &whole, OpenOptions::default()).err(),
    );
    let u = signed(nginx_port, "absent.safetensors.index.json");
    failed(
        "404 of an index",
        open_checkpoint(&u, &whole, CheckpointOptions::default()).err(),
    );
    // A failing server, retried, then given up on.
    let failing = proxy(nginx_port, "status500", 0);
    failed(
        "503",
        open(
            &signed(failing.port, "model.safetensors"),
            &whole,
            OpenOptions::default(),
        )
        .err(),
    );
    // A hung server, at the request timeout and at the deadline.
    let hung = proxy(nginx_port, "hang", 0);
    failed(
        "hung",
        open(
            &signed(hung.port, "model.safetensors"),
            &whole,
            OpenOptions::default(),
        )
        .err(),
    );
    let deadline = RemoteOptions {
        deadline: Some(Duration::from_millis(500)),
        ..impatient()
    };
    failed(
        "hung, deadline",
        open(
            &signed(hung.port, "model.safetensors"),
            &deadline,
            OpenOptions::default(),
        )
        .err(),
    );
    // On demand: the open succeeds, then a read is answered with other bytes or hangs.
    let spoiled = proxy(nginx_port, "range", 1);
    let f = open(
        &signed(spoiled.port, "model.safetensors"),
        &on_demand,
        OpenOptions::default(),
    )
    .unwrap();
    failed("on demand, wrong range", f.tensor_bytes("w").err());
    let hangs_later = proxy(nginx_port, "hang", 1);
    let f = open(
        &signed(hangs_later.port, "model.safetensors"),
        &on_demand,
        OpenOptions::default(),
    )
    .unwrap();
    failed("on demand, hung", f.tensor_bytes("w").err());
    // A redirect the policy refuses (to plain http on another host), the signature in the
    // target's URL too; and a redirect loop.
    let away = proxy_with(
        nginx_port,
        "redirect-to",
        0,
        &["--to", "http://192.0.2.1:9"],
    );
    failed(
        "refused redirect",
        open(
            &signed(away.port, "model.safetensors"),
            &whole,
            OpenOptions::default(),
        )
        .err(),
    );
    let looping = proxy(nginx_port, "redirect", 0);
    failed(
        "redirect loop",
        open(
            &signed(looping.port, "model.safetensors"),
            &whole,
            OpenOptions::default(),
        )
        .err(),
    );
    // Nothing listening.
    let closed = common::free_port();
    failed(
        "refused connection",
        open(
            &signed(closed, "model.safetensors"),
            &whole,
            OpenOptions::default(),
        )
        .err(),
    );
    // A checkpoint whose index is signed and whose shards need signatures of their own.
    std::fs::write(s.root.0.join("a.safetensors"), sample(1000)).unwrap();
    let index = r#"{"metadata": {}, "weight_map": {"w": "a.safetensors"}}"#;
    std::fs::write(s.root.0.join("model.safetensors.index.json"), index).unwrap();
    let signer = proxy_with(nginx_port, "signed", 0, &["--query", SIGNATURE]);
    let u = signed(signer.port, "model.safetensors.index.json");
    let ckpt = open_checkpoint(&u, &whole, CheckpointOptions::default()).unwrap();
    failed("an unsigned shard", ckpt.locate("w").err());

    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains(SIGNATURE_VALUE),
        "the refusing server never saw the signature, so its echo proves nothing"
    );
    assert!(messages.len() >= 12, "{}", messages.len());
    for (what, text) in &messages {
        eprintln!("{what}: {text}");
        assert!(
            !text.contains(SIGNATURE_VALUE),
            "{what} shows the signature: {text}"
        );
        assert!(text.contains("http://"), "{what} names no URL: {text}");
    }
}
