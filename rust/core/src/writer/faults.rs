//! The test seam of publishing: every operation that changes a directory while a writer
//! publishes (`publish.rs`, and `StreamWriter::finish`'s rename) goes through [`step`], which the
//! crate's own tests can make fail with a chosen error, or stop right after, as a crash would
//! (`writer/publish_tests.rs`). It exists only in the crate's test build (`cfg(test)`): no user
//! of the library can reach it, and in every other build [`step`] is the operation itself.

use std::io;

/// Why a step did not complete: the operation failed, or (tests only) the process is taken to
/// have died right after it, so that nothing else may run, not even a rollback.
#[derive(Debug)]
pub(super) enum Halt {
    Failed(io::Error),
    #[cfg_attr(not(test), allow(dead_code))]
    Crashed,
}

/// Runs one operation of a publish sequence; `what` names it for the tests.
#[cfg(not(test))]
#[inline]
pub(super) fn step<T>(_what: &str, op: impl FnOnce() -> io::Result<T>) -> Result<T, Halt> {
    op().map_err(Halt::Failed)
}

#[cfg(test)]
pub(super) use seam::{plan, step, Fault};

#[cfg(test)]
mod seam {
    use std::cell::RefCell;
    use std::io;

    use super::Halt;

    /// What happens to the operations of this thread's publishing, counted from 0 in the order
    /// they run.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Fault {
        /// Every operation runs.
        None,
        /// Operation `k` fails with `errno` without running; the ones after it (a rollback's)
        /// run.
        FailAt(usize, i32),
        /// Operation `k` and every one after it fail with `errno` (a disk gone read-only: the
        /// rollback fails too).
        FailFrom(usize, i32),
        /// Operation `k` runs, then the process is taken to die: nothing more runs.
        CrashAfter(usize),
    }

    struct Plan {
        fault: Fault,
        done: Vec<String>,
    }

    thread_local! {
        static PLAN: RefCell<Plan> = const {
            RefCell::new(Plan { fault: Fault::None, done: Vec::new() })
        };
    }

    /// Sets this thread's fault for the operations from now on, and returns the names of the
    /// operations run (or tried) under the previous one.
    pub(crate) fn plan(fault: Fault) -> Vec<String> {
        PLAN.with(|p| {
            let mut p = p.borrow_mut();
            p.fault = fault;
            std::mem::take(&mut p.done)
        })
    }

    pub(crate) fn step<T>(what: &str, op: impl FnOnce() -> io::Result<T>) -> Result<T, Halt> {
        let (k, fault) = PLAN.with(|p| {
            let mut p = p.borrow_mut();
            p.done.push(what.to_owned());
            (p.done.len() - 1, p.fault)
        });
        match fault {
            Fault::FailAt(at, errno) if at == k => {
                return Err(Halt::Failed(io::Error::from_raw_os_error(errno)))
            }
            Fault::FailFrom(at, errno) if k >= at => {
                return Err(Halt::Failed(io::Error::from_raw_os_error(errno)))
            }
            _ => {}
        }
        let out = op().map_err(Halt::Failed)?;
        match fault {
            Fault::CrashAfter(at) if at == k => Err(Halt::Crashed),
            _ => Ok(out),
        }
    }
}
