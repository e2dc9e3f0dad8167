//! Top-K divergences and the DPPO / Predictive Divergence token masks (docs/FORMAT.md, DPPO).
//!
//! The rollout engine reports its top-K (vLLM `logprobs=K`): ids `rollout_topk_ids [slots, K]`
//! and log-probs `rollout_topk_log_prob [slots, K]`. Per valid slot t, with y = `responses[t]`:
//!
//! * **Support** `S_t` ([`TopkSupport`](crate::stats::TopkSupport)): `Union` (default) is top-K ∪ {y}, K + 1 wide when y is
//!   not among the top-K; `ReplaceKth` (DPPO) keeps |S| = K by replacing the lowest-ranked entry
//!   — the one with the smallest rollout log-prob, ties → the last such column, which is the K-th
//!   column for rank-ordered input — by y when y is not among the top-K.
//! * **Probabilities on S**: μ = π_roll from `rollout_topk_log_prob` (for y ∉ top-K:
//!   `rollout_log_prob[t]`; when y ∈ top-K the top-K value is used and `rollout_log_prob` is
//!   not read). π = π_train from [`TrainerTopk`]: either full trainer logits (`old_logits`,
//!   divided by the temperature; one pass per row computes the log-sum-exp and gathers S — no
//!   `[N, V]` log-softmax is ever materialised) or trainer log-probs given on S directly.
//! * **Tails**: `μ_tail = 1 − Σ_S μ = −expm1(logsumexp_S log μ)` (likewise `π_tail`), so tails of
//!   1e-15 survive; inside the divergences they are clamped, `μ̂ = max(μ_tail, 1e-12)`.
//! * `topk_kl = Σ_S μ (log μ − log π) + μ̂ (log μ̂ − log π̂)`,
//!   `topk_tv = ½ (Σ_S |μ − π| + |μ̂ − π̂|)`,
//!   `ddot = (π_y − μ_y) + Σ_S π_i (μ_i − π_i) + tail` with `tail = π̂ (μ̂ − π̂)` (aggregated) or
//!   `tail / (V − |S|)` (uniform; 0 when V = |S|).
//!
//! The clamp follows docs/FORMAT.md's top-K formulas literally: where both tails are below 1e-12 the tail term of
//! `topk_kl` vanishes, so `topk_kl` can differ from the exact reduced KL by
//! `μ_tail |log(μ_tail/π_tail)|` (≈ 1e-14 on the real-data sample, whose smallest tails are
//! 1e-32). [`TopkStats`](crate::stats::TopkStats) reports the unclamped tails.
//!
//! `trmask::topk::topk_divergence` computes these per slot (CPU, f64);
//! [`GpuEngine::topk_divergence`](crate::gpu::GpuEngine::topk_divergence) takes the same
//! arguments and streams the trainer logits on the GPU (f32, within `2e-3·|ref| + 2e-7` of the
//! reference; `ddot` within `+1e-6`). `trmask::topk::dppo_mask` turns them into a
//! per-slot keep mask plus `trmask/*` metrics. The corrections layer ANDs the keep mask into
//! `modified_response_mask`:
//!
//! ```
//! use trmask::{Batch, Logits};
//! use trmask::topk::{dppo_mask, topk_divergence, DppoConfig, TopkSupport, TrainerTopk};
//! // One packed sequence of 2 tokens, V = 4, K = 2.
//! let batch = Batch::packed(&[0, 2])?
//!     .with_responses(vec![0, 3])?
//!     .with_log_probs("rollout_log_prob", vec![-0.5, -3.0])?
//!     .with_log_probs("advantages", vec![1.0, -1.0])?
//!     .with_topk(vec![0, 1, 1, 2], vec![-0.5, -1.2, -0.4, -1.5], 2)?
//!     .with_logits("old_logits", Logits::from_f32(
//!         &[2.0, 1.0, 0.0, -1.0, 0.0, 1.0, -0.5, -2.0], 2, 4)?)?
//!     .build()?;
//! let stats = topk_divergence(&batch, TopkSupport::Union, TrainerTopk::from_batch(&batch, 1.0)?)?;
//! assert_eq!(stats.support_size, vec![2, 3]); // y = 3 joins the second row's support
//! let cfg: DppoConfig = DppoConfig::from_json(&serde_json::json!(
//!     {"divergence": "topk_tv", "delta": 0.05, "direction": "predictive_aggregated"}))?;
//! let adv = batch.advantages().unwrap();
//! let (keep, metrics) = dppo_mask(&stats, adv, batch.mask(), &cfg)?;
//! assert_eq!(keep.len(), 2);
//! assert!(metrics.contains_key("trmask/dppo_masked_fraction"));
//! # Ok::<(), trmask::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::logits::Logits;
use crate::math::log_sum_exp;
use crate::stats::TopkSupport;

/// Tails are clamped to at least this inside the divergences (docs/FORMAT.md, DPPO).
pub const TAIL_FLOOR: f64 = 1e-12;

