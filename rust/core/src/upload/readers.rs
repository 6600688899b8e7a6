//! A ring's reader threads: started on its first run that needs them, parked between runs, and
//! ended with the ring. A load then pays no thread start, no context entry and no NUMA placement
//! (the CUDA target makes its context current on a reader thread once, for the thread's life:
//! see [`on_reader_thread`]); measured on the H200, the spawns and context entries of 8 readers
//! per load were part of a fixed cost of ~4.5 ms a load (docs/gpu.md).
//!
//! [`Readers::scope`] runs a borrowed closure on `n` of the threads while the calling thread
//! runs its own part, and returns only once every thread is done with the closure, so that the
//! closure may borrow the caller's stack (the files, the plan, the target), as
//! `std::thread::scope` allows, without a spawn per run.
//!
//! A process that forks keeps no threads in the child: a ring used in the child starts new ones
//! (the parent's are left alone).

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

thread_local! {
    static READER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is one of a ring's reader threads (which live as long as their
/// ring and run nothing else): a target may then keep per-thread state (a current CUDA context,
/// a CPU placement) for the thread's life instead of setting it up and undoing it every run.
pub fn on_reader_thread() -> bool {
    READER.with(Cell::get)
}

/// The closure of a run, its lifetime erased: [`Readers::scope`] waits for every use of it to
/// end before returning, so it never outlives what it borrows.
#[derive(Clone, Copy)]
struct Work(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the closure is `Sync`, and `scope` keeps it alive until every thread is done with it.
unsafe impl Send for Work {}

#[derive(Default)]
struct State {
    work: Option<Work>,
    /// Calls of the current work handed out, wanted, and finished.
    taken: usize,
    wanted: usize,
    finished: usize,
    /// The first panic of a call of the current work, passed on by `scope`.
    panic: Option<Box<dyn Any + Send>>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Work was posted, or the threads are to end.
    posted: Condvar,
    /// A call finished.
    finished: Condvar,
}

impl Shared {
    /// The state, locked. What the threads write while running the work (the staging buffers'
    /// bytes, errors) is handed to the caller through this lock, which a C++ program's
    /// ThreadSanitizer cannot see: announced to it (`crate::tsan`).
    fn lock(&self) -> Locked<'_> {
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        crate::tsan::acquire(&self.state);
        Locked {
            guard: Some(guard),
            token: &self.state,
        }
    }

    fn wait<'a>(&self, cv: &Condvar, mut locked: Locked<'a>) -> Locked<'a> {
        let guard = locked.guard.take().expect("held");
        crate::tsan::release(&self.state);
        let guard = cv.wait(guard).unwrap_or_else(|p| p.into_inner());
        crate::tsan::acquire(&self.state);
        locked.guard = Some(guard);
        locked
    }
}

struct Locked<'a> {
    guard: Option<MutexGuard<'a, State>>,
    token: &'a Mutex<State>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard.as_ref().expect("held")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard.as_mut().expect("held")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if self.guard.is_some() {
            crate::tsan::release(self.token);
        }
    }
}

struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The process that started the threads.
    pid: u32,
}

/// A ring's reader threads (none until its first run).
pub(super) struct Readers {
    pool: Mutex<Option<Pool>>,
}

impl Readers {
    pub(super) fn new() -> Readers {
        Readers {
            pool: Mutex::new(None),
        }
    }

    /// Threads started so far.
    pub(super) fn started(&self) -> usize {
        let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.as_ref()
            .filter(|p| p.pid == std::process::id())
            .map_or(0, |p| p.threads.len())
    }

