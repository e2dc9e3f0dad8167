//! The reference path: f64 accumulation everywhere, multi-threaded over rows where it pays.
//! It mirrors `gpu/` file for file.

pub(crate) mod masks;
mod segment_reduce;
mod token_stats;
mod topk_divergence;
mod vocab_divergence;

pub use masks::corrections_pass;
pub use segment_reduce::segment_reduce;
pub use token_stats::{k3_from_log_ratio, token_stats};
pub use topk_divergence::{neumaier_sum, topk_divergence, topk_row, TopkRow};
pub use vocab_divergence::vocab_divergence;
pub(crate) use vocab_divergence::{
    check_inputs as check_vocab_inputs, first_bad as first_bad_logit,
};

use crate::batch::{Batch, Logits, Segments};
use crate::engine::{Engine, SegmentStats, TokenStats, VocabStats};
use crate::error::Result;
use crate::topk::{TopkStats, TopkSupport, TrainerTopk};

/// The CPU reference engine.
#[derive(Clone, Debug, Default)]
pub struct CpuEngine;

impl CpuEngine {
    /// A new CPU engine (uses rayon's global pool).
    pub fn new() -> Self {
        CpuEngine
    }
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
        Ok(token_stats(rollout_log_prob, train_log_prob, mask))
    }

    fn segment_reduce(&self, values: &[&[f64]], segments: &Segments) -> Result<Vec<SegmentStats>> {
        Ok(values.iter().map(|v| segment_reduce(v, segments)).collect())
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
        crate::topk::topk_divergence(batch, support, trainer)
    }
}
