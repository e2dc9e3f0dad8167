//! The mask plan an engine's corrections pass executes (layer 0): criteria with their
//! per-token source and aggregation, IS settings, and the raw per-token / per-sequence results.
//! The CPU engine, the GPU kernel (whose `SRC_*` / `AGG_*` constants are generated from
//! [`MaskSource::ALL`] and [`MaskAgg::ALL`]) and the fused lean pass all read these types.

use crate::stats::{IsLevel, TokenStats};
use std::mem::discriminant;
use std::ops::Range;

/// Where a criterion's per-token statistic comes from in `Engine::corrections_pass`.
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
    /// KPop's `max(D_B(p‖q), D_B(q‖p))` (`trmask::numerics::binary_kl`) from column j (the
    /// trainer log-prob `ln p`), column j + 1 (the rollout's `ln q`) and the unclamped
    /// log-ratio.
    BinaryKl(usize),
}

impl MaskSource {
    /// Every source in the order of its [`code`](Self::code) (column sources at column 0).
    pub const ALL: [MaskSource; 9] = {
        use MaskSource::*;
        [
            K1,
            K2,
            K3,
            K3Verl,
            Abs,
            Ser,
            Column(0),
            SerWeighted(0),
            BinaryKl(0),
        ]
    };

    /// The source's code, its place in [`ALL`](Self::ALL) (the GPU kernel's `SRC_*`).
    pub fn code(self) -> u32 {
        code_of(&Self::ALL, &self)
    }

    /// The host columns the source reads.
    pub fn columns(self) -> Range<usize> {
        match self {
            Self::Column(j) | Self::SerWeighted(j) => j..j + 1,
            Self::BinaryKl(j) => j..j + 2,
            _ => 0..0,
        }
    }
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

impl MaskAgg {
    /// Every aggregation in the order of its [`code`](Self::code) (`WeightedMean` at column 0).
    pub const ALL: [MaskAgg; 6] = {
        use MaskAgg::*;
        [Token, Sum, MeanVerl, Mean, Max, WeightedMean(0)]
    };

    /// The aggregation's code, its place in [`ALL`](Self::ALL) (the GPU kernel's `AGG_*`).
    pub fn code(self) -> u32 {
        code_of(&Self::ALL, &self)
    }

    /// The host columns the aggregation reads.
    pub fn columns(self) -> Range<usize> {
        match self {
            Self::WeightedMean(j) => j..j + 1,
            _ => 0..0,
        }
    }
}

/// The place of `x`'s variant in `all`.
fn code_of<T>(all: &[T], x: &T) -> u32 {
    let d = discriminant(x);
    all.iter()
        .position(|k| discriminant(k) == d)
        .expect("every variant is listed") as u32
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

impl MaskCriterion {
    /// The inclusive keep test.
    #[inline]
    pub fn keep(&self, x: f64) -> bool {
        self.lower.is_none_or(|l| x >= l) && x <= self.upper
    }
}

/// IS weights of a [`MaskPlan`]: `raw = ρ_t` (token) or `exp(clamp(Σ lr))` (sequence), then
/// `min(raw, upper)` (TIS) or IcePop (`raw` if `lower ≤ raw ≤ upper`, else 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskIs {
    pub level: IsLevel,
    pub upper: f64,
    pub lower: Option<f64>,
    /// Divide by the batch mean (`rollout_is_batch_normalize`): finished on the host, after
    /// `Engine::corrections_pass`, which ignores it.
    pub batch_normalize: bool,
}

impl MaskIs {
    /// The weight of a raw ratio: TIS `min(raw, upper)` or IcePop (`raw` inside
    /// `[lower, upper]`, else 0).
    #[inline]
    pub fn weight(&self, raw: f64) -> f64 {
        match self.lower {
            None => raw.min(self.upper),
            Some(l) if raw >= l && raw <= self.upper => raw,
            Some(_) => 0.0,
        }
    }
}

/// What `Engine::corrections_pass` computes: criteria (at most 32, ANDed; bit i of the
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

/// Per-token and per-sequence results of `Engine::corrections_pass`.
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
