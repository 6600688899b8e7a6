//! One named test per error kind, and one per case where the reference is more lenient than its
//! own README (we must accept those too).

mod common;

use std::collections::BTreeMap;

use common::{raw_file, raw_file_bytes, scratch_dir};
use safetensors_core::{
    convert, dtype_to_write, serialize, text_to_write, Backend, Dtype, ErrorKind, Header, Indexer,
    PreparedFile, SafeFile, SafeTensors, SlicePlan, TensorView, TextField, MAX_HEADER_SIZE,
};

fn kind(bytes: &[u8]) -> ErrorKind {
    Header::parse(bytes).expect_err("must be rejected").kind()
}

fn ok(bytes: &[u8]) -> Header {
    Header::parse(bytes).unwrap_or_else(|e| panic!("must be accepted: {e}"))
}

const ONE_F32: &str = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;

// ---- one test per error kind -------------------------------------------------------------

#[test]
fn rejects_input_shorter_than_the_length_prefix() {
    for len in 0..8 {
        assert_eq!(
            kind(&vec![0u8; len]),
            ErrorKind::HeaderTooSmall,
            "{len} bytes"
        );
    }
}

#[test]
fn rejects_header_length_over_the_limit() {
    let mut f = ((MAX_HEADER_SIZE as u64) + 1).to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    assert_eq!(kind(&f), ErrorKind::HeaderTooLarge);
    let mut near_max = u64::MAX.to_le_bytes().to_vec();
    near_max.extend_from_slice(b"{}");
    assert_eq!(kind(&near_max), ErrorKind::HeaderTooLarge);
    // Exactly the limit passes this check and fails the next (the file is too short).
    let mut at_limit = (MAX_HEADER_SIZE as u64).to_le_bytes().to_vec();
    at_limit.extend_from_slice(b"{}");
    assert_eq!(kind(&at_limit), ErrorKind::InvalidHeaderLength);
}

#[test]
fn names_git_lfs_pointer_files() {
    let pointer = b"version https://git-lfs.github.com/spec/v1\n\
oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 548105171\n";
    let err = Header::parse(pointer).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeaderTooLarge);
    assert!(err.to_string().contains("git-lfs pointer"), "{err}");
}

#[test]
fn rejects_header_extending_past_the_end() {
    let mut f = raw_file(ONE_F32, 8);
    f.truncate(20);
    assert_eq!(kind(&f), ErrorKind::InvalidHeaderLength);
    let mut claims_more = 64u64.to_le_bytes().to_vec();
    claims_more.extend_from_slice(b"{}");
    assert_eq!(kind(&claims_more), ErrorKind::InvalidHeaderLength);
}

#[test]
fn rejects_header_that_is_not_utf8() {
    assert_eq!(
        kind(&raw_file_bytes(b"{\"\xff\":1}", 0)),
        ErrorKind::InvalidHeader
    );
    assert_eq!(
        kind(&raw_file_bytes(b"{}\xc3", 0)),
        ErrorKind::InvalidHeader
    );
}

#[test]
fn rejects_json_outside_the_schema() {
    let cases = [
        "[]",
        "null",
        "\"x\"",
        r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2]}}"#,
        r#"{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":1}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":[]}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\u0000"#,
        "\u{feff}{}",
        "{/*c*/}",
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x"#,
        r#"{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":5}"#,
    ];
    for json in cases {
        let json = json.replace("\\u0000", "\0");
        assert_eq!(
            kind(&raw_file(&json, 8)),
            ErrorKind::InvalidHeaderDeserialization,
            "{json:?}"
        );
    }
}

#[test]
fn rejects_offsets_with_gaps_overlaps_or_reversed_ends() {
    let gap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}"#;
    let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
    let hole_at_start = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#;
    let reversed = r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"c":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}}"#;
    for (json, len) in [(gap, 5), (overlap, 3), (hole_at_start, 4), (reversed, 2)] {
        let err = Header::parse(&raw_file(json, len)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOffset, "{json}");
    }
    let err = Header::parse(&raw_file(gap, 5)).unwrap_err();
    assert!(
        err.to_string().contains("`b`") && err.to_string().contains("gap"),
        "{err}"
    );
}

