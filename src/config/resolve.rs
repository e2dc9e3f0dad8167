//! Resolution of a [`CorrectionConfig`] into the checked plan the corrections run: IS settings,
//! criteria with a typed statistic and aggregation, LN-TRM, token veto, DPPO, legacy mode.

use super::dppo::DppoConfig;
use super::grammar::{parse_is_threshold, parse_rs_thresholds, py_float, py_num_str};
use super::types::{CorrectionConfig, Cppo, LnTrm, ThresholdSpec};
use crate::error::{Error, Result};
use crate::stats::TopkSupport;

/// IS settings after parsing: the plan's IS rule.
pub use crate::engine::plan::MaskIs as IsSpec;

impl CorrectionConfig {
    /// Checks the whole config and resolves it: IS thresholds, RS criteria and their thresholds,
    /// with verl's rules and error messages.
    pub fn resolve(&self) -> Result<Resolved> {
        super::temperature::check_temperature("temperature", self.temperature)?;
        if self.legacy {
            return self.resolve_legacy();
        }
        // verl weights only when both are set: a null threshold skips IS (docs/FORMAT.md, Config; the
        // `warning:` line is `warnings()`'s)
        let is = match (self.rollout_is, &self.rollout_is_threshold) {
            (Some(level), Some(spec)) => {
                let (upper, lower) = parse_is_threshold(spec)?;
                Some(IsSpec {
                    level,
                    upper,
                    lower,
                    batch_normalize: self.rollout_is_batch_normalize,
                })
            }
            _ => None,
        };
        let mut criteria = Vec::new();
        if let Some(rs) = &self.rollout_rs {
            let spec = self.rollout_rs_threshold.as_ref().ok_or_else(|| {
                Error::config(
                    "rollout_rs_threshold",
                    "rollout_rs_threshold must be provided for rejection sampling.",
                )
            })?;
            let mut options: Vec<String> = Vec::new();
            for opt in rs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if parse_option(opt).is_none() {
                    return Err(Error::config(
                        "rollout_rs",
                        format!(
                            "Invalid rollout_rs option: {opt}. Must be one of verl's {VERL_OPTIONS:?} \
                             or trmask's token_/seq_sum_/seq_mean_/seq_max_ with abs, ser, kl, kl_rev, tv, \
                             topk_kl, topk_tv, binary_kl, or seq_lntrm (binary_kl alone is KPop, token level), \
                             or opsm (DeepSeek-V3.2's off-policy sequence masking), or m2po \
                             (M2PO's second-moment trust region), or cppo (CPPO's cumulative prefix budget)."
                        ),
                    ));
                }
                // token_binary_kl is verl's binary_kl (one criterion, verl's metric names)
                let opt = if opt == "token_binary_kl" {
                    "binary_kl"
                } else {
                    opt
                };
                if !options.iter().any(|o| o == opt) {
                    options.push(opt.to_string());
                }
            }
            if options.is_empty() {
                return Err(Error::config(
                    "rollout_rs",
                    "rollout_rs must contain at least one valid option.",
                ));
            }
            let bounds = parse_rs_thresholds(&options, spec)?;
            for (opt, (lower, upper)) in options.iter().zip(bounds) {
                let (agg, stat) = parse_option(opt).expect("validated");
                criteria.push(Criterion {
                    name: opt.clone(),
                    agg,
                    stat,
                    lower,
                    upper,
                });
            }
            if criteria.iter().any(|c| c.agg == Agg::LnTrm) && self.ln_trm.is_none() {
                return Err(Error::config(
                    "ln_trm",
                    "seq_lntrm needs ln_trm: {eps, delta} (at least one of them)",
                ));
            }
        }
        Ok(Resolved {
            verl_metrics_only: false,
            histograms: true,
            is,
            criteria,
            ln_trm: self.ln_trm.unwrap_or_default(),
            cppo: self.cppo.unwrap_or_default(),
            token_veto: self.token_veto,
            legacy: None,
            dppo: match &self.dppo {
                Some(d) => {
                    d.validate()?;
                    Some(d.clone())
                }
                None => None,
            },
        })
    }

    /// What verl accepts silently but a user should hear of, as `warning:` lines (the CLI prints
    /// them on stderr, the Python package raises them as `UserWarning`s): today `rollout_is`
    /// with a null `rollout_is_threshold`, which skips importance weighting as verl does.
    ///
    /// ```
    /// let cfg = trmask::CorrectionConfig::from_json_str(
    ///     r#"{"rollout_is": "token", "rollout_is_threshold": null}"#,
    /// )?;
    /// assert!(cfg.resolve()?.is.is_none());
    /// assert!(cfg.warnings()[0].starts_with("warning: rollout_is"));
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let (Some(level), None) = (self.rollout_is, &self.rollout_is_threshold) {
            out.push(format!(
                "warning: rollout_is is '{}' but rollout_is_threshold is null: importance \
                 weighting is skipped as verl does (no rollout_is_weights; mask and metrics as \
                 without IS)",
                level.name()
            ));
        }
        out
    }

    /// The support of the `topk_*` statistics: `dppo.top_k_support`, else the union.
    pub fn top_k_support(&self) -> TopkSupport {
        self.dppo.as_ref().map(|d| d.support).unwrap_or_default()
    }

    fn resolve_legacy(&self) -> Result<Resolved> {
        if self.dppo.is_some() {
            return Err(Error::config(
                "dppo",
                "is not available with verl's legacy API (legacy / rollout_rs_threshold_lower / \
                 rollout_token_veto_threshold)",
            ));
        }
        let num = |key: &str, spec: &ThresholdSpec| -> Result<f64> {
            match spec {
                ThresholdSpec::Number(x) => Ok(*x),
                ThresholdSpec::Text(t) => py_float(t).ok_or_else(|| {
                    Error::config(key, format!("legacy verl takes a float, got '{t}'"))
                }),
            }
        };
        let is = match (self.rollout_is, &self.rollout_is_threshold) {
            (Some(level), Some(spec)) => {
                let u = num("rollout_is_threshold", spec)?;
                if u.is_nan() || u <= 0.0 {
                    return Err(Error::config(
                        "rollout_is_threshold",
                        format!(
                            "rollout_is_threshold must be positive, got {}.",
                            py_num_str(u)
                        ),
                    ));
                }
                Some(IsSpec {
                    level,
                    upper: u,
                    lower: None,
                    batch_normalize: self.rollout_is_batch_normalize,
                })
            }
            _ => None,
        };
        let rs = match &self.rollout_rs {
            None => None,
            Some(mode) => {
                if !matches!(mode.as_str(), "token" | "sequence" | "geometric") {
                    return Err(Error::config(
                        "rollout_rs",
                        format!(
                            "Invalid rollout_rs: {mode}. Must be one of {{'token', 'sequence', 'geometric'}}."
                        ),
                    ));
                }
                let spec = self.rollout_rs_threshold.as_ref().ok_or_else(|| {
                    Error::config(
                        "rollout_rs_threshold",
                        "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled.",
                    )
                })?;
                let upper = num("rollout_rs_threshold", spec)?;
                Some(LegacyRs {
                    mode: mode.clone(),
                    upper,
                    lower: self.rollout_rs_threshold_lower.unwrap_or(1.0 / upper),
                })
            }
        };
        if let Some(v) = self.rollout_token_veto_threshold {
            if v.is_nan() || v <= 0.0 {
                return Err(Error::config(
                    "rollout_token_veto_threshold",
                    format!("rollout_token_veto_threshold must be positive, got {v}."),
                ));
            }
        }
        Ok(Resolved {
            verl_metrics_only: false,
            histograms: true,
            is,
            criteria: Vec::new(),
            ln_trm: LnTrm::default(),
            cppo: Cppo::default(),
            token_veto: None,
            dppo: None,
            legacy: Some(LegacySpec {
                rs,
                veto: self.rollout_token_veto_threshold,
            }),
        })
    }
}

