//! The per-sequence kernel of the lean pass and its parallel driver.

use super::finish::{chunk_partial, details, SeqRec};
use super::plan::{is_weight, LAgg, LeanPlan, Src, MAX_CRITERIA};
use crate::config::{IsLevel, IsSpec};
use crate::error::Result;
use crate::math::k3_from_log_ratio;
use crate::partial::{exchange, Acc, Exchange, Partial};
use crate::stats::{Corrections, SAFETY_BOUND};
use crate::values::{MaskOut, MaskValues, Outputs, Values, WeightsOut, MASK_BAD};
use rayon::prelude::*;

/// Slots a tile holds (inputs widened tile by tile on the stack, never as a whole).
const TILE: usize = 512;
/// Fewest slots a parallel task covers (two tasks for a 64 × 1024 step).
const TASK_SLOTS: usize = 1 << 15;

/// How the lean pass's slots form sequences.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LeanLayout<'a> {
    Padded { batch: usize, seq_len: usize },
    Packed(&'a [i64]),
}

/// The borrowed inputs of one lean call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeanInputs<'a> {
    pub(crate) layout: LeanLayout<'a>,
    pub(crate) mask: Option<MaskValues<'a>>,
    pub(crate) roll: Values<'a>,
    pub(crate) train: Values<'a>,
}

impl LeanInputs<'_> {
    /// The sequences' slot ranges, `None` when the layout or a length does not fit (the full
    /// path names the problem).
    fn ranges(&self) -> Option<Vec<(usize, usize)>> {
        let (slots, ranges): (usize, Vec<(usize, usize)>) = match self.layout {
            LeanLayout::Padded { batch, seq_len } => {
                let n = batch.checked_mul(seq_len)?;
                if self.mask?.len() != n {
                    return None;
                }
                (
                    n,
                    (0..batch)
                        .map(|b| (b * seq_len, (b + 1) * seq_len))
                        .collect(),
                )
            }
            LeanLayout::Packed(cu) => {
                if self.mask.is_some() || cu.first() != Some(&0) {
                    return None;
                }
                if cu.windows(2).any(|w| w[1] < w[0]) {
                    return None;
                }
                let n = usize::try_from(*cu.last()?).ok()?;
                (
                    n,
                    cu.windows(2)
                        .map(|w| (w[0] as usize, w[1] as usize))
                        .collect(),
                )
            }
        };
        (self.roll.len() == slots && self.train.len() == slots).then_some(ranges)
    }
}

/// One task's sequences and its disjoint views of the output buffers.
struct Task<'o> {
    seqs: std::ops::Range<usize>,
    start: usize,
    weights: Option<WeightsOut<'o>>,
    mask: MaskOut<'o>,
}

/// Runs the lean pass: this shard's decisions (metrics left empty) and its metric partial
/// (to be exchanged and finished by the caller), or `Ok(None)` when it steps aside (the caller
/// runs the full path, which overwrites every output slot). `ex` carries the batch-norm
/// factor's partial between data-parallel ranks.
pub(crate) fn run(
    plan: &LeanPlan,
    inp: &LeanInputs<'_>,
    out: &mut Outputs<'_>,
    ex: &mut dyn Exchange,
) -> Result<Option<(Corrections, Partial)>> {
    let Some(ranges) = inp.ranges() else {
        return Ok(None);
    };
    let slots = ranges.last().map_or(0, |r| r.1);
    let slots = match inp.layout {
        LeanLayout::Padded { .. } => inp.mask.map_or(slots, |m| m.len()),
        LeanLayout::Packed(_) => slots,
    };
    if out.mask.len() != slots || out.weights.as_ref().map(|w| w.len()) != plan.is.map(|_| slots) {
        return Ok(None);
    }
    let deferred = plan.is.is_some_and(|is| is.batch_normalize);
    let tasks = split_tasks(&ranges, slots, out);
    let chunks: Vec<Option<(Vec<SeqRec>, Partial)>> = tasks
        .into_par_iter()
        .map(|mut t| {
            let recs = kernel(plan, inp, &ranges, &mut t, deferred)?;
            let p = chunk_partial(plan, &recs);
            Some((recs, p))
        })
        .collect();
    let mut recs = Vec::with_capacity(ranges.len());
    let mut merged = Partial::new();
    for c in chunks {
        let Some((r, p)) = c else {
            return Ok(None);
        };
        recs.extend(r);
        merged.merge(&p)?;
    }
    let n_tok: u64 = recs.iter().map(|r| r.n).sum();
    if n_tok == 0 && ex.size() <= 1 {
        return Ok(None); // the full path's "no valid token" error
    }
    if let (Some(is), true) = (plan.is, deferred) {
        let wmean = batch_norm_factor(&mut merged, is, ex)?;
        let tasks = split_tasks(&ranges, slots, out);
        tasks
            .into_par_iter()
            .for_each(|mut t| write_normalised(plan, inp, &ranges, &recs, &mut t, wmean));
    }
    Ok(Some((details(plan, &recs), merged)))
}

