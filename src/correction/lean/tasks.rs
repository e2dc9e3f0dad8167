//! The lean pass's parallel driver: the output buffers cut into tasks of whole sequences, and
//! the tasks run by the calling thread and rayon's workers.

use crate::input::values::{MaskOut, Outputs, WeightsOut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Fewest slots a parallel task covers (two tasks for a 64 × 1024 step).
const TASK_SLOTS: usize = 1 << 13;

/// One task's sequences and its disjoint views of the output buffers.
pub(super) struct Task<'o> {
    pub(super) seqs: std::ops::Range<usize>,
    pub(super) start: usize,
    pub(super) weights: Option<WeightsOut<'o>>,
    pub(super) mask: MaskOut<'o>,
}

/// `f` of every task, in order: the calling thread and `current_num_threads − 1` of rayon's
/// workers claim tasks from a shared counter until none is left, so the call starts at once
/// (no waiting for a sleeping worker to wake) and a worker slowed by other work is made up
/// for by the others. `None` for a task that was not run (never, short of a poisoned lock).
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
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| work());
        }
        work();
    });
    done.into_iter()
        .map(|m| m.into_inner().ok().flatten())
        .collect()
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
