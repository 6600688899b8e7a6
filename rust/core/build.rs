//! Compiles the AVX-512 conversion kernels (`src/convert/simd.rs`, `src/convert/streaming.rs`)
//! only with a Rust whose AVX-512 intrinsics are stable (1.89), so the crate still builds with
//! its minimum Rust version, which then runs the AVX2 kernels on every CPU.

use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(avx512_intrinsics)");
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok());
    // "rustc 1.95.0 (…)": the minor number of a 1.x compiler.
    let minor = version.as_deref().and_then(|v| {
        let mut parts = v.split_whitespace().nth(1)?.split('.');
        (parts.next()? == "1").then_some(())?;
        parts.next()?.parse::<u32>().ok()
    });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=avx512_intrinsics");
    }
}
