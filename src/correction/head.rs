//! verl HEAD's rollout correction (`compute_rollout_correction_and_rejection_mask`) plus
//! trmask's criteria: one engine corrections pass, then IS weights, RS criteria, the token veto,
//! the DPPO / PDM mask and every metric.

use super::cppo::CppoColumns;
use super::dppo::dppo_keep;
use super::lean::{
    batch_norm_factor, correction_metrics, corrections, criterion_result, diag_partial,
    veto_result, CritMetric, CritRec, SeqRec,
};
use super::m2po::M2poColumns;
use super::opsm::OpsmColumns;
use super::plan::{Column, Plan};
use crate::bounds::lntrm_rank_weight;
use crate::config::{Agg, Criterion, IsLevel, Resolved, Stat};
use crate::engine::plan::{CorrectionsRaw, MaskPlan};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::{Batch, Layout};
use crate::metrics::ctx::Ctx;
use crate::metrics::diag::{from_columns, Columns as DiagColumns};
use crate::metrics::trmask::kept_tokens;
use crate::metrics::verl::offpolicy_metrics;
use crate::partial::{Acc, Exchange, Partial};
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
    plan: &Plan,
    ex: &mut dyn Exchange,
) -> Result<(Corrections, Partial)> {
    let cfg = &plan.cfg;
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
    let mut raw = engine.corrections_pass(lr, segs, &bind(plan, table, &cols)?)?;
    // the engine's weights, before batch normalisation (moved out: the IS records read them)
    let raw_weights = raw.weights.take();

    // ---- the records verl's IS / RS metrics are finished from (as the fused pass's) ----
    let mut recs = vec![SeqRec::default(); b];
    for (r, &l) in recs.iter_mut().zip(&seq_len) {
        r.n = l as u64;
    }
    for i in (0..mask.len()).filter(|&i| mask[i] && !raw.mask[i]) {
        recs[ctx.owner[i]].n_rej_any += 1;
    }
    if let (Some(is), Some(w)) = (cfg.is, &raw_weights) {
        is_records(&ctx, is, rho, &s_lr, w, &mut recs)?;
    }
    let mut keep: Vec<bool> = raw.mask.clone();
    let mut criteria = Vec::new();
    let mut crit_recs = Vec::new();
    // how each criterion's metrics read its records (the plan's bounds)
    let specs: Vec<CritMetric> = (0..cfg.criteria.len())
        .map(|ci| CritMetric::of(plan, ci))
        .collect();
    for (ci, (c, spec)) in cfg.criteria.iter().zip(&specs).enumerate() {
        let (res, r) = criterion(
            &ctx,
            table,
            (c, spec),
            ci,
            &raw,
            (rho, k1),
            &cols,
            &mut metrics,
        )?;
        criteria.push(res);
        crit_recs.push(r);
    }
    correction_metrics(&mut metrics, cfg.is.as_ref(), &specs, &recs, &|ci, s| {
        crit_recs[ci][s]
    });
    let weights = match (cfg.is, raw_weights) {
        (Some(is), Some(mut w)) if is.batch_normalize => {
            let wmean = batch_norm_factor(&mut metrics, is, ex)?;
            w.iter_mut().for_each(|x| *x /= wmean);
            Some(w)
        }
        (Some(_), w) => w,
        (None, _) => None,
    };

    // ---- token veto (trmask; legacy verl semantics: any ρ_t < τ rejects the sequence) ----
    if let Some(tau) = cfg.token_veto {
        let s = ctx.reduce(rho)?;
        let veto = veto_result(tau, b, |i| (s.count[i] > 0).then_some(s.min[i]));
        for (i, k) in keep.iter_mut().enumerate() {
            if mask[i] && veto.seq_reject[ctx.owner[i]] {
                *k = false;
            }
        }
        criteria.push(veto);
    }

    // ---- DPPO / PDM token mask (docs/FORMAT.md, DPPO): ANDed in, no sequence decision ----
    if let Some(d) = &cfg.dppo {
        dppo_keep(batch, table, d, &mut keep, &mut metrics)?;
    }

    let final_mask: Vec<f64> = keep.iter().map(|&k| k as u8 as f64).collect();
    let c = corrections(weights, final_mask, seq_len, criteria);
    if !cfg.verl_metrics_only {
        let cols = DiagColumns {
            k1,
            k3: table.get("k3")?,
            log_ratio: table.get("log_ratio")?,
            roll_lp: table.stats.get("rollout_log_prob").map(Vec::as_slice),
            entropy: table.stats.get("training_entropy").map(Vec::as_slice),
            adv: batch.advantages(),
            weights: c.weights.as_deref(),
        };
        let (feeds, diag) = from_columns(segs, &cols, &c.mask, &c.seq_accept, cfg.histograms);
        let counts = (ctx.n as u64, kept_tokens(ctx.mask, &c.mask));
        diag_partial(&c, counts, &diag, &feeds, batch.uid(), &mut metrics);
        if let Some(r) = &table.routing {
            let col = |n: &str| table.stats.get(n).map(Vec::as_slice);
            let (lr, k3) = (col("log_ratio"), col("k3"));
            crate::metrics::routing::routing_metrics(r, lr, k3, mask, &mut metrics);
        }
    }
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
    let mut rank = vec![0u64; ctx.segs.len()];
    (0..ctx.mask.len())
        .map(|i| {
            if !ctx.mask[i] {
                return 0.0;
            }
            let s = ctx.owner[i];
            rank[s] += 1;
            lntrm_rank_weight(ctx.len[s] as u64, rank[s], e, d)
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

/// The IS fields of each sequence's record from the engine's weights `w` (before batch
/// normalisation).
fn is_records(
    ctx: &Ctx,
    is: crate::config::IsSpec,
    rho: &[f64],
    s_lr: &SegmentStats,
    w: &[f64],
    recs: &mut [SeqRec],
) -> Result<()> {
    let lower = is.lower.unwrap_or(1.0 / is.upper);
    let seq_w = |s: usize| s_lr.sum[s].clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();
    // the segment reduction and the loop below read valid slots only
    let seq_raw: Vec<f64>;
    let raw: &[f64] = match is.level {
        IsLevel::Token => rho,
        IsLevel::Sequence => {
            seq_raw = ctx.tok(|i| seq_w(ctx.owner[i]));
            &seq_raw
        }
    };
    // per-sequence sums and extrema by the engine's segment reduction (the fused pass's lanes)
    let (s_w, s_raw) = (ctx.reduce(w)?, ctx.reduce(raw)?);
    for (s, r) in recs.iter_mut().enumerate() {
        (r.s_lr, r.s_w, r.s_raw) = (s_lr.sum[s], s_w.sum[s], s_raw.sum[s]);
        if s_w.count[s] > 0 {
            (r.w_max, r.w_min) = (s_w.max[s], s_w.min[s]);
        }
    }
    for i in (0..w.len()).filter(|&i| ctx.mask[i]) {
        let r = &mut recs[ctx.owner[i]];
        let wc = w[i].clamp(0.0, is.upper);
        r.s_wc.add(wc);
        r.s_wc2.add(wc * wc);
        r.is_hi += u64::from(raw[i] > is.upper);
        r.is_lo += u64::from(raw[i] < lower);
        if let Some(l) = is.lower {
            r.is_oob += u64::from(raw[i] < l || raw[i] > is.upper);
        }
    }
    Ok(())
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
    (c, spec): (&Criterion, &CritMetric),
    ci: usize,
    raw: &CorrectionsRaw,
    (rho, k1): (&[f64], &[f64]),
    cols: &Columns,
    m: &mut Partial,
) -> Result<(CriterionResult, Vec<CritRec>)> {
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
    let (lower_log, upper_log) = (spec.lower, spec.upper);
    // decisions and sequence statistics from the engine pass
    let seq_stat: Option<Vec<f64>> = match c.agg {
        Agg::Token => None,
        _ => Some(raw.seq_stat[ci].clone()),
    };
    let bit = 1u32 << ci;
    let token_keep: Vec<bool> = raw.token_reject.iter().map(|&r| r & bit == 0).collect();
    let pre = format!("rollout_corr/rollout_rs_{}", c.name);
    match c.stat {
        Stat::M2po => cols.m2po.metrics(ctx, &pre, m),
        Stat::Cppo => cols.cppo.metrics(ctx, &pre, m),
        _ => {}
    }
    // the records verl's compute_rs_metrics reads (the fused pass fills the same)
    let mut recs = vec![CritRec::default(); b];
    if seq_stat.is_none() {
        // per-sequence sums and extrema by the engine's segment reduction (valid slots only)
        let s_st = ctx.reduce(st)?;
        for (s, r) in recs
            .iter_mut()
            .enumerate()
            .filter(|(s, _)| s_st.count[*s] > 0)
        {
            (r.pts, r.tmax, r.tmin) = (s_st.sum[s], s_st.max[s], s_st.min[s]);
        }
    }
    let (lo_c, hi_c) = (lower_log.unwrap_or(0.0), upper_log);
    for i in (0..ctx.mask.len()).filter(|&i| ctx.mask[i]) {
        let r = &mut recs[ctx.owner[i]];
        r.rej += u64::from(!token_keep[i]);
        if seq_stat.is_none() {
            let x = st[i];
            r.hi += u64::from(x > upper_log);
            r.lo += u64::from(lower_log.is_some() && x < lo_c);
            let sc = x.max(lo_c).min(hi_c);
            r.sc1.add(sc);
            r.sc2.add(sc * sc);
        }
    }
    if let Some(v) = &seq_stat {
        for (s, r) in recs.iter_mut().enumerate() {
            r.set_seq_value(ctx.len[s], v[s], lower_log, upper_log);
        }
    }
    let res = criterion_result(&c.name, seq_stat.is_none(), b, |s| {
        (ctx.len[s] as u64, recs[s])
    });
    Ok((res, recs))
}
