//! [`CorrectionConfig`]: verl's rollout-correction keys verbatim plus trmask's own, the 19 verl
//! presets (and paper aliases), and verl's threshold grammar with its exact rules and errors.
//!
//! JSON keys (unknown keys are an error naming the key):
//!
//! | key | meaning |
//! |---|---|
//! | `rollout_is` | `null`, `"token"` or `"sequence"` |
//! | `rollout_is_threshold` | number `U` (TIS: `w = min(raw, U)`) or `"L_U"` (IcePop); default 2.0 |
//! | `rollout_is_batch_normalize` | bool, default false |
//! | `rollout_rs` | comma-separated `<agg>_<stat>` criteria (ANDed, duplicates dropped) |
//! | `rollout_rs_threshold` | one threshold per criterion, or one broadcast to all |
//! | `bypass_mode`, `loss_type` | verl's preset fields; `bypass_mode: true` makes `log_prob` the training policy |
//! | `temperature` | softmax temperature for logits (default 1) |
//! | `ln_trm` | `{eps, delta}` for `seq_lntrm`; a missing one drops its term from `w_t` |
//! | `token_veto` | τ: reject a sequence if any ρ_t < τ |
//! | `dppo` | `{divergence, delta, delta_low, delta_high, direction, top_k_support}`: the DPPO / PDM token mask ([`crate::topk::DppoConfig`]; errors name `dppo.<key>`); `top_k_support` also picks the support of the `topk_*` statistics |
//! | `legacy`, `rollout_rs_threshold_lower`, `rollout_token_veto_threshold` | verl's legacy API (see [`CorrectionConfig::legacy`]) |
//!
//! Threshold grammar (verl's `_parse_rollout_rs_thresholds`): for `k1` criteria `"L_U"` keeps
//! `ln L ≤ k1 ≤ ln U`, a single `U` means `L = 1/U` (so `U ≥ 1`). Since `k1 = −log ρ =
//! log(π_roll/π_train)`, the bounds apply to `1/ρ`, not to ρ. Every other statistic takes one
//! upper bound `U` (keep if `stat ≤ U`, `U > 0`). Comparisons are inclusive.

use crate::error::{Error, Result};
use crate::topk::{DppoConfig, TopkSupport};
use serde_json::{Map, Value};

/// IS weight aggregation level (`rollout_is`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsLevel {
    Token,
    Sequence,
}

impl IsLevel {
    pub fn name(self) -> &'static str {
        match self {
            IsLevel::Token => "token",
            IsLevel::Sequence => "sequence",
        }
    }
}

/// A threshold as written in the config: a number or a string (`"2.0"`, `"0.5_5.0"`, `"0.5_2,2.5"`).
#[derive(Clone, Debug, PartialEq)]
pub enum ThresholdSpec {
    Number(f64),
    Text(String),
}

impl ThresholdSpec {
    fn to_json(&self) -> Value {
        match self {
            ThresholdSpec::Number(x) => num_json(*x),
            ThresholdSpec::Text(s) => Value::String(s.clone()),
        }
    }
    fn from_json(key: &str, v: &Value) -> Result<Option<Self>> {
        match v {
            Value::Null => Ok(None),
            Value::Number(n) => Ok(Some(ThresholdSpec::Number(n.as_f64().unwrap_or(f64::NAN)))),
            Value::String(s) => Ok(Some(ThresholdSpec::Text(s.clone()))),
            Value::Bool(_) => Err(Error::config(
                key,
                format!("{key} must be specified as a float or a string threshold specification, not a boolean."),
            )),
            _ => Err(Error::config(
                key,
                format!("{key} must be a float or a string threshold specification."),
            )),
        }
    }
}

/// LN-TRM parameters (`ln_trm: {eps, delta}`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LnTrm {
    pub eps: Option<f64>,
    pub delta: Option<f64>,
}

