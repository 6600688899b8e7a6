//! `gs://bucket/object` against fake-gcs-server on loopback (started here): the stores' matrix
//! (`common/stores.rs`: every mode, checkpoints, the hostile corpus, a replaced object), with
//! the endpoint and credentials a service-account key file gives (`GOOGLE_SERVICE_ACCOUNT`;
//! OAuth off, as an emulator takes none) and plain HTTP allowed by `GOOGLE_ALLOW_HTTP`.
//!
//! One test, in a program of its own: the configuration is the process's environment.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::stores::{matrix, Uploader};
use common::{fake_gcs, Scratch};

/// Writes object `key` of bucket `models` through the emulator's JSON API at `port`.
fn upload(port: u16, key: &str, bytes: &[u8]) {
    let name: String = key
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST /upload/storage/v1/b/models/o?uploadType=media&name={name} HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        bytes.len()
    )
    .unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "uploading {key}: {answer}"
    );
}

#[test]
fn gcs_objects_open_as_local_files_do() {
    let server = match fake_gcs() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let work = Scratch::new("gcs");
    let key_file = work.0.join("service-account.json");
    let endpoint = format!("http://127.0.0.1:{}", server.port);
    std::fs::write(
        &key_file,
        format!(
            r#"{{"gcs_base_url": "{endpoint}", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}}"#
        ),
    )
    .unwrap();
    std::env::set_var("GOOGLE_SERVICE_ACCOUNT", &key_file);
    std::env::set_var("GOOGLE_ALLOW_HTTP", "true");

    // The bucket, made through the emulator's JSON API.
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import urllib.request as u; u.urlopen(u.Request('{endpoint}/storage/v1/b', \
             data=b'{{\"name\": \"models\"}}', headers={{'Content-Type': 'application/json'}}))"
        ))
        .status()
        .unwrap();
    assert!(made.success(), "the bucket could not be made");
    // Objects are written through the emulator's JSON API (media upload): its XML API, the
    // one object_store writes through, takes no simple upload.
    let port = server.port;
    let up = Uploader::with(move |key, bytes| upload(port, key, bytes));
    matrix("gs://", "gs://models", &up);

    std::env::remove_var("GOOGLE_SERVICE_ACCOUNT");
    std::env::remove_var("GOOGLE_ALLOW_HTTP");
}
