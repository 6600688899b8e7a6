//! Sharded checkpoints: a `model.safetensors.index.json` and its shards, read as one.
//!
//! The index's `weight_map` is the authority. At open, the index is read like any other file
//! (a regular file only, size-capped), parsed (repeated names and metadata keys are refused),
//! every shard path is checked to name a file inside the index's directory, and every shard file
//! must exist. Shard paths are resolved against the index's directory made absolute at open, so
//! a later `chdir` cannot redirect them, and compared after lexical normalisation, so
//! `./a.safetensors` and `a.safetensors` are one shard. Shards are opened lazily, each at most
//! once, on first use of one of their tensors; opening one checks it against the index: every
//! tensor the index assigns to it must be there, and none of its tensors may be assigned to
//! another shard. Tensors a shard holds but the index does not list stay invisible. With the
//! read backend a shard keeps no descriptor between reads (see `SafeFile::open_unheld`).
//!
//! A plain `.safetensors` file opens as a checkpoint of one shard.
//!
//! An index that is not a local file (a remote one: [`Checkpoint::from_index_bytes`]) has its
//! shards next to it, named by joining the index's location with each confined shard path
//! (percent-encoded: a shard's name is never read as URL syntax), and opened by a
//! [`ShardOpener`]; no shard is checked to exist at open (that would cost a request
//! each): a missing one is `ShardMissing` when it is first opened.
//!
//! Lenient mode ([`CheckpointOptions::lenient`], opt-in) reads checkpoints as they exist in the
//! wild, as vLLM and transformers do: the index is an allow-list. A tensor the index lists but
//! its shard lacks (a stale index) is `ShardMissing` only when someone asks for it, and
//! [`Checkpoint::missing`] lists them all; a copy of a tensor in a shard the index does not
//! assign it to (shards reused between checkpoints) is ignored. A shard *file* that does not
//! exist is still `ShardMissing` at open: that is a broken download, not a quirk.

mod index;
mod paths;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::file::{read_regular, Backend, OpenOptions, Populate, SafeFile};
use crate::header::TensorInfo;
use index::parse_index;
pub use index::MAX_INDEX_SIZE;
use paths::{check_shard_file, confined, index_dir, is_index_path};

/// Options for [`Checkpoint::open_with`]. The default is strict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointOptions {
    /// How tensor bytes are reached.
    pub backend: Backend,
    /// Read the index as an allow-list (see the module documentation).
    pub lenient: bool,
    /// Open shards (or the single file) with bytes after their last tensor; see
    /// [`OpenOptions::allow_trailing_bytes`] and [`Checkpoint::trailing_bytes`].
    pub allow_trailing_bytes: bool,
    /// When each mapped shard's pages are brought in, from the shard's open on (see
    /// [`OpenOptions::populate`]).
    pub populate: Populate,
    /// Huge pages advised on each mapped shard (see [`OpenOptions::huge_pages`]).
    pub huge_pages: bool,
}

impl CheckpointOptions {
    fn file_options(&self) -> OpenOptions {
        OpenOptions {
            backend: self.backend,
            allow_trailing_bytes: self.allow_trailing_bytes,
            populate: self.populate,
            huge_pages: self.huge_pages,
        }
    }
}

/// Opens the shards of a checkpoint whose index is not a local file ([`Checkpoint::from_index_bytes`]).
pub trait ShardOpener: Send + Sync {
    /// Opens the shard at `location` (the index's location joined with the shard's path). An
    /// `Io` error whose cause is "not found" becomes `ShardMissing`.
    fn open_shard(&self, location: &str, options: OpenOptions) -> Result<SafeFile>;
}

struct Shard {
    /// The file name as the index spells it.
    name: String,
    path: PathBuf,
    file: OnceLock<Arc<SafeFile>>,
    opening: Mutex<()>,
}

