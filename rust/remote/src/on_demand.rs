//! Reading a remote object on demand ([`crate::RemoteOptions::on_demand`]): each read of the
//! file's bytes becomes concurrent ranged GETs of the pinned version, for exactly the byte runs
//! it asks (runs closer than [`BRIDGE`] fetched as one span, spans cut into parts of
//! `part_size`), at most `concurrency` GETs in flight. A part inside one run is written straight
//! into the caller's buffer; a part that spans runs (or a gap) lands in bytes of its own and is
//! copied into place while later ones are fetched, at most `2 × concurrency` of those held at
//! once. Bytes the open's first read already fetched are not fetched again.

use std::io;
use std::ops::Range;
use std::sync::{mpsc, Arc};

use futures::StreamExt;
use safetensors_core::{fallible, Error, RangeSource, Result};
use tokio::sync::Semaphore;

use crate::error::remote;
use crate::get::{parts, Getter, Pin};
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

/// Where a run's bytes go, as a raw pointer: once [`OnDemand::read_runs`] has made these, it
/// reaches the runs' buffers only through them (the task's direct writes and `scatter` alike),
/// and it does not return before the task that writes through them is gone.
#[derive(Clone, Copy)]
struct Place {
    at: u64,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `Place` is moved to the runtime's threads only inside `read_runs`, which holds the
// exclusive borrow of the bytes it points to until every writer is gone; distinct places (and
// the parts written through them) never overlap.
unsafe impl Send for Place {}

/// What one part's GET gave: written straight into its run, or bytes to copy into place (a part
/// that spans runs, or the gap between them).
enum Landed {
    Direct,
    Fetched(Fetched),
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
        let mut places: Vec<Place> = Vec::new();
        fallible::reserve(&mut places, order.len(), "a remote read's runs")?;
        for &i in &order {
            let (at, dst) = &mut runs[i];
            places.push(Place {
                at: *at,
                ptr: dst.as_mut_ptr(),
                len: dst.len(),
            });
        }
        // From here on the runs are reached through `places` only.
        let mut spans: Vec<Range<u64>> = Vec::new();
        for p in &places {
            let end = p.at + p.len as u64;
            if spans.last().is_some_and(|last| p.at < last.end) {
                return Err(Error::Internal {
                    message: format!("a read of {name} asked for overlapping byte runs"),
                });
            }
            match spans.last_mut() {
                // Runs closer than BRIDGE are fetched as one span, the gap included.
                Some(last) if p.at <= last.end.saturating_add(BRIDGE) => last.end = end,
                _ => fallible::push(&mut spans, p.at..end, "a remote read's spans")?,
            }
        }
        let all = parts(&spans, self.options.part_size as u64);
        if all.is_empty() {
            return Ok(());
        }
        // Each part inside one run is fetched straight into it; the others (spanning runs or a
        // gap) into bytes of their own, copied into place here as they land.
        let jobs: Vec<(Range<u64>, Option<Place>)> = all
            .into_iter()
            .map(|range| {
                let k = places.partition_point(|p| p.at + (p.len as u64) <= range.start);
                let inside = places
                    .get(k)
                    .filter(|p| p.at <= range.start && range.end <= p.at + p.len as u64);
                let direct = inside.map(|p| Place {
                    at: range.start,
                    // SAFETY: `range` lies inside the run `p` points to.
                    ptr: unsafe { p.ptr.add((range.start - p.at) as usize) },
                    len: (range.end - range.start) as usize,
                });
                (range, direct)
            })
            .collect();
        let count = jobs.len();
        let concurrency = self.options.concurrency.max(1);
        // A part that needs bytes of its own starts only once a permit is free: at most twice
        // `concurrency` such parts are in flight or waiting to be copied, whatever the read's size
        // (saturating, and within what a semaphore holds: `usize::MAX` means "no limit").
        let held = concurrency.saturating_mul(2).min(Semaphore::MAX_PERMITS);
        let permits = Arc::new(Semaphore::new(held));
        let (tx, rx) = mpsc::channel::<Result<Landed>>();
        // Dropped with the task (finished, aborted or unwound): what `read_runs` waits for
        // before it returns, so that no write through a place outlives the caller's borrow.
        let (gone_tx, gone_rx) = mpsc::channel::<()>();
        let getter = self.getter.clone();
        let pin = self.pin.clone();
        let deadline = self.options.deadline;
        let gate = permits.clone();
        let shown = name.clone();
        let running = runtime::start(&name, async move {
            let _gone = gone_tx;
            let fetches = futures::stream::iter(jobs).map(move |(range, direct)| {
                let getter = getter.clone();
                let pin = pin.clone();
                let gate = gate.clone();
                async move {
                    if let Some(place) = direct {
                        // SAFETY: `place` is this part's own bytes inside a run that
                        // `read_runs` borrows exclusively until this task is gone.
                        let dst = unsafe { std::slice::from_raw_parts_mut(place.ptr, place.len) };
                        getter.get_into(range, Some(&pin), dst).await?;
                        return Ok(Landed::Direct);
                    }
                    // The semaphore is never closed, so acquiring only waits.
                    if let Ok(permit) = gate.acquire().await {
                        permit.forget();
                    }
                    let len = (range.end - range.start) as usize;
                    let mut bytes = fallible::filled(len, 0u8, "a remote read's part")?;
                    getter
                        .get_into(range.clone(), Some(&pin), &mut bytes)
                        .await?;
                    Ok(Landed::Fetched(Fetched { range, bytes }))
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
        let mut result = Ok(());
        for _ in 0..count {
            match rx.recv() {
                Ok(Ok(Landed::Direct)) => {}
                Ok(Ok(Landed::Fetched(part))) => {
                    scatter(&places, &part);
                    permits.add_permits(1);
                }
                Ok(Err(e)) => {
                    result = Err(e);
                    break;
                }
                Err(_) => {
                    result = Err(Error::Internal {
                        message: format!("the remote read of {name} stopped without an answer"),
                    });
                    break;
                }
            }
        }
        // However it ended, the task is stopped and waited for: it may hold places.
        drop(running);
        let _ = gone_rx.recv();
        result
    }
}

/// Copies every run's overlap with `part` into place. `places` lists the runs by offset; they
/// are disjoint, so their ends ascend too.
fn scatter(places: &[Place], part: &Fetched) {
    let first = places.partition_point(|p| p.at + p.len as u64 <= part.range.start);
    for p in &places[first..] {
        if p.at >= part.range.end {
            break;
        }
        let end = p.at + p.len as u64;
        let lo = p.at.max(part.range.start);
        let hi = end.min(part.range.end);
        let from = &part.bytes[(lo - part.range.start) as usize..(hi - part.range.start) as usize];
        // SAFETY: `[lo, hi)` lies inside the run `p` points to (and inside `part`); no other
        // writer touches these bytes: parts are disjoint, and a part written directly never
        // also comes here.
        unsafe {
            std::ptr::copy_nonoverlapping(
                from.as_ptr(),
                p.ptr.add((lo - p.at) as usize),
                from.len(),
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::{scatter, Fetched, Place};

    /// Byte `k` of the object.
    fn byte(k: u64) -> u8 {
        (k * 7 % 251) as u8
    }

    #[test]
    fn parts_landing_in_any_order_fill_the_runs_they_span() {
        // (offset, length): disjoint runs with gaps between them, one spanning several parts,
        // one inside a part, one crossing a part's end; parts of 64 bytes landing last first.
        let shape = [(0u64, 150usize), (170, 10), (250, 100), (1000, 5)];
        let mut buffers: Vec<Vec<u8>> = shape.iter().map(|&(_, n)| vec![0; n]).collect();
        let places: Vec<Place> = shape
            .iter()
            .zip(buffers.iter_mut())
            .map(|(&(at, len), b)| Place {
                at,
                ptr: b.as_mut_ptr(),
                len,
            })
            .collect();
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
            scatter(&places, part);
        }
        drop(places);
        for (&(at, n), got) in shape.iter().zip(&buffers) {
            let want: Vec<u8> = (at..at + n as u64).map(byte).collect();
            assert_eq!(got, &want, "the run at {at}");
        }
    }
}
