//! [`ShardedWriter`]: a checkpoint of several files and its index, written in pieces as a
//! [`StreamWriter`] writes one file, and published as a set.
//!
//! Decisions (docs/writing.md states them for users):
//! - Which tensor goes where, the file names and the index's text are `huggingface_hub`'s
//!   (`shards.rs`). Every shard gets the caller's metadata as its `__metadata__`; the index gets
//!   `total_size` followed by the same metadata.
//! - Every shard (and the index) is a staged temporary file from the start: the whole
//!   checkpoint is reserved on the disk when the writer is made, and while it is written
//!   nothing in the directory changes. Each shard holds two descriptors until `finish`.
//! - Publishing (`finish`), once every shard is complete (and synced), is a transaction
//!   (`publish.rs`): the checkpoint already in the directory stays whole and openable through
//!   its index until the new one is complete, whatever fails and wherever a crash stops it; on
//!   a failure the directory is put back as it was and the writer may finish again.
//! - A crash before publishing leaves the directory as it was. Where the filesystem lacks
//!   unnamed temporary files, a crash may also leave hidden `.st-*.tmp` files (as for
//!   `save_file`).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::atomic::Staged;
use super::layout::{check_entries, data_alignment, Entry};
use super::publish::{publish, Failed, NewSet};
use super::shards::{index_name, index_text, plan_shards, DEFAULT_MAX_SHARD_SIZE};
use super::streaming::{published, StreamWriter, TensorSpec, WriteOptions};
use super::{noted, Durability};
use crate::error::{Error, Result};

/// How a sharded checkpoint is cut and named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardOptions {
    /// The most tensor bytes in one shard (a larger tensor gets a shard of its own); by default
    /// `huggingface_hub`'s 5 GB (5,000,000,000 bytes).
    pub max_shard_size: u64,
    /// The files' common name: `{prefix}.safetensors` for one shard,
    /// `{prefix}-00001-of-0000N.safetensors` and `{prefix}.safetensors.index.json` for more.
    pub prefix: String,
    /// Durability and alignment, for every shard.
    pub write: WriteOptions,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
            prefix: "model".into(),
            write: WriteOptions::default(),
        }
    }
}

/// A sharded checkpoint written in pieces (see the module documentation).
///
/// ```
/// use safetensors_core::{Dtype, ShardOptions, ShardedWriter, TensorSpec};
/// # let dir = std::env::temp_dir().join(format!("sharded-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let specs = [TensorSpec::new("a", Dtype::U8, &[4]), TensorSpec::new("b", Dtype::U8, &[4])];
/// let options = ShardOptions { max_shard_size: 4, ..ShardOptions::default() };
/// let mut w = ShardedWriter::create(&dir, &specs, None, options)?;
/// w.write("a", &[1; 4])?;
/// w.write("b", &[2; 4])?;
/// assert_eq!(w.files(), ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
///                        "model.safetensors.index.json"]);
/// w.finish()?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub struct ShardedWriter {
    dir: PathBuf,
    prefix: String,
    durability: Durability,
    shards: Vec<StreamWriter>,
    /// The shards' file names, in order.
    names: Vec<String>,
    /// For each declared tensor (declaration order): its shard and its position there.
    route: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
    /// The index and its bytes; none for a checkpoint of one file.
    index: Option<(Staged, Vec<u8>)>,
    total_size: u64,
    /// Whether `finish` put the set in place.
    published: bool,
    /// Why the writer cannot finish (a failed sync, a rollback that could not complete).
    failed: Option<Error>,
}

impl ShardedWriter {
    /// Plans the shards of `tensors` (in the order given) and creates every shard's temporary
    /// file in `dir` (an existing directory), headers written. Errors: those of
    /// [`StreamWriter::create`], and `InvalidShardPath` for a prefix that is not a plain file
    /// name.
    pub fn create(
        dir: impl AsRef<Path>,
        tensors: &[TensorSpec],
        metadata: Option<&BTreeMap<String, String>>,
        options: ShardOptions,
    ) -> Result<ShardedWriter> {
        let dir = dir.as_ref();
        ShardedWriter::create_inner(dir, tensors, metadata, options).map_err(|e| e.in_file(dir))
    }

    fn create_inner(
        dir: &Path,
        tensors: &[TensorSpec],
        metadata: Option<&BTreeMap<String, String>>,
        options: ShardOptions,
    ) -> Result<ShardedWriter> {
        check_prefix(&options.prefix)?;
        data_alignment(options.write.alignment)?;
        let entries: Vec<Entry<'_>> = tensors
            .iter()
            .map(|t| Entry {
                name: &t.name,
                dtype: t.dtype,
                shape: &t.shape,
                given: None,
            })
            .collect();
        let sizes: Vec<u64> = check_entries(&entries)?
            .into_iter()
            .map(|n| n as u64)
            .collect();
        let plan = plan_shards(&sizes, options.max_shard_size, &options.prefix).map_err(|i| {
            Error::ValidationOverflow {
                tensor: tensors[i].name.clone(),
                shape: tensors[i].shape.clone(),
            }
        })?;
        let mut route = vec![(0, 0); tensors.len()];
        let mut shards = Vec::with_capacity(plan.shards.len());
        for (s, (file, members)) in plan.shards.iter().enumerate() {
            let specs: Vec<TensorSpec> = members.iter().map(|&i| tensors[i].clone()).collect();
            for (k, &i) in members.iter().enumerate() {
                route[i] = (s, k);
            }
            shards.push(StreamWriter::create(
                dir.join(file),
                &specs,
                metadata,
                options.write,
            )?);
        }
        let index = if plan.shards.len() > 1 {
            let path = dir.join(index_name(&options.prefix));
            let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            Some((Staged::create(&path)?, index_text(&plan, &names, metadata)))
        } else {
            None
        };
        Ok(ShardedWriter {
            dir: dir.to_path_buf(),
            prefix: options.prefix,
            durability: options.write.durability,
            names: plan.shards.into_iter().map(|(name, _)| name).collect(),
            shards,
            route,
            by_name: tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            index,
            total_size: plan.total_size,
            published: false,
            failed: None,
        })
    }

