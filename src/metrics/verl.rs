//! verl's `rollout_corr/*` metrics (`compute_offpolicy_metrics` and the IS weight statistics),
//! as mergeable partials.

use super::ctx::{mean, std_unbiased, vmax, vmin, Ctx};
use crate::error::Result;
use crate::partial::{Acc, Partial, Sum};
use crate::stats::{SegmentStats, StatTable, SAFETY_BOUND};

pub(crate) use super::ctx::f32_frac;

/// verl's `*_seq_mean`, `*_seq_std` (unbiased, 0 for one row), `*_seq_max`, `*_seq_min` and
/// `*_seq_max_deviation` (from `centre`: 1 for weight means, 0 for a criterion's statistic) of
/// the per-row values; `name("seq_mean")` gives the key.
pub(crate) fn seq_mean_metrics(
    p: &mut Partial,
    name: &dyn Fn(&str) -> String,
    seq_mean: &[f64],
    centre: f64,
) {
    p.put(name("seq_mean"), mean(seq_mean));
    p.put(name("seq_std"), std_unbiased(seq_mean));
    p.put(name("seq_max"), vmax(seq_mean.iter().copied()));
    p.put(name("seq_min"), vmin(seq_mean.iter().copied()));
    p.put(
        name("seq_max_deviation"),
        vmax(seq_mean.iter().map(|x| (x - centre).abs())),
    );
}

/// `acc` finished with `offset` added (verl's `… − 1` of the χ² metrics).
fn minus_one(acc: Acc) -> Acc {
    match acc {
        Acc::MaskedMean { sum, n, .. } => Acc::MaskedMean {
            sum,
            n,
            offset: -1.0,
        },
        Acc::Mean { sum, n, empty, .. } => Acc::Mean {
            sum,
            n,
            offset: -1.0,
            empty,
        },
        a => a,
    }
}

/// verl's perplexity metrics from each sequence's mean trainer (`mt`) and rollout (`mr`)
/// log-prob: `training_ppl`, `rollout_ppl`, their logs, `log_ppl_diff` (+ abs, max, min) and
/// `ppl_ratio`. Shared by the full path and the lean pass.
pub(crate) fn ppl_metrics(mt: &[f64], mr: &[f64], m: &mut Partial) {
    let p = |k: &str| format!("rollout_corr/{k}");
    let map = |v: &[f64], f: fn(f64) -> f64| v.iter().map(|&x| f(x)).collect::<Vec<_>>();
    m.put(p("training_ppl"), mean(&map(mt, |x| (-x).exp())));
    m.put(p("training_log_ppl"), mean(&map(mt, |x| -x)));
    m.put(p("rollout_ppl"), mean(&map(mr, |x| (-x).exp())));
    m.put(p("rollout_log_ppl"), mean(&map(mr, |x| -x)));
    let d: Vec<f64> = mr.iter().zip(mt).map(|(r, t)| r - t).collect();
    m.put(p("log_ppl_diff"), mean(&d));
    m.put(p("log_ppl_abs_diff"), mean(&map(&d, f64::abs)));
    m.put(p("log_ppl_diff_max"), vmax(d.iter().copied()));
    m.put(p("log_ppl_diff_min"), vmin(d.iter().copied()));
    m.put(p("ppl_ratio"), mean(&map(&d, f64::exp)));
}

pub(crate) fn offpolicy_metrics(
    ctx: &Ctx,
    table: &StatTable,
    lr: &[f64],
    rho: &[f64],
    s_lr: &SegmentStats,
    m: &mut Partial,
) -> Result<()> {
    if let (Ok(train), Ok(roll)) = (table.get("train_log_prob"), table.get("rollout_log_prob")) {
        let mt = ctx.mmean_rows(&ctx.reduce(train)?);
        let mr = ctx.mmean_rows(&ctx.reduce(roll)?);
        ppl_metrics(&mt, &mr, m);
    }
    let valid = |f: &dyn Fn(usize) -> f64| Sum::of((0..lr.len()).filter(|&i| ctx.mask[i]).map(f));
    offpolicy_from_sums(
        OffPolicySums {
            // kl = mmean(rollout − old) = mmean(−lr)
            neg_lr: valid(&|i| -lr[i]),
            k3u: valid(&|i| (lr[i].exp() - lr[i]) - 1.0),
            rho2: valid(&|i| rho[i] * rho[i]),
            n: ctx.n as u64,
        },
        s_lr.sum.iter().copied(),
        m,
    );
    Ok(())
}

