//! The writer's layout and atomicity, and the two file backends.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use common::scratch_dir;
use safetensors_core::{
    serialize, serialize_to_file, Backend, Dtype, ErrorKind, Indexer, SafeFile, SafeTensors,
    TensorView,
};

fn header_text(bytes: &[u8]) -> &str {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    std::str::from_utf8(&bytes[8..8 + n]).unwrap()
}

#[test]
fn writes_the_empty_file_as_the_format_documents() {
    let bytes = serialize(Vec::<(&str, TensorView)>::new(), None).unwrap();
    assert_eq!(bytes.len(), 16);
    assert_eq!(header_text(&bytes), "{}      ");
}

#[test]
fn writes_the_single_tensor_example_as_the_format_documents() {
    let data = [0u8; 16];
    let bytes = serialize(
        [("test", TensorView::new(Dtype::I32, &[2, 2], &data))],
        None,
    )
    .unwrap();
    assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), 64);
    assert_eq!(
        header_text(&bytes),
        r#"{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}    "#
    );
}

#[test]
fn writes_metadata_first_sorted_then_tensors_by_dtype_descending_then_name() {
    let f = [1u8; 8];
    let b = [2u8; 2];
    let meta: BTreeMap<String, String> =
        [("z".into(), "1".into()), ("a".into(), "2".into())].into();
    let bytes = serialize(
        [
            ("b_small", TensorView::new(Dtype::U8, &[2], &b)),
            ("z_f32", TensorView::new(Dtype::F32, &[2], &f)),
            ("a_f32", TensorView::new(Dtype::F32, &[2], &f)),
            ("m_bool", TensorView::new(Dtype::BOOL, &[2], &b)),
            ("c_f64", TensorView::new(Dtype::F64, &[1], &f)),
        ],
        Some(&meta),
    )
    .unwrap();
    let text = header_text(&bytes);
    assert_eq!(
        text.trim_end(),
        concat!(
            r#"{"__metadata__":{"a":"2","z":"1"},"#,
            r#""c_f64":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"#,
            r#""a_f32":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"#,
            r#""z_f32":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},"#,
            r#""b_small":{"dtype":"U8","shape":[2],"data_offsets":[24,26]},"#,
            r#""m_bool":{"dtype":"BOOL","shape":[2],"data_offsets":[26,28]}}"#
        )
    );
    assert_eq!(text.len() % 8, 0);
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.header().metadata(), Some(&meta));
    assert_eq!(file.tensor("m_bool").unwrap().data, &b);
}

fn sample_tensors(fill: u8) -> Vec<(String, Vec<usize>, Dtype, Vec<u8>)> {
    Dtype::ALL
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let shape = vec![2, 4];
            let len = d.byte_size(8).unwrap();
            (
                format!("t{i}.{d}"),
                shape,
                d,
                (0..len).map(|j| (j as u8).wrapping_mul(fill)).collect(),
            )
        })
        .collect()
}

fn views(t: &[(String, Vec<usize>, Dtype, Vec<u8>)]) -> Vec<(&str, TensorView<'_>)> {
    t.iter()
        .map(|(n, s, d, data)| (n.as_str(), TensorView::new(*d, s, data)))
        .collect()
}

#[test]
fn file_writer_produces_the_serialized_bytes_and_both_backends_read_them() {
    let dir = scratch_dir("file_writer_produces_the_serialized_bytes");
    let tensors = sample_tensors(3);
    let path = dir.join("all.safetensors");
    serialize_to_file(views(&tensors), None, &path).unwrap();
    let expect = serialize(views(&tensors), None).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), expect);
    for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
        let f = SafeFile::open(&path, backend).unwrap();
        assert_eq!(f.backend(), backend);
        assert_eq!(f.header().len(), 22);
        for (name, shape, dtype, data) in &tensors {
            let info = f.info(name).unwrap();
            assert_eq!((info.dtype, info.shape), (*dtype, shape.as_slice()));
            assert_eq!(f.tensor_bytes(name).unwrap().as_ref(), data.as_slice());
        }
    }
    // Nothing but the target is left in the directory.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["all.safetensors"]);
}

