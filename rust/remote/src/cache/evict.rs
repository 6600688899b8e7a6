//! Keeping the cache within its bound: after an entry is added, the entries least recently used
//! (by their meta file's modification time, which every use sets) are removed until the rest
//! fit in [`crate::RemoteOptions::cache_limit`]. Leftovers are removed on the way: a temporary
//! file, or a data file without its meta file, whose entry no one holds locked (a process
//! writing an entry holds its lock until the entry is whole, so such files are a crashed
//! writer's). An entry someone holds locked is left alone; one that is only mapped may go (its
//! mapping stays valid: removing a file only unlinks it).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use super::lock;

/// What the cache directory holds of one key.
#[derive(Default)]
struct Found {
    /// When the entry was last used (its meta file's modification time); `None` without one.
    used: Option<SystemTime>,
    /// Bytes of its data and temporary files.
    bytes: u64,
    /// Whether it has a temporary file.
    leftover: bool,
}

/// Removes entries of `dir`, least recently used first, until at most `limit` bytes remain,
/// and leftovers no one is writing; never the entry `keep`.
pub(crate) fn evict(dir: &Path, limit: u64, keep: &str) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    for entry in listing.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((key, suffix)) = name.split_once('.') else {
            continue;
        };
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let f = found.entry(key.to_owned()).or_default();
        // The bound counts data and temporary files (not a meta file's few hundred bytes); a
        // key with a lock file and nothing else is a leftover too (a failed fetch's).
        match suffix {
            "meta" => f.used = meta.modified().ok(),
            "safetensors" => f.bytes = f.bytes.saturating_add(meta.len()),
            _ if suffix.ends_with(".tmp") => {
                f.leftover = true;
                f.bytes = f.bytes.saturating_add(meta.len());
            }
            _ => {}
        }
    }
    // Sizes of files on disk, which another process may make sparse and huge: never wraps.
    let mut total: u64 = found
        .values()
        .fold(0u64, |sum, f| sum.saturating_add(f.bytes));
    let mut order: Vec<(&String, &Found)> = found.iter().collect();
    // Entries without a meta file first (they are leftovers or half-removed), then by use.
    order.sort_by_key(|(_, f)| f.used);
    for (key, f) in order {
        // Without a meta file the key is no whole entry: a leftover, whatever else it has.
        let leftover = f.leftover || f.used.is_none();
        if key == keep || (total <= limit && !leftover) {
            continue;
        }
        let Ok(Some(held)) = lock::try_lock(&dir.join(format!("{key}.lock"))) else {
            continue;
        };
        remove_key(dir, key);
        held.remove();
        total = total.saturating_sub(f.bytes);
    }
}

/// Removes every file of `key` but its lock: the meta file first, so that a data file is never
/// trusted without it.
fn remove_key(dir: &Path, key: &str) {
    let _ = std::fs::remove_file(dir.join(format!("{key}.meta")));
    let _ = std::fs::remove_file(dir.join(format!("{key}.safetensors")));
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in listing.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(key) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
