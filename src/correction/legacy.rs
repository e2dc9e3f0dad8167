//! verl's legacy rollout-correction API (commit 9b718e1a, the parent of PR #4544), selected by
//! `"legacy": true` or by either legacy key (`rollout_rs_threshold_lower`,
//! `rollout_token_veto_threshold`):
//!
//! * IS metrics are computed on the raw weights **before** truncation; std/ESS clamp them to
//!   `[1/U, U]`; no IcePop.
//! * RS `rollout_rs` ∈ `token` (`exp(clamp20(lr))`), `sequence` (`exp(clamp20(Σ lr))`),
//!   `geometric` (`exp(clamp20(mmean(lr)))`), kept when `lower ≤ w ≤ upper`
//!   (`lower` defaults to `1/upper`), with the `rollout_rs_*` IS-style metrics.
//! * Token veto: a sequence with any valid `lr < ln τ` (τ rounded to float32) is rejected;
//!   `rollout_is_veto_fraction` and `rollout_is_catastrophic_token_fraction` are always logged.

use super::lean::{corrections, seq_output_name};
use crate::config::{IsLevel, IsSpec, LegacySpec};
use crate::error::Result;
use crate::metrics::ctx::{vmax, vmin, Ctx};
use crate::metrics::diag::{from_columns, Columns as DiagColumns};
use crate::metrics::trmask::{kept_tokens, trmask_metrics};
use crate::metrics::verl::{f32_frac, offpolicy_metrics, seq_mean_metrics};
use crate::partial::{exchange, Acc, Empty, Exchange, Partial};
use crate::stats::{Corrections, CriterionResult, StatTable, SAFETY_BOUND};

/// verl's legacy IS-style metrics of weights `w` (per slot, valid slots only read).
#[allow(clippy::too_many_arguments)]
fn ratio_metrics(
    ctx: &Ctx,
    prefix: &str,
    w: &[f64],
    seq_level: bool,
    log_for_metrics: &[f64],
    upper: f64,
    lower: f64,
    m: &mut Partial,
) -> Result<()> {
    let p = |k: &str| format!("rollout_corr/{prefix}_{k}");
    let b = ctx.b;
    let lu = (upper as f32).ln() as f64;
    let ll = (lower as f32).ln() as f64;
    let s_w = ctx.reduce(w)?;
    m.put(p("mean"), ctx.mmean_all(&s_w));
    if seq_level {
        // exp(min(·, 20)) and exp are monotone: the extremum of the transformed values
        let lmax = vmax(log_for_metrics.iter().map(|l| l.min(SAFETY_BOUND).exp()));
        let lmin = vmin(log_for_metrics.iter().map(|l| l.exp()));
        m.put(p("max"), lmax);
        m.put(p("min"), lmin);
        let hi = log_for_metrics.iter().filter(|&&x| x > lu).count();
        let lo = log_for_metrics.iter().filter(|&&x| x < ll).count();
        m.put(p("ratio_fraction_high"), f32_frac(hi, b));
        m.put(p("ratio_fraction_low"), f32_frac(lo, b));
    } else {
        let hi = ctx.tok(|i| (w[i] > upper) as u8 as f64);
        let lo = ctx.tok(|i| (w[i] < lower) as u8 as f64);
        m.put(p("ratio_fraction_high"), ctx.mmean(&hi));
        m.put(p("ratio_fraction_low"), ctx.mmean(&lo));
        m.put(p("max"), ctx.tok_max(&s_w));
        m.put(p("min"), ctx.tok_min(&s_w));
    }
    let wc = ctx.tok(|i| w[i].max(lower).min(upper));
    // the ESS error names `rollout_is` / `rollout_rs` (ESS_KEYS 1 and 2)
    let (std, ess) = ctx.std_and_ess(&wc, if prefix == "rollout_is" { 1 } else { 2 });
    m.put(p("std"), std);
    m.put(p("eff_sample_size"), ess);
    let seq_mean = ctx.mmean_rows(&s_w);
    seq_mean_metrics(m, &p, &seq_mean, 1.0);
    let hi = seq_mean.iter().filter(|&&x| x > upper).count();
    let lo = seq_mean.iter().filter(|&&x| x < lower).count();
    m.put(p("seq_fraction_high"), f32_frac(hi, b));
    m.put(p("seq_fraction_low"), f32_frac(lo, b));
    Ok(())
}