#[test]
fn replacing_a_mapped_file_keeps_the_old_mapping_intact() {
    let dir = scratch_dir("replacing_a_mapped_file");
    let path = dir.join("m.safetensors");
    let old = sample_tensors(3);
    serialize_to_file(views(&old), None, &path).unwrap();
    let mapped = SafeFile::open(&path, Backend::Mmap).unwrap();
    let new = sample_tensors(5);
    serialize_to_file(views(&new), None, &path).unwrap();
    for (name, _, _, data) in &old {
        assert_eq!(mapped.tensor_bytes(name).unwrap().as_ref(), data.as_slice());
    }
    let reopened = SafeFile::open(&path, Backend::Mmap).unwrap();
    assert_eq!(
        reopened.tensor_bytes(&new[7].0).unwrap().as_ref(),
        new[7].3.as_slice()
    );
}

#[test]
fn refused_writes_leave_the_existing_file_untouched() {
    let dir = scratch_dir("refused_writes_leave_the_existing_file");
    let path = dir.join("keep.safetensors");
    serialize_to_file(views(&sample_tensors(3)), None, &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let short = [0u8; 3];
    let bad = [("w", TensorView::new(Dtype::F32, &[1], &short))];
    assert_eq!(
        serialize_to_file(bad, None, &path).unwrap_err().kind(),
        ErrorKind::TensorInvalidInfo
    );
    let reserved = [("__metadata__", TensorView::new(Dtype::U8, &[0], &[]))];
    assert_eq!(
        serialize_to_file(reserved, None, &path).unwrap_err().kind(),
        ErrorKind::InvalidTensorName
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let missing_dir = dir.join("no/such/dir/x.safetensors");
    let err = serialize_to_file(views(&sample_tensors(3)), None, &missing_dir).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["keep.safetensors"]);
}

#[test]
fn replacing_a_file_keeps_its_permissions() {
    let dir = scratch_dir("replacing_a_file_keeps_its_permissions");
    let path = dir.join("p.safetensors");
    serialize_to_file(views(&sample_tensors(1)), None, &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    serialize_to_file(views(&sample_tensors(2)), None, &path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
}

#[test]
fn writes_into_the_current_directory_with_a_bare_file_name() {
    let dir = scratch_dir("writes_into_the_current_directory");
    let here = std::env::current_dir().unwrap();
    // A bare name has an empty parent; the temp file must still go beside it.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "bare_name_child", "--nocapture"])
        .env("SAFETENSORS_TEST_BARE_DIR", &dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("bare.safetensors").exists());
    assert_eq!(std::env::current_dir().unwrap(), here);
}

#[test]
fn bare_name_child() {
    let Ok(dir) = std::env::var("SAFETENSORS_TEST_BARE_DIR") else {
        return; // Only meaningful when spawned by the test above.
    };
    std::env::set_current_dir(dir).unwrap();
    serialize_to_file(views(&sample_tensors(1)), None, "bare.safetensors").unwrap();
}

#[test]
fn read_backend_reads_only_the_bytes_asked_for() {
    let dir = scratch_dir("read_backend_reads_only");
    let path = dir.join("big.safetensors");
    let big: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 31 % 251) as u8).collect();
    let small = [9u8; 64];
    serialize_to_file(
        [
            ("big", TensorView::new(Dtype::U8, &[512, 512], &big)),
            ("small", TensorView::new(Dtype::F32, &[16], &small)),
        ],
        None,
        &path,
    )
    .unwrap();
    let f = SafeFile::open(&path, Backend::Read).unwrap();
    assert_eq!(f.bytes_read(), 0, "opening reads only the header");
    assert_eq!(f.tensor_bytes("small").unwrap().as_ref(), &small);
    assert_eq!(f.bytes_read(), 64);
    // A column slice of 8 columns of 512 rows: 4 KiB of a 256 KiB tensor.
    let plan = f
        .plan_slice("big", &[Indexer::FULL, Indexer::range(100, 108)])
        .unwrap();
    let mut out = vec![0u8; plan.byte_len()];
    f.read_slice("big", &plan, &mut out).unwrap();
    assert_eq!(f.bytes_read(), 64 + 4096);
    let want: Vec<u8> = (0..512)
        .flat_map(|r| big[r * 512 + 100..r * 512 + 108].to_vec())
        .collect();
    assert_eq!(out, want);
    // The mapped backend gives the same slice.
    let m = SafeFile::open(&path, Backend::Mmap).unwrap();
    let mut out2 = vec![0u8; plan.byte_len()];
    m.read_slice("big", &plan, &mut out2).unwrap();
    assert_eq!(out2, want);
    assert_eq!(m.bytes_read(), 0);
}

#[test]
fn read_backend_reports_a_file_truncated_after_open() {
    let dir = scratch_dir("read_backend_reports_truncation");
    let path = dir.join("t.safetensors");
    let data = vec![1u8; 4096];
    serialize_to_file(
        [("w", TensorView::new(Dtype::U8, &[4096], &data))],
        None,
        &path,
    )
    .unwrap();
    let good = std::fs::read(&path).unwrap();
    for backend in [Backend::Read, Backend::Direct] {
        std::fs::write(&path, &good).unwrap();
        let f = SafeFile::open(&path, backend).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(100).unwrap();
        let err = f.tensor_bytes("w").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "{backend:?}");
        assert!(err.to_string().contains("truncated or replaced"), "{err}");
    }
}