/// The rollout-correction configuration (verl keys + trmask keys).
#[derive(Clone, Debug, PartialEq)]
pub struct CorrectionConfig {
    pub rollout_is: Option<IsLevel>,
    /// `None` only when the key was given as `null` (an error when `rollout_is` is set).
    pub rollout_is_threshold: Option<ThresholdSpec>,
    pub rollout_is_batch_normalize: bool,
    pub rollout_rs: Option<String>,
    pub rollout_rs_threshold: Option<ThresholdSpec>,
    pub bypass_mode: bool,
    pub loss_type: Option<String>,
    pub temperature: f64,
    pub ln_trm: Option<LnTrm>,
    pub token_veto: Option<f64>,
    /// The DPPO / PDM token mask (SPEC §7), ANDed into `modified_response_mask`.
    pub dppo: Option<DppoConfig>,
    /// verl's legacy API (commit 9b718e1a, before PR #4544): `rollout_rs` ∈ {token, sequence,
    /// geometric} with `rollout_rs_threshold` / `rollout_rs_threshold_lower` on the IS ratio,
    /// and `rollout_token_veto_threshold`. Set by `"legacy": true` or by either legacy key.
    pub legacy: bool,
    pub rollout_rs_threshold_lower: Option<f64>,
    pub rollout_token_veto_threshold: Option<f64>,
}

impl Default for CorrectionConfig {
    /// Everything off (verl's `disabled` preset): metrics only.
    fn default() -> Self {
        CorrectionConfig {
            rollout_is: None,
            rollout_is_threshold: Some(ThresholdSpec::Number(2.0)),
            rollout_is_batch_normalize: false,
            rollout_rs: None,
            rollout_rs_threshold: None,
            bypass_mode: false,
            loss_type: None,
            temperature: 1.0,
            ln_trm: None,
            token_veto: None,
            dppo: None,
            legacy: false,
            rollout_rs_threshold_lower: None,
            rollout_token_veto_threshold: None,
        }
    }
}

