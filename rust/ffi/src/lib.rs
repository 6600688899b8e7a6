//! The archive every C and C++ program links (`libsafetensors_ffi.a`, installed as
//! `libsafetensors_rust.a`, and inside `libsafetensors.so`): the C++ bridge and the C API side
//! by side, neither inside the other, so that a program using both links one copy of the core
//! and of Rust's standard library. Naming each crate links it in; the C API's `#[no_mangle]`
//! functions and the bridges' generated C++ are then part of this staticlib. Nothing else lives
//! here: the bridges translate, the core decides.

use safetensors_capi as _;
use safetensors_cxx as _;
