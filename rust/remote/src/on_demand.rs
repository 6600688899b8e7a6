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
        let permits = Arc::new(Semaphore::new(2 * concurrency));
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
            scatter(runs, &order, &part);
            permits.add_permits(1);
        }
        Ok(())
    }
}

/// Copies every run's overlap with `part` into place. `order` lists the runs by offset; they
/// are disjoint, so their ends ascend too.
fn scatter(runs: &mut [(u64, &mut [u8])], order: &[usize], part: &Fetched) {
    let first = order.partition_point(|&i| runs[i].0 + runs[i].1.len() as u64 <= part.range.start);
    for &i in &order[first..] {
        let (at, dst) = &mut runs[i];
        if *at >= part.range.end {
            break;
        }
        let end = *at + dst.len() as u64;
        let lo = (*at).max(part.range.start);
        let hi = end.min(part.range.end);
        let from = (lo - part.range.start) as usize..(hi - part.range.start) as usize;
        let to = (lo - *at) as usize..(hi - *at) as usize;
        dst[to].copy_from_slice(&part.bytes[from]);
    }
}
