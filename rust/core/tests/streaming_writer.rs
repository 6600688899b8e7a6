//! The streaming writer: files written in pieces, in any order, from several threads, are
//! byte-identical to `serialize` of the same tensors; every wrong piece is a typed error; an
//! unfinished or failed writer leaves the target as it was and nothing beside it; alignment;
//! memory that does not grow with the file.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use common::alloc::{measuring, peak_during};
use common::scratch_dir;
use common::sharded::pattern;
use safetensors_core::{
    serialize, serialize_to_file, Backend, Dtype, ErrorKind, Header, OpenOptions, PreparedFile,
    SafeFile, StreamWriter, TensorSpec, TensorView, WriteOptions, DIRECT_ALIGN,
};

// The heap is counted process-wide, so every test of this binary takes its turn (`measuring`).
#[global_allocator]
static ALLOCATOR: common::alloc::Counting = common::alloc::Counting;

/// Tensors of every dtype (sizes that are not multiples of anything, zero-sized, scalars),
/// declared in an order unrelated to the file's.
fn specs() -> Vec<TensorSpec> {
    let mut out = Vec::new();
    for (i, &d) in Dtype::ALL.iter().enumerate() {
        // Sub-byte formats need element counts that make whole bytes.
        let n = 4 * (i + 3);
        out.push(TensorSpec::new(
            format!("t{:02}.{}", (i * 7) % 22, d.name()),
            d,
            &[n, 3],
        ));
    }
    out.push(TensorSpec::new("scalar", Dtype::F64, &[]));
    out.push(TensorSpec::new("empty", Dtype::F32, &[0, 5]));
    out.push(TensorSpec::new("big", Dtype::U8, &[100_003]));
    out
}

fn data_of(specs: &[TensorSpec]) -> Vec<Vec<u8>> {
    specs
        .iter()
        .enumerate()
        .map(|(k, s)| pattern(k, s.dtype.byte_size(s.shape.iter().product()).unwrap()))
        .collect()
}

fn metadata() -> BTreeMap<String, String> {
    BTreeMap::from([("format".to_string(), "pt".to_string())])
}

fn reference(specs: &[TensorSpec], data: &[Vec<u8>], alignment: usize) -> Vec<u8> {
    let views = specs
        .iter()
        .zip(data)
        .map(|(s, d)| (s.name.as_str(), TensorView::new(s.dtype, &s.shape, d)));
    let meta = metadata();
    let prepared = PreparedFile::aligned(views, Some(&meta), alignment).unwrap();
    let mut out = vec![0; prepared.len()];
    prepared.write_into(&mut out).unwrap();
    out
}

/// A fixed shuffle, so that failures reproduce.
fn shuffled<T>(mut items: Vec<T>, seed: u64) -> Vec<T> {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items.swap(i, (state >> 33) as usize % (i + 1));
    }
    items
}

/// Every tensor cut into pieces of up to `piece` bytes: (tensor, offset, len).
fn pieces(data: &[Vec<u8>], piece: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for (k, d) in data.iter().enumerate() {
        let mut at = 0;
        while at < d.len() {
            let len = piece.min(d.len() - at);
            out.push((k, at, len));
            at += len;
        }
    }
    out
}

#[test]
fn pieces_in_any_order_give_the_bytes_serialize_gives() {
    let _turn = measuring();
    let dir = scratch_dir("stream_any_order");
    let specs = specs();
    let data = data_of(&specs);
    let want = reference(&specs, &data, 0);
    assert_eq!(
        want,
        serialize(
            specs
                .iter()
                .zip(&data)
                .map(|(s, d)| (s.name.as_str(), TensorView::new(s.dtype, &s.shape, d))),
            Some(&metadata())
        )
        .unwrap()
    );
    for (round, piece) in [1usize, 7, 4096, 1 << 20].into_iter().enumerate() {
        let path = dir.join(format!("out{round}.safetensors"));
        let mut w = StreamWriter::create(&path, &specs, Some(&metadata()), WriteOptions::default())
            .unwrap();
        assert_eq!(w.file_len(), want.len() as u64);
        // Nothing under the target's name while writing.
        assert!(!path.exists());
        for (k, at, len) in shuffled(pieces(&data, piece), round as u64) {
            w.write_at(&specs[k].name, at as u64, &data[k][at..at + len])
                .unwrap();
        }
        w.finish().unwrap();
        assert_eq!(fs::read(&path).unwrap(), want, "pieces of {piece} bytes");
    }
    assert_eq!(
        listing(&dir).len(),
        4,
        "no temporary file left: {:?}",
        listing(&dir)
    );
}