/// The output buffers cut into tasks of whole sequences, each at least [`TASK_SLOTS`] slots
/// (the last takes the rest, trailing slots no sequence owns included).
fn split_tasks<'o>(
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

/// The per-token statistic `src` of the clamped log-ratio `c` (`rho = exp(c)`).
#[inline]
fn stat(src: Src, c: f64, rho: f64) -> f64 {
    match src {
        Src::K1 => -c,
        Src::K2 => 0.5 * c * c,
        Src::K3 => k3_from_log_ratio(c),
        Src::K3Verl => (rho - 1.0) + -c,
        Src::Abs => c.abs(),
        Src::Ser => c.exp_m1().abs(),
    }
}

/// One task: every sequence's record, its weights (unless `deferred`) and mask written;
/// `None` on an input the pass does not vouch for.
fn kernel(
    plan: &LeanPlan,
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    t: &mut Task<'_>,
    deferred: bool,
) -> Option<Vec<SeqRec>> {
    let mut r = [0f64; TILE];
    let mut o = [0f64; TILE];
    let mut m = [1u8; TILE];
    let mut w = [0f64; TILE];
    let mut keep = [false; TILE];
    let nc = plan.criteria.len();
    let token_is = plan.is.filter(|is| is.level == IsLevel::Token);
    let mut recs = Vec::with_capacity(t.seqs.len());
    // slots before the first sequence / between sequences: padding of nobody
    let mut cursor = t.start;
    for s in t.seqs.clone() {
        let (a, e) = ranges[s];
        if a > cursor {
            t.mask.clear(cursor - t.start, a - cursor);
            if let Some(wo) = t.weights.as_mut() {
                wo.fill(cursor - t.start, a - cursor, 0.0);
            }
        }
        let mut rec = SeqRec::default();
        let mut first = [true; MAX_CRITERIA];
        let mut k = a;
        while k < e {
            let len = TILE.min(e - k);
            inp.roll.load(k, &mut r[..len]);
            inp.train.load(k, &mut o[..len]);
            if let Some(mv) = &inp.mask {
                mv.load(k, &mut m[..len]);
            }
            for j in 0..len {
                let mj = m[j];
                if mj != 1 {
                    if mj == MASK_BAD {
                        return None;
                    }
                    w[j] = 0.0;
                    keep[j] = false;
                    continue;
                }
                let (rv, tv) = (r[j], o[j]);
                if !(rv.is_finite() && tv.is_finite()) {
                    return None;
                }
                let lr = tv - rv;
                let c = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND);
                let rho = c.exp();
                rec.n += 1;
                rec.s_train += tv;
                rec.s_roll += rv;
                rec.s_lr += lr;
                let e_lr = if lr == c { rho } else { lr.exp() };
                rec.s_k3u += (e_lr - lr) - 1.0;
                rec.s_rho2 += rho * rho;
                if let Some(is) = &token_is {
                    let wt = is_weight(is, rho);
                    w[j] = wt;
                    rec.add_token_weight(is, rho, wt);
                }
                let mut kj = true;
                for (ci, cr) in plan.criteria.iter().enumerate() {
                    let x = stat(cr.src, c, rho);
                    let cc = &mut rec.crit[ci];
                    match cr.agg {
                        LAgg::Token => {
                            if !cr.keep(x) {
                                kj = false;
                                cc.rej += 1;
                            }
                            cc.add_token(cr, x);
                        }
                        LAgg::Max => {
                            if first[ci] || x > cc.agg {
                                cc.agg = x;
                                first[ci] = false;
                            }
                        }
                        _ => cc.agg += x,
                    }
                }
                if !kj {
                    rec.n_rej_any += 1;
                }
                keep[j] = kj;
            }
            let off = k - t.start;
            t.mask.store(off, &keep[..len]);
            if let (Some(wo), Some(_), false) = (t.weights.as_mut(), &token_is, deferred) {
                wo.store(off, &w[..len]);
            }
            k += len;
        }
        // sequence decisions
        let mut seq_rejected = false;
        for (ci, cr) in plan.criteria.iter().enumerate().take(nc) {
            if cr.agg != LAgg::Token && rec.finish_seq_criterion(ci, cr) {
                seq_rejected = true;
            }
        }
        if seq_rejected {
            rec.n_rej_any = rec.n;
            t.mask.clear(a - t.start, e - a);
        }
        if let Some(is) = plan.is.filter(|is| is.level == IsLevel::Sequence) {
            let ws = rec.finish_seq_weight(&is);
            if !deferred {
                if let Some(wo) = t.weights.as_mut() {
                    write_seq_weight(inp, wo, (a, e), t.start, ws, &mut m, &mut w)?;
                }
            }
        }
        recs.push(rec);
        cursor = e;
    }
    let end = t.start + t.mask.len();
    if end > cursor {
        t.mask.clear(cursor - t.start, end - cursor);
        if let Some(wo) = t.weights.as_mut() {
            wo.fill(cursor - t.start, end - cursor, 0.0);
        }
    }
    Some(recs)
}

