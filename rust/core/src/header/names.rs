//! The name index: tensor name → position in offset order, an open-addressing table over the
//! header's name arena that falls back to SipHash when a header steers probes long.

use std::hash::BuildHasher;

/// Name → position table: open addressing with linear probing.
///
/// Names are hashed with a fast keyed multiply-fold hash. Keys are random per table, but such a
/// hash is not proven collision-resistant, so the table watches itself: if any probe sequence
/// grows long while building (a crafted header, or plain bad luck), it is rebuilt with keyed
/// SipHash (std's `RandomState`), which a hostile header cannot steer. Lookups stay O(1) either
/// way; ordinary headers never pay for SipHash, which cost ~10% of opening a large header.
#[derive(Clone, Default)]
pub(crate) struct NameIndex {
    /// Positions plus one; 0 marks an empty slot.
    slots: Vec<u32>,
    hasher: NameHasher,
}

#[derive(Clone)]
enum NameHasher {
    Fast(u64, u64),
    Sip(std::collections::hash_map::RandomState),
}

impl Default for NameHasher {
    fn default() -> Self {
        NameHasher::fresh_fast()
    }
}

/// Longest probe sequence tolerated with the fast hash before switching to SipHash.
const MAX_FAST_PROBE: usize = 48;

impl NameHasher {
    fn fresh_fast() -> NameHasher {
        // Two random keys from std's per-process randomness.
        let rs = std::collections::hash_map::RandomState::new();
        NameHasher::Fast(rs.hash_one(0x5afe_u64) | 1, rs.hash_one(0x7e45_u64))
    }

    #[inline]
    fn hash(&self, name: &[u8]) -> u64 {
        match self {
            NameHasher::Fast(k0, k1) => fold_hash(*k0, *k1, name),
            NameHasher::Sip(rs) => rs.hash_one(name),
        }
    }
}

/// Multiplies as 128 bits and folds the halves together: a fast, well-mixing step.
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline]
fn fold_hash(k0: u64, k1: u64, bytes: &[u8]) -> u64 {
    const M: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = k0 ^ (bytes.len() as u64).wrapping_mul(M);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or_default());
        h = fold_mul(h ^ w, k1 ^ M);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        h = fold_mul(h ^ tail_word(bytes, rest.len()), k1.rotate_left(29) ^ M);
    }
    fold_mul(h, k0 ^ M)
}

/// The last `n` bytes of `bytes` (`1 <= n < 8`) as a little-endian word, zero-extended: the
/// value a zero-padded copy would give, read with whole-word loads. (Copying the tail into a
/// stack buffer byte by byte and loading it back as one word stalled store forwarding: a
/// third of building the index.)
#[inline]
fn tail_word(bytes: &[u8], n: usize) -> u64 {
    let len = bytes.len();
    if len >= 8 {
        // The word ending at the last byte, its first `8 - n` bytes (already hashed) shifted out.
        let w = u64::from_le_bytes(bytes[len - 8..].try_into().unwrap_or_default());
        return w >> (8 * (8 - n));
    }
    // The whole input is the tail (n == len).
    if len >= 4 {
        // Two overlapping 4-byte loads; the bytes both hold are equal, so OR joins them.
        let lo = u32::from_le_bytes(bytes[..4].try_into().unwrap_or_default());
        let hi = u32::from_le_bytes(bytes[len - 4..].try_into().unwrap_or_default());
        return u64::from(lo) | (u64::from(hi) << (8 * (len - 4)));
    }
    bytes
        .iter()
        .rev()
        .fold(0u64, |w, &b| (w << 8) | u64::from(b))
}

