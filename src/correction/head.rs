//! verl HEAD's rollout correction (`compute_rollout_correction_and_rejection_mask`) plus
//! trmask's criteria: one engine corrections pass, then IS weights, RS criteria, the token veto,
//! the DPPO / PDM mask and every metric.

use super::dppo::dppo_keep;
use crate::batch::Batch;
use crate::bounds::lntrm_weight;
use crate::config::{Agg, Criterion, IsLevel, Resolved, Stat};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::metrics::ctx::{mean, std_unbiased, vmax, vmin, Ctx};
use crate::metrics::diagnostics::{group_metrics, length_metrics};
use crate::metrics::trmask::trmask_metrics;
use crate::metrics::verl::{f32_frac, offpolicy_metrics, seq_mean_metrics};
use crate::plan::{CorrectionsRaw, MaskAgg, MaskCriterion, MaskIs, MaskPlan, MaskSource};
use crate::stats::{Corrections, CriterionResult, SegmentStats, StatTable, SAFETY_BOUND};
use std::collections::BTreeMap;

/// Computes weights, masks and metrics for `batch` from its per-token statistics.
pub fn compute(
    engine: &dyn Engine,
    batch: &Batch,
    table: &StatTable,
    cfg: &Resolved,
) -> Result<Corrections> {
    let segs = batch.segments();
    let mask = batch.mask();
    let seq_len = segs.lengths();
    let b = seq_len.len();
    let n_tok: usize = seq_len.iter().sum();
    let ctx = Ctx {
        segs,
        mask,
        owner: segs.slot_owner(),
        len: seq_len.iter().map(|&l| l as f64).collect(),
        n: n_tok as f64,
        b,
    };
    if n_tok == 0 {
        return Err(Error::input(
            "response_mask",
            "response_mask must contain at least one valid token (1).",
        ));
    }
    if let Some(legacy) = &cfg.legacy {
        return super::legacy::compute(&ctx, table, cfg.is, legacy, seq_len);
    }
    let lr = table.get("log_ratio")?;
    let rho = table.get("rho")?;
    let k1 = table.get("k1")?;
    let mut metrics = BTreeMap::new();

    // ---- off-policy metrics (verl's compute_offpolicy_metrics) ----
    let s_lr = ctx.reduce(lr)?;
    offpolicy_metrics(&ctx, table, lr, rho, &s_lr, &mut metrics)?;

    // ---- weights and masks: one engine pass (one GPU submission) ----
    let lntrm_w = lntrm_column(&ctx, cfg);
    let plan = mask_plan(table, cfg, &lntrm_w)?;
    let raw = engine.corrections_pass(lr, segs, &plan)?;

    // ---- IS weights ----
    let weights = match (cfg.is, &raw.weights) {
        (Some(is), Some(w)) => Some(is_weights(&ctx, is, rho, &s_lr, w.clone(), &mut metrics)?),
        _ => None,
    };

    // ---- RS criteria ----
    let mut keep: Vec<bool> = raw.mask.clone();
    let mut criteria = Vec::new();
    for (ci, c) in cfg.criteria.iter().enumerate() {
        let res = criterion(&ctx, table, c, ci, &raw, cfg, rho, k1, &mut metrics)?;
        criteria.push(res);
    }
    if !cfg.criteria.is_empty() {
        let rej = ctx.tok(|i| if keep[i] { 0.0 } else { 1.0 });
        let s = ctx.reduce(&rej)?;
        metrics.insert(
            "rollout_corr/rollout_rs_masked_fraction".into(),
            ctx.mmean_all(&s),
        );
        let k = (0..b).filter(|&i| s.sum[i] > 0.0).count();
        metrics.insert(
            "rollout_corr/rollout_rs_seq_masked_fraction".into(),
            f32_frac(k, b),
        );
    }

    // ---- token veto (trmask; legacy verl semantics: any ρ_t < τ rejects the sequence) ----
    if let Some(tau) = cfg.token_veto {
        let s = ctx.reduce(rho)?;
        let seq_stat: Vec<f64> = (0..b)
            .map(|i| if s.count[i] > 0 { s.min[i] } else { 1.0 })
            .collect();
        let seq_reject: Vec<bool> = (0..b).map(|i| s.count[i] > 0 && s.min[i] < tau).collect();
        for (i, k) in keep.iter_mut().enumerate() {
            if mask[i] && seq_reject[ctx.owner[i]] {
                *k = false;
            }
        }
        criteria.push(CriterionResult {
            name: "token_veto".into(),
            output_name: "seq_token_veto".into(),
            seq_stat,
            seq_reject,
        });
    }

    // ---- DPPO / PDM token mask (SPEC §7): ANDed in, no sequence decision ----
    if let Some(d) = &cfg.dppo {
        dppo_keep(batch, table, d, &mut keep, &mut metrics)?;
    }

    let mut bits = vec![0u64; b];
    for (ci, c) in criteria.iter().enumerate() {
        for (bb, r) in bits.iter_mut().zip(&c.seq_reject) {
            if *r && ci < 64 {
                *bb |= 1 << ci;
            }
        }
    }
    let seq_accept: Vec<bool> = (0..b)
        .map(|i| criteria.iter().all(|c| !c.seq_reject[i]))
        .collect();
    let final_mask: Vec<f64> = keep.iter().map(|&k| k as u8 as f64).collect();

    trmask_metrics(
        &ctx,
        &criteria,
        &seq_accept,
        &seq_len,
        &final_mask,
        weights.as_deref(),
        &mut metrics,
    )?;
    let est = [
        ("k1", k1),
        ("k3", table.get("k3")?),
        ("abs_log_ratio", table.get("abs")?),
    ];
    length_metrics(segs, est, &seq_accept, &criteria, &mut metrics);
    if let Some(uid) = &batch.uid {
        group_metrics(uid, &seq_accept, &mut metrics);
    }

    Ok(Corrections {
        weights,
        mask: final_mask,
        seq_accept,
        seq_len,
        seq_reject_bits: bits,
        criteria,
        metrics,
    })
}

