//! The compute thread pool: a fixed set of workers that run one data-parallel job at a time.
//!
//! Decoding a small model issues thousands of small ops per second, so the cost of handing
//! out a job and waiting for it matters more than anything a general-purpose pool offers. A
//! job is a closure `f(thread_index, n_threads)`; the calling thread runs index 0 itself.
//! Workers spin briefly on a generation counter (the next op usually follows within
//! microseconds) and then sleep on a condition variable, so an idle pool costs no CPU.
//!
//! Each thread's share of a job runs in a `pool_job` trace span (its thread index; a job
//! that counts its pieces records `chunks`, see [`record_chunks`]), so a `--trace` file
//! shows one track per compute thread. With no trace subscriber a span is one disabled
//! callsite check per job and thread.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Polls a waiting thread spins before it starts yielding its core (tens of microseconds:
/// the next op of a decode step usually arrives sooner).
const SPIN_ITERS: u32 = 4_000;
/// Yields a worker makes after spinning before it sleeps. Yielding keeps wake-ups cheap while
/// letting other threads run when the machine is oversubscribed.
const YIELD_ITERS: u32 = 200;

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    n_threads: usize,
    /// The current job, valid while `remaining > 0`. Written only by the submitting thread
    /// while no worker reads it (between jobs).
    job: UnsafeCell<Option<*const Job>>,
    /// Bumped once per job; workers run a job when they see a new value.
    generation: AtomicU64,
    /// Workers that have not finished the current job yet.
    remaining: AtomicUsize,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the thread inside `ThreadPool::run` while all workers are
// idle (remaining == 0), and only read by workers between the generation bump (Release /
// Acquire) and their decrement of `remaining`. The pointee is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A pool of `n_threads - 1` workers plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    submit: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs jobs on `n_threads` threads (at least 1) including the caller.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            job: UnsafeCell::new(None),
            generation: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|idx| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("mica-compute-{idx}"))
                    .spawn(move || worker_loop(&s, idx))
                    .expect("spawning a compute thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            submit: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(i, n)` for every thread index `i` in `0..n` and returns when all are done.
    /// A panic in any thread is re-raised here after all threads have finished.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: &(dyn Fn(usize, usize) + Sync + '_) = &f;
        // SAFETY: erase the closure's lifetime. Workers only dereference the pointer until
        // they decrement `remaining`, and we do not return before `remaining` is zero.
        let job: *const Job = unsafe {
            std::mem::transmute::<&(dyn Fn(usize, usize) + Sync + '_), &'static Job>(job)
        };
        // SAFETY: no worker reads `job` now: the previous job finished (remaining == 0).
        unsafe { *s.job.get() = Some(job) };
        s.remaining.store(n - 1, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| {
            let _job = job_span(0).entered();
            f(0, n)
        }));
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: all workers are done with the job.
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a compute thread panicked");
        }
    }
}

fn worker_loop(s: &Shared, idx: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin first, then sleep.
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if spins < SPIN_ITERS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if spins < SPIN_ITERS + YIELD_ITERS {
                spins += 1;
                std::thread::yield_now();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-check under the lock: the submitter bumps the generation before it looks at
            // `sleepers`, so either it sees us sleeping or we see its generation.
            let g = s.generation.load(Ordering::SeqCst);
            if g == seen && !s.shutdown.load(Ordering::SeqCst) {
                let _g = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
        // SAFETY: the job pointer is valid until we decrement `remaining` (see `run`).
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            let job: &Job = unsafe { &*job };
            let span = job_span(idx);
            let _job = span.enter();
            if catch_unwind(AssertUnwindSafe(|| job(idx, s.n_threads))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

/// The trace span of thread `thread`'s share of one job.
#[inline]
fn job_span(thread: usize) -> tracing::Span {
    tracing::trace_span!("pool_job", thread, chunks = tracing::field::Empty)
}

/// Records on the running thread's `pool_job` span how many pieces of the job (row chunks of
/// a matrix product) this thread took; nothing when tracing is off. Call it from inside a
/// job given to [`ThreadPool::run`].
#[inline]
pub fn record_chunks(chunks: usize) {
    if tracing::enabled!(tracing::Level::TRACE) {
        tracing::Span::current().record("chunks", chunks);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The half-open range of `0..n` that thread `i` of `n_threads` owns, in chunks of `align`
/// items (so a thread never splits a block it must process whole).
pub fn split_range(n: usize, i: usize, n_threads: usize, align: usize) -> std::ops::Range<usize> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let per = units / n_threads;
    let extra = units % n_threads;
    let start_u = i * per + i.min(extra);
    let end_u = start_u + per + usize::from(i < extra);
    (start_u * align).min(n)..(end_u * align).min(n)
}

/// Physical cores, the default thread count (SMT siblings share the SIMD units that bound
/// this workload, so counting them only adds contention).
pub fn physical_cores() -> usize {
    #[cfg(target_os = "linux")]
    if let Some(n) = linux_physical_cores() {
        return n;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(target_os = "linux")]
fn linux_physical_cores() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut cores = std::collections::HashSet::new();
    let (mut phys, mut core) = (None, None);
    for line in info.lines() {
        let mut kv = line.splitn(2, ':');
        let k = kv.next()?.trim();
        let v = kv.next().map(str::trim);
        match k {
            "physical id" => phys = v.map(str::to_string),
            "core id" => core = v.map(str::to_string),
            "" => {
                if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                    cores.insert((p, c));
                }
            }
            _ => {}
        }
    }
    if let (Some(p), Some(c)) = (phys, core) {
        cores.insert((p, c));
    }
    let avail = std::thread::available_parallelism().ok()?.get();
    (!cores.is_empty()).then(|| cores.len().min(avail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_index_runs_once_per_job() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(3);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let count = AtomicUsize::new(0);
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn worker_panic_reaches_caller_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn split_range_covers_everything_once() {
        for n in [0, 1, 7, 64, 100, 1000] {
            for nt in 1..5 {
                for align in [1, 4, 16] {
                    let mut covered = vec![0; n];
                    for i in 0..nt {
                        for j in split_range(n, i, nt, align) {
                            covered[j] += 1;
                        }
                    }
                    assert!(
                        covered.iter().all(|&c| c == 1),
                        "n={n} nt={nt} align={align}"
                    );
                }
            }
        }
    }
}