fn num_json(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn want_f64(key: &str, v: &Value) -> Result<f64> {
    v.as_f64()
        .ok_or_else(|| Error::config(key, format!("must be a number, got {v}")))
}

/// The 19 verl presets (HEAD `RolloutCorrectionConfig` factories) plus verl's dataclass default.
/// Tuple: name, rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold, bypass, loss_type.
type PresetRow = (
    &'static str,
    Option<&'static str>,
    f64,
    Option<&'static str>,
    Option<&'static str>,
    bool,
    &'static str,
);

const GEO: Option<&str> = Some("0.999_1.001");
const K3: Option<&str> = Some("0.01");
const PRESETS: [PresetRow; 19] = [
    (
        "bypass_pg_geo_rs",
        None,
        2.0,
        Some("seq_mean_k1"),
        GEO,
        true,
        "reinforce",
    ),
    (
        "bypass_pg_geo_rs_seq_tis",
        Some("sequence"),
        2.0,
        Some("seq_mean_k1"),
        GEO,
        true,
        "reinforce",
    ),
    (
        "bypass_pg_geo_rs_token_tis",
        Some("token"),
        2.0,
        Some("seq_mean_k1"),
        GEO,
        true,
        "reinforce",
    ),
    (
        "bypass_pg_is",
        Some("sequence"),
        2.0,
        None,
        None,
        true,
        "reinforce",
    ),
    (
        "bypass_pg_token_icepop",
        Some("token"),
        f64::NAN,
        None,
        None,
        true,
        "reinforce",
    ),
    ("bypass_ppo_clip", None, 2.0, None, None, true, "ppo_clip"),
    (
        "bypass_ppo_clip_geo_rs",
        None,
        2.0,
        Some("seq_mean_k1"),
        GEO,
        true,
        "ppo_clip",
    ),
    (
        "bypass_ppo_clip_k3_rs",
        None,
        2.0,
        Some("seq_mean_k3"),
        K3,
        true,
        "ppo_clip",
    ),
    (
        "decoupled_geo_rs",
        None,
        2.0,
        Some("seq_mean_k1"),
        GEO,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_geo_rs_seq_tis",
        Some("sequence"),
        2.0,
        Some("seq_mean_k1"),
        GEO,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_geo_rs_token_tis",
        Some("token"),
        2.0,
        Some("seq_mean_k1"),
        GEO,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_k3_rs",
        None,
        2.0,
        Some("seq_mean_k3"),
        K3,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_k3_rs_seq_tis",
        Some("sequence"),
        2.0,
        Some("seq_mean_k3"),
        K3,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_k3_rs_token_tis",
        Some("token"),
        2.0,
        Some("seq_mean_k3"),
        K3,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_seq_is",
        Some("sequence"),
        2.0,
        None,
        None,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_seq_is_rs",
        Some("sequence"),
        2.0,
        Some("seq_sum_k1"),
        Some("0.5_2.0"),
        false,
        "ppo_clip",
    ),
    (
        "decoupled_token_icepop",
        Some("token"),
        f64::NAN,
        None,
        None,
        false,
        "ppo_clip",
    ),
    (
        "decoupled_token_is",
        Some("token"),
        2.0,
        None,
        None,
        false,
        "ppo_clip",
    ),
    ("disabled", None, 2.0, None, None, false, "ppo_clip"),
];

/// Paper names → verl presets or trmask configs (unambiguous ones only).
/// `trm_avg` = `decoupled_k3_rs` (TRM-avg from samples: `seq_mean_k3 ≤ 0.01`),
/// `geo_mask` = `decoupled_geo_rs` (`seq_mean_k1` in `"0.999_1.001"`),
/// `seq_mis` = `decoupled_seq_is_rs` (sequence IS + `seq_sum_k1` in `"0.5_2.0"`),
/// `trm_max` = TRM-max from samples: `seq_max_k2 ≤ 2.5` (decoupled, no IS).
pub const ALIASES: [(&str, &str); 4] = [
    ("trm_avg", "decoupled_k3_rs"),
    ("geo_mask", "decoupled_geo_rs"),
    ("seq_mis", "decoupled_seq_is_rs"),
    ("trm_max", "<trm_max>"),
];

impl CorrectionConfig {
    /// Names of every preset (verl's 19) and alias.
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS
            .iter()
            .map(|p| p.0)
            .chain(ALIASES.iter().map(|a| a.0))
            .collect()
    }

    /// A verl preset by name (`decoupled_k3_rs`, …, `<dataclass default>`) or paper alias
    /// (`trm_max`, `trm_avg`, `geo_mask`, `seq_mis`).
    pub fn preset(name: &str) -> Result<Self> {
        if name == "<dataclass default>" || name == "default" {
            return Ok(CorrectionConfig {
                rollout_is: Some(IsLevel::Sequence),
                loss_type: Some("ppo_clip".into()),
                ..Default::default()
            });
        }
        if name == "trm_max" {
            return Ok(CorrectionConfig {
                rollout_rs: Some("seq_max_k2".into()),
                rollout_rs_threshold: Some(ThresholdSpec::Number(2.5)),
                loss_type: Some("ppo_clip".into()),
                ..Default::default()
            });
        }
        let name = ALIASES
            .iter()
            .find(|a| a.0 == name)
            .map(|a| a.1)
            .unwrap_or(name);
        let p = PRESETS.iter().find(|p| p.0 == name).ok_or_else(|| {
            Error::config(
                "preset",
                format!(
                    "unknown preset `{name}`; known: {}",
                    Self::preset_names().join(", ")
                ),
            )
        })?;
        Ok(CorrectionConfig {
            rollout_is: p.1.map(|l| {
                if l == "token" {
                    IsLevel::Token
                } else {
                    IsLevel::Sequence
                }
            }),
            rollout_is_threshold: Some(if p.2.is_nan() {
                ThresholdSpec::Text("0.5_5.0".into())
            } else {
                ThresholdSpec::Number(p.2)
            }),
            rollout_is_batch_normalize: false,
            rollout_rs: p.3.map(String::from),
            rollout_rs_threshold: p.4.map(|t| {
                if t == "0.01" {
                    ThresholdSpec::Number(0.01)
                } else {
                    ThresholdSpec::Text(t.into())
                }
            }),
            bypass_mode: p.5,
            loss_type: Some(p.6.into()),
            ..Default::default()
        })
    }

    /// Parses a JSON config object (verl's keys verbatim plus trmask's).
    pub fn from_json_value(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::config("config", "must be a JSON object"))?;
        let mut c = CorrectionConfig::default();
        for (key, val) in obj {
            match key.as_str() {
                "rollout_is" => {
                    c.rollout_is = match val {
                        Value::Null => None,
                        Value::String(s) if s == "token" => Some(IsLevel::Token),
                        Value::String(s) if s == "sequence" => Some(IsLevel::Sequence),
                        other => {
                            return Err(Error::config(
                                key,
                                format!(
                                    "Invalid rollout_is: {}. Must be one of {{'token', 'sequence'}}.",
                                    other.as_str().map(String::from).unwrap_or(other.to_string())
                                ),
                            ))
                        }
                    }
                }
                "rollout_is_threshold" => {
                    c.rollout_is_threshold = ThresholdSpec::from_json(key, val)?
                }
                "rollout_is_batch_normalize" => {
                    c.rollout_is_batch_normalize = match val {
                        Value::Null => false,
                        Value::Bool(b) => *b,
                        _ => return Err(Error::config(key, "must be true or false")),
                    }
                }
                "rollout_rs" => {
                    c.rollout_rs = match val {
                        Value::Null => None,
                        Value::String(s) => Some(s.clone()),
                        _ => {
                            return Err(Error::config(
                                key,
                                "rollout_rs must be a non-empty string (comma separated for multiple options).",
                            ))
                        }
                    }
                }
                "rollout_rs_threshold" => {
                    c.rollout_rs_threshold = match val {
                        Value::Bool(_) => {
                            return Err(Error::config(
                                key,
                                "rollout_rs_threshold must be a string or numeric value specifying per-option thresholds.",
                            ))
                        }
                        other => ThresholdSpec::from_json(key, other)?,
                    }
                }
                "bypass_mode" => {
                    c.bypass_mode = match val {
                        Value::Null => false,
                        Value::Bool(b) => *b,
                        _ => return Err(Error::config(key, "must be true or false")),
                    }
                }
                "loss_type" => {
                    c.loss_type = match val {
                        Value::Null => None,
                        Value::String(s) => Some(s.clone()),
                        _ => return Err(Error::config(key, "must be a string")),
                    }
                }
                "temperature" => {
                    let t = want_f64(key, val)?;
                    if !(t > 0.0 && t.is_finite()) {
                        return Err(Error::config(key, format!("must be > 0, got {t}")));
                    }
                    c.temperature = t;
                }
                "ln_trm" => {
                    if val.is_null() {
                        c.ln_trm = None;
                        continue;
                    }
                    let o = val
                        .as_object()
                        .ok_or_else(|| Error::config(key, "must be an object {eps, delta}"))?;
                    let mut p = LnTrm::default();
                    for (k, v) in o {
                        let full = format!("ln_trm.{k}");
                        let x = if v.is_null() {
                            None
                        } else {
                            let x = want_f64(&full, v)?;
                            if !(x >= 0.0 && x.is_finite()) {
                                return Err(Error::config(
                                    &full,
                                    format!("must be a finite number >= 0, got {x}"),
                                ));
                            }
                            Some(x)
                        };
                        match k.as_str() {
                            "eps" => p.eps = x,
                            "delta" => p.delta = x,
                            _ => return Err(Error::config(&full, "unknown key (expected eps, delta)")),
                        }
                    }
                    c.ln_trm = Some(p);
                }
                "token_veto" => {
                    c.token_veto = if val.is_null() {
                        None
                    } else {
                        let t = want_f64(key, val)?;
                        if !(t > 0.0 && t.is_finite()) {
                            return Err(Error::config(key, format!("must be > 0, got {t}")));
                        }
                        Some(t)
                    }
                }
                "dppo" => {
                    c.dppo = if val.is_null() {
                        None
                    } else {
                        Some(DppoConfig::from_json(val)?)
                    }
                }
                "legacy" => {
                    c.legacy |= val
                        .as_bool()
                        .ok_or_else(|| Error::config(key, "must be true or false"))?
                }
                "rollout_rs_threshold_lower" | "rollout_token_veto_threshold" => {
                    c.legacy = true;
                    let x = if val.is_null() {
                        None
                    } else {
                        Some(want_f64(key, val)?)
                    };
                    if key == "rollout_rs_threshold_lower" {
                        c.rollout_rs_threshold_lower = x;
                    } else {
                        c.rollout_token_veto_threshold = x;
                    }
                }
                other => {
                    return Err(Error::config(
                        other,
                        "unknown config key (expected rollout_is, rollout_is_threshold, \
                         rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold, bypass_mode, \
                         loss_type, temperature, ln_trm, token_veto, dppo)",
                    ))
                }
            }
        }
        c.resolve()?;
        Ok(c)
    }

    /// Parses JSON text.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::config("config", format!("not valid JSON: {e}")))?;
        Self::from_json_value(&v)
    }

    /// Reads a JSON config file.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(&p, e.to_string()))?;
        Self::from_json_str(&text)
    }

    /// The config as JSON (same keys as accepted).
    pub fn to_json_value(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "rollout_is".into(),
            self.rollout_is
                .map(|l| Value::String(l.name().into()))
                .unwrap_or(Value::Null),
        );
        m.insert(
            "rollout_is_threshold".into(),
            self.rollout_is_threshold
                .as_ref()
                .map(|t| t.to_json())
                .unwrap_or(Value::Null),
        );
        m.insert(
            "rollout_is_batch_normalize".into(),
            Value::Bool(self.rollout_is_batch_normalize),
        );
        m.insert(
            "rollout_rs".into(),
            self.rollout_rs
                .clone()
                .map(Value::String)
                .unwrap_or(Value::Null),
        );
        m.insert(
            "rollout_rs_threshold".into(),
            self.rollout_rs_threshold
                .as_ref()
                .map(|t| t.to_json())
                .unwrap_or(Value::Null),
        );
        m.insert("bypass_mode".into(), Value::Bool(self.bypass_mode));
        if let Some(l) = &self.loss_type {
            m.insert("loss_type".into(), Value::String(l.clone()));
        }
        m.insert("temperature".into(), num_json(self.temperature));
        if let Some(p) = &self.ln_trm {
            let mut o = Map::new();
            if let Some(e) = p.eps {
                o.insert("eps".into(), num_json(e));
            }
            if let Some(d) = p.delta {
                o.insert("delta".into(), num_json(d));
            }
            m.insert("ln_trm".into(), Value::Object(o));
        }
        if let Some(t) = self.token_veto {
            m.insert("token_veto".into(), num_json(t));
        }
        if let Some(d) = &self.dppo {
            m.insert(
                "dppo".into(),
                serde_json::to_value(d).unwrap_or(Value::Null),
            );
        }
        if self.legacy {
            m.insert("legacy".into(), Value::Bool(true));
            let opt = |x: Option<f64>| x.map(num_json).unwrap_or(Value::Null);
            m.insert(
                "rollout_rs_threshold_lower".into(),
                opt(self.rollout_rs_threshold_lower),
            );
            m.insert(
                "rollout_token_veto_threshold".into(),
                opt(self.rollout_token_veto_threshold),
            );
        }
        Value::Object(m)
    }

    /// Checks the whole config and resolves it: IS thresholds, RS criteria and their thresholds,
    /// with verl's rules and error messages.
    pub fn resolve(&self) -> Result<Resolved> {
        if self.legacy {
            return self.resolve_legacy();
        }
        let is = match self.rollout_is {
            None => None,
            Some(level) => {
                let spec = self.rollout_is_threshold.as_ref().ok_or_else(|| {
                    Error::config(
                        "rollout_is_threshold",
                        "rollout_is_threshold must be a float or a string threshold specification.",
                    )
                })?;
                let (upper, lower) = parse_is_threshold(spec)?;
                Some(IsSpec {
                    level,
                    upper,
                    lower,
                    batch_normalize: self.rollout_is_batch_normalize,
                })
            }
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
                             topk_kl, topk_tv, or seq_lntrm."
                        ),
                    ));
                }
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
            is,
            criteria,
            ln_trm: self.ln_trm.unwrap_or_default(),
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
            is,
            criteria: Vec::new(),
            ln_trm: LnTrm::default(),
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