/// LN-TRM token weights per slot (`w_t` from the token's rank among its sequence's valid
/// tokens; 0 at invalid slots), empty when no criterion needs them.
fn lntrm_column(ctx: &Ctx, cfg: &Resolved) -> Vec<f64> {
    if !cfg.criteria.iter().any(|c| c.stat == Stat::LnTrm) {
        return Vec::new();
    }
    let (e, d) = (cfg.ln_trm.eps, cfg.ln_trm.delta);
    let mut rank = vec![0usize; ctx.segs.len()];
    (0..ctx.mask.len())
        .map(|i| {
            if !ctx.mask[i] {
                return 0.0;
            }
            let s = ctx.owner[i];
            rank[s] += 1;
            lntrm_weight(ctx.len[s] as usize - rank[s], e, d)
        })
        .collect()
}

/// The engine-side description of the configured criteria and IS weights.
fn mask_plan<'a>(table: &'a StatTable, cfg: &Resolved, lntrm_w: &'a [f64]) -> Result<MaskPlan<'a>> {
    let mut columns: Vec<&'a [f64]> = Vec::new();
    let mut lntrm_col = None;
    let mut criteria = Vec::with_capacity(cfg.criteria.len());
    for c in &cfg.criteria {
        let mut col = |v: &'a [f64]| {
            columns.push(v);
            columns.len() - 1
        };
        let source = match c.stat {
            Stat::K1 => MaskSource::K1,
            Stat::K2 => MaskSource::K2,
            Stat::K3 if c.is_verl() => MaskSource::K3Verl,
            Stat::K3 => MaskSource::K3,
            Stat::Abs => MaskSource::Abs,
            Stat::Ser => MaskSource::Ser,
            Stat::LnTrm => {
                let j = *lntrm_col.get_or_insert_with(|| col(lntrm_w));
                MaskSource::SerWeighted(j)
            }
            // from both log-probs (columns j, j + 1) and the log-ratio
            Stat::BinaryKl => {
                let j = col(table.get("train_log_prob")?);
                col(table.get("rollout_log_prob")?);
                MaskSource::BinaryKl(j)
            }
            s => MaskSource::Column(col(table.get(s.name())?)),
        };
        let agg = match c.agg {
            Agg::Token => MaskAgg::Token,
            Agg::SeqSum => MaskAgg::Sum,
            Agg::SeqMean if c.is_verl() => MaskAgg::MeanVerl,
            Agg::SeqMean => MaskAgg::Mean,
            Agg::SeqMax => MaskAgg::Max,
            Agg::LnTrm => {
                let j = *lntrm_col.get_or_insert_with(|| col(lntrm_w));
                MaskAgg::WeightedMean(j)
            }
        };
        let (lower, upper) = if c.is_k1() {
            (c.lower.map(f64::ln), c.upper.ln())
        } else {
            (None, c.upper)
        };
        criteria.push(MaskCriterion {
            source,
            agg,
            lower,
            upper,
        });
    }
    Ok(MaskPlan {
        criteria,
        is: cfg.is.map(|is| MaskIs {
            level: is.level,
            upper: is.upper,
            lower: is.lower,
        }),
        columns,
    })
}

