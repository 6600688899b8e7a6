//! Ours against the reference crate (safetensors 0.8.0) on arbitrary bytes: the same verdict and
//! the same tensors, except where we are documented to be stricter (repeated keys refused,
//! checked arithmetic where the reference panics or wraps).
//!
//! Each input is tried twice: as a whole file, and as the raw JSON value of an unknown field in
//! an otherwise valid tensor entry. The second form lets the fuzzer explore the grammar of
//! ignored values (numbers, escapes, nesting depth) without first having to build a valid file.
#![no_main]

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use libfuzzer_sys::fuzz_target;
use safetensors_core::{test_hooks, ErrorKind, Header};

type Tensors = BTreeMap<String, (String, Vec<usize>, (usize, usize))>;

fn reference(data: &[u8]) -> Option<Result<(usize, Tensors), String>> {
    // A panic of the reference (its overflow checks: `-a` builds with them) is a verdict here,
    // not a finding: but libfuzzer-sys's panic hook aborts the process on any panic, before
    // `catch_unwind` could see it. So the reference runs with a silent hook, and libfuzzer-sys's
    // hook is back before our own code runs (a panic of ours stays a crash).
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(|| safetensors::SafeTensors::read_metadata(data)));
    std::panic::set_hook(hook);
    let r = r.ok()?;
    Some(r.map(|(n, meta)| {
        let tensors = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, (format!("{:?}", info.dtype), info.shape.clone(), info.data_offsets)))
            .collect();
        (n, tensors)
    }).map_err(|e| format!("{e:?}")))
}

fn compare(data: &[u8]) {
    let ours = Header::parse(data);
    // Both of our JSON paths must give the same verdict.
    assert_eq!(
        ours.as_ref().map_err(|e| e.kind()).map(|h| h.len()),
        test_hooks::parse_general_only(data).as_ref().map_err(|e| e.kind()).map(|h| h.len()),
        "the default and the general path disagree"
    );
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
}

/// A valid one-tensor file whose entry has `"x":<value>` with `value` verbatim.
fn with_unknown_field(value: &[u8]) -> Vec<u8> {
    let mut json = br#"{"t":{"dtype":"U8","shape":[1],"x":"#.to_vec();
    json.extend_from_slice(value);
    json.extend_from_slice(br#","data_offsets":[0,1]}}"#);
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&json);
    file.push(0);
    file
}

fuzz_target!(|data: &[u8]| {
    compare(data);
    compare(&with_unknown_field(data));
});