#[test]
fn rejects_shapes_whose_size_overflows() {
    let big = 1u64 << 32;
    let dims_overflow =
        format!(r#"{{"a":{{"dtype":"U8","shape":[{big},{big},0],"data_offsets":[0,0]}}}}"#);
    assert_eq!(
        kind(&raw_file(&dims_overflow, 0)),
        ErrorKind::ValidationOverflow
    );
    let bits_overflow = format!(
        r#"{{"a":{{"dtype":"F32","shape":[{}],"data_offsets":[0,0]}}}}"#,
        1u64 << 62
    );
    assert_eq!(
        kind(&raw_file(&bits_overflow, 0)),
        ErrorKind::ValidationOverflow
    );
}

#[test]
fn rejects_sub_byte_tensors_that_end_inside_a_byte() {
    let f4 = r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#;
    assert_eq!(kind(&raw_file(f4, 2)), ErrorKind::MisalignedSlice);
    let f6 = r#"{"a":{"dtype":"F6_E3M2","shape":[2],"data_offsets":[0,2]}}"#;
    assert_eq!(kind(&raw_file(f6, 2)), ErrorKind::MisalignedSlice);
    let f6_ok = r#"{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}"#;
    assert_eq!(ok(&raw_file(f6_ok, 3)).len(), 1);
}

#[test]
fn rejects_offsets_that_disagree_with_dtype_and_shape() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,7]}}"#;
    let err = Header::parse(&raw_file(json, 7)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorInvalidInfo);
    assert!(err.to_string().contains("8 bytes but 7"), "{err}");
}

#[test]
fn rejects_missing_or_trailing_data_bytes() {
    let truncated = Header::parse(&raw_file(ONE_F32, 5)).unwrap_err();
    assert_eq!(truncated.kind(), ErrorKind::MetadataIncompleteBuffer);
    assert!(truncated.to_string().contains("truncated"), "{truncated}");
    let trailing = Header::parse(&raw_file(ONE_F32, 9)).unwrap_err();
    assert_eq!(trailing.kind(), ErrorKind::MetadataIncompleteBuffer);
    assert!(trailing.to_string().contains("1 extra byte"), "{trailing}");
    // An end offset near 2^64: checked arithmetic, no wrap-around.
    let huge = format!(
        r#"{{"a":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}}}"#,
        n = u64::MAX / 8
    );
    assert_eq!(
        kind(&raw_file(&huge, 0)),
        ErrorKind::MetadataIncompleteBuffer
    );
}

#[test]
fn reports_unknown_tensor_names() {
    let bytes = raw_file(ONE_F32, 8);
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let err = file.tensor("b").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorNotFound);
    assert_eq!(err.to_string(), "tensor `b` not found");
}

#[test]
fn rejects_duplicate_tensor_names_and_metadata_keys() {
    let tensors = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert_eq!(kind(&raw_file(tensors, 2)), ErrorKind::DuplicateKey);
    let meta = r#"{"__metadata__":{"k":"1","k":"2"}}"#;
    assert_eq!(kind(&raw_file(meta, 0)), ErrorKind::DuplicateKey);
    let twice = r#"{"__metadata__":{"k":"1"},"__metadata__":{"j":"2"}}"#;
    assert_eq!(kind(&raw_file(twice, 0)), ErrorKind::DuplicateKey);
    // Malformed JSON wins over a duplicate seen earlier, as the reference reports it.
    let both = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},}"#;
    assert_eq!(
        kind(&raw_file(both, 2)),
        ErrorKind::InvalidHeaderDeserialization
    );
    // The writer refuses them too.
    let d = [0u8; 1];
    let v = TensorView::new(Dtype::U8, &[1], &d);
    assert_eq!(
        serialize([("x", v), ("x", v)], None).unwrap_err().kind(),
        ErrorKind::DuplicateKey
    );
}

#[test]
fn writer_refuses_the_reserved_name() {
    let d = [0u8; 1];
    let err = serialize(
        [("__metadata__", TensorView::new(Dtype::U8, &[1], &d))],
        None,
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidTensorName);
}

#[test]
fn writer_refuses_data_of_the_wrong_length() {
    let d = [0u8; 7];
    let err = serialize([("w", TensorView::new(Dtype::F32, &[2], &d))], None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorInvalidInfo);
    let err = serialize([("w", TensorView::new(Dtype::F4, &[3], &d[..2]))], None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MisalignedSlice);
}