impl NameIndex {
    /// Indexes `count` names; on a repeated name returns it as the error.
    pub(crate) fn build<'a>(
        count: usize,
        name: impl Fn(u32) -> &'a str,
    ) -> std::result::Result<NameIndex, String> {
        match Self::build_with(count, &name, NameHasher::fresh_fast(), Some(MAX_FAST_PROBE))? {
            Some(index) => Ok(index),
            None => {
                let sip = NameHasher::Sip(Default::default());
                Ok(Self::build_with(count, &name, sip, None)?.unwrap_or_default())
            }
        }
    }

    /// `Ok(None)` when a probe sequence exceeds `max_probe`.
    fn build_with<'a>(
        count: usize,
        name: &impl Fn(u32) -> &'a str,
        hasher: NameHasher,
        max_probe: Option<usize>,
    ) -> std::result::Result<Option<NameIndex>, String> {
        let capacity = (count.max(4) * 2).next_power_of_two();
        let mut slots = vec![0u32; capacity];
        let mask = capacity - 1;
        for i in 0..count as u32 {
            let n = name(i);
            let mut slot = hasher.hash(n.as_bytes()) as usize & mask;
            let mut probes = 0;
            loop {
                match slots[slot] {
                    0 => {
                        slots[slot] = i + 1;
                        break;
                    }
                    other if name(other - 1) == n => return Err(n.to_owned()),
                    _ => {
                        probes += 1;
                        if max_probe.is_some_and(|m| probes > m) {
                            return Ok(None);
                        }
                        slot = (slot + 1) & mask;
                    }
                }
            }
        }
        Ok(Some(NameIndex { slots, hasher }))
    }

    pub(crate) fn find<'a>(&self, n: &[u8], name: impl Fn(u32) -> &'a [u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut slot = self.hasher.hash(n) as usize & mask;
        loop {
            match self.slots[slot] {
                0 => return None,
                other if name(other - 1) == n => return Some(other - 1),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Whether the index fell back to SipHash (for tests).
    #[cfg(test)]
    fn uses_siphash(&self) -> bool {
        matches!(self.hasher, NameHasher::Sip(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_finds_every_name_and_reports_repeats() {
        let names: Vec<String> = (0..5000)
            .map(|i| format!("model.layers.{i}.weight"))
            .collect();
        let index = NameIndex::build(names.len(), |i| names[i as usize].as_str()).unwrap();
        assert!(!index.uses_siphash());
        for (i, n) in names.iter().enumerate() {
            assert_eq!(
                index.find(n.as_bytes(), |j| names[j as usize].as_bytes()),
                Some(i as u32)
            );
        }
        assert_eq!(
            index.find(b"absent", |j| names[j as usize].as_bytes()),
            None
        );
        let mut dup = names.clone();
        dup.push(names[17].clone());
        assert_eq!(
            NameIndex::build(dup.len(), |i| dup[i as usize].as_str()).err(),
            Some(names[17].clone())
        );
    }

    #[test]
    fn long_probe_sequences_switch_to_siphash() {
        // Force the fallback by building with a probe limit of zero, as a flood would.
        let names: Vec<String> = (0..64).map(|i| format!("t{i}")).collect();
        let name = |i: u32| names[i as usize].as_str();
        assert!(
            NameIndex::build_with(64, &name, NameHasher::fresh_fast(), Some(0))
                .unwrap()
                .is_none()
        );
        let sip = NameIndex::build_with(64, &name, NameHasher::Sip(Default::default()), None)
            .unwrap()
            .unwrap();
        assert!(sip.uses_siphash());
        assert_eq!(sip.find(b"t63", |i| names[i as usize].as_bytes()), Some(63));
    }

    #[test]
    fn tail_words_equal_the_zero_padded_copy() {
        let bytes: Vec<u8> = (1..=40u8).map(|b| b.wrapping_mul(37)).collect();
        for len in 1..=bytes.len() {
            let n = len % 8;
            if n == 0 {
                continue;
            }
            let input = &bytes[..len];
            let mut padded = [0u8; 8];
            padded[..n].copy_from_slice(&input[len - n..]);
            assert_eq!(
                tail_word(input, n),
                u64::from_le_bytes(padded),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn fold_hash_depends_on_every_byte_and_the_keys() {
        let base = fold_hash(1, 2, b"model.layers.0.mlp.up_proj.weight");
        assert_ne!(base, fold_hash(1, 2, b"model.layers.0.mlp.up_proj.weighu"));
        assert_ne!(base, fold_hash(1, 2, b"model.layers.1.mlp.up_proj.weight"));
        assert_ne!(base, fold_hash(3, 2, b"model.layers.0.mlp.up_proj.weight"));
        assert_ne!(fold_hash(1, 2, b""), fold_hash(1, 2, b"\0"));
    }
}
