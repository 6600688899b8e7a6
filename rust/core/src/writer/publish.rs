//! Publishing a sharded checkpoint as a transaction: the complete, staged files of a new
//! checkpoint take the place of the checkpoint already in the directory such that, at every
//! instant, the directory holds a whole checkpoint, the old one or the new one, never neither
//! and never a mix; a failure before the new one is in place puts everything back, and the new
//! files stay staged, to be published again.
//!
//! Decisions (docs/writing.md states them for users):
//! - "The checkpoint in the directory" is what loaders open: the index
//!   `{prefix}.safetensors.index.json` and the files its weight map names, and the single file
//!   `{prefix}.safetensors` (transformers opens it first when both are there). Each stays whole
//!   until the new checkpoint is whole; for a moment after the commit, a change between one file
//!   and a set leaves both, each whole (the one-file checkpoint is removed, or put in place,
//!   on the side of the commit where it is still, or already, whole).
//! - The hard case is a new shard whose name the old index names (the same shard count gives
//!   the same names). Such an old shard is first hard-linked to a backup name
//!   (`st-backup-<16 hex>.safetensors`, visible and ending in `.safetensors` so that loaders that
//!   list a directory's `*.safetensors` and keep those the index names, as vLLM does, still find
//!   it), and the old index is replaced, atomically, by a copy of itself naming the backups
//!   (`old_index.rs`): the old checkpoint is whole through them, and the new shards may take the
//!   old names. A missing old shard is renamed to a backup name that does not exist: the old
//!   checkpoint was incomplete and stays so, but never names a new file.
//! - The sequence: (1) back up the old files the new ones replace, and the old index (a hard link
//!   to a hidden name, for an exact restore); (2) point the old index at the backups; (3) rename
//!   each new shard into place; (4) the commit: rename the new index into place, or remove the
//!   old index when the new checkpoint is one file; (5) remove the backups and the old
//!   checkpoint's other files (`{prefix}.safetensors`, `{prefix}-NNNNN-of-NNNNN.safetensors`
//!   not in the new set, as `save_torch_state_dict` clears them, and backups an earlier
//!   interrupted save left named by the old index), syncing the directory between the stages.
//!   Nothing to back up (new names, or one file replacing one file) skips (1) and (2).
//! - A failure before the commit rolls back in the reverse order (new shards moved back to
//!   hidden staged names, old names linked back to their backups, the original index renamed
//!   back, the backups removed): the directory is as it was and the writer may publish again.
//!   Each rollback step is taken only while the directory keeps a whole checkpoint; where one
//!   fails the rollback stops there, the old checkpoint whole through the backups, and the
//!   writer says it cannot be finished (a later save clears the backups).
//! - Hard links refused (EXDEV, EPERM, EOPNOTSUPP, EMLINK: filesystems without them, or
//!   `fs.protected_hardlinks`) make the save fail before anything changed, saying to save to a
//!   new directory; only a save that reuses the old checkpoint's names needs them.
//! - An old index that cannot be read as one, or one name of which is a symlink or a directory
//!   the new set would replace, is refused before anything changes (`old_index.rs`): what the
//!   writer cannot keep whole it does not touch.
//! - A crash leaves the state of the step it interrupted, each a whole checkpoint; (1)-(3) may
//!   leave the old index naming backups (it opens as before), (5) may leave backups and hidden
//!   `.st-*.tmp` files, which nothing names.
//!
//! Every operation that changes the directory goes through `faults::step`, the seam the crate's
//! tests use to fail or stop each one in turn (`publish_tests.rs`).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::atomic::{sync_dir, temp_name, unique_id, Staged};
use super::faults::{step, Halt};
use super::old_index::{self, OldIndex};
use super::shards::{index_name, is_checkpoint_file};
use crate::error::Error;

/// A new checkpoint, every file complete and staged (and synced when `synced`).
pub(super) struct NewSet<'a> {
    pub dir: &'a Path,
    pub prefix: &'a str,
    /// The shards: file name and staged file, in order.
    pub shards: Vec<(&'a str, &'a mut Staged)>,
    /// The index, with its text written; none for a checkpoint of one file.
    pub index: Option<&'a mut Staged>,
    pub synced: bool,
}

