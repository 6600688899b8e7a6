//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod alloc;
pub mod hang;
pub mod inputs;
pub mod json;
pub mod sharded;

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// A file made of the length prefix, `json` verbatim, and `data_len` bytes of a counting pattern.
pub fn raw_file(json: &str, data_len: usize) -> Vec<u8> {
    raw_file_bytes(json.as_bytes(), data_len)
}

/// Like [`raw_file`] for a header that need not be UTF-8.
pub fn raw_file_bytes(json: &[u8], data_len: usize) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json);
    out.extend((0..data_len).map(|i| (i % 251) as u8));
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh, empty directory under the target dir, unique per test name.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The hostile-file corpus (tests/hostile/make_corpus.py, which needs only the standard
/// library, so any python3 builds it), in a fresh scratch directory `name`; its
/// `manifest.tsv` gives each file's expected error kind.
pub fn hostile_corpus(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile/make_corpus.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&dir)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Cuts the file at `path` to `len` bytes in place, as another process truncating it would.
pub fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// The interop script shared with the C++ tests.
pub fn interop_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/interop.py")
}

/// A Python with `safetensors==0.8.0` and `numpy`, or the reason there is none.
///
/// `SAFETENSORS_PYTHON` names the interpreter (default `python3`). When
/// `SAFETENSORS_REQUIRE_PYTHON=1` (set by the project's test command), a missing Python is a
/// failure rather than a skip.
pub fn python() -> Result<String, String> {
    let py = std::env::var("SAFETENSORS_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&py)
        .args([
            "-c",
            "import numpy, safetensors; assert safetensors.__version__ == '0.8.0', safetensors.__version__",
        ])
        .output();
    let reason = match probe {
        Ok(o) if o.status.success() => return Ok(py),
        Ok(o) => format!(
            "{py} lacks numpy or safetensors==0.8.0: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run {py}: {e}"),
    };
    if std::env::var("SAFETENSORS_REQUIRE_PYTHON").as_deref() == Ok("1") {
        panic!("SAFETENSORS_REQUIRE_PYTHON=1 but {reason}");
    }
    Err(reason)
}

/// Runs `interop.py <cmd> <dir>`; returns its exit code and prints its output.
pub fn run_interop(py: &str, cmd: &str, dir: &Path) -> i32 {
    let out = Command::new(py)
        .arg(interop_script())
        .arg(cmd)
        .arg(dir)
        .output()
        .expect("run interop.py");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    out.status.code().unwrap_or(-1)
}

/// Skips the calling test with a printed reason.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        eprintln!("SKIPPED: {}", format!($($arg)*));
        return;
    }};
}