/// Largest admissible `Σ_S μ` (and `Σ_S π` for trainer log-probs given on S): `1 + 1e-5`.
pub const SUPPORT_MASS_TOLERANCE: f64 = 1e-5;

/// The trainer side of the top-K divergences.
#[derive(Clone, Copy, Debug)]
pub enum TrainerTopk<'a> {
    /// Full trainer logits `[slots, V]` (`old_logits`, or `log_prob`'s logits in bypass mode),
    /// divided by `temperature` (finite, > 0) before the softmax.
    Logits {
        logits: &'a Logits,
        temperature: f64,
    },
    /// Trainer log-probs given on the support directly.
    LogProbs(TrainerSupportLogProbs<'a>),
}

/// Trainer log-probs on the rollout's top-K ids, for callers without trainer logits.
#[derive(Clone, Copy, Debug)]
pub struct TrainerSupportLogProbs<'a> {
    /// `old_topk_log_prob [slots, K]`: log π_train at `rollout_topk_ids`, same layout.
    pub topk_log_prob: &'a [f64],
    /// `old_log_prob [slots]`: log π_train(y_t); read only where y_t ∉ top-K.
    pub sampled_log_prob: &'a [f64],
    /// Vocabulary size V (ids are checked against it; `ddot_uniform` divides by `V − |S|`).
    pub vocab: usize,
}

impl<'a> TrainerTopk<'a> {
    /// The batch's `old_logits` at the given temperature.
    pub fn from_batch(batch: &'a Batch, temperature: f64) -> Result<Self> {
        let logits = batch.old_logits().ok_or_else(|| {
            Error::input(
                "old_logits",
                "is required for top-K divergences (or give trainer log-probs on the support)",
            )
        })?;
        Ok(TrainerTopk::Logits {
            logits,
            temperature,
        })
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        match self {
            TrainerTopk::Logits { logits, .. } => logits.vocab(),
            TrainerTopk::LogProbs(l) => l.vocab,
        }
    }
}

/// The validated support of every slot, shared by the CPU and GPU paths.
///
/// Row r of `ids` / `rollout_lp` / `train_lp` holds `width = K + 1` entries; the first
/// `len[r]` are S (`ids = −1` and log-prob 0 after them, and everywhere at invalid slots).
#[derive(Clone, Debug)]
pub struct PreparedSupport {
    /// K + 1.
    pub width: usize,
    /// Vocabulary size V.
    pub vocab: usize,
    /// Support ids `[slots, width]`, −1 where unused.
    pub ids: Vec<i64>,
    /// log μ on S `[slots, width]`.
    pub rollout_lp: Vec<f64>,
    /// log π on S when the trainer gave log-probs directly.
    pub train_lp: Option<Vec<f64>>,
    /// Index of y within the row's support.
    pub y_index: Vec<u32>,
    /// |S| (0 at invalid slots).
    pub len: Vec<u32>,
}

