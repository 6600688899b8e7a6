//! What an upload reads and where each tensor lands: an [`UploadPlan`], built from the same
//! requests as prefetch and streams (`request.rs`), or tensor by tensor.

use std::sync::Arc;

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::request::{resolve, Item, Request, Source};
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

/// One tensor or slice and where it goes: `len` contiguous bytes from `src`, or, for a slice,
/// the selection's runs of the tensor at `src`, packed. A slice stays one piece whatever its
/// number of runs (a strided one has a run per element): the runs of a chunk are walked from
/// the slice plan when the chunk is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// The placement it belongs to.
    pub(super) placement: usize,
    pub(super) source: usize,
    /// Offset in the source file's data buffer (of the tensor, for a slice).
    pub(super) src: u64,
    /// Offset in the destination.
    pub(super) dst: u64,
    pub(super) len: u64,
    /// The slice plan (an index into the plan's slices), for a slice.
    pub(super) slice: Option<usize>,
}

/// The alignment of an upload's placements when none is asked for (0): 256 bytes, what CUDA
/// allocations are aligned to, so that every tensor is as aligned as its allocation.
pub const DEFAULT_ALIGNMENT: usize = 256;

/// The one rule for the alignment of an upload's placements, for every binding and every
/// upload (one device, a caller's buffer, multi-rank device loads): 0 is the default
/// ([`DEFAULT_ALIGNMENT`]); anything else must be a power of two (`BadAlignment`, of kind
/// `InvalidSlice`).
///
/// ```
/// use safetensors_core::upload::{alignment, DEFAULT_ALIGNMENT};
/// assert_eq!(alignment(0).unwrap(), DEFAULT_ALIGNMENT);
/// assert_eq!(alignment(1).unwrap(), 1);
/// assert_eq!(alignment(4096).unwrap(), 4096);
/// assert!(alignment(3).is_err());
/// ```
pub fn alignment(requested: usize) -> Result<usize> {
    match requested {
        0 => Ok(DEFAULT_ALIGNMENT),
        a if a.is_power_of_two() => Ok(a),
        a => Err(Error::BadAlignment {
            alignment: a as u64,
            reason: "an alignment must be a power of two",
            upload: true,
        }),
    }
}

/// Where a tensor of `len` bytes goes after `placed` bytes of placements: `(offset, end)`,
/// `offset` the next multiple of `alignment` (at least 1), or `None` when either passes 2^64
/// (then [`Error::LayoutOverflow`], which tells the two apart). The one layout rule of every
/// upload: one device's plans and a rank's share of a multi-rank device load.
pub fn place(placed: u64, len: u64, alignment: u64) -> Option<(u64, u64)> {
    let offset = placed.checked_next_multiple_of(alignment.max(1))?;
    Some((offset, offset.checked_add(len)?))
}

/// What to upload and where each tensor goes: one destination range, tensors back to back,
/// each starting on an `alignment` boundary.
#[derive(Debug, Clone)]
pub struct UploadPlan {
    pub(super) alignment: u64,
    pub(super) placements: Vec<Placement>,
    pub(super) pieces: Vec<Piece>,
    pub(super) slices: Vec<SlicePlan>,
    pub(super) total: u64,
}

// Alignments, requests and slices come from callers: the layout's arithmetic is checked.
#[deny(clippy::arithmetic_side_effects)]
impl UploadPlan {
    /// An empty plan; every tensor will start on a multiple of `alignment`, taken as given
    /// (at least 1): the unchecked constructor, for a caller that chose its alignment. Plans
    /// made for a user's option go through [`alignment`] first (0: the default, 256, what CUDA
    /// allocations are aligned to; else a power of two), as [`UploadPlan::of`] and both
    /// bindings do: `UploadPlan::new(upload::alignment(asked)?)`.
    pub fn new(alignment: usize) -> UploadPlan {
        UploadPlan {
            alignment: alignment.max(1) as u64,
            placements: Vec::new(),
            pieces: Vec::new(),
            slices: Vec::new(),
            total: 0,
        }
    }