/// How a publish that did not complete left things.
#[derive(Debug)]
pub(super) enum Failed {
    /// The directory is as it was and every new file is staged: publishing may be tried again.
    Unchanged(Error),
    /// The new checkpoint is in place; removing what the old one left failed.
    Published(Error),
    /// A rollback could not complete: the old checkpoint is whole (its index may name
    /// backups), but the new files are not all staged any more.
    Stuck(Error),
    /// (Tests only) the process was taken to die in the middle: nothing more ran.
    #[cfg_attr(not(test), allow(dead_code))]
    Crashed,
}

/// An old file backed up before a new shard takes its name.
struct Backup {
    /// The name the old and the new file share.
    name: String,
    /// The backup's name in the directory.
    backup: String,
    /// Whether the old file exists (a missing shard of the old index gets a backup name only).
    exists: bool,
    /// Whether the backup link was made (and not yet removed).
    made: bool,
}

/// Publishes `set` (see the module documentation).
pub(super) fn publish(set: NewSet<'_>) -> Result<(), Failed> {
    let mut tx = Transaction::plan(set).map_err(Failed::Unchanged)?;
    match tx.forward() {
        Ok(()) => {}
        Err(Stop::Crashed) => return Err(Failed::Crashed),
        Err(Stop::At(e)) => return Err(tx.roll_back(e)),
    }
    tx.clean_up()
}

struct Transaction<'a> {
    set: NewSet<'a>,
    old: Option<OldIndex>,
    backups: Vec<Backup>,
    /// The old index's text for the rewrite, when old shards are backed up.
    rewritten: Option<Vec<u8>>,
    /// The hidden hard link to the original old index, while it exists.
    index_backup: Option<PathBuf>,
    /// Whether the old index now names the backups.
    repointed: bool,
}

/// A failed operation: the file concerned, what was being done, and why.
struct StepError {
    path: PathBuf,
    op: &'static str,
    source: io::Error,
}

impl StepError {
    fn into_error(self, note: &str) -> Error {
        let source = if note.is_empty() {
            self.source
        } else {
            io::Error::new(self.source.kind(), format!("{}; {note}", self.source))
        };
        Error::io(&self.path, self.op, source)
    }
}

/// The shape of an error while the transaction runs: a failure that says where, or a crash.
enum Stop {
    At(StepError),
    Crashed,
}

/// Runs one operation through the seam, naming `path` and `op` if it fails.
fn run<T>(path: &Path, op: &'static str, f: impl FnOnce() -> io::Result<T>) -> Result<T, Stop> {
    step(op, f).map_err(|h| match h {
        Halt::Crashed => Stop::Crashed,
        Halt::Failed(source) => Stop::At(StepError {
            path: path.to_path_buf(),
            op,
            source,
        }),
    })
}

/// Whether a failed `link` means this filesystem (or its settings) will not make hard links.
fn links_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EPERM | libc::EOPNOTSUPP | libc::EMLINK)
    )
}

/// A fresh backup name (see the module documentation).
fn backup_name() -> String {
    format!("st-backup-{:016x}.safetensors", unique_id())
}

