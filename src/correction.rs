//! What a trainer consumes each step: importance weights, the modified response mask, per-sequence
//! decisions and statistics, and the metrics (verl's `rollout_corr/*` plus trmask's `trmask/*`).
//!
//! Weights and masks come from one `Engine::corrections_pass` call (a [`MaskPlan`] built from the
//! config): token statistics, the per-sequence reduction of every criterion's statistic, the
//! per-criterion keep decisions, the modified mask and the IS weights before batch
//! normalisation. On the GPU that is one submission (`shaders/masks.wgsl`); on the CPU it is the
//! f64 reference (`cpu/masks.rs`). The host then finishes batch normalisation, the token veto
//! and every metric in f64 from the per-token / per-sequence results and the [`StatTable`]
//! (host reductions, no device round trip per metric). verl's quirks (`mmean = Σ / (L + 1e-8)`, means over all
//! B rows including empty ones, float32-rounded fractions) are applied on top of exact sums and
//! counts, only for the quantities verl names.
//!
//! # Policies
//!
//! `lr = log π_train − log π_roll` where π_train is `old_log_prob` (verl's decoupled mode, as in
//! `compute_rollout_correction_and_rejection_mask`), or `log_prob` when the config sets
//! `bypass_mode` or the batch has no `old_log_prob`.
//!
//! # Loss normalisation (read this before wiring the outputs into a loss)
//!
//! * Multiply the per-token loss by `weights` (when IS is on) and by `mask`
//!   (`modified_response_mask`). Rejected tokens contribute nothing.
//! * verl's decoupled mode replaces `response_mask` by the modified mask *before* the loss, so a
//!   `token-mean` loss divides by the number of tokens that **survive** RS. In bypass mode the
//!   engine path passes the token count of the mask **before** RS (`batch_num_tokens`), so
//!   rejected tokens stay in the denominator and rejection shrinks the gradient. Pick one and
//!   keep it fixed; see `examples/policy_loss.rs`.
//! * GRPO/RLOO baselines are computed before RS: rejected sequences still enter the group
//!   means/stds of the advantages. trmask does not touch advantages.
//!
//! # `seq_reject_bits`
//!
//! Bit `i` (value `1 << i`) is set when criterion `i` of `rollout_rs` (in config order, after
//! verl's de-duplication) rejected at least one valid token of the sequence; when `token_veto`
//! is set it is bit `criteria.len()`. `seq_accept` is 1 when no bit is set. Empty sequences are
//! accepted (nothing to reject) and excluded from trmask's own statistics.
//!
//! # Token masks (DPPO / PDM) and sequence criteria
//!
//! `modified_response_mask` is the AND of, per valid token: every `rollout_rs` criterion
//! (a sequence criterion rejects all tokens of its sequence, a `token_*` criterion only its
//! token), the token veto, and — when the config has a `dppo` block — the DPPO / PDM keep mask
//! of [`crate::topk::dppo_mask`] (SPEC §7; needs the rollout top-K, `responses`, `old_logits`
//! and `advantages`). The DPPO mask drops single tokens only: it never rejects a sequence, so
//! it sets no bit of `seq_reject_bits` and leaves `seq_accept`, verl's `rollout_corr/*` RS
//! metrics and the per-criterion `trmask/reject_rate/*` unchanged; `trmask/token_reject_rate`
//! counts every dropped token, and the `trmask/dppo_*` / `trmask/topk_*` metrics describe the
//! DPPO mask itself. The `topk_kl` / `topk_tv` statistics (TRM on the reduced support) are
//! ordinary `<agg>_<stat>` criteria and behave like any other sequence criterion.

use crate::analysis::StatTable;
use crate::batch::{Batch, Segments};
use crate::config::{Agg, Criterion, IsLevel, Resolved};
use crate::engine::{
    CorrectionsRaw, Engine, MaskAgg, MaskCriterion, MaskIs, MaskPlan, MaskSource, SegmentStats,
    SAFETY_BOUND,
};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Per-sequence statistic and decision of one criterion.
#[derive(Clone, Debug)]
pub struct CriterionResult {
    /// The criterion (`seq_mean_k3`, `token_k1`, `seq_lntrm`, `token_veto`).
    pub name: String,
    /// Output tensor name: the criterion's name when it starts with `seq_`, else `seq_` + name.
    pub output_name: String,
    /// The per-sequence statistic: the aggregated value for sequence criteria (verl's `+1e-8`
    /// mean for verl's `seq_mean_k*`); for token criteria the fraction of the sequence's valid
    /// tokens it rejected; for `token_veto` the minimum ρ_t (1 for an empty sequence).
    pub seq_stat: Vec<f64>,
    /// True where the criterion rejected at least one valid token of the sequence.
    pub seq_reject: Vec<bool>,
}

