//! The one trait implemented by the CPU reference ([`crate::cpu::CpuEngine`]) and the GPU
//! engine ([`crate::gpu::GpuEngine`]), so every computation and every test body runs on both.
//! The trait only: the corrections pass both engines compose from these primitives lives in
//! [`crate::engine::passes`].

use crate::engine::plan::{CorrectionsRaw, MaskPlan};
use crate::error::Result;
use crate::input::batch::{Batch, Segments};
use crate::input::logits::Logits;
use crate::input::support::TrainerTopk;
use crate::stats::{SegmentStats, TokenStats, TopkStats, TopkSupport, VocabStats};

/// A compute backend.
pub trait Engine: Send + Sync {
    /// A human-readable name (`cpu (2 threads)`, `gpu: llvmpipe (Vulkan)`, …).
    fn name(&self) -> String;

    /// True for the GPU engine.
    fn is_gpu(&self) -> bool {
        false
    }

    /// Gets ready to analyse `batch`: the GPU engine builds the kernels the analysis will use
    /// (vocabulary divergences, estimators, masks, segment reductions; the top-K kernel, whose
    /// variant depends on the configured support, at first use) all at once, one per core,
    /// instead of one after another at first use. Pipeline creation runs on the calling thread
    /// (measured on Mesa's lavapipe: 0.07–0.13 s for the vocabulary kernel, 0.03–0.04 s for
    /// the masks). The CPU engine has nothing to prepare. Never needed for correctness: a
    /// kernel that fails to build here fails again, with its error, where it is used. Every
    /// analysis and correction calls it first ([`crate::engine::passes::token_table_config`]).
    fn prepare(&self, batch: &Batch) {
        let _ = batch;
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
    /// only at valid slots). The CPU engine runs the f64 reference
    /// ([`crate::engine::passes::corrections_pass`], built on [`Engine::token_stats`] and one
    /// [`Engine::segment_reduce`] call); the GPU engine runs it as one submission.
    fn corrections_pass(
        &self,
        lr: &[f64],
        segments: &Segments,
        plan: &MaskPlan,
    ) -> Result<CorrectionsRaw>;

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

    /// Per-slot top-K divergences (docs/FORMAT.md, DPPO, [`crate::topk`]): the batch's rollout top-K
    /// (`rollout_topk_ids`, `rollout_topk_log_prob`, `responses`, and `rollout_log_prob` where
    /// y ∉ top-K) against `trainer` on the support `support`. Errors name the tensor and row.
    fn topk_divergence(
        &self,
        batch: &Batch,
        support: TopkSupport,
        trainer: TrainerTopk<'_>,
    ) -> Result<TopkStats>;
}