#[test]
fn pieces_from_many_threads_at_once_give_the_same_bytes() {
    let _turn = measuring();
    let dir = scratch_dir("stream_threads");
    let specs = specs();
    let data = Arc::new(data_of(&specs));
    let path = dir.join("out.safetensors");
    let w = Arc::new(
        StreamWriter::create(&path, &specs, Some(&metadata()), WriteOptions::default()).unwrap(),
    );
    let all = shuffled(pieces(&data, 333), 9);
    let threads = 8;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (w, data, specs, all) = (&w, &data, &specs, &all);
            s.spawn(move || {
                for &(k, at, len) in all.iter().skip(t).step_by(threads) {
                    w.write_at(&specs[k].name, at as u64, &data[k][at..at + len])
                        .unwrap();
                }
            });
        }
    });
    Arc::try_unwrap(w).ok().unwrap().finish().unwrap();
    assert_eq!(fs::read(&path).unwrap(), reference(&specs, &data, 0));
}

#[test]
fn whole_tensors_written_at_once_and_the_same_bytes_twice_by_two_threads() {
    let _turn = measuring();
    let dir = scratch_dir("stream_whole");
    let specs = vec![TensorSpec::new("w", Dtype::F32, &[1024])];
    let data = data_of(&specs);
    let mut w = StreamWriter::create(
        dir.join("a.safetensors"),
        &specs,
        None,
        WriteOptions::default(),
    )
    .unwrap();
    // Two threads racing to write the same bytes: exactly one wins, the other is told.
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2).map(|_| s.spawn(|| w.write("w", &data[0]))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    let err = results.into_iter().find_map(Result::err).unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidOffset, "{err}");
    w.finish().unwrap();
}

#[test]
fn every_wrong_piece_is_a_typed_error_naming_the_file_and_tensor() {
    let _turn = measuring();
    let dir = scratch_dir("stream_errors");
    let path = dir.join("out.safetensors");
    let specs = vec![
        TensorSpec::new("a", Dtype::F32, &[4]),
        TensorSpec::new("b", Dtype::U8, &[3]),
    ];
    let mut w = StreamWriter::create(&path, &specs, None, WriteOptions::default()).unwrap();
    let check = |r: safetensors_core::Result<()>, kind: ErrorKind, words: &[&str]| {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        let text = e.to_string();
        assert!(text.contains("out.safetensors"), "{text}");
        for word in words {
            assert!(text.contains(word), "{word:?} not in {text}");
        }
    };
    check(w.write("c", &[0; 4]), ErrorKind::TensorNotFound, &["`c`"]);
    check(
        w.write_at("c", 0, &[0]),
        ErrorKind::TensorNotFound,
        &["`c`"],
    );
    // Short and long whole tensors.
    check(
        w.write("a", &[0; 15]),
        ErrorKind::TensorInvalidInfo,
        &["`a`", "16 bytes", "15 bytes"],
    );
    check(
        w.write("a", &[0; 17]),
        ErrorKind::TensorInvalidInfo,
        &["`a`", "17 bytes"],
    );
    // A piece past the end, also one whose end would pass 2^64.
    check(
        w.write_at("b", 2, &[0; 2]),
        ErrorKind::TensorInvalidInfo,
        &["[2, 4)", "`b`", "3 bytes"],
    );
    check(
        w.write_at("b", u64::MAX, &[0]),
        ErrorKind::TensorInvalidInfo,
        &["`b`"],
    );
    // A piece written twice, or overlapping one.
    w.write_at("a", 4, &[1; 8]).unwrap();
    check(
        w.write_at("a", 4, &[1; 8]),
        ErrorKind::InvalidOffset,
        &["[4, 12)", "already written"],
    );
    check(
        w.write_at("a", 10, &[1; 4]),
        ErrorKind::InvalidOffset,
        &["[4, 12)"],
    );
    check(
        w.write_at("a", 0, &[1; 5]),
        ErrorKind::InvalidOffset,
        &["[0, 5)"],
    );
    // None of that wrote anything: what is missing is still missing.
    w.write_at("a", 0, &[1; 4]).unwrap();
    w.write("b", &[2; 3]).unwrap();
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer, "{e}");
    assert!(e.to_string().contains("12 of its 16 bytes"), "{e}");
    assert!(e.to_string().contains("[12, 16)"), "{e}");
    assert!(!path.exists());
    assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
}