/// Legacy RS (`rollout_rs` ∈ token / sequence / geometric) on the IS ratio.
#[derive(Clone, Debug, PartialEq)]
pub struct LegacyRs {
    pub mode: String,
    pub upper: f64,
    pub lower: f64,
}

/// The legacy-API part of a resolved config.
#[derive(Clone, Debug, PartialEq)]
pub struct LegacySpec {
    pub rs: Option<LegacyRs>,
    /// `rollout_token_veto_threshold`.
    pub veto: Option<f64>,
}

/// verl's supported RS options (HEAD).
pub const VERL_OPTIONS: [&str; 11] = [
    "seq_max_k2",
    "seq_max_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "token_k1",
    "token_k2",
    "token_k3",
];

/// The per-token statistic a criterion aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stat {
    K1,
    K2,
    K3,
    /// `|clamp(lr)|`.
    Abs,
    /// `|ρ − 1|`.
    Ser,
    /// Exact KL(π_roll‖π_train) from logits.
    Kl,
    /// Exact KL(π_train‖π_roll) from logits.
    KlRev,
    /// Exact total variation from logits.
    Tv,
    /// KL on the rollout's top-K support.
    TopkKl,
    /// TV on the rollout's top-K support.
    TopkTv,
    /// LN-TRM's `|ρ − 1|` weighted by `w_t` (`seq_lntrm` only).
    LnTrm,
    /// KPop's bidirectional binary KL `max(D_B(p‖q), D_B(q‖p))` of the sampled token
    /// (`binary_kl`, verl PR #6800 / AReaL; `trmask::numerics::binary_kl`).
    BinaryKl,
    /// OPSM's `log(π_roll/π_train) = −lr` (unclamped) of a sequence whose advantage is
    /// negative (`opsm` only; DeepSeek-V3.2).
    Opsm,
    /// M2PO's `lr²` (unclamped) of a token in the active quadrants (`A > 0, ρ > 1` or
    /// `A < 0, ρ < 1`); the batch-global drop runs on the host (`m2po` only).
    M2po,
    /// CPPO's position-weighted Binary-TV `w_t·|p_train − p_roll|` of the sampled token
    /// (`cppo` only; its keep test adds the prefix budget and the update direction).
    Cppo,
    /// MoE routing: 1 where a recorded layer's rollout and trainer expert sets differ
    /// (`route_flip`, from `rollout_routed_experts` / `old_routed_experts`); `seq_mean_` is
    /// the fraction of a sequence's recorded tokens that flipped.
    RouteFlip,
}

