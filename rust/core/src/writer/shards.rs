//! Which tensor goes to which shard of a checkpoint, the shards' file names and the index
//! file's text, exactly as `huggingface_hub` makes them, so that transformers, vLLM and
//! `huggingface_hub` read our checkpoints as their own.
//!
//! The rule follows `split_state_dict_into_shards_factory` in huggingface_hub's
//! `src/huggingface_hub/serialization/_base.py` (version 2.4.0), written here from its
//! description, not copied: tensors are taken in the order given; one larger than the maximum
//! gets a shard of its own, placed at that point in the list of shards while the shard being
//! filled stays open; otherwise a tensor that would take the open shard past the maximum closes
//! it first. Sizes are the tensors' bytes (headers are not counted, so a shard file may pass the
//! maximum by its header). One shard is named `{prefix}.safetensors`; N shards are
//! `{prefix}-00001-of-0000N.safetensors` and so on, with an index.
//!
//! The index follows `save_torch_state_dict` in `serialization/_torch.py`: `{"metadata":
//! {"total_size": <sum of the tensors' bytes>, ...the caller's metadata}, "weight_map":
//! {tensor: shard, ...}}`, the weight map in shard order and in the given order within a shard,
//! written as Python's `json.dump(index, f, indent=2)` writes it (two-space indent, ASCII only,
//! no final newline), so that the file is byte-identical to theirs. As there, a metadata key
//! `total_size` of the caller's replaces the computed one.

use std::collections::BTreeMap;

/// The maximum shard size `huggingface_hub` uses by default ("5GB").
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// The shards of a checkpoint: each one's file name and its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// For each shard, in order: its file name and the positions (in the given order) of its
    /// tensors, in the given order.
    pub shards: Vec<(String, Vec<usize>)>,
    /// The bytes of every tensor together: the index's `metadata.total_size`.
    pub total_size: u64,
}

/// Splits tensors of `sizes` bytes (in the order given) into shards of at most
/// `max_shard_size` bytes (a larger tensor gets a shard of its own) named after `prefix` (see
/// the module documentation). No tensors give one shard holding none. Returns `Err(i)` when the
/// total passes 2^64 at tensor `i`.
pub fn plan_shards(sizes: &[u64], max_shard_size: u64, prefix: &str) -> Result<ShardPlan, usize> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut open_size = 0u64;
    let mut total = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        total = total.checked_add(size).ok_or(i)?;
        if size > max_shard_size {
            groups.push(vec![i]);
            continue;
        }
        // `open_size` never passes the maximum, so adding a size that does not either cannot
        // overflow.
        if open_size + size > max_shard_size {
            groups.push(std::mem::take(&mut open));
            open_size = 0;
        }
        open.push(i);
        open_size += size;
    }
    if !open.is_empty() || groups.is_empty() {
        groups.push(open);
    }
    let n = groups.len();
    let shards = groups
        .into_iter()
        .enumerate()
        .map(|(k, tensors)| {
            let name = if n == 1 {
                format!("{prefix}.safetensors")
            } else {
                format!("{prefix}-{:05}-of-{n:05}.safetensors", k + 1)
            };
            (name, tensors)
        })
        .collect();
    Ok(ShardPlan {
        shards,
        total_size: total,
    })
}

/// The index file's name for shards named after `prefix`.
pub(crate) fn index_name(prefix: &str) -> String {
    format!("{prefix}.safetensors.index.json")
}

/// Whether `name` is a file of a checkpoint saved under `prefix`: `{prefix}.safetensors`,
/// `{prefix}-NNNNN-of-NNNNN.safetensors` or the index, the names `save_torch_state_dict` clears
/// from a directory before it saves there.
pub(crate) fn is_checkpoint_file(name: &[u8], prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix.as_bytes()) else {
        return false;
    };
    let rest = match rest.strip_suffix(b".index.json") {
        Some(r) => r,
        None => rest,
    };
    let Some(numbers) = rest.strip_suffix(b".safetensors") else {
        return false;
    };
    if numbers.is_empty() {
        return true;
    }
    // `-DDDDD-of-DDDDD`
    numbers.len() == 15
        && numbers[0] == b'-'
        && &numbers[6..10] == b"-of-"
        && numbers[1..6]
            .iter()
            .chain(&numbers[10..])
            .all(u8::is_ascii_digit)
}

