//! verl HEAD's rollout correction (`compute_rollout_correction_and_rejection_mask`) plus
//! trmask's criteria: one engine corrections pass, then IS weights, RS criteria, the token veto,
//! the DPPO / PDM mask and every metric.

use super::cppo::CppoColumns;
use super::dppo::dppo_keep;
use super::m2po::M2poColumns;
use super::opsm::OpsmColumns;
use super::plan::{Column, Plan};
use crate::bounds::lntrm_weight;
use crate::config::{Agg, Criterion, IsLevel, Resolved, Stat};
use crate::engine::plan::{CorrectionsRaw, MaskPlan};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::{Batch, Layout};
use crate::metrics::ctx::{vmax, vmin, Ctx};
use crate::metrics::diag::{from_columns, Columns as DiagColumns};
use crate::metrics::diagnostics::{group_metrics, length_metrics};
use crate::metrics::trmask::{kept_tokens, seq_histograms, trmask_metrics};
use crate::metrics::verl::{
    f32_frac, is_sequence_fractions, is_spread, is_token_fractions, offpolicy_metrics,
    seq_mean_metrics,
};
use crate::partial::{exchange, Acc, Empty, Exchange, FracMode, Partial, Sum};
use crate::stats::{Corrections, CriterionResult, SegmentStats, StatTable, SAFETY_BOUND};

