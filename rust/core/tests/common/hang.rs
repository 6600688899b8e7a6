//! Tests of concurrent code fail when it hangs instead of stalling the test run.

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on its own thread and fails the test if it has not finished after two minutes: a
/// hang is a failure, not a stuck test run. (Not a timing assertion: the code tested with it
/// takes a fraction of a second when it works.)
pub fn without_hanging(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => worker.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // `f` panicked: report its panic.
            if let Err(p) = worker.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung (deadlock)"),
    }
}