/// Legacy weights, masks and metrics.
pub(crate) fn compute(
    ctx: &Ctx,
    table: &StatTable,
    is: Option<IsSpec>,
    spec: &LegacySpec,
    seq_len: Vec<usize>,
    ex: &mut dyn Exchange,
    m: &mut Partial,
) -> Result<Corrections> {
    let lr = table.get("log_ratio")?;
    let rho = table.get("rho")?;
    let b = ctx.b;
    let s_lr = ctx.reduce(lr)?;
    let seq_sum = s_lr.sum.clone();
    let seq_mean_lr = ctx.mmean_rows(&s_lr);
    let clamp_exp = |x: f64| x.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();

    // ---- IS (metrics before truncation) ----
    let weights = match is {
        None => None,
        Some(is) => {
            let upper = is.upper;
            let raw = match is.level {
                IsLevel::Token => ctx.tok(|i| rho[i]),
                IsLevel::Sequence => ctx.tok(|i| clamp_exp(seq_sum[ctx.owner[i]])),
            };
            let seq = is.level == IsLevel::Sequence;
            ratio_metrics(
                ctx,
                "rollout_is",
                &raw,
                seq,
                &seq_sum,
                upper,
                1.0 / upper,
                m,
            )?;
            let mut w: Vec<f64> = raw.iter().map(|x| x.min(upper)).collect();
            if is.batch_normalize {
                // phase 1: the normaliser over every rank, then this rank's weights
                let norm = match is.level {
                    IsLevel::Token => ctx.mmean(&w),
                    IsLevel::Sequence => {
                        let sm = ctx.mmean_rows(&ctx.reduce(&w)?);
                        let valid: Vec<f64> =
                            (0..b).filter(|&i| ctx.valid(i)).map(|i| sm[i]).collect();
                        Acc::mean(&valid, Empty::Zero)
                    }
                };
                let key = "rollout_corr/rollout_is_batch_norm_factor";
                let mut local = Partial::new();
                local.put(key, norm);
                let wmean = exchange(ex, local)?.finish_one(key)?.unwrap_or(0.0);
                if wmean > 1e-8 {
                    w.iter_mut().for_each(|x| *x /= wmean);
                    m.put(key, Acc::Const(wmean));
                } else {
                    m.put(key, Acc::Const(1.0));
                }
            }
            Some(w)
        }
    };

    // ---- RS ----
    let mut keep: Vec<bool> = ctx.mask.to_vec();
    let mut criteria = Vec::new();
    if let Some(rs) = &spec.rs {
        let (w, seq_level, log_m, seq_stat): (Vec<f64>, bool, Vec<f64>, Option<Vec<f64>>) =
            match rs.mode.as_str() {
                "token" => (ctx.tok(|i| rho[i]), false, Vec::new(), None),
                "sequence" => (
                    ctx.tok(|i| clamp_exp(seq_sum[ctx.owner[i]])),
                    true,
                    seq_sum.clone(),
                    Some(seq_sum.clone()),
                ),
                _ => (
                    ctx.tok(|i| clamp_exp(seq_mean_lr[ctx.owner[i]])),
                    true,
                    seq_mean_lr.clone(),
                    Some(seq_mean_lr.clone()),
                ),
            };
        ratio_metrics(
            ctx,
            "rollout_rs",
            &w,
            seq_level,
            &log_m,
            rs.upper,
            rs.lower,
            m,
        )?;
        let ok = |x: f64| x >= rs.lower && x <= rs.upper;
        let tok_keep: Vec<bool> = (0..ctx.mask.len())
            .map(|i| !ctx.mask[i] || ok(w[i]))
            .collect();
        let rej = ctx.tok(|i| (!tok_keep[i]) as u8 as f64);
        let s_rej = ctx.reduce(&rej)?;
        m.put(
            "rollout_corr/rollout_rs_masked_fraction",
            ctx.mmean_all(&s_rej),
        );
        let seq_reject: Vec<bool> = (0..b).map(|i| s_rej.sum[i] > 0.0).collect();
        let frac = match &seq_stat {
            // row-level weight (an empty row has weight exp(0) = 1 and is kept)
            Some(v) => f32_frac(v.iter().filter(|&&x| !ok(clamp_exp(x))).count(), b),
            None => f32_frac(seq_reject.iter().filter(|&&r| r).count(), b),
        };
        m.put("rollout_corr/rollout_rs_seq_masked_fraction", frac);
        for (k, t) in keep.iter_mut().zip(&tok_keep) {
            *k = *k && *t;
        }
        let out_stat = seq_stat.unwrap_or_else(|| {
            (0..b)
                .map(|i| {
                    if s_rej.count[i] > 0 {
                        s_rej.sum[i] / s_rej.count[i] as f64
                    } else {
                        0.0
                    }
                })
                .collect()
        });
        criteria.push(CriterionResult {
            name: rs.mode.clone(),
            output_name: format!("seq_rs_{}", rs.mode),
            seq_stat: out_stat,
            seq_reject,
        });
    }

    // ---- token veto ----
    if let Some(tau) = spec.veto {
        let lv = (tau as f32).ln() as f64;
        let cat = ctx.tok(|i| (lr[i] < lv) as u8 as f64);
        let s_cat = ctx.reduce(&cat)?;
        let seq_reject: Vec<bool> = (0..b).map(|i| s_cat.sum[i] > 0.0).collect();
        m.put(
            "rollout_corr/rollout_is_veto_fraction",
            f32_frac(seq_reject.iter().filter(|&&r| r).count(), b),
        );
        m.put(
            "rollout_corr/rollout_is_catastrophic_token_fraction",
            ctx.mmean_all(&s_cat),
        );
        for (i, k) in keep.iter_mut().enumerate() {
            if ctx.mask[i] && seq_reject[ctx.owner[i]] {
                *k = false;
            }
        }
        let s_rho = ctx.reduce(rho)?;
        criteria.push(CriterionResult {
            name: "token_veto".into(),
            output_name: seq_output_name("token_veto"),
            seq_stat: (0..b)
                .map(|i| {
                    if s_rho.count[i] > 0 {
                        s_rho.min[i]
                    } else {
                        1.0
                    }
                })
                .collect(),
            seq_reject,
        });
    } else {
        m.put("rollout_corr/rollout_is_veto_fraction", Acc::Const(0.0));
        m.put(
            "rollout_corr/rollout_is_catastrophic_token_fraction",
            Acc::Const(0.0),
        );
    }

    offpolicy_metrics(ctx, table, lr, rho, &s_lr, m)?;

    let final_mask: Vec<f64> = keep.iter().map(|&k| k as u8 as f64).collect();
    let n_kept = kept_tokens(ctx.mask, &final_mask);
    let c = corrections(weights, final_mask, seq_len, criteria);
    trmask_metrics(
        &c.seq_len,
        &c.seq_accept,
        &c.criteria,
        ctx.n as u64,
        n_kept,
        m,
    );
    if let Some(w) = c.weights.as_deref() {
        let cols = DiagColumns {
            k1: table.get("k1")?,
            k3: table.get("k3")?,
            log_ratio: table.get("log_ratio")?,
            roll_lp: None,
            entropy: None,
            adv: None,
            weights: Some(w),
        };
        from_columns(ctx.segs, &cols, &c.mask, &c.seq_accept, false)
            .1
            .put_ess(m);
    }
    Ok(c)
}