#[test]
fn writer_refuses_a_header_over_the_limit() {
    let name = "n".repeat(MAX_HEADER_SIZE);
    let err = serialize(
        [(name.as_str(), TensorView::new(Dtype::U8, &[0], &[]))],
        None,
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeaderTooLarge);
    let mut meta = BTreeMap::new();
    meta.insert("k".to_string(), "v".repeat(MAX_HEADER_SIZE));
    let err = serialize(Vec::<(&str, TensorView)>::new(), Some(&meta)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeaderTooLarge);
}

#[test]
fn writer_refuses_text_that_is_not_utf8() {
    let name = text_to_write(b"bad\xff", TextField::TensorName).unwrap_err();
    assert_eq!(name.kind(), ErrorKind::InvalidTensorName);
    assert_eq!(
        name.to_string(),
        "tensor name \"bad\u{fffd}\" is not valid UTF-8 (invalid byte 0xff at offset 3); a \
         safetensors header is UTF-8 JSON, so convert it to UTF-8 first"
    );
    for field in [TextField::MetadataKey, TextField::MetadataValue] {
        let e = text_to_write(b"k\xc3", field).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidHeader);
        assert!(e.to_string().starts_with(field.describe()), "{e}");
    }
    assert_eq!(
        text_to_write("é".as_bytes(), TextField::TensorName).unwrap(),
        "é"
    );
}

#[test]
fn dtype_values_outside_the_enumeration_are_named() {
    // A type error, never the byte-length kind (which would send the user looking at sizes).
    let e = dtype_to_write("w", 99).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TypeMismatch);
    assert_eq!(
        e.to_string(),
        "tensor `w` has an invalid dtype value 99 (valid values are 0 to 21)"
    );
    assert_eq!(dtype_to_write("w", 17).unwrap(), Dtype::F32);
    let e = convert::dtype_to_convert(22).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TypeMismatch);
    assert!(e.to_string().contains("dtype index 22"), "{e}");
}

#[test]
fn writer_refuses_a_buffer_of_the_wrong_size() {
    let d = [1u8; 4];
    let file = PreparedFile::new([("w", TensorView::new(Dtype::U8, &[4], &d))], None).unwrap();
    let mut short = vec![0u8; file.len() - 1];
    let e = file.write_into(&mut short).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSlice);
    assert!(
        e.to_string().contains(&format!(
            "holds {} bytes but {} bytes are needed",
            file.len() - 1,
            file.len()
        )),
        "{e}"
    );
}

#[test]
fn rejects_slices_that_do_not_fit() {
    let bytes = raw_file(ONE_F32, 8);
    let header = ok(&bytes);
    let info = header.tensor("a").unwrap();
    let too_many = SlicePlan::new(&info, &[Indexer::FULL, Indexer::FULL]).unwrap_err();
    assert_eq!(too_many.kind(), ErrorKind::InvalidSlice);
    let out_of_range = SlicePlan::new(&info, &[Indexer::Select(2)]).unwrap_err();
    assert_eq!(out_of_range.kind(), ErrorKind::InvalidSlice);
}

#[test]
fn io_errors_name_the_file() {
    let dir = scratch_dir("io_errors_name_the_file");
    let missing = dir.join("missing.safetensors");
    for backend in [Backend::Mmap, Backend::Read] {
        let err = SafeFile::open(&missing, backend).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Io);
        assert!(err.to_string().contains("missing.safetensors"), "{err}");
        let err = SafeFile::open(&dir, backend).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Io);
        assert!(err.to_string().contains("directory"), "{err}");
    }
}

#[test]
fn opening_a_fifo_fails_instead_of_blocking() {
    let dir = scratch_dir("opening_a_fifo_fails");
    let fifo = dir.join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: plain libc call on a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for backend in [Backend::Mmap, Backend::Read] {
        let err = SafeFile::open(&fifo, backend).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Io);
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}

#[test]
fn file_errors_carry_the_path() {
    let dir = scratch_dir("file_errors_carry_the_path");
    let path = dir.join("trunc.safetensors");
    std::fs::write(&path, raw_file(ONE_F32, 4)).unwrap();
    for backend in [Backend::Mmap, Backend::Read] {
        let err = SafeFile::open(&path, backend).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::MetadataIncompleteBuffer);
        assert_eq!(err.path(), Some(path.as_path()));
        assert!(err.to_string().starts_with(path.to_str().unwrap()), "{err}");
    }
}

