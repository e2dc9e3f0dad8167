//! M2PO in the fused pass: each task's active values read first, in batch order; the
//! batch-global decision made once from them (`correction::m2po::decide`, as the full path
//! makes it); then the rule applied in every tile as a token criterion.

use super::inputs::{Chunk, LeanInputs, CHUNK};
use super::tasks::run_tasks;
use crate::correction::m2po::{active_sign, decide, M2poTask, Summary};
use crate::error::Result;
use crate::partial::Exchange;
use std::ops::Range;

/// The step's decision as each task (`spans`: its sequences) applies it, and the summary its
/// metrics report; `None` where the pass steps aside (as its tiles would: a mask value other
/// than 0/1, a non-finite valid log-prob; no advantages, which the full path names).
pub(super) fn plan_tasks(
    (ci, tau): (usize, f64),
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    spans: Vec<Range<usize>>,
    ex: &mut dyn Exchange,
) -> Result<Option<(Vec<M2poTask>, Summary)>> {
    let values = run_tasks(spans, |seqs| task_values(inp, ranges, seqs));
    let Some(values) = values
        .into_iter()
        .collect::<Option<Option<Vec<_>>>>()
        .flatten()
    else {
        return Ok(None);
    };
    let local: Vec<f64> = values.concat();
    let d = decide(&local, tau, ex)?;
    let mut tie = d.ties_before;
    let tasks = values
        .iter()
        .map(|v| {
            let t = M2poTask {
                ci,
                tau,
                cut: d.cut,
                tie,
            };
            tie += d.cut.ties_in(v);
            t
        })
        .collect();
    Ok(Some((tasks, d.summary)))
}

/// The active values (`lr²`) of the sequences `seqs`, in batch order.
fn task_values(
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    seqs: Range<usize>,
) -> Option<Vec<f64>> {
    let adv = inp.adv.as_ref()?;
    let mut c = Chunk::new();
    let mut kept = [0f64; CHUNK];
    let mut out = Vec::new();
    for &(start, end) in &ranges[seqs] {
        for k in (start..end).step_by(CHUNK) {
            let len = CHUNK.min(end - k);
            c.load(inp, adv, k, len);
            // the active values packed to the front of `kept`, branch-free
            let (mut n, mut bad) = (0, false);
            for j in 0..len {
                let (valid, b) = c.check(j);
                bad |= b;
                let lr = c.o[j] - c.r[j];
                kept[n] = lr * lr;
                n += usize::from(valid & active_sign(c.a[j], lr));
            }
            if bad {
                return None;
            }
            out.extend_from_slice(&kept[..n]);
        }
    }
    Some(out)
}
