//! Redirects from https: followed to https (another host included), never to plain http,
//! against the fault proxy serving TLS on loopback with a certificate made for the test
//! (trusted through `SSL_CERT_FILE`, which the TLS roots are read from). Before, an https URL
//! redirected to http was followed, and its bytes came in clear.
//!
//! A test program of its own: the roots are read when the process's first client is made.

mod common;

use common::{certificate, nginx, proxy_with, Scratch};
use safetensors_core::{serialize, Dtype, ErrorKind, OpenOptions, TensorView};
use safetensors_remote::{open, RemoteOptions};

#[test]
fn https_redirects_never_lead_to_plain_http() {
    let w: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let bytes = serialize([("w", TensorView::new(Dtype::U32, &[10_000], &w))], None).unwrap();
    let root = Scratch::new("tls-root");
    let work = Scratch::new("tls-nginx");
    std::fs::write(root.0.join("model.safetensors"), &bytes).unwrap();
    let server = match nginx(&root.0, &work.0) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let (ca, cert, key) = match certificate(&work.0) {
        Ok(made) => made,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    std::env::set_var("SSL_CERT_FILE", &ca);
    let tls = ["--tls", cert.to_str().unwrap(), key.to_str().unwrap()];
    let options = RemoteOptions {
        max_retries: 0,
        ..RemoteOptions::default()
    };

    // TLS itself works: the same object through the TLS proxy reads whole.
    let direct = proxy_with(server.port, "none", 0, &tls);
    let u = format!("https://127.0.0.1:{}/model.safetensors", direct.port);
    let f = open(&u, &options, OpenOptions::default()).unwrap();
    assert_eq!(&*f.tensor_bytes("w").unwrap(), &w[..]);

    // https to https on another host: followed.
    let to = format!("https://localhost:{}", direct.port);
    let mut args = vec!["--to", to.as_str()];
    args.extend_from_slice(&tls);
    let onwards = proxy_with(server.port, "redirect-to", 0, &args);
    let u = format!("https://127.0.0.1:{}/model.safetensors", onwards.port);
    let f = open(&u, &options, OpenOptions::default()).unwrap();
    assert_eq!(&*f.tensor_bytes("w").unwrap(), &w[..]);

    // https to http, even on the same loopback host: refused before any byte comes in clear.
    let served = || {
        std::fs::read_to_string(work.0.join("access.log"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = served();
    let to = format!("http://127.0.0.1:{}", server.port);
    let mut args = vec!["--to", to.as_str()];
    args.extend_from_slice(&tls);
    let down = proxy_with(server.port, "redirect-to", 0, &args);
    let u = format!("https://127.0.0.1:{}/model.safetensors", down.port);
    let e = open(&u, &options, OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&u) && text.contains("may not leave https"),
        "{text}"
    );
    assert_eq!(served(), before, "nginx served a request in clear");
}
