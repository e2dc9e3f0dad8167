//! Top-K divergences (docs/FORMAT.md, DPPO), f64, cancellation-free, parallel over rows.
//!
//! With `d_i = log π_i − log μ_i` on S and the true tails `μ_t = 1 − Σ_S μ`, `π_t = 1 − Σ_S π`:
//! `Σ_S μ_i (log μ_i − log π_i) = Σ_S μ_i k3(d_i) − (μ_t − π_t)` where `k3(d) = expm1(d) − d ≥ 0`
//! (because `Σ_S (π_i − μ_i) = μ_t − π_t`), so
//! `topk_kl = Σ_S μ_i k3(d_i) + [μ̂ ln(μ̂/π̂) − μ_t + π_t]` with the clamped tails `μ̂, π̂`;
//! without clamping the bracket is `μ_t k3(ln π_t − ln μ_t) ≥ 0`. Every term is second order in
//! the mismatch: nothing cancels at first order, so KLs of 1e-15 survive. Differences of
//! probabilities are `π_i − μ_i = μ_i expm1(d_i)`.

use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::logits::Logits;
use crate::input::support::{prepare_support, PreparedSupport, TrainerTopk, TAIL_FLOOR};
use crate::math::{k3_from_log_ratio, log_sum_exp, neumaier_sum};
use crate::stats::{TopkStats, TopkSupport};
use rayon::prelude::*;

/// One row's results.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TopkRow {
    pub topk_kl: f64,
    pub topk_tv: f64,
    pub ddot_aggregated: f64,
    pub ddot_uniform: f64,
    pub rollout_tail: f64,
    pub train_tail: f64,
    pub prob_diff: f64,
}

/// The statistics of one row from log μ and log π on S (`train_lp` may hold −inf: π = 0),
/// the index of y in S and the vocabulary size.
pub fn topk_row(rollout_lp: &[f64], train_lp: &[f64], y: usize, vocab: usize) -> TopkRow {
    let n = rollout_lp.len();
    let mu_t = -log_sum_exp(rollout_lp).exp_m1();
    let pi_t = -log_sum_exp(train_lp).exp_m1();
    let (mu_h, pi_h) = (mu_t.max(TAIL_FLOOR), pi_t.max(TAIL_FLOOR));
    let (mut kl, mut tv, mut cross) = (0.0, 0.0, 0.0);
    for (&lm, &lp) in rollout_lp.iter().zip(train_lp) {
        let mu = lm.exp();
        let d = lp - lm;
        let e = d.exp_m1(); // (π − μ)/μ
        kl += mu * k3_from_log_ratio(d);
        tv += mu * e.abs();
        // π (μ − π) = −π μ expm1(d); 0 when π = 0.
        if lp > f64::NEG_INFINITY {
            cross -= lp.exp() * mu * e;
        }
    }
    let tail_kl = if mu_h == mu_t && pi_h == pi_t {
        mu_t * k3_from_log_ratio(pi_t.ln() - mu_t.ln())
    } else {
        mu_h * (mu_h / pi_h).ln() - mu_t + pi_t
    };
    let prob_diff = rollout_lp[y].exp() * (train_lp[y] - rollout_lp[y]).exp_m1();
    let tail = pi_h * (mu_h - pi_h);
    let uniform_tail = if vocab > n {
        tail / (vocab - n) as f64
    } else {
        0.0
    };
    TopkRow {
        topk_kl: kl + tail_kl,
        topk_tv: 0.5 * (tv + (mu_h - pi_h).abs()),
        ddot_aggregated: prob_diff + cross + tail,
        ddot_uniform: prob_diff + cross + uniform_tail,
        rollout_tail: mu_t.max(0.0),
        train_tail: pi_t.max(0.0),
        prob_diff,
    }
}

/// The trainer's log-probs at `ids` from one row of logits divided by the temperature
/// (`inv_t = 1/τ`): one pass for the max, one for `Σ exp`, with the max term factored out.
fn gather_log_probs(
    logits: &Logits,
    r: usize,
    inv_t: f64,
    ids: &[i64],
    out: &mut [f64],
    buf: &mut [f64],
) -> std::result::Result<(), String> {
    logits.row_f64(r, buf);
    let (mut m, mut arg) = (f64::NEG_INFINITY, usize::MAX);
    for (i, x) in buf.iter_mut().enumerate() {
        if x.is_nan() || *x == f64::INFINITY {
            return Err(format!("value {x} at column {i}"));
        }
        *x *= inv_t;
        if *x > m {
            m = *x;
            arg = i;
        }
    }
    if arg == usize::MAX {
        return Err("every entry is -inf".into());
    }
    // Compensated (Neumaier) sum: a plain sum of 150k terms drifts by ~1e-14 relative, which
    // would show up as absolute error in the tail 1 − Σ_S π.
    let rest = neumaier_sum(
        buf.iter()
            .enumerate()
            .filter(|&(i, _)| i != arg)
            .map(|(_, &x)| (x - m).exp()),
    );
    // x − lse with the max factored out: exactly −ln1p(rest) at the mode.
    let l1p = rest.ln_1p();
    for (o, &id) in out.iter_mut().zip(ids) {
        *o = (buf[id as usize] - m) - l1p;
    }
    Ok(())
}

