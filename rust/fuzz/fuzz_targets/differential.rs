//! Ours against the reference crate (safetensors 0.8.0) on arbitrary bytes: the same verdict and
//! the same tensors, except where we are documented to be stricter (repeated keys refused,
//! checked arithmetic where the reference panics or wraps).
#![no_main]

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use libfuzzer_sys::fuzz_target;
use safetensors_core::{ErrorKind, Header};

type Tensors = BTreeMap<String, (String, Vec<usize>, (usize, usize))>;

fn reference(data: &[u8]) -> Option<Result<(usize, Tensors), String>> {
    let r = catch_unwind(AssertUnwindSafe(|| safetensors::SafeTensors::read_metadata(data))).ok()?;
    Some(r.map(|(n, meta)| {
        let tensors = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, (format!("{:?}", info.dtype), info.shape.clone(), info.data_offsets)))
            .collect();
        (n, tensors)
    }).map_err(|e| format!("{e:?}")))
}

fuzz_target!(|data: &[u8]| {
    let ours = Header::parse(data);
    let Some(theirs) = reference(data) else {
        // The reference panicked (debug-build overflow checks): we must have refused it.
        assert!(ours.is_err(), "we accept what makes the reference panic");
        return;
    };
    match (ours, theirs) {
        (Ok(h), Ok((n, tensors))) => {
            assert_eq!(h.header_len(), n);
            let ours: Tensors = h
                .iter()
                .map(|t| (t.name.to_owned(), (t.dtype.to_string(), t.shape.to_vec(), t.data_offsets)))
                .collect();
            assert_eq!(ours, tensors);
        }
        (Err(e), Ok(_)) => assert_eq!(e.kind(), ErrorKind::DuplicateKey, "we refuse, the reference accepts: {e}"),
        (Ok(_), Err(e)) => panic!("we accept, the reference refuses: {e}"),
        (Err(_), Err(_)) => {}
    }
});
