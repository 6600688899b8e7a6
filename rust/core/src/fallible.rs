//! Fallible allocation: memory whose size comes from a file or from a caller's numbers (a
//! selection's runs, a plan's steps, a world of ranks) is asked for with `try_reserve`, and a
//! refusal becomes an `Io` error naming the size and what it was for, never an abort.
//!
//! Public for the bridge (`rust/cxx`), which builds vectors of the same kinds for C++.
//!
//! (`file.rs` has its own `zeroed` for buffers read from a file; it predates this module and
//! names the file in its errors.)

use std::io;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The error for `bytes` bytes for `what` that could not be had. There is no file to name: the
/// message says what the memory was for instead.
pub fn out_of_memory(what: &str, bytes: u64) -> Error {
    Error::Io {
        path: PathBuf::new(),
        op: "allocate",
        source: io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot allocate {bytes} bytes for {what} (out of memory)"),
        )
        .into(),
    }
}

fn bytes_of<T>(n: usize) -> u64 {
    (n as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

/// An empty vector with room for `n` elements.
pub fn with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    reserve(&mut v, n, what)?;
    Ok(v)
}

/// Room for `n` more elements in `v`.
pub fn reserve<T>(v: &mut Vec<T>, n: usize, what: &str) -> Result<()> {
    v.try_reserve(n)
        .map_err(|_| out_of_memory(what, bytes_of::<T>(v.len().saturating_add(n))))
}

/// Pushes `x` onto `v`, growing it (by doubling, as `push` does) fallibly.
pub fn push<T>(v: &mut Vec<T>, x: T, what: &str) -> Result<()> {
    if v.len() == v.capacity() {
        reserve(v, 1, what)?;
    }
    v.push(x);
    Ok(())
}

/// `n` copies of `x`.
pub fn filled<T: Clone>(n: usize, x: T, what: &str) -> Result<Vec<T>> {
    let mut v = with_capacity(n, what)?;
    v.resize(n, x);
    Ok(v)
}

/// A copy of `items`.
pub fn copied<T: Clone>(items: &[T], what: &str) -> Result<Vec<T>> {
    let mut v = with_capacity(items.len(), what)?;
    v.extend_from_slice(items);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_size_is_an_io_error_naming_it() {
        let e = with_capacity::<u64>(usize::MAX / 2, "the test's runs").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Io);
        let text = e.to_string();
        assert!(text.contains("the test's runs"), "{text}");
        assert!(
            text.starts_with("allocate failed: cannot allocate "),
            "{text}"
        );
        let mut v = vec![1u8];
        assert!(reserve(&mut v, usize::MAX, "more").is_err());
        push(&mut v, 2, "more").unwrap();
        assert_eq!(v, [1, 2]);
        assert_eq!(filled(3, 7u8, "x").unwrap(), [7, 7, 7]);
        assert_eq!(copied(&[1, 2], "x").unwrap(), [1, 2]);
    }
}
