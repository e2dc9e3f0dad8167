//! The lean pass's per-sequence records, and the metric partial and decisions built from
//! them: the same accumulators, under the same keys, as `correction::head` puts.

use crate::config::IsLevel;
use crate::correction::plan::{Plan, MAX_LEAN_CRITERIA};
use crate::engine::plan::{MaskAgg, MaskCriterion, MaskIs, MaskSource};
use crate::error::Result;
use crate::metrics::ctx::{f32_frac, vmax, vmin};
use crate::metrics::diag::{DiagAcc, Feeds};
use crate::metrics::diagnostics::{group_metrics, length_metrics};
use crate::metrics::trmask::{seq_histograms, trmask_metrics};
use crate::metrics::verl::{
    is_sequence_fractions, is_spread, is_token_fractions, offpolicy_from_sums, seq_mean_metrics,
    OffPolicySums,
};
use crate::partial::{exchange, Acc, Empty, Exchange, FracMode, Partial, Sum};
use crate::stats::{Corrections, SAFETY_BOUND};

/// The sequence-IS batch normaliser's partial (an internal key, not a metric).
pub(crate) const SEQ_NORM: &str = "#lean_seq_is_norm";

/// One criterion's sums over one sequence.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CritRec {
    /// Σ or max of the statistic (sequence criteria).
    pub(crate) agg: f64,
    /// Σ of the per-token value verl's metrics read (the statistic, or the sequence's value
    /// on each of its tokens).
    pub(crate) pts: f64,
    pub(crate) tmax: f64,
    pub(crate) tmin: f64,
    pub(crate) hi: u64,
    pub(crate) lo: u64,
    /// Σ and Σ² of the value clamped to the thresholds (verl's std, which cancels: so
    /// compensated).
    pub(crate) sc1: Sum,
    pub(crate) sc2: Sum,
    /// Valid tokens this criterion rejected.
    pub(crate) rej: u64,
    /// Σ of LN-TRM's token weights `w_t` (its statistic is Σ |ρ_t − 1|·w_t / Σ w_t).
    pub(crate) wsum: f64,
    /// The sequence's statistic (sequence criteria) or rejected fraction (token criteria).
    pub(crate) value: f64,
}

impl Default for CritRec {
    fn default() -> Self {
        CritRec {
            agg: 0.0,
            pts: 0.0,
            tmax: f64::NEG_INFINITY,
            tmin: f64::INFINITY,
            hi: 0,
            lo: 0,
            sc1: Sum::default(),
            sc2: Sum::default(),
            rej: 0,
            wsum: 0.0,
            value: 0.0,
        }
    }
}

/// One sequence's sums (valid tokens only; `tile` adds them in lanes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeqRec {
    pub(crate) n: u64,
    pub(crate) s_train: f64,
    pub(crate) s_roll: f64,
    pub(crate) s_lr: f64,
    /// Σ advantage over the valid tokens (OPSM's sign).
    pub(crate) s_adv: f64,
    pub(crate) s_k3u: f64,
    pub(crate) s_rho2: f64,
    pub(crate) s_w: f64,
    pub(crate) w_max: f64,
    pub(crate) w_min: f64,
    pub(crate) s_raw: f64,
    /// Σ and Σ² of the clipped weights (verl's std and ESS, which cancel: compensated).
    pub(crate) s_wc: Sum,
    pub(crate) s_wc2: Sum,
    pub(crate) is_hi: u64,
    pub(crate) is_lo: u64,
    pub(crate) is_oob: u64,
    /// Sequence IS: the sequence's weight (before batch normalisation).
    pub(crate) seq_weight: f64,
    /// Valid tokens some criterion rejected (the token veto aside).
    pub(crate) n_rej_any: u64,
    /// The smallest ρ_t of the valid tokens (the token veto's statistic; +∞ for none).
    pub(crate) rho_min: f64,
    /// The token veto rejected the sequence.
    pub(crate) vetoed: bool,
    pub(crate) crit: [CritRec; MAX_LEAN_CRITERIA],
}

