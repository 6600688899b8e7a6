//! A small deterministic generator of safetensors files, valid and corrupted (names, dtypes,
//! shapes, JSON with odd strings, numbers and whitespace; files cut, patched and rebuilt), for
//! the differential tests beside it.

use crate::common;

use safetensors_core::Dtype;

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

pub(crate) const NAME_PARTS: &[&str] = &[
    "w", "b", "layer.0", "attn", "é", "a\\\"q", "x\\n", "\\u00e9", "emb",
];
pub(crate) const WS: &[&str] = &["", "", "", " ", "\n", "\t", "\r\n ", "  "];

pub(crate) struct Tensor {
    pub(crate) name: String,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<u64>,
    pub(crate) bytes: u64,
}

pub(crate) fn random_shape(rng: &mut Rng, dtype: Dtype) -> Vec<u64> {
    let rank = rng.below(4) as usize;
    let mut shape: Vec<u64> = (0..rank).map(|_| rng.below(5)).collect();
    // Mostly keep sub-byte tensors whole bytes; sometimes leave them misaligned on purpose.
    let numel: u64 = shape.iter().product();
    if !(numel * dtype.bits() as u64).is_multiple_of(8) && rng.chance(85) {
        shape.push(8 / gcd(dtype.bits() as u64, 8));
        let last = shape.len() - 1;
        if !(shape.iter().product::<u64>() * dtype.bits() as u64).is_multiple_of(8) {
            shape[last] = 8;
        }
    }
    shape
}

pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A random valid-looking file, plus whether the generator itself introduced a duplicate name.
pub(crate) fn random_file(rng: &mut Rng) -> Vec<u8> {
    let count = rng.below(7) as usize;
    let mut tensors = Vec::new();
    for i in 0..count {
        let dtype = *rng.pick(&Dtype::ALL);
        let shape = random_shape(rng, dtype);
        let numel: u64 = shape.iter().product();
        let bytes = numel * dtype.bits() as u64 / 8;
        let name = if rng.chance(3) && i > 0 {
            // Duplicate an earlier name now and then.
            tensors
                .get(rng.below(i as u64) as usize)
                .map(|t: &Tensor| t.name.clone())
                .unwrap()
        } else {
            format!("{}{}", rng.pick(NAME_PARTS), i)
        };
        tensors.push(Tensor {
            name,
            dtype,
            shape,
            bytes,
        });
    }
    // Lay out data in a random order; write JSON keys in another random order.
    let mut layout: Vec<usize> = (0..count).collect();
    shuffle(rng, &mut layout);
    let mut offsets = vec![(0u64, 0u64); count];
    let mut at = 0;
    for &i in &layout {
        offsets[i] = (at, at + tensors[i].bytes);
        at += tensors[i].bytes;
    }
    let mut order: Vec<usize> = (0..count).collect();
    shuffle(rng, &mut order);

    let mut json = String::new();
    let lead: &&str = rng.pick(WS);
    json.push_str(lead);
    json.push('{');
    let mut entries = Vec::new();
    if rng.chance(40) {
        let meta = match rng.below(4) {
            0 => "null".to_string(),
            1 => "{}".to_string(),
            2 => r#"{"format":"pt"}"#.to_string(),
            _ => r#"{"b":"2","a":"1","c":"\u00e9"}"#.to_string(),
        };
        entries.push(format!("\"__metadata__\":{}{meta}", rng.pick(WS)));
    }
    for &i in &order {
        let t = &tensors[i];
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        let extra = if rng.chance(15) {
            format!(",{}:{}", json_string(rng), json_value(rng, 0))
        } else {
            String::new()
        };
        let (b, e) = offsets[i];
        let entry = if rng.chance(5) {
            format!("[\"{}\",[{}],[{b},{e}]]", t.dtype, shape.join(","))
        } else {
            format!(
                "{{\"dtype\":{ws}\"{}\",\"shape\":[{}]{extra},\"data_offsets\":[{b},{ws}{e}]}}",
                t.dtype,
                shape.join(","),
                ws = rng.pick(WS)
            )
        };
        entries.push(format!("\"{}\":{}{entry}", t.name, rng.pick(WS)));
    }
    shuffle(rng, &mut entries);
    json.push_str(&entries.join(","));
    json.push('}');
    let pad = rng.below(9) as usize;
    for _ in 0..pad {
        let ws: &&str = rng.pick(&[" ", " ", "\t", "\n", "\r"]);
        json.push_str(ws);
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend((0..at).map(|i| (i * 7 % 256) as u8));
    out
}

/// Pieces of string content: plain text, every escape, surrogates paired and lone, invalid
/// escapes, and raw control characters (which JSON forbids inside strings).
pub(crate) const STRING_PIECES: &[&str] = &[
    "a",
    "é",
    "中",
    "\\\"",
    "\\\\",
    "\\/",
    "\\b",
    "\\f",
    "\\n",
    "\\r",
    "\\t",
    "\\u0041",
    "\\u00e9",
    "\\u0000",
    "\\ud83d\\ude00",
    "\\ud800",
    "\\udfff",
    "\\ud800\\u0041",
    "\\x41",
    "\\u12",
    "\\u12g4",
    "\\'",
    "\\U0041",
    "\u{0}",
    "\u{1}",
    "\n",
    "\t",
    "\u{1f}",
    "\u{7f}",
];

/// A random JSON string, valid or not.
pub(crate) fn json_string(rng: &mut Rng) -> String {
    let mut s = String::from("\"");
    for _ in 0..rng.below(4) {
        let piece: &&str = rng.pick(STRING_PIECES);
        s.push_str(piece);
    }
    s.push('"');
    s
}

/// A random JSON value for an unknown entry field, sometimes malformed, sometimes nested past
/// serde_json's 128-level limit.
pub(crate) fn json_value(rng: &mut Rng, depth: usize) -> String {
    match rng.below(if depth > 3 { 5 } else { 9 }) {
        0 => (*rng.pick(&["true", "false", "null", "nul", "tru"])).to_string(),
        1 | 2 => (*rng.pick(common::json::NUMBERS)).to_string(),
        3 => match rng.below(3) {
            0 => "9".repeat(300 + rng.below(200) as usize),
            1 => format!("0.{}1", "0".repeat(300 + rng.below(200) as usize)),
            _ => format!(
                "-{}e-{}",
                "1".repeat(rng.below(30) as usize + 1),
                rng.below(500)
            ),
        },
        4 => json_string(rng),
        5 | 6 => {
            let items: Vec<String> = (0..rng.below(4))
                .map(|_| json_value(rng, depth + 1))
                .collect();
            format!("[{}]", items.join(","))
        }
        7 => {
            let items: Vec<String> = (0..rng.below(4))
                .map(|_| format!("{}:{}", json_string(rng), json_value(rng, depth + 1)))
                .collect();
            format!("{{{}}}", items.join(","))
        }
        _ => {
            // Deep nesting around the limit: the root and the entry already take two levels.
            let levels = rng.pick(&[100, 124, 125, 126, 127, 200]).to_owned();
            let (open, close) = if rng.chance(50) {
                ("[", "]")
            } else {
                ("{\"k\":", "}")
            };
            format!("{}0{}", open.repeat(levels), close.repeat(levels))
        }
    }
}

pub(crate) fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

/// Applies one random corruption.
pub(crate) fn corrupt(rng: &mut Rng, mut f: Vec<u8>) -> Vec<u8> {
    let n = u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
    let header = 8..8 + n;
    match rng.below(12) {
        0 if n > 0 => {
            let i = header.start + rng.below(n as u64) as usize;
            f[i] = rng.next() as u8;
        }
        1 => f.truncate(rng.below(f.len() as u64) as usize),
        2 => f.extend((0..1 + rng.below(9)).map(|_| rng.next() as u8)),
        3 => {
            let delta = rng.below(17) as i64 - 8;
            let new = (n as i64 + delta).max(0) as u64;
            f[..8].copy_from_slice(&new.to_le_bytes());
        }
        4 => {
            let huge = *rng.pick(&[u64::MAX, u64::MAX - 7, 100_000_001, 1 << 40]);
            f[..8].copy_from_slice(&huge.to_le_bytes());
        }
        5 => f = replace_number(rng, &f, n),
        6 => {
            let to = *rng.pick(&["\"f32\"", "\"F31\"", "3", "{\"F32\":null}", "null"]);
            f = replace_text(rng, &f, n, "\"F32\"", to);
        }
        7 => {
            let to = *rng.pick(&[
                ",18446744073709551615],\"data_offsets\"",
                ",4294967296,4294967296],\"data_offsets\"",
                ",-1],\"data_offsets\"",
            ]);
            f = replace_text(rng, &f, n, "],\"data_offsets\"", to);
        }
        8 => {
            // Duplicate the first tensor entry under its own name.
            let text = String::from_utf8_lossy(&f[header.clone()]).to_string();
            if let (Some(start), Some(end)) = (text.find("\":{\"dtype\""), text.find("]}")) {
                if let Some(q) = text[..start].rfind('"') {
                    if q < start && end > start {
                        let entry = text[q..end + 2].to_string();
                        let new = text.replacen('{', &format!("{{{entry},"), 1);
                        f = rebuild(&f, n, new.as_bytes());
                    }
                }
            }
        }
        9 => {
            let to = *rng.pick(&["[99999999999,", "[0,", "[2.0,"]);
            f = replace_text(rng, &f, n, "[", to);
        }
        10 if n > 0 => {
            let at = header.start + rng.below(n as u64) as usize;
            let junk = *rng.pick(&[&b"\0"[..], b",", b"}", b"\xff", b"\"", b"[[[[", b" "]);
            let mut h = f[header.clone()].to_vec();
            h.splice(at - 8..at - 8, junk.iter().copied());
            f = rebuild(&f, n, &h);
        }
        _ => {
            // Unbalanced nesting, deep enough to hit the JSON recursion limit.
            let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
            let mut out = (deep.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(deep.as_bytes());
            f = out;
        }
    }
    f
}

/// The same file with a new header (length prefix updated, data kept).
pub(crate) fn rebuild(f: &[u8], n: usize, header: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(f.get(8 + n..).unwrap_or(&[]));
    out
}

pub(crate) fn replace_text(rng: &mut Rng, f: &[u8], n: usize, from: &str, to: &str) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(&f[8..8 + n]) else {
        return f.to_vec();
    };
    let hits: Vec<usize> = text.match_indices(from).map(|(i, _)| i).collect();
    if hits.is_empty() {
        return f.to_vec();
    }
    let at = *rng.pick(&hits);
    let new = format!("{}{}{}", &text[..at], to, &text[at + from.len()..]);
    rebuild(f, n, new.as_bytes())
}

pub(crate) fn replace_number(rng: &mut Rng, f: &[u8], n: usize) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(&f[8..8 + n]) else {
        return f.to_vec();
    };
    let digits: Vec<usize> = text
        .char_indices()
        .filter(|(i, c)| c.is_ascii_digit() && !text[..*i].ends_with(|p: char| p.is_ascii_digit()))
        .map(|(i, _)| i)
        .collect();
    if digits.is_empty() {
        return f.to_vec();
    }
    let at = *rng.pick(&digits);
    let end = at
        + text[at..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len() - at);
    let value: u64 = text[at..end].parse().unwrap_or(0);
    let new_value = match rng.below(5) {
        0 => value + 1,
        1 => value.saturating_sub(1),
        2 => u64::MAX - value % 16,
        3 => 0,
        _ => value * 2,
    };
    rebuild(
        f,
        n,
        format!("{}{}{}", &text[..at], new_value, &text[end..]).as_bytes(),
    )
}
