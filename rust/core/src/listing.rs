//! What the bindings hand out by position and keep for as long as what it came from lives:
//! metadata as (key, value) pairs in key order (C's `st_file_metadata(i)`, the C++ bridge's
//! `Metadata` walked by index), and a file's tensor names in byte-wise order (Python's
//! `keys()`), sorted once, by the first call that asks. This module owns those orders and the
//! rule that each is made once: a caller holds the strings and positions handed out for as
//! long as the file or checkpoint lives, so they may never be rebuilt under it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::header::Header;

/// A metadata map as pairs in key order (byte-wise, as the map keeps them), walked by index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataList(Vec<(String, String)>);

impl MetadataList {
    /// The entries of `map` (none for `None`: no metadata at all).
    pub fn of(map: Option<&BTreeMap<String, String>>) -> MetadataList {
        MetadataList(
            map.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
        )
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entry `i` in key order, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<(&str, &str)> {
        self.0.get(i).map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The value of the key spelled by the bytes `key`. Any bytes may be asked for: keys are
    /// UTF-8, so bytes that are not match none (no lossy copy that could match another).
    pub fn value(&self, key: &[u8]) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_bytes().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }
}

/// A file's tensor positions (its offset order) in byte-wise name order, sorted at the first
/// call that asks and kept. Always asked with the header of the file it belongs to.
#[derive(Debug, Default)]
pub struct SortedNames(OnceLock<Vec<u32>>);

impl SortedNames {
    /// Nothing sorted yet.
    pub fn new() -> SortedNames {
        SortedNames::default()
    }

    /// Every position of `header`, in name order.
    pub fn order(&self, header: &Header) -> &[u32] {
        self.0.get_or_init(|| header.sorted_positions())
    }

    /// The position (offset order) of the `i`-th name in name order, or `None` past the end.
    pub fn position(&self, header: &Header, i: usize) -> Option<usize> {
        self.order(header).get(i).map(|&p| p as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{serialize, Dtype, TensorView};

    #[test]
    fn metadata_is_walked_in_key_order() {
        let map: BTreeMap<String, String> = [("b", "2"), ("a", "1"), ("B", "0")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let list = MetadataList::of(Some(&map));
        assert_eq!(list.len(), 3);
        assert_eq!(list.get(0), Some(("B", "0")));
        assert_eq!(list.get(2), Some(("b", "2")));
        assert_eq!(list.get(3), None);
        assert!(MetadataList::of(None).is_empty());
        assert_eq!(list.value(b"a"), Some("1"));
        assert_eq!(list.value(b"B"), Some("0"));
        assert_eq!(list.value(b"c"), None);
        assert_eq!(list.value(b"a\xff"), None);
    }

    #[test]
    fn names_are_sorted_bytewise_once() {
        let d = [0u8; 4];
        let bytes = serialize(
            [
                ("b", TensorView::new(Dtype::U8, &[1], &d[..1])),
                ("a", TensorView::new(Dtype::F32, &[1], &d)),
                ("C", TensorView::new(Dtype::U8, &[1], &d[..1])),
            ],
            None,
        )
        .unwrap();
        let header = crate::SafeTensors::deserialize(&bytes).unwrap();
        let header = header.header();
        let sorted = SortedNames::new();
        let names: Vec<&str> = (0..3)
            .map(|i| header.name_at(sorted.position(header, i).unwrap()).unwrap())
            .collect();
        assert_eq!(names, ["C", "a", "b"]);
        assert!(std::ptr::eq(sorted.order(header), sorted.order(header)));
        assert_eq!(sorted.position(header, 3), None);
    }
}