impl Default for SeqRec {
    fn default() -> Self {
        SeqRec {
            n: 0,
            s_train: 0.0,
            s_roll: 0.0,
            s_lr: 0.0,
            s_adv: 0.0,
            s_k3u: 0.0,
            s_rho2: 0.0,
            s_w: 0.0,
            w_max: f64::NEG_INFINITY,
            w_min: f64::INFINITY,
            s_raw: 0.0,
            s_wc: Sum::default(),
            s_wc2: Sum::default(),
            is_hi: 0,
            is_lo: 0,
            is_oob: 0,
            seq_weight: 0.0,
            n_rej_any: 0,
            rho_min: f64::INFINITY,
            vetoed: false,
            crit: [CritRec::default(); MAX_LEAN_CRITERIA],
        }
    }
}

impl SeqRec {
    /// Valid tokens the final mask drops: every one of a vetoed sequence, else those some
    /// criterion rejected.
    pub(crate) fn n_dropped(&self) -> u64 {
        if self.vetoed {
            self.n
        } else {
            self.n_rej_any
        }
    }

    /// Sequence IS: the weight of every valid token, `exp(clamp(Σ lr))` through TIS / IcePop.
    pub(crate) fn finish_seq_weight(&mut self, is: &MaskIs) -> f64 {
        let raw = self.s_lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();
        let w = is.weight(raw);
        let n = self.n as f64;
        self.seq_weight = w;
        if self.n > 0 {
            self.s_w = n * w;
            self.w_max = w;
            self.w_min = w;
            self.s_raw = n * raw;
            let wc = w.clamp(0.0, is.upper);
            self.s_wc = times(n, wc);
            self.s_wc2 = times(n, wc * wc);
            if let Some(l) = is.lower {
                self.is_oob = if raw < l || raw > is.upper { self.n } else { 0 };
            }
        }
        w
    }

    /// A sequence criterion's value and decision; true when it rejects the sequence.
    pub(crate) fn finish_seq_criterion(&mut self, ci: usize, c: &MaskCriterion) -> bool {
        let n = self.n as f64;
        let r = &mut self.crit[ci];
        let v = match c.agg {
            MaskAgg::Sum => r.agg,
            MaskAgg::MeanVerl => r.agg / (n + 1e-8),
            MaskAgg::Mean if self.n > 0 => r.agg / n,
            MaskAgg::Max if self.n > 0 => r.agg,
            // LN-TRM: Σ |ρ_t − 1|·w_t / Σ w_t (0 without weight)
            MaskAgg::WeightedMean(_) if matches!(c.source, MaskSource::SerWeighted(_)) => {
                match r.wsum > 0.0 {
                    true => r.agg / r.wsum,
                    false => 0.0,
                }
            }
            // OPSM: the mean of −lr over a sequence with a negative advantage, else 0 (the
            // full path's weighted mean of its value and weight columns, the same bits)
            MaskAgg::WeightedMean(_) if self.n > 0 && self.s_adv < 0.0 => -self.s_lr / n,
            _ => 0.0,
        };
        r.set_seq_value(n, v, c.lower, c.upper);
        let rejected = self.n > 0 && !c.keep(v);
        r.rej = if rejected { self.n } else { 0 };
        rejected
    }
}

impl CritRec {
    /// A sequence criterion's statistic `v` over its sequence's `n` valid tokens, as verl's
    /// metrics read it: the value on each token, clamped to `[lower or 0, upper]` for the std.
    pub(crate) fn set_seq_value(&mut self, n: f64, v: f64, lower: Option<f64>, upper: f64) {
        self.value = v;
        self.pts = n * v;
        let sc = v.max(lower.unwrap_or(0.0)).min(upper);
        self.sc1 = times(n, sc);
        self.sc2 = times(n, sc * sc);
    }
}

