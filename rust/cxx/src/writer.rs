//! `Writer`: tensors handed over one by one from C++, then written in one go (bridge and glue).

use std::collections::BTreeMap;
use std::path::PathBuf;

use safetensors_core::{
    dtype_to_write, text_to_write, Dtype, Durability, Error, PreparedFile, TensorView, TextField,
};

use crate::status::{guard, Status};

#[cxx::bridge(namespace = "safetensors::ffi")]
pub mod ffi {
    unsafe extern "C++" {
        include!("safetensors/ffi/src/status.rs.h");
        type Status = crate::status::ffi::Status;
    }

    extern "Rust" {
        /// Tensors collected for one write; see `rust/cxx/src/writer.rs` for the lifetime rule.
        type Writer;
        /// An empty writer for the file at `target` (empty: bytes in memory), which every error
        /// of the tensors and metadata it is given then names.
        fn new_writer(target: &[u8]) -> Box<Writer>;
        /// Adds a tensor; `data` must stay alive until the writer is dropped.
        fn add_tensor(
            self: &mut Writer,
            name: &[u8],
            dtype: u8,
            shape: &[usize],
            data: &[u8],
            status: &mut Status,
        );
        /// Writes `__metadata__` even if no entry is added.
        fn keep_metadata(self: &mut Writer);
        /// Adds a metadata entry (refuses a repeated key).
        fn add_metadata(self: &mut Writer, key: &[u8], value: &[u8], status: &mut Status);
        /// Checks everything, lays the file out once, and returns its length; `write_into` then
        /// writes that layout.
        unsafe fn prepare(self: &mut Writer, status: &mut Status) -> usize;
        /// Writes the prepared file into `dst` (exactly `prepare`'s length).
        unsafe fn write_into(self: &Writer, dst: &mut [u8], status: &mut Status);
        /// Writes the file atomically at `path`, fsynced when `sync`.
        unsafe fn write_file(self: &Writer, path: &[u8], sync: bool, status: &mut Status);
    }
}

/// Tensors and metadata collected for one `serialize` or `save_file` call.
///
/// The tensor bytes are not copied: `Writer` keeps their addresses. That is sound because the
/// only user is the C++ wrapper in `include/safetensors/writer.hpp`, which creates a `Writer`,
/// feeds it spans that outlive the call (keeping its own copy of any tensor a range yields as a
/// temporary), writes, and drops it, all inside one function.
pub struct Writer {
    /// The file it will write, named by its errors (`None` for `serialize`).
    target: Option<PathBuf>,
    names: Vec<String>,
    dtypes: Vec<Dtype>,
    shapes: Vec<Vec<usize>>,
    data: Vec<(*const u8, usize)>,
    metadata: Option<BTreeMap<String, String>>,
    /// The layout `prepare` made, which `write_into` writes: `serialize` sizes its buffer and
    /// fills it from one layout. It borrows the tensor bytes under the same rule as `data`.
    prepared: Option<PreparedFile<'static>>,
}

pub fn new_writer(target: &[u8]) -> Box<Writer> {
    Box::new(Writer {
        target: (!target.is_empty()).then(|| crate::status::native_path(target).to_path_buf()),
        names: Vec::new(),
        dtypes: Vec::new(),
        shapes: Vec::new(),
        data: Vec::new(),
        metadata: None,
        prepared: None,
    })
}

impl Writer {
    /// `e`, naming the file being written when there is one.
    fn named(&self, e: Error) -> Error {
        match &self.target {
            Some(path) => e.in_file(path),
            None => e,
        }
    }

    pub fn add_tensor(
        &mut self,
        name: &[u8],
        dtype: u8,
        shape: &[usize],
        data: &[u8],
        status: &mut Status,
    ) {
        guard(status, || {
            let name = text_to_write(name, TextField::TensorName).map_err(|e| self.named(e))?;
            let dtype = dtype_to_write(&name, dtype).map_err(|e| self.named(e))?;
            self.names.push(name);
            self.dtypes.push(dtype);
            self.shapes.push(shape.to_vec());
            self.data.push((data.as_ptr(), data.len()));
            self.prepared = None;
            Ok(())
        })
    }

    /// Writes `__metadata__` even when no key is added (an empty object, as Python writes for
    /// `metadata={}`).
    pub fn keep_metadata(&mut self) {
        self.metadata.get_or_insert_with(BTreeMap::new);
        self.prepared = None;
    }

    pub fn add_metadata(&mut self, key: &[u8], value: &[u8], status: &mut Status) {
        guard(status, || {
            let key = text_to_write(key, TextField::MetadataKey).map_err(|e| self.named(e))?;
            let value =
                text_to_write(value, TextField::MetadataValue).map_err(|e| self.named(e))?;
            if self.metadata.as_ref().is_some_and(|m| m.contains_key(&key)) {
                return Err(self.named(Error::DuplicateKey {
                    key,
                    in_metadata: true,
                }));
            }
            let map = self.metadata.get_or_insert_with(BTreeMap::new);
            map.insert(key, value);
            self.prepared = None;
            Ok(())
        })
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    unsafe fn prepared(&self) -> Result<PreparedFile<'_>, Error> {
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
        PreparedFile::new(views, self.metadata.as_ref())
    }

    /// Lays the file out (every check included) and keeps the layout for `write_into`; returns
    /// the file's length.
    ///
    /// # Safety
    /// Every span passed to `add_tensor` must stay alive until the writer is dropped.
    pub unsafe fn prepare(&mut self, status: &mut Status) -> usize {
        guard(status, || {
            let prepared = unsafe { self.prepared() }?;
            let len = prepared.len();
            // SAFETY: a `PreparedFile` keeps only the tensor data slices (names and shapes are
            // read while laying out), and those stay alive until the writer is dropped (the
            // caller's contract), so the layout may outlive this borrow of `self`.
            let prepared: PreparedFile<'static> = unsafe { std::mem::transmute(prepared) };
            self.prepared = Some(prepared);
            Ok(len)
        })
    }

    /// Writes the layout `prepare` made into `dst` (exactly that many bytes).
    ///
    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    pub unsafe fn write_into(&self, dst: &mut [u8], status: &mut Status) {
        guard(status, || match &self.prepared {
            Some(prepared) => prepared.write_into(dst),
            None => Err(Error::Internal {
                message: "the writer was asked to write before `prepare` laid the file out".into(),
            }),
        })
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    pub unsafe fn write_file(&self, path: &[u8], sync: bool, status: &mut Status) {
        guard(status, || {
            let path = crate::status::native_path(path);
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