/// One rank's corrections (weights batch-normalised over every rank through `ex`, so two
/// collective exchanges with it when `rollout_is_batch_normalize` is on, none otherwise) and
/// its metric partial (`Corrections::metrics` is left empty: merge the ranks' partials, then
/// finish). A shard without a valid token is legal when there are several ranks; the merged
/// partial's `#valid_tokens` must then be checked ([`check_valid_tokens`]).
pub(crate) fn compute_partial(
    engine: &dyn Engine,
    batch: &Batch,
    table: &StatTable,
    cfg: &Resolved,
    plan: &Plan,
    ex: &mut dyn Exchange,
) -> Result<(Corrections, Partial)> {
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
        n: n_tok,
        b,
    };
    if n_tok == 0 && ex.size() <= 1 {
        return Err(no_valid_token(batch.layout()));
    }
    let mut metrics = Partial::new();
    metrics.put(VALID_TOKENS, Acc::Count(n_tok as u64));
    if let Some(legacy) = &cfg.legacy {
        let c = super::legacy::compute(&ctx, table, cfg.is, legacy, seq_len, ex, &mut metrics)?;
        return Ok((c, metrics));
    }
    let lr = table.get("log_ratio")?;
    let rho = table.get("rho")?;
    let k1 = table.get("k1")?;

    // ---- off-policy metrics (verl's compute_offpolicy_metrics) ----
    let s_lr = ctx.reduce(lr)?;
    offpolicy_metrics(&ctx, table, lr, rho, &s_lr, &mut metrics)?;

    // ---- weights and masks: one engine pass (one GPU submission) ----
    let lntrm_w = lntrm_column(&ctx, cfg);
    let opsm = OpsmColumns::new(
        &ctx,
        batch,
        lr,
        cfg.criteria.iter().any(|c| c.agg == Agg::Opsm),
    )?;
    // M2PO's batch-global drop (one collective through `ex` with several ranks)
    let m2po_tau = cfg.criteria.iter().find(|c| c.stat == Stat::M2po);
    let m2po = M2poColumns::new(&ctx, batch, table, m2po_tau.map(|c| c.upper), ex)?;
    let cppo_spec = cfg.criteria.iter().find(|c| c.stat == Stat::Cppo);
    let cppo = CppoColumns::new(&ctx, batch, table, cppo_spec.map(|c| (c.upper, cfg.cppo)))?;
    let cols = Columns {
        lntrm: &lntrm_w,
        opsm: &opsm,
        m2po: &m2po,
        cppo: &cppo,
    };
    let raw = engine.corrections_pass(lr, segs, &bind(plan, table, &cols)?)?;

    // ---- IS weights ----
    let weights = match (cfg.is, &raw.weights) {
        (Some(is), Some(w)) => Some(is_weights(
            &ctx,
            is,
            rho,
            &s_lr,
            w.clone(),
            ex,
            &mut metrics,
        )?),
        _ => None,
    };

    // ---- RS criteria ----
    let mut keep: Vec<bool> = raw.mask.clone();
    let mut criteria = Vec::new();
    for (ci, c) in cfg.criteria.iter().enumerate() {
        let res = criterion(&ctx, table, c, ci, &raw, rho, k1, &cols, &mut metrics)?;
        criteria.push(res);
    }
    if !cfg.criteria.is_empty() {
        let rej = ctx.tok(|i| if keep[i] { 0.0 } else { 1.0 });
        let s = ctx.reduce(&rej)?;
        metrics.put("rollout_corr/rollout_rs_masked_fraction", ctx.mmean_all(&s));
        let k = (0..b).filter(|&i| s.sum[i] > 0.0).count();
        metrics.put(
            "rollout_corr/rollout_rs_seq_masked_fraction",
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

    // ---- DPPO / PDM token mask (docs/FORMAT.md, DPPO): ANDed in, no sequence decision ----
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

    if !cfg.verl_metrics_only {
        let n_kept = kept_tokens(ctx.mask, &final_mask);
        trmask_metrics(
            &seq_len,
            &seq_accept,
            &criteria,
            ctx.n as u64,
            n_kept,
            &mut metrics,
        );
        let stats: Vec<(&str, &[f64])> = criteria
            .iter()
            .map(|c| (c.name.as_str(), c.seq_stat.as_slice()))
            .collect();
        length_metrics(&seq_len, &seq_accept, &stats, &mut metrics);
        seq_histograms(&stats, &seq_len, &mut metrics);
        let cols = DiagColumns {
            k1,
            k3: table.get("k3")?,
            log_ratio: table.get("log_ratio")?,
            roll_lp: table.stats.get("rollout_log_prob").map(Vec::as_slice),
            entropy: table.stats.get("training_entropy").map(Vec::as_slice),
            adv: batch.advantages(),
            weights: weights.as_deref(),
        };
        let (feeds, diag) = from_columns(segs, &cols, &final_mask, &seq_accept);
        diag.put(&feeds, &mut metrics);
        if let Some(uid) = batch.uid() {
            group_metrics(uid, &seq_accept, &mut metrics);
        }
        if let Some(r) = &table.routing {
            let col = |n: &str| table.stats.get(n).map(Vec::as_slice);
            let (lr, k3) = (col("log_ratio"), col("k3"));
            crate::metrics::routing::routing_metrics(r, lr, k3, mask, &mut metrics);
        }
    }

    let c = Corrections {
        weights,
        mask: final_mask,
        seq_accept,
        seq_len,
        seq_reject_bits: bits,
        criteria,
        metrics: Default::default(),
        histograms: Default::default(),
    };
    Ok((c, metrics))
}

/// The internal count of valid tokens in a corrections partial.
const VALID_TOKENS: &str = "#valid_tokens";

/// verl's error for a batch without a valid token, naming the tensor that says so: the
/// `response_mask` of a padded batch, the `cu_seqlens` of a packed one (every sequence empty).
fn no_valid_token(layout: &Layout) -> Error {
    match layout {
        Layout::Padded { .. } => Error::input(
            "response_mask",
            "response_mask must contain at least one valid token (1).",
        ),
        Layout::Packed { .. } => Error::input(
            "cu_seqlens",
            "the batch must contain at least one valid token: every sequence is empty",
        ),
    }
}

/// The error a whole batch without a valid token gives, checked on the merged partial.
pub(crate) fn check_valid_tokens(merged: &Partial, layout: &Layout) -> Result<()> {
    if merged.count(VALID_TOKENS) == 0 {
        return Err(no_valid_token(layout));
    }
    Ok(())
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

/// The plan bound to this step's host columns.
fn bind<'a>(plan: &Plan, table: &'a StatTable, cols: &Columns<'a>) -> Result<MaskPlan<'a>> {
    let column = |c: &Column| -> Result<&'a [f64]> {
        Ok(match *c {
            Column::Table(name) => table.get(name)?,
            Column::LnTrm => cols.lntrm,
            Column::OpsmValue => &cols.opsm.value,
            Column::OpsmWeight => &cols.opsm.weight,
            Column::M2poDrop => &cols.m2po.drop,
            Column::CppoDrop => &cols.cppo.drop,
            Column::Recorded => {
                let need = || Error::config("route_flip", "needs both sides' routed experts");
                &table.routing.as_ref().ok_or_else(need)?.recorded
            }
        })
    };
    Ok(MaskPlan {
        criteria: plan.criteria.clone(),
        is: plan.is,
        columns: plan.columns.iter().map(column).collect::<Result<_>>()?,
    })
}

/// verl's IS metrics on the engine's weights `w` (before batch normalisation), then batch
/// normalisation by the mean over every rank (one exchange through `ex`).
fn is_weights(
    ctx: &Ctx,
    is: crate::config::IsSpec,
    rho: &[f64],
    s_lr: &SegmentStats,
    w: Vec<f64>,
    ex: &mut dyn Exchange,
    m: &mut Partial,
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
    m.put(p("rollout_is_mean"), is_mean.clone());
    match is.level {
        IsLevel::Sequence => is_sequence_fractions(&s_lr.sum, upper, lower, m),
        IsLevel::Token => {
            let count = |f: &dyn Fn(f64) -> bool| {
                Sum::of(
                    (0..raw.len())
                        .filter(|&i| ctx.mask[i])
                        .map(|i| f64::from(u8::from(f(raw[i])))),
                )
            };
            is_token_fractions(
                count(&|r| r > upper),
                count(&|r| r < lower),
                ctx.n as u64,
                ctx.tok_max(&s_w),
                ctx.tok_min(&s_w),
                m,
            );
        }
    }
    let (mut s1, mut s2) = (Sum::default(), Sum::default());
    for i in (0..w.len()).filter(|&i| ctx.mask[i]) {
        let wc = w[i].clamp(0.0, upper);
        s1.add(wc);
        s2.add(wc * wc);
    }
    is_spread(s1, s2, ctx.n as u64, m);
    let seq_mean = ctx.mmean_rows(&s_w);
    seq_mean_metrics(m, &|k| p(&format!("rollout_is_{k}")), &seq_mean, 1.0);
    let raw_seq = ctx.mmean_rows(&ctx.reduce(&raw)?);
    let hi = raw_seq.iter().filter(|&&x| x > upper).count();
    let lo = raw_seq.iter().filter(|&&x| x < lower).count();
    m.put(p("rollout_is_seq_fraction_high"), f32_frac(hi, b));
    m.put(p("rollout_is_seq_fraction_low"), f32_frac(lo, b));
    if let Some(l) = is.lower {
        let oob = ctx.tok(|i| (raw[i] < l || raw[i] > upper) as u8 as f64);
        m.put(p("rollout_is_oob_ratio"), ctx.mmean(&oob));
    }
    if is.batch_normalize {
        // phase 1: the normaliser's partial over every rank, then each rank's own weights
        let norm = match is.level {
            IsLevel::Token => is_mean,
            IsLevel::Sequence => {
                let valid: Vec<f64> = (0..b)
                    .filter(|&i| ctx.valid(i))
                    .map(|i| seq_mean[i])
                    .collect();
                Acc::mean(&valid, Empty::Zero)
            }
        };
        let key = p("rollout_is_batch_norm_factor");
        let mut local = Partial::new();
        local.put(key.clone(), norm);
        let wmean = exchange(ex, local)?.finish_one(&key)?.unwrap_or(0.0);
        if wmean > 1e-8 {
            w.iter_mut().for_each(|x| *x /= wmean);
            m.put(key, Acc::Const(wmean));
        } else {
            m.put(key, Acc::Const(1.0));
        }
    }
    Ok(w)
}

/// The host-built columns of the criteria that need more than the statistics table.
struct Columns<'a> {
    /// LN-TRM's token weights (empty when no criterion needs them).
    lntrm: &'a [f64],
    opsm: &'a OpsmColumns,
    m2po: &'a M2poColumns,
    cppo: &'a CppoColumns,
}

