//! The lean pass's parallel driver: the output buffers cut into tasks of whole sequences, and
//! the tasks run by the calling thread and whichever of rayon's workers start in time.

use crate::input::values::{MaskOut, Outputs, WeightsOut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Fewest slots a parallel task covers (eight tasks for a 64 × 1024 step).
const TASK_SLOTS: usize = 1 << 13;

/// One task's sequences and its disjoint views of the output buffers.
pub(super) struct Task<'o> {
    pub(super) seqs: std::ops::Range<usize>,
    pub(super) start: usize,
    pub(super) weights: Option<WeightsOut<'o>>,
    pub(super) mask: MaskOut<'o>,
}

/// `f` of every task, in order: the calling thread and up to `current_num_threads − 1` of
/// rayon's workers claim tasks from a shared counter until none is left. The call starts at
/// once and never waits for a worker to wake: a helper that starts after the calling thread
/// has run out of tasks does nothing, and the calling thread waits only for helpers that are
/// running a task. `None` for a task that was not run (never, short of a poisoned lock).
pub(super) fn run_tasks<T: Send, R: Send>(
    tasks: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Vec<Option<R>> {
    let n = tasks.len();
    let helpers = rayon::current_num_threads()
        .saturating_sub(1)
        .min(n.saturating_sub(1));
    if helpers == 0 {
        return tasks.into_iter().map(|t| Some(f(t))).collect();
    }
    let todo: Vec<Mutex<Option<T>>> = tasks.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let done: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        if let Some(t) = todo[i].lock().ok().and_then(|mut g| g.take()) {
            let r = f(t);
            if let Ok(mut g) = done[i].lock() {
                *g = Some(r);
            }
        }
    };
    helped(helpers, &work);
    done.into_iter()
        .map(|m| m.into_inner().ok().flatten())
        .collect()
}

/// Whether helpers may still start `work`, how many are running it, and the first panic of
/// a helper (raised again on the calling thread).
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, usize)>,
    idle: Condvar,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Gate {
    /// Registers a helper; false once the gate is closed.
    fn enter(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 {
            return false;
        }
        g.1 += 1;
        true
    }

    fn leave(&self) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.1 -= 1;
        if g.1 == 0 {
            self.idle.notify_all();
        }
    }

    /// Closes the gate and waits until no helper is inside.
    fn close(&self) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = true;
        while g.1 > 0 {
            g = self.idle.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Runs `work` on the calling thread and offers it to `helpers` of rayon's workers; returns
/// once the calling thread's `work` has returned and every helper that started it is done.
fn helped(helpers: usize, work: &(dyn Fn() + Sync)) {
    /// The gate closed and emptied however the calling thread leaves (a panic included):
    /// after it, no helper touches `work`.
    struct Closing(Arc<Gate>);
    impl Drop for Closing {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    /// A helper's registration, released however it leaves.
    struct Inside<'g>(&'g Gate);
    impl Drop for Inside<'_> {
        fn drop(&mut self) {
            self.0.leave();
        }
    }
    let gate = Arc::new(Gate::default());
    let closing = Closing(gate.clone());
    // SAFETY: the erased borrow is only used by a helper inside the gate (`enter` returned
    // true before `close`), and `closing` (dropped before this function returns, also on
    // unwinding) waits until no helper is inside, so `work` outlives every use.
    let shared: &'static (dyn Fn() + Sync) = unsafe { std::mem::transmute(work) };
    for _ in 0..helpers {
        let gate = gate.clone();
        rayon::spawn(move || {
            if gate.enter() {
                let _inside = Inside(&gate);
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(shared)) {
                    let mut slot = gate.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
            }
        });
    }
    work();
    drop(closing);
    let panic = gate.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

/// The output buffers cut into tasks of whole sequences, each at least [`TASK_SLOTS`] slots
/// (the last takes the rest, trailing slots no sequence owns included).
pub(super) fn split_tasks<'o>(
    ranges: &[(usize, usize)],
    slots: usize,
    out: &'o mut Outputs<'_>,
) -> Vec<Task<'o>> {
    let mut weights = out.weights.as_mut().map(|w| w.reborrow());
    let mut mask = out.mask.reborrow();
    let mut tasks = Vec::new();
    let (mut first, mut start) = (0, 0);
    for s in 0..ranges.len() {
        let end = ranges[s].1;
        let last = s + 1 == ranges.len();
        if end - start < TASK_SLOTS && !last {
            continue;
        }
        let end = if last { slots } else { end };
        let (m, rest) = mask.split_at(end - start);
        mask = rest;
        let w = weights.take().map(|w| {
            let (a, b) = w.split_at(end - start);
            weights = Some(b);
            a
        });
        tasks.push(Task {
            seqs: first..s + 1,
            start,
            weights: w,
            mask: m,
        });
        (first, start) = (s + 1, end);
    }
    if ranges.is_empty() {
        tasks.push(Task {
            seqs: 0..0,
            start: 0,
            weights,
            mask,
        });
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::run_tasks;
    use std::sync::mpsc;
    use std::time::Duration;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn every_task_runs_once_and_results_keep_their_order() {
        let got = pool(4).install(|| run_tasks((0..37u64).collect(), |i| i * i));
        let want: Vec<_> = (0..37u64).map(|i| Some(i * i)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_calling_thread_does_not_wait_for_a_helper_that_has_not_started() {
        // called from outside the pool (as from Python) while every worker is held until
        // run_tasks has returned: a driver that waits for its helpers to run never returns
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build_global();
        let n = rayon::current_num_threads();
        assert!(n >= 2, "the test needs a pool of two workers");
        let (release, held) = mpsc::channel::<()>();
        let held = std::sync::Arc::new(std::sync::Mutex::new(held));
        let (started, busy) = mpsc::channel::<()>();
        for _ in 0..n {
            let (held, started) = (held.clone(), started.clone());
            rayon::spawn(move || {
                started.send(()).unwrap();
                held.lock().unwrap().recv().ok();
            });
        }
        (0..n).for_each(|_| busy.recv().unwrap());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(run_tasks(vec![1, 2, 3], |x| x + 1)).ok());
        let got = rx.recv_timeout(Duration::from_secs(20));
        (0..n).for_each(|_| release.send(()).unwrap());
        assert_eq!(
            got.expect("run_tasks waited for a helper"),
            vec![Some(2), Some(3), Some(4)]
        );
    }

    #[test]
    fn a_panic_in_a_task_reaches_the_caller() {
        for bad in [0, 5] {
            let r = std::panic::catch_unwind(|| {
                pool(2).install(|| {
                    run_tasks((0..8).collect(), |i: i32| {
                        assert_ne!(i, bad, "task {bad}");
                        std::thread::sleep(Duration::from_millis(1));
                        i
                    })
                })
            });
            assert!(r.is_err(), "task {bad}'s panic was lost");
        }
    }
}
