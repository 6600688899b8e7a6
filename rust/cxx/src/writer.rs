//! Writing (bridge and glue): `Writer`, tensors handed over one by one from C++ and written in
//! one go (`save_file`, `serialize`); `StreamingWriter`, a file or a sharded checkpoint whose
//! tensors are declared in one call and whose bytes arrive in pieces, from any thread.

use std::path::Path;
use std::sync::RwLock;

use safetensors_core::{
    CheckpointWriter, Declarations, Durability, Error, PreparedFile, ShardOptions, WriteOptions,
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
        /// The files `finish` publishes, by name, relative to the target's directory: the
        /// file's name, or the shards then the index (C++ joins them to the path given).
        fn files(self: &StreamingWriter) -> Vec<String>;
        /// The bytes of every tensor together.
        fn total_size(self: &StreamingWriter) -> u64;
    }

    impl Box<StreamingWriter> {}
}

/// Tensors and metadata collected for one `serialize` or `save_file` call, declared and checked
/// by the core's [`Declarations`] (the rule C's writers follow too).
///
/// The tensor bytes are not copied: `Writer` keeps their addresses. That is sound because the
/// only user is the C++ wrapper in `include/safetensors/writer.hpp`, which creates a `Writer`,
/// feeds it spans that outlive the call (keeping its own copy of any tensor a range yields as a
/// temporary), writes, and drops it, all inside one function.
pub struct Writer {
    decls: Declarations,
    data: Vec<(*const u8, usize)>,
    /// The layout `prepare` made, which `write_into` writes: `serialize` sizes its buffer and
    /// fills it from one layout. It borrows the tensor bytes under the same rule as `data`.
    prepared: Option<PreparedFile<'static>>,
}

pub fn new_writer(target: &[u8]) -> Box<Writer> {
    let target = (!target.is_empty()).then(|| crate::status::native_path(target));
    Box::new(Writer {
        decls: Declarations::new(target),
        data: Vec::new(),
        prepared: None,
    })
}

impl Writer {
    pub fn add_tensor(
        &mut self,
        name: &[u8],
        dtype: u8,
        shape: &[usize],
        data: &[u8],
        status: &mut Status,
    ) {
        guard(status, || {
            self.decls.tensor(name, dtype, shape)?;
            self.data.push((data.as_ptr(), data.len()));
            self.prepared = None;
            Ok(())
        })
    }

    /// Writes `__metadata__` even when no key is added (an empty object, as Python writes for
    /// `metadata={}`).
    pub fn keep_metadata(&mut self) {
        self.decls.keep_empty_metadata();
        self.prepared = None;
    }

    pub fn add_metadata(&mut self, key: &[u8], value: &[u8], status: &mut Status) {
        guard(status, || {
            self.decls.metadata_entry(key, value)?;
            self.prepared = None;
            Ok(())
        })
    }

    /// # Safety
    /// Every span passed to `add_tensor` must still be alive.
    unsafe fn prepared_aligned(&self, alignment: usize) -> Result<PreparedFile<'_>, Error> {
        let data: Vec<&[u8]> = self
            .data
            .iter()
            .map(|&(ptr, len)| {
                // SAFETY: the caller guarantees the C++ spans are alive (see the type's docs);
                // an empty span may carry a null pointer, which a slice may not.
                if len == 0 {
                    &[][..]
                } else {
                    unsafe { std::slice::from_raw_parts(ptr, len) }
                }
            })
            .collect();
        self.decls.prepare(&data, alignment)
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

/// A file, or a sharded checkpoint, written in pieces: the core's [`CheckpointWriter`] (the one
/// C's `st_writer` holds too). Writes from several C++ threads share the lock; `finish` takes it
/// alone, so a `finish` racing with writes waits for them. The core writer stays after
/// `finish`: a failed one can be finished again, and after a successful one the core refuses
/// every call.
pub struct StreamingWriter {
    target: RwLock<CheckpointWriter>,
    /// What `finish` publishes, and the tensors' bytes.
    files: Vec<String>,
    total_size: u64,
}

/// The declarations C++ gives in one call (names, keys, values and the prefix in `text`, shapes
/// in `dims`), read into the core's [`Declarations`], which check them.
fn declared(
    target: &Path,
    tensors: &[TensorDecl],
    metadata: &[MetadataSpan],
    text: &[u8],
    dims: &[usize],
    empty_metadata: bool,
) -> Result<Declarations, Error> {
    let mut d = Declarations::with_capacity(Some(target), tensors.len())?;
    for t in tensors {
        d.tensor(
            part(text, t.name_start, t.name_len)?,
            t.dtype,
            part(dims, t.dims_start, t.rank)?,
        )?;
    }
    if empty_metadata {
        d.keep_empty_metadata();
    }
    for m in metadata {
        d.metadata_entry(
            part(text, m.key_start, m.key_len)?,
            part(text, m.value_start, m.value_len)?,
        )?;
    }
    Ok(d)
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
        let d = declared(path, tensors, metadata, text, dims, options.empty_metadata)?;
        let write = WriteOptions {
            durability: durability(options.sync),
            alignment: options.alignment,
        };
        let writer = if options.sharded {
            let prefix = d.shard_prefix(part(text, options.prefix_start, options.prefix_len)?)?;
            CheckpointWriter::sharded(
                path,
                &d,
                ShardOptions {
                    max_shard_size: options.max_shard_size,
                    prefix,
                    write,
                },
            )?
        } else {
            CheckpointWriter::file(path, &d, write)?
        };
        Ok(handed_over(StreamingWriter {
            files: writer.files(),
            total_size: writer.total_size(),
            target: RwLock::new(writer),
        }))
    })
}

impl StreamingWriter {
    /// Runs `f` on the writer, sharing it with other writes.
    fn with_target<T>(
        &self,
        f: impl FnOnce(&CheckpointWriter) -> Result<T, Error>,
    ) -> Result<T, Error> {
        f(&self.target.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes `data` at byte `offset` of the declared tensor at `index` (declaration order).
    pub(crate) fn write_index(&self, index: usize, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.with_target(|w| w.write_index(index, offset, data))
    }

    /// The name and bytes of each declared tensor, in declaration order.
    pub(crate) fn declared(&self) -> Result<Vec<(String, u64)>, Error> {
        self.with_target(|w| {
            Ok((0..w.tensor_count())
                .map(|i| (w.tensor_name(i).to_owned(), w.tensor_len(i)))
                .collect())
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
        // A name that is not UTF-8 was never declared: the core's rule (`lookup.rs`).
        guard(status, || {
            self.with_target(|w| match whole {
                true => w.write(name, data),
                false => w.write_at(name, offset, data),
            })
        })
    }

    pub fn finish(&self, status: &mut Status) {
        guard(status, || {
            self.target
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .finish()
        })
    }

    pub fn files(&self) -> Vec<String> {
        self.files.clone()
    }

    pub fn total_size(&self) -> u64 {
        self.total_size
    }
}