    /// The files `finish` publishes, relative to the directory: the shards in order, then the
    /// index when there is one.
    pub fn files(&self) -> Vec<String> {
        let mut out = self.names.clone();
        if self.index.is_some() {
            out.push(index_name(&self.prefix));
        }
        out
    }

    /// The bytes of every tensor together (the index's `total_size`).
    pub fn total_size(&self) -> u64 {
        self.total_size
    }

    /// The position of `name` among the declared tensors (`TensorNotFound`).
    pub fn position(&self, name: &str) -> Result<usize> {
        self.by_name.get(name).copied().ok_or_else(|| {
            Error::TensorNotFound {
                name: name.to_owned(),
            }
            .in_file(&self.dir)
        })
    }

    /// Number of declared tensors.
    pub fn tensor_count(&self) -> usize {
        self.route.len()
    }

    /// Bytes of the declared tensor at `index` (declaration order); 0 past the end.
    pub fn tensor_len(&self, index: usize) -> u64 {
        self.route
            .get(index)
            .map_or(0, |&(s, k)| self.shards[s].tensor_len(k))
    }

    /// The name of the declared tensor at `index` ("" past the end).
    pub fn tensor_name(&self, index: usize) -> &str {
        self.route
            .get(index)
            .map_or("", |&(s, k)| self.shards[s].tensor_name(k))
    }

    /// Writes all of tensor `name` (see [`StreamWriter::write`]).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.check_open()?;
        let (s, k) = self.route[self.position(name)?];
        let shard = &self.shards[s];
        if bytes.len() as u64 != shard.tensor_len(k) {
            // The shard's own check says it, naming the shard.
            return shard.write(name, bytes);
        }
        shard.write_index(k, 0, bytes)
    }

    /// Writes `bytes` at byte `offset` of tensor `name` (see [`StreamWriter::write_at`]).
    pub fn write_at(&self, name: &str, offset: u64, bytes: &[u8]) -> Result<()> {
        self.write_index(self.position(name)?, offset, bytes)
    }

    /// [`ShardedWriter::write_at`] for the declared tensor at `index` (declaration order).
    pub fn write_index(&self, index: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        self.check_open()?;
        let &(s, k) = self.route.get(index).ok_or_else(|| Error::Internal {
            message: format!(
                "tensor position {index} of a writer of {} tensors",
                self.route.len()
            ),
        })?;
        self.shards[s].write_index(k, offset, bytes)
    }

    /// Checks that every shard is complete, then publishes the set as a transaction (see
    /// `publish.rs`): the checkpoint already in the directory stays whole until the new one is.
    /// On an error nothing was published and, unless the error says the writer cannot finish
    /// (a failed write or sync, or a rollback that could not complete), the writer may be
    /// finished again once the cause is fixed (write the missing bytes, clear the way). After
    /// success every call is refused.
    pub fn finish(&mut self) -> Result<()> {
        let dir = self.dir.clone();
        self.publish().map_err(|e| e.in_file(&dir))
    }

    /// Refuses every call after a `finish` that published or that left the writer unable to.
    fn check_open(&self) -> Result<()> {
        if self.published {
            return Err(published(&self.dir));
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn publish(&mut self) -> Result<()> {
        self.check_open()?;
        let synced = self.durability == Durability::Synced;
        for shard in &self.shards {
            shard.check_complete()?;
        }
        if let Some((staged, text)) = &self.index {
            staged
                .file()
                .write_all_at(text, 0)
                .map_err(|e| Error::io(staged.path(), "write", e))?;
            if synced {
                staged.sync().map_err(|e| {
                    self.fail(noted(
                        e,
                        "the disk may not hold what was written: write the checkpoint again",
                    ))
                })?;
            }
        }
        if synced {
            for shard in &self.shards {
                shard.sync()?;
            }
        }
        let set = NewSet {
            dir: &self.dir,
            prefix: &self.prefix,
            shards: self
                .names
                .iter()
                .map(String::as_str)
                .zip(self.shards.iter_mut().map(StreamWriter::staged))
                .collect(),
            index: self.index.as_mut().map(|(staged, _)| staged),
            synced,
        };
        match publish(set) {
            Ok(()) => {
                self.set_published();
                Ok(())
            }
            Err(Failed::Unchanged(e)) => Err(e),
            Err(Failed::Published(e)) => {
                self.set_published();
                Err(e)
            }
            Err(Failed::Stuck(e)) => Err(self.fail(e)),
            Err(Failed::Crashed) => Err(self.fail(Error::Internal {
                message: "the test's simulated crash".into(),
            })),
        }
    }

    fn set_published(&mut self) {
        self.published = true;
        for shard in &mut self.shards {
            shard.set_published();
        }
    }

    /// Records `e` as the reason the writer cannot finish, reported by every later call.
    fn fail(&mut self, e: Error) -> Error {
        self.failed.get_or_insert(e).clone()
    }
}

/// Refuses a prefix that would put the files outside the directory, or name no file.
fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix == "." || prefix == ".." || prefix.contains(['/', '\0']) {
        return Err(Error::InvalidShardPath {
            shard: format!("{prefix}.safetensors"),
        });
    }
    Ok(())
}
