//! verl's `rollout_corr/*` metrics (`compute_offpolicy_metrics` and the IS weight statistics).

use super::ctx::{mean, std_unbiased, vmax, vmin, Ctx};
use crate::error::Result;
use crate::stats::{SegmentStats, StatTable, SAFETY_BOUND};
use std::collections::BTreeMap;

/// verl's `*_seq_mean`, `*_seq_std` (unbiased, 0 for one row), `*_seq_max`, `*_seq_min` and
/// `*_seq_max_deviation` (from 1) of the per-row weight means; `name("seq_mean")` gives the key.
pub(crate) fn seq_mean_metrics(
    m: &mut BTreeMap<String, f64>,
    name: &dyn Fn(&str) -> String,
    seq_mean: &[f64],
    b: usize,
) {
    m.insert(name("seq_mean"), mean(seq_mean));
    m.insert(
        name("seq_std"),
        if b > 1 { std_unbiased(seq_mean) } else { 0.0 },
    );
    m.insert(name("seq_max"), vmax(seq_mean.iter().copied()));
    m.insert(name("seq_min"), vmin(seq_mean.iter().copied()));
    m.insert(
        name("seq_max_deviation"),
        vmax(seq_mean.iter().map(|x| (x - 1.0).abs())),
    );
}

pub(crate) fn f32_frac(k: usize, n: usize) -> f64 {
    (k as f32 / n as f32) as f64
}

pub(crate) fn offpolicy_metrics(
    ctx: &Ctx,
    table: &StatTable,
    lr: &[f64],
    rho: &[f64],
    s_lr: &SegmentStats,
    m: &mut BTreeMap<String, f64>,
) -> Result<()> {
    let p = |k: &str| format!("rollout_corr/{k}");
    if let (Ok(train), Ok(roll)) = (table.get("train_log_prob"), table.get("rollout_log_prob")) {
        let mt = ctx.mmean_rows(&ctx.reduce(train)?);
        let mr = ctx.mmean_rows(&ctx.reduce(roll)?);
        m.insert(
            p("training_ppl"),
            mean(&mt.iter().map(|x| (-x).exp()).collect::<Vec<_>>()),
        );
        m.insert(
            p("training_log_ppl"),
            mean(&mt.iter().map(|x| -x).collect::<Vec<_>>()),
        );
        m.insert(
            p("rollout_ppl"),
            mean(&mr.iter().map(|x| (-x).exp()).collect::<Vec<_>>()),
        );
        m.insert(
            p("rollout_log_ppl"),
            mean(&mr.iter().map(|x| -x).collect::<Vec<_>>()),
        );
        let d: Vec<f64> = mr.iter().zip(&mt).map(|(r, t)| r - t).collect();
        m.insert(p("log_ppl_diff"), mean(&d));
        m.insert(
            p("log_ppl_abs_diff"),
            mean(&d.iter().map(|x| x.abs()).collect::<Vec<_>>()),
        );
        m.insert(p("log_ppl_diff_max"), vmax(d.iter().copied()));
        m.insert(p("log_ppl_diff_min"), vmin(d.iter().copied()));
        m.insert(
            p("ppl_ratio"),
            mean(&d.iter().map(|x| x.exp()).collect::<Vec<_>>()),
        );
    }
    // kl = mmean(rollout − old) = mmean(−lr)
    let neg = ctx.tok(|i| -lr[i]);
    m.insert(p("kl"), ctx.mmean(&neg)?);
    let k3u = ctx.tok(|i| (lr[i].exp() - lr[i]) - 1.0);
    m.insert(p("k3_kl"), ctx.mmean(&k3u)?);
    let rho2 = ctx.tok(|i| rho[i] * rho[i]);
    m.insert(p("chi2_token"), ctx.mmean(&rho2)? - 1.0);
    let chi: Vec<f64> = s_lr
        .sum
        .iter()
        .map(|s| (2.0 * s.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp())
        .collect();
    m.insert(p("chi2_seq"), mean(&chi) - 1.0);
    Ok(())
}
