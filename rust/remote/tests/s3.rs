//! Remote files on a real S3-compatible server (`s3s-fs` on loopback, started here): signed
//! requests with credentials, region and endpoint from the AWS_* environment variables or the
//! AWS shared files' profile,
//! path-style addressing, the hostile corpus, a replaced object (the version pin), and
//! credentials kept out of every message.
//!
//! One test, because the configuration is the process's environment, which tests running in
//! parallel threads would otherwise fight over.

mod common;

use common::{s3, Scratch};
use safetensors_core::{serialize, Dtype, ErrorKind, OpenOptions, SafeFile, TensorView};
use safetensors_remote::{open, open_header, RemoteOptions};

const ACCESS_KEY: &str = "AKIDSAFETENSORSTEST";
const SECRET_KEY: &str = "s3cr3t-SafetensorsTestKey-0123456789";

fn sample() -> Vec<u8> {
    let w: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    serialize([("w", TensorView::new(Dtype::U32, &[1000, 200], &w))], None).unwrap()
}

fn many_parts() -> RemoteOptions {
    RemoteOptions {
        first_read: 32,
        part_size: 100_000,
        concurrency: 4,
        max_retries: 0,
        ..RemoteOptions::default()
    }
}

fn configure(port: u16, secret: &str) {
    std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{port}"));
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::set_var("AWS_REGION", "us-east-1");
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", secret);
    std::env::remove_var("AWS_SESSION_TOKEN");
    std::env::remove_var("AWS_VIRTUAL_HOSTED_STYLE_REQUEST");
}

#[test]
fn s3_objects_open_as_local_files_do() {
    let root = Scratch::new("s3-root");
    let bucket = root.0.join("models");
    std::fs::create_dir_all(&bucket).unwrap();
    let bytes = sample();
    std::fs::write(bucket.join("model.safetensors"), &bytes).unwrap();
    let server = match s3(&root.0, ACCESS_KEY, SECRET_KEY) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    configure(server.port, SECRET_KEY);
    let local =
        SafeFile::from_memory("local", Box::new(bytes.clone()), OpenOptions::default()).unwrap();

    // Every byte, in parts, signed.
    let url = "s3://models/model.safetensors";
    let remote = open(url, &many_parts(), OpenOptions::default()).unwrap();
    assert_eq!(
        &*remote.tensor_bytes("w").unwrap(),
        &*local.tensor_bytes("w").unwrap()
    );

    // On demand: the same bytes, each read fetched when made, signed as well.
    let on_demand = RemoteOptions {
        on_demand: true,
        ..many_parts()
    };
    let remote = open(url, &on_demand, OpenOptions::default()).unwrap();
    assert!(!remote.is_in_memory());
    assert_eq!(
        &*remote.tensor_bytes("w").unwrap(),
        &*local.tensor_bytes("w").unwrap()
    );

    // A missing key: `Io`, naming the URL.
    let e = open(
        "s3://models/absent.safetensors",
        &many_parts(),
        OpenOptions::default(),
    )
    .err()
    .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.to_string().contains("s3://models/absent.safetensors"),
        "{e}"
    );

    // The hostile corpus: the kinds a local file gets.
    let corpus = Scratch::new("s3-corpus");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile/make_corpus.py");
    let made = std::process::Command::new("python3")
        .arg(script)
        .arg(&corpus.0)
        .output()
        .unwrap();
    assert!(made.status.success());
    let manifest = std::fs::read_to_string(corpus.0.join("manifest.tsv")).unwrap();
    let hostile = root.0.join("hostile");
    std::fs::create_dir_all(&hostile).unwrap();
    let mut checked = 0;
    for line in manifest.lines() {
        let name = line.split('\t').next().unwrap();
        let path = corpus.0.join(name);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        std::fs::copy(&path, hostile.join(name)).unwrap();
        let local = SafeFile::open(&path, safetensors_core::Backend::Read);
        let url = format!("s3://hostile/{name}");
        let remote = open(&url, &many_parts(), OpenOptions::default());
        match (local, remote) {
            (Ok(_), Ok(_)) => {}
            (Err(l), Err(r)) => {
                assert_eq!(r.kind(), l.kind(), "{name}: from disk {l}; from S3 {r}");
                assert!(r.to_string().contains(&url), "{name}: {r}");
            }
            (l, r) => panic!(
                "{name}: from disk {}, from S3 {}",
                l.is_ok(),
                r.map(|_| ()).map_err(|e| e.to_string()).is_ok()
            ),
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} corpus files checked");

    // An object replaced after its header was read: the pinned ETag no longer matches (the
    // fault proxy cannot do this one: `If-Match` is a signed header).
    let object = open_header(url, &many_parts(), OpenOptions::default()).unwrap();
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    std::fs::write(bucket.join("model.safetensors"), &other).unwrap();
    let e = object.fetch_all().expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("changed"), "{e}");

    // Wrong credentials: refused, and no credential in the message.
    let wrong = "WrongSecretKeyThatMustNotBeShown-987654321";
    configure(server.port, wrong);
    let e = open(url, &many_parts(), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains(url), "{text}");
    for secret in [wrong, SECRET_KEY, ACCESS_KEY] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }

    // No AWS_* keys, region or endpoint in the environment: the shared files' profile gives
    // them (credentials file: the keys; config file: region and a plain-HTTP endpoint).
    std::fs::write(bucket.join("model.safetensors"), &bytes).unwrap();
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT",
        "AWS_ALLOW_HTTP",
        "AWS_REGION",
    ] {
        std::env::remove_var(var);
    }
    let files = Scratch::new("s3-profile");
    let credentials = files.0.join("credentials");
    let config = files.0.join("config");
    let write_profile = |secret: &str| {
        std::fs::write(
            &credentials,
            format!(
                "[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n\
                 [bench]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {secret}\n"
            ),
        )
        .unwrap();
    };
    write_profile(SECRET_KEY);
    std::fs::write(
        &config,
        format!(
            "[profile bench]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:{}\n",
            server.port
        ),
    )
    .unwrap();
    std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &credentials);
    std::env::set_var("AWS_CONFIG_FILE", &config);
    std::env::set_var("AWS_PROFILE", "bench");
    let remote = open(url, &many_parts(), OpenOptions::default()).unwrap();
    assert_eq!(
        &*remote.tensor_bytes("w").unwrap(),
        &*local.tensor_bytes("w").unwrap()
    );
    // A profile with a wrong secret: refused, and neither key shown.
    write_profile(wrong);
    let e = open(url, &many_parts(), OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    for secret in [wrong, ACCESS_KEY] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    for var in [
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        "AWS_PROFILE",
    ] {
        std::env::remove_var(var);
    }
}
