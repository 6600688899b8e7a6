//! Writing (bridge and glue): `Writer`, tensors handed over one by one from C++ and written in
//! one go (`save_file`, `serialize`); `StreamingWriter`, a file or a sharded checkpoint whose
//! tensors are declared in one call and whose bytes arrive in pieces, from any thread.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::RwLock;

use safetensors_core::{
    dtype_to_write, text_to_write, Dtype, Durability, Error, PreparedFile, ShardOptions,
    ShardedWriter, StreamWriter, TensorSpec, TensorView, TextField, WriteOptions,
};

use crate::status::{guard, handed_over, part, Status};
use ffi::{MetadataSpan, StreamingOptions, TensorDecl};

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
        /// Checks everything, lays the file out once (the data starting on a multiple of
        /// `alignment`, 0 for the reference's layout), and returns its length; `write_into`
        /// then writes that layout.
        unsafe fn prepare(self: &mut Writer, alignment: usize, status: &mut Status) -> usize;
        /// Writes the prepared file into `dst` (exactly `prepare`'s length).
        unsafe fn write_into(self: &Writer, dst: &mut [u8], status: &mut Status);
        /// Writes the file atomically at `path`, fsynced when `sync`, the data starting on a
        /// multiple of `alignment` (0: the reference's layout).
        unsafe fn write_file(
            self: &Writer,
            path: &[u8],
            sync: bool,
            alignment: usize,
            status: &mut Status,
        );
    }

    /// How a streaming writer writes (C++'s `SaveOptions` and `ShardOptions`).
    #[derive(Debug, Clone, Copy)]
    struct StreamingOptions {
        sync: bool,
        empty_metadata: bool,
        alignment: usize,
        /// Shards in the directory `target` (else one file at `target`), named after the
        /// prefix `text[prefix_start..][..prefix_len]`.
        sharded: bool,
        max_shard_size: u64,
        prefix_start: usize,
        prefix_len: usize,
    }

    /// One declared tensor: its name `text[name_start..][..name_len]`, its dtype (an index),
    /// its shape `dims[dims_start..][..rank]`.
    #[derive(Debug, Clone, Copy)]
    struct TensorDecl {
        name_start: usize,
        name_len: usize,
        dtype: u8,
        dims_start: usize,
        rank: usize,
    }

    /// One metadata entry: its key and value, spans of `text`.
    #[derive(Debug, Clone, Copy)]
    struct MetadataSpan {
        key_start: usize,
        key_len: usize,
        value_start: usize,
        value_len: usize,
    }

    extern "Rust" {
        /// A file, or a sharded checkpoint, written in pieces.
        #[derive(ExternType)]
        type StreamingWriter;
        /// Declares every tensor and metadata entry at once (names, keys, values and the prefix
        /// in one `text` buffer, shapes in `dims`). Null on failure.
        fn new_streaming_writer(
            target: &[u8],
            tensors: &[TensorDecl],
            metadata: &[MetadataSpan],
            text: &[u8],
            dims: &[usize],
            options: &StreamingOptions,
            status: &mut Status,
        ) -> *mut StreamingWriter;
        /// Writes `data` at byte `offset` of tensor `name`; with `whole`, `data` is the whole
        /// tensor (and `offset` 0).
        fn write_tensor(
            self: &StreamingWriter,
            name: &[u8],
            offset: u64,
            data: &[u8],
            whole: bool,
            status: &mut Status,
        );
        /// Checks that every byte arrived and publishes the file or the set; after a failure
        /// the writer is as it was (unless the error says it cannot finish), to be finished
        /// again.
        fn finish(self: &StreamingWriter, status: &mut Status);
        /// The files `finish` publishes (shards, then the index), relative to the target's
        /// directory for a sharded checkpoint.
        fn files(self: &StreamingWriter) -> Vec<String>;
        /// The bytes of every tensor together.
        fn total_size(self: &StreamingWriter) -> u64;
    }

    impl Box<StreamingWriter> {}
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
    unsafe fn prepared_aligned(&self, alignment: usize) -> Result<PreparedFile<'_>, Error> {
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
        PreparedFile::aligned(views, self.metadata.as_ref(), alignment)
    }

    /// Lays the file out (every check included) and keeps the layout for `write_into`; returns
    /// the file's length.
    ///
    /// # Safety
    /// Every span passed to `add_tensor` must stay alive until the writer is dropped.
    pub unsafe fn prepare(&mut self, alignment: usize, status: &mut Status) -> usize {
        guard(status, || {
            let prepared = unsafe { self.prepared_aligned(alignment) }?;
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
    pub unsafe fn write_file(
        &self,
        path: &[u8],
        sync: bool,
        alignment: usize,
        status: &mut Status,
    ) {
        guard(status, || {
            let path = crate::status::native_path(path);
            unsafe { self.prepared_aligned(alignment) }
                .and_then(|p| p.write_file_with(path, durability(sync)))
                .map_err(|e| e.in_file(path))
        })
    }
}

fn durability(sync: bool) -> Durability {
    if sync {
        Durability::Synced
    } else {
        Durability::Unsynced
    }
}

/// What a streaming writer writes: one file, or a checkpoint's shards and index.
enum Target {
    File(StreamWriter),
    Sharded(ShardedWriter),
}

impl Target {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn write_index(&self, index: usize, offset: u64, data: &[u8]) -> Result<(), Error> {
        match self {
            Target::File(w) => w.write_index(index, offset, data),
            Target::Sharded(w) => w.write_index(index, offset, data),
        }
    }
}

/// A file, or a sharded checkpoint, written in pieces. Writes from several C++ threads share
/// the lock; `finish` takes it alone, so a `finish` racing with writes waits for them. The core
/// writer stays after `finish`: a failed one can be finished again, and after a successful one
/// the core refuses every call.
pub struct StreamingWriter {
    target: RwLock<Target>,
    /// The path given, named by the error of a name that is not UTF-8.
    path: PathBuf,
    /// What `finish` publishes, and the tensors' bytes.
    files: Vec<String>,
    total_size: u64,
}

/// `__metadata__` to write: none, or a map (empty included).
type MetadataMap = Option<BTreeMap<String, String>>;

/// The declared tensors and the metadata, checked as the core's writers check them (names and
/// metadata UTF-8, dtypes real, no key twice; the rest is the core's).
fn declared(
    tensors: &[TensorDecl],
    metadata: &[MetadataSpan],
    text: &[u8],
    dims: &[usize],
    empty_metadata: bool,
) -> Result<(Vec<TensorSpec>, MetadataMap), Error> {
    let mut specs = Vec::with_capacity(tensors.len());
    for t in tensors {
        let name = text_to_write(part(text, t.name_start, t.name_len)?, TextField::TensorName)?;
        let dtype = dtype_to_write(&name, t.dtype)?;
        let shape = part(dims, t.dims_start, t.rank)?;
        specs.push(TensorSpec::new(name, dtype, shape));
    }
    let mut map = empty_metadata.then(BTreeMap::new);
    for m in metadata {
        let key = text_to_write(part(text, m.key_start, m.key_len)?, TextField::MetadataKey)?;
        let value = text_to_write(
            part(text, m.value_start, m.value_len)?,
            TextField::MetadataValue,
        )?;
        let map = map.get_or_insert_with(BTreeMap::new);
        if map.contains_key(&key) {
            return Err(Error::DuplicateKey {
                key,
                in_metadata: true,
            });
        }
        map.insert(key, value);
    }
    Ok((specs, map))
}

pub fn new_streaming_writer(
    target: &[u8],
    tensors: &[TensorDecl],
    metadata: &[MetadataSpan],
    text: &[u8],
    dims: &[usize],
    options: &StreamingOptions,
    status: &mut Status,
) -> *mut StreamingWriter {
    let path = crate::status::native_path(target);
    guard(status, || {
        let (specs, metadata) = declared(tensors, metadata, text, dims, options.empty_metadata)
            .map_err(|e| e.in_file(path))?;
        let write = WriteOptions {
            durability: durability(options.sync),
            alignment: options.alignment,
        };
        let target = if options.sharded {
            let prefix = part(text, options.prefix_start, options.prefix_len)?;
            let prefix =
                text_to_write(prefix, TextField::TensorName).map_err(|e| e.in_file(path))?;
            Target::Sharded(ShardedWriter::create(
                path,
                &specs,
                metadata.as_ref(),
                ShardOptions {
                    max_shard_size: options.max_shard_size,
                    prefix,
                    write,
                },
            )?)
        } else {
            Target::File(StreamWriter::create(
                path,
                &specs,
                metadata.as_ref(),
                write,
            )?)
        };
        let (files, total_size) = match &target {
            Target::File(w) => (
                vec![path.to_string_lossy().into_owned()],
                (0..w.tensor_count()).map(|i| w.tensor_len(i)).sum(),
            ),
            Target::Sharded(w) => (w.files(), w.total_size()),
        };
        Ok(handed_over(StreamingWriter {
            target: RwLock::new(target),
            path: path.to_path_buf(),
            files,
            total_size,
        }))
    })
}

impl StreamingWriter {
    /// Runs `f` on the target, sharing it with other writes.
    fn with_target<T>(&self, f: impl FnOnce(&Target) -> Result<T, Error>) -> Result<T, Error> {
        f(&self.target.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes `data` at byte `offset` of the declared tensor at `index` (declaration order).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn write_index(&self, index: usize, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.with_target(|t| t.write_index(index, offset, data))
    }

    /// The name and bytes of each declared tensor, in declaration order.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn declared(&self) -> Result<Vec<(String, u64)>, Error> {
        self.with_target(|t| {
            Ok(match t {
                Target::File(w) => (0..w.tensor_count())
                    .map(|i| (w.tensor_name(i).to_owned(), w.tensor_len(i)))
                    .collect(),
                Target::Sharded(w) => (0..w.tensor_count())
                    .map(|i| (w.tensor_name(i).to_owned(), w.tensor_len(i)))
                    .collect(),
            })
        })
    }

    pub fn write_tensor(
        &self,
        name: &[u8],
        offset: u64,
        data: &[u8],
        whole: bool,
        status: &mut Status,
    ) {
        guard(status, || {
            // A name that is not UTF-8 was never declared.
            let name = std::str::from_utf8(name).map_err(|_| {
                Error::TensorNotFound {
                    name: String::from_utf8_lossy(name).into_owned(),
                }
                .in_file(&self.path)
            })?;
            self.with_target(|t| match (t, whole) {
                (Target::File(w), true) => w.write(name, data),
                (Target::File(w), false) => w.write_at(name, offset, data),
                (Target::Sharded(w), true) => w.write(name, data),
                (Target::Sharded(w), false) => w.write_at(name, offset, data),
            })
        })
    }

    pub fn finish(&self, status: &mut Status) {
        guard(status, || {
            match &mut *self.target.write().unwrap_or_else(|p| p.into_inner()) {
                Target::File(w) => w.finish(),
                Target::Sharded(w) => w.finish(),
            }
        })
    }

    pub fn files(&self) -> Vec<String> {
        self.files.clone()
    }

    pub fn total_size(&self) -> u64 {
        self.total_size
    }
}
