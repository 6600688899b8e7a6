//! `az://container/blob` against Azurite on loopback (started here): the stores' matrix
//! (`common/stores.rs`: every mode, checkpoints, the hostile corpus, a replaced object) with
//! the emulator's account and key (`AZURE_STORAGE_USE_EMULATOR`, `AZURITE_BLOB_STORAGE_URL`),
//! then with an account key given in `AZURE_STORAGE_ACCOUNT_KEY` (a wrong one refused, and never
//! shown).
//!
//! One test, in a program of its own: the configuration is the process's environment.

mod common;

use std::sync::Arc;

use common::stores::{matrix, Uploader};
use common::{azurite, Scratch};
use object_store::azure::MicrosoftAzureBuilder;
use safetensors_core::{ErrorKind, OpenOptions};
use safetensors_remote::{open, RemoteOptions};

/// Azurite's well-known development account key (public: every Azure Storage emulator has it).
const EMULATOR_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

#[test]
fn azure_blobs_open_as_local_files_do() {
    let work = Scratch::new("azurite");
    let server = match azurite(&work.0) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let endpoint = format!("http://127.0.0.1:{}", server.port);
    std::env::set_var("AZURE_STORAGE_USE_EMULATOR", "true");
    std::env::set_var("AZURITE_BLOB_STORAGE_URL", &endpoint);
    let store = MicrosoftAzureBuilder::new()
        .with_use_emulator(true)
        .with_container_name("models")
        .build()
        .unwrap();
    // The container, made through the store's own client: Azurite starts with none.
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(CREATE_CONTAINER)
        .arg(&endpoint)
        .arg(EMULATOR_KEY)
        .status()
        .unwrap();
    assert!(made.success(), "the container could not be made");
    let up = Uploader::store(Arc::new(store));
    matrix("az://", "az://models", &up);

    // The account key given, right then wrong: the wrong one refused and never shown.
    std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", EMULATOR_KEY);
    let options = RemoteOptions {
        max_retries: 0,
        ..RemoteOptions::default()
    };
    let url = "az://models/model.safetensors";
    open(url, &options, OpenOptions::default()).unwrap();
    let wrong = "V3JvbmdBY2NvdW50S2V5VGhhdE11c3ROb3RCZVNob3du";
    std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", wrong);
    let e = open(url, &options, OpenOptions::default())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let text = e.to_string();
    assert!(text.contains(url), "{text}");
    for secret in [wrong, EMULATOR_KEY] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    for var in [
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_USE_EMULATOR",
        "AZURITE_BLOB_STORAGE_URL",
    ] {
        std::env::remove_var(var);
    }
}

/// Creates the container `models` in the emulator at argv[1] with the account key argv[2]
/// (Shared Key, as the Blob service documents it: the string to sign of a PUT with no body).
const CREATE_CONTAINER: &str = r#"
import base64, hashlib, hmac, http.client, sys
from email.utils import formatdate
from urllib.parse import urlsplit
endpoint, key = urlsplit(sys.argv[1]), sys.argv[2]
account, date, version = "devstoreaccount1", formatdate(usegmt=True), "2021-08-06"
to_sign = ("PUT" + "\n" * 12 + f"x-ms-date:{date}\nx-ms-version:{version}\n"
           + f"/{account}/{account}/models\nrestype:container")
mac = hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()
headers = {"x-ms-date": date, "x-ms-version": version, "Content-Length": "0",
           "Authorization": f"SharedKey {account}:{base64.b64encode(mac).decode()}"}
connection = http.client.HTTPConnection(endpoint.hostname, endpoint.port)
connection.request("PUT", f"/{account}/models?restype=container", headers=headers)
answer = connection.getresponse()
sys.exit(0 if answer.status == 201 else f"{answer.status} {answer.read()[:300]}")
"#;
