//! The reference of `Engine::corrections_pass` (f64; mirrors `gpu/masks.rs`): token
//! statistics, one `segment_reduce` call over every statistic the criteria aggregate,
//! per-criterion keep decisions, the modified mask and the IS weights.

use crate::engine::plan::{
    CorrectionsRaw, MaskAgg, MaskCriterion, MaskPlan, MaskSource, MAX_MASK_CRITERIA,
};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::Segments;
use crate::math::binary_kl;
use crate::stats::{IsLevel, TokenStats, SAFETY_BOUND};

/// Checks a plan against the batch: column lengths and references, criterion count.
pub(crate) fn check_plan(lr: &[f64], segments: &Segments, plan: &MaskPlan) -> Result<()> {
    let n = segments.slots();
    if lr.len() != n {
        return Err(Error::input(
            "log_ratio",
            format!("has {} values but the batch has {n} slots", lr.len()),
        ));
    }
    if plan.criteria.len() > MAX_MASK_CRITERIA {
        return Err(Error::config(
            "rollout_rs",
            format!(
                "{} criteria; at most {MAX_MASK_CRITERIA} are supported",
                plan.criteria.len()
            ),
        ));
    }
    for (j, c) in plan.columns.iter().enumerate() {
        if c.len() != n {
            return Err(Error::input(
                format!("columns[{j}]"),
                format!("has {} values but the batch has {n} slots", c.len()),
            ));
        }
    }
    let bad = |c: &MaskCriterion| {
        let mut cols = c.source.columns().chain(c.agg.columns());
        cols.any(|j| j >= plan.columns.len())
    };
    if plan.criteria.iter().any(bad) {
        return Err(Error::config(
            "rollout_rs",
            "criterion refers to a missing column",
        ));
    }
    Ok(())
}

/// The per-slot statistic of `source` (0 at invalid slots).
fn source_values(source: MaskSource, t: &TokenStats, plan: &MaskPlan, mask: &[bool]) -> Vec<f64> {
    let tok = |f: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..mask.len())
            .map(|i| if mask[i] { f(i) } else { 0.0 })
            .collect()
    };
    match source {
        MaskSource::K1 => t.k1.clone(),
        MaskSource::K2 => t.k2.clone(),
        MaskSource::K3 => t.k3.clone(),
        // verl: exp(c) − 1 − c
        MaskSource::K3Verl => tok(&|i| (t.rho[i] - 1.0) + t.k1[i]),
        MaskSource::Abs => t.abs.clone(),
        MaskSource::Ser => t.ser.clone(),
        MaskSource::Column(j) => tok(&|i| plan.columns[j][i]),
        MaskSource::SerWeighted(j) => tok(&|i| t.ser[i] * plan.columns[j][i]),
        MaskSource::BinaryKl(j) => {
            tok(&|i| binary_kl(plan.columns[j][i], plan.columns[j + 1][i], t.log_ratio[i]))
        }
    }
}