/// A checkpoint of one or more safetensors files.
///
/// ```no_run
/// use safetensors_core::{Backend, Checkpoint};
/// let ckpt = Checkpoint::open("model.safetensors.index.json", Backend::Mmap)?;
/// let (file, info) = ckpt.locate("model.embed_tokens.weight")?;
/// # Ok::<(), safetensors_core::Error>(())
/// ```
pub struct Checkpoint {
    path: PathBuf,
    /// Tensor names, sorted, with the shard each one is in.
    names: Vec<String>,
    shard_of: Vec<u32>,
    shards: Vec<Shard>,
    metadata: Option<BTreeMap<String, String>>,
    options: CheckpointOptions,
    opens: AtomicUsize,
    /// Opens the shards when they are not local files.
    opener: Option<Box<dyn ShardOpener>>,
}

impl Checkpoint {
    /// Opens an index (a path ending in `.json`, in any case) or a single safetensors file.
    pub fn open(path: impl AsRef<Path>, backend: Backend) -> Result<Checkpoint> {
        Checkpoint::open_with(
            path,
            CheckpointOptions {
                backend,
                ..CheckpointOptions::default()
            },
        )
    }

    /// [`Checkpoint::open`] with every option (lenient mode, trailing bytes).
    pub fn open_with(path: impl AsRef<Path>, options: CheckpointOptions) -> Result<Checkpoint> {
        let path = path.as_ref();
        if is_index_path(path) {
            Self::from_index_inner(path, options).map_err(|e| e.in_file(path))
        } else {
            Checkpoint::from_file_with(path, options)
        }
    }

    /// A single file as a checkpoint of one shard (opened now).
    pub fn from_file(path: impl AsRef<Path>, backend: Backend) -> Result<Checkpoint> {
        Checkpoint::from_file_with(
            path,
            CheckpointOptions {
                backend,
                ..CheckpointOptions::default()
            },
        )
    }

    fn from_file_with(path: impl AsRef<Path>, options: CheckpointOptions) -> Result<Checkpoint> {
        let path = path.as_ref();
        let file = SafeFile::open_with(path, options.file_options())?;
        Ok(Checkpoint::of_file(file, options))
    }

    /// A file already open (a remote one, say) as a checkpoint of one shard; its path is the
    /// checkpoint's. `options` says what its shards were opened with.
    pub fn of_file(file: SafeFile, options: CheckpointOptions) -> Checkpoint {
        let path = file.path().to_path_buf();
        let names: Vec<String> = file
            .header()
            .sorted_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let shard = Shard {
            name: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            path: path.clone(),
            file: OnceLock::new(),
            opening: Mutex::new(()),
        };
        let metadata = file.header().metadata().cloned();
        let _ = shard.file.set(Arc::new(file));
        Checkpoint {
            path,
            shard_of: vec![0; names.len()],
            names,
            shards: vec![shard],
            metadata,
            options,
            opens: AtomicUsize::new(1),
            opener: None,
        }
    }

    /// Parses a Hugging Face index: `{"metadata": {...}, "weight_map": {"tensor": "shard", ...}}`.
    pub fn from_index(path: impl AsRef<Path>, backend: Backend) -> Result<Checkpoint> {
        let path = path.as_ref();
        let options = CheckpointOptions {
            backend,
            ..CheckpointOptions::default()
        };
        Self::from_index_inner(path, options).map_err(|e| e.in_file(path))
    }

    fn from_index_inner(path: &Path, options: CheckpointOptions) -> Result<Checkpoint> {
        let text = read_regular(path, "a checkpoint index", MAX_INDEX_SIZE)?;
        let dir = index_dir(path)?;
        Self::build(path, &text, options, None, |shard, relative| {
            let full = dir.join(relative);
            check_shard_file(shard, &full)?;
            Ok(full)
        })
    }