/// Everything a trainer needs for one step.
#[derive(Clone, Debug)]
pub struct Corrections {
    /// `rollout_is_weights` per slot (0 at invalid slots), `None` when IS is off.
    pub weights: Option<Vec<f64>>,
    /// `modified_response_mask` per slot (1 keep, 0 rejected or invalid).
    pub mask: Vec<f64>,
    /// Per sequence: no criterion rejected any of its tokens.
    pub seq_accept: Vec<bool>,
    /// Per sequence: number of valid tokens.
    pub seq_len: Vec<usize>,
    /// Per sequence: bit i = criterion i rejected it (see the module docs).
    pub seq_reject_bits: Vec<u64>,
    /// Per criterion: per-sequence statistic and decision.
    pub criteria: Vec<CriterionResult>,
    /// verl's `rollout_corr/*` and trmask's `trmask/*` metrics.
    pub metrics: BTreeMap<String, f64>,
}

pub(crate) struct Ctx<'a> {
    pub(crate) segs: &'a Segments,
    pub(crate) mask: &'a [bool],
    pub(crate) owner: Vec<usize>,
    pub(crate) len: Vec<f64>,
    pub(crate) n: f64,
    pub(crate) b: usize,
}

/// verl's `*_seq_mean`, `*_seq_std` (unbiased, 0 for one row), `*_seq_max`, `*_seq_min` and
/// `*_seq_max_deviation` (from 1) of the per-row weight means; `name("seq_mean")` gives the key.
pub(crate) fn seq_mean_metrics(
    m: &mut BTreeMap<String, f64>,
    name: &dyn Fn(&str) -> String,
    seq_mean: &[f64],
    b: usize,
) {
    m.insert(name("seq_mean"), mean(seq_mean));
    m.insert(
        name("seq_std"),
        if b > 1 { std_unbiased(seq_mean) } else { 0.0 },
    );
    m.insert(name("seq_max"), vmax(seq_mean.iter().copied()));
    m.insert(name("seq_min"), vmin(seq_mean.iter().copied()));
    m.insert(
        name("seq_max_deviation"),
        vmax(seq_mean.iter().map(|x| (x - 1.0).abs())),
    );
}

pub(crate) fn f32_frac(k: usize, n: usize) -> f64 {
    (k as f32 / n as f32) as f64
}

impl Ctx<'_> {
    /// Host f64 reduction for metric finishing (the engines' per-token and per-sequence
    /// results come from `Engine::corrections_pass`; no device round trip per metric).
    pub(crate) fn reduce(&self, v: &[f64]) -> Result<SegmentStats> {
        Ok(crate::cpu::segment_reduce(v, self.segs))
    }
    /// Per-slot array from a per-token function (0 at invalid slots).
    pub(crate) fn tok(&self, f: impl Fn(usize) -> f64) -> Vec<f64> {
        (0..self.mask.len())
            .map(|i| if self.mask[i] { f(i) } else { 0.0 })
            .collect()
    }
    /// verl's per-row `masked_mean`: `Σ / (L + 1e-8)`.
    pub(crate) fn mmean_rows(&self, s: &SegmentStats) -> Vec<f64> {
        s.sum
            .iter()
            .zip(&self.len)
            .map(|(x, l)| x / (l + 1e-8))
            .collect()
    }
    /// verl's batch `masked_mean`: `Σ / (N + 1e-8)`.
    pub(crate) fn mmean_all(&self, s: &SegmentStats) -> f64 {
        s.sum.iter().sum::<f64>() / (self.n + 1e-8)
    }
    /// verl's std and effective sample size of (already clipped) weights `wc`:
    /// `std = sqrt(mmean(wc²) − mmean(wc)²)` (0 with a single valid token) and
    /// `ESS = 1 / mmean((wc / (mmean(wc) + 1e-8))²)`, `None` when that mean is 0 (verl divides by
    /// zero).
    pub(crate) fn std_and_ess(&self, wc: &[f64]) -> Result<(f64, Option<f64>)> {
        let mean_c = self.mmean(wc)?;
        let std = if self.n > 1.0 {
            let wc2 = self.tok(|i| wc[i] * wc[i]);
            (self.mmean(&wc2)? - mean_c * mean_c).max(0.0).sqrt()
        } else {
            0.0
        };
        let norm2 = self.tok(|i| {
            let x = wc[i] / (mean_c + 1e-8);
            x * x
        });
        let denom = self.mmean(&norm2)?;
        Ok((std, (denom != 0.0).then(|| 1.0 / denom)))
    }

    pub(crate) fn mmean(&self, v: &[f64]) -> Result<f64> {
        Ok(self.mmean_all(&self.reduce(v)?))
    }
    pub(crate) fn valid(&self, b: usize) -> bool {
        self.len[b] > 0.0
    }
    pub(crate) fn tok_max(&self, s: &SegmentStats) -> f64 {
        (0..self.b)
            .filter(|&b| s.count[b] > 0)
            .map(|b| s.max[b])
            .fold(f64::NEG_INFINITY, f64::max)
    }
    pub(crate) fn tok_min(&self, s: &SegmentStats) -> f64 {
        (0..self.b)
            .filter(|&b| s.count[b] > 0)
            .map(|b| s.min[b])
            .fold(f64::INFINITY, f64::min)
    }
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// torch's unbiased `std()`.
pub(crate) fn std_unbiased(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - 1.0)).sqrt()
}

