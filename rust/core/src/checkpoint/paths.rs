//! Where a checkpoint's files are: whether a path names an index, the directory its shard paths
//! are relative to, and the rule that confines a shard path to that directory.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Whether `path` names an index: its extension is `json` in any case (`*.JSON` included).
pub(super) fn is_index_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.as_encoded_bytes().eq_ignore_ascii_case(b"json"))
}

/// The directory the index's shard paths are relative to, made absolute now: resolving them
/// later against whatever the current directory has become would read another directory's
/// files. (Symlinks are not resolved, as a shell's `cd` would not.)
pub(super) fn index_dir(index: &Path) -> Result<PathBuf> {
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
pub(super) fn confined(shard: &str) -> Result<PathBuf> {
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
pub(super) fn check_shard_file(shard: &str, full: &Path) -> Result<()> {
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
