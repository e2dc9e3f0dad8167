//! The reference path: f64 accumulation everywhere, multi-threaded over rows where it pays.
//! It mirrors `gpu/` file for file; the corrections pass is the shared f64 composition in
//! [`crate::passes`]. Every entry point checks its shapes and returns an `Err`, never panics.

mod segment_reduce;
mod token_stats;
mod topk_divergence;
mod vocab_divergence;
mod vocab_fast;
mod vocab_general;

// The engine's building blocks, for benches and tests; the API is `CpuEngine` (the `Engine`
// trait), which checks shapes before calling them.
#[doc(hidden)]
pub use segment_reduce::segment_reduce;
#[doc(hidden)]
pub use token_stats::token_stats;
#[doc(hidden)]
pub use topk_divergence::topk_divergence_batch;
#[doc(hidden)]
pub use topk_divergence::{topk_divergence, topk_row, TopkRow};
#[doc(hidden)]
pub use vocab_divergence::vocab_divergence;
pub(crate) use vocab_divergence::{
    check_inputs as check_vocab_inputs, first_bad as first_bad_logit,
};

use crate::batch::{Batch, Segments};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::logits::Logits;
use crate::plan::{CorrectionsRaw, MaskPlan};
use crate::stats::{SegmentStats, TokenStats, TopkStats, TopkSupport, VocabStats};
use crate::support::TrainerTopk;

/// The CPU reference engine.
#[derive(Clone, Debug, Default)]
pub struct CpuEngine;

impl CpuEngine {
    /// A new CPU engine (uses rayon's global pool).
    pub fn new() -> Self {
        CpuEngine
    }
}

/// `Err` naming `name` unless `values` has one value per slot.
pub(crate) fn check_len(name: &str, values: usize, slots: usize) -> Result<()> {
    if values != slots {
        return Err(Error::input(
            name,
            format!("has {values} values but the batch has {slots} slots"),
        ));
    }
    Ok(())
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        format!("cpu ({} threads, f64)", rayon::current_num_threads())
    }

    fn token_stats(
        &self,
        rollout_log_prob: &[f64],
        train_log_prob: &[f64],
        mask: &[bool],
    ) -> Result<TokenStats> {
        check_len("rollout_log_prob", rollout_log_prob.len(), mask.len())?;
        check_len("train_log_prob", train_log_prob.len(), mask.len())?;
        Ok(token_stats(rollout_log_prob, train_log_prob, mask))
    }

    fn segment_reduce(&self, values: &[&[f64]], segments: &Segments) -> Result<Vec<SegmentStats>> {
        for (k, v) in values.iter().enumerate() {
            check_len(&format!("values[{k}]"), v.len(), segments.slots())?;
        }
        Ok(values.iter().map(|v| segment_reduce(v, segments)).collect())
    }

    fn corrections_pass(
        &self,
        lr: &[f64],
        segments: &Segments,
        plan: &MaskPlan,
    ) -> Result<CorrectionsRaw> {
        crate::passes::corrections_pass(self, lr, segments, plan)
    }

    fn vocab_divergence(
        &self,
        rollout: &Logits,
        train: &Logits,
        responses: Option<&[i64]>,
        mask: &[bool],
        temperature: f64,
    ) -> Result<VocabStats> {
        // device-resident logits (Logits::device) are for the GPU engine only
        rollout.host_bytes("rollout_logits")?;
        train.host_bytes("old_logits")?;
        vocab_divergence(rollout, train, responses, mask, temperature)
    }

    fn topk_divergence(
        &self,
        batch: &Batch,
        support: TopkSupport,
        trainer: TrainerTopk<'_>,
    ) -> Result<TopkStats> {
        if let TrainerTopk::Logits { logits, .. } = trainer {
            logits.host_bytes("old_logits")?;
        }
        topk_divergence_batch(batch, support, trainer)
    }
}
