//! Splitting one product over the cores. A decode step makes ~120 products of 20-200 us
//! each with other work between them; a pool whose workers fall asleep between calls (as
//! rayon's do after a few microseconds) pays a wake-up per call, which on a virtual machine
//! costs as much as the work it shares. Here the calling thread starts at once and takes
//! chunks from a shared counter; helper threads that are awake take chunks too; a helper
//! keeps checking for work (yielding its core to anyone who wants it) for a while before it
//! parks. The call returns when every chunk is done and no helper is inside it.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle helper keeps looking for work before it parks.
const SPIN: Duration = Duration::from_micros(300);

/// One call's work: chunks `0..chunks`, claimed through `next`.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    chunks: usize,
    next: AtomicUsize,
}

impl Job<'_> {
    fn work(&self) {
        loop {
            let c = self.next.fetch_add(1, SeqCst);
            if c >= self.chunks {
                return;
            }
            (self.run)(c);
        }
    }
}

struct Pool {
    /// The current job (erased lifetime; null when none). Valid while non-null: the caller
    /// clears it and then waits until `active` is 0 before the job goes out of scope.
    job: AtomicPtr<Job<'static>>,
    /// Helpers inside the current job.
    active: AtomicUsize,
    /// Jobs posted so far: a helper that served one does not enter it again while its caller
    /// finishes (it would only find the counter spent).
    posted: AtomicUsize,
    parked: Vec<(AtomicBool, OnceLock<Thread>)>,
    /// One caller at a time (the Python side calls from one thread; others wait here).
    busy: std::sync::Mutex<()>,
}

static POOL: OnceLock<&'static Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let helpers = thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1);
        let helpers = std::env::var("SPECDEC_LINEAR_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .map_or(helpers, |n| n.saturating_sub(1));
        let p: &'static Pool = Box::leak(Box::new(Pool {
            job: AtomicPtr::new(std::ptr::null_mut()),
            active: AtomicUsize::new(0),
            posted: AtomicUsize::new(0),
            parked: (0..helpers)
                .map(|_| (AtomicBool::new(false), OnceLock::new()))
                .collect(),
            busy: std::sync::Mutex::new(()),
        }));
        for i in 0..helpers {
            let h = thread::Builder::new()
                .name(format!("specdec-linear-{i}"))
                .spawn(move || helper(p, i));
            if let Ok(h) = h {
                let _ = p.parked[i].1.set(h.thread().clone());
            }
        }
        p
    })
}

fn helper(p: &'static Pool, i: usize) {
    let mut idle_since = Instant::now();
    let mut served = 0;
    loop {
        let posted = p.posted.load(SeqCst);
        if posted != served && !p.job.load(SeqCst).is_null() {
            p.active.fetch_add(1, SeqCst);
            let job = p.job.load(SeqCst);
            if !job.is_null() {
                // SAFETY: `job` was current after `active` counted us, so its caller is
                // still waiting for `active` to drop to 0: the job outlives this use.
                let work = || unsafe { (*job).work() };
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
                    // A chunk left undone would be a wrong product, and the caller would
                    // wait for this helper forever: neither is acceptable.
                    std::process::abort();
                }
            }
            p.active.fetch_sub(1, SeqCst);
            served = posted;
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < SPIN {
            thread::yield_now();
            continue;
        }
        let flag = &p.parked[i].0;
        flag.store(true, SeqCst);
        if p.job.load(SeqCst).is_null() {
            thread::park(); // `run` unparks us when it posts a job; spurious wake-ups loop
        }
        flag.store(false, SeqCst);
        idle_since = Instant::now();
    }
}

/// Helper threads besides the caller.
pub fn helpers() -> usize {
    pool().parked.len()
}

/// `run(c)` for every chunk `c` in `0..chunks`, on the calling thread and any helpers.
pub fn run(chunks: usize, run: &(dyn Fn(usize) + Sync)) {
    let p = pool();
    if chunks <= 1 || p.parked.is_empty() {
        (0..chunks).for_each(run);
        return;
    }
    let _guard = p.busy.lock().unwrap_or_else(|e| e.into_inner());
    let job = Job {
        run,
        chunks,
        next: AtomicUsize::new(0),
    };
    let ptr: *const Job<'_> = &job;
    p.job.store(ptr.cast_mut().cast(), SeqCst);
    // Dropped before `job`, also if a chunk panics here: no helper may see the job after.
    let _retire = Retire(p);
    p.posted.fetch_add(1, SeqCst);
    for (flag, t) in &p.parked {
        if flag.load(SeqCst) {
            if let Some(t) = t.get() {
                t.unpark();
            }
        }
    }
    job.work();
}

/// Withdraws the current job and waits until no helper is inside it.
struct Retire(&'static Pool);

impl Drop for Retire {
    fn drop(&mut self) {
        self.0.job.store(std::ptr::null_mut(), SeqCst);
        while self.0.active.load(SeqCst) != 0 {
            std::hint::spin_loop(); // a helper finishing its last chunk
        }
    }
}

/// A raw output pointer shared by the chunks of one [`run`]: each chunk writes only its own
/// range of the buffer (the caller's contract), so no two threads touch one value.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: the chunks of one run write disjoint ranges of one buffer (callers' contract).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer `i` values on (a method, so closures capture the whole `Send` wrapper).
    pub(crate) fn add(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