/// Writes a sequence's weight `ws` at its valid slots (0 at its padding).
fn write_seq_weight(
    inp: &LeanInputs<'_>,
    wo: &mut WeightsOut<'_>,
    (a, e): (usize, usize),
    start: usize,
    ws: f64,
    m: &mut [u8; TILE],
    w: &mut [f64; TILE],
) -> Option<()> {
    let mut k = a;
    while k < e {
        let len = TILE.min(e - k);
        match &inp.mask {
            Some(mv) => {
                mv.load(k, &mut m[..len]);
                for j in 0..len {
                    w[j] = if m[j] == 1 { ws } else { 0.0 };
                }
                wo.store(k - start, &w[..len]);
            }
            None => wo.fill(k - start, len, ws),
        }
        k += len;
    }
    Some(())
}

/// Batch normalisation's phase 1: the normaliser over every rank (one exchange), recorded as
/// `rollout_is_batch_norm_factor`; returns the divisor (1 when the mean is ≤ 1e-8).
fn batch_norm_factor(merged: &mut Partial, is: IsSpec, ex: &mut dyn Exchange) -> Result<f64> {
    let key = "rollout_corr/rollout_is_batch_norm_factor";
    let mut local = Partial::new();
    let norm = match is.level {
        IsLevel::Token => merged.get("rollout_corr/rollout_is_mean").cloned(),
        IsLevel::Sequence => merged.get(super::finish::SEQ_NORM).cloned(),
    };
    if let Some(n) = norm {
        local.put(key, n);
    }
    let wmean = exchange(ex, local)?.finish_one(key)?.unwrap_or(0.0);
    if wmean > 1e-8 {
        merged.put(key, Acc::Const(wmean));
        Ok(wmean)
    } else {
        merged.put(key, Acc::Const(1.0));
        Ok(1.0)
    }
}

/// Batch normalisation's phase 2: this task's weights recomputed and divided by `wmean`.
fn write_normalised(
    plan: &LeanPlan,
    inp: &LeanInputs<'_>,
    ranges: &[(usize, usize)],
    recs: &[SeqRec],
    t: &mut Task<'_>,
    wmean: f64,
) {
    let (Some(is), Some(wo)) = (plan.is, t.weights.as_mut()) else {
        return;
    };
    let mut r = [0f64; TILE];
    let mut o = [0f64; TILE];
    let mut m = [1u8; TILE];
    let mut w = [0f64; TILE];
    for s in t.seqs.clone() {
        let (a, e) = ranges[s];
        let ws = recs[s].seq_weight / wmean;
        let mut k = a;
        while k < e {
            let len = TILE.min(e - k);
            if let Some(mv) = &inp.mask {
                mv.load(k, &mut m[..len]);
            }
            if is.level == IsLevel::Token {
                inp.roll.load(k, &mut r[..len]);
                inp.train.load(k, &mut o[..len]);
            }
            for j in 0..len {
                w[j] = if m[j] != 1 {
                    0.0
                } else if is.level == IsLevel::Token {
                    let c = (o[j] - r[j]).clamp(-SAFETY_BOUND, SAFETY_BOUND);
                    is_weight(&is, c.exp()) / wmean
                } else {
                    ws
                };
            }
            wo.store(k - t.start, &w[..len]);
            k += len;
        }
    }
}
