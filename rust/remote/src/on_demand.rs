//! Reading a remote object on demand ([`crate::RemoteOptions::on_demand`]): each read of the
//! file's bytes becomes concurrent ranged GETs of the pinned version, for exactly the byte runs
//! it asks (runs closer than [`BRIDGE`] fetched as one span, spans cut into parts of
//! `part_size`), at most `concurrency` GETs in flight, each part copied into place as it lands
//! while later ones are fetched, and at most `2 × concurrency` parts held at once; bytes the
//! open's first read already fetched are not fetched again.

use std::io;
use std::ops::Range;
use std::sync::{mpsc, Arc};

use futures::StreamExt;
use safetensors_core::{fallible, Error, RangeSource, Result};
use tokio::sync::Semaphore;

use crate::error::remote;
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
}

/// One part's bytes.
struct Fetched {
    range: Range<u64>,
    bytes: Vec<u8>,
}

impl RangeSource for OnDemand {
    fn read_runs(&self, runs: &mut [(u64, &mut [u8])]) -> Result<()> {
        let name = self.getter.name.clone();
        // Runs in the order of their offsets; the empty ones and those the first read holds
        // are served at once.
        let mut order: Vec<usize> = Vec::new();
        fallible::reserve(&mut order, runs.len(), "a remote read's runs")?;
        for (i, (at, dst)) in runs.iter_mut().enumerate() {
            let len = dst.len() as u64;
            let end = at.checked_add(len).ok_or_else(|| Error::Internal {
                message: format!("a read of {name} past the end of the address space"),
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
        let reach = reach(runs, &order)?;
        // Spans: runs closer than BRIDGE merged; then parts of at most `part_size`.
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
        let all = parts(&spans, self.options.part_size as u64);
        if all.is_empty() {
            return Ok(());
        }
        let count = all.len();
        let concurrency = self.options.concurrency.max(1);
        // Parts land here in any order and are copied into place on this thread while later
        // ones are fetched. A part is only started once a permit is free: at most twice
        // `concurrency` parts are in flight or waiting to be copied, whatever the read's size.
        // Saturating, and within what a semaphore holds: `usize::MAX` means "no limit".
        let held = concurrency.saturating_mul(2).min(Semaphore::MAX_PERMITS);
        let permits = Arc::new(Semaphore::new(held));
        let (tx, rx) = mpsc::channel::<Result<Fetched>>();
        let getter = self.getter.clone();
        let pin = self.pin.clone();
        let deadline = self.options.deadline;
        let gate = permits.clone();
        let shown = name.clone();
        let _running = runtime::start(&name, async move {
            let fetches = futures::stream::iter(all).map(move |range| {
                let getter = getter.clone();
                let pin = pin.clone();
                let gate = gate.clone();
                async move {
                    // The semaphore is never closed, so acquiring only waits.
                    if let Ok(permit) = gate.acquire().await {
                        permit.forget();
                    }
                    let len = (range.end - range.start) as usize;
                    let mut bytes = fallible::filled(len, 0u8, "a remote read's part")?;
                    getter
                        .get_into(range.clone(), Some(&pin), &mut bytes)
                        .await?;
                    Ok(Fetched { range, bytes })
                }
            });
            let mut landed = fetches.buffer_unordered(concurrency);
            let all_of_them = async {
                while let Some(part) = landed.next().await {
                    let failed = part.is_err();
                    // The reader is gone only when it stopped on an error of its own.
                    if tx.send(part).is_err() || failed {
                        return;
                    }
                }
            };
            match deadline {
                None => all_of_them.await,
                Some(limit) => {
                    if tokio::time::timeout(limit, all_of_them).await.is_err() {
                        let _ = tx.send(Err(remote(
                            &shown,
                            "GET",
                            io::ErrorKind::TimedOut,
                            format!(
                                "not finished within the deadline of {:.3} s \
                                 (RemoteOptions::deadline)",
                                limit.as_secs_f64()
                            ),
                        )));
                    }
                }
            }
        })?;
        for _ in 0..count {
            let part = rx.recv().unwrap_or_else(|_| {
                Err(Error::Internal {
                    message: format!("the remote read of {name} stopped without an answer"),
                })
            })?;
            scatter(runs, &order, &reach, &part);
            permits.add_permits(1);
        }
        Ok(())
    }
}

/// For each run in `order` (the runs by offset), the furthest end of it and the runs before
/// it: ascending even where runs overlap or nest (a caller's runs may), unlike their own ends.
fn reach(runs: &[(u64, &mut [u8])], order: &[usize]) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    fallible::reserve(&mut out, order.len(), "a remote read's runs")?;
    let mut furthest = 0u64;
    for &i in order {
        furthest = furthest.max(runs[i].0 + runs[i].1.len() as u64);
        out.push(furthest);
    }
    Ok(out)
}

/// Copies every run's overlap with `part` into place. `order` lists the runs by offset and
/// `reach` is [`reach`] of them: the runs before the first whose reach passes the part's start
/// all end before it.
fn scatter(runs: &mut [(u64, &mut [u8])], order: &[usize], reach: &[u64], part: &Fetched) {
    let first = reach.partition_point(|&end| end <= part.range.start);
    for &i in &order[first..] {
        let (at, dst) = &mut runs[i];
        if *at >= part.range.end {
            break;
        }
        let end = *at + dst.len() as u64;
        let lo = (*at).max(part.range.start);
        let hi = end.min(part.range.end);
        if lo >= hi {
            // A run nested in an earlier one, ending before this part.
            continue;
        }
        let from = (lo - part.range.start) as usize..(hi - part.range.start) as usize;
        let to = (lo - *at) as usize..(hi - *at) as usize;
        dst[to].copy_from_slice(&part.bytes[from]);
    }
}

#[cfg(test)]
mod tests {
    use super::{reach, scatter, Fetched};

    /// Byte `k` of the object.
    fn byte(k: u64) -> u8 {
        (k * 7 % 251) as u8
    }

    #[test]
    fn overlapping_and_nested_runs_get_their_bytes_whatever_order_parts_land_in() {
        // (offset, length): a long run, one nested in it, a duplicate of it, one overlapping
        // its end, and one far after; parts of 64 bytes landing last first.
        let shape = [(0u64, 300usize), (10, 10), (10, 10), (250, 100), (1000, 5)];
        let mut buffers: Vec<Vec<u8>> = shape.iter().map(|&(_, n)| vec![0; n]).collect();
        let mut runs: Vec<(u64, &mut [u8])> = shape
            .iter()
            .zip(buffers.iter_mut())
            .map(|(&(at, _), b)| (at, b.as_mut_slice()))
            .collect();
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by_key(|&i| runs[i].0);
        let reach = reach(&runs, &order).unwrap();
        let mut parts: Vec<Fetched> = (0..1005u64)
            .step_by(64)
            .map(|start| {
                let range = start..(start + 64).min(1005);
                let bytes = range.clone().map(byte).collect();
                Fetched { range, bytes }
            })
            .collect();
        parts.reverse();
        for part in &parts {
            scatter(&mut runs, &order, &reach, part);
        }
        drop(runs);
        for (&(at, n), got) in shape.iter().zip(&buffers) {
            let want: Vec<u8> = (at..at + n as u64).map(byte).collect();
            assert_eq!(got, &want, "the run at {at}");
        }
    }
}
