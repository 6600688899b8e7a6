//! Resource limits, measured with a counting allocator: a header over the limit is refused
//! before it is read into memory, and a 100 MB header of tiny entries opens in memory
//! proportional to it. (Time is a benchmark's business: `cargo bench --bench parse`.)

mod common;

use std::io::Write;

use common::alloc::{measuring, peak_during};
use common::scratch_dir;
use safetensors_core::{Backend, ErrorKind, SafeFile};

#[global_allocator]
static ALLOCATOR: common::alloc::Counting = common::alloc::Counting;

#[test]
fn headers_over_the_limit_are_refused_before_they_are_read() {
    let _turn = measuring();
    let dir = scratch_dir("limits_over");
    // A sparse 300 MB file whose prefix claims a 150 MB header.
    let path = dir.join("huge.safetensors");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&150_000_000u64.to_le_bytes()).unwrap();
    f.write_all(b"{\"a\":").unwrap();
    f.set_len(300_000_000).unwrap();
    for backend in [Backend::Mmap, Backend::Read] {
        let (result, peak) = peak_during(|| SafeFile::open(&path, backend).err().map(|e| e.kind()));
        assert_eq!(result, Some(ErrorKind::HeaderTooLarge));
        assert!(
            peak < 1 << 20,
            "{backend:?}: {peak} bytes allocated to refuse it"
        );
    }
}

#[test]
fn a_100_mb_header_of_tiny_entries_opens_in_proportional_memory() {
    let _turn = measuring();
    let dir = scratch_dir("limits_100mb");
    let path = dir.join("tiny-entries.safetensors");
    let (bytes, count) = common::inputs::tiny_entries_at_the_limit();
    let header_bytes = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    for backend in [Backend::Mmap, Backend::Read] {
        let (file, peak) = peak_during(|| SafeFile::open(&path, backend).unwrap());
        assert_eq!(file.header().len(), count);
        assert_eq!(file.tensor_bytes("t123456").unwrap().as_ref(), &[7]);
        // Bounded by a small multiple of the header itself (which the read backend also holds
        // while parsing).
        assert!(
            peak < 3 * header_bytes,
            "{backend:?}: peak {peak} bytes for a {header_bytes}-byte header"
        );
        println!(
            "{backend:?}: {count} tensors in a {header_bytes}-byte header; peak heap {:.0} MB ({:.2}x the header)",
            peak as f64 / 1e6,
            peak as f64 / header_bytes as f64
        );
    }
}