impl Stat {
    /// Every statistic a `<agg>_<stat>` option may name.
    pub const ALL: [Stat; 12] = [
        Stat::K1,
        Stat::K2,
        Stat::K3,
        Stat::Abs,
        Stat::Ser,
        Stat::Kl,
        Stat::KlRev,
        Stat::Tv,
        Stat::TopkKl,
        Stat::TopkTv,
        Stat::BinaryKl,
        Stat::RouteFlip,
    ];

    /// The name in options and in the statistics table (`k3`, `kl_rev`, `topk_kl`, `lntrm`).
    pub fn name(self) -> &'static str {
        match self {
            Stat::K1 => "k1",
            Stat::K2 => "k2",
            Stat::K3 => "k3",
            Stat::Abs => "abs",
            Stat::Ser => "ser",
            Stat::Kl => "kl",
            Stat::KlRev => "kl_rev",
            Stat::Tv => "tv",
            Stat::TopkKl => "topk_kl",
            Stat::TopkTv => "topk_tv",
            Stat::LnTrm => "lntrm",
            Stat::BinaryKl => "binary_kl",
            Stat::Opsm => "opsm",
            Stat::M2po => "m2po",
            Stat::Cppo => "cppo",
            Stat::RouteFlip => "route_flip",
        }
    }

    fn parse(s: &str) -> Option<Stat> {
        Stat::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// How a criterion aggregates its per-token statistic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agg {
    Token,
    SeqSum,
    SeqMean,
    SeqMax,
    /// `seq_lntrm` (LN-TRM).
    LnTrm,
    /// `opsm`: the mean of `−lr` over a sequence's valid tokens, tested only when the
    /// sequence's advantage (the mean over its valid tokens) is negative.
    Opsm,
}