/// Statistics a criterion may use beyond verl's k1/k2/k3.
pub const TRMASK_STATS: [&str; 7] = ["abs", "ser", "kl", "kl_rev", "tv", "topk_kl", "topk_tv"];

/// How a criterion aggregates its per-token statistic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agg {
    Token,
    SeqSum,
    SeqMean,
    SeqMax,
    /// `seq_lntrm` (LN-TRM).
    LnTrm,
}

fn parse_option(opt: &str) -> Option<(Agg, String)> {
    if opt == "seq_lntrm" {
        return Some((Agg::LnTrm, "lntrm".into()));
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
    let ok = match stat {
        "k1" => agg != Agg::SeqMax, // verl rejects seq_max_k1
        "k2" | "k3" => true,
        s => TRMASK_STATS.contains(&s),
    };
    ok.then(|| (agg, stat.to_string()))
}

/// One rejection criterion `<agg>_<stat>` with its resolved bounds (ratio space for k1).
#[derive(Clone, Debug, PartialEq)]
pub struct Criterion {
    /// The option as written (`seq_mean_k3`).
    pub name: String,
    pub agg: Agg,
    /// `k1`, `k2`, `k3`, `abs`, `ser`, `kl`, …, or `lntrm`.
    pub stat: String,
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
        self.stat == "k1"
    }
}

