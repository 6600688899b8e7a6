//! `s3://` with no keys anywhere, credentials resolved as the AWS SDKs resolve them: instance
//! metadata (IMDSv2), container credentials (the full-URI endpoint with an authorization token
//! file, as EKS Pod Identity and ECS give), a web identity token exchanged at STS (as pods
//! on Kubernetes get them; STS over TLS only), and a profile's `credential_process`. Each source is a stand-in on loopback
//! (`tests/remote/credential_server.py`) in front of a real S3 server (`s3s-fs`); each hands
//! out credentials that expire within the five minutes before expiry at which the client asks
//! again, so a long on-demand read must refresh them as it goes. A source that refuses the
//! caller is an `Io` error that shows neither the caller's token nor any key.
//!
//! One test, in a program of its own: the configuration is the process's environment, and the
//! TLS roots (`SSL_CERT_FILE`, for the STS stand-in) are read when the first client is made.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{certificate, credential_server, s3, Scratch};
use safetensors_core::{serialize, Dtype, ErrorKind, OpenOptions, SafeFile, TensorView};
use safetensors_remote::{open, RemoteOptions};

const ACCESS_KEY: &str = "AKIDSAFETENSORSCREDS";
const SECRET_KEY: &str = "s3cr3t-SafetensorsCredentialChain-9876";
const POD_TOKEN: &str = "pod-authorization-token-5e1f";
const WEB_TOKEN: &str = "eyJweb-identity-token-a41c";

/// Every variable that names a credential source, cleared before each source is set up (the
/// keys of the environment and the shared files would win over every source tried here).
const SOURCES: [&str; 12] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_METADATA_ENDPOINT",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
];

fn sample() -> Vec<u8> {
    let w: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    serialize([("w", TensorView::new(Dtype::U32, &[1000, 200], &w))], None).unwrap()
}

fn options(on_demand: bool) -> RemoteOptions {
    RemoteOptions {
        first_read: 32,
        part_size: 100_000,
        concurrency: 4,
        max_retries: 0,
        on_demand,
        ..RemoteOptions::default()
    }
}

/// How many credentials `source` has handed out so far.
fn handed_out(log: &Path, source: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').next() == Some(source))
        .count()
}

/// The object read whole, then on demand in four reads 150 ms apart (past the client's 100 ms
/// between fetches of credentials that are about to expire): the same bytes as the local copy
/// each time, and `source` asked again during the long read.
fn reads_with(source: &str, log: &Path, local: &SafeFile) {
    let url = "s3://models/model.safetensors";
    let want = local.tensor_bytes("w").unwrap();
    let whole = open(url, &options(false), OpenOptions::default())
        .unwrap_or_else(|e| panic!("{source}: {e}"));
    assert_eq!(&*whole.tensor_bytes("w").unwrap(), &*want, "{source}");
    let first = handed_out(log, source);
    assert!(first >= 1, "{source} was never asked");
    let lazy = open(url, &options(true), OpenOptions::default()).unwrap();
    let quarter = want.len() / 4;
    for i in 0..4 {
        std::thread::sleep(Duration::from_millis(150));
        let mut got = vec![0u8; quarter];
        lazy.read_data((i * quarter) as u64, &mut got).unwrap();
        assert_eq!(
            got,
            want[i * quarter..(i + 1) * quarter],
            "{source} part {i}"
        );
    }
    assert!(
        handed_out(log, source) > first,
        "{source}: credentials about to expire were not fetched again during the read"
    );
}

/// `open` refused, with no secret in its message.
fn refused(source: &str) {
    let e = open(
        "s3://models/model.safetensors",
        &options(false),
        OpenOptions::default(),
    )
    .err()
    .unwrap_or_else(|| panic!("{source}: opened with a refused caller"));
    assert_eq!(e.kind(), ErrorKind::Io, "{source}: {e}");
    let text = e.to_string();
    assert!(text.contains("s3://models/model.safetensors"), "{text}");
    for secret in [SECRET_KEY, POD_TOKEN, WEB_TOKEN, "wrong-token-6b2d"] {
        assert!(!text.contains(secret), "{source}: {secret} in {text}");
    }
}