#[test]
fn lookups_of_missing_tensors_name_the_file() {
    let dir = scratch_dir("lookups_of_missing_tensors");
    let path = dir.join("x.safetensors");
    serialize_to_file(views(&sample_tensors(1)), None, &path).unwrap();
    let f = SafeFile::open(&path, Backend::Mmap).unwrap();
    let err = f.info("nope").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorNotFound);
    assert!(err.to_string().contains("x.safetensors") && err.to_string().contains("`nope`"));
}

#[test]
fn headers_ending_around_the_first_block_read_open_on_every_backend() {
    // The first read at open takes up to 16 KiB; a header (length prefix included) that ends
    // one byte before, at or after that, in files shorter and longer than it, parses the same
    // on every backend, and a header one byte past the file's end is refused.
    let dir = scratch_dir("headers_around_the_first_read");
    let path = dir.join("h.safetensors");
    const FIRST: usize = 16 * 1024;
    for end in [FIRST - 1, FIRST, FIRST + 1] {
        for data_len in [0usize, 1, 7, 5000] {
            let json = format!(
                r#"{{"t":{{"dtype":"U8","shape":[{data_len}],"data_offsets":[0,{data_len}]}}}}"#
            );
            let padded = format!("{json:<width$}", width = end - 8);
            let bytes = common::raw_file(&padded, data_len);
            std::fs::write(&path, &bytes).unwrap();
            for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
                let f = SafeFile::open(&path, backend).unwrap();
                assert_eq!(f.header().data_start(), end, "{backend:?}, header to {end}");
                let got = f.tensor_bytes("t").unwrap();
                assert!(
                    got[..] == bytes[end..],
                    "{backend:?}, header to {end}, {data_len} data bytes"
                );
            }
            // The same header in a file one byte short of it.
            std::fs::write(&path, &bytes[..end - 1]).unwrap();
            for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
                let err = SafeFile::open(&path, backend).err().expect("a short file");
                assert_eq!(
                    err.kind(),
                    ErrorKind::InvalidHeaderLength,
                    "{backend:?}: {err}"
                );
            }
        }
    }
}
