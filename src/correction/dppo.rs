//! The DPPO / PDM token mask (docs/FORMAT.md, DPPO) and its `trmask/*` metrics.

use crate::config::DppoConfig;
use crate::engine::passes::topk_missing_input;
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::partial::{Acc, Empty, FracMode, Partial, Sum};
use crate::stats::{DppoDirection, StatTable, TopkStats};
use std::collections::BTreeMap;

/// ANDs the DPPO / PDM keep mask into `keep` and adds its `trmask/*` metrics.
pub(crate) fn dppo_keep(
    batch: &Batch,
    table: &StatTable,
    cfg: &DppoConfig,
    keep: &mut [bool],
    metrics: &mut Partial,
) -> Result<()> {
    let stats = match &table.topk {
        Some(s) => s,
        None => {
            let missing = topk_missing_input(batch).unwrap_or("old_logits");
            return Err(Error::input(
                missing,
                "is missing: dppo needs the rollout top-K (rollout_topk_ids, \
                 rollout_topk_log_prob), responses and old_logits",
            ));
        }
    };
    let adv = batch.advantages().ok_or_else(|| {
        Error::input(
            "advantages",
            "is missing: dppo's direction test needs per-token advantages",
        )
    })?;
    let (dppo_keep, m) = dppo_partial(stats, adv, batch.mask(), cfg)?;
    for (k, d) in keep.iter_mut().zip(&dppo_keep) {
        *k = *k && *d > 0.0;
    }
    metrics.extend(m);
    Ok(())
}

/// The DPPO / PDM keep mask and its metrics.
///
/// For each valid slot t, with D = `stats.divergence(cfg.divergence)[t]`,
/// δ_t = [`DppoConfig::threshold`]`(prob_diff[t])` and A = `advantages[t]`:
/// * `ratio`: drop iff `D > δ_t` and `A · (π_y − μ_y) > 0`;
/// * `predictive_aggregated` / `predictive_uniform`: drop iff `D > δ_t` and `A · ddot > 0`.
///
/// Returns `keep` (1.0 = keep, 0.0 = dropped, and 0.0 at invalid slots, so it can be ANDed
/// into `modified_response_mask`) and these metrics, each 0 when its denominator is empty
/// (L = number of valid slots):
/// * `trmask/topk_kl_mean`, `trmask/topk_kl_max`: mean (over L) and max of `topk_kl`;
/// * `trmask/topk_kl_less_01`, `trmask/topk_kl_less_05`: share of valid tokens with
///   `topk_kl < 0.1` / `< 0.5`;
/// * `trmask/dppo_masked_fraction`: dropped / L;
/// * `trmask/dppo_masked_fraction_pos_adv`, `…_neg_adv`: dropped share among valid tokens with
///   A > 0 / A < 0;
/// * `trmask/topk_tail_mass_mean`, `…_max`: mean and max of the rollout tail `μ_tail`;
/// * `trmask/dppo_direction_disagreement`: among valid tokens with `D > δ_t`, the share where
///   the ratio test (`A·(π_y − μ_y) > 0`) and the predictive test (`A·ddot > 0`, with
///   `ddot_uniform` when `direction = predictive_uniform`, else `ddot_aggregated`) disagree.
///
/// Errors: an invalid `cfg`, or lengths that differ from `stats`.
pub fn dppo_mask(
    stats: &TopkStats,
    advantages: &[f64],
    mask: &[bool],
    cfg: &DppoConfig,
) -> Result<(Vec<f64>, BTreeMap<String, f64>)> {
    let (keep, p) = dppo_partial(stats, advantages, mask, cfg)?;
    Ok((keep, p.finish()?))
}

/// [`dppo_mask`] with its metrics as a mergeable partial.
pub(crate) fn dppo_partial(
    stats: &TopkStats,
    advantages: &[f64],
    mask: &[bool],
    cfg: &DppoConfig,
) -> Result<(Vec<f64>, Partial)> {
    cfg.validate()?;
    let n = stats.len();
    if advantages.len() != n || mask.len() != n {
        return Err(Error::input(
            "advantages",
            format!(
                "{} advantages / {} mask slots for {n} top-K statistics",
                advantages.len(),
                mask.len()
            ),
        ));
    }
    let d = stats.divergence(cfg.divergence);
    let dir = stats.direction(cfg.direction);
    let predictive = match cfg.direction {
        DppoDirection::PredictiveUniform => &stats.ddot_uniform,
        _ => &stats.ddot_aggregated,
    };
    let mut keep = vec![0.0; n];
    let (mut valid, mut dropped) = (0usize, 0usize);
    let (mut pos, mut pos_dropped, mut neg, mut neg_dropped) = (0usize, 0usize, 0usize, 0usize);
    let (mut over, mut disagree) = (0usize, 0usize);
    let (mut kl_sum, mut kl_max, mut less01, mut less05) =
        (Sum::default(), f64::NEG_INFINITY, 0usize, 0usize);
    let (mut tail_sum, mut tail_max) = (Sum::default(), f64::NEG_INFINITY);
    for t in (0..n).filter(|&t| mask[t]) {
        valid += 1;
        let a = advantages[t];
        let over_delta = d[t] > cfg.threshold(stats.prob_diff[t]);
        let drop = over_delta && a * dir[t] > 0.0;
        keep[t] = if drop { 0.0 } else { 1.0 };
        dropped += drop as usize;
        if a > 0.0 {
            pos += 1;
            pos_dropped += drop as usize;
        } else if a < 0.0 {
            neg += 1;
            neg_dropped += drop as usize;
        }
        if over_delta {
            over += 1;
            disagree += ((a * stats.prob_diff[t] > 0.0) != (a * predictive[t] > 0.0)) as usize;
        }
        let kl = stats.topk_kl[t];
        kl_sum.add(kl);
        kl_max = f64::max(kl_max, kl);
        less01 += (kl < 0.1) as usize;
        less05 += (kl < 0.5) as usize;
        tail_sum.add(stats.rollout_tail[t]);
        tail_max = f64::max(tail_max, stats.rollout_tail[t]);
    }
    let frac = |a: usize, b: usize| Acc::frac(a, b, FracMode::F64, Empty::Zero);
    let mean = |sum: Sum| Acc::Mean {
        sum,
        n: valid as u64,
        offset: 0.0,
        empty: Empty::Zero,
    };
    let max = |v: f64| Acc::Max {
        v,
        empty: Empty::Zero,
    };
    let mut m = Partial::new();
    let mut put = |k: &str, v: Acc| m.put(format!("trmask/{k}"), v);
    put("topk_kl_mean", mean(kl_sum));
    put("topk_kl_max", max(kl_max));
    put("topk_kl_less_01", frac(less01, valid));
    put("topk_kl_less_05", frac(less05, valid));
    put("dppo_masked_fraction", frac(dropped, valid));
    put("dppo_masked_fraction_pos_adv", frac(pos_dropped, pos));
    put("dppo_masked_fraction_neg_adv", frac(neg_dropped, neg));
    put("topk_tail_mass_mean", mean(tail_sum));
    put("topk_tail_mass_max", max(tail_max));
    put("dppo_direction_disagreement", frac(disagree, over));
    Ok((keep, m))
}
