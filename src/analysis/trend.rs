//! A run's trend: the `--metrics-jsonl` lines of many steps read back, and the steps whose
//! mismatch jumps, by a robust z-score against a rolling window of the steps before.
//!
//! The z-score of step `t` is `(x_t − median(W)) / (1.4826 · MAD(W))` over the window `W` of
//! the (at most) [`WINDOW`] steps before it, on `log10` of the mismatch (`trmask/k3_mean`, a
//! positive, heavy-tailed quantity); `|z| > `[`JUMP_Z`] is a jump. A window with MAD 0 marks
//! any step that differs from its median.
//!
//! ```
//! let text = (0..30)
//!     .map(|s| {
//!         let k3 = if s == 25 { 1e-2 } else { 1e-4 * (1.0 + 0.1 * ((s * 7 % 5) as f64)) };
//!         format!("{{\"input\": \"step{s}\", \"step\": {s}, \"trmask/k3_mean\": {k3}}}\n")
//!     })
//!     .collect::<String>();
//! let steps = trmask::trend::parse_jsonl(&text, "run.jsonl")?;
//! let jumps = trmask::trend::jumps(&steps, "trmask/k3_mean");
//! assert_eq!(jumps.iter().map(|j| j.index).collect::<Vec<_>>(), vec![25]);
//! # Ok::<(), trmask::Error>(())
//! ```

use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Steps in a jump's rolling window.
pub const WINDOW: usize = 20;
/// Fewest steps before a step for its z-score to be computed.
pub const MIN_WINDOW: usize = 5;
/// `|z|` above which a step is a jump.
pub const JUMP_Z: f64 = 3.5;

/// One line of a `--metrics-jsonl` file.
#[derive(Clone, Debug)]
pub struct Step {
    pub input: String,
    pub step: f64,
    pub metrics: BTreeMap<String, f64>,
}

/// A step whose value jumps.
#[derive(Clone, Debug, PartialEq)]
pub struct Jump {
    /// Position of the step in the file.
    pub index: usize,
    pub z: f64,
}

fn number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// Reads the lines of a `--metrics-jsonl` file (`name` in errors); blank lines are skipped.
/// Every line must be a JSON object with a numeric `step`; metrics that are not numbers (the
/// sweeps' arrays) are left out.
pub fn parse_jsonl(text: &str, name: &str) -> Result<Vec<Step>> {
    let mut out = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{name}: line {}", k + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| Error::file(&at, e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::file(&at, "is not a JSON object"))?;
        let step = obj
            .get("step")
            .and_then(number)
            .ok_or_else(|| Error::file(&at, "has no numeric `step`"))?;
        let input = obj
            .get("input")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let metrics = obj
            .iter()
            .filter(|(k, _)| *k != "step")
            .filter_map(|(k, v)| number(v).map(|x| (k.clone(), x)))
            .collect();
        out.push(Step {
            input,
            step,
            metrics,
        });
    }
    if out.is_empty() {
        return Err(Error::file(name, "has no metrics line"));
    }
    Ok(out)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The steps whose `log10(metric)` has `|z| > JUMP_Z` against the steps before (see the
/// module docs); steps without a positive finite value are skipped.
pub fn jumps(steps: &[Step], metric: &str) -> Vec<Jump> {
    let series: Vec<(usize, f64)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.metrics.get(metric).map(|&x| (i, x)))
        .filter(|(_, x)| x.is_finite() && *x > 0.0)
        .map(|(i, x)| (i, x.log10()))
        .collect();
    let mut out = Vec::new();
    for k in MIN_WINDOW..series.len() {
        let mut w: Vec<f64> = series[k.saturating_sub(WINDOW)..k]
            .iter()
            .map(|p| p.1)
            .collect();
        let med = median(&mut w);
        let mut dev: Vec<f64> = w.iter().map(|x| (x - med).abs()).collect();
        let mad = median(&mut dev) * 1.4826;
        let x = series[k].1;
        let z = if mad > 0.0 {
            (x - med) / mad
        } else if x != med {
            f64::INFINITY.copysign(x - med)
        } else {
            0.0
        };
        if z.abs() > JUMP_Z {
            out.push(Jump {
                index: series[k].0,
                z,
            });
        }
    }
    out
}