    /// Runs `work(0)`, …, `work(n - 1)`, each once, on the reader threads (started as needed),
    /// while the calling thread runs `main`; returns `main`'s result once every call of `work`
    /// has returned. A panic of `work` is passed on once all have returned; a panic of `main`
    /// too, after waiting for them. One scope at a time (the ring's run lock sees to that).
    /// Fewer threads than `n` may run the calls (when no more could be started); none at all is
    /// the error of the failed start, and nothing runs.
    pub(super) fn scope<R>(
        &self,
        n: usize,
        work: &(dyn Fn(usize) + Sync),
        main: impl FnOnce() -> R,
    ) -> std::io::Result<R> {
        let shared = self.threads_for(n)?;
        // SAFETY: only the lifetime is erased; `Join` below waits (even while unwinding) until
        // every call of the work has returned, before this function returns.
        let erased: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute(work as *const (dyn Fn(usize) + Sync)) };
        {
            let mut st = shared.lock();
            *st = State {
                work: Some(Work(erased)),
                wanted: n,
                ..State::default()
            };
        }
        shared.posted.notify_all();
        let join = Join { shared: &shared };
        let result = catch_unwind(AssertUnwindSafe(main));
        let panic = join.wait();
        match (result, panic) {
            (Err(p), _) | (Ok(_), Some(p)) => resume_unwind(p),
            (Ok(r), None) => Ok(r),
        }
    }

    /// The pool, with at least `n` threads where they could be started (at least one).
    fn threads_for(&self, n: usize) -> std::io::Result<Arc<Shared>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if pool.as_ref().is_some_and(|p| p.pid != pid) {
            // A forked child: the threads are the parent's. Leak the handles (joining them
            // here would wait for threads this process does not have).
            if let Some(old) = pool.take() {
                std::mem::forget(old.threads);
            }
        }
        let pool = pool.get_or_insert_with(|| Pool {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                posted: Condvar::new(),
                finished: Condvar::new(),
            }),
            threads: Vec::new(),
            pid,
        });
        while pool.threads.len() < n {
            let shared = pool.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("safetensors-reader".into())
                .spawn(move || worker(&shared));
            match spawned {
                Ok(handle) => pool.threads.push(handle),
                // Fewer threads than asked: the calls queue on those there are.
                Err(e) if pool.threads.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(pool.shared.clone())
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        let Some(pool) = self
            .pool
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        if pool.pid != std::process::id() {
            std::mem::forget(pool.threads);
            return;
        }
        pool.shared.lock().shutdown = true;
        pool.shared.posted.notify_all();
        for t in pool.threads {
            let _ = t.join();
        }
    }
}

/// Waits for every call of a scope's work, also when `main` unwinds.
struct Join<'a> {
    shared: &'a Shared,
}

impl Join<'_> {
    /// Every call finished; the first panic of one of them.
    fn wait(self) -> Option<Box<dyn Any + Send>> {
        let panic = self.finish();
        std::mem::forget(self);
        panic
    }

    fn finish(&self) -> Option<Box<dyn Any + Send>> {
        let mut st = self.shared.lock();
        loop {
            if st.finished == st.wanted {
                st.work = None;
                return st.panic.take();
            }
            st = self.shared.wait(&self.shared.finished, st);
        }
    }
}

impl Drop for Join<'_> {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

fn run_one(work: Work, i: usize) -> std::thread::Result<()> {
    // SAFETY: `scope` keeps the closure alive until this call has been counted as finished.
    let f = unsafe { &*work.0 };
    catch_unwind(AssertUnwindSafe(|| f(i)))
}

fn finish_one(st: &mut State, outcome: std::thread::Result<()>) {
    if let Err(p) = outcome {
        st.panic.get_or_insert(p);
    }
    st.finished += 1;
}

fn worker(shared: &Shared) {
    READER.with(|r| r.set(true));
    let mut st = shared.lock();
    loop {
        if st.shutdown {
            return;
        }
        match st.work {
            Some(work) if st.taken < st.wanted => {
                let i = st.taken;
                st.taken += 1;
                drop(st);
                let outcome = run_one(work, i);
                st = shared.lock();
                finish_one(&mut st, outcome);
                if st.finished == st.wanted {
                    shared.finished.notify_all();
                }
            }
            _ => st = shared.wait(&shared.posted, st),
        }
    }
}
