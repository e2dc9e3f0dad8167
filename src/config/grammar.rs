//! verl's threshold grammar (`_parse_rollout_rs_thresholds`, the IS threshold) with its exact
//! rules and error messages, and Python's `float(str)`.

use super::types::ThresholdSpec;
use crate::error::{Error, Result};

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

pub(crate) fn py_num_str(x: f64) -> String {
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
}
