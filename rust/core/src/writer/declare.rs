//! What a binding declares to a writer, handed over as bytes and numbers (C's `st_tensor` and
//! `st_metadata_entry`, the C++ bridge's `add_tensor`, `add_metadata` and `TensorDecl`): this
//! module owns the checks every writer makes of them before anything is laid out, once for
//! every face of the library:
//! - a tensor name, a metadata key and a metadata value are UTF-8, as a JSON header must be
//!   ([`text_to_write`]: `InvalidTensorName` for a name, `InvalidHeader` for metadata);
//! - a dtype value names a dtype, whatever the integer width it came in ([`dtype_to_write`]:
//!   `TypeMismatch`);
//! - a metadata key is given once (`DuplicateKey`: the writer's input is a list, and which of
//!   two values to keep is no choice to make silently);
//! - a sharded checkpoint's file prefix given as bytes is UTF-8, or it names no file an index
//!   can list (`InvalidShardPath`, as every other prefix that is not a plain file name).
//!
//! [`Declarations`] collects them, each error naming the file (or directory) being written, and
//! lays out a file of tensors given at once ([`Declarations::prepare`]) or starts a writer of
//! pieces (`target.rs`). What depends on all the tensors together (a name given twice,
//! `__metadata__` as a name, sizes, the header's size) is the layout's (`layout.rs`), checked
//! when the file is laid out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::streaming::TensorSpec;
use super::PreparedFile;
use crate::dtype::Dtype;
use crate::error::{Error, Result, TextField};
use crate::fallible;
use crate::view::TensorView;

/// Header text handed over as bytes (a tensor name, a metadata key or value, from C++), as
/// UTF-8: the header is UTF-8 JSON, so other bytes cannot be written ([`Error::NotUtf8`]).
pub fn text_to_write(bytes: &[u8], field: TextField) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        Error::NotUtf8 {
            field,
            lossy: String::from_utf8_lossy(bytes).into_owned(),
            offset,
            byte: bytes[offset],
        }
    })
}

/// The dtype with enumeration value `value` (as C++ passes it, a `uint8_t`, or C, an
/// `int32_t`) of tensor `tensor`, to be written ([`Error::InvalidDtypeValue`] when there is
/// none).
pub fn dtype_to_write(tensor: &str, value: impl Into<i64>) -> Result<Dtype> {
    let value = value.into();
    Dtype::from_value(value).ok_or_else(|| Error::InvalidDtypeValue {
        value,
        tensor: Some(tensor.to_owned()),
    })
}

/// The tensors and metadata a binding declares for one file or checkpoint to write, each
/// checked as it is given (see the module documentation), every error naming the target.
///
/// ```
/// use safetensors_core::{Declarations, ErrorKind};
/// let mut d = Declarations::new(None);
/// d.tensor(b"w", 17i32, &[2, 2])?;
/// d.metadata_entry(b"format", b"pt")?;
/// let e = d.metadata_entry(b"format", b"np").unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::DuplicateKey);
/// assert_eq!(d.tensors()[0].shape, [2, 2]);
/// # Ok::<(), safetensors_core::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Declarations {
    target: Option<PathBuf>,
    tensors: Vec<TensorSpec>,
    metadata: Option<BTreeMap<String, String>>,
}

impl Declarations {
    /// No declarations yet, for the file or directory `target` (`None` for bytes in memory).
    pub fn new(target: Option<&Path>) -> Declarations {
        Declarations {
            target: target.map(Path::to_path_buf),
            ..Declarations::default()
        }
    }

    /// Room for `n` tensors, refused with `Io` when memory for that many is not to be had (a
    /// count comes from the caller).
    pub fn with_capacity(target: Option<&Path>, n: usize) -> Result<Declarations> {
        let mut d = Declarations::new(target);
        d.tensors = fallible::with_capacity(n, "the declared tensors").map_err(|e| d.named(e))?;
        Ok(d)
    }

    /// Declares tensor `name` of dtype value `dtype` and `shape`. Errors: `InvalidTensorName`
    /// (not UTF-8), `TypeMismatch` (no such dtype).
    pub fn tensor(&mut self, name: &[u8], dtype: impl Into<i64>, shape: &[usize]) -> Result<()> {
        let name = text_to_write(name, TextField::TensorName).map_err(|e| self.named(e))?;
        let dtype = dtype_to_write(&name, dtype).map_err(|e| self.named(e))?;
        let spec = TensorSpec::new(name, dtype, shape);
        fallible::push(&mut self.tensors, spec, "the declared tensors").map_err(|e| self.named(e))
    }

    /// Adds the metadata entry `key` = `value`. Errors: `InvalidHeader` (not UTF-8),
    /// `DuplicateKey` (a key given before).
    pub fn metadata_entry(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let key = text_to_write(key, TextField::MetadataKey).map_err(|e| self.named(e))?;
        let value = text_to_write(value, TextField::MetadataValue).map_err(|e| self.named(e))?;
        if self.metadata.as_ref().is_some_and(|m| m.contains_key(&key)) {
            return Err(self.named(Error::DuplicateKey {
                key,
                in_metadata: true,
            }));
        }
        self.metadata
            .get_or_insert_with(BTreeMap::new)
            .insert(key, value);
        Ok(())
    }

    /// Writes `__metadata__` even when no entry is given (an empty object, as Python writes for
    /// `metadata={}`).
    pub fn keep_empty_metadata(&mut self) {
        self.metadata.get_or_insert_with(BTreeMap::new);
    }

