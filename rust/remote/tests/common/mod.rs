//! Real servers on loopback for the remote tests, started by the tests themselves: Debian's
//! nginx serving a directory (range requests, ETags, `If-Match`), an S3-compatible server
//! (`s3s-fs`), and the fault-injecting proxy (tests/remote/fault_proxy.py) between client and
//! server. A missing server skips its tests with a message, unless
//! `SAFETENSORS_REQUIRE_SERVERS=1` (tests/run sets it under CI), which makes that a failure.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use safetensors_core::{OpenOptions, SafeFile};

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "safetensors-remote-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Why a server is missing: a skip, or a failure when servers are required.
pub fn missing(reason: String) -> String {
    if std::env::var("SAFETENSORS_REQUIRE_SERVERS").as_deref() == Ok("1") {
        panic!("SAFETENSORS_REQUIRE_SERVERS=1 but {reason} (.ci/setup tests installs it)");
    }
    reason
}

/// Skips the calling test with a printed reason.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        eprintln!("SKIPPED: {}", format!($($arg)*));
        return;
    }};
}

/// A port free right now on 127.0.0.1 (for servers that cannot be told to pick one).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(port: u16, child: &mut Child, what: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on port {port} within 20 s");
}

/// A child process killed (and reaped) on drop.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(program: &str, extra: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .chain(extra.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// nginx serving `root` on a port of its own, or why there is none. Every request is logged
/// to `work/access.log` as `Range status body-bytes` (see [`access_log`]).
pub fn nginx(root: &Path, work: &Path) -> Result<Server, String> {
    let Some(bin) = find("nginx", &["/usr/sbin/nginx"]) else {
        return Err(missing(
            "nginx is not installed (apt-get install nginx)".into(),
        ));
    };
    let port = free_port();
    let conf = work.join("nginx.conf");
    let w = work.display();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {w}/nginx.pid;\n\
             error_log {w}/error.log;\nevents {{ worker_connections 256; }}\n\
             http {{\n  log_format ranges '$http_range $status $body_bytes_sent';\n\
             access_log {w}/access.log ranges;\n  client_body_temp_path {w}/body;\n\
             proxy_temp_path {w}/proxy;\n  fastcgi_temp_path {w}/fastcgi;\n\
             uwsgi_temp_path {w}/uwsgi;\n  scgi_temp_path {w}/scgi;\n\
             default_type application/octet-stream;\n\
             server {{ listen 127.0.0.1:{port}; root {}; }}\n}}\n",
            root.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(bin)
        .arg("-p")
        .arg(work)
        .arg("-e")
        .arg(work.join("error.log"))
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| missing(format!("cannot start nginx: {e}")))?;
    wait_for(port, &mut child, "nginx");
    Ok(Server { child, port })
}

/// The fault proxy in front of `upstream`, spoiling every GET after the first `after`.
pub fn proxy(upstream: u16, fault: &str, after: usize) -> Server {
    proxy_with(upstream, fault, after, &[])
}

/// [`proxy`] with more of the proxy's arguments (`--to URL`, `--log FILE`, `--tls CERT KEY`).
pub fn proxy_with(upstream: u16, fault: &str, after: usize, more: &[&str]) -> Server {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/remote/fault_proxy.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(upstream.to_string())
        .arg(fault)
        .arg("--after")
        .arg(after.to_string())
        .args(more)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("python3 runs the fault proxy");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the proxy prints its port");
    wait_for(port, &mut child, "the fault proxy");
    Server { child, port }
}

/// The credential stand-ins (`tests/remote/credential_server.py`) handing out `access` and
/// `secret` with session tokens, logging each hand-out to `log`; `more` are its options
/// (`--tls CERT KEY`, `--pod-token TEXT`, `--web-token TEXT`, `--ttl SECONDS`).
pub fn credential_server(access: &str, secret: &str, log: &Path, more: &[&str]) -> Server {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/remote/credential_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(access)
        .arg(secret)
        .arg("--log")
        .arg(log)
        .args(more)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("python3 runs the credential stand-ins");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the stand-ins print their port");
    wait_for(port, &mut child, "the credential stand-ins");
    Server { child, port }
}

