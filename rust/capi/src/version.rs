//! The version: macros for the header and a call for the library a program actually runs.
//!
//! The one place the version is written is `include/safetensors/version.hpp`; rust/cxx's build
//! script refuses to build when Cargo.toml disagrees with it, and the assertions below refuse
//! to compile when these numbers disagree with Cargo.toml. They are literals because the header
//! generator copies them into `safetensors.h` as `#define`s.

use std::ffi::c_char;

/// The major version of this header.
pub const ST_VERSION_MAJOR: u32 = 0;
/// The minor version of this header.
pub const ST_VERSION_MINOR: u32 = 1;
/// The patch version of this header.
pub const ST_VERSION_PATCH: u32 = 0;
/// This header's version, `MAJOR << 16 | MINOR << 8 | PATCH`: compare it with `st_version()`.
pub const ST_VERSION: u32 = 256;

const fn number(text: &str) -> u32 {
    let bytes = text.as_bytes();
    let mut n = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        n = n * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    n
}

const _: () = {
    assert!(ST_VERSION_MAJOR == number(env!("CARGO_PKG_VERSION_MAJOR")));
    assert!(ST_VERSION_MINOR == number(env!("CARGO_PKG_VERSION_MINOR")));
    assert!(ST_VERSION_PATCH == number(env!("CARGO_PKG_VERSION_PATCH")));
    assert!(ST_VERSION == (ST_VERSION_MAJOR << 16) | (ST_VERSION_MINOR << 8) | ST_VERSION_PATCH);
};

/// The version of the library this program runs, `MAJOR << 16 | MINOR << 8 | PATCH` (compare
/// it with `ST_VERSION` when the library is loaded at run time).
#[no_mangle]
pub extern "C" fn st_version() -> u32 {
    ST_VERSION
}

/// The version of the library this program runs, `"MAJOR.MINOR.PATCH"` (static).
#[no_mangle]
pub extern "C" fn st_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
