//! A spinning team of threads for the many short parallel regions of a forward pass.
//!
//! A decode step runs several hundred parallel regions (the projections, norms and attention
//! of every layer) of a few to a few hundred microseconds each. Through rayon each region wakes
//! sleeping workers (a futex wake, costly in a VM) and the caller then sleeps until they are
//! done; measured on SmolLM2-135M, 2 threads ran decode only 1.2x faster than 1 (llama.cpp:
//! 1.74x). [`with_team`] takes every thread of rayon's pool for the duration of one evaluation
//! (`rayon::broadcast`): the caller's closure runs on one of them (the leader), the others spin
//! on one atomic word and take tasks of each region [`for_each`] publishes, like ggml's
//! threadpool during a graph computation. Outside a team, [`for_each`] is rayon's parallel loop.
//!
//! Protocol: one `AtomicU64` holds (region generation, task count, next task index). The leader
//! writes the region's closure, then publishes a new word; a thread claims task `i` by a CAS
//! from `(g, n, i)` to `(g, n, i + 1)`, and only then reads the closure: a region cannot end
//! (and the leader cannot reuse the slot) before every claimed task has counted itself done.
//! The leader never waits for a thread to join, only for claimed tasks to finish, so a team
//! whose other threads are busy elsewhere runs its regions alone rather than deadlocking.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

use rayon::prelude::*;

const IDX_BITS: u32 = 20;
const MAX_TASKS: usize = (1 << IDX_BITS) - 1;
const MASK: u64 = (1 << IDX_BITS) - 1;

fn pack(gen_: u64, n: usize, i: usize) -> u64 {
    (gen_ << (2 * IDX_BITS)) | ((n as u64) << IDX_BITS) | i as u64
}
fn tasks(v: u64) -> usize {
    ((v >> IDX_BITS) & MASK) as usize
}
fn index(v: u64) -> usize {
    (v & MASK) as usize
}

type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Team {
    word: AtomicU64,
    /// Points at the leader's `Job` of the current region.
    job: AtomicPtr<()>,
    done: AtomicUsize,
    quit: AtomicBool,
    panicked: AtomicBool,
}

impl Team {
    /// Claims and runs one task of the published region; false when there is none.
    fn work_one(&self) -> bool {
        let v = self.word.load(Acquire);
        let i = index(v);
        if i >= tasks(v) || self.word.compare_exchange_weak(v, v + 1, AcqRel, Relaxed).is_err() {
            return false;
        }
        // SAFETY: the claim succeeded, so the region is live: the leader's `Job` (written
        // before the word was published) stays in place until this task counts itself done.
        let job: Job = unsafe { *(self.job.load(Acquire) as *const Job) };
        if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
            self.panicked.store(true, Release);
        }
        self.done.fetch_add(1, Release);
        true
    }

    /// A non-leader thread: spin for tasks until the leader is done.
    fn serve(&self) {
        IN_TASK.with(|t| t.set(true));
        let mut idle = 0u32;
        while !self.quit.load(Acquire) {
            if self.work_one() {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < 1 << 16 {
                std::hint::spin_loop();
            } else {
                // A long serial stretch of the leader, or an oversubscribed machine.
                std::thread::yield_now();
            }
        }
        IN_TASK.with(|t| t.set(false));
    }

    /// The leader: run `f(0..n)` with whoever is spinning, then wait for the claimed tasks.
    fn run(&self, gen_: &Cell<u64>, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let job: Job = f;
        self.job.store(&job as *const Job as *mut (), Release);
        self.done.store(0, Relaxed);
        gen_.set(gen_.get() + 1);
        self.word.store(pack(gen_.get(), n, 0), Release);
        IN_TASK.with(|t| t.set(true));
        while self.work_one() {}
        IN_TASK.with(|t| t.set(false));
        while self.done.load(Acquire) < n {
            std::hint::spin_loop();
        }
        if self.panicked.swap(false, AcqRel) {
            resume_unwind(Box::new("a task of a parallel region panicked"));
        }
    }
}

