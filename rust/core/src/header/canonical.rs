//! A fast path for headers in the canonical layout that writers produce.
//!
//! Nearly every real header is compact JSON where each entry reads
//! `"name":{"dtype":"F32","shape":[..],"data_offsets":[b,e]}`, with plain strings (no escapes)
//! and plain integers. This scanner accepts exactly that subset (plus JSON whitespace between
//! tokens, and a `__metadata__` of plain strings or `null`) and gives up on anything else:
//! escapes, control characters, leading zeros, signs, fractions, exponents, other field orders,
//! unknown fields, the array form, repeated metadata. On giving up, the caller reparses with the
//! general serde visitor, which alone decides errors. So for any input this path accepts, the
//! result is the one the general path gives (a differential test and a fuzz target check it),
//! and it never reports an error of its own.
//!
//! Why bother: on a 20,000-tensor header the general path spends most of its time in serde's
//! generic plumbing; this scanner does the same work in about half the time.

use std::collections::BTreeMap;

use super::builder::{grow_dims, Builder, Entry};
use crate::dtype::Dtype;
use crate::format::{MAX_RANK, METADATA_KEY};

/// Not canonical: fall back to the general parser.
pub(super) struct GiveUp;

type Scan<T> = Result<T, GiveUp>;

/// Parses `text` into `b`, or gives up leaving `b` in an unspecified state.
pub(super) fn parse(text: &str, b: &mut Builder) -> Scan<()> {
    let mut s = Scanner {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        compact: true,
    };
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.pos += 1;
    } else {
        loop {
            let key = s.string()?;
            s.ws();
            s.eat(b':')?;
            s.ws();
            if key == METADATA_KEY {
                if b.metadata_seen {
                    return Err(GiveUp);
                }
                b.metadata_seen = true;
                b.metadata = s.metadata()?;
            } else {
                s.entry(key, b)?;
            }
            s.ws();
            match s.next()? {
                b',' => s.ws(),
                b'}' => break,
                _ => return Err(GiveUp),
            }
        }
    }
    s.ws();
    if s.pos == s.bytes.len() {
        Ok(())
    } else {
        Err(GiveUp)
    }
}

