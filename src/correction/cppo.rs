//! CPPO's cumulative prefix budget (`rollout_rs: "cppo"`, Mao et al. 2026, arXiv 2606.10968,
//! Eq. 8–11 and 22, Binary-TV variant): a token mask that tightens the per-token divergence
//! threshold early in a response and as the prefix drifts. Per sequence with T valid tokens,
//! t = 1..T over its valid tokens in order, `p = π_train(y_t)`, `q = π_roll(y_t)`:
//!
//! ```text
//! D_t = |p − q|                                   w_t = 1 − (1 − w_min)(t − 1)/max(T − 1, 1)
//! Z_t = w_t D_t    S_{t−1} = Σ_{j<t} Z_j    W_{t−1} = Σ_{j<t} w_j
//! δ_b = clamp(P90(D_1..D_T), delta_b, 2·delta_b)   (the linear-interpolation quantile)
//! c_t = min(δ, δ + δ_b W_{t−1} − S_{t−1})
//! drop t  iff  A_t (ρ_t − 1) > 0  and  Z_t > c_t
//! ```
//!
//! A token whose update moves π back toward the rollout (`A_t (ρ_t − 1) ≤ 0`) is always kept.
//! Everything is per sequence: no batch-global state, so data-parallel shards need no exchange.
//! The decisions are computed on the host in f64 and applied by either engine's corrections
//! pass as a drop column.

use super::m2po::active_sign;
use crate::config::Cppo;
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::metrics::ctx::Ctx;
use crate::partial::{Acc, Empty, FracMode, Partial};
use crate::stats::StatTable;

/// CPPO's per-slot columns: `Z_t = w_t D_t` (0 at invalid slots) and the drop indicator (1
/// dropped), empty when no criterion is `cppo`; the counts behind its metrics.
#[derive(Default)]
pub(crate) struct CppoColumns {
    pub value: Vec<f64>,
    pub drop: Vec<f64>,
    /// Dropped tokens whose `Z_t` exceeds δ itself, and those dropped by the prefix budget only.
    token_drops: usize,
    prefix_drops: usize,
}

/// `D_t = |p − q|` of a token from its two log-probs.
#[inline(always)]
pub(crate) fn divergence(train_lp: f64, roll_lp: f64) -> f64 {
    (train_lp.exp() - roll_lp.exp()).abs()
}

/// The update moves π away from the rollout (`A_t (ρ_t − 1) > 0`, from the sign of the
/// log-ratio `lr`): M2PO's active quadrants.
#[inline(always)]
pub(crate) fn outward(adv: f64, lr: f64) -> bool {
    active_sign(adv, lr)
}

/// numpy's / torch's default (linear) quantile of `v` (not empty) at `q`.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// One sequence's drop decisions (`d`: D_t, `outward`: A_t (ρ_t − 1) > 0, in token order) and
/// `Z_t`; `drop[t]` is 0 (kept), 1 (dropped by δ) or 2 (dropped by the prefix budget only).
pub(crate) fn sequence(d: &[f64], outward: &[bool], delta: f64, p: Cppo) -> (Vec<f64>, Vec<u8>) {
    let n = d.len();
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let budget = quantile(&mut d.to_vec(), 0.9).clamp(p.delta_b, 2.0 * p.delta_b);
    let span = (n - 1).max(1) as f64;
    let (mut s, mut w_sum) = (0.0f64, 0.0f64);
    let mut z = Vec::with_capacity(n);
    let mut drop = Vec::with_capacity(n);
    for t in 0..n {
        let w = 1.0 - (1.0 - p.w_min) * t as f64 / span;
        let zt = w * d[t];
        let c = delta.min(delta + budget * w_sum - s);
        drop.push(match (outward[t], zt > c) {
            (true, true) if zt > delta => 1,
            (true, true) => 2,
            _ => 0,
        });
        z.push(zt);
        s += zt;
        w_sum += w;
    }
    (z, drop)
}