/// The index file's bytes: `plan`'s weight map and total size, and `metadata` after
/// `total_size`, as Python's `json.dump(..., indent=2)` writes them.
pub(crate) fn index_text(
    plan: &ShardPlan,
    names: &[&str],
    metadata: Option<&BTreeMap<String, String>>,
) -> Vec<u8> {
    let mut out = String::from("{\n  \"metadata\": {\n    \"total_size\": ");
    match metadata.and_then(|m| m.get("total_size")) {
        Some(v) => push_py_json_str(&mut out, v),
        None => out.push_str(&plan.total_size.to_string()),
    }
    for (k, v) in metadata.into_iter().flatten() {
        if k == "total_size" {
            continue;
        }
        out.push_str(",\n    ");
        push_py_json_str(&mut out, k);
        out.push_str(": ");
        push_py_json_str(&mut out, v);
    }
    out.push_str("\n  },\n  \"weight_map\": ");
    let mut first = true;
    for (file, tensors) in &plan.shards {
        for &i in tensors {
            out.push_str(if first { "{\n    " } else { ",\n    " });
            first = false;
            push_py_json_str(&mut out, names[i]);
            out.push_str(": ");
            push_py_json_str(&mut out, file);
        }
    }
    out.push_str(if first { "{}" } else { "\n  }" });
    out.push_str("\n}");
    out.into_bytes()
}

/// A JSON string as Python's `json` module writes it by default (`ensure_ascii`): `"` and `\`
/// escaped, the five short escapes, every other character outside printable ASCII as `\uxxxx`
/// (lowercase hex; beyond the BMP as a surrogate pair).
fn push_py_json_str(out: &mut String, s: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(plan: &ShardPlan) -> Vec<Vec<usize>> {
        plan.shards.iter().map(|(_, t)| t.clone()).collect()
    }

    #[test]
    fn splits_as_the_reference_documents() {
        // The docstring's example: 10 GB shards of [6, 6, 2, 6, 2, 2] GB give [6], [6+2], [6+2+2].
        let plan = plan_shards(&[6, 6, 2, 6, 2, 2], 10, "model").unwrap();
        assert_eq!(groups(&plan), vec![vec![0], vec![1, 2], vec![3, 4, 5]]);
        assert_eq!(plan.total_size, 24);
        let names: Vec<&str> = plan.shards.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors"
            ]
        );
    }

    #[test]
    fn a_tensor_over_the_maximum_gets_its_own_shard_where_it_comes() {
        // The open shard [0, 1] stays open while 2 gets a shard of its own before it, and so
        // does 4 (as huggingface_hub 2.4.0 gives, checked there).
        let plan = plan_shards(&[1, 1, 9, 1, 4], 3, "m").unwrap();
        assert_eq!(groups(&plan), vec![vec![2], vec![4], vec![0, 1, 3]]);
        let plan = plan_shards(&[1, 1, 9, 1, 2], 3, "m").unwrap();
        assert_eq!(groups(&plan), vec![vec![2], vec![0, 1, 3], vec![4]]);
        // Exactly the maximum fits.
        let plan = plan_shards(&[3, 3], 3, "m").unwrap();
        assert_eq!(groups(&plan), vec![vec![0], vec![1]]);
    }

    #[test]
    fn one_shard_is_named_without_numbers_and_none_is_an_empty_one() {
        let plan = plan_shards(&[1, 2, 0], 100, "model").unwrap();
        assert_eq!(
            plan.shards,
            vec![("model.safetensors".to_string(), vec![0, 1, 2])]
        );
        let plan = plan_shards(&[], 100, "model").unwrap();
        assert_eq!(plan.shards, vec![("model.safetensors".to_string(), vec![])]);
        assert_eq!(plan_shards(&[u64::MAX, 1], 100, "m"), Err(1));
    }

    #[test]
    fn the_index_is_written_as_pythons_json_dump_with_indent_2() {
        let plan = plan_shards(&[4, 4], 4, "model").unwrap();
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        meta.insert("note".to_string(), "é\u{1F600}\"\\\n\u{7f}".to_string());
        let text = index_text(&plan, &["b", "a"], Some(&meta));
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "{\n  \"metadata\": {\n    \"total_size\": 8,\n    \"format\": \"pt\",\n    \"note\": \
             \"\\u00e9\\ud83d\\ude00\\\"\\\\\\n\\u007f\"\n  },\n  \"weight_map\": {\n    \"b\": \
             \"model-00001-of-00002.safetensors\",\n    \"a\": \
             \"model-00002-of-00002.safetensors\"\n  }\n}"
        );
    }

    #[test]
    fn recognises_the_files_of_a_checkpoint() {
        for yes in [
            "model.safetensors",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
        ] {
            assert!(is_checkpoint_file(yes.as_bytes(), "model"), "{yes}");
        }
        for no in [
            "model.safetensors.bak",
            "model-1-of-2.safetensors",
            "model-00001-of-0000x.safetensors",
            "other.safetensors",
            "model-00001-of-00002.safetensors.index.json.x",
            "modelx.safetensors",
        ] {
            assert!(!is_checkpoint_file(no.as_bytes(), "model"), "{no}");
        }
    }
}