/// IS settings after parsing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IsSpec {
    pub level: IsLevel,
    pub upper: f64,
    /// `Some` for IcePop (`"L_U"`).
    pub lower: Option<f64>,
    pub batch_normalize: bool,
}

/// A checked config: what the computation uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub is: Option<IsSpec>,
    /// The RS criteria in config order (bit i of `seq_reject_bits` is criterion i; the token
    /// veto, when set, is the bit after the last criterion).
    pub criteria: Vec<Criterion>,
    pub ln_trm: LnTrm,
    pub token_veto: Option<f64>,
    /// `Some` in legacy mode.
    pub legacy: Option<LegacySpec>,
    /// The DPPO / PDM token mask, when configured (never in legacy mode).
    pub dppo: Option<DppoConfig>,
}

/// Python's `float(str)`: surrounding whitespace, underscores between digits, inf/nan.
pub fn py_float(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let b = s.as_bytes();
    let mut clean = String::with_capacity(s.len());
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            let ok =
                i > 0 && i + 1 < b.len() && b[i - 1].is_ascii_digit() && b[i + 1].is_ascii_digit();
            if !ok {
                return None;
            }
        } else {
            clean.push(c as char);
        }
    }
    let lower = clean.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if body.starts_with("inf") || body.starts_with("nan") {
        if !matches!(body, "inf" | "infinity" | "nan") || lower.len() - body.len() > 1 {
            return None;
        }
    } else if !body
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'+' | b'-'))
    {
        return None;
    }
    lower.parse::<f64>().ok()
}