impl CppoColumns {
    /// The columns for this shard (`spec`: δ and `{w_min, delta_b}` when a criterion is
    /// `cppo`); the log-probs come from the table in f64.
    pub(crate) fn new(
        ctx: &Ctx,
        batch: &Batch,
        table: &StatTable,
        spec: Option<(f64, Cppo)>,
    ) -> Result<Self> {
        let Some((delta, p)) = spec else {
            return Ok(CppoColumns::default());
        };
        let adv = batch.advantages().ok_or_else(|| {
            Error::input(
                "advantages",
                "is missing: rollout_rs 'cppo' masks only updates that move the policy away \
                 from the rollout (A·(ρ − 1) > 0)",
            )
        })?;
        let (t, r) = (table.get("train_log_prob")?, table.get("rollout_log_prob")?);
        let n_slots = ctx.mask.len();
        let mut out = CppoColumns {
            value: vec![0.0; n_slots],
            drop: vec![0.0; n_slots],
            ..Default::default()
        };
        for &(start, end) in ctx.segs.ranges() {
            let slots: Vec<usize> = (start..end).filter(|&i| ctx.mask[i]).collect();
            let d: Vec<f64> = slots.iter().map(|&i| divergence(t[i], r[i])).collect();
            let outward: Vec<bool> = slots
                .iter()
                .map(|&i| outward(adv[i], t[i] - r[i]))
                .collect();
            let (z, drop) = sequence(&d, &outward, delta, p);
            for (k, &i) in slots.iter().enumerate() {
                out.value[i] = z[k];
                out.drop[i] = (drop[k] > 0) as u8 as f64;
                out.token_drops += (drop[k] == 1) as usize;
                out.prefix_drops += (drop[k] == 2) as usize;
            }
        }
        Ok(out)
    }

    /// CPPO's own metrics under `pre` (`rollout_corr/rollout_rs_cppo`): the shares of valid
    /// tokens dropped because `w_t D_t > δ`, and dropped by the prefix budget alone.
    pub(crate) fn metrics(&self, ctx: &Ctx, pre: &str, m: &mut Partial) {
        metrics((self.token_drops, self.prefix_drops), ctx.n, pre, m);
    }
}

/// CPPO's own metrics under `pre` from a shard's counts of tokens dropped by δ and by the
/// prefix budget alone, as shares of its `n_valid` tokens.
pub(crate) fn metrics((token, prefix): (usize, usize), n_valid: usize, pre: &str, m: &mut Partial) {
    for (k, n) in [
        ("token_masked_fraction", token),
        ("prefix_masked_fraction", prefix),
    ] {
        m.put(
            format!("{pre}_{k}"),
            Acc::frac(n, n_valid, FracMode::F64, Empty::Compute),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{quantile, sequence};
    use crate::config::Cppo;

    #[test]
    fn quantile_is_the_linear_one() {
        assert_eq!(quantile(&mut [3.0, 1.0, 2.0, 4.0, 5.0], 0.9), 4.6);
        assert_eq!(quantile(&mut [7.0], 0.9), 7.0);
    }

    #[test]
    fn the_prefix_budget_tightens_after_drift() {
        let p = Cppo {
            w_min: 0.5,
            delta_b: 0.05,
        };
        // P90 of D = 0.1 + 0.8·(0.3 − 0.1) = 0.26 → budget clamp(0.26, 0.05, 0.1) = 0.1;
        // w = 1, 0.75, 0.5; c_1 = 0.2, c_2 = min(0.2, 0.2 + 0.1·1 − 0.3) = 0
        let d = [0.3, 0.1, 0.1];
        let (z, drop) = sequence(&d, &[true, true, false], 0.2, p);
        assert_eq!(z, vec![0.3, 0.07500000000000001, 0.05]);
        // token 1 over δ; token 2 over its prefix-tightened threshold; token 3 moves back
        assert_eq!(drop, vec![1, 2, 0]);
        assert_eq!(sequence(&[], &[], 0.2, p).1, Vec::<u8>::new());
    }
}