/// verl's IS metrics on the engine's weights `w` (before batch normalisation), then batch
/// normalisation.
fn is_weights(
    ctx: &Ctx,
    is: crate::config::IsSpec,
    rho: &[f64],
    s_lr: &SegmentStats,
    w: Vec<f64>,
    m: &mut BTreeMap<String, f64>,
) -> Result<Vec<f64>> {
    let p = |k: &str| format!("rollout_corr/{k}");
    let upper = is.upper;
    let b = ctx.b;
    let seq_w: Vec<f64> = s_lr
        .sum
        .iter()
        .map(|s| s.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp())
        .collect();
    let raw = match is.level {
        IsLevel::Token => ctx.tok(|i| rho[i]),
        IsLevel::Sequence => ctx.tok(|i| seq_w[ctx.owner[i]]),
    };
    let mut w = w;
    // ---- compute_is_metrics (before batch normalisation) ----
    let lower = is.lower.unwrap_or(1.0 / upper);
    let s_w = ctx.reduce(&w)?;
    let is_mean = ctx.mmean_all(&s_w);
    match is.level {
        IsLevel::Sequence => {
            let lmax = vmax(s_lr.sum.iter().copied());
            let lmin = vmin(s_lr.sum.iter().copied());
            m.insert(p("rollout_is_max"), lmax.min(SAFETY_BOUND).exp());
            m.insert(p("rollout_is_min"), lmin.exp());
            m.insert(p("rollout_is_mean"), is_mean);
            // torch.log(torch.tensor(U)) is float32 under the default dtype
            let lu = (upper as f32).ln() as f64;
            let ll = (lower as f32).ln() as f64;
            let hi = s_lr.sum.iter().filter(|&&s| s > lu).count();
            let lo = s_lr.sum.iter().filter(|&&s| s < ll).count();
            m.insert(p("rollout_is_ratio_fraction_high"), f32_frac(hi, b));
            m.insert(p("rollout_is_ratio_fraction_low"), f32_frac(lo, b));
        }
        IsLevel::Token => {
            m.insert(p("rollout_is_mean"), is_mean);
            let hi = ctx.tok(|i| (raw[i] > upper) as u8 as f64);
            let lo = ctx.tok(|i| (raw[i] < lower) as u8 as f64);
            m.insert(p("rollout_is_ratio_fraction_high"), ctx.mmean(&hi)?);
            m.insert(p("rollout_is_ratio_fraction_low"), ctx.mmean(&lo)?);
            m.insert(p("rollout_is_max"), ctx.tok_max(&s_w));
            m.insert(p("rollout_is_min"), ctx.tok_min(&s_w));
        }
    }
    let wc = ctx.tok(|i| w[i].clamp(0.0, upper));
    let (std, ess) = ctx.std_and_ess(&wc)?;
    m.insert(p("rollout_is_std"), std);
    let ess = ess.ok_or_else(|| {
        Error::config(
            "rollout_is_threshold",
            "every IS weight is zero, so the effective sample size is 1/0 \
             (verl raises ZeroDivisionError: float division by zero)",
        )
    })?;
    m.insert(p("rollout_is_eff_sample_size"), ess);
    let seq_mean = ctx.mmean_rows(&s_w);
    seq_mean_metrics(m, &|k| p(&format!("rollout_is_{k}")), &seq_mean, b);
    let raw_seq = ctx.mmean_rows(&ctx.reduce(&raw)?);
    let hi = raw_seq.iter().filter(|&&x| x > upper).count();
    let lo = raw_seq.iter().filter(|&&x| x < lower).count();
    m.insert(p("rollout_is_seq_fraction_high"), f32_frac(hi, b));
    m.insert(p("rollout_is_seq_fraction_low"), f32_frac(lo, b));
    if let Some(l) = is.lower {
        let oob = ctx.tok(|i| (raw[i] < l || raw[i] > upper) as u8 as f64);
        m.insert(p("rollout_is_oob_ratio"), ctx.mmean(&oob)?);
    }
    if is.batch_normalize {
        let wmean = match is.level {
            IsLevel::Token => is_mean,
            IsLevel::Sequence => {
                let valid: Vec<f64> = (0..b).map(|i| ctx.valid(i) as u8 as f64).collect();
                let num: f64 = seq_mean.iter().zip(&valid).map(|(a, v)| a * v).sum();
                num / valid.iter().sum::<f64>().max(1e-8)
            }
        };
        if wmean > 1e-8 {
            w.iter_mut().for_each(|x| *x /= wmean);
            m.insert(p("rollout_is_batch_norm_factor"), wmean);
        } else {
            m.insert(p("rollout_is_batch_norm_factor"), 1.0);
        }
    }
    Ok(w)
}

