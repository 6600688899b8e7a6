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
//! Lenient mode ([`CheckpointOptions::lenient`], opt-in) reads checkpoints as they exist in the
//! wild, as vLLM and transformers do: the index is an allow-list. A tensor the index lists but
//! its shard lacks (a stale index) is `ShardMissing` only when someone asks for it, and
//! [`Checkpoint::missing`] lists them all; a copy of a tensor in a shard the index does not
//! assign it to (shards reused between checkpoints) is ignored. A shard *file* that does not
//! exist is still `ShardMissing` at open: that is a broken download, not a quirk.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::file::{read_regular, Backend, OpenOptions, SafeFile};
use crate::header::TensorInfo;

/// Index files are small (a name and a file name per tensor); refuse absurd ones before reading.
const MAX_INDEX_SIZE: u64 = 256 * 1024 * 1024;

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
}

impl CheckpointOptions {
    fn file_options(&self) -> OpenOptions {
        OpenOptions {
            backend: self.backend,
            allow_trailing_bytes: self.allow_trailing_bytes,
        }
    }
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
            path: path.to_path_buf(),
            file: OnceLock::new(),
            opening: Mutex::new(()),
        };
        let metadata = file.header().metadata().cloned();
        let _ = shard.file.set(Arc::new(file));
        Ok(Checkpoint {
            path: path.to_path_buf(),
            shard_of: vec![0; names.len()],
            names,
            shards: vec![shard],
            metadata,
            options,
            opens: AtomicUsize::new(1),
        })
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
        let index: IndexFile = serde_json::from_slice(&text).map_err(|e| Error::InvalidIndex {
            reason: e.to_string(),
        })?;
        let weight_map = index.weight_map.ok_or_else(|| Error::InvalidIndex {
            reason: "no `weight_map` object".into(),
        })?;
        let metadata = index.metadata.map(unique_metadata).transpose()?;
        let dir = index_dir(path)?;
        let mut shard_ids: BTreeMap<PathBuf, u32> = BTreeMap::new();
        let mut shards = Vec::new();
        let mut entries: Vec<(String, u32)> = Vec::with_capacity(weight_map.len());
        for (tensor, shard) in &weight_map {
            let relative = confined(shard)?;
            let id = match shard_ids.get(&relative) {
                Some(&id) => id,
                None => {
                    let full = dir.join(&relative);
                    check_shard_file(shard, &full)?;
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
        let file =
            SafeFile::open_unheld(&shard.path, self.options.file_options()).map_err(|e| {
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

/// Whether `path` names an index: its extension is `json` in any case (`*.JSON` included).
fn is_index_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.as_encoded_bytes().eq_ignore_ascii_case(b"json"))
}

/// The directory the index's shard paths are relative to, made absolute now: resolving them
/// later against whatever the current directory has become would read another directory's
/// files. (Symlinks are not resolved, as a shell's `cd` would not.)
fn index_dir(index: &Path) -> Result<PathBuf> {
    let dir = match index.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::path::absolute(dir).map_err(|e| Error::io(dir, "resolve", e))
}

/// The shard path, lexically normalised (`.` components and repeated slashes dropped), as a
/// relative path that names a file inside the index's directory. Refused: empty paths and
/// paths that name the directory itself (`.`, `./`), paths ending in `/`, `..` anywhere, and
/// absolute paths.
fn confined(shard: &str) -> Result<PathBuf> {
    let refuse = || Error::InvalidShardPath {
        shard: shard.to_owned(),
    };
    let mut out = PathBuf::new();
    for c in Path::new(shard).components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(refuse())
            }
        }
    }
    // A NUL cannot be part of a file name: no file could ever be opened under it.
    if out.as_os_str().is_empty()
        || shard.ends_with('/')
        || shard.ends_with("/.")
        || shard.contains('\0')
    {
        return Err(refuse());
    }
    Ok(out)
}

