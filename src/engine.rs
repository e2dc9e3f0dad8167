//! The one trait implemented by the CPU reference ([`crate::cpu::CpuEngine`]) and the GPU
//! engine ([`crate::gpu::GpuEngine`]), so every computation and every test body runs on both.

use crate::batch::{Batch, Logits, Segments};
use crate::config::IsLevel;
use crate::error::Result;
use crate::topk::{TopkStats, TopkSupport, TrainerTopk};

/// verl's `SAFETY_BOUND`: log-ratios are clamped to ±20 before `exp` and in k1/k2/k3.
pub const SAFETY_BOUND: f64 = 20.0;

/// Per-token estimators of KL(π_roll‖π_train) from sampled-token log-probs (SPEC §1).
///
/// Every vector has one value per slot; invalid (masked / padding) slots hold 0.
/// With `lr = train − roll` and `c = clamp(lr, ±20)`: `log_ratio = lr` (unclamped),
/// `rho = exp(c)`, `k1 = −c`, `k2 = c²/2`, `k3 = expm1(c) − c`, `abs = |c|`, `ser = |expm1(c)|`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenStats {
    pub log_ratio: Vec<f64>,
    pub rho: Vec<f64>,
    pub k1: Vec<f64>,
    pub k2: Vec<f64>,
    pub k3: Vec<f64>,
    pub abs: Vec<f64>,
    pub ser: Vec<f64>,
}

/// Per-sequence reductions of one per-token statistic over the valid tokens of each sequence.
///
/// Empty sequences (no valid token, including all-masked rows) have `count = 0`, `sum = 0`,
/// `mean = 0`, `max = 0`, `min = 0` and `argmax = -1`. `argmax` is the offset of the first
/// maximal token from the start of its sequence's slot range (the column `t` in a padded batch).
/// `mean` is the exact mean `sum / count` (verl's `+1e-8` quirk is applied by the verl layer).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SegmentStats {
    pub sum: Vec<f64>,
    pub mean: Vec<f64>,
    pub max: Vec<f64>,
    pub min: Vec<f64>,
    pub argmax: Vec<i64>,
    pub count: Vec<u32>,
}

/// Exact per-token divergences over the whole vocabulary (SPEC §4), one value per slot,
/// 0 at invalid slots. `rollout_logp` / `train_logp` are the log-probs of `responses[t]`
/// (0 when no responses were given).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VocabStats {
    pub kl: Vec<f64>,
    pub kl_rev: Vec<f64>,
    pub tv: Vec<f64>,
    pub rollout_entropy: Vec<f64>,
    pub training_entropy: Vec<f64>,
    pub rollout_logp: Vec<f64>,
    pub train_logp: Vec<f64>,
}

/// Where a criterion's per-token statistic comes from in [`Engine::corrections_pass`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskSource {
    /// `−clamp(lr)`.
    K1,
    /// `clamp(lr)²/2`.
    K2,
    /// trmask's k3, `expm1(c) − c` (the `k3` of [`TokenStats`]).
    K3,
    /// verl's k3, `exp(c) − 1 − c` (evaluated as `(ρ − 1) + k1` on the CPU reference).
    K3Verl,
    /// `|clamp(lr)|`.
    Abs,
    /// `|expm1(clamp(lr))|`.
    Ser,
    /// Host-provided per-slot column `j` of [`MaskPlan::columns`] (`kl`, `tv`, `topk_kl`, …).
    Column(usize),
    /// `ser × column j` (LN-TRM: column j holds the weights `w_t`).
    SerWeighted(usize),
}

/// How a criterion aggregates its per-token statistic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskAgg {
    /// Per-token test.
    Token,
    /// Sum over the sequence's valid tokens.
    Sum,
    /// verl's `Σ / (L + 1e-8)`.
    MeanVerl,
    /// Exact mean `Σ / L` (0 for an empty sequence).
    Mean,
    /// Maximum over valid tokens (0 for an empty sequence).
    Max,
    /// `Σ stat / Σ column j` (0 when the denominator is 0): LN-TRM's `W / Z`.
    WeightedMean(usize),
}

/// One rejection criterion of a [`MaskPlan`]: keep iff `lower ≤ stat ≤ upper` (inclusive; the
/// bounds are in the statistic's space, e.g. `ln U` for k1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskCriterion {
    pub source: MaskSource,
    pub agg: MaskAgg,
    pub lower: Option<f64>,
    pub upper: f64,
}

