//! Reading a remote object on demand ([`crate::RemoteOptions::on_demand`]): each read of the
//! file's bytes becomes concurrent ranged GETs of the pinned version, for exactly the byte runs
//! it asks (runs closer than [`BRIDGE`] fetched as one span, spans cut into parts of
//! `part_size`), at most `concurrency` GETs in flight and `concurrency × part_size` bytes held
//! at once; bytes the open's first read already fetched are not fetched again.

use std::ops::Range;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use safetensors_core::{fallible, Error, RangeSource, Result};

use crate::fetch::{parts, Getter, Pin};
use crate::options::RemoteOptions;
use crate::runtime;

/// Runs closer than this are fetched as one span, the bytes between them included: one GET
/// costs a round trip, during which a link moves far more than this.
pub(crate) const BRIDGE: u64 = 64 << 10;

/// The [`RangeSource`] of a remote file opened on demand.
pub(crate) struct OnDemand {
    getter: Getter,
    pin: Pin,
    options: RemoteOptions,
    /// The object's first bytes, fetched at open (header and what followed it).
    head: Vec<u8>,
}

impl OnDemand {
    pub(crate) fn new(getter: Getter, pin: Pin, options: RemoteOptions, head: Vec<u8>) -> Self {
        OnDemand {
            getter,
            pin,
            options,
            head,
        }
    }

    /// The object's first bytes, as fetched at open.
    pub(crate) fn head(&self) -> &[u8] {
        &self.head
    }

    /// Fetches `parts` (sorted, disjoint) concurrently; each comes back with its bytes.
    fn fetch(&self, parts: Vec<Range<u64>>, deadline_at: Option<Instant>) -> Result<Vec<Fetched>> {
        let getter = self.getter.clone();
        let pin = self.pin.clone();
        let concurrency = self.options.concurrency;
        let left = deadline_at.map(|at| at.saturating_duration_since(Instant::now()));
        let name = self.getter.name.clone();
        runtime::run(&name, left, async move {
            let gets = parts.into_iter().map(|range| {
                let getter = getter.clone();
                let pin = pin.clone();
                async move {
                    let len = (range.end - range.start) as usize;
                    let mut bytes = fallible::filled(len, 0u8, "a remote read's part")?;
                    getter
                        .get_into(range.clone(), Some(&pin), &mut bytes)
                        .await?;
                    Ok::<Fetched, Error>(Fetched { range, bytes })
                }
            });
            futures::stream::iter(gets)
                .buffer_unordered(concurrency)
                .try_collect::<Vec<Fetched>>()
                .await
        })
    }
}

/// One part's bytes.
struct Fetched {
    range: Range<u64>,
    bytes: Vec<u8>,
}

impl RangeSource for OnDemand {
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()> {
        let deadline_at = self.options.deadline.map(|d| Instant::now() + d);
        // Runs in the order of their offsets, the empty ones and those the first read holds
        // served at once.
        let mut order: Vec<usize> = Vec::new();
        fallible::reserve(&mut order, runs.len(), "a remote read's runs")?;
        for (i, (at, dst)) in runs.iter_mut().enumerate() {
            let len = dst.len() as u64;
            let end = at.checked_add(len).ok_or_else(|| Error::Internal {
                message: format!(
                    "a read of {} past the end of the address space",
                    self.getter.name
                ),
            })?;
            if len == 0 {
                continue;
            }
            if end <= self.head.len() as u64 {
                dst.copy_from_slice(&self.head[*at as usize..end as usize]);
                continue;
            }
            order.push(i);
        }
        order.sort_by_key(|&i| runs[i].0);
        // Spans: runs closer than BRIDGE merged.
        let mut spans: Vec<Range<u64>> = Vec::new();
        for &i in &order {
            let (at, dst) = &runs[i];
            let end = at + dst.len() as u64;
            match spans.last_mut() {
                Some(last) if *at <= last.end.saturating_add(BRIDGE) => {
                    last.end = last.end.max(end)
                }
                _ => fallible::push(&mut spans, *at..end, "a remote read's spans")?,
            }
        }
        let part_size = self.options.part_size as u64;
        let all = parts(&spans, part_size);
        // Windows of at most `concurrency` parts: the bytes held at once stay bounded.
        let window = self.options.concurrency.max(1);
        let mut next_run = 0usize; // index into `order`: runs before it end before this window
        for chunk in all.chunks(window) {
            let mut fetched = self.fetch(chunk.to_vec(), deadline_at)?;
            fetched.sort_by_key(|f| f.range.start);
            for f in &fetched {
                // Copy every run's overlap with this part, from the first run that ends past
                // its start (runs are disjoint and sorted, so their ends are too).
                let mut k = next_run
                    + order[next_run..]
                        .partition_point(|&i| runs[i].0 + runs[i].1.len() as u64 <= f.range.start);
                while k < order.len() {
                    let (at, dst) = &mut runs[order[k]];
                    let end = *at + dst.len() as u64;
                    if *at >= f.range.end {
                        break;
                    }
                    let lo = (*at).max(f.range.start);
                    let hi = end.min(f.range.end);
                    if lo < hi {
                        let from = (lo - f.range.start) as usize..(hi - f.range.start) as usize;
                        let to = (lo - *at) as usize..(hi - *at) as usize;
                        dst[to].copy_from_slice(&f.bytes[from]);
                    }
                    k += 1;
                }
            }
            // Runs wholly before the end of this window need no later part.
            if let Some(last) = fetched.last() {
                while next_run < order.len() {
                    let (at, dst) = &runs[order[next_run]];
                    if at + dst.len() as u64 <= last.range.end {
                        next_run += 1;
                    } else {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