    /// A checkpoint whose index is not a local file: `text` is the index's content (at most
    /// [`MAX_INDEX_SIZE`] bytes), `name` stands for it in messages (its URL), and each shard is
    /// `base` (the index's location up to and including its last `/`) followed by the shard's
    /// path confined as for a local index, its components percent-encoded (a shard is the
    /// object of exactly the name the index gives, never URL syntax) and joined with `/`,
    /// opened by `opener` on first use and checked against the index as a local shard is.
    /// `options.backend` and the mapping options are the opener's to honour or ignore.
    pub fn from_index_bytes(
        name: &str,
        text: &[u8],
        base: &str,
        opener: Box<dyn ShardOpener>,
        options: CheckpointOptions,
    ) -> Result<Checkpoint> {
        let path = Path::new(name);
        if text.len() as u64 > MAX_INDEX_SIZE {
            return Err(Error::InvalidIndex {
                reason: format!(
                    "the index is {} bytes; the limit is {MAX_INDEX_SIZE}",
                    text.len()
                ),
            }
            .in_file(path));
        }
        Self::build(path, text, options, Some(opener), |_, relative| {
            let mut location = base.to_owned();
            for (k, part) in relative.iter().enumerate() {
                if k > 0 {
                    location.push('/');
                }
                crate::url::push_url_segment(&mut location, &part.to_string_lossy());
            }
            Ok(PathBuf::from(location))
        })
        .map_err(|e| e.in_file(path))
    }

