//! One input, one error, whoever owns the output: every conversion and dequantization has a
//! face that sizes its output for a caller that allocates it (`converted_len`,
//! `fp8_blocks_output_len`, `mxfp4_output`: what the C++ API allocates from) and a face that
//! writes into a caller's buffer (`convert`, `dequantize_*`: what the C API and the C++ calls
//! into a span reach). For each bad input of the table, both faces give the table's error kind,
//! the buffer face with destinations of every length, and no message quotes a size that does
//! not exist (a wrapped `u64::MAX`).

use safetensors_core::convert::{
    convert, converted_len, dequantize_fp8_blocks, dequantize_mxfp4, fp8_blocks_output_len,
    mxfp4_output,
};
use safetensors_core::{Dtype, Error, ErrorKind, TensorView};

/// A tensor of the table: dtype, shape, and how many bytes it really holds (zeros).
#[derive(Clone)]
struct Given {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: usize,
}

fn given(dtype: Dtype, shape: &[usize], bytes: usize) -> Given {
    Given {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

/// One call, in both faces.
enum Call {
    Convert(Given, Dtype),
    Fp8Blocks(Given, Given, (usize, usize), Dtype),
    Mxfp4(Given, Given, Dtype),
}

impl Call {
    /// The allocating face: the output's size.
    fn sized(&self, data: &[Vec<u8>]) -> Result<usize, Error> {
        match self {
            Call::Convert(s, to) => converted_len(view(s, &data[0]), *to),
            Call::Fp8Blocks(w, s, block, to) => {
                fp8_blocks_output_len(view(w, &data[0]), view(s, &data[1]), *block, *to)
            }
            Call::Mxfp4(b, s, to) => {
                mxfp4_output(view(b, &data[0]), view(s, &data[1]), *to).map(|(_, len)| len)
            }
        }
    }

    /// The face that writes into `dst`.
    fn written(&self, data: &[Vec<u8>], dst: &mut [u8]) -> Result<(), Error> {
        match self {
            Call::Convert(s, to) => convert(s.dtype, &s.shape, &data[0], *to, dst),
            Call::Fp8Blocks(w, s, block, to) => {
                dequantize_fp8_blocks(view(w, &data[0]), view(s, &data[1]), *block, *to, dst)
            }
            Call::Mxfp4(b, s, to) => {
                dequantize_mxfp4(view(b, &data[0]), view(s, &data[1]), *to, dst)
            }
        }
    }

    fn inputs(&self) -> Vec<&Given> {
        match self {
            Call::Convert(s, _) => vec![s],
            Call::Fp8Blocks(w, s, _, _) | Call::Mxfp4(w, s, _) => vec![w, s],
        }
    }
}

fn view<'a>(g: &'a Given, data: &'a [u8]) -> TensorView<'a> {
    TensorView::new(g.dtype, &g.shape, data)
}

const HUGE: usize = 1 << 40;

/// Every bad input, and the kind both faces must give (one row a line: a table).
#[rustfmt::skip]
fn table() -> Vec<(&'static str, Call, ErrorKind)> {
    use Dtype::*;
    use ErrorKind::*;
    let f32x3 = given(F32, &[3], 12);
    let fp8 = given(F8_E4M3, &[1, 4], 4);
    let scale = given(F32, &[1, 1], 4);
    let blocks = given(U8, &[1, 16], 16);
    let scales = given(U8, &[1], 1);
    vec![
        // Sub-byte outputs and sources whose elements end inside a byte: no buffer fits them.
        ("3 values into F4", Call::Convert(f32x3.clone(), F4), MisalignedSlice),
        ("3 values into F6_E2M3", Call::Convert(f32x3.clone(), F6_E2M3), MisalignedSlice),
        ("2 values into F6_E3M2", Call::Convert(given(F32, &[2], 8), F6_E3M2), MisalignedSlice),
        ("3 F4 values", Call::Convert(given(F4, &[3], 2), F32), MisalignedSlice),
        ("5 F6 values", Call::Convert(given(F6_E2M3, &[5], 4), F16), MisalignedSlice),
        // Sizes that do not fit in 64 bits: of the elements, or of their bits.
        ("elements overflow", Call::Convert(given(F32, &[HUGE, HUGE], 8), F64), ValidationOverflow),
        ("bits overflow", Call::Convert(given(F64, &[usize::MAX / 4], 8), F32), ValidationOverflow),
        // A source whose bytes disagree with its dtype and shape, small or huge.
        ("short source", Call::Convert(given(F32, &[3], 8), F16), TensorInvalidInfo),
        ("lying source", Call::Convert(given(F8_E4M3, &[HUGE], 4), F32), TensorInvalidInfo),
        // Pairs that are not conversions.
        ("complex source", Call::Convert(given(C64, &[1], 8), F32), TypeMismatch),
        ("integer target", Call::Convert(given(F32, &[1], 4), I32), TypeMismatch),
        ("complex source, lying", Call::Convert(given(C64, &[HUGE], 4), F32), TypeMismatch),
        // Block dequantization.
        ("fp8 into F4, odd count", Call::Fp8Blocks(given(F8_E4M3, &[1, 3], 3), scale.clone(), (128, 128), F4), TypeMismatch),
        ("fp8 into F4, even count", Call::Fp8Blocks(fp8.clone(), scale.clone(), (128, 128), F4), TypeMismatch),
        ("fp8 into F6", Call::Fp8Blocks(fp8.clone(), scale.clone(), (128, 128), F6_E3M2), TypeMismatch),
        ("fp8 F4 weight", Call::Fp8Blocks(given(F4, &[1, 4], 2), scale.clone(), (128, 128), F32), TypeMismatch),
        ("fp8 complex scale", Call::Fp8Blocks(fp8.clone(), given(C64, &[1, 1], 8), (128, 128), F32), TypeMismatch),
        ("fp8 lying weight", Call::Fp8Blocks(given(F8_E4M3, &[1 << 20, 1 << 20], 4), given(F32, &[8192, 8192], 4), (128, 128), F32), TensorInvalidInfo),
        ("fp8 lying scale", Call::Fp8Blocks(fp8.clone(), given(F32, &[8192, 8192], 4), (128, 128), F32), TensorInvalidInfo),
        ("fp8 lying scale of a 3-D weight", Call::Fp8Blocks(given(F8_E4M3, &[1, 1, 4], 4), given(F32, &[HUGE], 4), (128, 128), F32), TensorInvalidInfo),
        ("fp8 half-byte scale", Call::Fp8Blocks(fp8.clone(), given(F4, &[1, 1], 1), (128, 128), F32), MisalignedSlice),
        ("fp8 scale of the wrong shape", Call::Fp8Blocks(fp8.clone(), given(F32, &[2, 2], 16), (128, 128), F32), TypeMismatch),
        ("fp8 3-D weight", Call::Fp8Blocks(given(F8_E4M3, &[1, 1, 4], 4), scale.clone(), (128, 128), F32), TypeMismatch),
        ("fp8 empty block", Call::Fp8Blocks(fp8.clone(), scale.clone(), (0, 128), F32), TypeMismatch),
        // MXFP4.
        ("mxfp4 into F4", Call::Mxfp4(blocks.clone(), scales.clone(), F4), TypeMismatch),
        ("mxfp4 into an integer", Call::Mxfp4(blocks.clone(), scales.clone(), U8), TypeMismatch),
        ("mxfp4 F32 blocks, lying", Call::Mxfp4(given(F32, &[HUGE, 16], 4), scales.clone(), F32), TypeMismatch),
        ("mxfp4 lying blocks", Call::Mxfp4(given(U8, &[HUGE, 16], 4), given(U8, &[HUGE], 4), F32), TensorInvalidInfo),
        ("mxfp4 lying scales", Call::Mxfp4(blocks.clone(), given(U8, &[HUGE], 4), F32), TensorInvalidInfo),
        ("mxfp4 blocks overflow", Call::Mxfp4(given(U8, &[1 << 60, 16], 4), given(U8, &[1 << 60], 4), F32), ValidationOverflow),
        ("mxfp4 groups of 15", Call::Mxfp4(given(U8, &[1, 15], 15), scales.clone(), F32), TypeMismatch),
        ("mxfp4 scales of the wrong shape", Call::Mxfp4(blocks.clone(), given(U8, &[2], 2), F32), TypeMismatch),
    ]
}

/// What a message may never hold: a size that wrapped (`u64::MAX`, `usize::MAX`).
fn assert_sane(what: &str, e: &Error) {
    let text = e.to_string();
    assert!(!text.contains(&u64::MAX.to_string()), "{what}: {text}");
    assert!(!text.is_empty(), "{what}: an empty message");
}

#[test]
fn every_bad_input_is_the_same_error_kind_allocating_and_into_a_callers_buffer() {
    for (what, call, kind) in table() {
        let data: Vec<Vec<u8>> = call.inputs().iter().map(|g| vec![0u8; g.bytes]).collect();
        let sized = call.sized(&data).expect_err(what);
        assert_eq!(sized.kind(), kind, "{what}, allocating: {sized}");
        assert_sane(what, &sized);
        for len in [0, 1, 7, 12, 64] {
            let mut dst = vec![0u8; len];
            let into = call.written(&data, &mut dst).expect_err(what);
            assert_eq!(into.kind(), kind, "{what}, into {len} bytes: {into}");
            assert_eq!(
                into.to_string(),
                sized.to_string(),
                "{what}: one message for both faces"
            );
            assert_eq!(dst, vec![0u8; len], "{what}: nothing written");
        }
    }
}

#[test]
fn sub_byte_outputs_name_their_elements_and_bits() {
    let src = [0u8; 12];
    let e = converted_len(TensorView::new(Dtype::F32, &[3], &src), Dtype::F4).unwrap_err();
    assert_eq!(
        e.to_string(),
        "misaligned tensor `the F4 output`: 3 elements of F4 make 12 bits, not a whole number of \
         bytes"
    );
}

/// Good inputs: the allocating face's size is the one the buffer face takes; any other length
/// is `TensorInvalidInfo` naming the destination and both sizes.
#[test]
fn a_destination_of_another_length_is_named_with_both_sizes() {
    use Dtype::*;
    let cases = [
        Call::Convert(given(F32, &[4], 16), F4),
        Call::Convert(given(F32, &[4], 16), F6_E2M3),
        Call::Convert(given(F16, &[2, 3], 12), F32),
        Call::Fp8Blocks(
            given(F8_E4M3, &[2, 4], 8),
            given(F32, &[1, 1], 4),
            (128, 128),
            BF16,
        ),
        Call::Mxfp4(given(U8, &[2, 16], 32), given(U8, &[2], 2), F32),
    ];
    for call in cases {
        let data: Vec<Vec<u8>> = call.inputs().iter().map(|g| vec![0u8; g.bytes]).collect();
        let len = call.sized(&data).unwrap();
        let mut dst = vec![0xFFu8; len];
        call.written(&data, &mut dst).unwrap();
        for wrong in [0, len - 1, len + 1] {
            let e = call.written(&data, &mut vec![0u8; wrong]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TensorInvalidInfo, "{e}");
            let text = e.to_string();
            assert!(text.contains("the destination"), "{text}");
            assert!(text.contains(&format!("make {len} byte")), "{text}");
            assert!(text.contains(&format!("{wrong} byte")), "{text}");
        }
    }
}