#[test]
fn declarations_that_do_not_add_up_are_refused_before_any_file_exists() {
    let _turn = measuring();
    let dir = scratch_dir("stream_declarations");
    let path = dir.join("out.safetensors");
    let make = |specs: &[TensorSpec], alignment: usize| {
        StreamWriter::create(
            &path,
            specs,
            None,
            WriteOptions {
                alignment,
                ..WriteOptions::default()
            },
        )
        .err()
        .map(|e| e.kind())
    };
    let t = |name: &str, d: Dtype, shape: &[usize]| TensorSpec::new(name, d, shape);
    assert_eq!(
        make(&[t("w", Dtype::F64, &[usize::MAX, 2])], 0),
        Some(ErrorKind::ValidationOverflow)
    );
    assert_eq!(
        make(&[t("w", Dtype::F4, &[3])], 0),
        Some(ErrorKind::MisalignedSlice)
    );
    assert_eq!(
        make(&[t("w", Dtype::U8, &[1; 1025])], 0),
        Some(ErrorKind::TensorInvalidInfo)
    );
    assert_eq!(
        make(&[t("w", Dtype::U8, &[1]), t("w", Dtype::F32, &[1])], 0),
        Some(ErrorKind::DuplicateKey)
    );
    assert_eq!(
        make(&[t("__metadata__", Dtype::U8, &[1])], 0),
        Some(ErrorKind::InvalidTensorName)
    );
    let long = "n".repeat(1 << 20);
    let many: Vec<TensorSpec> = (0..100)
        .map(|i| t(&format!("{i}{long}"), Dtype::U8, &[0]))
        .collect();
    assert_eq!(make(&many, 0), Some(ErrorKind::HeaderTooLarge));
    for bad in [3, 100, 4097, 1 << 27] {
        assert_eq!(
            make(&[t("w", Dtype::U8, &[1])], bad),
            Some(ErrorKind::InvalidSlice),
            "{bad}"
        );
    }
    assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
}

