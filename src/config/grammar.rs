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
    // `inf`, `infinity` and `nan` (any case, one sign) are left to Rust's parser, which takes
    // exactly Python's spellings of them; every other number is decimal digits only.
    let word = body.starts_with("inf") || body.starts_with("nan");
    if !word
        && !body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'+' | b'-'))
    {
        return None;
    }
    lower.parse::<f64>().ok()
}

/// Python's `str(float)`: the shortest round-trip digits, positional for decimal exponents in
/// `[−4, 16)` (with `.0` on integers), else `1.5e-05` / `1e+16`; `nan`, `inf`, `-inf`.
pub(crate) fn py_num_str(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{x:e}"); // shortest round-trip digits: "1.5e-5", "-1e16", "0e0"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
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
    fn python_float_edges() {
        // underscores only between two digits
        assert_eq!(py_float("2_"), None);
        assert_eq!(py_float("1__2"), None);
        assert_eq!(py_float("1._5"), None);
        assert_eq!(py_float("1_.5"), None);
        assert_eq!(py_float("1_e3"), None);
        assert_eq!(py_float("1_0.2_5"), Some(10.25));
        assert_eq!(py_float("   "), None);
        assert_eq!(py_float(""), None);
        // one sign at most before inf/nan, and only the full words
        assert_eq!(py_float("+inf"), Some(f64::INFINITY));
        assert_eq!(py_float("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(py_float("++inf"), None);
        assert_eq!(py_float("-+inf"), None);
        assert_eq!(py_float("infin"), None);
        assert_eq!(py_float("infinityx"), None);
        assert_eq!(py_float(" INFINITY "), Some(f64::INFINITY));
        assert!(py_float("+nan").is_some_and(f64::is_nan));
        assert_eq!(py_float("nanx"), None);
        assert!(py_float("NaN").is_some_and(f64::is_nan));
        assert!(py_float("-nan").is_some_and(f64::is_nan));
        // decimal forms only (Rust would also take these; Python does not)
        assert_eq!(py_float("1.5E3"), Some(1500.0));
        assert_eq!(py_float("-.5"), Some(-0.5));
        assert_eq!(py_float("0x10"), None);
        assert_eq!(py_float("1,5"), None);
    }

    #[test]
    fn python_number_text() {
        assert_eq!(py_num_str(0.0), "0.0");
        assert_eq!(py_num_str(-3.0), "-3.0");
        assert_eq!(py_num_str(-1.5), "-1.5");
        assert_eq!(py_num_str(-1.25), "-1.25");
        assert_eq!(py_num_str(0.125), "0.125");
        assert_eq!(py_num_str(f64::NEG_INFINITY), "-inf");
        assert_eq!(py_num_str(f64::INFINITY), "inf");
        assert_eq!(py_num_str(f64::NAN), "nan");
        // str(x) in CPython 3.11
        let python = [
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (-1e16, "-1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (-0.00001, "-1e-05"),
            (1.5e-7, "1.5e-07"),
            (2.5e300, "2.5e+300"),
            (5e-324, "5e-324"),
            (0.1, "0.1"),
        ];
        for (x, want) in python {
            assert_eq!(py_num_str(x), want, "{x:e}");
        }
    }

    fn text(s: &str) -> ThresholdSpec {
        ThresholdSpec::Text(s.into())
    }

    fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn is_threshold_grammar() {
        let p = parse_is_threshold;
        assert_eq!(p(&ThresholdSpec::Number(2.0)).unwrap(), (2.0, None));
        assert_eq!(p(&text(" 2.5 ")).unwrap(), (2.5, None));
        assert_eq!(p(&text("0.5_2")).unwrap(), (2.0, Some(0.5)));
        assert_eq!(p(&text("2_3")).unwrap(), (3.0, Some(2.0))); // a range, not Python's 23
        assert_eq!(p(&text("1.5_1.5")).unwrap(), (1.5, Some(1.5)));
        let m = message(p(&text("  ")));
        assert!(m.contains("must not be an empty string"), "{m}");
        let m = message(p(&text("abc")));
        assert!(m.contains("Invalid rollout_is_threshold 'abc'"), "{m}");
        let m = message(p(&text("0.5_x")));
        assert!(m.contains("Invalid rollout_is_threshold '0.5_x'"), "{m}");
        let m = message(p(&text("x_2")));
        assert!(m.contains("Invalid rollout_is_threshold 'x_2'"), "{m}");
        let m = message(p(&ThresholdSpec::Number(0.0)));
        assert!(m.contains("upper bound must be positive, got 0.0."), "{m}");
        let m = message(p(&ThresholdSpec::Number(-1.5)));
        assert!(m.contains("upper bound must be positive, got -1.5."), "{m}");
        let m = message(p(&text("nan")));
        assert!(m.contains("upper bound must be positive"), "{m}");
        let m = message(p(&text("0.0_2")));
        assert!(m.contains("lower bound must be positive, got 0.0."), "{m}");
        let m = message(p(&text("nan_2")));
        assert!(m.contains("lower bound must be positive"), "{m}");
        let m = message(p(&text("3_2.5")));
        assert!(m.contains("lower bound must be <= upper bound"), "{m}");
    }

    #[test]
    fn rs_threshold_grammar() {
        let opts = |o: &[&str]| o.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = parse_rs_thresholds;
        // one value shared by every option; k1 gets (1/u, u) or an explicit range
        assert_eq!(
            p(&opts(&["token_k1", "seq_sum_k3"]), &text("2")).unwrap(),
            vec![(Some(0.5), 2.0), (None, 2.0)]
        );
        assert_eq!(
            p(&opts(&["seq_mean_k1"]), &ThresholdSpec::Number(4.0)).unwrap(),
            vec![(Some(0.25), 4.0)]
        );
        assert_eq!(
            p(&opts(&["token_k1", "seq_max_k2"]), &text(" 0.5_3 , 0.01 ,")).unwrap(),
            vec![(Some(0.5), 3.0), (None, 0.01)]
        );
        assert_eq!(
            p(&opts(&["token_k1"]), &text("2_3")).unwrap(),
            vec![(Some(2.0), 3.0)]
        );
        assert_eq!(
            p(&opts(&["token_k1"]), &text("1.5_1.5")).unwrap(),
            vec![(Some(1.5), 1.5)]
        );
        let m = message(p(&opts(&["token_k1"]), &text(" , ")));
        assert!(m.contains("at least one threshold value"), "{m}");
        let m = message(p(&opts(&["a_k3", "b_k3", "c_k3"]), &text("1,2")));
        assert!(m.contains("exactly 3 thresholds"), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("x_2")));
        assert!(
            m.contains("Invalid numeric threshold 'x_2' for option 'token_k1'"),
            "{m}"
        );
        let m = message(p(&opts(&["token_k1"]), &text("0.5_y")));
        assert!(m.contains("Invalid numeric threshold '0.5_y'"), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("z")));
        assert!(m.contains("Invalid numeric threshold 'z'"), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("0_2")));
        assert!(m.contains("must be positive, got 0_2."), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("0.5_-1")));
        assert!(m.contains("must be positive, got 0.5_-1."), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("3_2")));
        assert!(m.contains("must be lower <= upper, got 3_2."), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("nan_2")));
        assert!(m.contains("Invalid numeric threshold 'nan_2'"), "{m}");
        let m = message(p(&opts(&["token_k1"]), &text("0.5_nan")));
        assert!(m.contains("Invalid numeric threshold '0.5_nan'"), "{m}");
        let m = message(p(&opts(&["seq_sum_k3"]), &text("0.5_2")));
        assert!(m.contains("single upper bound without '_'"), "{m}");
        let m = message(p(&opts(&["seq_sum_k3"]), &text("q")));
        assert!(
            m.contains("Invalid numeric threshold 'q' for option 'seq_sum_k3'"),
            "{m}"
        );
        let m = message(p(&opts(&["seq_sum_k3"]), &text("0")));
        assert!(m.contains("must be positive, got 0."), "{m}");
        let m = message(p(&opts(&["seq_sum_k3"]), &text("nan")));
        assert!(m.contains("must be positive, got nan."), "{m}");
    }
}
