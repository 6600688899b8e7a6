//! Generates and compiles the C++ side of the bridge, then copies the generated header and
//! `cxx.h` to `$SAFETENSORS_CXX_INCLUDE_DIR/safetensors/ffi/` when CMake asks for them.
//!
//! The generated header includes `"rust/cxx.h"`; placing `cxx.h` at `ffi/rust/cxx.h` beside it
//! resolves that include relative to the header itself, so installs never need a global
//! `include/rust/` directory.

use std::path::{Path, PathBuf};

fn main() {
    cxx_build::CFG.include_prefix = "safetensors/ffi";
    // Default visibility: libsafetensors.so (cmake/SafetensorsShared.cmake) exports these C++
    // functions through its version script, which cannot export hidden symbols. Their names are
    // ours (namespace safetensors), so they cannot collide with another library's.
    // No exceptions: the bridge reports every outcome through a status and never throws (see
    // src/lib.rs), and this flag makes that a compile-time rule (cxx's `Result` would need them).
    cxx_build::bridge("src/lib.rs")
        .std("c++17")
        .flag_if_supported("-fno-exceptions")
        .compile("safetensors_cxx_bridge");
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-env-changed=SAFETENSORS_CXX_INCLUDE_DIR");
    write_version_symbol();

    let Some(dest) = std::env::var_os("SAFETENSORS_CXX_INCLUDE_DIR") else {
        return;
    };
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let generated = out.join("cxxbridge/include");
    let ffi = Path::new(&dest).join("safetensors/ffi");
    for (from, to) in [
        (
            generated.join("safetensors/ffi/src/lib.rs.h"),
            ffi.join("lib.rs.h"),
        ),
        (generated.join("rust/cxx.h"), ffi.join("rust/cxx.h")),
    ] {
        copy_if_changed(&from, &to);
        // If a copy is deleted (a `clean` that removes byproducts), run again to restore it.
        println!("cargo:rerun-if-changed={}", to.display());
    }
}

/// Checks that Cargo's version is the one `include/safetensors/version.hpp` declares (that header
/// is where the version is written; CMake reads it too), and generates the function named after
/// it that every program including the headers references, so that headers and library of
/// different versions fail to link.
fn write_version_symbol() {
    let header = "../../include/safetensors/version.hpp";
    println!("cargo:rerun-if-changed={header}");
    let text = std::fs::read_to_string(header).unwrap_or_else(|e| panic!("read {header}: {e}"));
    let part = |name: &str| -> u32 {
        let macro_name = format!("#define SAFETENSORS_VERSION_{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(macro_name.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{header} lacks `{macro_name}<number>`"))
    };
    let (major, minor, patch) = (part("MAJOR"), part("MINOR"), part("PATCH"));
    let cargo = std::env::var("CARGO_PKG_VERSION").expect("CARGO_PKG_VERSION");
    assert_eq!(
        cargo,
        format!("{major}.{minor}.{patch}"),
        "Cargo.toml's version differs from {header}: change both together"
    );
    let code = format!(
        "/// The library's version, `major << 16 | minor << 8 | patch`, under a name that only this \
         version defines (see include/safetensors/version.hpp).\n\
         #[no_mangle]\n\
         pub extern \"C\" fn safetensors_library_v{major}_{minor}_{patch}() -> u32 {{\n    \
         {}\n}}\n",
        (major << 16) | (minor << 8) | patch
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("version.rs");
    if std::fs::read_to_string(&out).ok().as_deref() != Some(code.as_str()) {
        std::fs::write(&out, code).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
    }
}

/// Rewrites `to` only when its content differs, so that builds stay incremental, and stamps it
/// with the newest modification time of the inputs that determine it. That time is older than
/// this build, so cargo's `rerun-if-changed` check stays quiet on the next build, yet newer than
/// any C++ object compiled against an older header, so Ninja still rebuilds those.
fn copy_if_changed(from: &Path, to: &Path) {
    let content = std::fs::read(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
    if std::fs::read(to).ok().as_deref() == Some(content.as_slice()) {
        return;
    }
    std::fs::create_dir_all(to.parent().expect("parent")).expect("create include dir");
    std::fs::write(to, content).unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
    let inputs = ["src/lib.rs", "build.rs", "../../Cargo.lock"];
    let newest = inputs
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    if let Some(time) = newest {
        let _ = std::fs::File::options()
            .write(true)
            .open(to)
            .and_then(|f| f.set_modified(time));
    }
}
