//! What a trainer consumes each step: importance weights, the modified response mask, per-sequence
//! decisions and statistics, and the metrics (verl's `rollout_corr/*` plus trmask's `trmask/*`).
//!
//! Weights and masks come from one `Engine::corrections_pass` call (a
//! [`MaskPlan`](crate::engine::plan::MaskPlan): the config's plan, compiled once by `plan`,
//! bound to the step's columns): token statistics, the per-sequence reduction of every criterion's statistic, the
//! per-criterion keep decisions, the modified mask and the IS weights before batch
//! normalisation. On the GPU that is one submission (`shaders/masks.wgsl`); on the CPU it is the
//! f64 reference (`passes/corrections.rs`). The host then finishes batch normalisation, the token veto
//! and every metric in f64 from the per-token / per-sequence results and the [`StatTable`](crate::stats::StatTable)
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
//! of `trmask::topk::dppo_mask` (docs/FORMAT.md, DPPO; needs the rollout top-K, `responses`, `old_logits`
//! and `advantages`). The DPPO mask drops single tokens only: it never rejects a sequence, so
//! it sets no bit of `seq_reject_bits` and leaves `seq_accept`, verl's `rollout_corr/*` RS
//! metrics and the per-criterion `trmask/reject_rate/*` unchanged; `trmask/token_reject_rate`
//! counts every dropped token, and the `trmask/dppo_*` / `trmask/topk_*` metrics describe the
//! DPPO mask itself. The `topk_kl` / `topk_tv` statistics (TRM on the reduced support) are
//! ordinary `<agg>_<stat>` criteria and behave like any other sequence criterion.

pub(crate) mod corrector;
mod cppo;
pub(crate) mod dppo;
mod head;
pub(crate) mod lean;
mod legacy;
mod m2po;
mod opsm;
pub(crate) mod plan;
pub(crate) mod run;
pub(crate) mod step;

pub use crate::stats::{Corrections, CriterionResult};
pub(crate) use head::check_valid_tokens;

use crate::config::CorrectionConfig;
use crate::engine::Engine;
use crate::error::Result;
use crate::input::batch::Batch;
use crate::partial::{Exchange, SingleProcess};

/// The once-per-step entry point for a trainer: batch in, [`Corrections`] out.
///
/// ```
/// use trmask::{Batch, CorrectionConfig, cpu::CpuEngine};
/// let batch = Batch::padded(2, 3, &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0])?
///     .with_log_probs("rollout_log_prob", vec![-1.0, -0.5, -0.2, -2.0, -1.0, 0.0])?
///     .with_log_probs("old_log_prob", vec![-1.0, -0.5, -0.2, -1.0, -3.0, 0.0])?
///     .build()?;
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
    config: &CorrectionConfig,
) -> Result<Corrections> {
    correct_shard(engine, batch, config, &mut SingleProcess)
}

/// [`correct`] for one data-parallel rank: `batch` is this rank's shard (whole sequences, any
/// number of them), `ex` carries the partials between ranks (every rank calls this
/// collectively with the same config). Weights, mask and per-sequence results are this
/// shard's rows of the whole-batch run (IS weights normalised over the whole batch); the
/// metrics are the whole batch's, identical on every rank.
pub fn correct_shard(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
    ex: &mut dyn Exchange,
) -> Result<Corrections> {
    run::correct_shard(engine, &plan::Plan::compile(config)?, batch, ex)
}