fn parse_option(opt: &str) -> Option<(Agg, Stat)> {
    if opt == "seq_lntrm" {
        return Some((Agg::LnTrm, Stat::LnTrm));
    }
    if opt == "opsm" {
        return Some((Agg::Opsm, Stat::Opsm));
    }
    if opt == "cppo" {
        // a token criterion with a per-sequence prefix budget (correction::cppo)
        return Some((Agg::Token, Stat::Cppo));
    }
    if opt == "m2po" {
        // a token criterion whose keep test is batch-global (correction::m2po)
        return Some((Agg::Token, Stat::M2po));
    }
    if opt == "binary_kl" {
        // verl's (PR #6800) spelling of token_binary_kl (KPop)
        return Some((Agg::Token, Stat::BinaryKl));
    }
    let (agg, stat) = if let Some(s) = opt.strip_prefix("token_") {
        (Agg::Token, s)
    } else if let Some(s) = opt.strip_prefix("seq_sum_") {
        (Agg::SeqSum, s)
    } else if let Some(s) = opt.strip_prefix("seq_mean_") {
        (Agg::SeqMean, s)
    } else if let Some(s) = opt.strip_prefix("seq_max_") {
        (Agg::SeqMax, s)
    } else {
        return None;
    };
    let stat = Stat::parse(stat)?;
    // verl rejects seq_max_k1
    (stat != Stat::K1 || agg != Agg::SeqMax).then_some((agg, stat))
}

/// One rejection criterion `<agg>_<stat>` with its resolved bounds (ratio space for k1).
#[derive(Clone, Debug, PartialEq)]
pub struct Criterion {
    /// The option as written (`seq_mean_k3`).
    pub name: String,
    pub agg: Agg,
    /// The per-token statistic.
    pub stat: Stat,
    /// Lower bound (k1 only, in ratio space; the test is on `ln lower`).
    pub lower: Option<f64>,
    pub upper: f64,
}

impl Criterion {
    /// True for verl's own options (verl's formulas, `+1e-8` means).
    pub fn is_verl(&self) -> bool {
        VERL_OPTIONS.contains(&self.name.as_str())
    }
    /// True for `k1` criteria (two-sided, log space).
    pub fn is_k1(&self) -> bool {
        self.stat == Stat::K1
    }
}

/// A checked config: what the computation uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub is: Option<IsSpec>,
    /// The RS criteria in config order (bit i of `seq_reject_bits` is criterion i; the token
    /// veto, when set, is the bit after the last criterion).
    pub criteria: Vec<Criterion>,
    pub ln_trm: LnTrm,
    /// CPPO's `{w_min, delta_b}` (the paper's defaults when not configured).
    pub cppo: Cppo,
    pub token_veto: Option<f64>,
    /// `Some` in legacy mode.
    pub legacy: Option<LegacySpec>,
    /// The DPPO / PDM token mask, when configured (never in legacy mode).
    pub dppo: Option<DppoConfig>,
    /// Only verl's `rollout_corr/*` metrics are wanted (the trainer's hot path): trmask's
    /// diagnostics (`trmask/*`, length and group buckets) are not computed.
    pub verl_metrics_only: bool,
    /// The histograms (`#hist/*`: log ρ per valid token, each criterion's per-sequence
    /// statistic) are counted with trmask's diagnostics; off where nobody reads them.
    pub histograms: bool,
}
