//! Element types: the `ST_DTYPE_*` values (C++'s `safetensors::Dtype`, in the format's order),
//! their names and sizes. Which value or spelling names a dtype is the core's rule
//! (`Dtype::from_value`, `Dtype::from_str`).

use std::ffi::c_char;
use std::os::raw::c_int;

use safetensors_core::{convert, Dtype};

use crate::args::Call;
use crate::ffi::static_c_str;
use crate::status::{run, st_error, Fail, Res};

/// A dtype: boolean, one byte per element. The `ST_DTYPE_*` values are C++'s `safetensors::Dtype`
/// values, in the format's order.
pub const ST_DTYPE_BOOL: i32 = 0;
/// 4-bit float (MXFP4), two elements per byte, element 0 in the low nibble.
pub const ST_DTYPE_F4: i32 = 1;
/// 6-bit float, 2-bit exponent (MXFP6), four elements in three bytes.
pub const ST_DTYPE_F6_E2M3: i32 = 2;
/// 6-bit float, 3-bit exponent (MXFP6), four elements in three bytes.
pub const ST_DTYPE_F6_E3M2: i32 = 3;
/// Unsigned 8-bit integer.
pub const ST_DTYPE_U8: i32 = 4;
/// Signed 8-bit integer.
pub const ST_DTYPE_I8: i32 = 5;
/// 8-bit float, 5-bit exponent.
pub const ST_DTYPE_F8_E5M2: i32 = 6;
/// 8-bit float, 4-bit exponent.
pub const ST_DTYPE_F8_E4M3: i32 = 7;
/// 8-bit power-of-two scale (MX block scale).
pub const ST_DTYPE_F8_E8M0: i32 = 8;
/// 8-bit float E4M3, finite, unsigned zero.
pub const ST_DTYPE_F8_E4M3FNUZ: i32 = 9;
/// 8-bit float E5M2, finite, unsigned zero.
pub const ST_DTYPE_F8_E5M2FNUZ: i32 = 10;
/// Signed 16-bit integer.
pub const ST_DTYPE_I16: i32 = 11;
/// Unsigned 16-bit integer.
pub const ST_DTYPE_U16: i32 = 12;
/// IEEE half precision.
pub const ST_DTYPE_F16: i32 = 13;
/// bfloat16.
pub const ST_DTYPE_BF16: i32 = 14;
/// Signed 32-bit integer.
pub const ST_DTYPE_I32: i32 = 15;
/// Unsigned 32-bit integer.
pub const ST_DTYPE_U32: i32 = 16;
/// IEEE single precision.
pub const ST_DTYPE_F32: i32 = 17;
/// Complex: two F32 (real, imaginary).
pub const ST_DTYPE_C64: i32 = 18;
/// IEEE double precision.
pub const ST_DTYPE_F64: i32 = 19;
/// Signed 64-bit integer.
pub const ST_DTYPE_I64: i32 = 20;
/// Unsigned 64-bit integer.
pub const ST_DTYPE_U64: i32 = 21;

// The one numbering: every `ST_DTYPE_*` is the core's `Dtype` of that name.
const _: () = {
    let dtypes = [
        (ST_DTYPE_BOOL, Dtype::BOOL),
        (ST_DTYPE_F4, Dtype::F4),
        (ST_DTYPE_F6_E2M3, Dtype::F6_E2M3),
        (ST_DTYPE_F6_E3M2, Dtype::F6_E3M2),
        (ST_DTYPE_U8, Dtype::U8),
        (ST_DTYPE_I8, Dtype::I8),
        (ST_DTYPE_F8_E5M2, Dtype::F8_E5M2),
        (ST_DTYPE_F8_E4M3, Dtype::F8_E4M3),
        (ST_DTYPE_F8_E8M0, Dtype::F8_E8M0),
        (ST_DTYPE_F8_E4M3FNUZ, Dtype::F8_E4M3FNUZ),
        (ST_DTYPE_F8_E5M2FNUZ, Dtype::F8_E5M2FNUZ),
        (ST_DTYPE_I16, Dtype::I16),
        (ST_DTYPE_U16, Dtype::U16),
        (ST_DTYPE_F16, Dtype::F16),
        (ST_DTYPE_BF16, Dtype::BF16),
        (ST_DTYPE_I32, Dtype::I32),
        (ST_DTYPE_U32, Dtype::U32),
        (ST_DTYPE_F32, Dtype::F32),
        (ST_DTYPE_C64, Dtype::C64),
        (ST_DTYPE_F64, Dtype::F64),
        (ST_DTYPE_I64, Dtype::I64),
        (ST_DTYPE_U64, Dtype::U64),
    ];
    let mut i = 0;
    while i < dtypes.len() {
        assert!(dtypes[i].0 == dtypes[i].1 as i32 && dtypes[i].0 == i as i32);
        i += 1;
    }
    assert!(dtypes.len() == Dtype::ALL.len());
};

/// The header spelling of a dtype, e.g. `"F32"` (static, NUL-terminated); `""` for a value
/// that is no dtype.
#[no_mangle]
pub extern "C" fn st_dtype_name(dtype: i32) -> *const c_char {
    static_c_str(Dtype::from_value(dtype).map_or("", Dtype::name))
}

/// Bits of one element (4 for F4, 6 for the F6 types); 0 for a value that is no dtype.
#[no_mangle]
pub extern "C" fn st_dtype_bits(dtype: i32) -> usize {
    Dtype::from_value(dtype).map_or(0, Dtype::bits)
}

/// The dtype spelled exactly `name` (`name_len` bytes; `"f32"` is not `F32`), into `*dtype`.
/// Errors: `ST_ERR_TYPE_MISMATCH` for a name that is no dtype.
#[no_mangle]
pub unsafe extern "C" fn st_dtype_from_name(
    name: *const c_char,
    name_len: usize,
    dtype: *mut i32,
    err: *mut st_error,
) -> c_int {
    let c = Call("st_dtype_from_name");
    run(err, || {
        // SAFETY: the header's contract for each argument.
        let (name, out) = unsafe { (c.name(name, name_len, "name")?, c.out(dtype, "dtype")?) };
        // The core's message (every spelling listed), with the C API's kind for a bad dtype.
        let lossy = String::from_utf8_lossy(name);
        *out = lossy.parse::<Dtype>().map_err(|unknown| {
            Fail::Said(
                safetensors_core::ErrorKind::TypeMismatch,
                format!("{}: {unknown}", c.0),
            )
        })? as i32;
        Ok(())
    })
}

/// A dtype value a caller passes for a conversion (the core's rule and message for a value that
/// is no dtype, whatever its width).
pub(crate) fn to_convert(value: i32) -> Res<Dtype> {
    Ok(convert::dtype_to_convert(value)?)
}
