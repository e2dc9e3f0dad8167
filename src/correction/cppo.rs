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

/// numpy's / torch's default (linear) quantile of `v` (not empty) at `q`, the values sorted
/// only as far as the two it reads (`v` is reordered).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    let (_, &mut x_lo, above) = v.select_nth_unstable_by(lo, f64::total_cmp);
    // the next value in sorted order: the smallest of those after `lo`
    let x_hi = match hi > lo {
        true => above.iter().copied().min_by(f64::total_cmp).unwrap_or(x_lo),
        false => x_lo,
    };
    x_lo + (x_hi - x_lo) * (pos - lo as f64)
}

/// One sequence's decisions, in buffers reused from sequence to sequence.
#[derive(Debug, Default)]
pub(crate) struct Decisions {
    /// `Z_t` by valid token.
    pub(crate) z: Vec<f64>,
    /// By valid token: 0 kept, 1 dropped by δ, 2 dropped by the prefix budget only.
    pub(crate) drop: Vec<u8>,
    /// The quantile's copy of `D_t`.
    sorted: Vec<f64>,
}

impl Decisions {
    /// The sequence's decisions (`d`: D_t, `outward`: A_t (ρ_t − 1) > 0, in token order), and
    /// its counts of drops by δ and by the prefix budget alone.
    pub(crate) fn sequence(
        &mut self,
        d: &[f64],
        outward: &[bool],
        delta: f64,
        p: Cppo,
    ) -> (usize, usize) {
        let n = d.len();
        self.z.clear();
        self.drop.clear();
        if n == 0 {
            return (0, 0);
        }
        self.sorted.clear();
        self.sorted.extend_from_slice(d);
        let budget = quantile(&mut self.sorted, 0.9).clamp(p.delta_b, 2.0 * p.delta_b);
        let span = (n - 1).max(1) as f64;
        let (mut s, mut w_sum) = (0.0f64, 0.0f64);
        let mut drops = (0, 0);
        for t in 0..n {
            let w = 1.0 - (1.0 - p.w_min) * t as f64 / span;
            let zt = w * d[t];
            let c = delta.min(delta + budget * w_sum - s);
            let k = match (outward[t], zt > c) {
                (true, true) if zt > delta => 1,
                (true, true) => 2,
                _ => 0,
            };
            drops.0 += usize::from(k == 1);
            drops.1 += usize::from(k == 2);
            self.drop.push(k);
            self.z.push(zt);
            s += zt;
            w_sum += w;
        }
        drops
    }
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
        let (mut slots, mut d, mut out_) = (Vec::new(), Vec::new(), Vec::new());
        let mut seq = Decisions::default();
        for &(start, end) in ctx.segs.ranges() {
            slots.clear();
            slots.extend((start..end).filter(|&i| ctx.mask[i]));
            d.clear();
            d.extend(slots.iter().map(|&i| divergence(t[i], r[i])));
            out_.clear();
            out_.extend(slots.iter().map(|&i| outward(adv[i], t[i] - r[i])));
            let (token, prefix) = seq.sequence(&d, &out_, delta, p);
            out.token_drops += token;
            out.prefix_drops += prefix;
            for (k, &i) in slots.iter().enumerate() {
                out.value[i] = seq.z[k];
                out.drop[i] = (seq.drop[k] > 0) as u8 as f64;
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
    use super::{quantile, Decisions};
    use crate::config::Cppo;

    #[test]
    fn quantile_is_the_linear_one() {
        assert_eq!(quantile(&mut [3.0, 1.0, 2.0, 4.0, 5.0], 0.9), 4.6);
        assert_eq!(quantile(&mut [7.0], 0.9), 7.0);
        // the partial selection reads the two values a full sort would, to the bit: random
        // lengths, few levels (ties), a NaN now and then
        let mut u = crate::math::test_uniform();
        for n in 1..80 {
            let v: Vec<f64> = (0..n)
                .map(|_| match u() {
                    x if x < 0.03 => f64::NAN,
                    x => (x * 7.0).floor() * 0.125,
                })
                .collect();
            for q in [0.0, 0.5, 0.9, 1.0] {
                let mut s = v.clone();
                s.sort_by(f64::total_cmp);
                let pos = q * (n - 1) as f64;
                let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
                let want = s[lo] + (s[hi] - s[lo]) * (pos - lo as f64);
                let got = quantile(&mut v.clone(), q);
                assert_eq!(got.to_bits(), want.to_bits(), "n {n}, q {q}");
            }
        }
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
        let mut seq = Decisions::default();
        assert_eq!(seq.sequence(&d, &[true, true, false], 0.2, p), (1, 1));
        assert_eq!(seq.z, vec![0.3, 0.07500000000000001, 0.05]);
        // token 1 over δ; token 2 over its prefix-tightened threshold; token 3 moves back
        assert_eq!(seq.drop, vec![1, 2, 0]);
        // the buffers are reused: an empty sequence leaves none of the last one's
        assert_eq!(seq.sequence(&[], &[], 0.2, p), (0, 0));
        assert!(seq.z.is_empty() && seq.drop.is_empty());
    }
}