pub(crate) fn vmax(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(f64::NEG_INFINITY, f64::max)
}
pub(crate) fn vmin(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

/// The once-per-step entry point for a trainer: batch in, [`Corrections`] out.
///
/// ```
/// use trmask::{Batch, CorrectionConfig, cpu::CpuEngine};
/// let batch = Batch::padded(2, 3, &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0])?
///     .with_log_probs("rollout_log_prob", vec![-1.0, -0.5, -0.2, -2.0, -1.0, 0.0])?
///     .with_log_probs("old_log_prob", vec![-1.0, -0.5, -0.2, -1.0, -3.0, 0.0])?;
/// let cfg = CorrectionConfig::preset("decoupled_k3_rs_token_tis")?;
/// let c = trmask::correction::correct(&CpuEngine::new(), &batch, &cfg)?;
/// assert_eq!(c.seq_accept, vec![true, false]); // sequence 1 drifts: seq_mean_k3 > 0.01
/// assert_eq!(c.mask, vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
/// assert!(c.weights.is_some() && c.metrics.contains_key("rollout_corr/rollout_is_mean"));
/// # Ok::<(), trmask::Error>(())
/// ```
pub fn correct(
    engine: &dyn Engine,
    batch: &Batch,
    config: &crate::CorrectionConfig,
) -> Result<Corrections> {
    let resolved = config.resolve()?;
    let table = crate::analysis::token_table_config(engine, batch, config)?;
    compute(engine, batch, &table, &resolved)
}

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
        return crate::legacy::compute(&ctx, table, cfg.is, legacy, seq_len);
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

/// ANDs the DPPO / PDM keep mask into `keep` and adds its `trmask/*` metrics.
fn dppo_keep(
    batch: &Batch,
    table: &StatTable,
    cfg: &crate::topk::DppoConfig,
    keep: &mut [bool],
    metrics: &mut BTreeMap<String, f64>,
) -> Result<()> {
    let stats = match &table.topk {
        Some(s) => s,
        None => {
            let missing = crate::analysis::topk_missing_input(batch).unwrap_or("old_logits");
            return Err(Error::input(
                missing,
                "is missing: dppo needs the rollout top-K (rollout_topk_ids, \
                 rollout_topk_log_prob), responses and old_logits",
            ));
        }
    };
    let adv = batch.advantages.as_deref().ok_or_else(|| {
        Error::input(
            "advantages",
            "is missing: dppo's direction test needs per-token advantages",
        )
    })?;
    let (dppo_keep, m) = crate::topk::dppo_mask(stats, adv, batch.mask(), cfg)?;
    for (k, d) in keep.iter_mut().zip(&dppo_keep) {
        *k = *k && *d > 0.0;
    }
    metrics.extend(m);
    Ok(())
}

pub(crate) fn offpolicy_metrics(
    ctx: &Ctx,
    table: &StatTable,
    lr: &[f64],
    rho: &[f64],
    s_lr: &SegmentStats,
    m: &mut BTreeMap<String, f64>,
) -> Result<()> {
    let p = |k: &str| format!("rollout_corr/{k}");
    if let (Ok(train), Ok(roll)) = (table.get("train_log_prob"), table.get("rollout_log_prob")) {
        let mt = ctx.mmean_rows(&ctx.reduce(train)?);
        let mr = ctx.mmean_rows(&ctx.reduce(roll)?);
        m.insert(
            p("training_ppl"),
            mean(&mt.iter().map(|x| (-x).exp()).collect::<Vec<_>>()),
        );
        m.insert(
            p("training_log_ppl"),
            mean(&mt.iter().map(|x| -x).collect::<Vec<_>>()),
        );
        m.insert(
            p("rollout_ppl"),
            mean(&mr.iter().map(|x| (-x).exp()).collect::<Vec<_>>()),
        );
        m.insert(
            p("rollout_log_ppl"),
            mean(&mr.iter().map(|x| -x).collect::<Vec<_>>()),
        );
        let d: Vec<f64> = mr.iter().zip(&mt).map(|(r, t)| r - t).collect();
        m.insert(p("log_ppl_diff"), mean(&d));
        m.insert(
            p("log_ppl_abs_diff"),
            mean(&d.iter().map(|x| x.abs()).collect::<Vec<_>>()),
        );
        m.insert(p("log_ppl_diff_max"), vmax(d.iter().copied()));
        m.insert(p("log_ppl_diff_min"), vmin(d.iter().copied()));
        m.insert(
            p("ppl_ratio"),
            mean(&d.iter().map(|x| x.exp()).collect::<Vec<_>>()),
        );
    }
    // kl = mmean(rollout − old) = mmean(−lr)
    let neg = ctx.tok(|i| -lr[i]);
    m.insert(p("kl"), ctx.mmean(&neg)?);
    let k3u = ctx.tok(|i| (lr[i].exp() - lr[i]) - 1.0);
    m.insert(p("k3_kl"), ctx.mmean(&k3u)?);
    let rho2 = ctx.tok(|i| rho[i] * rho[i]);
    m.insert(p("chi2_token"), ctx.mmean(&rho2)? - 1.0);
    let chi: Vec<f64> = s_lr
        .sum
        .iter()
        .map(|s| (2.0 * s.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp())
        .collect();
    m.insert(p("chi2_seq"), mean(&chi) - 1.0);
    Ok(())
}

/// LN-TRM token weights per slot (`w_t` from the token's rank among its sequence's valid
/// tokens; 0 at invalid slots), empty when no criterion needs them.
fn lntrm_column(ctx: &Ctx, cfg: &Resolved) -> Vec<f64> {
    if !cfg.criteria.iter().any(|c| c.stat == "lntrm") {
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
            lntrm_weight(ctx.len[s] as usize, rank[s], e, d)
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
        let source = match c.stat.as_str() {
            "k1" => MaskSource::K1,
            "k2" => MaskSource::K2,
            "k3" if c.is_verl() => MaskSource::K3Verl,
            "k3" => MaskSource::K3,
            "abs" => MaskSource::Abs,
            "ser" => MaskSource::Ser,
            "lntrm" => {
                let j = *lntrm_col.get_or_insert_with(|| col(lntrm_w));
                MaskSource::SerWeighted(j)
            }
            s => MaskSource::Column(col(table.get(s)?)),
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

/// LN-TRM token weights `w_j = min(1, (L−j)ε, sqrt((L−j)δ/2))`, j = 1..L (missing terms dropped).
pub fn lntrm_weight(l: usize, j: usize, eps: Option<f64>, delta: Option<f64>) -> f64 {
    let r = (l - j) as f64;
    let mut w: f64 = 1.0;
    if let Some(e) = eps {
        w = w.min(r * e);
    }
    if let Some(d) = delta {
        w = w.min((r * d / 2.0).sqrt());
    }
    w
}

/// LN-TRM of one sequence from its per-token ρ: `W/Z`, 0 when `Z = 0`.
pub fn lntrm(rho: &[f64], eps: Option<f64>, delta: Option<f64>) -> f64 {
    let l = rho.len();
    let (mut w, mut z) = (0.0, 0.0);
    for (j, r) in rho.iter().enumerate() {
        let wt = lntrm_weight(l, j + 1, eps, delta);
        w += (r - 1.0).abs() * wt;
        z += wt;
    }
    if z > 0.0 {
        w / z
    } else {
        0.0
    }
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
    let st: &[f64] = match c.stat.as_str() {
        "k3" if c.is_verl() => {
            // verl: exp(c) − 1 − c
            k3v = ctx.tok(|i| (rho[i] - 1.0) + k1[i]);
            &k3v
        }
        "lntrm" => {
            // per-token |ρ_t − 1|·w_t, w_t from the token's rank among its sequence's valid tokens
            let ser = table.get("ser")?;
            let mut rank = vec![0usize; ctx.segs.len()];
            let (e, d) = (cfg.ln_trm.eps, cfg.ln_trm.delta);
            k3v = (0..ctx.mask.len())
                .map(|i| {
                    if !ctx.mask[i] {
                        return 0.0;
                    }
                    let s = ctx.owner[i];
                    rank[s] += 1;
                    ser[i] * lntrm_weight(ctx.len[s] as usize, rank[s], e, d)
                })
                .collect();
            &k3v
        }
        s => table.get(s)?,
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

/// Linear-interpolation percentile (numpy's default) of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn ess(v: &[f64]) -> f64 {
    let s: f64 = v.iter().sum();
    let s2: f64 = v.iter().map(|x| x * x).sum();
    if s2 > 0.0 {
        s * s / (v.len() as f64 * s2)
    } else {
        0.0
    }
}

pub(crate) fn trmask_metrics(
    ctx: &Ctx,
    criteria: &[CriterionResult],
    seq_accept: &[bool],
    seq_len: &[usize],
    final_mask: &[f64],
    weights: Option<&[f64]>,
    m: &mut BTreeMap<String, f64>,
) -> Result<()> {
    let nonempty: Vec<usize> = (0..ctx.b).filter(|&i| seq_len[i] > 0).collect();
    let ne = nonempty.len() as f64;
    let rejected = nonempty.iter().filter(|&&i| !seq_accept[i]).count();
    m.insert("trmask/reject_rate".into(), rejected as f64 / ne);
    for c in criteria {
        let k = nonempty.iter().filter(|&&i| c.seq_reject[i]).count();
        m.insert(format!("trmask/reject_rate/{}", c.name), k as f64 / ne);
    }
    let kept: f64 = final_mask.iter().sum();
    m.insert("trmask/token_reject_rate".into(), 1.0 - kept / ctx.n);
    let mut lens = |prefix: &str, idx: Vec<usize>| {
        if idx.is_empty() {
            return;
        }
        let mut v: Vec<f64> = idx.iter().map(|&i| seq_len[i] as f64).collect();
        v.sort_by(f64::total_cmp);
        m.insert(format!("trmask/{prefix}_mean"), mean(&v));
        m.insert(format!("trmask/{prefix}_p50"), percentile(&v, 0.5));
        m.insert(format!("trmask/{prefix}_p90"), percentile(&v, 0.9));
        m.insert(format!("trmask/{prefix}_max"), v[v.len() - 1]);
    };
    lens("seq_len", nonempty.clone());
    lens(
        "accepted_seq_len",
        nonempty
            .iter()
            .copied()
            .filter(|&i| seq_accept[i])
            .collect(),
    );
    if let Some(w) = weights {
        // final weights on the tokens the final mask keeps
        let wk = ctx.tok(|i| w[i] * final_mask[i]);
        let s = ctx.reduce(&wk)?;
        let kept_tok: Vec<f64> = (0..w.len())
            .filter(|&i| ctx.mask[i] && final_mask[i] > 0.0)
            .map(|i| w[i])
            .collect();
        if !kept_tok.is_empty() {
            m.insert("trmask/ess_token".into(), ess(&kept_tok));
        }
        let cnt = ctx.reduce(final_mask)?;
        let seq_w: Vec<f64> = (0..ctx.b)
            .filter(|&i| cnt.sum[i] > 0.0)
            .map(|i| s.sum[i] / cnt.sum[i])
            .collect();
        if !seq_w.is_empty() {
            m.insert("trmask/ess_seq".into(), ess(&seq_w));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lntrm_example() {
        let v = lntrm(&[1.0, 1.1, 0.9, 2.0, 0.5], Some(0.1), Some(0.02));
        assert!((v - 0.21389031741350378).abs() < 1e-15, "{v}");
    }
}