/// A shard must exist and be a file. Only "no such file" is `ShardMissing`; any other reason
/// the process cannot `stat` it (permissions, a symlink loop, a name too long) is `Io` with the
/// operating system's reason, which a user needs to fix it. A directory is `InvalidShardPath`.
fn check_shard_file(shard: &str, full: &Path) -> Result<()> {
    match std::fs::metadata(full) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::ShardMissing {
            shard: shard.to_owned(),
            tensor: None,
        }),
        Err(e) => Err(Error::io(full, "stat", e)),
        Ok(m) if m.is_dir() => Err(Error::InvalidShardPath {
            shard: shard.to_owned(),
        }),
        Ok(_) => Ok(()),
    }
}

/// The index's metadata as a map, refusing a repeated key (readers disagree on which copy wins).
fn unique_metadata(pairs: Vec<(String, String)>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (key, value) in pairs {
        if out.contains_key(&key) {
            return Err(Error::DuplicateKey {
                key,
                in_metadata: true,
            });
        }
        out.insert(key, value);
    }
    Ok(out)
}

/// The parts of an index file we use; both maps keep repeats so they can be refused.
struct IndexFile {
    metadata: Option<Vec<(String, String)>>,
    weight_map: Option<Vec<(String, String)>>,
}

impl<'de> serde::Deserialize<'de> for IndexFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(IndexVisitor)
    }
}

struct IndexVisitor;

impl<'de> Visitor<'de> for IndexVisitor {
    type Value = IndexFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with `weight_map`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<IndexFile, A::Error> {
        let mut out = IndexFile {
            metadata: None,
            weight_map: None,
        };
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" if out.metadata.is_some() => {
                    return Err(de::Error::duplicate_field("metadata"))
                }
                "metadata" => {
                    let raw: Option<MetadataPairs> = map.next_value()?;
                    out.metadata = Some(raw.map(|m| m.0).unwrap_or_default());
                }
                "weight_map" if out.weight_map.is_some() => {
                    return Err(de::Error::duplicate_field("weight_map"))
                }
                "weight_map" => out.weight_map = Some(map.next_value::<Pairs>()?.0),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// The index's `metadata` object as pairs, repeats kept: strings as their value, anything else
/// as its exact JSON text (`1e3` stays `1e3`, not `1000.0`).
struct MetadataPairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for MetadataPairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MetadataPairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a `metadata` object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<MetadataPairs, A::Error> {
                let mut out = Vec::new();
                while let Some((key, raw)) = map.next_entry::<String, Box<RawValue>>()? {
                    let text = raw.get();
                    let value = if text.starts_with('"') {
                        serde_json::from_str::<String>(text).map_err(de::Error::custom)?
                    } else {
                        text.to_owned()
                    };
                    out.push((key, value));
                }
                Ok(MetadataPairs(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A JSON object of strings as a list of pairs, repeats kept (so they can be refused).
struct Pairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Pairs, A::Error> {
                let mut out = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    out.push(pair);
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{confined, is_index_path};

    #[test]
    fn shard_paths_must_name_a_file_inside_the_directory() {
        for ok in [
            "model-00001-of-00002.safetensors",
            "sub/a.safetensors",
            "./a.safetensors",
        ] {
            assert!(confined(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "./",
            "./.",
            "sub/",
            "sub/.",
            "../a.safetensors",
            "/etc/passwd",
            "sub/../../a",
            "a/..",
        ] {
            assert!(confined(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spellings_of_one_shard_normalise_to_one_path() {
        let want = Path::new("sub/a.safetensors");
        for spelling in [
            "sub/a.safetensors",
            "./sub/a.safetensors",
            "sub//./a.safetensors",
        ] {
            assert_eq!(confined(spelling).unwrap(), want, "{spelling}");
        }
    }

    #[test]
    fn index_extension_is_matched_in_any_case() {
        for yes in ["m.index.json", "m.index.JSON", "dir/M.Json"] {
            assert!(is_index_path(Path::new(yes)), "{yes}");
        }
        for no in ["m.safetensors", "json", "m.jsonl", "m.json.bak"] {
            assert!(!is_index_path(Path::new(no)), "{no}");
        }
    }
}