/// Per-slot statistics for a validated support (see [`crate::topk::prepare_support`]).
/// `position` names a slot in error messages.
pub fn topk_divergence(
    prepared: &PreparedSupport,
    trainer: &TrainerTopk<'_>,
    mask: &[bool],
    position: impl Fn(usize) -> String + Sync,
) -> Result<TopkStats> {
    let w = prepared.width;
    let rows: Vec<Result<TopkRow>> = (0..mask.len())
        .into_par_iter()
        .map_init(
            || (vec![0f64; w], Vec::<f64>::new()),
            |(train, buf), r| {
                if !mask[r] {
                    return Ok(TopkRow::default());
                }
                let len = prepared.len[r] as usize;
                let o = r * w;
                let ids = &prepared.ids[o..o + len];
                let train = &mut train[..len];
                match trainer {
                    TrainerTopk::Logits {
                        logits,
                        temperature,
                    } => {
                        buf.resize(logits.vocab(), 0.0);
                        gather_log_probs(logits, r, 1.0 / temperature, ids, train, buf).map_err(
                            |e| Error::input("old_logits", format!("row {}: {e}", position(r))),
                        )?;
                    }
                    TrainerTopk::LogProbs(_) => {
                        let tl = prepared.train_lp.as_ref().ok_or_else(|| {
                            Error::input("old_topk_log_prob", "missing from the prepared support")
                        })?;
                        train.copy_from_slice(&tl[o..o + len]);
                    }
                }
                Ok(topk_row(
                    &prepared.rollout_lp[o..o + len],
                    train,
                    prepared.y_index[r] as usize,
                    prepared.vocab,
                ))
            },
        )
        .collect();
    let mut s = TopkStats::zeros(mask.len());
    for (r, row) in rows.into_iter().enumerate() {
        let row = row?;
        s.topk_kl[r] = row.topk_kl;
        s.topk_tv[r] = row.topk_tv;
        s.ddot_aggregated[r] = row.ddot_aggregated;
        s.ddot_uniform[r] = row.ddot_uniform;
        s.rollout_tail[r] = row.rollout_tail;
        s.train_tail[r] = row.train_tail;
        s.prob_diff[r] = row.prob_diff;
        s.support_size[r] = prepared.len[r];
    }
    Ok(s)
}