// ---- lenient cases we must accept ---------------------------------------------------------

#[test]
fn accepts_leading_whitespace_before_the_object() {
    let h = ok(&raw_file(&format!(" \t\n\r{ONE_F32}"), 8));
    assert_eq!(h.tensor("a").unwrap().shape, &[2]);
}

#[test]
fn accepts_padding_with_any_json_whitespace() {
    for pad in [" ", "\t", "\n", "\r", " \t\r\n  "] {
        let h = ok(&raw_file(&format!("{ONE_F32}{pad}"), 8));
        assert_eq!(h.len(), 1);
    }
}

#[test]
fn ignores_unknown_fields_in_tensor_entries() {
    let json = r#"{"a":{"extra":{"nested":[1,2,{"x":null}]},"dtype":"F32","shape":[2],"data_offsets":[0,8],"more":"x"}}"#;
    assert_eq!(
        ok(&raw_file(json, 8)).tensor("a").unwrap().dtype,
        Dtype::F32
    );
}

#[test]
fn treats_null_metadata_as_absent() {
    let json = r#"{"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    assert!(ok(&raw_file(json, 8)).metadata().is_none());
}

#[test]
fn accepts_zero_size_tensors_sharing_an_offset() {
    let json = r#"{"z1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z2":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]},"z3":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}}"#;
    let h = ok(&raw_file(json, 8));
    // Offset order; equal offsets keep header order.
    assert_eq!(
        h.offset_names().collect::<Vec<_>>(),
        ["z1", "z2", "a", "z3"]
    );
}

#[test]
fn accepts_header_lengths_that_are_not_multiples_of_8() {
    let json = format!("{ONE_F32} ");
    assert_ne!(json.len() % 8, 0);
    let bytes = raw_file(&json, 8);
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.tensor("a").unwrap().data, &bytes[8 + json.len()..]);
}

#[test]
fn accepts_the_ten_byte_empty_file() {
    let bytes = raw_file("{}", 0);
    assert_eq!(bytes.len(), 10);
    let h = ok(&bytes);
    assert!(h.is_empty() && h.metadata().is_none());
    assert_eq!(h.data_len(), 0);
}

#[test]
fn accepts_zero_first_shape_whose_tail_would_overflow() {
    let big = 1u64 << 32;
    let json = format!(r#"{{"a":{{"dtype":"U8","shape":[0,{big},{big}],"data_offsets":[0,0]}}}}"#);
    let h = ok(&raw_file(&json, 0));
    let info = h.tensor("a").unwrap();
    assert_eq!(info.shape, &[0, big as usize, big as usize]);
    // Slicing must not multiply the dimensions again unchecked.
    let plan = SlicePlan::new(&info, &[Indexer::FULL, Indexer::range(1, 3)]).unwrap();
    assert_eq!(plan.shape(), &[0, 2, big as usize]);
    assert_eq!(plan.byte_len(), 0);
}

#[test]
fn accepts_key_order_different_from_offset_order() {
    let json = r#"{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let h = ok(&raw_file(json, 2));
    assert_eq!(h.offset_names().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn accepts_the_forms_serde_accepts_for_entries_and_dtypes() {
    // The reference deserializes entries with serde's derive, which also takes a 3-element array,
    // and dtypes as an externally tagged enum, which also takes `{"F32": null}`.
    let json =
        r#"{"a":["F32",[2],[0,8]],"b":{"dtype":{"U8":null},"shape":[1],"data_offsets":[8,9]}}"#;
    let h = ok(&raw_file(json, 9));
    assert_eq!(h.tensor("a").unwrap().data_offsets, (0, 8));
    assert_eq!(h.tensor("b").unwrap().dtype, Dtype::U8);
}

#[test]
fn accepts_escaped_names_and_metadata() {
    let json = r#"{"__metadata__":{"k\n":"v\u00e9\"","":""},"w\u0000\/x":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}"#;
    let h = ok(&raw_file(json, 1));
    assert!(h.get("w\0/x").is_some());
    let meta = h.metadata().unwrap();
    assert_eq!(meta.get("k\n").map(String::as_str), Some("vé\""));
    assert_eq!(meta.get("").map(String::as_str), Some(""));
}
