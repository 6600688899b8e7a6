//! The index of the checkpoint a sharded save replaces: which files it names, and a copy of it
//! that names other files in their place (`publish.rs` points the old index at backups while
//! the new shards take the old names).
//!
//! Decisions:
//! - The old index is read as JSON with a `weight_map` object of strings; anything else (not
//!   JSON, no `weight_map`, a value that is not a string, a name that leaves the directory or
//!   names the index itself) is refused before the directory changes: a writer that cannot
//!   tell which files the old checkpoint needs could not keep it whole, and never deletes what
//!   it cannot read (the user moves the file away, or saves to another directory).
//! - The copy keeps every top-level member as its exact text, in its order (metadata, members
//!   other tools add); only the weight map is written anew, with the same tensors in the same
//!   order, the renamed files replaced.

use std::collections::HashMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::atomic::resolve_symlinks;
use crate::error::{Error, Result};
use crate::open::read_regular;
use crate::MAX_INDEX_SIZE;

/// The index found where the new checkpoint's index goes.
pub(super) struct OldIndex {
    /// The file it is, symlinks followed: what is backed up and rewritten.
    pub real: PathBuf,
    text: Vec<u8>,
    /// Each file the weight map names, once, in the order first named, with the plain file
    /// name in the directory it stands for (`None` for a path with a directory part).
    pub files: Vec<(String, Option<String>)>,
}

/// Reads the index at `path` (a file or a symlink to one; see the module comment for what is
/// refused). `index_name` is the index's own file name.
pub(super) fn read(path: &Path, index_name: &str) -> Result<OldIndex> {
    let real = resolve_symlinks(path).map_err(|e| Error::io(path, "resolve", e))?;
    let text = read_regular(&real, "a checkpoint index", MAX_INDEX_SIZE).map_err(|e| {
        // Named as the user named it.
        match e {
            Error::Io { op, source, .. } => Error::io(path, op, source.0),
            other => other,
        }
    })?;
    let refuse = |reason: String| {
        Error::InvalidIndex {
            reason: format!(
                "{reason}; a sharded save replaces the index of an earlier checkpoint only when \
                 it can read which files that checkpoint needs (to keep them whole until the \
                 new one is in place, and to remove them after): move this file away, or save \
                 to another directory"
            ),
        }
        .in_file(path)
    };
    let members = parse(&text).map_err(|e| refuse(e.to_string()))?;
    let weight_map = members
        .iter()
        .find(|(k, _)| k == "weight_map")
        .ok_or_else(|| refuse("it has no `weight_map`".into()))?;
    let pairs = weight_map_pairs(weight_map.1.get()).map_err(|e| refuse(e.to_string()))?;
    let mut files: Vec<(String, Option<String>)> = Vec::new();
    for (_, file) in pairs {
        if files.iter().any(|(f, _)| *f == file) {
            continue;
        }
        let plain = plain_name(&file).map_err(|()| {
            refuse(format!(
                "the shard path `{file}` leaves the index's directory"
            ))
        })?;
        if plain.as_deref() == Some(index_name) {
            return Err(refuse(format!("it names itself (`{file}`) as a shard")));
        }
        files.push((file, plain));
    }
    Ok(OldIndex { real, text, files })
}

impl OldIndex {
    /// The index's text with each file in `renamed` (a weight map value, as written) replaced by
    /// its new name.
    pub fn rewritten(&self, renamed: &HashMap<String, String>) -> Result<Vec<u8>> {
        let broken = |e: serde_json::Error| Error::InvalidIndex {
            reason: e.to_string(),
        };
        let members = parse(&self.text).map_err(broken)?;
        let mut out = String::from("{");
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(key).map_err(broken)?);
            out.push(':');
            if key != "weight_map" {
                out.push_str(value.get());
                continue;
            }
            out.push('{');
            for (j, (tensor, file)) in weight_map_pairs(value.get())
                .map_err(broken)?
                .into_iter()
                .enumerate()
            {
                if j > 0 {
                    out.push(',');
                }
                let file = renamed.get(&file).cloned().unwrap_or(file);
                out.push_str(&serde_json::to_string(&tensor).map_err(broken)?);
                out.push(':');
                out.push_str(&serde_json::to_string(&file).map_err(broken)?);
            }
            out.push('}');
        }
        out.push('}');
        Ok(out.into_bytes())
    }
}

