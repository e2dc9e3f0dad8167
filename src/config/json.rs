//! JSON in and out of [`CorrectionConfig`] (unknown keys are an error naming the key).

use super::dppo::DppoConfig;
use super::types::{CorrectionConfig, Cppo, LnTrm, ThresholdSpec};
use crate::error::{Error, Result};
use crate::stats::IsLevel;
use serde_json::{Map, Value};

impl ThresholdSpec {
    pub(crate) fn to_json(&self) -> Value {
        match self {
            ThresholdSpec::Number(x) => num_json(*x),
            ThresholdSpec::Text(s) => Value::String(s.clone()),
        }
    }
    pub(crate) fn from_json(key: &str, v: &Value) -> Result<Option<Self>> {
        match v {
            Value::Null => Ok(None),
            Value::Number(n) => Ok(Some(ThresholdSpec::Number(n.as_f64().unwrap_or(f64::NAN)))),
            Value::String(s) => Ok(Some(match crate::lenient_json::non_finite(s) {
                Some(x) => ThresholdSpec::Number(x),
                None => ThresholdSpec::Text(s.clone()),
            })),
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

pub(crate) fn num_json(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn want_f64(key: &str, v: &Value) -> Result<f64> {
    v.as_f64()
        .or_else(|| v.as_str().and_then(crate::lenient_json::non_finite))
        .ok_or_else(|| Error::config(key, format!("must be a number, got {v}")))
}

/// verl keeps these keys under `algorithm.rollout_correction`; accept that nesting (and a bare
/// `rollout_correction` object) as well as the flat object.
fn unnest(v: &Value) -> &Value {
    let inner = v
        .get("algorithm")
        .and_then(|a| a.get("rollout_correction"))
        .or_else(|| v.get("rollout_correction"));
    match inner {
        Some(x) if x.is_object() => x,
        _ => v,
    }
}

impl CorrectionConfig {
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
                    c.set_temperature(key, want_f64(key, val)?)?;
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
                "cppo" => {
                    if val.is_null() {
                        c.cppo = None;
                        continue;
                    }
                    let o = val
                        .as_object()
                        .ok_or_else(|| Error::config(key, "must be an object {w_min, delta_b}"))?;
                    let mut p = Cppo::default();
                    for (k, v) in o {
                        let full = format!("cppo.{k}");
                        let x = want_f64(&full, v)?;
                        match k.as_str() {
                            "w_min" if x > 0.0 && x <= 1.0 => p.w_min = x,
                            "w_min" => {
                                return Err(Error::config(&full, format!("must be in (0, 1], got {x}")))
                            }
                            "delta_b" if x >= 0.0 && x.is_finite() => p.delta_b = x,
                            "delta_b" => {
                                return Err(Error::config(
                                    &full,
                                    format!("must be a finite number >= 0, got {x}"),
                                ))
                            }
                            _ => {
                                return Err(Error::config(
                                    &full,
                                    "unknown key (expected w_min, delta_b)",
                                ))
                            }
                        }
                    }
                    c.cppo = Some(p);
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
                "top_p" | "min_p" => {
                    let x = if val.is_null() {
                        if key == "top_p" {
                            1.0
                        } else {
                            0.0
                        }
                    } else {
                        want_f64(key, val)?
                    };
                    if key == "top_p" {
                        c.sampling.top_p = x;
                    } else {
                        c.sampling.min_p = x;
                    }
                    c.sampling.validate()?;
                }
                "top_k" => {
                    // vLLM's -1 and 0 both mean off
                    let x = if val.is_null() { 0.0 } else { want_f64(key, val)? };
                    if x.fract() != 0.0 || x < -1.0 || x > u32::MAX as f64 {
                        return Err(Error::config(
                            key,
                            format!("must be an integer >= -1 (-1 or 0: off), got {x}"),
                        ));
                    }
                    c.sampling.top_k = x.max(0.0) as usize;
                }
                "sampling_replay" => {
                    c.sampling_replay = match val {
                        Value::Null => false,
                        Value::Bool(b) => *b,
                        _ => return Err(Error::config(key, "must be true or false")),
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
                         loss_type, temperature, ln_trm, cppo, token_veto, dppo, top_p, top_k, \
                         min_p, sampling_replay)",
                    ))
                }
            }
        }
        c.resolve()?;
        Ok(c)
    }

    /// Parses JSON text (Python's bare `NaN` / `Infinity` / `-Infinity` accepted).
    pub fn from_json_str(text: &str) -> Result<Self> {
        let v: Value = crate::lenient_json::parse(text)
            .map_err(|e| Error::config("config", format!("not valid JSON: {e}")))?;
        Self::from_json_value(unnest(&v))
    }

