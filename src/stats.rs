//! Result types of every op (layer 0: no internal dependency but `error`): per-token
//! estimators, per-sequence reductions, exact vocabulary divergences, top-K statistics, and the
//! per-token statistics table the corrections read.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// verl's `SAFETY_BOUND`: log-ratios are clamped to ±20 before `exp` and in k1/k2/k3.
pub const SAFETY_BOUND: f64 = 20.0;

/// Per-token estimators of KL(π_roll‖π_train) from sampled-token log-probs (docs/FORMAT.md, log-ratio).
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
/// maximal valid token from the start of its sequence's slot range (the column `t` in a padded
/// batch); a sequence whose valid values are all −∞ has the offset of its first valid token.
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

/// Exact per-token divergences over the whole vocabulary (docs/FORMAT.md, Outputs), one value per slot,
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

/// IS weight aggregation level (`rollout_is`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsLevel {
    Token,
    Sequence,
}

impl IsLevel {
    /// verl's spelling (`token`, `sequence`).
    pub fn name(self) -> &'static str {
        match self {
            IsLevel::Token => "token",
            IsLevel::Sequence => "sequence",
        }
    }
}

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

impl TopkDivergence {
    /// The config's spelling (`topk_kl`, `topk_tv`).
    pub fn name(self) -> &'static str {
        match self {
            TopkDivergence::TopkKl => "topk_kl",
            TopkDivergence::TopkTv => "topk_tv",
        }
    }
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

impl DppoDirection {
    /// The config's spelling (`ratio`, `predictive_aggregated`, `predictive_uniform`).
    pub fn name(self) -> &'static str {
        match self {
            DppoDirection::Ratio => "ratio",
            DppoDirection::PredictiveAggregated => "predictive_aggregated",
            DppoDirection::PredictiveUniform => "predictive_uniform",
        }
    }
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

/// Per-slot top-K statistics (one value per slot; every field is 0 at invalid slots).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopkStats {
    /// KL(μ‖π) of the reduced distributions (S entries plus the tail), docs/FORMAT.md (DPPO).
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

/// What the summary screen and the `warning:` lines read besides the metrics, computed by the
/// pass that analysed the batch (the fused pass from its tiles, the full path from its table).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Findings {
    /// Valid tokens, and those the final mask keeps.
    pub valid: u64,
    pub kept: u64,
    /// Per sequence, its valid token of largest |log ρ| (the last of equal ones): its position
    /// among the sequence's valid tokens, its slot and |log ρ|; `None` without a valid token.
    pub worst: Vec<Option<(usize, usize, f64)>>,
    /// Mean and standard deviation of log ρ over the valid tokens.
    pub log_ratio: Option<(f64, f64)>,
    /// Each log-prob tensor holding positive valid values: its name, how many, the largest
    /// and its slot (the last of equal ones).
    pub positive: Vec<(String, u64, f64, usize)>,
    /// Where every valid log-prob of both policies is exactly a bf16 or f16 value: the
    /// narrowest format of the rollout's and of the training policy's, the fewer mantissa bits
    /// of the two, and the noise floor rounding puts under k3 (the mean over valid tokens of
    /// `(ulp_roll² + ulp_train²) / 24`).
    pub quantised: Option<(&'static str, &'static str, i32, f64)>,
}

/// Per-token statistics by name (`log_ratio`, `rho`, `k1`, `k2`, `k3`, `abs`, `ser`, from
/// logits `kl`, `kl_rev`, `tv`, `rollout_entropy`, `training_entropy`, and from the rollout
/// top-K `topk_kl`, `topk_tv`, `ddot` (aggregated tail), `ddot_uniform`), one value per slot,
/// 0 at invalid slots.
#[derive(Clone, Debug, Default)]
pub struct StatTable {
    pub stats: BTreeMap<String, Vec<f64>>,
    /// The full top-K statistics (tails, `π_y − μ_y`, support sizes) when the batch has a
    /// rollout top-K, `responses` and `old_logits`; read by the DPPO / PDM mask.
    pub topk: Option<TopkStats>,
    /// The MoE routing outputs (`route_overlap`, `route_first_layer`, the recorded tokens and
    /// the per-layer counts) when the batch has both sides' routed experts; `route_flip` is
    /// also in [`stats`](Self::stats), the statistic criteria read.
    pub routing: Option<crate::input::routing::RouteTokens>,
}

