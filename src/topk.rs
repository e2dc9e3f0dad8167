//! Top-K divergences and the DPPO / Predictive Divergence token masks (SPEC §7).
//!
//! The rollout engine reports its top-K (vLLM `logprobs=K`): ids `rollout_topk_ids [slots, K]`
//! and log-probs `rollout_topk_log_prob [slots, K]`. Per valid slot t, with y = `responses[t]`:
//!
//! * **Support** `S_t` ([`TopkSupport`]): `Union` (default) is top-K ∪ {y}, K + 1 wide when y is
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
//! The clamp follows SPEC §7 literally: where both tails are below 1e-12 the tail term of
//! `topk_kl` vanishes, so `topk_kl` can differ from the exact reduced KL by
//! `μ_tail |log(μ_tail/π_tail)|` (≈ 1e-14 on the real-data sample, whose smallest tails are
//! 1e-32). [`TopkStats`] reports the unclamped tails.
//!
//! [`topk_divergence`] computes these per slot (CPU, f64);
//! [`GpuEngine::topk_divergence`](crate::gpu::GpuEngine::topk_divergence) takes the same
//! arguments and streams the trainer logits on the GPU (f32, within `2e-3·|ref| + 2e-7` of the
//! reference; `ddot` within `+1e-6`). [`dppo_mask`] turns them into a
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
//!         &[2.0, 1.0, 0.0, -1.0, 0.0, 1.0, -0.5, -2.0], 2, 4)?)?;
//! let stats = topk_divergence(&batch, TopkSupport::Union, TrainerTopk::from_batch(&batch, 1.0)?)?;
//! assert_eq!(stats.support_size, vec![2, 3]); // y = 3 joins the second row's support
//! let cfg: DppoConfig = DppoConfig::from_json(&serde_json::json!(
//!     {"divergence": "topk_tv", "delta": 0.05, "direction": "predictive_aggregated"}))?;
//! let adv = batch.advantages.as_deref().unwrap();
//! let (keep, metrics) = dppo_mask(&stats, adv, batch.mask(), &cfg)?;
//! assert_eq!(keep.len(), 2);
//! assert!(metrics.contains_key("trmask/dppo_masked_fraction"));
//! # Ok::<(), trmask::Error>(())
//! ```

use crate::batch::{Batch, Logits};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Tails are clamped to at least this inside the divergences (SPEC §7).
pub const TAIL_FLOOR: f64 = 1e-12;

/// Largest admissible `Σ_S μ` (and `Σ_S π` for trainer log-probs given on S): `1 + 1e-5`.
pub const SUPPORT_MASS_TOLERANCE: f64 = 1e-5;

/// The divergence D tested against δ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkDivergence {
    /// [`TopkStats::topk_kl`] (default).
    #[default]
    TopkKl,
    /// [`TopkStats::topk_tv`].
    TopkTv,
}

/// Which quantity's sign, multiplied by the advantage, decides that a token over δ is dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DppoDirection {
    /// DPPO: `A · (π_y − μ_y) > 0` (default).
    #[default]
    Ratio,
    /// PDM: `A · ddot_aggregated > 0`.
    PredictiveAggregated,
    /// PDM: `A · ddot_uniform > 0`.
    PredictiveUniform,
}

/// How the sampled token joins the support when it is not among the rollout top-K.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkSupport {
    /// S = top-K ∪ {y} (K + 1 entries when y ∉ top-K). Default.
    #[default]
    Union,
    /// DPPO's rule: y replaces the lowest-ranked top-K entry, |S| = K.
    ReplaceKth,
}

