//! Glue for `Writer`: tensors handed over one by one from C++, then written in one go.

use std::collections::BTreeMap;

use safetensors_core::{Dtype, Durability, Error, Prepared, TensorView};

use crate::{guard, BridgeError};

/// Tensors and metadata collected for one `serialize` or `save_file` call.
///
/// The tensor bytes are not copied: `Writer` keeps their addresses. That is sound because the
/// only user is the C++ wrapper in `include/safetensors/writer.hpp`, which creates a `Writer`,
/// feeds it spans that outlive the call, writes, and drops it, all inside one function.
pub struct Writer {
    names: Vec<String>,
    dtypes: Vec<Dtype>,
    shapes: Vec<Vec<usize>>,
    data: Vec<(*const u8, usize)>,
    metadata: Option<BTreeMap<String, String>>,
}

pub fn new_writer() -> Box<Writer> {
    Box::new(Writer {
        names: Vec::new(),
        dtypes: Vec::new(),
        shapes: Vec::new(),
        data: Vec::new(),
        metadata: None,
    })
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, Error> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::InvalidTensorName {
        name: format!(
            "{what} {:?} is not valid UTF-8",
            String::from_utf8_lossy(bytes)
        ),
    })
}

impl Writer {
    pub fn add_tensor(
        &mut self,
        name: &[u8],
        dtype: u8,
        shape: &[usize],
        data: &[u8],
    ) -> Result<(), BridgeError> {
        guard(|| {
            let name = utf8(name, "tensor name")?;
            let dtype = Dtype::from_index(dtype).ok_or_else(|| Error::TensorInvalidInfo {
                tensor: name.clone(),
                expected: 0,
                actual: data.len() as u64,
            })?;
            self.names.push(name);
            self.dtypes.push(dtype);
            self.shapes.push(shape.to_vec());
            self.data.push((data.as_ptr(), data.len()));
            Ok(())
        })
    }

    pub fn add_metadata(&mut self, key: &[u8], value: &[u8]) -> Result<(), BridgeError> {
        guard(|| {
            let key = utf8(key, "metadata key")?;
            let value = utf8(value, "metadata value")?;
            let map = self.metadata.get_or_insert_with(BTreeMap::new);
            if map.contains_key(&key) {
                return Err(Error::DuplicateKey {
                    key,
                    in_metadata: true,
                });
            }
            map.insert(key, value);
            Ok(())
        })
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    unsafe fn prepared(&self) -> Result<Prepared<'_>, Error> {
        let views = (0..self.names.len()).map(|i| {
            let (ptr, len) = self.data[i];
            // SAFETY: the caller guarantees the C++ spans are alive (see the type's docs); an
            // empty span may carry a null pointer, which a slice may not.
            let bytes = if len == 0 {
                &[][..]
            } else {
                unsafe { std::slice::from_raw_parts(ptr, len) }
            };
            (
                self.names[i].as_str(),
                TensorView::new(self.dtypes[i], &self.shapes[i], bytes),
            )
        });
        Prepared::new(views, self.metadata.as_ref())
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    pub unsafe fn file_len(&self) -> Result<usize, BridgeError> {
        guard(|| unsafe { self.prepared() }.map(|p| p.len()))
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    pub unsafe fn write_into(&self, dst: &mut [u8]) -> Result<(), BridgeError> {
        guard(|| unsafe { self.prepared() }?.write_into(dst))
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    pub unsafe fn write_file(&self, path: &[u8], sync: bool) -> Result<(), BridgeError> {
        guard(|| {
            let path = crate::native_path(path);
            let durability = if sync {
                Durability::Synced
            } else {
                Durability::Unsynced
            };
            unsafe { self.prepared() }
                .and_then(|p| p.write_file_with(path, durability))
                .map_err(|e| e.in_file(path))
        })
    }
}
