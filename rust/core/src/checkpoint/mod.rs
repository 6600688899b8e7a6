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
mod name_list;
mod paths;
mod shard;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::file::{read_regular, Backend, OpenOptions, Populate, SafeFile};
use crate::header::names::NameIndex;
use crate::header::TensorInfo;
use index::parse_index;
pub use index::MAX_INDEX_SIZE;
pub use name_list::{NameIter, NameList};
use paths::{check_shard_file, confined, index_dir, is_index_path};
use shard::Shard;

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

/// `Checkpoint::entry` before the tensor's shard is open.
const UNKNOWN: u32 = u32::MAX;
/// `Checkpoint::entry` of a tensor its (open) shard lacks (lenient mode).
const ABSENT: u32 = u32::MAX - 1;

/// Where [`Checkpoint::find`] found a tensor the index lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// In shard `shard` (open), at position `entry` of its offset order.
    At {
        /// The shard.
        shard: usize,
        /// The tensor's position in the shard's offset order.
        entry: usize,
    },
    /// In shard `shard`, which is not open yet.
    Unopened {
        /// The shard.
        shard: usize,
    },
    /// Assigned to shard `shard`, which lacks it (lenient mode).
    Missing {
        /// The shard.
        shard: usize,
    },
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
    names: NameList,
    shard_of: Vec<u32>,
    /// Name → sorted position.
    lookup: NameIndex,
    /// The sorted positions of each shard's tensors: shard `s`'s are
    /// `members[starts[s]..starts[s + 1]]`, ascending.
    starts: Vec<u32>,
    members: Vec<u32>,
    /// Each position's entry in its shard's offset order, filled when the shard is opened
    /// (`UNKNOWN` before, `ABSENT` when it lacks the tensor): a lookup of a tensor in an open
    /// shard is one hash probe and one load, no lock and no header lookup.
    entry: Vec<AtomicU32>,
    /// The position after the last one a lookup found (see [`Checkpoint::position_bytes`]).
    hint: AtomicUsize,
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
        let names: NameList = file.header().sorted_names().into_iter().collect();
        let shard = Shard::new(
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            path.clone(),
        );
        let metadata = file.header().metadata().cloned();
        let count = names.len();
        let ckpt = Checkpoint::assemble(
            path,
            names,
            vec![0; count],
            vec![shard],
            metadata,
            options,
            None,
        );
        // The file's own names: none is missing, none is another shard's.
        let entries = ckpt.place_entries(0, &file).unwrap_or_default();
        ckpt.shards[0].publish(Arc::new(file), entries);
        ckpt.opens.store(1, Ordering::Relaxed);
        ckpt
    }

    /// A checkpoint of these sorted, distinct names (each in shard `shard_of[i]`), no shard
    /// open yet.
    fn assemble(
        path: PathBuf,
        names: NameList,
        shard_of: Vec<u32>,
        shards: Vec<Shard>,
        metadata: Option<BTreeMap<String, String>>,
        options: CheckpointOptions,
        opener: Option<Box<dyn ShardOpener>>,
    ) -> Checkpoint {
        // Distinct names (checked by the caller), so the build never reports a repeat.
        let lookup = NameIndex::build(names.len(), |i| &names[i as usize]).unwrap_or_default();
        // The positions grouped by shard, ascending within each (a counting sort).
        let mut starts = vec![0u32; shards.len() + 1];
        for &s in &shard_of {
            starts[s as usize + 1] += 1;
        }
        for s in 0..shards.len() {
            starts[s + 1] += starts[s];
        }
        let mut next = starts.clone();
        let mut members = vec![0u32; shard_of.len()];
        for (pos, &s) in shard_of.iter().enumerate() {
            members[next[s as usize] as usize] = pos as u32;
            next[s as usize] += 1;
        }
        let entry = (0..names.len()).map(|_| AtomicU32::new(UNKNOWN)).collect();
        Checkpoint {
            path,
            names,
            shard_of,
            lookup,
            starts,
            members,
            entry,
            hint: AtomicUsize::new(0),
            shards,
            metadata,
            options,
            opens: AtomicUsize::new(0),
            opener,
        }
    }

    /// The sorted positions of the tensors the index assigns to shard `id`.
    fn members_of(&self, id: usize) -> &[u32] {
        &self.members[self.starts[id] as usize..self.starts[id + 1] as usize]
    }

    /// Checks shard `id`'s file against the index and records where each of its tensors is in
    /// it: returns the entries the index assigns to it, ascending. Called once per shard,
    /// before it is published; on an error nothing is recorded.
    ///
    /// The index is the authority: the shard must hold what it is assigned (else
    /// `ShardMissing`, checked first), and nothing that is assigned elsewhere (else
    /// `ShardMismatch`). In lenient mode neither is an error: a missing tensor is recorded as
    /// such and is an error when asked for ([`Checkpoint::place`]), a copy assigned elsewhere is
    /// never read (lookups go through the index).
    ///
    /// Each of the shard's tensors is looked up in the shard's own small name table, which the
    /// parse just built and the cache still holds; the checkpoint's table (some 90,000 names
    /// for a mixture-of-experts model) is asked only about tensors of the shard the index does
    /// not assign to it, which a checkpoint as saved has none of.
    fn place_entries(&self, id: usize, file: &SafeFile) -> Result<Vec<usize>> {
        let header = file.header();
        let members = self.members_of(id);
        let mut entries = Vec::with_capacity(members.len());
        let mut missing = None;
        for &pos in members {
            let name = &self.names[pos as usize];
            let value = match header.position(name) {
                Some(e) => {
                    entries.push(e);
                    e as u32
                }
                None if self.options.lenient => ABSENT,
                None => {
                    missing.get_or_insert_with(|| Error::ShardMissing {
                        shard: self.shards[id].name.clone(),
                        tensor: Some(name.to_owned()),
                    });
                    UNKNOWN
                }
            };
            self.entry[pos as usize].store(value, Ordering::Relaxed);
        }
        let mut mismatch = None;
        if entries.len() < header.len() && !self.options.lenient {
            // Some tensor of the shard is not one the index assigns to it: unlisted (fine), or
            // assigned to another shard (refused).
            let mut mine = vec![false; header.len()];
            for &e in &entries {
                mine[e] = true;
            }
            for (e, name) in header.offset_names().enumerate() {
                if mine[e] {
                    continue;
                }
                if let Some(pos) = self.position(name) {
                    let owner = self.shard_of[pos] as usize;
                    if owner != id {
                        mismatch = Some(Error::ShardMismatch {
                            tensor: name.to_owned(),
                            found_in: self.shards[id].name.clone(),
                            claimed_by: Some(self.shards[owner].name.clone()),
                        });
                        break;
                    }
                }
            }
        }
        if let Some(e) = missing.or(mismatch) {
            for &pos in members {
                self.entry[pos as usize].store(UNKNOWN, Ordering::Relaxed);
            }
            return Err(e);
        }
        entries.sort_unstable();
        Ok(entries)
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
    ///
    /// Per shard, not per entry: a shard's spelling is confined and resolved once (an index of
    /// 90,000 tensors names some 160 shards; consecutive entries mostly name the same one, which
    /// is tried first). The names are sorted only when the index's order is not already sorted
    /// (Hugging Face tools write them sorted).
    fn build(
        path: &Path,
        text: &[u8],
        options: CheckpointOptions,
        opener: Option<Box<dyn ShardOpener>>,
        mut resolve: impl FnMut(&str, &Path) -> Result<PathBuf>,
    ) -> Result<Checkpoint> {
        let (metadata, weight_map) = parse_index(text)?;
        let mut by_spelling: std::collections::HashMap<&str, u32> = Default::default();
        let mut by_relative: BTreeMap<PathBuf, u32> = BTreeMap::new();
        let mut shards = Vec::new();
        let mut ids: Vec<u32> = Vec::with_capacity(weight_map.len());
        let mut last: Option<(&str, u32)> = None;
        for (_, shard) in &weight_map {
            let shard: &str = shard;
            let id = match last {
                Some((spelling, id)) if spelling == shard => id,
                _ => match by_spelling.get(shard) {
                    Some(&id) => id,
                    None => {
                        let relative = confined(shard)?;
                        let id = match by_relative.get(&relative) {
                            Some(&id) => id,
                            None => {
                                let full = resolve(shard, &relative)?;
                                let id = shards.len() as u32;
                                shards.push(Shard::new(shard.to_owned(), full));
                                by_relative.insert(relative, id);
                                id
                            }
                        };
                        by_spelling.insert(shard, id);
                        id
                    }
                },
            };
            last = Some((shard, id));
            ids.push(id);
        }
        let name = |i: u32| weight_map[i as usize].0.as_bytes();
        let mut order: Vec<u32> = (0..weight_map.len() as u32).collect();
        if !order.windows(2).all(|w| name(w[0]) < name(w[1])) {
            order.sort_unstable_by(|&a, &b| name(a).cmp(name(b)));
            if let Some(w) = order.windows(2).find(|w| name(w[0]) == name(w[1])) {
                return Err(Error::DuplicateKey {
                    key: weight_map[w[0] as usize].0.to_string(),
                    in_metadata: false,
                });
            }
        }
        let bytes = weight_map.iter().map(|(n, _)| n.len()).sum();
        let mut names = NameList::with_capacity(order.len(), bytes);
        for &i in &order {
            names.push(&weight_map[i as usize].0);
        }
        let shard_of = order.iter().map(|&i| ids[i as usize]).collect();
        Ok(Checkpoint::assemble(
            path.to_path_buf(),
            names,
            shard_of,
            shards,
            metadata,
            options,
            opener,
        ))
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
    pub fn names(&self) -> &NameList {
        &self.names
    }

    /// The index's `metadata` (values that are not strings are given as their exact JSON text,
    /// e.g. `total_size` written `1e3` stays `1e3`), or the single file's `__metadata__`.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Position of `name` in [`Checkpoint::names`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.position_bytes(name.as_bytes())
    }

    /// Position of the name of these bytes in [`Checkpoint::names`] (bytes that are not UTF-8
    /// match no name).
    ///
    /// Callers mostly ask in the order of [`Checkpoint::names`] (`keys()`, then each tensor's
    /// `info`): the name after the last one found is tried first, one comparison of memory the
    /// cache holds, before the hash table, whose probe is a cache miss in a table of 90,000
    /// names. The hint is only a guess: a lookup's answer never depends on it.
    pub fn position_bytes(&self, name: &[u8]) -> Option<usize> {
        let next = self.hint.load(Ordering::Relaxed);
        if self.names.get(next).is_some_and(|n| n.as_bytes() == name) {
            self.hint.store(next + 1, Ordering::Relaxed);
            return Some(next);
        }
        let found = self
            .lookup
            .find(name, |i| self.names[i as usize].as_bytes())
            .map(|i| i as usize)?;
        self.hint.store(found + 1, Ordering::Relaxed);
        Some(found)
    }

    /// Where the tensor of these bytes is, without a lock or an allocation: `None` when the
    /// index does not list it. The fast path of every lookup: once its shard is open, a
    /// tensor's place costs one hash probe and one load.
    pub fn find(&self, name: &[u8]) -> Option<Found> {
        let pos = self.position_bytes(name)?;
        let shard = self.shard_of[pos] as usize;
        Some(match self.entry[pos].load(Ordering::Relaxed) {
            // The entry is filled before the shard is published: make sure it is.
            UNKNOWN => Found::Unopened { shard },
            ABSENT => Found::Missing { shard },
            entry if self.shards[shard].opened().is_some() => Found::At {
                shard,
                entry: entry as usize,
            },
            _ => Found::Unopened { shard },
        })
    }

    /// The entries of shard `i` (positions in its offset order) that the index assigns to it
    /// and it holds, ascending: what iterating over the checkpoint reads from it. Opens it.
    pub fn shard_entries(&self, i: usize) -> Result<&[usize]> {
        self.shard(i)?; // acquired there
        Ok(self.shards[i].entries.get().map_or(&[], Vec::as_slice))
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

    /// The file holding `name` and the tensor's description.
    pub fn locate(&self, name: &str) -> Result<(&SafeFile, TensorInfo<'_>)> {
        let (shard, entry) = self.place(name)?;
        let file = self.shards[shard].opened().ok_or_else(|| Error::Internal {
            message: format!("shard {shard} was placed but is not open"),
        })?;
        let info = file.header().at(entry).ok_or_else(|| Error::Internal {
            message: format!("entry {entry} of shard {shard} is past its last"),
        })?;
        Ok((file, info))
    }

    /// The shard holding `name` (opened now if it is not yet) and the tensor's entry in it:
    /// `TensorNotFound` when the index does not list it, `ShardMissing` when (lenient mode) the
    /// shard lacks it, or the shard's error when it cannot be opened.
    pub fn place(&self, name: &str) -> Result<(usize, usize)> {
        loop {
            match self.find(name.as_bytes()) {
                Some(Found::At { shard, entry }) => return Ok((shard, entry)),
                Some(Found::Unopened { shard }) => {
                    self.shard(shard)?;
                }
                Some(Found::Missing { shard }) => return Err(self.missing_in(shard, name)),
                None => {
                    return Err(Error::TensorNotFound {
                        name: name.to_owned(),
                    }
                    .in_file(&self.path))
                }
            }
        }
    }

    /// The shard holding `name`, opened: [`Checkpoint::shard_of`], then (in lenient mode, where
    /// opening a shard does not check this) `ShardMissing` when the shard lacks the tensor.
    pub fn shard_holding(&self, name: &str) -> Result<usize> {
        self.place(name).map(|(shard, _)| shard)
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
        self.open_all_shards()?;
        let mut out = Vec::new();
        for i in 0..self.shards.len() {
            self.shard(i)?;
            for &pos in self.members_of(i) {
                if self.entry[pos as usize].load(Ordering::Relaxed) == ABSENT {
                    out.push((self.names[pos as usize].to_owned(), i));
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Shards with bytes after their last tensor, as (shard index, byte count); opens every
    /// shard to know. Always empty unless opened with `allow_trailing_bytes`.
    pub fn trailing_bytes(&self) -> Result<Vec<(usize, u64)>> {
        self.open_all_shards()?;
        let mut out = Vec::new();
        for i in 0..self.shards.len() {
            let n = self.shard(i)?.trailing_bytes();
            if n > 0 {
                out.push((i, n));
            }
        }
        Ok(out)
    }
}
