//! The one trait implemented by the CPU reference ([`crate::cpu::CpuEngine`]) and the GPU
//! engine ([`crate::gpu::GpuEngine`]), so every computation and every test body runs on both.

use crate::batch::{Batch, Logits, Segments};
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