fn py_num_str(x: f64) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

fn spec_text(spec: &ThresholdSpec) -> String {
    match spec {
        ThresholdSpec::Number(x) => py_num_str(*x),
        ThresholdSpec::Text(s) => s.clone(),
    }
}

/// verl's `_parse_rollout_is_threshold`: `(upper, lower)`; `lower` is `Some` for IcePop.
pub fn parse_is_threshold(spec: &ThresholdSpec) -> Result<(f64, Option<f64>)> {
    const K: &str = "rollout_is_threshold";
    let (upper, lower) = match spec {
        ThresholdSpec::Number(x) => (*x, None),
        ThresholdSpec::Text(raw) => {
            let s = raw.trim();
            if s.is_empty() {
                return Err(Error::config(
                    K,
                    "rollout_is_threshold must not be an empty string.",
                ));
            }
            let bad = || Error::config(K, format!("Invalid rollout_is_threshold '{raw}'."));
            if let Some((l, u)) = s.split_once('_') {
                (
                    py_float(u).ok_or_else(bad)?,
                    Some(py_float(l).ok_or_else(bad)?),
                )
            } else {
                (py_float(s).ok_or_else(bad)?, None)
            }
        }
    };
    if upper.is_nan() || upper <= 0.0 {
        return Err(Error::config(
            K,
            format!(
                "rollout_is_threshold upper bound must be positive, got {}.",
                py_num_str(upper)
            ),
        ));
    }
    if let Some(l) = lower {
        if l.is_nan() || l <= 0.0 {
            return Err(Error::config(
                K,
                format!(
                    "rollout_is_threshold lower bound must be positive, got {}.",
                    py_num_str(l)
                ),
            ));
        }
        if l > upper {
            return Err(Error::config(
                K,
                "rollout_is_threshold lower bound must be <= upper bound.",
            ));
        }
    }
    Ok((upper, lower))
}

