//! Large reads into fresh memory on several threads. A copy out of the page cache into memory
//! nobody has touched yet is largely the kernel faulting in and zeroing the new pages, on the
//! reading thread (measured on an Intel Xeon: gpt2's owned load at 0.6x of one read() into
//! memory already mapped). Split into pieces on 4 MiB boundaries of the destination, which
//! threads take in turn, each page is faulted, zeroed and filled by one thread, and the cores
//! share the work; a thread that another process keeps from running holds up the read by one
//! piece at most. Small reads, and machines with one core, read on the caller's thread.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Reads below this stay on one thread: a thread's start (~20 µs) is small beside a copy of
/// this size into fresh memory (~0.3 ms). Lowered from 8 MiB so that gpt2's 7 MiB attention
/// weights (a sixth of the file) are shared too.
const PARALLEL_MIN: usize = 2 << 20;

/// The pieces of [`read_many`](super::read_many), ending on multiples of this in the address
/// space: small enough that each is read on one thread (below [`PARALLEL_MIN`]), large enough
/// that a thread's turn costs little beside its copy.
pub(crate) const MANY_PIECE: usize = 1 << 20;

/// The pieces: 4 MiB, ending on multiples of 4 MiB in the address space, so that no huge page
/// is shared by two threads; about a millisecond of copying each.
const PIECE: usize = 4 << 20;

/// Threads for one read, at most: memory bandwidth, not cores, bounds a copy.
const MAX_THREADS: usize = 8;

/// [`FileExt::read_exact_at`] of `dst.len()` bytes at `at`, on several threads when `dst` is
/// large and the process may run on more than one core. The first error, in file order, is
/// returned; the bytes of `dst` are then unspecified, as with any failed read.
///
/// Two cores read on two threads. Measured on a 2-core AMD EPYC (`bench_cpp --items load_copy`,
/// gpt2, medians of 9): quiet, 63-65 ms on two threads against 93-100 ms on one (0.82-0.86x
/// against 0.56-0.61x of one `read()` into mapped memory); with a busy loop holding one core,
/// 114-116 ms against 101-121 ms, within noise: pieces are taken in turn, so a thread kept
/// off its core delays the read by one piece at most. (An earlier measurement on a machine
/// loaded by several builds found two threads 1.2-1.3x slower; the quiet case is the one an
/// engine's loader meets.) One core (`taskset -c 0`) reads on one thread.
pub(crate) fn read_exact_at(file: &File, dst: &mut [u8], at: u64) -> io::Result<()> {
    read_on(file, dst, at, threads_for(dst.len()), PIECE)
}

/// Threads for a read of `len` bytes: one below [`PARALLEL_MIN`] or on one core.
pub(crate) fn threads_for(len: usize) -> usize {
    let cores = cores();
    if len < PARALLEL_MIN || cores < 2 {
        1
    } else {
        cores.min(MAX_THREADS).min(len.div_ceil(PIECE))
    }
}

