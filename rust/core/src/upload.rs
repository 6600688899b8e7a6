//! Staged uploads: tensors (or slices), from one or more files, into one destination buffer,
//! through a small ring of staging buffers filled by several reader threads.
//!
//! The destination is abstract ([`Device`]): the CUDA path (`rust/cuda`) implements it with
//! pinned host memory, a non-blocking stream and events; the tests implement it over host
//! memory and check that every byte lands where the plan says. Host memory stays bounded by the
//! ring (`slots × slot_bytes`) whatever the size of the model.
//!
//! How it runs: the destination range `[0, plan.total())` is cut into chunks of one slot each.
//! Reader threads claim chunks in order; chunk `k` uses slot `k % slots`, waits until chunk
//! `k - slots` has been submitted from that slot and its copy has completed, fills the slot from
//! the files (`pread`, or a copy from the mapping), and submits one asynchronous copy of the
//! whole chunk. Bytes of the destination that no tensor covers (alignment padding) are zeroed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::slice::{Indexer, SlicePlan};

/// Where one uploaded tensor (or slice) lives in the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of what was uploaded (the slice's shape for a slice).
    pub shape: Vec<usize>,
    /// Byte offset in the destination (a multiple of the plan's alignment).
    pub offset: u64,
    /// Byte length.
    pub len: u64,
}

/// One contiguous run of source bytes and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    source: usize,
    /// Offset in the source file's data buffer.
    src: u64,
    /// Offset in the destination.
    dst: u64,
    len: u64,
}

/// What to upload and where each tensor goes: one destination range, tensors back to back,
/// each starting on an `alignment` boundary.
#[derive(Debug, Clone)]
pub struct UploadPlan {
    alignment: u64,
    placements: Vec<Placement>,
    pieces: Vec<Piece>,
    total: u64,
}

impl UploadPlan {
    /// An empty plan; every tensor will start on a multiple of `alignment` (at least 1; CUDA
    /// allocations are 256-byte aligned, so 256 keeps every tensor as aligned as its base).
    pub fn new(alignment: usize) -> UploadPlan {
        UploadPlan {
            alignment: alignment.max(1) as u64,
            placements: Vec::new(),
            pieces: Vec::new(),
            total: 0,
        }
    }

    /// Adds a whole tensor of `file` (the plan's source number `source`).
    pub fn add_tensor(&mut self, source: usize, file: &SafeFile, name: &str) -> Result<&Placement> {
        let info = file.info(name)?;
        let (begin, end) = info.data_offsets;
        let offset = self.reserve(name, info.dtype, info.shape.to_vec(), (end - begin) as u64)?;
        if end > begin {
            self.pieces.push(Piece {
                source,
                src: begin as u64,
                dst: offset,
                len: (end - begin) as u64,
            });
        }
        Ok(self.placements.last().expect("just pushed"))
    }

    /// Adds a slice of a tensor: only the selected bytes are read, packed contiguously.
    pub fn add_slice(
        &mut self,
        source: usize,
        file: &SafeFile,
        name: &str,
        indexers: &[Indexer],
    ) -> Result<&Placement> {
        let info = file.info(name)?;
        let plan = SlicePlan::new(&info, indexers).map_err(|e| e.in_file(file.path()))?;
        let offset = self.reserve(
            name,
            info.dtype,
            plan.shape().to_vec(),
            plan.byte_len() as u64,
        )?;
        let base = info.data_offsets.0 as u64;
        let mut at = offset;
        for (run, len) in plan.runs() {
            self.pieces.push(Piece {
                source,
                src: base + run as u64,
                dst: at,
                len: len as u64,
            });
            at += len as u64;
        }
        Ok(self.placements.last().expect("just pushed"))
    }

