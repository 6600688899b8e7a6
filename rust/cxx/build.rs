//! Generates and compiles the C++ side of the bridges, then copies the generated headers and
//! `cxx.h` to `$SAFETENSORS_CXX_INCLUDE_DIR/safetensors/ffi/` when CMake asks for them.
//!
//! Each bridge's header is `safetensors/ffi/src/<area>.rs.h` (the path cxx gives it, which the
//! headers of the bridges that reuse its types include). They include `"rust/cxx.h"`; placing
//! `cxx.h` at `ffi/src/rust/cxx.h` beside them resolves that include relative to the headers
//! themselves, so installs never need a global `include/rust/` directory.

use std::path::{Path, PathBuf};

/// Every bridge, in the order their headers include one another.
const BRIDGES: &[&str] = &[
    "src/status.rs",
    "src/file.rs",
    "src/checkpoint.rs",
    "src/writer.rs",
    "src/convert.rs",
    "src/stream.rs",
    "src/cuda.rs",
    "src/memory.rs",
    "src/distributed.rs",
    "src/remote.rs",
];

fn main() {
    cxx_build::CFG.include_prefix = "safetensors/ffi";
    // Default visibility: libsafetensors.so (cmake/SafetensorsShared.cmake) exports these C++
    // functions through its version script, which cannot export hidden symbols. Their names are
    // ours (namespace safetensors), so they cannot collide with another library's.
    // No exceptions: the bridges report every outcome through a status and never throw (see
    // src/lib.rs), and this flag makes that a compile-time rule (cxx's `Result` would need them).
    cxx_build::bridges(BRIDGES)
        .std("c++17")
        .flag_if_supported("-fno-exceptions")
        .compile("safetensors_cxx_bridge");
    for bridge in BRIDGES {
        println!("cargo:rerun-if-changed={bridge}");
    }
    println!("cargo:rerun-if-env-changed=SAFETENSORS_CXX_INCLUDE_DIR");
    write_version_symbol();

    let Some(dest) = std::env::var_os("SAFETENSORS_CXX_INCLUDE_DIR") else {
        return;
    };
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let generated = out.join("cxxbridge/include");
    let ffi = Path::new(&dest).join("safetensors/ffi/src");
    let mut copies: Vec<(PathBuf, PathBuf)> = BRIDGES
        .iter()
        .map(|b| {
            let header = format!("{}.h", b.trim_start_matches("src/"));
            (
                generated.join("safetensors/ffi/src").join(&header),
                ffi.join(&header),
            )
        })
        .collect();
    copies.push((generated.join("rust/cxx.h"), ffi.join("rust/cxx.h")));
    for (from, to) in copies {
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
    let newest = BRIDGES
        .iter()
        .chain(&["build.rs", "../../Cargo.lock"])
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    if let Some(time) = newest {
        let _ = std::fs::File::options()
            .write(true)
            .open(to)
            .and_then(|f| f.set_modified(time));
    }
}
