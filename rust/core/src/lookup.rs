//! Tensor names that a binding hands over as bytes (C's `(pointer, length)` names, C++'s
//! `std::string_view`) to look a tensor up: this module owns the rule for bytes that are not
//! UTF-8. A tensor name in a header is a JSON string, hence UTF-8, so such bytes name no
//! tensor: the lookup is `TensorNotFound` naming the file (the name shown with each invalid
//! sequence as U+FFFD), never a lookup of a lossy copy, which could match another tensor.
//!
//! Every lookup by bytes in the C API and the C++ bridge goes through here: a file, a
//! checkpoint, a stream's or an upload's requests, a writer's pieces.

use std::path::Path;

use crate::error::{Error, Result};

/// The tensor name `name` as text, or `TensorNotFound` naming `source` (the file, checkpoint
/// or writer looked in) when the bytes are not UTF-8.
///
/// ```
/// use std::path::Path;
/// use safetensors_core::{name_to_find, ErrorKind};
/// assert_eq!(name_to_find(b"wte.weight", Path::new("m.safetensors"))?, "wte.weight");
/// let e = name_to_find(b"w\xff", Path::new("m.safetensors")).unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::TensorNotFound);
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub fn name_to_find<'a>(name: &'a [u8], source: &Path) -> Result<&'a str> {
    std::str::from_utf8(name).map_err(|_| tensor_not_found(name, source))
}

/// `TensorNotFound` for the name `name` (any bytes) in `source`: what a lookup that found
/// nothing reports, whoever made it.
pub fn tensor_not_found(name: &[u8], source: &Path) -> Error {
    Error::TensorNotFound {
        name: String::from_utf8_lossy(name).into_owned(),
    }
    .in_file(source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn utf8_names_pass_unchanged() {
        let name = "a\0b\u{e9}".as_bytes();
        assert_eq!(name_to_find(name, Path::new("f")).unwrap(), "a\0b\u{e9}");
        assert_eq!(name_to_find(b"", Path::new("f")).unwrap(), "");
    }

    #[test]
    fn a_name_that_is_not_utf8_is_not_found_in_the_named_file() {
        let e = name_to_find(b"w\xff.x", Path::new("dir/m.safetensors")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TensorNotFound);
        assert_eq!(e.path(), Some(Path::new("dir/m.safetensors")));
        assert_eq!(
            e.to_string(),
            "dir/m.safetensors: tensor `w\u{fffd}.x` not found"
        );
    }

    #[test]
    fn not_found_shows_the_name_lossily_and_names_the_source() {
        let e = tensor_not_found(b"missing", Path::new("ckpt/index.json"));
        assert_eq!(e.kind(), ErrorKind::TensorNotFound);
        assert!(e.to_string().contains("`missing`"), "{e}");
        assert!(e.to_string().contains("ckpt/index.json"), "{e}");
    }
}
