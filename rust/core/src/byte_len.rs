//! The tensor byte-length rule: a tensor of `dtype` and `shape` takes dtype × shape bits, which
//! must fit in 64 bits (`ValidationOverflow`) and end on a byte boundary (`MisalignedSlice`);
//! data of any other length is `TensorInvalidInfo`, and so is a tensor of a file with more than
//! [`MAX_RANK`] dimensions.
//!
//! One rule for every layer that needs it: header validation, the writer's check of its input,
//! slice planning, and conversion (its sources, outputs and destinations).

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::format::MAX_RANK;

/// Number of elements of `shape` (1 for a scalar), or `None` when it does not fit in `usize`.
pub(crate) fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Bytes taken by tensor `tensor` of `dtype` and `shape` (`tensor` names it in errors).
///
/// ```
/// use safetensors_core::{tensor_byte_len, Dtype};
/// assert_eq!(tensor_byte_len("w", Dtype::F4, &[2, 3]).unwrap(), 3);
/// ```
pub fn tensor_byte_len(tensor: &str, dtype: Dtype, shape: &[usize]) -> Result<usize> {
    let overflow = || Error::ValidationOverflow {
        tensor: tensor.to_owned(),
        shape: shape.to_vec(),
    };
    let numel = checked_numel(shape).ok_or_else(overflow)?;
    let bits = numel.checked_mul(dtype.bits()).ok_or_else(overflow)?;
    // The bit count fits, so `byte_size` can only refuse a partial byte.
    dtype
        .byte_size(numel)
        .ok_or_else(|| Error::MisalignedSlice {
            tensor: tensor.to_owned(),
            reason: format!(
                "{numel} elements of {dtype} make {bits} bits, not a whole number of bytes"
            ),
        })
}

/// Checks that `actual` bytes are what tensor `tensor` of `dtype` and `shape` takes, and that
/// the shape has at most [`MAX_RANK`] dimensions: the rule for a tensor of a file, read or
/// written.
pub(crate) fn check_tensor_byte_len(
    tensor: &str,
    dtype: Dtype,
    shape: &[usize],
    actual: usize,
) -> Result<()> {
    if shape.len() > MAX_RANK {
        return Err(Error::RankTooLarge {
            tensor: tensor.to_owned(),
        });
    }
    check_data_len(tensor, dtype, shape, actual)
}

/// Checks that `actual` bytes are what tensor `tensor` of `dtype` and `shape` takes: the
/// byte-length rule's kinds (`ValidationOverflow`, `MisalignedSlice`) first, so that a length
/// that no number of bytes could satisfy is never reported as a mismatch with an expected size
/// that does not exist; then `TensorInvalidInfo`. The rule for a caller's bytes (a conversion's
/// source), which may have any rank.
pub fn check_data_len(tensor: &str, dtype: Dtype, shape: &[usize], actual: usize) -> Result<()> {
    let expected = tensor_byte_len(tensor, dtype, shape)?;
    if actual != expected {
        return Err(Error::TensorInvalidInfo {
            tensor: tensor.to_owned(),
            expected: expected as u64,
            actual: actual as u64,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn byte_length_is_dtype_times_shape() {
        assert_eq!(tensor_byte_len("t", Dtype::F32, &[2, 3]).unwrap(), 24);
        assert_eq!(tensor_byte_len("t", Dtype::F4, &[4]).unwrap(), 2);
        assert_eq!(tensor_byte_len("t", Dtype::F6_E3M2, &[4]).unwrap(), 3);
        assert_eq!(tensor_byte_len("t", Dtype::U8, &[]).unwrap(), 1);
        assert_eq!(
            tensor_byte_len("t", Dtype::U64, &[0, usize::MAX]).unwrap(),
            0
        );
    }

    #[test]
    fn overflow_partial_bytes_and_mismatches_have_their_kinds() {
        let kind = |r: Result<usize>| r.unwrap_err().kind();
        let huge = [usize::MAX, 2];
        assert_eq!(
            kind(tensor_byte_len("t", Dtype::U8, &huge)),
            ErrorKind::ValidationOverflow
        );
        let bits_overflow = [usize::MAX / 4];
        assert_eq!(
            kind(tensor_byte_len("t", Dtype::F64, &bits_overflow)),
            ErrorKind::ValidationOverflow
        );
        let e = tensor_byte_len("t", Dtype::F4, &[3]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MisalignedSlice);
        assert_eq!(
            e.to_string(),
            "misaligned tensor `t`: 3 elements of F4 make 12 bits, not a whole number of bytes"
        );
        let e = check_tensor_byte_len("t", Dtype::F32, &[2], 7).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TensorInvalidInfo);
        assert!(check_tensor_byte_len("t", Dtype::F32, &[2], 8).is_ok());
    }
}
