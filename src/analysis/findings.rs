//! The full path's [`Findings`]: what the summary screen and the warnings read, from the
//! batch, its statistics table and the corrections (the fused pass gathers the same from its
//! tiles, `correction::lean`).

use crate::input::batch::Batch;
use crate::math::{half_exact, ulp};
use crate::metrics::trmask::kept_tokens;
use crate::stats::{Corrections, Findings, StatTable};

/// The narrowest of bf16 / f16 that holds every valid value exactly: (name, mantissa bits).
fn quantised(values: &[f64], mask: &[bool]) -> Option<(&'static str, i32)> {
    let (mut b, mut f) = (true, true);
    for (&x, _) in values.iter().zip(mask).filter(|(_, &m)| m) {
        let (xb, xf) = half_exact(x);
        (b, f) = (b && xb, f && xf);
        if !b && !f {
            return None;
        }
    }
    if b {
        Some(("bf16", 7))
    } else {
        f.then_some(("f16", 10))
    }
}

/// The findings of an analysed batch.
pub(crate) fn findings(batch: &Batch, table: &StatTable, c: &Corrections) -> Findings {
    let mask = batch.mask();
    let valid = mask.iter().filter(|&&m| m).count();
    let lr = table.stats.get("log_ratio");
    let worst = batch
        .segments()
        .ranges()
        .iter()
        .map(|&(a, b)| {
            let lr = lr?;
            (a..b)
                .filter(|&i| mask[i])
                .enumerate()
                .max_by(|x, y| lr[x.1].abs().total_cmp(&lr[y.1].abs()))
                .map(|(t, i)| (t, i, lr[i].abs()))
        })
        .collect();
    let log_ratio = lr.filter(|_| valid > 0).map(|lr| {
        let vals: Vec<f64> = (0..lr.len()).filter(|&i| mask[i]).map(|i| lr[i]).collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / vals.len() as f64;
        (mean, var.sqrt())
    });
    let mut positive = Vec::new();
    for name in crate::input::tensors::log_prob_names() {
        let Some(v) = batch.values(name) else {
            continue;
        };
        let pos: Vec<usize> = (0..v.len()).filter(|&i| mask[i] && v[i] > 0.0).collect();
        if let Some(&top) = pos.iter().max_by(|&&x, &&y| v[x].total_cmp(&v[y])) {
            positive.push((name.to_string(), pos.len() as u64, v[top], top));
        }
    }
    let roll = batch.rollout_log_prob();
    let train = crate::engine::passes::training_log_prob(batch);
    let quantised = match (roll, train) {
        (Some(r), Some(t)) if valid > 0 => match (quantised(r, mask), quantised(t, mask)) {
            (Some((nr, mr)), Some((nt, mt))) => {
                let f = (0..r.len())
                    .filter(|&i| mask[i])
                    .map(|i| (ulp(r[i], mr).powi(2) + ulp(t[i], mt).powi(2)) / 24.0)
                    .sum::<f64>()
                    / valid as f64;
                Some((nr, nt, mr.min(mt), f))
            }
            _ => None,
        },
        _ => None,
    };
    Findings {
        valid: valid as u64,
        kept: if c.mask.len() == mask.len() {
            kept_tokens(mask, &c.mask)
        } else {
            0
        },
        worst,
        log_ratio,
        positive,
        quantised,
    }
}