#[test]
fn temporary_credentials_come_from_every_source_and_are_refreshed() {
    let root = Scratch::new("creds-root");
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
    let work = Scratch::new("creds-work");
    let (ca, cert, key) = match certificate(&work.0) {
        Ok(made) => made,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    std::env::set_var("SSL_CERT_FILE", &ca);
    let log = work.0.join("handed-out.log");
    let plain = credential_server(
        ACCESS_KEY,
        SECRET_KEY,
        &log,
        &["--pod-token", POD_TOKEN, "--web-token", WEB_TOKEN],
    );
    let tls = credential_server(
        ACCESS_KEY,
        SECRET_KEY,
        &log,
        &[
            "--web-token",
            WEB_TOKEN,
            "--tls",
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
        ],
    );
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();

    let none = work.0.join("none");
    let clean = || {
        for var in SOURCES {
            std::env::remove_var(var);
        }
        // No shared files: their keys would come before every source tried here.
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &none);
        std::env::set_var("AWS_CONFIG_FILE", &none);
        std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", server.port));
        std::env::set_var("AWS_ALLOW_HTTP", "true");
        std::env::set_var("AWS_REGION", "us-east-1");
    };
    let write = |name: &str, text: &str| {
        let path = work.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };

    // Instance metadata (IMDSv2: a session token first, then the role and its credentials).
    clean();
    let imds = format!("http://127.0.0.1:{}", plain.port);
    std::env::set_var("AWS_METADATA_ENDPOINT", &imds);
    reads_with("imds", &log, &local);

    // Container credentials: the full URI and the authorization token read from its file.
    clean();
    let full_uri = format!("http://127.0.0.1:{}/pod-credentials", plain.port);
    std::env::set_var("AWS_CONTAINER_CREDENTIALS_FULL_URI", &full_uri);
    let token_file = write("pod-token", POD_TOKEN);
    std::env::set_var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &token_file);
    reads_with("pod", &log, &local);
    write("pod-token", "wrong-token-6b2d");
    refused("pod");

    // A web identity token exchanged at STS (which is reached over TLS only).
    clean();
    let web_file = write("web-token", WEB_TOKEN);
    std::env::set_var("AWS_WEB_IDENTITY_TOKEN_FILE", &web_file);
    std::env::set_var("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/safetensors");
    std::env::set_var(
        "AWS_ENDPOINT_URL_STS",
        format!("https://127.0.0.1:{}/", tls.port),
    );
    reads_with("sts", &log, &local);
    write("web-token", "wrong-token-6b2d");
    refused("sts");
    // STS over plain HTTP is never asked, even on loopback: a web identity token is a secret.
    write("web-token", WEB_TOKEN);
    let before = handed_out(&log, "sts");
    std::env::set_var(
        "AWS_ENDPOINT_URL_STS",
        format!("http://127.0.0.1:{}/", plain.port),
    );
    refused("sts over http");
    assert_eq!(handed_out(&log, "sts"), before);

    // A profile's credential_process: a command printing credentials as JSON (run by us:
    // object_store has no such provider), which a long read runs again as they near expiry.
    clean();
    let script = write(
        "credential-process.py",
        &format!(
            "import datetime, json, sys\n\
             open(sys.argv[1], 'a').write('process 1\\n')\n\
             if len(sys.argv) > 2: sys.exit(int(sys.argv[2]))\n\
             at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=240)\n\
             print(json.dumps({{'Version': 1, 'AccessKeyId': '{ACCESS_KEY}', \
             'SecretAccessKey': '{SECRET_KEY}', 'SessionToken': 'process-session', \
             'Expiration': at.strftime('%Y-%m-%dT%H:%M:%SZ')}}))\n"
        ),
    );
    let profile = |extra: &str| {
        write(
            "config",
            &format!(
                "[profile proc]\ncredential_process = python3 '{}' '{}'{extra}\n",
                script.display(),
                log.display()
            ),
        )
    };
    std::env::set_var("AWS_CONFIG_FILE", profile(""));
    std::env::set_var("AWS_PROFILE", "proc");
    reads_with("process", &log, &local);
    profile(" 1");
    refused("process");

    clean();
    for var in [
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        "SSL_CERT_FILE",
    ] {
        std::env::remove_var(var);
    }
}