    fn reserve(&mut self, name: &str, dtype: Dtype, shape: Vec<usize>, len: u64) -> Result<u64> {
        let too_big = || Error::ValidationOverflow {
            tensor: name.to_owned(),
            shape: shape.clone(),
        };
        let offset = self
            .total
            .checked_next_multiple_of(self.alignment)
            .ok_or_else(too_big)?;
        self.total = offset.checked_add(len).ok_or_else(too_big)?;
        self.placements.push(Placement {
            name: name.to_owned(),
            dtype,
            shape,
            offset,
            len,
        });
        Ok(offset)
    }

    /// Bytes the destination needs.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Where each tensor goes, in the order they were added.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// Source bytes the plan reads (the total minus alignment padding).
    pub fn payload(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }
}

/// A destination that takes asynchronous copies out of staging buffers.
pub trait Device: Sync {
    /// A staging buffer plus whatever tracks its last copy (an event).
    type Slot: Send;
    /// A staging buffer of `bytes` bytes.
    fn new_slot(&self, bytes: usize) -> Result<Self::Slot>;
    /// The host memory of a slot.
    fn buffer<'s>(&self, slot: &'s mut Self::Slot) -> &'s mut [u8];
    /// Starts copying the first `len` bytes of the slot to `dst_offset`; may return before the
    /// copy is done.
    fn submit(&self, slot: &mut Self::Slot, len: usize, dst_offset: u64) -> Result<()>;
    /// Blocks until the slot's last submitted copy is done (immediately if none).
    fn wait(&self, slot: &mut Self::Slot) -> Result<()>;
    /// Runs on each reader thread before its first call (CUDA makes its context current).
    fn enter_thread(&self) -> Result<()> {
        Ok(())
    }
}

/// Sizes of the staging ring and how many threads fill it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// Number of staging buffers (at least 2 to overlap reading with copying).
    pub slots: usize,
    /// Bytes in each staging buffer.
    pub slot_bytes: usize,
    /// Reader threads.
    pub readers: usize,
}

impl Default for RingOptions {
    /// 4 × 32 MiB (128 MiB of staging) and up to 4 readers.
    fn default() -> Self {
        RingOptions {
            slots: 4,
            slot_bytes: 32 << 20,
            readers: std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
        }
    }
}

struct SlotState<S> {
    /// The chunk allowed to use this slot next.
    turn: usize,
    slot: S,
}

/// A ring of staging buffers, reusable across uploads to the same device.
pub struct Ring<S> {
    slots: Vec<(Mutex<SlotState<S>>, Condvar)>,
    slot_bytes: usize,
    readers: usize,
}

/// What an upload moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UploadStats {
    /// Bytes copied to the destination, padding included.
    pub bytes: u64,
    /// Chunks (one copy each).
    pub chunks: usize,
}

impl<S: Send> Ring<S> {
    /// Allocates the staging buffers on `device`.
    pub fn new<D: Device<Slot = S>>(device: &D, options: RingOptions) -> Result<Ring<S>> {
        let count = options.slots.max(1);
        let slot_bytes = options.slot_bytes.max(4096);
        let mut slots = Vec::with_capacity(count);
        for i in 0..count {
            let slot = device.new_slot(slot_bytes)?;
            slots.push((Mutex::new(SlotState { turn: i, slot }), Condvar::new()));
        }
        Ok(Ring {
            slots,
            slot_bytes,
            readers: options.readers.max(1),
        })
    }

    /// Bytes of staging memory the ring holds.
    pub fn staging_bytes(&self) -> usize {
        self.slots.len() * self.slot_bytes
    }