/// The f64 reference of `Engine::corrections_pass`, on any engine's `token_stats` and
/// `segment_reduce` (one call for every reduction).
pub fn corrections_pass<E: Engine + ?Sized>(
    engine: &E,
    lr: &[f64],
    segments: &Segments,
    plan: &MaskPlan,
) -> Result<CorrectionsRaw> {
    check_plan(lr, segments, plan)?;
    let mask = segments.mask();
    let n = mask.len();
    let b = segments.len();
    let zeros = vec![0.0; n];
    // train − roll = lr − 0 = lr exactly
    let tokens = engine.token_stats(&zeros, lr, mask)?;
    let stats: Vec<Vec<f64>> = plan
        .criteria
        .iter()
        .map(|c| source_values(c.source, &tokens, plan, mask))
        .collect();
    // one reduction call: each criterion's statistic, the log-ratio, the columns
    let mut values: Vec<&[f64]> = stats.iter().map(|v| v.as_slice()).collect();
    values.push(&tokens.log_ratio);
    values.extend(plan.columns.iter().copied());
    let red = engine.segment_reduce(&values, segments)?;
    let nc = plan.criteria.len();
    let s_lr = &red[nc];
    let len: Vec<f64> = s_lr.count.iter().map(|&c| f64::from(c)).collect();

    let mut token_reject = vec![0u32; n];
    let mut seq_stat = Vec::with_capacity(nc);
    let owner = segments.slot_owner();
    for (ci, c) in plan.criteria.iter().enumerate() {
        let s = &red[ci];
        let bit = 1u32 << ci;
        let per_seq: Option<Vec<f64>> = match c.agg {
            MaskAgg::Token => None,
            MaskAgg::Sum => Some(s.sum.clone()),
            MaskAgg::MeanVerl => Some(
                s.sum
                    .iter()
                    .zip(&len)
                    .map(|(x, l)| x / (l + 1e-8))
                    .collect(),
            ),
            MaskAgg::Mean => Some(
                (0..b)
                    .map(|i| if s.count[i] > 0 { s.mean[i] } else { 0.0 })
                    .collect(),
            ),
            MaskAgg::Max => Some(
                (0..b)
                    .map(|i| if s.count[i] > 0 { s.max[i] } else { 0.0 })
                    .collect(),
            ),
            MaskAgg::WeightedMean(j) => {
                let z = &red[nc + 1 + j];
                Some(
                    (0..b)
                        .map(|i| {
                            if z.sum[i] > 0.0 {
                                s.sum[i] / z.sum[i]
                            } else {
                                0.0
                            }
                        })
                        .collect(),
                )
            }
        };
        match &per_seq {
            None => {
                for i in 0..n {
                    if mask[i] && !c.keep(stats[ci][i]) {
                        token_reject[i] |= bit;
                    }
                }
            }
            Some(v) => {
                let kb: Vec<bool> = v.iter().map(|&x| c.keep(x)).collect();
                for i in 0..n {
                    if mask[i] && !kb[owner[i]] {
                        token_reject[i] |= bit;
                    }
                }
            }
        }
        seq_stat
            .push(per_seq.unwrap_or_else(|| token_reject_fraction(&token_reject, bit, segments)));
    }
    let seq_reject = seq_reject_bits(&token_reject, segments);
    let final_mask: Vec<bool> = (0..n).map(|i| mask[i] && token_reject[i] == 0).collect();
    let weights = plan.is.map(|is| {
        let seq_w: Vec<f64> = s_lr
            .sum
            .iter()
            .map(|s| s.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp())
            .collect();
        (0..n)
            .map(|i| {
                if !mask[i] {
                    return 0.0;
                }
                is.weight(match is.level {
                    IsLevel::Token => tokens.rho[i],
                    IsLevel::Sequence => seq_w[owner[i]],
                })
            })
            .collect()
    });
    Ok(CorrectionsRaw {
        seq_log_ratio_sum: s_lr.sum.clone(),
        tokens,
        weights,
        mask: final_mask,
        token_reject,
        seq_stat,
        seq_reject,
    })
}

/// Per sequence: the fraction of its valid tokens whose reject bits include `bit` (0 if empty).
pub(crate) fn token_reject_fraction(bits: &[u32], bit: u32, segments: &Segments) -> Vec<f64> {
    segments
        .ranges()
        .iter()
        .map(|&(a, e)| {
            let (mut k, mut l) = (0usize, 0usize);
            for (&r, &m) in bits[a..e].iter().zip(&segments.mask()[a..e]) {
                if m {
                    l += 1;
                    k += usize::from(r & bit != 0);
                }
            }
            if l > 0 {
                k as f64 / l as f64
            } else {
                0.0
            }
        })
        .collect()
}

/// Per sequence: OR of its valid tokens' reject bits.
pub(crate) fn seq_reject_bits(bits: &[u32], segments: &Segments) -> Vec<u32> {
    segments
        .ranges()
        .iter()
        .map(|&(a, e)| {
            (a..e)
                .filter(|&i| segments.mask()[i])
                .fold(0, |acc, i| acc | bits[i])
        })
        .collect()
}
