//! A checkpoint's shards: each opened and checked against the index once, on first use, by
//! whichever thread gets there first, or several at once ([`Checkpoint::open_shards`]); every
//! hand-over of an open shard announced to a sanitized caller (`crate::tsan`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::file::SafeFile;

use super::Checkpoint;

pub(super) struct Shard {
    /// The file name as the index spells it.
    pub(super) name: String,
    pub(super) path: PathBuf,
    file: OnceLock<Arc<SafeFile>>,
    /// The entries (positions in the shard's offset order) of the tensors the index assigns to
    /// this shard and the shard holds, ascending: set with `file`.
    pub(super) entries: OnceLock<Vec<usize>>,
    opening: Mutex<()>,
}

impl Shard {
    pub(super) fn new(name: String, path: PathBuf) -> Shard {
        Shard {
            name,
            path,
            file: OnceLock::new(),
            entries: OnceLock::new(),
            opening: Mutex::new(()),
        }
    }

    /// The file, once open. Every way out of the core to an open shard goes through here or
    /// [`Shard::publish`]: the thread that opened it (a caller's, or a helper of
    /// [`Checkpoint::open_shards`]) announced its work to a sanitized program just before
    /// publishing it, and this announces the hand-over to the thread that gets it, so that a
    /// ThreadSanitizer build of the caller sees the header, names and entries it reads ordered
    /// after their making (the core's `OnceLock` and lock are invisible to it; `crate::tsan`).
    /// Bindings need no synchronisation of their own for it.
    pub(super) fn opened(&self) -> Option<&Arc<SafeFile>> {
        let file = self.file.get();
        if file.is_some() {
            crate::tsan::acquire(&self.file);
        }
        file
    }

    /// Publishes the file and its entries, once, under `opening`.
    pub(super) fn publish(&self, file: Arc<SafeFile>, entries: Vec<usize>) -> &Arc<SafeFile> {
        let _ = self.entries.set(entries);
        crate::tsan::release(&self.file);
        self.file.get_or_init(|| file)
    }
}

impl Checkpoint {
    /// Path of shard `i`: absolute for an index's shards (resolved at open), as given for a
    /// single file.
    pub fn shard_path(&self, i: usize) -> Option<&Path> {
        self.shards.get(i).map(|s| s.path.as_path())
    }

    /// Whether shard `i` has been opened.
    pub fn shard_is_open(&self, i: usize) -> bool {
        self.shards.get(i).is_some_and(|s| s.opened().is_some())
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
        if let Some(file) = shard.opened() {
            return Ok(file);
        }
        let _guard = shard.opening.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = shard.opened() {
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
        let entries = self
            .place_entries(i, &file)
            .map_err(|e| e.in_file(&self.path))?;
        self.opens.fetch_add(1, Ordering::Relaxed);
        Ok(shard.publish(Arc::new(file), entries))
    }

    /// Opens every shard of `shards` not open yet, several at once (up to the machine's cores,
    /// at most 8): each is opened and checked as [`Checkpoint::shard`] does. For work that needs
    /// many shards at once (iterating over the checkpoint, a request list, a stream, an upload):
    /// the headers of a 163-shard checkpoint are parsed by every core instead of one. On an
    /// error, the one of the lowest-numbered shard that failed (the others are still opened).
    pub fn open_shards(&self, shards: &[usize]) -> Result<()> {
        let pending: Vec<usize> = shards
            .iter()
            .copied()
            .filter(|&i| i < self.shards.len() && !self.shard_is_open(i))
            .collect();
        // Each shard on a thread of its own as the threads come free; joined one by one, so
        // that a ThreadSanitizer build of the caller sees the headers the helpers parsed handed
        // to it (see `on_tasks`). The first failure in task order: the lowest-numbered shard.
        let threads = parallelism().min(pending.len());
        crate::file::parallel::on_tasks(pending.len(), threads, |k| {
            self.shard(pending[k]).map(|_| ())
        })
    }

    /// Opens the shards from `first` on that a reader walking them in order will reach next:
    /// up to one per core (at most 8) not open yet, several at once. Errors are left for the
    /// reader to meet when it gets to the shard (a shard that failed stays unopened, and its
    /// open fails again then, naming it): a loop that stops early opens few shards beyond
    /// where it stopped, and reports a broken shard only if it gets there.
    pub fn open_ahead(&self, first: usize) {
        let last = first.saturating_add(parallelism()).min(self.shards.len());
        let ahead: Vec<usize> = (first..last).collect();
        let _ = self.open_shards(&ahead);
    }

    /// Opens every shard (see [`Checkpoint::open_shards`]).
    pub fn open_all_shards(&self) -> Result<()> {
        let all: Vec<usize> = (0..self.shards.len()).collect();
        self.open_shards(&all)
    }
}

/// Shards opened at once: one per core, at most 8.
fn parallelism() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
}