    /// The plan for `requests` of `source` (`None`: every tensor), and the files it reads,
    /// numbered as its sources: the same requests as prefetch and streams take, resolved by the
    /// same rule (`request.rs`), so a shard pin or a slice means the same bytes to all three.
    /// Tensors are placed in request order; every tensor, in name order (as `keys()` lists
    /// them). Every tensor starts on a multiple of `alignment` bytes, by the one rule of
    /// [`alignment`] (0: the default; else a power of two).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use safetensors_core::{upload::UploadPlan, Backend, Request, SafeFile, Source};
    /// let f = [Arc::new(SafeFile::open("model.safetensors", Backend::Mmap)?)];
    /// let (plan, files) = UploadPlan::of(Source::Files(&f), Some(&[Request::tensor("wte.weight")]), 256)?;
    /// # Ok::<(), safetensors_core::Error>(())
    /// ```
    pub fn of(
        source: Source<'_>,
        requests: Option<&[Request]>,
        alignment: usize,
    ) -> Result<(UploadPlan, Vec<Arc<SafeFile>>)> {
        // The alignment first: a bad one is refused before any shard is opened.
        let alignment = self::alignment(alignment)?;
        let mut items = resolve(source, requests)?;
        match requests {
            Some(_) => items.sort_by_key(|it| it.request),
            None => items.sort_by(|a, b| a.name.cmp(&b.name)),
        }
        let mut plan = UploadPlan::new(alignment);
        // The source's file numbers, renumbered densely in the order first used.
        let mut files: Vec<(usize, Arc<SafeFile>)> = Vec::new();
        for item in items {
            let number = match files.iter().position(|(n, _)| *n == item.file) {
                Some(k) => k,
                None => {
                    files.push((item.file, item.source.clone()));
                    files.len().saturating_sub(1)
                }
            };
            plan.add_item(number, item)?;
        }
        Ok((plan, files.into_iter().map(|(_, f)| f).collect()))
    }

    /// Adds a resolved request (its slice already planned).
    fn add_item(&mut self, source: usize, item: Item) -> Result<()> {
        let offset = self.reserve(&item.name, item.dtype, item.shape, item.len)?;
        if item.len > 0 {
            self.pieces.push(Piece {
                placement: self.placements.len().saturating_sub(1),
                source,
                src: item.begin,
                dst: offset,
                len: item.len,
                slice: item.slice.is_some().then_some(self.slices.len()),
            });
            self.slices.extend(item.slice);
        }
        Ok(())
    }

    /// Adds a whole tensor of `file` (the plan's source number `source`).
    pub fn add_tensor(&mut self, source: usize, file: &SafeFile, name: &str) -> Result<&Placement> {
        let info = file.info(name)?;
        let begin = info.data_offsets.0 as u64;
        let len = info.byte_len() as u64;
        let offset = self.reserve(name, info.dtype, info.shape.to_vec(), len)?;
        if len > 0 {
            self.pieces.push(Piece {
                placement: self.placements.len().saturating_sub(1),
                source,
                src: begin,
                dst: offset,
                len,
                slice: None,
            });
        }
        self.last_placement()
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
        let len = plan.byte_len() as u64;
        if len > 0 {
            self.pieces.push(Piece {
                placement: self.placements.len().saturating_sub(1),
                source,
                src: info.data_offsets.0 as u64,
                dst: offset,
                len,
                slice: Some(self.slices.len()),
            });
            self.slices.push(plan);
        }
        self.last_placement()
    }

    /// The placement just reserved.
    fn last_placement(&self) -> Result<&Placement> {
        self.placements.last().ok_or_else(|| Error::Internal {
            message: "an upload plan lost the placement it reserved".into(),
        })
    }

    fn reserve(&mut self, name: &str, dtype: Dtype, shape: Vec<usize>, len: u64) -> Result<u64> {
        let overflow = || Error::LayoutOverflow {
            tensor: name.to_owned(),
            placed: self.total,
            len,
            alignment: self.alignment,
        };
        let (offset, total) = place(self.total, len, self.alignment).ok_or_else(overflow)?;
        self.total = total;
        self.placements.push(Placement {
            name: name.to_owned(),
            dtype,
            shape,
            offset,
            len,
        });
        Ok(offset)
    }