#[allow(clippy::too_many_arguments)]
fn criterion(
    ctx: &Ctx,
    table: &StatTable,
    c: &Criterion,
    ci: usize,
    raw: &CorrectionsRaw,
    rho: &[f64],
    k1: &[f64],
    cols: &Columns,
    m: &mut Partial,
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
            k3v = ctx.tok(|i| ser[i] * cols.lntrm[i]);
            &k3v
        }
        Stat::Opsm => &cols.opsm.value,
        Stat::M2po => &cols.m2po.value,
        Stat::Cppo => &cols.cppo.value,
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
    match c.stat {
        Stat::M2po => cols.m2po.metrics(ctx, &pre, m),
        Stat::Cppo => cols.cppo.metrics(ctx, &pre, m),
        _ => {}
    }
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
    let count = |f: &dyn Fn(f64) -> bool| valid_vals.iter().filter(|&&x| f(x)).count();
    m.put(format!("{pre}_mean"), ctx.mmean_all(&s_pts));
    if is_seq {
        m.put(format!("{pre}_max"), vmax(valid_vals.iter().copied()));
        m.put(format!("{pre}_min"), vmin(valid_vals.iter().copied()));
        m.put(
            format!("{pre}_fraction_high"),
            f32_frac(count(&|x| x > upper_log), nv),
        );
        let lo = if lower_log.is_some() {
            f32_frac(count(&|x| x < thr_l), nv)
        } else {
            Acc::Const(0.0)
        };
        m.put(format!("{pre}_fraction_low"), lo);
    } else {
        m.put(format!("{pre}_max"), ctx.tok_max(&s_pts));
        m.put(format!("{pre}_min"), ctx.tok_min(&s_pts));
        let hi = ctx.tok(|i| (pts[i] > upper_log) as u8 as f64);
        m.put(format!("{pre}_fraction_high"), ctx.mmean(&hi));
        let lo = if lower_log.is_some() {
            let lo = ctx.tok(|i| (pts[i] < thr_l) as u8 as f64);
            ctx.mmean(&lo)
        } else {
            Acc::Const(0.0)
        };
        m.put(format!("{pre}_fraction_low"), lo);
    }
    // verl's std of the clamped statistic (0 with a single valid token in the whole batch)
    let cmin = lower_log.unwrap_or(0.0);
    let sc = ctx.tok(|i| pts[i].max(cmin).min(upper_log));
    m.put(format!("{pre}_std"), ctx.std_and_ess(&sc, 0).0);
    seq_mean_metrics(m, &|k| format!("{pre}_{k}"), &valid_vals, 0.0);
    m.put(
        format!("{pre}_seq_fraction_high"),
        f32_frac(count(&|x| x > upper_log), nv),
    );
    if lower_log.is_some() {
        m.put(
            format!("{pre}_seq_fraction_low"),
            f32_frac(count(&|x| x < thr_l), nv),
        );
    }
    let rej = ctx.tok(|i| (!token_keep[i]) as u8 as f64);
    let s_rej = ctx.reduce(&rej)?;
    m.put(format!("{pre}_masked_fraction"), ctx.mmean_all(&s_rej));
    let seq_reject: Vec<bool> = (0..b).map(|i| s_rej.sum[i] > 0.0).collect();
    let k = (0..b).filter(|&i| ctx.valid(i) && seq_reject[i]).count();
    m.put(
        format!("{pre}_seq_masked_fraction"),
        Acc::frac(k, nv, FracMode::F64, Empty::Compute),
    );

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
