//! Generates this fixture's own cxx bridge, as any other cxx-based library would.
fn main() {
    cxx_build::bridge("src/lib.rs")
        .std("c++17")
        .compile("other_cxx_lib_bridge");
    println!("cargo:rerun-if-changed=src/lib.rs");
}
