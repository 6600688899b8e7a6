//! Outputs larger than a quarter of the last-level cache: converted a few thousand elements at a
//! time into a small buffer that stays in the first-level cache, then written out with streaming
//! (non-temporal) stores. A plain store first reads the destination's cache line from memory
//! (to merge into it) and later writes it back, so a conversion into memory the cache cannot
//! hold moves the output across the bus twice; streaming stores write whole lines without that
//! read, which is what lets a conversion run at memcpy's speed or faster (memcpy itself streams
//! large copies). The element loops are the usual ones, so the bits are the same as on the plain
//! path; only the way they reach memory differs. x86-64 only, AVX-512 (where the compiler has
//! it, `build.rs`) or AVX2 chosen at run time; every other CPU, and every smaller output,
//! stores as it converts.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::Dtype;

/// How converted bytes reach the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    /// Stored by the element loops themselves.
    Plain,
    /// Staged, then streamed 32 bytes per store.
    #[cfg(target_arch = "x86_64")]
    Avx2Stream,
    /// Staged, then streamed a whole 64-byte line per store.
    #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
    Avx512Stream,
}

impl Store {
    /// The way to store an output of `len` bytes on this CPU: streaming from a quarter of the
    /// last-level cache on ([`STREAM_FROM`]).
    #[inline]
    pub(crate) fn detect(len: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if len > last_level_cache() / STREAM_FROM {
            #[cfg(avx512_intrinsics)]
            if is_x86_feature_detected!("avx512f") {
                return Store::Avx512Stream;
            }
            if is_x86_feature_detected!("avx2") {
                return Store::Avx2Stream;
            }
        }
        let _ = len;
        Store::Plain
    }

    /// Every way this CPU can store (for tests that compare them).
    #[cfg(test)]
    pub(crate) fn all_here() -> Vec<Self> {
        #[allow(unused_mut)]
        let mut v = vec![Store::Plain];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                v.push(Store::Avx2Stream);
            }
            #[cfg(avx512_intrinsics)]
            if is_x86_feature_detected!("avx512f") {
                v.push(Store::Avx512Stream);
            }
        }
        v
    }
}

/// Outputs larger than the last-level cache divided by this stream. A last-level cache is shared
/// by every core of its socket (or core complex), and on a virtual machine by other tenants, so
/// an output that fits in it has no claim to stay there: on a virtual 16-core Intel Xeon
/// (model 207, one socket's 300 MiB L3 shared by all its cores) a 256 MiB U8 -> F32 conversion
/// stored plainly took 37-40 ms, streamed 16-18 ms (memcpy 25-29 ms), and BF16 37-42 against
/// 22-26 ms. A quarter is glibc's own threshold for non-temporal stores in `memcpy` since 2.38
/// ("roughly sizeof_L3 / 4", libc-alpha, May 2023), which is why its copies of such outputs
/// already streamed there.
#[cfg(target_arch = "x86_64")]
const STREAM_FROM: usize = 4;

/// Bytes of the last-level cache one core uses: the kernel's own description of cpu0's caches
/// (`/sys/devices/system/cpu/cpu0/cache/index*/`: the highest-level data or unified cache, one
/// instance), else what glibc answers from CPUID, else 32 MiB (a common size today). The
/// kernel's figure comes first: on an AMD EPYC virtual
/// machine glibc answered 320 MiB (every core complex's L3 together) where one core complex has
/// 32 MiB, so a 256 MiB conversion was stored plainly at 0.55x the speed of streaming stores.
#[cfg(target_arch = "x86_64")]
fn last_level_cache() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static BYTES: AtomicUsize = AtomicUsize::new(0);
    let cached = BYTES.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: sysconf has no preconditions.
    let asked = unsafe { libc::sysconf(libc::_SC_LEVEL3_CACHE_SIZE) };
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let asked = 0;
    let bytes = sysfs_last_level_cache(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache"))
        .or_else(|| usize::try_from(asked).ok().filter(|&b| b > 0))
        .unwrap_or(32 << 20);
    BYTES.store(bytes, Ordering::Relaxed);
    bytes
}