    /// A checkpoint from its index's text, each shard's location given by `resolve(shard as
    /// the index spells it, its confined relative path)`.
    fn build(
        path: &Path,
        text: &[u8],
        options: CheckpointOptions,
        opener: Option<Box<dyn ShardOpener>>,
        mut resolve: impl FnMut(&str, &Path) -> Result<PathBuf>,
    ) -> Result<Checkpoint> {
        let (metadata, weight_map) = parse_index(text)?;
        let mut shard_ids: BTreeMap<PathBuf, u32> = BTreeMap::new();
        let mut shards = Vec::new();
        let mut entries: Vec<(String, u32)> = Vec::with_capacity(weight_map.len());
        for (tensor, shard) in &weight_map {
            let relative = confined(shard)?;
            let id = match shard_ids.get(&relative) {
                Some(&id) => id,
                None => {
                    let full = resolve(shard, &relative)?;
                    let id = shards.len() as u32;
                    shards.push(Shard {
                        name: shard.clone(),
                        path: full,
                        file: OnceLock::new(),
                        opening: Mutex::new(()),
                    });
                    shard_ids.insert(relative, id);
                    id
                }
            };
            entries.push((tensor.clone(), id));
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::DuplicateKey {
                key: w[0].0.clone(),
                in_metadata: false,
            });
        }
        let (names, shard_of) = entries.into_iter().unzip();
        Ok(Checkpoint {
            path: path.to_path_buf(),
            names,
            shard_of,
            shards,
            metadata,
            options,
            opens: AtomicUsize::new(0),
            opener,
        })
    }

    /// The path given to [`Checkpoint::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// `true` when the checkpoint lists no tensor.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Tensor names, sorted byte-wise.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index's `metadata` (values that are not strings are given as their exact JSON text,
    /// e.g. `total_size` written `1e3` stays `1e3`), or the single file's `__metadata__`.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Position of `name` in [`Checkpoint::names`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }

    /// Which shard holds `name`, or `TensorNotFound`.
    pub fn shard_of(&self, name: &str) -> Result<usize> {
        self.position(name)
            .map(|i| self.shard_of[i] as usize)
            .ok_or_else(|| {
                Error::TensorNotFound {
                    name: name.to_owned(),
                }
                .in_file(&self.path)
            })
    }

    /// Number of shard files.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Path of shard `i`: absolute for an index's shards (resolved at open), as given for a
    /// single file.
    pub fn shard_path(&self, i: usize) -> Option<&Path> {
        self.shards.get(i).map(|s| s.path.as_path())
    }

    /// Whether shard `i` has been opened.
    pub fn shard_is_open(&self, i: usize) -> bool {
        self.shards.get(i).is_some_and(|s| s.file.get().is_some())
    }

    /// How many shard files have been opened so far (each is opened at most once).
    pub fn shards_opened(&self) -> usize {
        self.opens.load(Ordering::Relaxed)
    }

    /// Shard `i`, opened and checked against the index on first use.
    pub fn shard(&self, i: usize) -> Result<&Arc<SafeFile>> {
        let shard = self.shards.get(i).ok_or_else(|| Error::InvalidIndex {
            reason: format!("no shard {i}; the index names {}", self.shards.len()),
        })?;
        if let Some(file) = shard.file.get() {
            return Ok(file);
        }
        let _guard = shard.opening.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = shard.file.get() {
            return Ok(file);
        }
        let opened = match &self.opener {
            Some(opener) => {
                opener.open_shard(&shard.path.to_string_lossy(), self.options.file_options())
            }
            None => SafeFile::open_unheld(&shard.path, self.options.file_options()),
        };
        let file = opened.map_err(|e| {
            // Deleted since the index was opened: the same `ShardMissing` as at open.
            match e.innermost() {
                Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    Error::ShardMissing {
                        shard: shard.name.clone(),
                        tensor: None,
                    }
                    .in_file(&self.path)
                }
                _ => e,
            }
        })?;
        self.check_shard(i as u32, &file)
            .map_err(|e| e.in_file(&self.path))?;
        self.opens.fetch_add(1, Ordering::Relaxed);
        Ok(shard.file.get_or_init(|| Arc::new(file)))
    }

    /// The file holding `name` and the tensor's description.
    pub fn locate(&self, name: &str) -> Result<(&SafeFile, TensorInfo<'_>)> {
        let file = self.shard(self.shard_holding(name)?)?;
        let info = file.info(name)?;
        Ok((file, info))
    }

    /// The shard holding `name`, opened: [`Checkpoint::shard_of`], then (in lenient mode, where
    /// opening a shard does not check this) `ShardMissing` when the shard lacks the tensor.
    pub fn shard_holding(&self, name: &str) -> Result<usize> {
        let i = self.shard_of(name)?;
        let file = self.shard(i)?;
        if file.header().position(name).is_none() {
            return Err(self.missing_in(i, name));
        }
        Ok(i)
    }

    fn missing_in(&self, shard: usize, name: &str) -> Error {
        Error::ShardMissing {
            shard: self.shards[shard].name.clone(),
            tensor: Some(name.to_owned()),
        }
        .in_file(&self.path)
    }

    /// Whether this checkpoint was opened in lenient mode.
    pub fn is_lenient(&self) -> bool {
        self.options.lenient
    }

    /// Tensors the index lists but their shard lacks, sorted, each with its shard's index.
    /// Opens every shard to know (an error opening one is returned). Always empty in strict
    /// mode, where such a shard fails to open instead.
    pub fn missing(&self) -> Result<Vec<(String, usize)>> {
        let mut out = Vec::new();
        for i in 0..self.shards.len() {
            let file = self.shard(i)?;
            for (name, _) in self
                .names
                .iter()
                .zip(&self.shard_of)
                .filter(|(_, &s)| s as usize == i)
            {
                if file.header().position(name).is_none() {
                    out.push((name.clone(), i));
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Shards with bytes after their last tensor, as (shard index, byte count); opens every
    /// shard to know. Always empty unless opened with `allow_trailing_bytes`.
    pub fn trailing_bytes(&self) -> Result<Vec<(usize, u64)>> {
        let mut out = Vec::new();
        for i in 0..self.shards.len() {
            let n = self.shard(i)?.trailing_bytes();
            if n > 0 {
                out.push((i, n));
            }
        }
        Ok(out)
    }

    /// The index is the authority: the shard must hold what it is assigned, and nothing that
    /// is assigned elsewhere. In lenient mode neither is checked here: a missing tensor is an
    /// error when asked for ([`Checkpoint::shard_holding`]), a copy assigned elsewhere is never
    /// read (lookups go through the index).
    fn check_shard(&self, id: u32, file: &SafeFile) -> Result<()> {
        if self.options.lenient {
            return Ok(());
        }
        let shard = &self.shards[id as usize];
        for (name, _) in self
            .names
            .iter()
            .zip(&self.shard_of)
            .filter(|(_, &s)| s == id)
        {
            if file.header().position(name).is_none() {
                return Err(Error::ShardMissing {
                    shard: shard.name.clone(),
                    tensor: Some(name.clone()),
                });
            }
        }
        for info in file.header().iter() {
            if let Some(pos) = self.position(info.name) {
                let owner = self.shard_of[pos];
                if owner != id {
                    return Err(Error::ShardMismatch {
                        tensor: info.name.to_owned(),
                        found_in: shard.name.clone(),
                        claimed_by: Some(self.shards[owner as usize].name.clone()),
                    });
                }
            }
        }
        Ok(())
    }
}