thread_local! {
    /// The team this thread leads, and its region counter.
    static LEADING: Cell<Option<(*const Team, *const Cell<u64>)>> = const { Cell::new(None) };
    /// This thread is running a task of a team's region (nested regions run serially).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every thread of rayon's pool as a spinning team (see the module docs), so the
/// [`for_each`] regions inside it cost a store and a few cache-line transfers instead of
/// thread wake-ups. The other threads spin (yielding after a while) until `f` returns: use it
/// around one evaluation, not around idle time. Inline when already leading a team or with a
/// pool of one thread.
pub fn with_team<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if LEADING.with(|l| l.get().is_some()) || IN_TASK.with(|t| t.get()) || rayon::current_num_threads() < 2 {
        return f();
    }
    let team = Team {
        word: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        done: AtomicUsize::new(0),
        quit: AtomicBool::new(false),
        panicked: AtomicBool::new(false),
    };
    let f = Mutex::new(Some(f));
    let out: Mutex<Option<std::thread::Result<R>>> = Mutex::new(None);
    let leader_taken = AtomicBool::new(false);
    rayon::broadcast(|_| {
        // The first thread to arrive leads; the others serve until it is done.
        if leader_taken.swap(true, AcqRel) {
            team.serve();
            return;
        }
        let f = f.lock().map(|mut g| g.take()).ok().flatten().expect("the leader runs f once");
        let gen_ = Cell::new(0u64);
        LEADING.with(|l| l.set(Some((&team as *const Team, &gen_ as *const Cell<u64>))));
        let r = catch_unwind(AssertUnwindSafe(f));
        LEADING.with(|l| l.set(None));
        team.quit.store(true, Release);
        if let Ok(mut o) = out.lock() {
            *o = Some(r);
        }
    });
    match out.into_inner().ok().flatten().expect("the leader stored its result") {
        Ok(r) => r,
        Err(p) => resume_unwind(p),
    }
}

/// `f(i)` for every `i < n`, in parallel: on the current team when this thread leads one,
/// serially inside a team's task or with a pool of one thread (handing each region to rayon's
/// single worker would only add two thread switches per region: `--threads 1` decoded SmolLM2
/// ~10% slower in the kernel's scheduler), through rayon otherwise.
pub fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    if n <= 1 || IN_TASK.with(|t| t.get()) || rayon::current_num_threads() < 2 {
        (0..n).for_each(f);
        return;
    }
    match LEADING.with(|l| l.get()) {
        // SAFETY: the pointers are set by `with_team` on this thread for as long as `f` runs
        // there, and this call happens inside it.
        Some((team, gen_)) => {
            // Contiguous ranges, ~8 per thread: one claim (a CAS on a shared line) per range,
            // and slack for a thread the VM delays.
            let per = n.div_ceil(rayon::current_num_threads() * 8).max(n.div_ceil(MAX_TASKS));
            let ranges = n.div_ceil(per);
            let g = |t: usize| (t * per..((t + 1) * per).min(n)).for_each(&f);
            unsafe { (*team).run(&*gen_, ranges, &g) }
        }
        None => {
            let f = &f;
            (0..n).into_par_iter().for_each(f)
        }
    }
}

/// `f(i, chunk)` for the `i`-th chunk of `size` elements of `data` (the last may be shorter),
/// in parallel like [`for_each`].
pub fn chunks_mut<T: Send>(data: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let size = size.max(1);
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    for_each(len.div_ceil(size), |i| {
        #[allow(clippy::redundant_locals)]
        let base = base;
        let s = i * size;
        // SAFETY: chunk `i` is `[s, min(s + size, len))` of `data`, disjoint from every other
        // chunk, and `data` is borrowed mutably for the whole call.
        f(i, unsafe { std::slice::from_raw_parts_mut(base.0.add(s), (len - s).min(size)) })
    });
}

/// [`chunks_mut`] with a fallible `f`: the first error (in completion order) is returned once
/// every chunk has run.
pub fn try_chunks_mut<T: Send, E: Send>(
    data: &mut [T],
    size: usize,
    f: impl Fn(usize, &mut [T]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let first = Mutex::new(None);
    chunks_mut(data, size, |i, c| {
        if let Err(e) = f(i, c)
            && let Ok(mut g) = first.lock()
        {
            g.get_or_insert(e);
        }
    });
    match first.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: used only to hand disjoint chunks of one `&mut [T]` (T: Send) to the tasks.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

/// Whether this thread leads a team (tests).
pub fn leading() -> bool {
    LEADING.with(|l| l.get().is_some())
}
