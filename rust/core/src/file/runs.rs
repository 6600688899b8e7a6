//! Reading slices and batches of runs: a slice's runs read from the mapping, the file or a
//! remote source (in bounded batches of runs), and a caller's batch of runs checked and read.

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::header::TensorInfo;
use crate::slice::{Indexer, SlicePlan};

use super::{Handle, RangeSource, SafeFile, Storage, RANGED_RUNS};

impl SafeFile {
    /// Plans a slice of tensor `name` (see [`SlicePlan`]).
    pub fn plan_slice(&self, name: &str, indexers: &[Indexer]) -> Result<SlicePlan> {
        let info = self.info(name)?;
        SlicePlan::new(&info, indexers).map_err(|e| e.in_file(&self.path))
    }

    /// Copies the bytes a slice plan selects from tensor `name` into `dst`, which must be
    /// exactly [`SlicePlan::byte_len`] long. Only the selected bytes are read.
    pub fn read_slice(&self, name: &str, plan: &SlicePlan, dst: &mut [u8]) -> Result<()> {
        let info = self.info(name)?;
        self.read_slice_of(&info, plan, dst)
    }

    /// [`SafeFile::read_slice`] for a tensor already looked up.
    pub fn read_slice_of(
        &self,
        info: &TensorInfo<'_>,
        plan: &SlicePlan,
        dst: &mut [u8],
    ) -> Result<()> {
        plan.check_fits(info, dst.len())
            .map_err(|e| e.in_file(&self.path))?;
        self.read_runs(info.data_offsets.0 as u64, plan, dst)
    }

    /// The runs of `plan`, a slice of the tensor whose bytes start at data offset `base`, packed
    /// into `dst` (exactly [`SlicePlan::byte_len`] bytes, checked by the caller).
    pub(crate) fn read_runs(&self, base: u64, plan: &SlicePlan, dst: &mut [u8]) -> Result<()> {
        // One descriptor for the whole slice, however many runs it has.
        let handle = self.handle()?;
        if let Some(Handle::Ranged(source)) = &handle {
            // All the runs in one call, so that a remote source coalesces and fetches them
            // concurrently rather than one round trip each.
            return self.read_runs_ranged(*source, base, plan, dst);
        }
        let mut at = 0usize;
        for (offset, len) in plan.runs() {
            let out = at
                .checked_add(len)
                .and_then(|end| dst.get_mut(at..end))
                .ok_or_else(|| self.outside(base + offset as u64, len))?;
            self.read_with(handle.as_ref(), base + offset as u64, out)?;
            at += len;
        }
        Ok(())
    }

    /// [`SafeFile::read_runs`] from a ranged source: the runs in calls of at most
    /// [`RANGED_RUNS`] each (one call for all but the most scattered slices).
    fn read_runs_ranged(
        &self,
        source: &dyn RangeSource,
        base: u64,
        plan: &SlicePlan,
        dst: &mut [u8],
    ) -> Result<()> {
        let data_start = self.header.data_start() as u64;
        let mut runs: Vec<(u64, &mut [u8])> = Vec::new();
        let mut rest = dst;
        let mut total = 0u64;
        for (offset, len) in plan.runs() {
            let at = base + offset as u64;
            at.checked_add(len as u64)
                .filter(|&end| end <= self.header.data_len() as u64)
                .ok_or_else(|| self.outside(at, len))?;
            if len > rest.len() {
                return Err(self.outside(at, len));
            }
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            if len > 0 {
                if runs.len() == RANGED_RUNS {
                    source.read_runs(&mut runs)?;
                    runs.clear();
                }
                crate::fallible::push(&mut runs, (data_start + at, mine), "a slice's runs")?;
            }
            total += len as u64;
        }
        source.read_runs(&mut runs)?;
        self.bytes_read.fetch_add(total, Ordering::Relaxed);
        Ok(())
    }

    /// Whether each read of this file is a round trip to a remote source ([`SafeFile::from_source`]):
    /// readers that have several reads to make hand them over together ([`SafeFile::read_batch`]),
    /// so that they are fetched concurrently.
    pub fn reads_in_batches(&self) -> bool {
        matches!(self.storage, Storage::Ranged(_))
    }

    /// Several reads of the data buffer at once: each `(offset, dst)` gets the data bytes
    /// `[offset, offset + dst.len())`. The runs must not overlap (`InvalidSlice`, before
    /// anything is read). A ranged source gets them in one call (coalesced and fetched
    /// concurrently); other files read them one by one. On an error the offsets are as given
    /// and what the buffers hold is unspecified.
    pub fn read_batch(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()> {
        let handle = self.handle()?;
        let Some(Handle::Ranged(source)) = &handle else {
            for (offset, dst) in runs.iter_mut() {
                self.read_with(handle.as_ref(), *offset, dst)?;
            }
            return Ok(());
        };
        let data_start = self.header.data_start() as u64;
        let mut total = 0u64;
        let mut spans: Vec<(u64, u64)> = Vec::new();
        crate::fallible::reserve(&mut spans, runs.len(), "a batch of reads")?;
        for (offset, dst) in runs.iter() {
            let end = offset
                .checked_add(dst.len() as u64)
                .filter(|&end| end <= self.header.data_len() as u64)
                .ok_or_else(|| self.outside(*offset, dst.len()))?;
            if !dst.is_empty() {
                spans.push((*offset, end));
            }
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(Error::InvalidSlice {
                tensor: String::new(),
                reason: format!(
                    "a batch of reads asks for bytes [{}, {}) and [{}, {}), which overlap; \
                     read them separately",
                    w[0].0, w[0].1, w[1].0, w[1].1
                ),
            }
            .in_file(&self.path));
        }
        for (offset, dst) in runs.iter_mut() {
            *offset += data_start;
            total += dst.len() as u64;
        }
        let read = source.read_runs(runs);
        for (offset, _) in runs.iter_mut() {
            *offset -= data_start;
        }
        read?;
        self.bytes_read.fetch_add(total, Ordering::Relaxed);
        Ok(())
    }
}
