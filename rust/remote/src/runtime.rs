//! The library's own runtime for remote reads: one multi-threaded tokio runtime per process,
//! created on the first remote open (and again in a child made by `fork`, see
//! [`crate::process`]), with a few worker threads (network I/O and copying into place), named
//! `safetensors-remote`. Never the caller's: a caller inside its own runtime (or none) gets
//! the same behaviour, since [`run`] hands the work to this runtime and waits on a channel
//! rather than entering a runtime on the calling thread (which would panic inside another).

use std::future::Future;
use std::io;
use std::sync::mpsc;
use std::time::Duration;

use safetensors_core::{Error, Result};
use tokio::runtime::Runtime;

use crate::error::remote;
use crate::process::PerProcess;

/// Worker threads: enough to keep many requests and their copies going, few enough to leave the
/// caller's cores alone (the work is mostly waiting on the network).
const WORKERS: usize = 4;

/// The runtime of this process (see [`crate::process`]: a child made by `fork` gets one of its
/// own, since the parent's workers did not come with it).
static RUNTIME: PerProcess<std::result::Result<Runtime, String>> = PerProcess::new(build);

fn build() -> std::result::Result<Runtime, String> {
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("safetensors-remote")
        // Uninstrumented threads that hand memory around through atomics: a
        // ThreadSanitizer build of the caller ignores what they do (see `tsan`), up to their
        // end (a blocking thread idle for a while ends; so do all when a runtime is dropped).
        .on_thread_start(safetensors_core::tsan::ignore_this_thread)
        .on_thread_stop(safetensors_core::tsan::stop_ignoring_this_thread)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the remote-read runtime: {e}"));
    // The runtime (its event file descriptors among the rest) is published through an atomic
    // pointer, which a ThreadSanitizer build cannot see: the thread that built it announces it,
    // and every thread that uses it takes the announcement (see `tsan`).
    safetensors_core::tsan::release(&RUNTIME);
    built
}

fn runtime() -> std::result::Result<&'static Runtime, &'static str> {
    let made = RUNTIME.get();
    safetensors_core::tsan::acquire(&RUNTIME);
    made.as_ref().map_err(String::as_str)
}

/// Runs `work` on the library's runtime and waits for it, at most `deadline` when given. Errors
/// name `name` (the URL). A panic inside `work` is an `Internal` error, never an unwind into
/// the caller.
pub fn run<T, F>(name: &str, deadline: Option<Duration>, work: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let rt =
        runtime().map_err(|why| remote(name, "start", io::ErrorKind::Other, why.to_owned()))?;
    let (tx, rx) = mpsc::sync_channel(1);
    let owned = name.to_owned();
    rt.spawn(async move {
        let result = match deadline {
            None => work.await,
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(r) => r,
                Err(_) => Err(remote(
                    &owned,
                    "GET",
                    io::ErrorKind::TimedOut,
                    format!(
                        "not finished within the deadline of {:.3} s (RemoteOptions::deadline)",
                        limit.as_secs_f64()
                    ),
                )),
            },
        };
        // The receiver waits until this is sent; it is gone only if the caller's thread died.
        let _ = tx.send(result);
    });
    rx.recv().unwrap_or_else(|_| {
        Err(Error::Internal {
            message: format!("the remote read of {name} stopped without an answer (a panic)"),
        })
    })
}

/// Starts `work` on the library's runtime without waiting for it; the returned guard aborts it
/// when dropped (a caller that stops early stops the work too). Errors name `name`.
pub(crate) fn start<F>(name: &str, work: F) -> Result<Running>
where
    F: Future<Output = ()> + Send + 'static,
{
    let rt =
        runtime().map_err(|why| remote(name, "start", io::ErrorKind::Other, why.to_owned()))?;
    Ok(Running(rt.spawn(work)))
}

/// Work started by [`start`]; aborted when dropped.
pub(crate) struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}