/// The size of the highest-level data or unified cache described under `dir` (a CPU's
/// `cache` directory in sysfs: `index0`, `index1`, ... each with `level`, `type` and `size`
/// such as `32768K`); `None` when there is none or it cannot be read.
#[cfg(target_arch = "x86_64")]
fn sysfs_last_level_cache(dir: &std::path::Path) -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let mut best: Option<(u32, usize)> = None;
    for i in 0..16 {
        let index = dir.join(format!("index{i}"));
        let (Some(level), Some(kind), Some(size)) = (
            read(index.join("level")),
            read(index.join("type")),
            read(index.join("size")),
        ) else {
            continue;
        };
        let Ok(level) = level.trim().parse::<u32>() else {
            continue;
        };
        if !matches!(kind.trim(), "Data" | "Unified") {
            continue;
        }
        let size = size.trim();
        let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            Some((at, _)) => size.split_at(at),
            None => (size, ""),
        };
        let shift = match unit {
            "" => 0,
            "K" => 10,
            "M" => 20,
            "G" => 30,
            _ => continue,
        };
        let Some(bytes) = digits
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_mul(1 << shift))
            .filter(|&b| b > 0)
        else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, bytes)| bytes)
}

/// Elements per staged step: a multiple of 8, so every step of a sub-byte source or target is
/// whole bytes. Small enough that a step's source and staged output (8 KiB at most, for F64)
/// share the first-level cache with room to spare: with 4096 (16 KiB of F32 staged beside
/// 16 KiB of I32 source) the staged path measured slower than plain stores, with 1024 faster
/// for U8, BF16 and I32 sources (a shared AMD EPYC).
const STEP: usize = 1024;

/// Converts `src` (`from`) into `dst` (`to`) with `convert` (the element loops, which fill
/// their destination completely), one step at a time through a staging buffer, storing with
/// `store` (not [`Store::Plain`]).
pub(crate) fn convert_streamed(
    store: Store,
    from: Dtype,
    src: &[u8],
    to: Dtype,
    dst: &mut [u8],
    convert: impl Fn(&[u8], &mut [u8]),
) {
    let mut stage = vec![0u8; STEP * to.bits() / 8];
    let src_step = STEP * from.bits() / 8;
    for (s, d) in src.chunks(src_step).zip(dst.chunks_mut(stage.len())) {
        let t = &mut stage[..d.len()];
        convert(s, t);
        stream_copy(store, t, d);
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64. Streaming stores are weakly ordered: the fence makes them
    // visible before anything this thread stores next (a flag another thread reads, say).
    unsafe {
        _mm_sfence()
    };
}

/// Copies `src` into `dst` (the same length): plain stores up to the first 64-byte boundary of
/// `dst` and after the last, streaming stores for the whole lines between.
fn stream_copy(store: Store, src: &[u8], dst: &mut [u8]) {
    debug_assert_eq!(src.len(), dst.len());
    let head = dst.as_ptr().align_offset(64).min(dst.len());
    let lines = (dst.len() - head) / 64;
    let body = head + lines * 64;
    dst[..head].copy_from_slice(&src[..head]);
    let (s, d) = (&src[head..body], &mut dst[head..body]);
    match store {
        Store::Plain => d.copy_from_slice(s),
        // SAFETY: the CPU has the features (`Store::detect`, `Store::all_here`); `d` starts on
        // a 64-byte boundary and both hold `lines` whole lines.
        #[cfg(target_arch = "x86_64")]
        Store::Avx2Stream => unsafe { stream_lines_avx2(s, d) },
        #[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
        Store::Avx512Stream => unsafe { stream_lines_avx512(s, d) },
    }
    dst[body..].copy_from_slice(&src[body..]);
}

/// # Safety
/// AVX2; `dst` 64-byte aligned, both a whole number of 64-byte lines of the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_lines_avx2(src: &[u8], dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(64).zip(dst.chunks_exact_mut(64)) {
        // SAFETY: 64 bytes each; unaligned loads, aligned streaming stores (`d` is on a line).
        unsafe {
            let a = _mm256_loadu_si256(s.as_ptr().cast());
            let b = _mm256_loadu_si256(s.as_ptr().add(32).cast());
            _mm256_stream_si256(d.as_mut_ptr().cast(), a);
            _mm256_stream_si256(d.as_mut_ptr().add(32).cast(), b);
        }
    }
}