/// verl's k3 mean, the key a run's trend reads from verl's own metrics logs.
pub(crate) const K3_KL: &str = "rollout_corr/k3_kl";

/// Sums over the valid tokens that verl's off-policy metrics read.
pub(crate) struct OffPolicySums {
    /// Σ −log ρ.
    pub(crate) neg_lr: Sum,
    /// Σ (ρ − log ρ − 1) with the unclamped log-ratio.
    pub(crate) k3u: Sum,
    /// Σ ρ² (ρ from the clamped log-ratio).
    pub(crate) rho2: Sum,
    pub(crate) n: u64,
}

/// verl's `kl`, `k3_kl`, `chi2_token` and `chi2_seq` from the token sums `s` and each
/// sequence's Σ log ρ (`seq_lr`, every sequence): the one definition the full path (sums over
/// tokens) and the fused pass (sums of its per-sequence sums) both call.
pub(crate) fn offpolicy_from_sums(
    s: OffPolicySums,
    seq_lr: impl Iterator<Item = f64>,
    m: &mut Partial,
) {
    let p = |k: &str| format!("rollout_corr/{k}");
    let n = s.n as usize;
    m.put(p("kl"), Acc::masked_mean(s.neg_lr, n));
    m.put(K3_KL, Acc::masked_mean(s.k3u, n));
    m.put(p("chi2_token"), minus_one(Acc::masked_mean(s.rho2, n)));
    let chi: Vec<f64> = seq_lr
        .map(|l| (2.0 * l.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp())
        .collect();
    m.put(p("chi2_seq"), minus_one(mean(&chi)));
}

/// verl's sequence-IS extrema and truncated fractions from each sequence's Σ log ρ (every
/// sequence): `rollout_is_max` / `_min` and `rollout_is_ratio_fraction_high` / `_low` (the
/// thresholds' logs in float32, as torch computes them).
pub(crate) fn is_sequence_fractions(seq_lr: &[f64], upper: f64, lower: f64, m: &mut Partial) {
    let p = |k: &str| format!("rollout_corr/{k}");
    // exp(min(·, 20)) and exp are monotone: the extremum of the transformed values
    m.put(
        p("rollout_is_max"),
        vmax(seq_lr.iter().map(|l| l.min(SAFETY_BOUND).exp())),
    );
    m.put(p("rollout_is_min"), vmin(seq_lr.iter().map(|l| l.exp())));
    let lu = (upper as f32).ln() as f64;
    let ll = (lower as f32).ln() as f64;
    let hi = seq_lr.iter().filter(|&&s| s > lu).count();
    let lo = seq_lr.iter().filter(|&&s| s < ll).count();
    let b = seq_lr.len();
    m.put(p("rollout_is_ratio_fraction_high"), f32_frac(hi, b));
    m.put(p("rollout_is_ratio_fraction_low"), f32_frac(lo, b));
}

/// verl's token-IS truncated fractions from the counts of valid tokens above the upper and
/// below the lower threshold (as sums), with the weights' extrema.
pub(crate) fn is_token_fractions(hi: Sum, lo: Sum, n: u64, max: Acc, min: Acc, m: &mut Partial) {
    let p = |k: &str| format!("rollout_corr/{k}");
    m.put(
        p("rollout_is_ratio_fraction_high"),
        Acc::masked_mean(hi, n as usize),
    );
    m.put(
        p("rollout_is_ratio_fraction_low"),
        Acc::masked_mean(lo, n as usize),
    );
    m.put(p("rollout_is_max"), max);
    m.put(p("rollout_is_min"), min);
}

/// verl's `rollout_is_std` and `rollout_is_eff_sample_size` from Σ and Σ² of the clipped
/// weights over the `n` valid tokens.
pub(crate) fn is_spread(s1: Sum, s2: Sum, n: u64, m: &mut Partial) {
    let p = |k: &str| format!("rollout_corr/{k}");
    m.put(p("rollout_is_std"), Acc::VerlStd { s1, s2, n });
    m.put(
        p("rollout_is_eff_sample_size"),
        Acc::VerlEss { s1, s2, n, key: 0 },
    );
}