/// `n · x` exactly, as a compensated sum (the product and its FMA rounding error).
fn times(n: f64, x: f64) -> Sum {
    let p = n * x;
    let mut s = Sum::default();
    s.add(p);
    if p.is_finite() {
        s.add(n.mul_add(x, -p));
    }
    s
}

fn merged(v: impl Iterator<Item = Sum>) -> Sum {
    let mut s = Sum::default();
    v.for_each(|x| s.merge(x));
    s
}

fn sum(v: impl Iterator<Item = f64>) -> Sum {
    Sum::of(v)
}

fn masked(s: Sum, n: u64) -> Acc {
    Acc::masked_mean(s, n as usize)
}

fn count_sum(v: impl Iterator<Item = u64>) -> Sum {
    Sum::of(v.map(|k| k as f64))
}

/// The metric partial of one task's sequences.
pub(crate) fn chunk_partial(plan: &Plan, recs: &[SeqRec]) -> Partial {
    let mut m = Partial::new();
    let n: u64 = recs.iter().map(|r| r.n).sum();
    m.put("#valid_tokens", Acc::Count(n));
    let row = |s: f64, r: &SeqRec| s / (r.n as f64 + 1e-8);
    // ---- compute_offpolicy_metrics ----
    let mt: Vec<f64> = recs.iter().map(|r| row(r.s_train, r)).collect();
    let mr: Vec<f64> = recs.iter().map(|r| row(r.s_roll, r)).collect();
    crate::metrics::verl::ppl_metrics(&mt, &mr, &mut m);
    offpolicy_from_sums(
        OffPolicySums {
            neg_lr: sum(recs.iter().map(|r| -r.s_lr)),
            k3u: sum(recs.iter().map(|r| r.s_k3u)),
            rho2: sum(recs.iter().map(|r| r.s_rho2)),
            n,
        },
        recs.iter().map(|r| r.s_lr),
        &mut m,
    );
    let crits: Vec<CritMetric> = (0..plan.criteria.len())
        .map(|ci| CritMetric::of(plan, ci))
        .collect();
    correction_metrics(&mut m, plan.is.as_ref(), &crits, recs, &|ci, s| {
        recs[s].crit[ci]
    });
    m
}

/// How one criterion's metrics read its records: its option name, sequence or token, and the
/// thresholds its values are compared with.
pub(crate) struct CritMetric<'a> {
    pub(crate) name: &'a str,
    pub(crate) seq: bool,
    pub(crate) lower: Option<f64>,
    pub(crate) upper: f64,
}

impl<'a> CritMetric<'a> {
    /// Criterion `ci` of `plan`.
    pub(crate) fn of(plan: &'a Plan, ci: usize) -> Self {
        let (lower, upper) = plan.metric_bounds[ci];
        CritMetric {
            name: &plan.names[ci],
            seq: plan.criteria[ci].agg != MaskAgg::Token,
            lower,
            upper,
        }
    }
}

/// verl's IS metrics (`is`), each criterion's `rollout_rs_*` metrics (criterion `ci` of
/// sequence `s` is `crit(ci, s)`) and the any-criterion masked fractions, from the
/// per-sequence records: the one definition both the fused pass and the full path
/// (`correction::head`) finish.
pub(crate) fn correction_metrics(
    m: &mut Partial,
    is: Option<&MaskIs>,
    crits: &[CritMetric],
    recs: &[SeqRec],
    crit: &dyn Fn(usize, usize) -> CritRec,
) {
    let p = |k: &str| format!("rollout_corr/{k}");
    let n: u64 = recs.iter().map(|r| r.n).sum();
    if let Some(is) = is {
        is_metrics(m, is, recs, n);
    }
    for (ci, c) in crits.iter().enumerate() {
        criterion_metrics(m, c, recs, &|s| crit(ci, s), n);
    }
    if !crits.is_empty() {
        m.put(
            p("rollout_rs_masked_fraction"),
            masked(count_sum(recs.iter().map(|r| r.n_rej_any)), n),
        );
        let k = recs.iter().filter(|r| r.n_rej_any > 0).count();
        m.put(p("rollout_rs_seq_masked_fraction"), f32_frac(k, recs.len()));
    }
}