/// # Safety
/// AVX-512F; `dst` 64-byte aligned, both a whole number of 64-byte lines of the same length.
#[cfg(all(target_arch = "x86_64", avx512_intrinsics))]
#[allow(clippy::incompatible_msrv)] // compiled only by a Rust that has them (build.rs)
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines_avx512(src: &[u8], dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(64).zip(dst.chunks_exact_mut(64)) {
        // SAFETY: 64 bytes each; unaligned load, aligned streaming store (`d` is on a line).
        unsafe {
            let a = _mm512_loadu_si512(s.as_ptr().cast());
            _mm512_stream_si512(d.as_mut_ptr().cast(), a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{convert_in_pieces, convert_on, is_float, Kernels};

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_last_level_cache_is_the_highest_data_or_unified_one_in_sysfs() {
        let dir = std::env::temp_dir().join(format!("st-core-llc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let index = |i: u32, level: &str, kind: &str, size: &str| {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        };
        assert_eq!(sysfs_last_level_cache(&dir), None, "no directory");
        index(0, "1", "Data", "32K");
        index(1, "1", "Instruction", "32K");
        assert_eq!(sysfs_last_level_cache(&dir), Some(32 << 10));
        index(2, "2", "Unified", "1024K");
        index(3, "3", "Unified", "32768K");
        assert_eq!(sysfs_last_level_cache(&dir), Some(32 << 20));
        // An instruction cache never counts; unreadable sizes are skipped.
        index(4, "4", "Instruction", "1G");
        index(5, "4", "Unified", "lots");
        assert_eq!(sysfs_last_level_cache(&dir), Some(32 << 20));
        index(6, "4", "Unified", "1M");
        assert_eq!(sysfs_last_level_cache(&dir), Some(1 << 20));
        std::fs::remove_dir_all(&dir).unwrap();
        // This machine's answer is some positive size.
        assert!(last_level_cache() > 0);
    }

    /// Bit patterns that take every special branch of a decoder or encoder, by element width:
    /// infinities, signalling and quiet NaNs with payloads, the smallest and largest
    /// subnormals, the largest finite values, and values that overflow or underflow narrower
    /// targets.
    fn specials(width: usize) -> Vec<u64> {
        match width {
            2 => vec![
                0x7C00, 0xFC00, 0x7C01, 0xFE00, 0x7D55, 0x0001, 0x83FF, 0x7BFF, // as F16
                0x7F80, 0xFF81, 0x7FC1, 0x0001, 0x807F, 0x7F7F, // as BF16
            ],
            4 => vec![
                0x7F80_0000,
                0xFF80_0000,
                0x7F80_0001,
                0xFFC0_1234,
                0x7FBF_FFFF,
                0x0000_0001,
                0x807F_FFFF,
                0x0080_0000,
                0x7F7F_FFFF,
                0x477F_F000, // 65520: F16's overflow boundary
                0x4380_0000, // 256: past every 8-bit format's largest
                0x3380_0000, // 2^-24: F16's smallest subnormal, halfway cases below it
            ],
            8 => vec![
                0x7FF0_0000_0000_0000,
                0xFFF0_0000_0000_0000,
                0x7FF0_0000_0000_0001,
                0x7FF8_0000_DEAD_BEEF,
                0xFFF7_FFFF_FFFF_FFFF,
                0x0000_0000_0000_0001,
                0x3690_0000_0000_0000, // an F32 subnormal
                0x47EF_FFFF_F000_0000, // rounds to F32 infinity
                0x7FEF_FFFF_FFFF_FFFF,
            ],
            _ => vec![],
        }
    }

    /// `len` bytes of a hash read as `from`, with the special patterns every 61 elements (8-bit
    /// and sub-byte sources already meet every code through the hash).
    fn source(from: Dtype, len: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0u64..len as u64)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect();
        let width = from.bits() / 8;
        let sp = specials(width);
        if !sp.is_empty() {
            for (k, chunk) in v.chunks_exact_mut(width).step_by(61).enumerate() {
                chunk.copy_from_slice(&sp[k % sp.len()].to_le_bytes()[..width]);
            }
        }
        v
    }

    /// One conversion to check: `src` (`n` elements of `from`, `so` bytes into its buffer) and
    /// what the portable loop wrote for it, `dl` bytes of `to` at `dof` in a buffer of 0xA5.
    struct Case<'a> {
        from: Dtype,
        to: Dtype,
        n: usize,
        so: usize,
        dof: usize,
        dl: usize,
        src: &'a [u8],
        want: &'a [u8],
    }

    impl Case<'_> {
        /// `convert` into a fresh buffer like `want`'s, then the first byte where they differ
        /// (the bytes around the destination included).
        fn first_difference(&self, convert: impl FnOnce(&mut [u8])) -> Option<usize> {
            let mut got = vec![0xA5u8; self.want.len()];
            convert(&mut got[self.dof..self.dof + self.dl]);
            (0..got.len()).find(|&i| got[i] != self.want[i])
        }
    }

    /// Every pair of a source and a float target, each count the pair can hold, each offset:
    /// `check` for each; returns how many comparisons `check` counted.
    fn each_case(
        counts: &[usize],
        offsets: &[(usize, usize)],
        mut check: impl FnMut(&Case) -> usize,
    ) -> usize {
        let mut compared = 0;
        for from in Dtype::ALL {
            for to in Dtype::ALL {
                if from == Dtype::C64 || !is_float(to) {
                    continue;
                }
                for &n in counts {
                    let (Some(sl), Some(dl)) = (from.byte_size(n), to.byte_size(n)) else {
                        continue;
                    };
                    for &(so, dof) in offsets {
                        let src = source(from, so + sl);
                        let mut want = vec![0xA5u8; dof + dl + 64];
                        let (src, d) = (&src[so..], &mut want[dof..dof + dl]);
                        convert_on(Kernels::Portable, Store::Plain, from, src, to, d);
                        compared += check(&Case {
                            from,
                            to,
                            n,
                            so,
                            dof,
                            dl,
                            src,
                            want: &want,
                        });
                    }
                }
            }
        }
        compared
    }

    #[test]
    fn every_path_gives_the_portable_bits_for_every_pair_any_length_and_alignment() {
        let kernels = Kernels::all_here();
        let stores = Store::all_here();
        eprintln!("paths: {kernels:?} × {stores:?}");
        // Empty, shorter than a line, a few steps with a tail, for each offset of the
        // destination from a line (and of the source from its element size).
        let counts = [0usize, 1, 4, 13, 2 * STEP + 40, 2 * STEP + 37];
        let offsets = [(0usize, 0usize), (1, 3), (3, 17), (5, 60)];
        let compared = each_case(&counts, &offsets, |c| {
            for &k in &kernels {
                for &s in &stores {
                    let bad = c.first_difference(|d| convert_on(k, s, c.from, c.src, c.to, d));
                    assert_eq!(
                        bad, None,
                        "{} -> {}, {} elements, source +{}, destination +{}, {k:?}/{s:?}: first \
                         differing byte",
                        c.from, c.to, c.n, c.so, c.dof
                    );
                }
            }
            kernels.len() * stores.len()
        });
        assert!(compared > 0);
    }

    #[test]
    fn several_threads_give_the_portable_bits_for_every_pair_any_length_and_alignment() {
        // Small pieces, so that every pair meets many of them, a last short one, and a count
        // that is not a whole number of pieces.
        let counts = [0usize, 8, 3 * 64 + 16, 7 * 64];
        let offsets = [(0usize, 0usize), (3, 17)];
        let store = Store::all_here().pop().unwrap();
        let compared = each_case(&counts, &offsets, |c| {
            for threads in [2, 3] {
                let bad = c.first_difference(|d| {
                    convert_in_pieces(
                        Kernels::detect(),
                        store,
                        threads,
                        64,
                        c.from,
                        c.src,
                        c.to,
                        d,
                    )
                });
                assert_eq!(
                    bad, None,
                    "{} -> {}, {} elements, +{}/+{}, {threads} threads",
                    c.from, c.to, c.n, c.so, c.dof
                );
            }
            2
        });
        assert!(compared > 0);
    }

    #[test]
    fn a_large_conversion_takes_the_threaded_path_and_gives_the_portable_bits() {
        // Past the size from which conversions use several threads, with a piece's tail.
        let n = super::super::PARALLEL_FROM / 4 + 40;
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        // The choice `convert_unchecked` makes: several threads from that size on, one below.
        let threads = super::super::conversion_threads(Dtype::F32, 4 * n);
        assert_eq!(threads > 1, cores > 1, "{cores} cores, {threads} threads");
        let below = super::super::conversion_threads(Dtype::F32, super::super::PARALLEL_FROM - 4);
        assert_eq!(below, 1);
        for (from, to) in [
            (Dtype::U8, Dtype::F32),
            (Dtype::BF16, Dtype::F32),
            (Dtype::F32, Dtype::F32),
        ] {
            let src = source(from, from.byte_size(n).unwrap());
            let mut want = vec![0u8; to.byte_size(n).unwrap()];
            convert_on(Kernels::Portable, Store::Plain, from, &src, to, &mut want);
            let mut got = vec![0xA5u8; want.len()];
            super::super::convert_unchecked(from, &src, to, &mut got);
            assert!(
                got == want,
                "{from} -> {to}: the threaded conversion differs from the portable loop"
            );
        }
    }

    #[test]
    fn stream_copy_writes_exactly_its_destination_at_every_offset() {
        let src: Vec<u8> = (0..700u32).map(|i| (i * 7 + 1) as u8).collect();
        for s in Store::all_here() {
            for off in 0..64 {
                for len in [0, 1, 63, 64, 65, 129, 600] {
                    let mut dst = vec![0u8; 64 + 700];
                    stream_copy(s, &src[..len], &mut dst[off..off + len]);
                    assert_eq!(&dst[off..off + len], &src[..len], "{s:?} +{off} {len}");
                    assert!(dst[..off].iter().all(|&b| b == 0), "{s:?} wrote before");
                    assert!(
                        dst[off + len..].iter().all(|&b| b == 0),
                        "{s:?} wrote after"
                    );
                }
            }
        }
    }
}