    /// Copies everything `plan` names from `files` (indexed by the plan's source numbers) into
    /// the device. Returns once every chunk is submitted; call [`Ring::wait_all`] for completion.
    pub fn run<D: Device<Slot = S>>(
        &self,
        device: &D,
        files: &[&SafeFile],
        plan: &UploadPlan,
    ) -> Result<UploadStats> {
        let chunk = self.slot_bytes as u64;
        let chunks = plan.total.div_ceil(chunk) as usize;
        // Each chunk's pieces, found by binary search over pieces sorted by destination.
        let mut pieces = plan.pieces.clone();
        pieces.sort_by_key(|p| p.dst);
        if let Some(bad) = pieces.iter().find(|p| p.source >= files.len()) {
            return Err(Error::InvalidIndex {
                reason: format!("upload plan names source {} of {}", bad.source, files.len()),
            });
        }
        // Chunk numbers restart at 0 for every run, so each slot's turn does too.
        for (i, (state, _)) in self.slots.iter().enumerate() {
            lock(state).turn = i;
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let readers = self.readers.min(chunks.max(1));
        std::thread::scope(|scope| {
            for _ in 0..readers {
                scope.spawn(|| {
                    let result = device.enter_thread().and_then(|()| {
                        self.read_chunks(device, files, &pieces, plan.total, chunks, &next, &failed)
                    });
                    if let Err(e) = result {
                        failed.store(true, Ordering::SeqCst);
                        lock(&first_error).get_or_insert(e);
                        for (_, cv) in &self.slots {
                            cv.notify_all();
                        }
                    }
                });
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(UploadStats {
                bytes: plan.total,
                chunks,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read_chunks<D: Device<Slot = S>>(
        &self,
        device: &D,
        files: &[&SafeFile],
        pieces: &[Piece],
        total: u64,
        chunks: usize,
        next: &AtomicUsize,
        failed: &AtomicBool,
    ) -> Result<()> {
        let ring = self.slots.len();
        loop {
            let k = next.fetch_add(1, Ordering::SeqCst);
            if k >= chunks || failed.load(Ordering::SeqCst) {
                return Ok(());
            }
            let (state, turn_changed) = &self.slots[k % ring];
            let mut st = lock(state);
            while st.turn != k {
                if failed.load(Ordering::SeqCst) {
                    return Ok(());
                }
                st = turn_changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            device.wait(&mut st.slot)?;
            let start = k as u64 * self.slot_bytes as u64;
            let len = (total - start).min(self.slot_bytes as u64) as usize;
            fill(device.buffer(&mut st.slot), start, len, files, pieces)?;
            device.submit(&mut st.slot, len, start)?;
            st.turn = k + ring;
            drop(st);
            turn_changed.notify_all();
        }
    }

    /// Blocks until every submitted copy is done.
    pub fn wait_all<D: Device<Slot = S>>(&self, device: &D) -> Result<()> {
        for (state, _) in &self.slots {
            device.wait(&mut lock(state).slot)?;
        }
        Ok(())
    }

    /// Gives the staging buffers back (after [`Ring::wait_all`]).
    pub fn into_slots(self) -> Vec<S> {
        self.slots
            .into_iter()
            .map(|(m, _)| m.into_inner().unwrap_or_else(|p| p.into_inner()).slot)
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fills `buf[..len]` with destination bytes `[start, start + len)`: source bytes where a piece
/// covers them, zeros elsewhere.
fn fill(
    buf: &mut [u8],
    start: u64,
    len: usize,
    files: &[&SafeFile],
    pieces: &[Piece],
) -> Result<()> {
    let end = start + len as u64;
    let buf = &mut buf[..len];
    // First piece that ends after `start`.
    let first = pieces.partition_point(|p| p.dst + p.len <= start);
    let mut at = start;
    for p in pieces[first..].iter().take_while(|p| p.dst < end) {
        let lo = p.dst.max(start);
        let hi = (p.dst + p.len).min(end);
        if lo > at {
            buf[(at - start) as usize..(lo - start) as usize].fill(0);
        }
        let dst = &mut buf[(lo - start) as usize..(hi - start) as usize];
        files[p.source].read_data(p.src + (lo - p.dst), dst)?;
        at = hi;
    }
    if at < end {
        buf[(at - start) as usize..].fill(0);
    }
    Ok(())
}
