//! Calibration helpers: the precision a batch's log-probs were stored in, read from the values
//! themselves, and the quantisation noise floor it puts under a criterion's statistic.
//!
//! A log-prob stored in a format with `m` mantissa bits (bf16 7, fp16 10, f32 23, f64 52) is
//! rounded to a grid of spacing `ulp(x) = 2^(⌊log2 |x|⌋ − m)`, an error of variance `ulp²/12`;
//! a token's log-ratio carries rounding noise of variance `(ulp_roll² + ulp_train²)/12` and the
//! floor is its root mean square `σ` over valid tokens (the `warning:` line's `σ²/2` under
//! k3), mapped into the statistic's space (`k1`, `abs`, `ser`, `lntrm`: `σ`; `k2`, `k3`, KL and
//! binary KL: `σ²/2`; TV: `σ/2`; a `seq_sum_` criterion times the median sequence length). A
//! threshold below it separates rounding noise, not mismatch.
//!
//! ```
//! use trmask::calibrate::precision_of;
//! let bf16: Vec<f64> = [-1.5f64, -0.25, -3.0].to_vec();
//! assert_eq!(precision_of(&bf16).0, "bf16");
//! assert_eq!(precision_of(&[-1.2345678901234]).0, "f64");
//! ```

use crate::config::{Agg, Criterion, Stat};
use crate::input::batch::Batch;
use serde::Serialize;

/// The narrowest of bf16, fp16, f32, f64 that holds every finite value exactly, with its
/// number of mantissa bits.
pub fn precision_of(values: &[f64]) -> (&'static str, i32) {
    let all = |f: &dyn Fn(f64) -> f64| values.iter().all(|&x| !x.is_finite() || f(x) == x);
    if all(&|x| half::bf16::from_f64(x).to_f64()) {
        ("bf16", 7)
    } else if all(&|x| half::f16::from_f64(x).to_f64()) {
        ("fp16", 10)
    } else if all(&|x| x as f32 as f64) {
        ("f32", 23)
    } else {
        ("f64", 52)
    }
}

/// The spacing of the grid of `m` mantissa bits at `x` (0 at 0).
fn ulp(x: f64, m: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    2f64.powi(x.abs().log2().floor() as i32 - m)
}

/// The quantisation noise floor of a batch for one criterion.
#[derive(Clone, Debug, Serialize)]
pub struct NoiseFloor {
    /// Precision of the rollout log-probs (`bf16`, `fp16`, `f32`, `f64`).
    pub rollout: &'static str,
    /// Precision of the trainer log-probs.
    pub train: &'static str,
    /// Root mean square rounding noise of a token's log-ratio.
    pub log_ratio: f64,
    /// The same in the criterion's statistic space: no threshold below it is suggested.
    pub statistic: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The noise floor of `batch`'s log-probs under criterion `c`; `None` without both log-prob
/// tensors (log-probs computed from logits: see the module docs).
pub fn noise_floor(batch: &Batch, c: &Criterion) -> Option<NoiseFloor> {
    let (roll, train) = (batch.rollout_log_prob()?, batch.old_log_prob()?);
    let mask = batch.mask();
    let pick = |v: &[f64]| -> Vec<f64> {
        v.iter()
            .zip(mask)
            .filter(|(_, &m)| m)
            .map(|(&x, _)| x)
            .collect()
    };
    let (r, t) = (pick(roll), pick(train));
    let (pr, mr) = precision_of(&r);
    let (pt, mt) = precision_of(&t);
    let var = r
        .iter()
        .zip(&t)
        .map(|(&a, &b)| (ulp(a, mr).powi(2) + ulp(b, mt).powi(2)) / 12.0)
        .sum::<f64>()
        / r.len().max(1) as f64;
    let e = var.sqrt();
    let mut s = match c.stat {
        Stat::K1 | Stat::Abs | Stat::Ser | Stat::LnTrm | Stat::Opsm => e,
        Stat::Tv | Stat::TopkTv => e / 2.0,
        // |p − q| of the sampled token: at most |lr| (p, q ≤ 1)
        Stat::Cppo => e,
        Stat::K2 | Stat::K3 | Stat::Kl | Stat::KlRev | Stat::TopkKl | Stat::BinaryKl => e * e / 2.0,
        Stat::M2po => e * e,
        // expert choices, not log-probs: no quantisation floor
        Stat::RouteFlip => return None,
    };
    if c.agg == Agg::SeqSum {
        let lens: Vec<f64> = batch
            .segments()
            .lengths()
            .into_iter()
            .filter(|&l| l > 0)
            .map(|l| l as f64)
            .collect();
        s *= median(lens);
    }
    Some(NoiseFloor {
        rollout: pr,
        train: pt,
        log_ratio: e,
        statistic: s,
    })
}