/// fake-gcs-server (the GCS emulator object_store itself tests with) on loopback over plain
/// HTTP, objects in memory, or why there is none.
pub fn fake_gcs() -> Result<Server, String> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let go_bin = home.join("go/bin/fake-gcs-server");
    let Some(bin) = find("fake-gcs-server", &[go_bin.to_str().unwrap_or("")]) else {
        return Err(missing(
            "fake-gcs-server is not installed (go install github.com/fsouza/fake-gcs-server)"
                .into(),
        ));
    };
    let port = free_port();
    let mut child = Command::new(bin)
        .args([
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-backend",
            "memory",
        ])
        .args(["-log-level", "error", "-port", &port.to_string()])
        // Requests to this host are the XML API's (`/bucket/object`), which object_store speaks.
        .args(["-public-host", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| missing(format!("cannot start fake-gcs-server: {e}")))?;
    wait_for(port, &mut child, "fake-gcs-server");
    Ok(Server { child, port })
}

/// Azurite's blob service (the Azure Storage emulator object_store itself tests with) on
/// loopback, its data in `work`, or why there is none.
pub fn azurite(work: &Path) -> Result<Server, String> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let npm_bin = home.join(".local/share/safetensors-ci/azurite/node_modules/.bin/azurite-blob");
    let Some(bin) = find("azurite-blob", &[npm_bin.to_str().unwrap_or("")]) else {
        return Err(missing(
            "Azurite is not installed (npm install azurite; .ci/setup tests installs it)".into(),
        ));
    };
    let port = free_port();
    let mut child = Command::new(bin)
        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
        .args([
            "--silent",
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--location",
        ])
        .arg(work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| missing(format!("cannot start Azurite: {e}")))?;
    wait_for(port, &mut child, "Azurite");
    Ok(Server { child, port })
}

/// An S3-compatible server (`s3s-fs`) over `root` (each subdirectory a bucket) with these
/// credentials, or why there is none.
pub fn s3(root: &Path, access_key: &str, secret_key: &str) -> Result<Server, String> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cargo_bin = home.join(".cargo/bin/s3s-fs");
    let Some(bin) = find("s3s-fs", &[cargo_bin.to_str().unwrap_or("")]) else {
        return Err(missing(
            "s3s-fs is not installed (cargo install s3s-fs --version 0.14.1 --locked --features binary)"
                .into(),
        ));
    };
    let port = free_port();
    let mut child = Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", access_key, "--secret-key", secret_key])
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| missing(format!("cannot start s3s-fs: {e}")))?;
    wait_for(port, &mut child, "s3s-fs");
    Ok(Server { child, port })
}

/// The requests nginx served from `work` so far: (the Range header, the status, the body
/// bytes sent), in order.
#[allow(dead_code)] // not every test program reads it
pub fn access_log(work: &Path) -> Vec<(String, u16, u64)> {
    std::fs::read_to_string(work.join("access.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// A certificate authority and a certificate it signed for `127.0.0.1` and `localhost`, with
/// its key, made by `openssl` in `dir`: (authority, certificate, key), or why there are none.
pub fn certificate(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let (ca, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let (csr, ext) = (dir.join("leaf.csr"), dir.join("leaf.ext"));
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let p = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let steps: [Vec<String>; 3] = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-keyout".into(), p(&ca_key), "-out".into(), p(&ca)])
        .collect(),
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-keyout".into(), p(&key), "-out".into(), p(&csr)])
        .collect(),
        ["x509", "-req", "-days", "2", "-CAcreateserial"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                "-in".into(),
                p(&csr),
                "-CA".into(),
                p(&ca),
                "-CAkey".into(),
                p(&ca_key),
            ])
            .chain(["-extfile".into(), p(&ext), "-out".into(), p(&cert)])
            .collect(),
    ];
    for args in steps {
        let made = Command::new("openssl")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match made {
            Ok(status) if status.success() => {}
            Ok(status) => {
                return Err(missing(format!(
                    "openssl could not make a certificate: {status}"
                )))
            }
            Err(e) => {
                return Err(missing(format!(
                    "openssl is not installed ({e}; apt-get install openssl)"
                )))
            }
        }
    }
    Ok((ca, cert, key))
}

/// The open file descriptors of this process that are sockets.
pub fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// `remote` holds what `local` holds: the same tensors, bytes and metadata.
pub fn same_tensors(remote: &SafeFile, local: &SafeFile) {
    assert_eq!(remote.header().len(), local.header().len());
    assert_eq!(remote.header().metadata(), local.header().metadata());
    for info in local.header().iter() {
        assert_eq!(
            remote.tensor_bytes(info.name).unwrap(),
            local.tensor_bytes(info.name).unwrap(),
            "{}",
            info.name
        );
    }
}

/// `remote` holds what the file `bytes` holds.
pub fn same_as_bytes(remote: &SafeFile, bytes: &[u8]) {
    let local =
        SafeFile::from_memory("local", Box::new(bytes.to_vec()), OpenOptions::default()).unwrap();
    same_tensors(remote, &local);
}

pub mod stores;