/// The `dppo` configuration block (SPEC §10):
/// `{"divergence": "topk_kl"|"topk_tv", "delta": δ, "delta_low": δ_low, "delta_high": δ_high,
///   "direction": "ratio"|"predictive_aggregated"|"predictive_uniform",
///   "top_k_support": "union"|"replace_kth"}` (`support` is accepted for `top_k_support`).
///
/// **Threshold rule.** A token's threshold is `δ_high` when `π_y > μ_y` (the ratio
/// `π_train/π_roll` of the sampled token is above 1) and `δ_low` otherwise (`π_y ≤ μ_y`),
/// whatever the `direction`; each defaults to `delta` when absent. The sign of `π_y − μ_y`
/// always picks the side, also for the predictive directions.
///
/// Deserialize it with [`DppoConfig::from_json`] (which validates and names the bad key), or
/// embed it in a larger serde struct and call [`DppoConfig::validate`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DppoConfig {
    /// D: `topk_kl` (default) or `topk_tv`.
    #[serde(default)]
    pub divergence: TopkDivergence,
    /// δ, finite and > 0 (required).
    pub delta: f64,
    /// δ for tokens with `π_y ≤ μ_y`; defaults to `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_low: Option<f64>,
    /// δ for tokens with `π_y > μ_y`; defaults to `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_high: Option<f64>,
    /// The direction test (default `ratio`).
    #[serde(default)]
    pub direction: DppoDirection,
    /// The support S (default `union`); JSON key `top_k_support` or `support`.
    #[serde(default, rename = "top_k_support", alias = "support")]
    pub support: TopkSupport,
}

impl DppoConfig {
    /// A configuration with the given divergence, δ and direction, symmetric thresholds and
    /// the union support.
    pub fn new(divergence: TopkDivergence, delta: f64, direction: DppoDirection) -> Self {
        DppoConfig {
            divergence,
            delta,
            delta_low: None,
            delta_high: None,
            direction,
            support: TopkSupport::Union,
        }
    }