fn is_metrics(m: &mut Partial, is: &MaskIs, recs: &[SeqRec], n: u64) {
    let p = |k: &str| format!("rollout_corr/{k}");
    let b = recs.len();
    let upper = is.upper;
    let lower = is.lower.unwrap_or(1.0 / upper);
    m.put(
        p("rollout_is_mean"),
        masked(sum(recs.iter().map(|r| r.s_w)), n),
    );
    match is.level {
        IsLevel::Sequence => {
            let sl: Vec<f64> = recs.iter().map(|r| r.s_lr).collect();
            is_sequence_fractions(&sl, upper, lower, m);
        }
        IsLevel::Token => {
            let valid = || recs.iter().filter(|r| r.n > 0);
            is_token_fractions(
                count_sum(recs.iter().map(|r| r.is_hi)),
                count_sum(recs.iter().map(|r| r.is_lo)),
                n,
                vmax(valid().map(|r| r.w_max)),
                vmin(valid().map(|r| r.w_min)),
                m,
            );
        }
    }
    is_spread(
        merged(recs.iter().map(|r| r.s_wc)),
        merged(recs.iter().map(|r| r.s_wc2)),
        n,
        m,
    );
    let seq_mean: Vec<f64> = recs.iter().map(|r| r.s_w / (r.n as f64 + 1e-8)).collect();
    seq_mean_metrics(m, &|k| p(&format!("rollout_is_{k}")), &seq_mean, 1.0);
    let raw_seq = || recs.iter().map(|r| r.s_raw / (r.n as f64 + 1e-8));
    let hi = raw_seq().filter(|&x| x > upper).count();
    let lo = raw_seq().filter(|&x| x < lower).count();
    m.put(p("rollout_is_seq_fraction_high"), f32_frac(hi, b));
    m.put(p("rollout_is_seq_fraction_low"), f32_frac(lo, b));
    if is.lower.is_some() {
        let oob = count_sum(recs.iter().map(|r| r.is_oob));
        m.put(p("rollout_is_oob_ratio"), masked(oob, n));
    }
    if is.batch_normalize && is.level == IsLevel::Sequence {
        let valid: Vec<f64> = (0..b)
            .filter(|&i| recs[i].n > 0)
            .map(|i| seq_mean[i])
            .collect();
        m.put(SEQ_NORM, Acc::mean(&valid, Empty::Zero));
    }
}