impl StatTable {
    /// The statistic `name`, or an error saying which inputs it needs.
    pub fn get(&self, name: &str) -> Result<&[f64]> {
        self.stats.get(name).map(|v| v.as_slice()).ok_or_else(|| {
            let need = match name {
                "kl" | "kl_rev" | "tv" | "rollout_entropy" | "training_entropy" => {
                    "rollout_logits and old_logits"
                }
                "topk_kl" | "topk_tv" | "ddot" | "ddot_uniform" => {
                    "rollout_topk_ids, rollout_topk_log_prob, responses and old_logits"
                }
                "route_flip" => "rollout_routed_experts and old_routed_experts",
                _ => "rollout_log_prob and old_log_prob (or logits with responses)",
            };
            Error::config(
                name,
                format!("statistic `{name}` is not available: it needs {need}"),
            )
        })
    }
}

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
    /// With trmask's metrics: fixed-bin histograms of log ρ over valid tokens (`log_ratio`)
    /// and of each criterion's per-sequence statistic (its name), merged across ranks.
    pub histograms: BTreeMap<String, crate::partial::hist::Hist>,
}

impl Corrections {
    /// `modified_response_mask` as booleans (true = keep).
    pub fn mask_bool(&self) -> Vec<bool> {
        self.mask.iter().map(|&m| m != 0.0).collect()
    }
    /// `modified_response_mask` as 0/1 `f32`, ready to multiply a loss.
    pub fn mask_f32(&self) -> Vec<f32> {
        self.mask.iter().map(|&m| m as f32).collect()
    }
    /// `rollout_is_weights` rounded to `f32` (0 at invalid slots), `None` when IS is off.
    pub fn weights_f32(&self) -> Option<Vec<f32>> {
        self.weights
            .as_ref()
            .map(|w| w.iter().map(|&x| x as f32).collect())
    }
}

/// How the GPU vocabulary kernel read the valid rows of the last exact-divergence call on a
/// context (`trmask::gpu::Context::last_vocab_passes`): every row passes twice (pass 1:
/// normalisers and shifts; pass 2: the divergence sums); pass 1 once more, with per-element
/// masks, when the row holds a −∞ (or a NaN / +∞) logit; and a third time when the first-order
/// TV correction is not provably negligible (or a common-support mass underflowed). Pass 2
/// takes its lean loop (two exponentials per element) when the row is well conditioned. A row
/// short enough for the workgroup to keep on-chip is read from memory once whatever passes
/// ran; longer rows are read once per pass. A row split into slices keeps each slice on-chip
/// for passes 1 and 2 and reads again only the slices whose TV certificate fails.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VocabPasses {
    /// Valid rows (token slots) of the call.
    pub rows: u64,
    /// Rows whose pass 2 took the lean loop.
    pub lean_rows: u64,
    /// Rows whose pass 1 ran again with per-element masks (a −∞, NaN or +∞ logit).
    pub masked_pass1_rows: u64,
    /// Rows whose pass 3 ran (TV again with the exact λ).
    pub third_pass_rows: u64,
    /// Rows read from memory once: every pass after the first ran on the copy each thread
    /// kept on-chip.
    pub on_chip_rows: u64,
    /// Rows cut into slices, several workgroups each, merged by the combine step.
    pub split_rows: u64,
    /// Rows whose pass 1 ran the masked loop from the start (no second read for a −∞).
    pub masked_first_rows: u64,
    /// Reads of rows from memory, summed over the rows: 1 for a row kept on-chip, else 2 plus
    /// one for a masked pass 1 run again and one for a pass 3; a split row 1 (its slices kept
    /// on-chip; else 2, plus one for a masked pass 1 run again in any slice) plus the share
    /// of its slices read again for TV.
    pub row_reads: f64,
}

impl VocabPasses {
    /// Average reads of each logit from memory: `row_reads / rows` (0 without rows).
    pub fn reads_per_logit(&self) -> f64 {
        if self.rows == 0 {
            return 0.0;
        }
        self.row_reads / self.rows as f64
    }
}