/// IS weights of a [`MaskPlan`]: `raw = ρ_t` (token) or `exp(clamp(Σ lr))` (sequence), then
/// `min(raw, upper)` (TIS) or IcePop (`raw` if `lower ≤ raw ≤ upper`, else 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskIs {
    pub level: IsLevel,
    pub upper: f64,
    pub lower: Option<f64>,
}

/// What [`Engine::corrections_pass`] computes: criteria (at most 32, ANDed; bit i of the
/// reject bitmasks is criterion i) and optional IS weights.
#[derive(Clone, Debug, Default)]
pub struct MaskPlan<'a> {
    pub criteria: Vec<MaskCriterion>,
    pub is: Option<MaskIs>,
    /// Host-provided per-slot columns referenced by [`MaskSource::Column`],
    /// [`MaskSource::SerWeighted`] and [`MaskAgg::WeightedMean`].
    pub columns: Vec<&'a [f64]>,
}

/// Most criteria a [`MaskPlan`] may hold (one bit each).
pub const MAX_MASK_CRITERIA: usize = 32;

/// Per-token and per-sequence results of [`Engine::corrections_pass`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CorrectionsRaw {
    /// The per-token estimators of the log-ratio the pass was given.
    pub tokens: TokenStats,
    /// IS weights before batch normalisation (0 at invalid slots), when the plan has IS.
    pub weights: Option<Vec<f64>>,
    /// The modified response mask: valid and kept by every criterion.
    pub mask: Vec<bool>,
    /// Per slot: bit i set when criterion i rejected this (valid) token.
    pub token_reject: Vec<u32>,
    /// Per criterion, per sequence: the aggregated statistic (sequence criteria) or the
    /// fraction of the sequence's valid tokens the criterion rejected (token criteria).
    pub seq_stat: Vec<Vec<f64>>,
    /// Per sequence: bit i set when criterion i rejected at least one of its valid tokens.
    pub seq_reject: Vec<u32>,
    /// Per sequence: `Σ lr` over its valid tokens (unclamped; sequence IS).
    pub seq_log_ratio_sum: Vec<f64>,
}

/// A compute backend.
pub trait Engine: Send + Sync {
    /// A human-readable name (`cpu (2 threads)`, `gpu: llvmpipe (Vulkan)`, …).
    fn name(&self) -> String;

    /// True for the GPU engine.
    fn is_gpu(&self) -> bool {
        false
    }

    /// Per-token estimators from the rollout and training log-probs of the sampled tokens.
    fn token_stats(
        &self,
        rollout_log_prob: &[f64],
        train_log_prob: &[f64],
        mask: &[bool],
    ) -> Result<TokenStats>;

    /// Segmented reductions of each of `values` (one per-slot statistic each) over the sequences.
    fn segment_reduce(&self, values: &[&[f64]], segments: &Segments) -> Result<Vec<SegmentStats>>;

    /// Token statistics → per-sequence reductions → per-criterion keep decisions → modified
    /// mask and IS weights (before batch normalisation) for the log-ratio `lr` (per slot; read
    /// only at valid slots). The default is the f64 reference (`cpu::masks`), built on
    /// [`Engine::token_stats`] and one [`Engine::segment_reduce`] call; the GPU engine runs it
    /// as one submission.
    fn corrections_pass(
        &self,
        lr: &[f64],
        segments: &Segments,
        plan: &MaskPlan,
    ) -> Result<CorrectionsRaw> {
        crate::cpu::corrections_pass(self, lr, segments, plan)
    }

    /// Exact vocabulary divergences between two logits tensors after dividing both by
    /// `temperature`.
    fn vocab_divergence(
        &self,
        rollout: &Logits,
        train: &Logits,
        responses: Option<&[i64]>,
        mask: &[bool],
        temperature: f64,
    ) -> Result<VocabStats>;

    /// Per-slot top-K divergences (SPEC §7, [`crate::topk`]): the batch's rollout top-K
    /// (`rollout_topk_ids`, `rollout_topk_log_prob`, `responses`, and `rollout_log_prob` where
    /// y ∉ top-K) against `trainer` on the support `support`. Errors name the tensor and row.
    fn topk_divergence(
        &self,
        batch: &Batch,
        support: TopkSupport,
        trainer: TrainerTopk<'_>,
    ) -> Result<TopkStats>;
}
