//! A second, independent cxx-based Rust static library, for the test that links it into one
//! program with safetensors' shared library: both carry cxx's runtime (`cxxbridge1$...` and
//! `rust::cxxbridge1::...` symbols), which collide when both are static archives.

#[cxx::bridge(namespace = "other")]
mod ffi {
    extern "Rust" {
        /// The sum of `bytes`, and a Rust `String` describing it (exercises cxx's runtime).
        fn describe_sum(bytes: &[u8]) -> String;
    }
}

fn describe_sum(bytes: &[u8]) -> String {
    let sum: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
    format!("sum {sum}")
}
