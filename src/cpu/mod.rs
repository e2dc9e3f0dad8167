//! The reference path: f64 accumulation everywhere, multi-threaded over rows where it pays.
//! It mirrors `gpu/` file for file; the corrections pass is the shared f64 composition in
//! [`crate::engine::passes`]. Every entry point checks its shapes and returns an `Err`, never panics.

mod segment_reduce;
mod token_stats;
mod topk_divergence;
mod vocab_divergence;
mod vocab_f32;
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
pub(crate) use vocab_divergence::{
    check_inputs as check_vocab_inputs, first_bad as first_bad_logit,
};
#[doc(hidden)]
pub use vocab_divergence::{vocab_divergence, vocab_divergence_f32};

use crate::engine::plan::{CorrectionsRaw, MaskPlan};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::{Batch, Segments};
use crate::input::logits::Logits;
use crate::input::support::TrainerTopk;
use crate::stats::{SegmentStats, TokenStats, TopkStats, TopkSupport, VocabStats};

/// The CPU engine: the f64 reference, or the `cpu-fast` precision (vocabulary divergences in
/// f32, the GPU engine's tolerance; everything else in f64 as in the reference).
#[derive(Clone, Debug, Default)]
pub struct CpuEngine {
    fast: bool,
}

impl CpuEngine {
    /// The f64 reference engine (uses rayon's global pool).
    pub fn new() -> Self {
        CpuEngine { fast: false }
    }

    /// The `cpu-fast` engine ([`crate::engine::backend::Backend::CpuFast`]).
    pub fn fast() -> Self {
        CpuEngine { fast: true }
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
        let precision = if self.fast {
            "f32 vocabulary divergences"
        } else {
            "f64"
        };
        format!(
            "cpu ({} threads, {precision})",
            rayon::current_num_threads()
        )
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
        crate::engine::passes::corrections_pass(self, lr, segments, plan)
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
        if self.fast {
            vocab_divergence_f32(rollout, train, responses, mask, temperature)
        } else {
            vocab_divergence(rollout, train, responses, mask, temperature)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_names_its_precision() {
        let threads = format!("{} threads", rayon::current_num_threads());
        let (exact, fast) = (CpuEngine::new().name(), CpuEngine::fast().name());
        assert!(
            exact.starts_with("cpu (") && exact.contains(&threads) && exact.ends_with(", f64)")
        );
        assert!(fast.contains(&threads) && fast.ends_with("f32 vocabulary divergences)"));
    }
}