/// Length of the run of bytes before the first `"`, `\\` or control character, or `None` when
/// there is none. Tests eight bytes at a time: names are most of a header's bytes.
fn string_len(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // High bit of each byte of the result is set where the byte of `x` is zero / below `n`
    // (exact for the first such byte, which is all that is needed).
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut at = 0;
    for chunk in bytes.chunks_exact(8) {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let hits = zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')))
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGH);
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|i| at + i)
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    /// Whether entries are still tried as compact (see [`Scanner::compact_entry`]).
    compact: bool,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn next(&mut self) -> Scan<u8> {
        let c = self.peek().ok_or(GiveUp)?;
        self.pos += 1;
        Ok(c)
    }

    fn eat(&mut self, c: u8) -> Scan<()> {
        if self.next()? == c {
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// Inlined so that a literal's comparison, its length known, is a few loads rather than a
    /// call to `memcmp`.
    #[inline(always)]
    fn eat_literal(&mut self, lit: &[u8]) -> Scan<()> {
        if self.bytes[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// JSON whitespace, exactly as serde_json skips it.
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// A string without escapes or control characters. The header is already known to be UTF-8
    /// and `"` is ASCII, so the text between the quotes is a valid `str` slice.
    fn string(&mut self) -> Scan<&'a str> {
        self.eat(b'"')?;
        let start = self.pos;
        let len = string_len(&self.bytes[start..]).ok_or(GiveUp)?;
        if self.bytes[start + len] != b'"' {
            return Err(GiveUp);
        }
        self.pos = start + len + 1;
        self.text.get(start..start + len).ok_or(GiveUp)
    }

    /// A non-negative integer without sign, fraction, exponent or leading zero, that fits.
    fn integer(&mut self) -> Scan<usize> {
        let rest = &self.bytes[self.pos..];
        // One pass: up to 19 digits cannot overflow a u64, so the common case checks nothing
        // but the digits themselves (counting them first, then folding, read each twice).
        let mut value = 0u64;
        let mut digits = 0;
        while let Some(d) = rest.get(digits).map(|c| c.wrapping_sub(b'0')) {
            if d > 9 || digits == 19 {
                break;
            }
            value = value * 10 + u64::from(d);
            digits += 1;
        }
        if digits == 0 || (digits > 1 && rest[0] == b'0') {
            return Err(GiveUp);
        }
        // More digits: checked from here on (a value past u64 is given up on).
        while let Some(d) = rest.get(digits).map(|c| c.wrapping_sub(b'0')) {
            if d > 9 {
                break;
            }
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d)))
                .ok_or(GiveUp)?;
            digits += 1;
        }
        self.pos += digits;
        usize::try_from(value).map_err(|_| GiveUp)
    }

    /// A long shape gets its exact room up front (one comma per dimension after the first),
    /// so that a hostile rank of millions costs one allocation of its final size rather than a
    /// doubling whose last step holds both the old and the new block. Short shapes skip this.
    fn reserve_dims(&self, b: &mut Builder) {
        const LONG: usize = 4096;
        let rest = &self.bytes[self.pos..];
        let Some(window) = rest.get(..LONG) else {
            return;
        };
        if window.contains(&b']') {
            return;
        }
        let end = rest.iter().position(|&c| c == b']').unwrap_or(rest.len());
        let dims = rest[..end].iter().filter(|&&c| c == b',').count() + 1;
        // A shape over the rank limit is refused: room for one dimension more than the limit is
        // all it gets (the general parser keeps that many to say so).
        b.shapes
            .reserve_exact(dims.min(b.max_dims).min(MAX_RANK + 1));
    }

    /// `"key"` then `:` with optional whitespace around the colon.
    fn field(&mut self, quoted: &[u8]) -> Scan<()> {
        self.eat_literal(quoted)?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Ok(())
    }

    /// `,` with optional whitespace around it.
    fn comma(&mut self) -> Scan<()> {
        self.ws();
        self.eat(b',')?;
        self.ws();
        Ok(())
    }

    /// `{"dtype":..,"shape":[..],"data_offsets":[b,e]}`, appended to the builder.
    fn entry(&mut self, name: &str, b: &mut Builder) -> Scan<()> {
        let shape_start = b.shapes.len();
        let compact = if self.compact {
            self.compact_entry(b)
        } else {
            None
        };
        let (dtype, begin, end) = match compact {
            Some(found) => found,
            None => {
                // A header spelled otherwise once (pretty-printed, say) is likely spelled so
                // throughout: its later entries go straight to the token-wise path rather than
                // each being read twice.
                self.compact = false;
                self.spaced_entry(b)?
            }
        };
        let as_u32 = |n: usize| u32::try_from(n).map_err(|_| GiveUp);
        b.entries.push(Entry {
            name_start: as_u32(b.names.len())?,
            name_len: as_u32(name.len())?,
            shape_start: as_u32(shape_start)?,
            shape_len: as_u32(b.shapes.len() - shape_start)?,
            dtype,
            begin,
            end,
        });
        b.names.push_str(name);
        Ok(())
    }

    /// An entry written with no whitespace at all, `{"dtype":"F32","shape":[4,8],
    /// "data_offsets":[0,128]}`: how every writer we know lays it out. Its fixed parts are
    /// compared as whole literals rather than token by token (a fifth of the time of opening a
    /// 20,000-tensor file went to the token-wise path). `None`, with the position and the shape
    /// arena as they were, for any other spelling, which [`Scanner::spaced_entry`] then reads:
    /// this path accepts a subset of what that one does and records the same values.
    fn compact_entry(&mut self, b: &mut Builder) -> Option<(Dtype, usize, usize)> {
        let (pos, shape_start) = (self.pos, b.shapes.len());
        let found = self.compact_fields(b);
        if found.is_none() {
            self.pos = pos;
            b.shapes.truncate(shape_start);
        }
        found
    }

    fn compact_fields(&mut self, b: &mut Builder) -> Option<(Dtype, usize, usize)> {
        self.eat_literal(b"{\"dtype\":\"").ok()?;
        let rest = self.bytes.get(self.pos..)?;
        let len = rest
            .iter()
            .take(Dtype::LONGEST_NAME + 1)
            .position(|&c| c == b'"')?;
        let dtype = Dtype::from_name(self.text.get(self.pos..self.pos + len)?)?;
        self.pos += len + 1;
        self.eat_literal(b",\"shape\":[").ok()?;
        let shape_start = b.shapes.len();
        if self.peek()? == b']' {
            self.pos += 1;
        } else {
            loop {
                // Long shapes (and hostile ones) take the token-wise path, which reserves
                // their room and enforces the rank limit.
                if b.shapes.len() - shape_start == MAX_RANK {
                    return None;
                }
                grow_dims(&mut b.shapes, b.max_dims);
                b.shapes.push(self.integer().ok()?);
                match self.next().ok()? {
                    b',' => {}
                    b']' => break,
                    _ => return None,
                }
            }
        }
        self.eat_literal(b",\"data_offsets\":[").ok()?;
        let begin = self.integer().ok()?;
        self.eat(b',').ok()?;
        let end = self.integer().ok()?;
        self.eat_literal(b"]}").ok()?;
        Some((dtype, begin, end))
    }

    /// [`Scanner::entry`]'s fields token by token, with JSON whitespace allowed between them.
    fn spaced_entry(&mut self, b: &mut Builder) -> Scan<(Dtype, usize, usize)> {
        self.eat(b'{')?;
        self.ws();
        self.field(b"\"dtype\"")?;
        let dtype = Dtype::from_name(self.string()?).ok_or(GiveUp)?;
        self.comma()?;
        self.field(b"\"shape\"")?;
        self.eat(b'[')?;
        self.ws();
        let shape_start = b.shapes.len();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            self.reserve_dims(b);
            loop {
                if b.shapes.len() - shape_start > MAX_RANK {
                    return Err(GiveUp);
                }
                grow_dims(&mut b.shapes, b.max_dims);
                b.shapes.push(self.integer()?);
                self.ws();
                match self.next()? {
                    b',' => self.ws(),
                    b']' => break,
                    _ => return Err(GiveUp),
                }
            }
        }
        self.comma()?;
        self.field(b"\"data_offsets\"")?;
        self.eat(b'[')?;
        self.ws();
        let begin = self.integer()?;
        self.comma()?;
        let end = self.integer()?;
        self.ws();
        self.eat(b']')?;
        self.ws();
        self.eat(b'}')?;
        Ok((dtype, begin, end))
    }

    /// `null` or an object of plain string values without repeated keys.
    fn metadata(&mut self) -> Scan<Option<BTreeMap<String, String>>> {
        if self.peek() == Some(b'n') {
            self.eat_literal(b"null")?;
            return Ok(None);
        }
        self.eat(b'{')?;
        self.ws();
        let mut map = BTreeMap::new();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Some(map));
        }
        loop {
            let k = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let v = self.string()?;
            if map.insert(k.to_owned(), v.to_owned()).is_some() {
                return Err(GiveUp);
            }
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => return Ok(Some(map)),
                _ => return Err(GiveUp),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, string_len, Builder};
    use crate::dtype::Dtype;

    /// An entry as the scanner recorded it: name, dtype, shape, offsets.
    type Recorded = (String, Dtype, Vec<usize>, (usize, usize));

    fn scanned(text: &str) -> Option<Vec<Recorded>> {
        let mut b = Builder::for_len(text.len());
        parse(text, &mut b).ok()?;
        Some(
            b.entries
                .iter()
                .map(|e| {
                    let name = e.name_start as usize..(e.name_start + e.name_len) as usize;
                    let shape = e.shape_start as usize..(e.shape_start + e.shape_len) as usize;
                    (
                        b.names[name].to_owned(),
                        e.dtype,
                        b.shapes[shape].to_vec(),
                        (e.begin, e.end),
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn every_dtype_spelling_takes_the_compact_path() {
        for name in Dtype::NAMES {
            let text = format!(r#"{{"dtype":"{name}","shape":[3],"data_offsets":[0,0]}}"#);
            let mut s = super::Scanner {
                text: &text,
                bytes: text.as_bytes(),
                pos: 0,
                compact: true,
            };
            let mut b = Builder::for_len(text.len());
            let got = s.compact_entry(&mut b);
            assert_eq!(got, Some((Dtype::from_name(name).unwrap(), 0, 0)), "{name}");
            assert_eq!(
                (s.pos, b.shapes.as_slice()),
                (text.len(), &[3][..]),
                "{name}"
            );
        }
    }

    #[test]
    fn compact_and_spaced_entries_record_the_same_values() {
        let compact = r#"{"a":{"dtype":"BF16","shape":[4,8,2],"data_offsets":[0,128]},"b":{"dtype":"F8_E4M3FNUZ","shape":[],"data_offsets":[128,129]}}"#;
        let want = vec![
            ("a".to_owned(), Dtype::BF16, vec![4, 8, 2], (0, 128)),
            ("b".to_owned(), Dtype::F8_E4M3FNUZ, vec![], (128, 129)),
        ];
        assert_eq!(scanned(compact), Some(want.clone()));
        // Whitespace at each place the compact path checks: it gives up on the entry part way
        // (after recording dimensions, in the shape cases), and the token-wise path must then
        // read the entry afresh, with none of the abandoned dimensions left behind.
        for spaced in [
            r#"{"a":{ "dtype":"BF16","shape":[4,8,2],"data_offsets":[0,128]},"#,
            r#"{"a":{"dtype": "BF16","shape":[4,8,2],"data_offsets":[0,128]},"#,
            r#"{"a":{"dtype":"BF16" ,"shape":[4,8,2],"data_offsets":[0,128]},"#,
            r#"{"a":{"dtype":"BF16","shape":[ 4,8,2],"data_offsets":[0,128]},"#,
            r#"{"a":{"dtype":"BF16","shape":[4, 8,2],"data_offsets":[0,128]},"#,
            r#"{"a":{"dtype":"BF16","shape":[4,8,2 ],"data_offsets":[0,128]},"#,
            r#"{"a":{"dtype":"BF16","shape":[4,8,2],"data_offsets":[0 ,128]},"#,
            r#"{"a":{"dtype":"BF16","shape":[4,8,2],"data_offsets":[0,128] },"#,
            r#"{"a":{"dtype":"BF16","shape":[4,8,2],"data_offsets":[0,128]
            },"#,
        ] {
            let text = format!(
                "{spaced}{}",
                r#""b":{"dtype":"F8_E4M3FNUZ","shape":[],"data_offsets":[128,129]}}"#
            );
            assert_eq!(scanned(&text), Some(want.clone()), "{text}");
        }
        // What neither path accepts is left to the general parser.
        for other in [
            r#"{"a":{"dtype":"F32","shape":[4,08],"data_offsets":[0,128]}}"#,
            r#"{"a":{"dtype":"F\u0033\u0032","shape":[4],"data_offsets":[0,16]}}"#,
            r#"{"a":{"dtype":"F32","shape":[4,],"data_offsets":[0,16]}}"#,
            r#"{"a":{"shape":[4],"dtype":"F32","data_offsets":[0,16]}}"#,
        ] {
            assert_eq!(scanned(other), None, "{other}");
        }
    }

    fn naive(b: &[u8]) -> Option<usize> {
        b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20)
    }

    #[test]
    fn word_scan_finds_the_first_stop_byte() {
        let mut buf = vec![b'a'; 40];
        assert_eq!(string_len(&buf), None);
        for stop in [b'"', b'\\', 0x00, 0x1f, 0x0a] {
            for at in 0..buf.len() {
                buf[at] = stop;
                assert_eq!(string_len(&buf), Some(at), "{stop:#x} at {at}");
                // A second stop after the first must not matter.
                if at + 3 < buf.len() {
                    buf[at + 3] = b'"';
                    assert_eq!(string_len(&buf), Some(at));
                    buf[at + 3] = b'a';
                }
                buf[at] = b'a';
            }
        }
        // Bytes that are close to stop bytes, and every byte value, agree with the naive scan.
        let all: Vec<u8> = (0..=255u8).chain(0..=255u8).rev().collect();
        for start in 0..all.len() {
            assert_eq!(
                string_len(&all[start..]),
                naive(&all[start..]),
                "from {start}"
            );
        }
        let high: Vec<u8> = "é中\u{7f}\u{80}ab\u{ff}"
            .bytes()
            .chain([0x21, 0x7e, 0xff, 0x80, 0x20, b'"'])
            .collect();
        assert_eq!(string_len(&high), naive(&high));
    }
}