/// The plain file name a shard path stands for in the index's directory (`./a` is `a`);
/// `Ok(None)` for a path into a subdirectory, `Err` for one that leaves the directory.
fn plain_name(file: &str) -> std::result::Result<Option<String>, ()> {
    let mut parts = Vec::new();
    for c in Path::new(file).components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(()),
        }
    }
    if parts.is_empty() || file.contains('\0') {
        return Err(());
    }
    Ok((parts.len() == 1 && !file.ends_with('/')).then(|| parts[0].to_string_lossy().into_owned()))
}

/// The top-level members of an index, in order, each value as its exact text; a repeated
/// `weight_map` is refused (readers disagree on which one counts).
fn parse(text: &[u8]) -> serde_json::Result<Vec<(String, Box<RawValue>)>> {
    struct Members(Vec<(String, Box<RawValue>)>);
    impl<'de> serde::Deserialize<'de> for Members {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Members;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object with `weight_map`")
                }
                fn visit_map<A: MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> std::result::Result<Members, A::Error> {
                    let mut out: Vec<(String, Box<RawValue>)> = Vec::new();
                    while let Some(key) = map.next_key::<String>()? {
                        if key == "weight_map" && out.iter().any(|(k, _)| *k == key) {
                            return Err(de::Error::duplicate_field("weight_map"));
                        }
                        let value: Box<RawValue> = map.next_value()?;
                        out.push((key, value));
                    }
                    Ok(Members(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_slice::<Members>(text).map(|m| m.0)
}

/// A weight map's (tensor, file) pairs in the file's order.
fn weight_map_pairs(text: &str) -> serde_json::Result<Vec<(String, String)>> {
    struct Pairs(Vec<(String, String)>);
    impl<'de> serde::Deserialize<'de> for Pairs {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Pairs;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a `weight_map` object of tensor names to file names")
                }
                fn visit_map<A: MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> std::result::Result<Pairs, A::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = map.next_entry::<String, String>()? {
                        out.push(entry);
                    }
                    Ok(Pairs(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_str::<Pairs>(text).map(|p| p.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn old(text: &str) -> OldIndex {
        OldIndex {
            real: PathBuf::from("i.json"),
            text: text.as_bytes().to_vec(),
            files: Vec::new(),
        }
    }

    #[test]
    fn the_copy_keeps_every_member_and_renames_only_the_files_asked() {
        let text = "{\"metadata\": {\"total_size\": 8, \"x\": [1, 2]},\n \"weight_map\": {\"b\": \
                    \"m-1.safetensors\", \"a\": \"m-2.safetensors\", \"c\": \"m-1.safetensors\"}, \
                    \"extra\": null}";
        let renamed = HashMap::from([("m-1.safetensors".to_string(), "st-b.safetensors".into())]);
        let out = String::from_utf8(old(text).rewritten(&renamed).unwrap()).unwrap();
        assert_eq!(
            out,
            "{\"metadata\":{\"total_size\": 8, \"x\": [1, 2]},\"weight_map\":{\"b\":\
             \"st-b.safetensors\",\"a\":\"m-2.safetensors\",\"c\":\"st-b.safetensors\"},\
             \"extra\":null}"
        );
    }

    #[test]
    fn shard_paths_are_plain_names_subdirectories_or_refused() {
        assert_eq!(
            plain_name("a.safetensors"),
            Ok(Some("a.safetensors".into()))
        );
        assert_eq!(
            plain_name("./a.safetensors"),
            Ok(Some("a.safetensors".into()))
        );
        assert_eq!(plain_name("sub/a.safetensors"), Ok(None));
        assert_eq!(plain_name("a/"), Ok(None));
        for bad in ["../a", "/etc/passwd", "", ".", "a\0b"] {
            assert_eq!(plain_name(bad), Err(()), "{bad:?}");
        }
    }
}