#[test]
fn a_writer_dropped_unfinished_leaves_the_old_file_and_nothing_else() {
    let _turn = measuring();
    let dir = scratch_dir("stream_dropped");
    let path = dir.join("out.safetensors");
    serialize_to_file(
        [("old", TensorView::new(Dtype::U8, &[1], &[7]))],
        None,
        &path,
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    let before = fs::read(&path).unwrap();
    let specs = vec![TensorSpec::new("new", Dtype::U8, &[8])];
    {
        let w = StreamWriter::create(&path, &specs, None, WriteOptions::default()).unwrap();
        w.write_at("new", 0, &[1; 4]).unwrap();
    }
    assert_eq!(fs::read(&path).unwrap(), before);
    assert_eq!(listing(&dir), ["out.safetensors"]);
    // Finished, the new file has the old one's mode.
    let mut w = StreamWriter::create(&path, &specs, None, WriteOptions::default()).unwrap();
    w.write("new", &[1; 8]).unwrap();
    w.finish().unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(listing(&dir), ["out.safetensors"]);
}

#[test]
fn an_aligned_file_starts_its_data_on_the_boundary_and_is_otherwise_the_reference() {
    let _turn = measuring();
    let dir = scratch_dir("stream_aligned");
    let specs = specs();
    let data = data_of(&specs);
    let plain = reference(&specs, &data, 0);
    let plain_start = Header::parse(&plain).unwrap().data_start();
    for alignment in [1usize, 8, 64, 4096, 1 << 16] {
        let path = dir.join(format!("a{alignment}.safetensors"));
        let mut w = StreamWriter::create(
            &path,
            &specs,
            Some(&metadata()),
            WriteOptions {
                alignment,
                ..WriteOptions::default()
            },
        )
        .unwrap();
        for (k, s) in specs.iter().enumerate() {
            w.write(&s.name, &data[k]).unwrap();
        }
        w.finish().unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes, reference(&specs, &data, alignment));
        let header = Header::parse(&bytes).unwrap();
        let start = header.data_start();
        assert_eq!(start % alignment.max(8), 0, "alignment {alignment}");
        // The same JSON, more spaces, the same data.
        let json_end = plain[..plain_start]
            .iter()
            .rposition(|&b| b == b'}')
            .unwrap()
            + 1;
        assert_eq!(bytes[8..json_end], plain[8..json_end]);
        assert!(bytes[json_end..start].iter().all(|&b| b == b' '));
        assert_eq!(bytes[start..], plain[plain_start..]);
        // Every tensor starts at a multiple of its element size in the file.
        let file = SafeFile::open(&path, Backend::Mmap).unwrap();
        for s in &specs {
            let info = file.info(&s.name).unwrap();
            let element = (s.dtype.bits() / 8).max(1);
            assert_eq!((start + info.data_offsets.0) % element, 0, "{}", s.name);
            assert_eq!(
                file.tensor_bytes(&s.name).unwrap().as_ref(),
                data[specs.iter().position(|x| x.name == s.name).unwrap()]
            );
        }
    }
    // The direct backend reads the whole data buffer of a 4096-aligned file straight into
    // the destination: it starts at offset 0 of it, where a plain file's starts after the
    // header's end within the first block.
    let aligned = SafeFile::open_with(
        dir.join("a4096.safetensors"),
        OpenOptions {
            backend: Backend::Direct,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let len = aligned.header().data_len();
    let mut buf = safetensors_core::AlignedBuf::new(aligned.aligned_len(0, len).unwrap()).unwrap();
    assert_eq!(
        aligned
            .read_data_aligned(0, len, buf.as_mut_slice())
            .unwrap(),
        0
    );
    assert_eq!(buf.as_slice()[..len], plain[plain_start..]);
    assert_ne!(plain_start % DIRECT_ALIGN, 0);
}

#[test]
fn memory_does_not_grow_with_the_file() {
    let _turn = measuring();
    let dir = scratch_dir("stream_memory");
    let piece = vec![5u8; 1 << 20];
    let mut peaks = Vec::new();
    for mib in [4usize, 64] {
        let specs = vec![TensorSpec::new("w", Dtype::U8, &[mib << 20])];
        let path = dir.join(format!("m{mib}.safetensors"));
        let (file_len, peak) = peak_during(|| {
            let mut w = StreamWriter::create(
                &path,
                &specs,
                None,
                WriteOptions {
                    durability: safetensors_core::Durability::Unsynced,
                    ..WriteOptions::default()
                },
            )
            .unwrap();
            // Out of order, so that the writer tracks gaps too.
            for i in shuffled((0..mib).collect(), 3) {
                w.write_at("w", (i << 20) as u64, &piece).unwrap();
            }
            let len = w.file_len();
            w.finish().unwrap();
            len
        });
        peaks.push(peak);
        assert!(file_len > (mib << 20) as u64);
        assert_eq!(fs::metadata(&path).unwrap().len(), file_len);
        fs::remove_file(&path).unwrap();
    }
    // A few kilobytes for the header and the ranges, whatever the size.
    assert!(peaks[1] < 256 << 10, "{peaks:?}");
    assert!(peaks[1] < peaks[0] + (64 << 10), "{peaks:?}");
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_failed_finish_leaves_the_writer_able_to_finish_once_the_cause_is_fixed() {
    let _turn = measuring();
    let dir = scratch_dir("stream_finish_again");
    let path = dir.join("out.safetensors");
    let specs = vec![
        TensorSpec::new("a", Dtype::F32, &[4]),
        TensorSpec::new("b", Dtype::U8, &[3]),
    ];
    let mut w = StreamWriter::create(&path, &specs, None, WriteOptions::default()).unwrap();
    w.write("b", &[2; 3]).unwrap();
    // Bytes missing: said, and the writer is as it was.
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MetadataIncompleteBuffer, "{e}");
    w.write("a", &[1; 16]).unwrap();
    // The rename refused (a directory where the file goes): nothing published, the writer kept.
    fs::create_dir(&path).unwrap();
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("may be called again"), "{e}");
    assert!(path.is_dir());
    fs::remove_dir(&path).unwrap();
    w.finish().unwrap();
    let want = serialize(
        [
            ("a", TensorView::new(Dtype::F32, &[4], &[1; 16])),
            ("b", TensorView::new(Dtype::U8, &[3], &[2; 3])),
        ],
        None,
    )
    .unwrap();
    assert_eq!(fs::read(&path).unwrap(), want);
    assert_eq!(listing(&dir), ["out.safetensors"]);
    // Published, the writer is done: nothing more reaches the file.
    for e in [
        w.write_at("b", 0, &[9]).unwrap_err(),
        w.finish().unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
        assert!(e.to_string().contains("already published"), "{e}");
    }
    assert_eq!(fs::read(&path).unwrap(), want);
}