/// Whether `name` is a backup name of ours.
fn is_backup_name(name: &str) -> bool {
    name.strip_prefix("st-backup-")
        .and_then(|r| r.strip_suffix(".safetensors"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn refuse(path: &Path, what: &str) -> Error {
    Error::io(
        path,
        "replace the earlier checkpoint",
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{what}; nothing was published: save to a new directory, or move it away and \
                 finish again"
            ),
        ),
    )
}

impl<'a> Transaction<'a> {
    /// Reads what the directory holds and decides what to back up; changes nothing.
    fn plan(set: NewSet<'a>) -> Result<Transaction<'a>, Error> {
        let index = index_name(set.prefix);
        let index_path = set.dir.join(&index);
        let old = match fs::symlink_metadata(&index_path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(&index_path, "read the earlier index", e)),
            Ok(m) if m.is_dir() => {
                return Err(refuse(
                    &index_path,
                    "a directory is where the checkpoint's index goes",
                ))
            }
            Ok(_) => Some(old_index::read(&index_path, &index)?),
        };
        let single = format!("{}.safetensors", set.prefix);
        let named: HashMap<&str, &str> = old
            .iter()
            .flat_map(|o| &o.files)
            .filter_map(|(written, plain)| plain.as_deref().map(|p| (p, written.as_str())))
            .collect();
        // One file replacing one file: its rename is the whole transaction.
        let trivial = set.index.is_none() && old.is_none();
        let mut backups = Vec::new();
        for (name, _) in &set.shards {
            let by_index = named.contains_key(name);
            if trivial || !(by_index || *name == single) {
                continue;
            }
            let path = set.dir.join(name);
            let exists = match fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(Error::io(&path, "read the earlier checkpoint", e)),
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refuse(
                        &path,
                        "the earlier checkpoint's file is a symbolic link, and replacing the \
                         file it points to would change that checkpoint before the new one is \
                         complete",
                    ))
                }
                Ok(m) if !m.is_file() => {
                    return Err(refuse(&path, "it is not a regular file"));
                }
                Ok(_) => true,
            };
            if exists || by_index {
                backups.push(Backup {
                    name: (*name).to_owned(),
                    backup: backup_name(),
                    exists,
                    made: false,
                });
            }
        }
        let renamed: HashMap<String, String> = backups
            .iter()
            .filter_map(|b| {
                named
                    .get(b.name.as_str())
                    .map(|w| (w.to_string(), b.backup.clone()))
            })
            .collect();
        let rewritten = match &old {
            Some(o) if !renamed.is_empty() => Some(o.rewritten(&renamed)?),
            _ => None,
        };
        Ok(Transaction {
            set,
            old,
            backups,
            rewritten,
            index_backup: None,
            repointed: false,
        })
    }

    fn dir(&self) -> &Path {
        self.set.dir
    }

    fn sync_dirs(&self) {
        if !self.set.synced {
            return;
        }
        sync_dir(self.dir());
        if let Some(parent) = self.old.as_ref().and_then(|o| o.real.parent()) {
            if parent != self.dir() && !parent.as_os_str().is_empty() {
                sync_dir(parent);
            }
        }
    }

    /// Steps (1) to (4).
    fn forward(&mut self) -> Result<(), Stop> {
        let dir = self.set.dir;
        for b in &mut self.backups {
            if !b.exists {
                continue;
            }
            let (from, to) = (dir.join(&b.name), dir.join(&b.backup));
            run(&from, "back up a file of the earlier checkpoint", || {
                fs::hard_link(&from, &to)
            })
            .map_err(|s| match s {
                Stop::At(mut e) if links_refused(&e.source) => {
                    e.source = io::Error::new(
                        e.source.kind(),
                        format!(
                            "{}; the new checkpoint reuses this file's name, so the file must \
                             stay whole under a second name (a hard link) until the new \
                             checkpoint is complete, and the filesystem refused the link: save \
                             to a new directory, or remove the earlier checkpoint first",
                            e.source
                        ),
                    );
                    Stop::At(e)
                }
                other => other,
            })?;
            b.made = true;
        }
        if let (Some(text), Some(old)) = (self.rewritten.take(), &self.old) {
            let real = old.real.clone();
            let backup = real.with_file_name(std::ffi::OsStr::from_bytes(temp_name().as_bytes()));
            run(&real, "back up the earlier index", || {
                fs::hard_link(&real, &backup)
            })?;
            self.index_backup = Some(backup);
            let synced = self.set.synced;
            let mut copy = run(&real, "write a copy of the earlier index", || {
                let staged = Staged::create(&real).map_err(io::Error::other)?;
                staged.file().write_all_at(&text, 0)?;
                if synced {
                    staged.file().sync_all()?;
                }
                Ok(staged)
            })?;
            run(&real, "point the earlier index at the backups", || {
                copy.persist_io()
            })?;
            self.repointed = true;
            self.sync_dirs();
        }
        for (name, staged) in &mut self.set.shards {
            let path = dir.join(&**name);
            run(&path, "rename a new shard into place", || {
                staged.persist_io()
            })?;
        }
        let index_path = dir.join(index_name(self.set.prefix));
        match &mut self.set.index {
            Some(index) => {
                run(&index_path, "rename the new index into place", || {
                    index.persist_io()
                })?;
            }
            None if self.old.is_some() => {
                run(
                    &index_path,
                    "remove the earlier index",
                    || match fs::remove_file(&index_path) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                        _ => Ok(()),
                    },
                )?;
            }
            None => {}
        }
        self.sync_dirs();
        Ok(())
    }

    /// Undoes steps (3) to (1) after `failure`, as far as the directory stays whole at every
    /// step (see the module documentation).
    fn roll_back(&mut self, failure: StepError) -> Failed {
        match self.undo() {
            Ok(leftover) => {
                let mut note = String::from(
                    "nothing was published: the earlier checkpoint is as it was, and `finish` \
                     may be called again once the cause is fixed",
                );
                if let Some(l) = leftover {
                    note.push_str(&format!(
                        " (removing the backup {} failed: {}; remove it by hand)",
                        l.path.display(),
                        l.source
                    ));
                }
                Failed::Unchanged(failure.into_error(&note))
            }
            Err(Stop::Crashed) => Failed::Crashed,
            Err(Stop::At(undo)) => Failed::Stuck(failure.into_error(&format!(
                "putting the earlier checkpoint back failed too ({}: {} failed: {}): nothing \
                 was published and the earlier checkpoint is whole, its index naming backups of \
                 its files (st-backup-*.safetensors); this writer cannot finish: save again, \
                 which removes them",
                undo.path.display(),
                undo.op,
                undo.source
            ))),
        }
    }

    /// The rollback; `Ok(Some(_))` when only removing a backup failed.
    fn undo(&mut self) -> Result<Option<StepError>, Stop> {
        let dir = self.set.dir;
        for (name, staged) in self.set.shards.iter_mut().rev() {
            if !staged.is_placed() {
                continue;
            }
            let path = dir.join(&**name);
            run(&path, "take a new shard back out of place", || {
                staged.unplace_io()
            })?;
            if let Some(b) = self.backups.iter().find(|b| b.name == **name && b.made) {
                let backup = dir.join(&b.backup);
                run(&path, "put the earlier file back", || {
                    fs::hard_link(&backup, &path)
                })?;
            }
        }
        if let Some(backup) = &self.index_backup {
            if self.repointed {
                let real = &self.old.as_ref().expect("an index was backed up").real;
                run(real, "put the earlier index back", || {
                    fs::rename(backup, real)
                })?;
                self.repointed = false;
            } else {
                run(backup, "remove the earlier index's backup", || {
                    fs::remove_file(backup)
                })?;
            }
            self.index_backup = None;
        }
        // Every old name holds its old file again and the old index names them: the backups are
        // spare links.
        let mut leftover = None;
        for b in &mut self.backups {
            if !b.made {
                continue;
            }
            let path = dir.join(&b.backup);
            match run(&path, "remove a backup", || fs::remove_file(&path)) {
                Ok(()) => b.made = false,
                Err(Stop::Crashed) => return Err(Stop::Crashed),
                Err(Stop::At(e)) => {
                    leftover.get_or_insert(e);
                }
            }
        }
        self.sync_dirs();
        Ok(leftover)
    }

    /// Step (5): every removal is tried; the first failure is reported.
    fn clean_up(&mut self) -> Result<(), Failed> {
        let dir = self.set.dir;
        let mut first: Option<StepError> = None;
        let mut remove = |path: PathBuf, op: &'static str| -> Result<(), Failed> {
            let removed = run(&path, op, || match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            });
            match removed {
                Ok(()) => Ok(()),
                Err(Stop::Crashed) => Err(Failed::Crashed),
                Err(Stop::At(e)) => {
                    first.get_or_insert(e);
                    Ok(())
                }
            }
        };
        for b in &self.backups {
            if b.made {
                remove(
                    dir.join(&b.backup),
                    "remove a backup of the earlier checkpoint",
                )?;
            }
        }
        if let Some(backup) = self.index_backup.take() {
            remove(backup, "remove the earlier index's backup")?;
        }
        // Backups an interrupted earlier save left, which the old index named.
        for (_, plain) in self.old.iter().flat_map(|o| &o.files) {
            if let Some(name) = plain.as_deref().filter(|n| is_backup_name(n)) {
                remove(dir.join(name), "remove a backup of the earlier checkpoint")?;
            }
        }
        let mut keep: Vec<&str> = self.set.shards.iter().map(|(n, _)| *n).collect();
        let index = index_name(self.set.prefix);
        keep.push(&index);
        match fs::read_dir(dir) {
            Err(e) => {
                first.get_or_insert(StepError {
                    path: dir.to_path_buf(),
                    op: "list",
                    source: e,
                });
            }
            Ok(entries) => {
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    let bytes = name.as_bytes();
                    if !is_checkpoint_file(bytes, self.set.prefix)
                        || keep.iter().any(|k| k.as_bytes() == bytes)
                        || entry.file_type().is_ok_and(|t| t.is_dir())
                    {
                        continue;
                    }
                    remove(entry.path(), "remove a file of the earlier checkpoint")?;
                }
            }
        }
        self.sync_dirs();
        match first {
            None => Ok(()),
            Some(e) => Err(Failed::Published(e.into_error(
                "the new checkpoint is in place, but this file of the earlier one is left: \
                 remove it by hand",
            ))),
        }
    }
}