/// verl's `_parse_rollout_rs_thresholds`: `(lower, upper)` per option (lower only for k1).
pub fn parse_rs_thresholds(
    options: &[String],
    spec: &ThresholdSpec,
) -> Result<Vec<(Option<f64>, f64)>> {
    const K: &str = "rollout_rs_threshold";
    let mut raw: Vec<String> = match spec {
        ThresholdSpec::Number(x) => vec![py_num_str(*x)],
        ThresholdSpec::Text(s) => s
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect(),
    };
    if raw.is_empty() {
        return Err(Error::config(
            K,
            "rollout_rs_threshold must contain at least one threshold value.",
        ));
    }
    if raw.len() != 1 && raw.len() != options.len() {
        return Err(Error::config(
            K,
            format!(
                "rollout_rs_threshold expects either one threshold shared by all options or exactly \
                 {} thresholds to match the provided rollout_rs options.",
                options.len()
            ),
        ));
    }
    if raw.len() == 1 && options.len() > 1 {
        raw = vec![raw[0].clone(); options.len()];
    }
    let _ = spec_text(spec);
    let mut out = Vec::new();
    for (option, s) in options.iter().zip(&raw) {
        let bad = || {
            Error::config(
                K,
                format!("Invalid numeric threshold '{s}' for option '{option}'."),
            )
        };
        if option.ends_with("k1") {
            let (lower, upper) = if let Some((l, u)) = s.split_once('_') {
                (py_float(l).ok_or_else(bad)?, py_float(u).ok_or_else(bad)?)
            } else {
                let u = py_float(s).ok_or_else(bad)?;
                (1.0 / u, u)
            };
            if lower <= 0.0 || upper <= 0.0 {
                return Err(Error::config(
                    K,
                    format!("Thresholds for option '{option}' must be positive, got {s}."),
                ));
            }
            if lower > upper {
                return Err(Error::config(
                    K,
                    format!("Thresholds for option '{option}' must be lower <= upper, got {s}."),
                ));
            }
            if lower.is_nan() || upper.is_nan() {
                return Err(bad());
            }
            out.push((Some(lower), upper));
        } else {
            if s.contains('_') {
                return Err(Error::config(
                    K,
                    format!(
                        "rollout_rs_threshold for option '{option}' must provide a single upper bound \
                         without '_'. Received '{s}'."
                    ),
                ));
            }
            let upper = py_float(s).ok_or_else(bad)?;
            if upper.is_nan() || upper <= 0.0 {
                return Err(Error::config(
                    K,
                    format!("Threshold for option '{option}' must be positive, got {s}."),
                ));
            }
            out.push((None, upper));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_rules() {
        assert_eq!(py_float(" 3 "), Some(3.0));
        assert_eq!(py_float("2_3"), Some(23.0));
        assert_eq!(py_float("_2"), None);
        assert_eq!(py_float("abc"), None);
        assert_eq!(py_float("1e-3"), Some(1e-3));
        assert_eq!(py_float("inf"), Some(f64::INFINITY));
    }

    #[test]
    fn presets_resolve() {
        for name in CorrectionConfig::preset_names() {
            CorrectionConfig::preset(name).unwrap().resolve().unwrap();
        }
        assert!(CorrectionConfig::preset("nope").is_err());
    }

    #[test]
    fn unknown_key_named() {
        let e = CorrectionConfig::from_json_str(r#"{"rollout_iss": "token"}"#).unwrap_err();
        assert!(e.to_string().contains("rollout_iss"));
        let c = CorrectionConfig::from_json_str(r#"{"dppo": {"delta": 0.1}}"#).unwrap();
        assert_eq!(c.dppo.as_ref().map(|d| d.delta), Some(0.1));
        assert_eq!(c.top_k_support(), TopkSupport::Union);
        let back = CorrectionConfig::from_json_value(&c.to_json_value()).unwrap();
        assert_eq!(back, c);
        for (bad, key) in [
            (
                r#"{"dppo": {"delta": 0.1, "direction": "up"}}"#,
                "dppo.direction",
            ),
            (r#"{"dppo": {"delta": -1}}"#, "dppo.delta"),
            (r#"{"dppo": {"delta": 0.1, "detla": 1}}"#, "dppo.detla"),
            (r#"{"dppo": 3}"#, "dppo"),
        ] {
            match CorrectionConfig::from_json_str(bad) {
                Err(Error::InvalidConfig { key: k, .. }) => assert_eq!(k, key, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let c = CorrectionConfig::from_json_str(
            r#"{"rollout_is": "token", "dppo": {"delta": 0.1, "top_k_support": "replace_kth"}}"#,
        )
        .unwrap();
        assert_eq!(c.top_k_support(), TopkSupport::ReplaceKth);
        assert!(c.resolve().unwrap().dppo.is_some());
    }
}
