//! verl's `rollout_corr/*` metrics (`compute_offpolicy_metrics` and the IS weight statistics),
//! as mergeable partials.

use super::ctx::{mean, std_unbiased, vmax, vmin, Ctx};
use crate::error::Result;
use crate::partial::{Acc, Partial};
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
    let p = |k: &str| format!("rollout_corr/{k}");
    if let (Ok(train), Ok(roll)) = (table.get("train_log_prob"), table.get("rollout_log_prob")) {
        let mt = ctx.mmean_rows(&ctx.reduce(train)?);
        let mr = ctx.mmean_rows(&ctx.reduce(roll)?);
        ppl_metrics(&mt, &mr, m);
    }
    // kl = mmean(rollout − old) = mmean(−lr)
    let neg = ctx.tok(|i| -lr[i]);
    m.put(p("kl"), ctx.mmean(&neg));
    let k3u = ctx.tok(|i| (lr[i].exp() - lr[i]) - 1.0);
    m.put(p("k3_kl"), ctx.mmean(&k3u));
    let rho2 = ctx.tok(|i| rho[i] * rho[i]);
    m.put(p("chi2_token"), minus_one(ctx.mmean(&rho2)));
    let chi: Vec<f64> = s_lr
        .sum
        .iter()
        .map(|s| (2.0 * s.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp())
        .collect();
    m.put(p("chi2_seq"), minus_one(mean(&chi)));
    Ok(())
}