fn criterion_metrics(
    m: &mut Partial,
    c: &CritMetric,
    recs: &[SeqRec],
    cr: &dyn Fn(usize) -> CritRec,
    n: u64,
) {
    let pre = format!("rollout_corr/rollout_rs_{}", c.name);
    let is_seq = c.seq;
    let valid = || recs.iter().enumerate().filter(|(_, r)| r.n > 0);
    let valid_vals: Vec<f64> = valid()
        .map(|(s, r)| {
            if is_seq {
                cr(s).value
            } else {
                cr(s).pts / (r.n as f64 + 1e-8)
            }
        })
        .collect();
    let nv = valid_vals.len();
    let upper = c.upper;
    let thr_l = c.lower.unwrap_or(0.0);
    let count = |f: &dyn Fn(f64) -> bool| valid_vals.iter().filter(|&&x| f(x)).count();
    m.put(
        format!("{pre}_mean"),
        masked(sum((0..recs.len()).map(|s| cr(s).pts)), n),
    );
    if is_seq {
        m.put(format!("{pre}_max"), vmax(valid_vals.iter().copied()));
        m.put(format!("{pre}_min"), vmin(valid_vals.iter().copied()));
        m.put(
            format!("{pre}_fraction_high"),
            f32_frac(count(&|x| x > upper), nv),
        );
        let lo = if c.lower.is_some() {
            f32_frac(count(&|x| x < thr_l), nv)
        } else {
            Acc::Const(0.0)
        };
        m.put(format!("{pre}_fraction_low"), lo);
    } else {
        m.put(format!("{pre}_max"), vmax(valid().map(|(s, _)| cr(s).tmax)));
        m.put(format!("{pre}_min"), vmin(valid().map(|(s, _)| cr(s).tmin)));
        let hi = count_sum((0..recs.len()).map(|s| cr(s).hi));
        m.put(format!("{pre}_fraction_high"), masked(hi, n));
        let lo = if c.lower.is_some() {
            masked(count_sum((0..recs.len()).map(|s| cr(s).lo)), n)
        } else {
            Acc::Const(0.0)
        };
        m.put(format!("{pre}_fraction_low"), lo);
    }
    let (s1, s2) = (
        merged((0..recs.len()).map(|s| cr(s).sc1)),
        merged((0..recs.len()).map(|s| cr(s).sc2)),
    );
    m.put(format!("{pre}_std"), Acc::VerlStd { s1, s2, n });
    seq_mean_metrics(m, &|k| format!("{pre}_{k}"), &valid_vals, 0.0);
    m.put(
        format!("{pre}_seq_fraction_high"),
        f32_frac(count(&|x| x > upper), nv),
    );
    if c.lower.is_some() {
        m.put(
            format!("{pre}_seq_fraction_low"),
            f32_frac(count(&|x| x < thr_l), nv),
        );
    }
    m.put(
        format!("{pre}_masked_fraction"),
        masked(count_sum((0..recs.len()).map(|s| cr(s).rej)), n),
    );
    let k = (0..recs.len()).filter(|&s| cr(s).rej > 0).count();
    m.put(
        format!("{pre}_seq_masked_fraction"),
        Acc::frac(k, nv, FracMode::F64, Empty::Compute),
    );
}

/// Batch normalisation's phase 1: the normaliser over every rank (one exchange), recorded as
/// `rollout_is_batch_norm_factor`; returns the divisor (1 when the mean is ≤ 1e-8).
pub(crate) fn batch_norm_factor(
    merged: &mut Partial,
    is: MaskIs,
    ex: &mut dyn Exchange,
) -> Result<f64> {
    let key = "rollout_corr/rollout_is_batch_norm_factor";
    let mut local = Partial::new();
    let norm = match is.level {
        IsLevel::Token => merged.get("rollout_corr/rollout_is_mean").cloned(),
        IsLevel::Sequence => merged.get(SEQ_NORM).cloned(),
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

/// trmask's own metrics from a step's decisions `c` (`n_valid` valid tokens, `n_kept` of them
/// in the final mask): the sequence-level ones, the per-token diagnostics from the
/// accumulator both executors feed, the GRPO groups from `uid`. Both executors finish them
/// here.
pub(crate) fn diag_partial(
    c: &Corrections,
    (n_valid, n_kept): (u64, u64),
    diag: &DiagAcc,
    feeds: &Feeds,
    uid: Option<&[i64]>,
    m: &mut Partial,
) {
    trmask_metrics(&c.seq_len, &c.seq_accept, &c.criteria, n_valid, n_kept, m);
    let stats: Vec<(&str, &[f64])> = c
        .criteria
        .iter()
        .map(|k| (k.name.as_str(), k.seq_stat.as_slice()))
        .collect();
    length_metrics(&c.seq_len, &c.seq_accept, &stats, m);
    if diag.histograms() {
        seq_histograms(&stats, &c.seq_len, m);
    }
    diag.put(feeds, m);
    if let Some(u) = uid {
        group_metrics(u, &c.seq_accept, m);
    }
}