    /// The alignment every placement's offset is a multiple of.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Bytes the destination needs.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Where each tensor goes, in the order they were added.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// Reads the plan into host memory: every piece straight into its place in `dst` (which must
    /// be exactly [`UploadPlan::total`] bytes), in file order (by file, then offset), and the
    /// alignment padding between placements zeroed. `files` are the plan's sources, as
    /// [`UploadPlan::of`] returns them. A host load of tensors into one allocation is this.
    pub fn read_into(&self, files: &[Arc<SafeFile>], dst: &mut [u8]) -> Result<()> {
        if dst.len() as u64 != self.total {
            return Err(Error::WrongBufferLength {
                buffer: "the load's destination",
                expected: self.total,
                actual: dst.len() as u64,
            });
        }
        if files.iter().any(|f| f.reads_in_batches()) {
            return self.read_into_in_batches(files, dst);
        }
        let mut order: Vec<&Piece> = Vec::new();
        crate::fallible::reserve(&mut order, self.pieces.len(), "a load's pieces")?;
        order.extend(self.pieces.iter());
        order.sort_by_key(|p| (p.source, p.src));
        for p in order {
            let file = files.get(p.source).ok_or_else(|| Error::Internal {
                message: format!("a load reads source {} of {}", p.source, files.len()),
            })?;
            // Inside `dst`: every placement ends within the total, which is `dst.len()`.
            let at = usize::try_from(p.dst).unwrap_or(usize::MAX);
            let len = usize::try_from(p.len).unwrap_or(usize::MAX);
            let out = at
                .checked_add(len)
                .and_then(|end| dst.get_mut(at..end))
                .ok_or_else(|| Error::Internal {
                    message: format!("a load's piece [{at}, +{len}) lies outside its destination"),
                })?;
            match p.slice.and_then(|k| self.slices.get(k)) {
                None => file.read_data(p.src, out)?,
                Some(plan) => file.read_runs(p.src, plan, out)?,
            }
        }
        // The padding: every byte no placement covers.
        let mut at = 0u64;
        for p in &self.placements {
            if let Some(gap) = dst.get_mut(at as usize..p.offset as usize) {
                gap.fill(0);
            }
            at = p.offset.saturating_add(p.len);
        }
        if let Some(tail) = dst.get_mut(at as usize..) {
            tail.fill(0);
        }
        Ok(())
    }

    /// [`UploadPlan::read_into`] with files that read in batches (remote files read on demand):
    /// every piece's reads (a tensor, or a slice's runs) of one file handed to it together, so
    /// that they are fetched concurrently rather than one round trip each.
    fn read_into_in_batches(&self, files: &[Arc<SafeFile>], dst: &mut [u8]) -> Result<()> {
        let plain: Vec<&SafeFile> = files.iter().map(|f| f.as_ref()).collect();
        let mut order: Vec<&Piece> = Vec::new();
        crate::fallible::reserve(&mut order, self.pieces.len(), "a load's pieces")?;
        order.extend(self.pieces.iter());
        order.sort_by_key(|p| p.dst);
        let mut reads: Vec<(usize, u64, &mut [u8])> = Vec::new();
        let mut rest: &mut [u8] = dst;
        let mut at = 0u64;
        for p in order {
            match p.slice.and_then(|k| self.slices.get(k)) {
                None => {
                    // Saturating: a placement past the destination is refused by `carve`.
                    let end = p.dst.saturating_add(p.len);
                    let out = super::carve(p.dst, end, &mut rest, &mut at)?;
                    crate::fallible::push(&mut reads, (p.source, p.src, out), "a load's reads")?;
                }
                Some(plan) => {
                    for (src, out, n) in plan.runs_in_result(0, p.len as usize) {
                        let to = p.dst.saturating_add(out as u64);
                        let out =
                            super::carve(to, to.saturating_add(n as u64), &mut rest, &mut at)?;
                        // Inside the source file's data, which the plan was checked against;
                        // a read past it is refused by the file.
                        let from = p.src.saturating_add(src as u64);
                        crate::fallible::push(&mut reads, (p.source, from, out), "a load's reads")?;
                    }
                }
            }
        }
        // The padding after the last placement (carve zeroed the gaps before each read).
        rest.fill(0);
        super::read_grouped(&plain, &mut reads)
    }

    /// Source bytes the plan reads (the total minus alignment padding).
    pub fn payload(&self) -> u64 {
        // At most the total, which fits.
        self.pieces
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.len))
    }
}
