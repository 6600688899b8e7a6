//! The header parser over arbitrary bytes: never panics, both JSON paths agree, and an accepted
//! header describes tensors that all lie inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use safetensors_core::{test_hooks, Header, SafeTensors};

type Summary = (usize, Vec<(String, String, Vec<usize>, (usize, usize))>, Option<Vec<(String, String)>>);

fn summary(h: &Header) -> Summary {
    let tensors = h
        .iter()
        .map(|t| (t.name.to_owned(), t.dtype.to_string(), t.shape.to_vec(), t.data_offsets))
        .collect();
    let meta = h.metadata().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    (h.header_len(), tensors, meta)
}

fuzz_target!(|data: &[u8]| {
    let ours = Header::parse(data);
    let general = test_hooks::parse_general_only(data);
    match (&ours, &general) {
        (Ok(a), Ok(b)) => assert_eq!(summary(a), summary(b)),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
        _ => panic!("the canonical and general paths disagree: {ours:?} vs {general:?}"),
    }
    match ours {
        Ok(h) => {
            assert_eq!(h.file_len(), data.len());
            let file = SafeTensors::deserialize(data).expect("accepted once, accepted again");
            for (name, view) in file.tensors() {
                assert_eq!(h.tensor(name).unwrap().byte_len(), view.data.len());
            }
            for name in h.sorted_names() {
                assert!(h.position(name).is_some());
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
