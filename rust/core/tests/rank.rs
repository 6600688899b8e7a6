//! A header of one tensor with a rank in the tens of millions: parsing and validating it must be
//! linear in the header's size, in memory as in work. Measured with a counting allocator.

mod common;

use common::alloc::{measuring, peak_during};
use common::raw_file;
use safetensors_core::{test_hooks, ErrorKind, Header};

#[global_allocator]
static ALLOCATOR: common::alloc::Counting = common::alloc::Counting;

/// `{"t":{"dtype":"U8","shape":[d,d,...],"data_offsets":[0,n]}}` with `rank` dims, padded.
fn high_rank_file(rank: usize, dim: &str, end: usize, spaced: bool) -> Vec<u8> {
    let sep = if spaced { ", " } else { "," };
    let mut json = String::with_capacity(rank * (dim.len() + sep.len()) + 64);
    json.push_str(r#"{"t":{"dtype":"U8","shape":["#);
    for i in 0..rank {
        if i > 0 {
            json.push_str(sep);
        }
        json.push_str(dim);
    }
    json.push_str(&format!(r#"],"data_offsets":[0,{end}]}}}}"#));
    raw_file(&json, end)
}

#[test]
fn a_header_of_rank_fifty_million_parses_in_memory_linear_in_its_size() {
    let _turn = measuring();
    // 49,999,970 dims of 1 in a header just under the 100 MB limit.
    let rank = 49_999_970;
    let file = high_rank_file(rank, "1", 1, false);
    let header_len = file.len() - 9;
    assert!(header_len <= safetensors_core::MAX_HEADER_SIZE);
    // The canonical scanner sizes the dimension arena exactly; the general path grows it by
    // doubling, capped at what the header can hold, so its last step holds the old block too
    // (with this allocator; glibc moves blocks that large with mremap, without the copy).
    for (path, parse, bound) in [
        ("default", Header::parse as fn(&[u8]) -> _, 5),
        ("general", test_hooks::parse_general_only, 8),
    ] {
        let (header, peak) = peak_during(|| parse(&file).unwrap());
        assert_eq!(header.tensor("t").unwrap().shape.len(), rank);
        assert_eq!(header.tensor("t").unwrap().numel(), 1);
        println!(
            "{path}: rank {rank} in a {header_len}-byte header: peak heap {:.0} MB ({:.2}x)",
            peak as f64 / 1e6,
            peak as f64 / header_len as f64
        );
        assert!(
            peak <= bound * header_len,
            "{path}: peak {peak} bytes for a {header_len}-byte header"
        );
    }
}

#[test]
fn an_overflowing_rank_fifty_million_shape_is_refused_with_a_short_message() {
    let _turn = measuring();
    let rank = 49_999_970;
    let file = high_rank_file(rank, "2", 1, false);
    let (err, peak) = peak_during(|| Header::parse(&file).unwrap_err());
    assert_eq!(err.kind(), ErrorKind::ValidationOverflow);
    let msg = err.to_string();
    assert!(msg.len() < 400, "{} bytes of message", msg.len());
    assert!(msg.contains(&format!("(rank {rank})")), "{msg}");
    let header_len = file.len() - 9;
    println!(
        "overflow: peak heap {:.0} MB ({:.2}x)",
        peak as f64 / 1e6,
        peak as f64 / header_len as f64
    );
    // The error carries the shape (a copy of the arena's 8 bytes per dimension) on top of the
    // parse itself.
    assert!(peak <= 9 * header_len, "peak {peak} bytes");
}