    /// Parses YAML text (the same keys; verl's `algorithm: rollout_correction:` nesting too).
    pub fn from_yaml_str(text: &str) -> Result<Self> {
        let v: Value = serde_yaml_ng::from_str(text)
            .map_err(|e| Error::config("config", format!("not valid YAML: {e}")))?;
        Self::from_json_value(unnest(&v))
    }

    /// Reads a config file: YAML for `.yaml` / `.yml`, JSON otherwise.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        Self::from_json_value(&Self::file_value(path)?)
    }

    /// `base` (a preset) with the keys of the config file at `path` overriding its own:
    /// `--preset NAME --config CFG`.
    pub fn from_file_over(base: &Self, path: &std::path::Path) -> Result<Self> {
        let mut merged = base.to_json_value();
        if let (Value::Object(m), Value::Object(over)) = (&mut merged, Self::file_value(path)?) {
            m.extend(over);
        }
        Self::from_json_value(&merged)
    }

    /// A config file's object (unnested from `algorithm: rollout_correction:`).
    fn file_value(path: &std::path::Path) -> Result<Value> {
        let p = path.display().to_string();
        // A config is small: at most 1 MiB, read from a file or a pipe (`--config <(echo …)`),
        // never more than the limit from an endless source.
        const LIMIT: u64 = 1 << 20;
        let too_large = || {
            Error::file(
                &p,
                format!("is larger than the {LIMIT}-byte limit for a config"),
            )
        };
        let m = std::fs::metadata(path).map_err(|e| Error::file(&p, e.to_string()))?;
        if m.is_dir() {
            return Err(Error::file(
                &p,
                "is a directory; a config is a JSON or YAML file",
            ));
        }
        if m.is_file() && m.len() > LIMIT {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        let file = std::fs::File::open(path).map_err(|e| Error::file(&p, e.to_string()))?;
        std::io::Read::read_to_end(&mut std::io::Read::take(file, LIMIT + 1), &mut bytes)
            .map_err(|e| Error::file(&p, e.to_string()))?;
        if bytes.len() as u64 > LIMIT {
            return Err(too_large());
        }
        let text = String::from_utf8(bytes).map_err(|_| Error::file(&p, "is not UTF-8 text"))?;
        let yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
        let v: Value = if yaml {
            serde_yaml_ng::from_str(&text)
                .map_err(|e| Error::config("config", format!("not valid YAML: {e}")))?
        } else {
            crate::lenient_json::parse(&text)
                .map_err(|e| Error::config("config", format!("not valid JSON: {e}")))?
        };
        Ok(unnest(&v).clone())
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
        if let Some(p) = &self.cppo {
            let mut o = Map::new();
            o.insert("w_min".into(), num_json(p.w_min));
            o.insert("delta_b".into(), num_json(p.delta_b));
            m.insert("cppo".into(), Value::Object(o));
        }
        if let Some(t) = self.token_veto {
            m.insert("token_veto".into(), num_json(t));
        }
        if self.sampling.top_p < 1.0 {
            m.insert("top_p".into(), num_json(self.sampling.top_p));
        }
        if self.sampling.top_k > 0 {
            m.insert("top_k".into(), Value::from(self.sampling.top_k as u64));
        }
        if self.sampling.min_p > 0.0 {
            m.insert("min_p".into(), num_json(self.sampling.min_p));
        }
        if self.sampling_replay {
            m.insert("sampling_replay".into(), Value::Bool(true));
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::TopkSupport;

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

    #[test]
    fn yaml_python_json_and_verl_nesting() {
        let flat = CorrectionConfig::from_json_str(
            r#"{"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01, "token_veto": 1e-4}"#,
        )
        .unwrap();
        let yaml = "algorithm:\n  rollout_correction:\n    rollout_rs: seq_mean_k3\n    \
                    rollout_rs_threshold: 0.01\n    token_veto: 1.0e-4\n";
        assert_eq!(CorrectionConfig::from_yaml_str(yaml).unwrap(), flat);
        let nested = r#"{"algorithm": {"rollout_correction": {"rollout_rs": "seq_mean_k3",
            "rollout_rs_threshold": 0.01, "token_veto": 1e-4}}}"#;
        assert_eq!(CorrectionConfig::from_json_str(nested).unwrap(), flat);
        let py = CorrectionConfig::from_json_str(
            r#"{"rollout_is": "token", "rollout_is_threshold": Infinity}"#,
        )
        .unwrap();
        assert_eq!(
            py.rollout_is_threshold,
            Some(ThresholdSpec::Number(f64::INFINITY))
        );
        let e = CorrectionConfig::from_yaml_str("rollout_rs: [1").unwrap_err();
        assert!(e.to_string().contains("YAML"), "{e}");
    }
}