    /// A sharded checkpoint's file prefix given as bytes. Errors: `InvalidShardPath` for bytes
    /// that are not UTF-8 (no index could list the files); the writer refuses the other
    /// prefixes that are not a plain file name the same way.
    pub fn shard_prefix(&self, prefix: &[u8]) -> Result<String> {
        String::from_utf8(prefix.to_vec()).map_err(|_| {
            self.named(Error::InvalidShardPath {
                shard: format!("{}.safetensors", String::from_utf8_lossy(prefix)),
            })
        })
    }

    /// The tensors, in the order declared.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// The metadata to write: `None` for no `__metadata__` at all.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Lays out a file of the declared tensors with their bytes, `data[i]` for tensor `i`, the
    /// data starting on a multiple of `alignment` (0: the reference's layout). Errors: those of
    /// [`PreparedFile::aligned`], naming the target.
    pub fn prepare<'a>(&'a self, data: &[&'a [u8]], alignment: usize) -> Result<PreparedFile<'a>> {
        if data.len() != self.tensors.len() {
            return Err(Error::Internal {
                message: format!(
                    "{} tensors declared, bytes given for {}",
                    self.tensors.len(),
                    data.len()
                ),
            });
        }
        let views = self
            .tensors
            .iter()
            .zip(data)
            .map(|(t, d)| (t.name.as_str(), TensorView::new(t.dtype, &t.shape, d)));
        PreparedFile::aligned(views, self.metadata(), alignment).map_err(|e| self.named(e))
    }

    /// The file or directory being written, when there is one.
    pub fn target(&self) -> Option<&Path> {
        self.target.as_deref()
    }

    /// `e`, naming the target when there is one.
    fn named(&self, e: Error) -> Error {
        match &self.target {
            Some(path) => e.in_file(path),
            None => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn names_and_metadata_must_be_utf8() {
        let mut d = Declarations::new(Some(Path::new("out.safetensors")));
        let e = d.tensor(b"w\xfe", 17, &[1]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidTensorName);
        assert!(e.to_string().starts_with("out.safetensors: "), "{e}");
        let e = d.metadata_entry(b"k\xff", b"v").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidHeader);
        let e = d.metadata_entry(b"k", b"\xc3").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidHeader);
        assert!(d.tensors().is_empty() && d.metadata().is_none());
    }

    #[test]
    fn a_dtype_value_of_any_width_is_checked() {
        let mut d = Declarations::new(None);
        for bad in [22i64, -1, 256 + 17, i64::from(i32::MAX)] {
            let e = d.tensor(b"w", bad, &[1]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TypeMismatch, "{bad}");
            assert!(e.to_string().contains(&format!("value {bad} ")), "{e}");
            assert!(e.path().is_none());
        }
        d.tensor(b"w", 17u8, &[3]).unwrap();
        assert_eq!(d.tensors(), [TensorSpec::new("w", Dtype::F32, &[3])]);
    }

    #[test]
    fn a_metadata_key_given_twice_is_refused() {
        let mut d = Declarations::new(None);
        d.metadata_entry(b"a", b"1").unwrap();
        let e = d.metadata_entry(b"a", b"2").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DuplicateKey);
        assert!(e.to_string().contains("duplicate metadata key `a`"), "{e}");
        assert_eq!(d.metadata().unwrap()["a"], "1");
    }

    #[test]
    fn empty_metadata_is_kept_only_when_asked() {
        let mut d = Declarations::new(None);
        assert!(d.metadata().is_none());
        d.keep_empty_metadata();
        assert!(d.metadata().unwrap().is_empty());
        d.metadata_entry(b"k", b"v").unwrap();
        d.keep_empty_metadata();
        assert_eq!(d.metadata().unwrap().len(), 1);
    }

    #[test]
    fn a_file_laid_out_from_declarations_is_the_reference_layout_and_names_the_target() {
        let mut d = Declarations::new(Some(Path::new("out.safetensors")));
        d.tensor(b"b", 4u8, &[2]).unwrap();
        d.tensor(b"a", 17u8, &[1]).unwrap();
        d.metadata_entry(b"k", b"v").unwrap();
        let (b, a) = ([1u8, 2], [0u8, 0, 128, 63]);
        let prepared = d.prepare(&[&b, &a], 0).unwrap();
        let mut bytes = vec![0; prepared.len()];
        prepared.write_into(&mut bytes).unwrap();
        let reference = crate::serialize(
            [
                ("b", TensorView::new(Dtype::U8, &[2], &b)),
                ("a", TensorView::new(Dtype::F32, &[1], &a)),
            ],
            d.metadata(),
        )
        .unwrap();
        assert_eq!(bytes, reference);
        let e = d.prepare(&[&b, &a[..3]], 0).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::TensorInvalidInfo);
        assert_eq!(e.path(), Some(Path::new("out.safetensors")));
        let e = d.prepare(&[&b], 0).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Internal);
    }

    #[test]
    fn a_prefix_that_is_not_utf8_is_no_shard_path() {
        let d = Declarations::new(Some(Path::new("ckpt")));
        assert_eq!(d.shard_prefix(b"model").unwrap(), "model");
        let e = d.shard_prefix(b"m\xff").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidShardPath);
        assert!(e.to_string().starts_with("ckpt: "), "{e}");
        assert!(e.to_string().contains("m\u{fffd}.safetensors"), "{e}");
    }
}
