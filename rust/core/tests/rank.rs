//! The rank limit (`MAX_RANK`): a header of one tensor with a rank in the tens of millions is
//! refused while parsing, without keeping its shape, and the largest rank allowed reads and
//! writes. Measured with a counting allocator.

mod common;

use common::alloc::{measuring, peak_during};
use common::raw_file;
use safetensors_core::{serialize, test_hooks, Dtype, ErrorKind, Header, TensorView, MAX_RANK};

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
fn a_header_of_rank_fifty_million_is_refused_while_parsing_in_little_memory() {
    let _turn = measuring();
    // 49,999,970 dims of 1 in a header just under the 100 MB limit: a file the reference
    // accepts, refused here on purpose (MAX_RANK), without keeping its shape.
    let rank = 49_999_970;
    let file = high_rank_file(rank, "1", 1, false);
    let header_len = file.len() - 9;
    assert!(header_len <= safetensors_core::MAX_HEADER_SIZE);
    for (path, parse) in [
        ("default", Header::parse as fn(&[u8]) -> _),
        ("general", test_hooks::parse_general_only),
    ] {
        let (err, peak) = peak_during(|| parse(&file).unwrap_err());
        assert_eq!(err.kind(), ErrorKind::TensorInvalidInfo, "{path}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains("`t`") && msg.contains(&format!("more than {MAX_RANK} dimensions")),
            "{msg}"
        );
        println!(
            "{path}: rank {rank} in a {header_len}-byte header refused; peak heap {:.0} MB ({:.2}x)",
            peak as f64 / 1e6,
            peak as f64 / header_len as f64
        );
        // What the parsers reserve for a header of this size (names, entries, the first
        // dimensions), and no shape: 400 MB of it, and 4.9x the header, before the limit.
        assert!(
            peak <= 2 * header_len,
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
    assert_eq!(err.kind(), ErrorKind::TensorInvalidInfo);
    let msg = err.to_string();
    assert!(msg.len() < 400, "{} bytes of message", msg.len());
    let header_len = file.len() - 9;
    assert!(peak <= 2 * header_len, "peak {peak} bytes");
}

#[test]
fn a_tensor_of_the_largest_rank_is_read_and_one_more_is_refused_both_ways() {
    let _turn = measuring();
    let fits = high_rank_file(MAX_RANK, "1", 1, true);
    let header = Header::parse(&fits).unwrap();
    assert_eq!(header.tensor("t").unwrap().shape.len(), MAX_RANK);
    for spaced in [false, true] {
        let over = high_rank_file(MAX_RANK + 1, "1", 1, spaced);
        for parse in [
            Header::parse as fn(&[u8]) -> _,
            test_hooks::parse_general_only,
        ] {
            assert_eq!(
                parse(&over).unwrap_err().kind(),
                ErrorKind::TensorInvalidInfo
            );
        }
    }
    // The writer refuses what readers would refuse.
    let shape = vec![1usize; MAX_RANK + 1];
    let err = serialize([("t", TensorView::new(Dtype::U8, &shape, &[7]))], None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TensorInvalidInfo, "{err}");
    let shape = vec![1usize; MAX_RANK];
    let bytes = serialize([("t", TensorView::new(Dtype::U8, &shape, &[7]))], None).unwrap();
    assert_eq!(
        Header::parse(&bytes)
            .unwrap()
            .tensor("t")
            .unwrap()
            .shape
            .len(),
        MAX_RANK
    );
}