    /// Parses a `dppo` JSON object and validates it. Errors name the key (`dppo.delta`, …).
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let obj = value
            .as_object()
            .ok_or_else(|| Error::config("dppo", format!("expected an object, got {value}")))?;
        const KEYS: [&str; 7] = [
            "divergence",
            "delta",
            "delta_low",
            "delta_high",
            "direction",
            "top_k_support",
            "support",
        ];
        for k in obj.keys() {
            if !KEYS.contains(&k.as_str()) {
                return Err(Error::config(
                    format!("dppo.{k}"),
                    format!("unknown key; expected one of {}", KEYS.join(", ")),
                ));
            }
        }
        if obj.contains_key("support") && obj.contains_key("top_k_support") {
            return Err(Error::config(
                "dppo.support",
                "given together with its alias `top_k_support`; give one",
            ));
        }
        fn field<T: serde::de::DeserializeOwned>(
            obj: &serde_json::Map<String, serde_json::Value>,
            key: &str,
        ) -> Result<Option<T>> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => serde_json::from_value(v.clone())
                    .map(Some)
                    .map_err(|e| Error::config(format!("dppo.{key}"), format!("{v}: {e}"))),
            }
        }
        let delta = field::<f64>(obj, "delta")?
            .ok_or_else(|| Error::config("dppo.delta", "is required"))?;
        let cfg = DppoConfig {
            divergence: field(obj, "divergence")?.unwrap_or_default(),
            delta,
            delta_low: field(obj, "delta_low")?,
            delta_high: field(obj, "delta_high")?,
            direction: field(obj, "direction")?.unwrap_or_default(),
            support: match field(obj, "top_k_support")? {
                Some(s) => s,
                None => field(obj, "support")?.unwrap_or_default(),
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that every δ is finite and > 0.
    pub fn validate(&self) -> Result<()> {
        for (key, v) in [
            ("dppo.delta", Some(self.delta)),
            ("dppo.delta_low", self.delta_low),
            ("dppo.delta_high", self.delta_high),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(Error::config(key, format!("{v} must be finite and > 0")));
                }
            }
        }
        Ok(())
    }

    /// δ_low (`delta` when absent).
    pub fn delta_low(&self) -> f64 {
        self.delta_low.unwrap_or(self.delta)
    }
    /// δ_high (`delta` when absent).
    pub fn delta_high(&self) -> f64 {
        self.delta_high.unwrap_or(self.delta)
    }
    /// The threshold of a token whose sampled-token probability difference is `prob_diff`
    /// (`π_y − μ_y`): δ_high when it is > 0, δ_low otherwise.
    pub fn threshold(&self, prob_diff: f64) -> f64 {
        if prob_diff > 0.0 {
            self.delta_high()
        } else {
            self.delta_low()
        }
    }
}

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
        let logits = batch.old_logits.as_ref().ok_or_else(|| {
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

/// Per-slot top-K statistics (one value per slot; every field is 0 at invalid slots).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopkStats {
    /// KL(μ‖π) of the reduced distributions (S entries plus the tail), SPEC §7.
    pub topk_kl: Vec<f64>,
    /// Total variation of the reduced distributions.
    pub topk_tv: Vec<f64>,
    /// `ddot` with the aggregated tail `π̂(μ̂ − π̂)`.
    pub ddot_aggregated: Vec<f64>,
    /// `ddot` with the tail spread uniformly, `π̂(μ̂ − π̂)/(V − |S|)` (0 when V = |S|).
    pub ddot_uniform: Vec<f64>,
    /// Rollout tail `μ_tail = 1 − Σ_S μ` (not clamped; ≥ 0).
    pub rollout_tail: Vec<f64>,
    /// Trainer tail `π_tail = 1 − Σ_S π` (not clamped; ≥ 0).
    pub train_tail: Vec<f64>,
    /// `π_y − μ_y`, the sampled token's probability difference (trainer minus rollout).
    pub prob_diff: Vec<f64>,
    /// |S| (K or K + 1).
    pub support_size: Vec<u32>,
}

impl TopkStats {
    /// All-zero statistics for `n` slots.
    pub fn zeros(n: usize) -> Self {
        TopkStats {
            topk_kl: vec![0.0; n],
            topk_tv: vec![0.0; n],
            ddot_aggregated: vec![0.0; n],
            ddot_uniform: vec![0.0; n],
            rollout_tail: vec![0.0; n],
            train_tail: vec![0.0; n],
            prob_diff: vec![0.0; n],
            support_size: vec![0; n],
        }
    }
    /// Number of slots.
    pub fn len(&self) -> usize {
        self.topk_kl.len()
    }
    /// True when there is no slot.
    pub fn is_empty(&self) -> bool {
        self.topk_kl.is_empty()
    }
    /// The divergence D selected by `divergence`.
    pub fn divergence(&self, divergence: TopkDivergence) -> &[f64] {
        match divergence {
            TopkDivergence::TopkKl => &self.topk_kl,
            TopkDivergence::TopkTv => &self.topk_tv,
        }
    }
    /// The direction quantity (`prob_diff`, `ddot_aggregated` or `ddot_uniform`).
    pub fn direction(&self, direction: DppoDirection) -> &[f64] {
        match direction {
            DppoDirection::Ratio => &self.prob_diff,
            DppoDirection::PredictiveAggregated => &self.ddot_aggregated,
            DppoDirection::PredictiveUniform => &self.ddot_uniform,
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

/// `ln Σ exp(x_i)` with the largest term factored out and `ln_1p` of the rest, so that
/// `−expm1` of it keeps a small complement.
pub fn log_sum_exp(x: &[f64]) -> f64 {
    let (mut m, mut arg) = (f64::NEG_INFINITY, usize::MAX);
    for (i, &v) in x.iter().enumerate() {
        if v > m {
            m = v;
            arg = i;
        }
    }
    if arg == usize::MAX {
        return f64::NEG_INFINITY;
    }
    let rest: f64 = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != arg)
        .map(|(_, &v)| (v - m).exp())
        .sum();
    m + rest.ln_1p()
}

/// Checks the top-K inputs and builds S for every valid slot (SPEC §7 validation): K ≥ 1,
/// ids in `[0, V)`, no duplicate id in a row, finite log-probs, `Σ_S μ ≤ 1 + 1e-5` (and
/// `Σ_S π` likewise for trainer log-probs). Invalid slots are never read.
pub fn prepare_support(
    batch: &Batch,
    support: TopkSupport,
    trainer: &TrainerTopk<'_>,
) -> Result<PreparedSupport> {
    batch.validate()?;
    let k = batch.topk;
    let (ids_in, lp_in) = match (&batch.rollout_topk_ids, &batch.rollout_topk_log_prob) {
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
    if k == 0 {
        return Err(Error::input("rollout_topk_ids", "K must be at least 1"));
    }
    let slots = batch.slots();
    if ids_in.len() != slots * k || lp_in.len() != slots * k {
        return Err(Error::input(
            "rollout_topk_ids",
            format!(
                "{} ids / {} log-probs do not hold [{slots}, {k}]",
                ids_in.len(),
                lp_in.len()
            ),
        ));
    }
    let responses = batch
        .responses
        .as_ref()
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
            if !(temperature.is_finite() && *temperature > 0.0) {
                return Err(Error::config(
                    "temperature",
                    format!("{temperature} must be finite and > 0"),
                ));
            }
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
                let roll_y = batch.rollout_log_prob.as_ref().ok_or_else(|| {
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

/// Per-slot top-K divergences on the CPU in f64 (see the module docs for the definitions).
///
/// `batch` supplies `rollout_topk_ids`, `rollout_topk_log_prob`, `responses`, the mask and,
/// where some y_t is not among the top-K, `rollout_log_prob`. `trainer` supplies π on S
/// (use [`TrainerTopk::from_batch`] for `old_logits`). Errors name the tensor and the row.
pub fn topk_divergence(
    batch: &Batch,
    support: TopkSupport,
    trainer: TrainerTopk<'_>,
) -> Result<TopkStats> {
    let prepared = prepare_support(batch, support, &trainer)?;
    crate::cpu::topk_divergence(&prepared, &trainer, batch.mask(), |r| batch.position(r))
}

/// The DPPO / PDM keep mask and its metrics.
///
/// For each valid slot t, with D = `stats.divergence(cfg.divergence)[t]`,
/// δ_t = [`DppoConfig::threshold`]`(prob_diff[t])` and A = `advantages[t]`:
/// * `ratio`: drop iff `D > δ_t` and `A · (π_y − μ_y) > 0`;
/// * `predictive_aggregated` / `predictive_uniform`: drop iff `D > δ_t` and `A · ddot > 0`.
///
/// Returns `keep` (1.0 = keep, 0.0 = dropped, and 0.0 at invalid slots, so it can be ANDed
/// into `modified_response_mask`) and these metrics, each 0 when its denominator is empty
/// (L = number of valid slots):
/// * `trmask/topk_kl_mean`, `trmask/topk_kl_max`: mean (over L) and max of `topk_kl`;
/// * `trmask/topk_kl_less_01`, `trmask/topk_kl_less_05`: share of valid tokens with
///   `topk_kl < 0.1` / `< 0.5`;
/// * `trmask/dppo_masked_fraction`: dropped / L;
/// * `trmask/dppo_masked_fraction_pos_adv`, `…_neg_adv`: dropped share among valid tokens with
///   A > 0 / A < 0;
/// * `trmask/topk_tail_mass_mean`, `…_max`: mean and max of the rollout tail `μ_tail`;
/// * `trmask/dppo_direction_disagreement`: among valid tokens with `D > δ_t`, the share where
///   the ratio test (`A·(π_y − μ_y) > 0`) and the predictive test (`A·ddot > 0`, with
///   `ddot_uniform` when `direction = predictive_uniform`, else `ddot_aggregated`) disagree.
///
/// Errors: an invalid `cfg`, or lengths that differ from `stats`.
pub fn dppo_mask(
    stats: &TopkStats,
    advantages: &[f64],
    mask: &[bool],
    cfg: &DppoConfig,
) -> Result<(Vec<f64>, BTreeMap<String, f64>)> {
    cfg.validate()?;
    let n = stats.len();
    if advantages.len() != n || mask.len() != n {
        return Err(Error::input(
            "advantages",
            format!(
                "{} advantages / {} mask slots for {n} top-K statistics",
                advantages.len(),
                mask.len()
            ),
        ));
    }
    let d = stats.divergence(cfg.divergence);
    let dir = stats.direction(cfg.direction);
    let predictive = match cfg.direction {
        DppoDirection::PredictiveUniform => &stats.ddot_uniform,
        _ => &stats.ddot_aggregated,
    };
    let mut keep = vec![0.0; n];
    let (mut valid, mut dropped) = (0usize, 0usize);
    let (mut pos, mut pos_dropped, mut neg, mut neg_dropped) = (0usize, 0usize, 0usize, 0usize);
    let (mut over, mut disagree) = (0usize, 0usize);
    let (mut kl_sum, mut kl_max, mut less01, mut less05) = (0.0, f64::NEG_INFINITY, 0usize, 0usize);
    let (mut tail_sum, mut tail_max) = (0.0, f64::NEG_INFINITY);
    for t in (0..n).filter(|&t| mask[t]) {
        valid += 1;
        let a = advantages[t];
        let over_delta = d[t] > cfg.threshold(stats.prob_diff[t]);
        let drop = over_delta && a * dir[t] > 0.0;
        keep[t] = if drop { 0.0 } else { 1.0 };
        dropped += drop as usize;
        if a > 0.0 {
            pos += 1;
            pos_dropped += drop as usize;
        } else if a < 0.0 {
            neg += 1;
            neg_dropped += drop as usize;
        }
        if over_delta {
            over += 1;
            disagree += ((a * stats.prob_diff[t] > 0.0) != (a * predictive[t] > 0.0)) as usize;
        }
        let kl = stats.topk_kl[t];
        kl_sum += kl;
        kl_max = f64::max(kl_max, kl);
        less01 += (kl < 0.1) as usize;
        less05 += (kl < 0.5) as usize;
        tail_sum += stats.rollout_tail[t];
        tail_max = f64::max(tail_max, stats.rollout_tail[t]);
    }
    let frac = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let mean = |s: f64| if valid == 0 { 0.0 } else { s / valid as f64 };
    let max = |m: f64| if valid == 0 { 0.0 } else { m };
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: f64| {
        m.insert(format!("trmask/{k}"), v);
    };
    put("topk_kl_mean", mean(kl_sum));
    put("topk_kl_max", max(kl_max));
    put("topk_kl_less_01", frac(less01, valid));
    put("topk_kl_less_05", frac(less05, valid));
    put("dppo_masked_fraction", frac(dropped, valid));
    put("dppo_masked_fraction_pos_adv", frac(pos_dropped, pos));
    put("dppo_masked_fraction_neg_adv", frac(neg_dropped, neg));
    put("topk_tail_mass_mean", mean(tail_sum));
    put("topk_tail_mass_max", max(tail_max));
    put("dppo_direction_disagreement", frac(disagree, over));
    Ok((keep, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json() {
        let c = DppoConfig::from_json(&serde_json::json!({
            "divergence": "topk_tv", "delta": 0.1, "direction": "predictive_uniform",
            "top_k_support": "replace_kth", "delta_high": 0.2}))
        .unwrap();
        assert_eq!(c.divergence, TopkDivergence::TopkTv);
        assert_eq!(c.direction, DppoDirection::PredictiveUniform);
        assert_eq!(c.support, TopkSupport::ReplaceKth);
        assert_eq!((c.delta_low(), c.delta_high()), (0.1, 0.2));
        assert_eq!(c.threshold(1e-9), 0.2);
        assert_eq!(c.threshold(0.0), 0.1);
        let c2: DppoConfig =
            serde_json::from_str(r#"{"delta": 0.1, "support": "replace_kth"}"#).unwrap();
        assert_eq!(c2.support, TopkSupport::ReplaceKth);
        assert_eq!(c2.divergence, TopkDivergence::TopkKl);
        assert_eq!(c2.direction, DppoDirection::Ratio);
        let back: DppoConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        for (bad, key) in [
            (serde_json::json!({"delta": 0.0}), "dppo.delta"),
            (serde_json::json!({"delta": -1.0}), "dppo.delta"),
            (serde_json::json!({}), "dppo.delta"),
            (
                serde_json::json!({"delta": 0.1, "delta_low": 0.0}),
                "dppo.delta_low",
            ),
            (serde_json::json!({"delta": "x"}), "dppo.delta"),
            (
                serde_json::json!({"delta": 0.1, "direction": "up"}),
                "dppo.direction",
            ),
            (
                serde_json::json!({"delta": 0.1, "divergence": "kl"}),
                "dppo.divergence",
            ),
            (
                serde_json::json!({"delta": 0.1, "support": "all"}),
                "dppo.support",
            ),
            (serde_json::json!({"delta": 0.1, "detla": 1}), "dppo.detla"),
        ] {
            match DppoConfig::from_json(&bad) {
                Err(Error::InvalidConfig { key: k, .. }) => assert_eq!(k, key, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let mut c = DppoConfig::new(TopkDivergence::TopkKl, f64::NAN, DppoDirection::Ratio);
        assert!(c.validate().is_err());
        c.delta = 1.0;
        c.delta_high = Some(f64::INFINITY);
        assert!(c.validate().is_err());
    }

    #[test]
    fn lse_keeps_small_complements() {
        let lp = [-1e-20f64, -50.0];
        let t = -log_sum_exp(&lp).exp_m1();
        // 1 − (e^{−1e-20} + e^{−50}) = 1e-20 − e^{−50} + O(1e-40)
        let want = 1e-20 - (-50f64).exp();
        assert!((t - want).abs() < 1e-30, "{t} {want}");
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
    }
}