/// Per-slot top-K divergences on the CPU in f64 (see the module docs for the definitions).
///
/// `batch` supplies `rollout_topk_ids`, `rollout_topk_log_prob`, `responses`, the mask and,
/// where some y_t is not among the top-K, `rollout_log_prob`. `trainer` supplies π on S
/// (use [`TrainerTopk::from_batch`] for `old_logits`). Errors name the tensor and the row.
pub fn topk_divergence_batch(
    batch: &Batch,
    support: TopkSupport,
    trainer: TrainerTopk<'_>,
) -> Result<TopkStats> {
    let prepared = prepare_support(batch, support, &trainer)?;
    topk_divergence(&prepared, &trainer, batch.mask(), |r| batch.position(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_distributions() {
        let lp = [-0.2f64, -2.5, -4.0];
        let r = topk_row(&lp, &lp, 1, 10);
        assert_eq!(r.topk_kl, 0.0);
        assert_eq!(r.topk_tv, 0.0);
        assert_eq!(r.prob_diff, 0.0);
        assert_eq!(r.ddot_aggregated, 0.0);
        let tail = 1.0 - lp.iter().map(|x| x.exp()).sum::<f64>();
        assert!((r.rollout_tail - tail).abs() < 1e-15);
    }

    #[test]
    fn matches_naive() {
        let mu = [-0.3f64, -1.7, -2.9];
        let pi = [-0.4f64, -1.5, -3.2];
        let r = topk_row(&mu, &pi, 2, 8);
        let m: Vec<f64> = mu.iter().map(|x| x.exp()).collect();
        let p: Vec<f64> = pi.iter().map(|x| x.exp()).collect();
        let mt = 1.0 - m.iter().sum::<f64>();
        let pt = 1.0 - p.iter().sum::<f64>();
        let kl = m.iter().zip(&p).map(|(a, b)| a * (a / b).ln()).sum::<f64>() + mt * (mt / pt).ln();
        let tv =
            0.5 * (m.iter().zip(&p).map(|(a, b)| (a - b).abs()).sum::<f64>() + (mt - pt).abs());
        let cross: f64 = m.iter().zip(&p).map(|(a, b)| b * (a - b)).sum();
        let agg = (p[2] - m[2]) + cross + pt * (mt - pt);
        let uni = (p[2] - m[2]) + cross + pt * (mt - pt) / 5.0;
        for (got, want) in [
            (r.topk_kl, kl),
            (r.topk_tv, tv),
            (r.ddot_aggregated, agg),
            (r.ddot_uniform, uni),
            (r.rollout_tail, mt),
            (r.train_tail, pt),
            (r.prob_diff, p[2] - m[2]),
        ] {
            assert!((got - want).abs() < 1e-14, "{got} {want}");
        }
        // V = |S|: no uniform tail term.
        let r = topk_row(&mu, &pi, 2, 3);
        assert!((r.ddot_uniform - ((p[2] - m[2]) + cross)).abs() < 1e-15);
    }

    /// One tail under the 1e-12 floor, the other not: the KL takes the clamped tail term
    /// `μ̂ ln(μ̂/π̂)` (the unclamped closed form applies only when neither tail is clamped).
    #[test]
    fn one_clamped_tail_uses_the_floor() {
        let naive = |mu: &[f64], pi: &[f64]| {
            let mt = (1.0 - mu.iter().sum::<f64>()).max(TAIL_FLOOR);
            let pt = (1.0 - pi.iter().sum::<f64>()).max(TAIL_FLOOR);
            mu.iter()
                .zip(pi)
                .map(|(a, b)| a * (a / b).ln())
                .sum::<f64>()
                + mt * (mt / pt).ln()
        };
        for (mu, pi) in [([0.6, 0.3], [0.5, 0.5]), ([0.5, 0.5], [0.6, 0.3])] {
            let ln = |x: [f64; 2]| x.map(f64::ln);
            let r = topk_row(&ln(mu), &ln(pi), 0, 10);
            let want = naive(&mu, &pi);
            assert!(
                (r.topk_kl - want).abs() < 1e-14 * want,
                "{} {want}",
                r.topk_kl
            );
        }
    }

    /// Neither tail clamped and the tails 1e-8 apart: the closed form `μ_t k3(ln π_t − ln μ_t)`
    /// keeps a KL of 4.5e-16 (the clamped form's `− μ_t + π_t` cancels it away).
    #[test]
    fn unclamped_tails_keep_a_tiny_kl() {
        let (lm, lp) = (-0.10536051565782628f64, -0.10536050565782629f64); // ln 0.9, + 1e-8
        let r = topk_row(&[lm], &[lp], 0, 4);
        // μ ln(μ/π) + μ_t ln(μ_t/π_t) at these exact inputs, 60 digits (python3 decimal)
        let want = 4.500000280262819e-16;
        assert!((r.topk_kl - want).abs() < 1e-6 * want, "{:e}", r.topk_kl);
    }

    /// The trainer's log-probs on S from logits divided by the temperature.
    #[test]
    fn gather_log_probs_divides_by_the_temperature() {
        let row = [1.0f32, -2.0, 0.5, 3.0, 3.0];
        let logits = Logits::from_f32(&row, 1, 5).unwrap();
        for tau in [0.7f64, 1.0, 2.5] {
            let x: Vec<f64> = row.iter().map(|&v| v as f64 / tau).collect();
            let lse = x.iter().map(|v| v.exp()).sum::<f64>().ln();
            let (mut out, mut buf) = ([0.0; 3], [0.0; 5]);
            gather_log_probs(&logits, 0, 1.0 / tau, &[3, 1, 4], &mut out, &mut buf).unwrap();
            for (o, id) in out.iter().zip([3, 1, 4]) {
                assert!((o - (x[id] - lse)).abs() < 1e-14, "τ={tau} id {id}: {o}");
            }
        }
        let bad = Logits::from_f32(&[f32::NEG_INFINITY; 3], 1, 3).unwrap();
        let e = gather_log_probs(&bad, 0, 1.0, &[0], &mut [0.0], &mut [0.0; 3]).unwrap_err();
        assert!(e.contains("-inf"), "{e}");
    }

    #[test]
    fn zero_trainer_probability_gives_infinite_kl() {
        let r = topk_row(&[-0.5, -1.0], &[-0.2, f64::NEG_INFINITY], 0, 5);
        assert_eq!(r.topk_kl, f64::INFINITY);
        assert!(r.topk_tv.is_finite() && r.ddot_aggregated.is_finite());
    }
}