/// Threads for `len` bytes of memory-bound work in pieces of `piece` bytes, from `min` bytes
/// up: the cores this process may run on now, at most [`MAX_THREADS`]. Not cached, unlike
/// [`threads_for`]: it is asked once per piece of work that takes milliseconds, and a program
/// that narrows its CPU affinity (a benchmark measuring one core, an engine pinning a loader
/// thread) is heard at the next call.
pub(crate) fn threads_now(len: usize, min: usize, piece: usize) -> usize {
    if len < min {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(MAX_THREADS).min(len.div_ceil(piece)).max(1)
}

/// The cores this process may run on (cached: the answer reads cgroup files).
fn cores() -> usize {
    static CORES: AtomicUsize = AtomicUsize::new(0);
    match CORES.load(Ordering::Relaxed) {
        0 => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            CORES.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// The read on `threads` threads (the caller's among them), in pieces that end on multiples of
/// `piece` in the address space.
fn read_on(file: &File, dst: &mut [u8], at: u64, threads: usize, piece: usize) -> io::Result<()> {
    if threads <= 1 {
        return file.read_exact_at(dst, at);
    }
    on_pieces(dst, threads, piece, |offset, p| {
        file.read_exact_at(p, at + offset as u64)
    })
}

/// `work(offset in dst, piece)` over `dst` in pieces that end on multiples of `piece` in the
/// address space, on `threads` threads (the caller's among them). The first failure, in buffer
/// order, is returned.
fn on_pieces<F>(dst: &mut [u8], threads: usize, piece: usize, work: F) -> io::Result<()>
where
    F: Fn(usize, &mut [u8]) -> io::Result<()> + Sync,
{
    let mut offset = 0;
    let pieces: Vec<(usize, Mutex<&mut [u8]>)> = split(dst, piece)
        .into_iter()
        .map(|piece| {
            let start = offset;
            offset += piece.len();
            (start, Mutex::new(piece))
        })
        .collect();
    on_tasks(pieces.len(), threads, |i| {
        let (start, piece) = &pieces[i];
        let mut piece = piece.lock().unwrap_or_else(|e| e.into_inner());
        work(*start, &mut piece)
    })
}

/// `work(i)` for every `i` in `0..tasks`, on at most `threads` threads (the caller's among
/// them). Every thread takes the next task not yet taken, so that a slow thread, or one the
/// system refuses to start (a thread limit is no reason to fail a read), leaves its share to the
/// others. Every task runs; the first failure, in task order, is returned.
pub(crate) fn on_tasks<E, F>(tasks: usize, threads: usize, work: F) -> std::result::Result<(), E>
where
    E: Send,
    F: Fn(usize) -> std::result::Result<(), E> + Sync,
{
    if threads <= 1 || tasks <= 1 {
        let mut first = Ok(());
        for i in 0..tasks {
            let r = work(i);
            if first.is_ok() {
                first = r;
            }
        }
        return first;
    }
    let results: Vec<Mutex<std::result::Result<(), E>>> =
        (0..tasks).map(|_| Mutex::new(Ok(()))).collect();
    let next = AtomicUsize::new(0);
    let run = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return;
        }
        let r = work(i);
        *results[i].lock().unwrap_or_else(|e| e.into_inner()) = r;
    };
    std::thread::scope(|scope| {
        let mut helpers = Vec::new();
        for _ in 1..threads.min(tasks) {
            match std::thread::Builder::new()
                .name("safetensors-work".into())
                .spawn_scoped(scope, run)
            {
                Ok(h) => helpers.push(h),
                Err(_) => break,
            }
        }
        run();
        // Joined one by one (`pthread_join`) rather than left to the scope's own wait (an
        // atomic count and a futex): a C++ program built with ThreadSanitizer sees the join, so
        // the bytes the helpers read into its buffer are ordered before its own later reads,
        // where the scope's wait is invisible to it and would be reported as a race. A helper's
        // panic is passed on, as the scope would have (its tasks were not all done).
        for h in helpers {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    // The first failure in task order (a file that shrank fails its last pieces).
    results
        .into_iter()
        .try_for_each(|r| r.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// `dst` in pieces that end on multiples of `piece` in the address space (the first and last
/// may be shorter).
pub(crate) fn split(dst: &mut [u8], piece: usize) -> Vec<&mut [u8]> {
    let base = dst.as_ptr() as usize;
    let mut out = Vec::with_capacity(dst.len() / piece + 2);
    let mut rest = dst;
    let mut done = 0;
    while !rest.is_empty() {
        let boundary = ((base + done) / piece + 1) * piece - base;
        let take = (boundary - done).min(rest.len());
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(take);
        out.push(head);
        rest = tail;
        done += take;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(name: &str, bytes: &[u8]) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "st-core-parallel-{}-{name}.bin",
            std::process::id()
        ));
        std::fs::write(&path, bytes).unwrap();
        let f = File::open(&path).unwrap();
        (path, f)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n as u64)
            .map(|i| ((i * 2_654_435_761) >> 11) as u8)
            .collect()
    }

    #[test]
    fn pieces_cover_the_buffer_in_order_and_end_on_the_boundary() {
        let mut buf = vec![0u8; 10_000];
        for off in [0usize, 1, 63, 4095] {
            for piece in [1usize, 64, 4096] {
                let dst = &mut buf[off..off + 5000];
                let base = dst.as_ptr() as usize;
                let lens: Vec<usize> = split(dst, piece).iter().map(|p| p.len()).collect();
                assert_eq!(
                    lens.iter().sum::<usize>(),
                    5000,
                    "+{off}, pieces of {piece}"
                );
                assert!(lens.iter().all(|&l| l > 0 && l <= piece));
                let mut end = 0;
                for &l in &lens[..lens.len() - 1] {
                    end += l;
                    assert_eq!((base + end) % piece, 0, "+{off}, pieces of {piece}");
                }
            }
        }
        assert!(split(&mut [], 64).is_empty());
    }

    #[test]
    fn threaded_reads_give_the_file_bytes_at_any_size_offset_and_alignment() {
        let bytes = pattern(300_001);
        let (path, f) = file_of("bytes", &bytes);
        let mut buf = vec![0u8; 300_001 + 64];
        for threads in [1usize, 2, 3, 8] {
            for (at, len) in [
                (0usize, 0usize),
                (0, 1),
                (5, 4095),
                (1, 4097),
                (1, 300_000),
                (0, 300_001),
            ] {
                for off in [0usize, 1, 33] {
                    buf.fill(0xEE);
                    let dst = &mut buf[off..off + len];
                    read_on(&f, dst, at as u64, threads, 4096).unwrap();
                    assert!(
                        buf[off..off + len] == bytes[at..at + len],
                        "{threads} threads, {len} bytes at {at}, destination +{off}"
                    );
                    assert!(buf[..off].iter().all(|&b| b == 0xEE));
                    assert!(buf[off + len..].iter().all(|&b| b == 0xEE));
                }
            }
        }
        // The public entry point on a read large enough to be split.
        let big = pattern(PARALLEL_MIN + 3 * PIECE + 12_345);
        std::fs::write(&path, &big).unwrap();
        let f = File::open(&path).unwrap();
        let mut got = vec![0u8; big.len() - 3];
        read_exact_at(&f, &mut got, 3).unwrap();
        assert!(got == big[3..]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn tasks_all_run_on_any_thread_count_and_the_first_failure_in_order_is_returned() {
        for threads in [1usize, 2, 3, 8] {
            let ran: Vec<AtomicUsize> = (0..20).map(|_| AtomicUsize::new(0)).collect();
            let r = on_tasks(ran.len(), threads, |i| {
                ran[i].fetch_add(1, Ordering::Relaxed);
                if i % 7 == 5 {
                    Err(i)
                } else {
                    Ok(())
                }
            });
            assert_eq!(r, Err(5), "{threads} threads");
            assert!(
                ran.iter().all(|n| n.load(Ordering::Relaxed) == 1),
                "{threads} threads"
            );
        }
    }

    #[test]
    fn a_read_past_the_end_fails_as_unexpected_eof_on_every_thread_count() {
        let bytes = pattern(50_000);
        let (path, f) = file_of("short", &bytes);
        for threads in [1usize, 2, 5] {
            let mut dst = vec![0u8; 40_000];
            let err = read_on(&f, &mut dst, 20_000, threads, 4096).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::UnexpectedEof,
                "{threads} threads"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}