#[allow(clippy::too_many_arguments)]
fn criterion(
    ctx: &Ctx,
    table: &StatTable,
    c: &Criterion,
    ci: usize,
    raw: &CorrectionsRaw,
    cfg: &Resolved,
    rho: &[f64],
    k1: &[f64],
    m: &mut BTreeMap<String, f64>,
) -> Result<CriterionResult> {
    let b = ctx.b;
    let k3v: Vec<f64>;
    // verl's own per-token statistic, else the table's
    let st: &[f64] = match c.stat {
        Stat::K3 if c.is_verl() => {
            // verl: exp(c) − 1 − c
            k3v = ctx.tok(|i| (rho[i] - 1.0) + k1[i]);
            &k3v
        }
        Stat::LnTrm => {
            // per-token |ρ_t − 1|·w_t, w_t from the token's rank among its sequence's valid tokens
            let ser = table.get("ser")?;
            let w = lntrm_column(ctx, cfg);
            k3v = ctx.tok(|i| ser[i] * w[i]);
            &k3v
        }
        s => table.get(s.name())?,
    };
    let (lower_log, upper_log) = if c.is_k1() {
        (c.lower.map(f64::ln), c.upper.ln())
    } else {
        (None, c.upper)
    };
    // decisions and sequence statistics from the engine pass
    let seq_stat: Option<Vec<f64>> = match c.agg {
        Agg::Token => None,
        _ => Some(raw.seq_stat[ci].clone()),
    };
    let bit = 1u32 << ci;
    let token_keep: Vec<bool> = raw.token_reject.iter().map(|&r| r & bit == 0).collect();
    // ---- verl's compute_rs_metrics on the per-token statistic (broadcast for sequences) ----
    let pts: Vec<f64> = match &seq_stat {
        None => ctx.tok(|i| st[i]),
        Some(v) => ctx.tok(|i| v[ctx.owner[i]]),
    };
    let pre = format!("rollout_corr/rollout_rs_{}", c.name);
    let s_pts = ctx.reduce(&pts)?;
    let seq_values: Vec<f64> = match &seq_stat {
        None => ctx.mmean_rows(&s_pts),
        Some(v) => v.clone(),
    };
    let valid_vals: Vec<f64> = (0..b)
        .filter(|&i| ctx.valid(i))
        .map(|i| seq_values[i])
        .collect();
    let nv = valid_vals.len();
    let is_seq = seq_stat.is_some();
    let thr_l = lower_log.unwrap_or(0.0);
    m.insert(format!("{pre}_mean"), ctx.mmean_all(&s_pts));
    if is_seq {
        m.insert(format!("{pre}_max"), vmax(valid_vals.iter().copied()));
        m.insert(format!("{pre}_min"), vmin(valid_vals.iter().copied()));
        let hi = valid_vals.iter().filter(|&&x| x > upper_log).count();
        m.insert(format!("{pre}_fraction_high"), f32_frac(hi, nv));
        let lo = if lower_log.is_some() {
            f32_frac(valid_vals.iter().filter(|&&x| x < thr_l).count(), nv)
        } else {
            0.0
        };
        m.insert(format!("{pre}_fraction_low"), lo);
    } else {
        m.insert(format!("{pre}_max"), ctx.tok_max(&s_pts));
        m.insert(format!("{pre}_min"), ctx.tok_min(&s_pts));
        let hi = ctx.tok(|i| (pts[i] > upper_log) as u8 as f64);
        m.insert(format!("{pre}_fraction_high"), ctx.mmean(&hi)?);
        let lo = if lower_log.is_some() {
            let lo = ctx.tok(|i| (pts[i] < thr_l) as u8 as f64);
            ctx.mmean(&lo)?
        } else {
            0.0
        };
        m.insert(format!("{pre}_fraction_low"), lo);
    }
    if ctx.n > 1.0 {
        let cmin = lower_log.unwrap_or(0.0);
        let sc = ctx.tok(|i| pts[i].max(cmin).min(upper_log));
        let sc2 = ctx.tok(|i| sc[i] * sc[i]);
        let mc = ctx.mmean(&sc)?;
        let var = ctx.mmean(&sc2)? - mc * mc;
        m.insert(format!("{pre}_std"), var.max(0.0).sqrt());
    } else {
        m.insert(format!("{pre}_std"), 0.0);
    }
    m.insert(format!("{pre}_seq_mean"), mean(&valid_vals));
    m.insert(
        format!("{pre}_seq_std"),
        if nv > 1 {
            std_unbiased(&valid_vals)
        } else {
            0.0
        },
    );
    m.insert(format!("{pre}_seq_max"), vmax(valid_vals.iter().copied()));
    m.insert(format!("{pre}_seq_min"), vmin(valid_vals.iter().copied()));
    m.insert(
        format!("{pre}_seq_max_deviation"),
        vmax(valid_vals.iter().map(|x| x.abs())),
    );
    m.insert(
        format!("{pre}_seq_fraction_high"),
        f32_frac(valid_vals.iter().filter(|&&x| x > upper_log).count(), nv),
    );
    if lower_log.is_some() {
        m.insert(
            format!("{pre}_seq_fraction_low"),
            f32_frac(valid_vals.iter().filter(|&&x| x < thr_l).count(), nv),
        );
    }
    let rej = ctx.tok(|i| (!token_keep[i]) as u8 as f64);
    let s_rej = ctx.reduce(&rej)?;
    m.insert(format!("{pre}_masked_fraction"), ctx.mmean_all(&s_rej));
    let seq_reject: Vec<bool> = (0..b).map(|i| s_rej.sum[i] > 0.0).collect();
    let k = (0..b).filter(|&i| ctx.valid(i) && seq_reject[i]).count();
    m.insert(format!("{pre}_seq_masked_fraction"), k as f64 / nv as f64);

    let out_stat = match seq_stat {
        Some(v) => v,
        None => (0..b)
            .map(|i| {
                if s_rej.count[i] > 0 {
                    s_rej.sum[i] / s_rej.count[i] as f64
                } else {
                    0.0
                }
            })
            .collect(),
    };
    let output_name = if c.name.starts_with("seq_") {
        c.name.clone()
    } else {
        format!("seq_{}", c.name)
    };
    Ok(CriterionResult {
        name: c.name.clone(),
        output_name,
        seq_stat: out_stat,
        seq_reject,
    })
}