/// Checks the top-K inputs and builds S for every valid slot (validation): K ≥ 1,
/// ids in `[0, V)`, no duplicate id in a row, finite log-probs, `Σ_S μ ≤ 1 + 1e-5` (and
/// `Σ_S π` likewise for trainer log-probs). Invalid slots are never read.
pub fn prepare_support(
    batch: &Batch,
    support: TopkSupport,
    trainer: &TrainerTopk<'_>,
) -> Result<PreparedSupport> {
    let k = batch.topk();
    let (ids_in, lp_in) = match (batch.rollout_topk_ids(), batch.rollout_topk_log_prob()) {
        (Some(i), Some(l)) => (i, l),
        (None, _) => {
            return Err(Error::input(
                "rollout_topk_ids",
                "is required for top-K divergences",
            ))
        }
        (_, None) => {
            return Err(Error::input(
                "rollout_topk_log_prob",
                "is required for top-K divergences",
            ))
        }
    };
    // K ≥ 1 and the [slots, K] shapes were checked when the tensors were attached
    let slots = batch.slots();
    let responses = batch
        .responses()
        .ok_or_else(|| Error::input("responses", "is required for top-K divergences"))?;
    let vocab = trainer.vocab();
    if let Some(bv) = batch.vocab() {
        if bv != vocab {
            return Err(Error::input(
                "old_topk_log_prob",
                format!("vocabulary {vocab} differs from the batch logits' {bv}"),
            ));
        }
    }
    match trainer {
        TrainerTopk::Logits {
            logits,
            temperature,
        } => {
            crate::config::check_temperature("temperature", *temperature)?;
            if logits.rows() != slots {
                return Err(Error::input(
                    "old_logits",
                    format!("has {} rows, the batch {slots} slots", logits.rows()),
                ));
            }
        }
        TrainerTopk::LogProbs(t) => {
            if t.topk_log_prob.len() != slots * k {
                return Err(Error::input(
                    "old_topk_log_prob",
                    format!(
                        "has {} values, expected [{slots}, {k}]",
                        t.topk_log_prob.len()
                    ),
                ));
            }
            if t.sampled_log_prob.len() != slots {
                return Err(Error::input(
                    "old_log_prob",
                    format!("has {} values, expected {slots}", t.sampled_log_prob.len()),
                ));
            }
            if t.vocab == 0 {
                return Err(Error::input("old_topk_log_prob", "vocabulary size is 0"));
            }
        }
    }
    let train_in = match trainer {
        TrainerTopk::LogProbs(t) => Some(*t),
        TrainerTopk::Logits { .. } => None,
    };
    let width = k + 1;
    let mask = batch.mask();
    let mut out = PreparedSupport {
        width,
        vocab,
        ids: vec![-1; slots * width],
        rollout_lp: vec![0.0; slots * width],
        train_lp: train_in.map(|_| vec![0.0; slots * width]),
        y_index: vec![0; slots],
        len: vec![0; slots],
    };
    let mut sorted = Vec::with_capacity(width);
    for r in (0..slots).filter(|&r| mask[r]) {
        let pos = batch.position(r);
        let row_ids = &ids_in[r * k..(r + 1) * k];
        let row_lp = &lp_in[r * k..(r + 1) * k];
        for (j, &id) in row_ids.iter().enumerate() {
            if id < 0 || id as usize >= vocab {
                return Err(Error::input(
                    "rollout_topk_ids",
                    format!("id {id} at row {pos}, column {j} is outside [0, {vocab})"),
                ));
            }
            if !row_lp[j].is_finite() {
                return Err(Error::input(
                    "rollout_topk_log_prob",
                    format!("value {} at row {pos}, column {j} is not finite", row_lp[j]),
                ));
            }
            if let Some(t) = &train_in {
                let v = t.topk_log_prob[r * k + j];
                if !v.is_finite() {
                    return Err(Error::input(
                        "old_topk_log_prob",
                        format!("value {v} at row {pos}, column {j} is not finite"),
                    ));
                }
            }
        }
        sorted.clear();
        sorted.extend_from_slice(row_ids);
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::input(
                "rollout_topk_ids",
                format!("id {} appears twice in row {pos}", w[0]),
            ));
        }
        let y = responses[r];
        if y < 0 || y as usize >= vocab {
            return Err(Error::input(
                "responses",
                format!("token id {y} at valid position {pos} is outside [0, {vocab})"),
            ));
        }
        let o = r * width;
        out.ids[o..o + k].copy_from_slice(row_ids);
        out.rollout_lp[o..o + k].copy_from_slice(row_lp);
        if let (Some(t), Some(tl)) = (&train_in, out.train_lp.as_mut()) {
            tl[o..o + k].copy_from_slice(&t.topk_log_prob[r * k..(r + 1) * k]);
        }
        let mut len = k;
        let yi = match row_ids.iter().position(|&i| i == y) {
            Some(j) => j,
            None => {
                let roll_y = batch.rollout_log_prob().ok_or_else(|| {
                    Error::input(
                        "rollout_log_prob",
                        format!(
                            "is required: the sampled token {y} at {pos} is not among the top-K"
                        ),
                    )
                })?[r];
                let train_y = match &train_in {
                    Some(t) => {
                        let v = t.sampled_log_prob[r];
                        if !v.is_finite() {
                            return Err(Error::input(
                                "old_log_prob",
                                format!("value {v} at valid position {pos} is not finite"),
                            ));
                        }
                        v
                    }
                    None => 0.0,
                };
                let j = match support {
                    TopkSupport::Union => {
                        len = k + 1;
                        k
                    }
                    TopkSupport::ReplaceKth => {
                        // The lowest-ranked entry: smallest log-prob, ties → last column.
                        let mut j = 0;
                        for (c, &v) in row_lp.iter().enumerate() {
                            if v <= row_lp[j] {
                                j = c;
                            }
                        }
                        j
                    }
                };
                out.ids[o + j] = y;
                out.rollout_lp[o + j] = roll_y;
                if let Some(tl) = out.train_lp.as_mut() {
                    tl[o + j] = train_y;
                }
                j
            }
        };
        let mass = log_sum_exp(&out.rollout_lp[o..o + len]);
        if mass > SUPPORT_MASS_TOLERANCE.ln_1p() {
            return Err(Error::input(
                "rollout_topk_log_prob",
                format!(
                    "probabilities on the support (top-K ∪ sampled token) at row {pos} sum to {} > 1 + 1e-5",
                    mass.exp()
                ),
            ));
        }
        if let Some(tl) = &out.train_lp {
            let mass = log_sum_exp(&tl[o..o + len]);
            if mass > SUPPORT_MASS_TOLERANCE.ln_1p() {
                return Err(Error::input(
                    "old_topk_log_prob",
                    format!(
                        "probabilities on the support (top-K ∪ sampled token) at row {pos} sum to {} > 1 + 1e-5",
                        mass.exp()
                    ),
                ));
            }
        }
        out.y_index[r] = yi as u32;
        out.len[r] = len as u32;
    }
    Ok(out)
}
