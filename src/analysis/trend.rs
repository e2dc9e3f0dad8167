//! A run's trend: the metrics lines of many steps read back (trmask's `--metrics-jsonl`, or
//! verl's `file` logger), ordered by step, and the steps whose mismatch jumps, by a robust
//! z-score against a rolling window of the steps before.
//!
//! Steps are kept sorted by their `step` value, whatever the order of the lines: a resumed run
//! that appends steps 0–30 again after steps 0–110 draws one line per step, and a step that
//! appears more than once keeps its last line ([`Trend::duplicates`] names those steps).
//!
//! The z-score of step `t` for a metric is `(x_t − median(W)) / max(1.4826 · MAD(W),
//! MIN_SPREAD)` over the window `W` of the (at most) [`WINDOW`] steps before it that have the
//! metric, on `log10` of the metric (a positive, heavy-tailed quantity); `|z| > `[`JUMP_Z`] is
//! a jump, from the step with [`MIN_WINDOW`] steps before it on. The floor [`MIN_SPREAD`]
//! keeps a window of near-identical steps (MAD ≈ 0) from flagging a 10 % wobble: a jump is
//! always a change of at least a factor 10^(3.5 · 0.05) ≈ 1.5. The metrics watched for jumps
//! are [`JUMP_METRICS`].
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
pub const MIN_WINDOW: usize = 4;
/// `|z|` above which a step is a jump.
pub const JUMP_Z: f64 = 3.5;
/// The least robust σ of a window, in decades (log10 units): with [`JUMP_Z`], a jump is a
/// change by a factor of at least 10^0.175 ≈ 1.5, however alike the steps before it are.
pub const MIN_SPREAD: f64 = 0.05;

/// The metrics whose jumps are detected: a label and the keys that hold it, the first present
/// in a step wins (verl's `file` logger writes verl's k3 mean, `K3_KL`, where
/// trmask writes `trmask/k3_mean`).
pub const JUMP_METRICS: [(&str, &[&str]); 3] = [
    ("k3 mean", &["trmask/k3_mean", crate::metrics::verl::K3_KL]),
    ("exact KL mean", &["trmask/kl_mean"]),
    ("max |log rho|", &["trmask/abs_max"]),
];

/// One metrics line: the input it describes (empty when the line names none), its step and
/// its numeric metrics.
#[derive(Clone, Debug)]
pub struct Step {
    pub input: String,
    pub step: f64,
    pub metrics: BTreeMap<String, f64>,
}

impl Step {
    /// The first of `keys` this step holds.
    pub fn first(&self, keys: &[&str]) -> Option<f64> {
        keys.iter().find_map(|k| self.metrics.get(*k).copied())
    }
}

/// A step whose value jumps.
#[derive(Clone, Debug, PartialEq)]
pub struct Jump {
    /// Position of the step in the slice given to [`jumps`] (sorted by step).
    pub index: usize,
    pub z: f64,
    /// The step's value of the metric.
    pub value: f64,
    /// The median of the window the step was compared with.
    pub median: f64,
    /// Steps in that window.
    pub window: usize,
}

/// A jump of one of the [`JUMP_METRICS`], with the step it happened at.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub step: f64,
    /// The metric's label in [`JUMP_METRICS`].
    pub metric: &'static str,
    /// The key it was read from.
    pub key: &'static str,
    pub jump: Jump,
}

impl Alert {
    /// The `alert:` line the command line prints for this jump.
    pub fn line(&self) -> String {
        format!(
            "alert: step {}: {} {} jumped (robust z {:+.1} against the median {} of the {} \
             steps before; |z| > {JUMP_Z})",
            fmt_num(self.step),
            self.metric,
            fmt_sci(self.jump.value),
            self.jump.z,
            fmt_sci(self.jump.median),
            self.jump.window
        )
    }
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

fn fmt_sci(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-2 || x.abs() >= 1e4) {
        format!("{x:.3e}")
    } else {
        format!("{x:.4}")
    }
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

/// Which writer a metrics line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFormat {
    /// trmask's `--metrics-jsonl`: `{"input", "step", <metric>: value, …}`.
    Trmask,
    /// verl's `file` logger (verl/utils/tracking.py, `FileLogger`): `{"step", "data": {…}}`.
    VerlFileLogger,
}

impl LineFormat {
    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            LineFormat::Trmask => "trmask metrics lines",
            LineFormat::VerlFileLogger => "verl file-logger lines",
        }
    }
}

/// Parses one line of a metrics JSON-lines file into its steps (`at` names the file and line
/// in errors). A line normally holds one object; objects glued onto one line by an append to
/// a file that lacked its final newline are read one after another. `keep` selects the
/// metrics kept (non-numeric values, the sweeps' arrays, are always left out). A blank line
/// holds no step.
pub fn parse_line(
    line: &str,
    at: &str,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(Step, LineFormat)>> {
    let mut out = Vec::new();
    let text = crate::lenient_json::quote_non_finite(line);
    let stream = serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>();
    for v in stream {
        let v = v.map_err(|e| {
            let what = if e.is_eof() {
                "a partial line (the JSON object is cut off)"
            } else {
                "not a JSON object"
            };
            Error::file(at, format!("{what}: {e}"))
        })?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::file(at, "is not a JSON object"))?;
        let step = obj
            .get("step")
            .and_then(number)
            .ok_or_else(|| Error::file(at, "has no numeric `step`"))?;
        let (format, fields) = match obj.get("data").and_then(|d| d.as_object()) {
            Some(data) if !obj.contains_key("input") => (LineFormat::VerlFileLogger, data),
            _ => (LineFormat::Trmask, obj),
        };
        let input = obj
            .get("input")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let metrics = fields
            .iter()
            .filter(|(k, _)| *k != "step" && *k != "input" && keep(k))
            // verl's file logger (orjson) writes NaN and ±inf as null
            .filter_map(|(k, v)| match (v, format) {
                (serde_json::Value::Null, LineFormat::VerlFileLogger) => {
                    Some((k.clone(), f64::NAN))
                }
                _ => number(v).map(|x| (k.clone(), x)),
            })
            .collect();
        out.push((
            Step {
                input,
                step,
                metrics,
            },
            format,
        ));
    }
    Ok(out)
}

/// The steps of a run, sorted by step; a step seen again replaces the one before.
#[derive(Clone, Debug, Default)]
pub struct Trend {
    steps: Vec<Step>,
    /// Steps that appeared more than once, with how many times.
    duplicates: BTreeMap<OrdF64, usize>,
}

/// An f64 ordered by `total_cmp` (map keys).
#[derive(Clone, Copy, Debug, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl Trend {
    /// An empty trend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a step in its place by `step`; a step already present is replaced (the later line
    /// wins) and counted as duplicated. Returns the step's position.
    pub fn push(&mut self, s: Step) -> usize {
        // appends (the common case) first
        if self
            .steps
            .last()
            .is_none_or(|l| l.step.total_cmp(&s.step).is_lt())
        {
            self.steps.push(s);
            return self.steps.len() - 1;
        }
        match self.steps.binary_search_by(|x| x.step.total_cmp(&s.step)) {
            Ok(i) => {
                *self.duplicates.entry(OrdF64(s.step)).or_insert(1) += 1;
                self.steps[i] = s;
                i
            }
            Err(i) => {
                self.steps.insert(i, s);
                i
            }
        }
    }

    /// The steps, sorted by step.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The steps that appeared more than once, with how many times each appeared.
    pub fn duplicates(&self) -> Vec<(f64, usize)> {
        self.duplicates.iter().map(|(k, &n)| (k.0, n)).collect()
    }

    /// The `warning:` line naming the duplicated steps (`name`: the run file), if any.
    pub fn duplicate_warning(&self, name: &str) -> Option<String> {
        if self.duplicates.is_empty() {
            return None;
        }
        let list: Vec<String> = self.duplicates.keys().map(|k| fmt_num(k.0)).collect();
        let shown = if list.len() > 12 {
            format!(
                "{} … {} ({} steps)",
                list[..6].join(", "),
                list[list.len() - 3..].join(", "),
                list.len()
            )
        } else {
            list.join(", ")
        };
        Some(format!(
            "warning: {name}: step{} {shown} appear{} more than once (a resumed run?); the last \
             line of each is kept",
            if list.len() == 1 { "" } else { "s" },
            if list.len() == 1 { "s" } else { "" },
        ))
    }

    /// The jumps of every [`JUMP_METRICS`] metric, in step order.
    pub fn alerts(&self) -> Vec<Alert> {
        alerts(&self.steps)
    }
}

/// Reads the lines of a metrics JSON-lines file (`name` in errors; trmask's `--metrics-jsonl`
/// or verl's `file` logger), sorted by step, a repeated step keeping its last line; blank
/// lines are skipped. Every line must be a JSON object with a numeric `step`; metrics that are
/// not numbers (the sweeps' arrays) are left out.
pub fn parse_jsonl(text: &str, name: &str) -> Result<Vec<Step>> {
    let mut t = Trend::new();
    for (k, line) in text.lines().enumerate() {
        let at = format!("{name}: line {}", k + 1);
        for (s, _) in parse_line(line, &at, &|_| true)? {
            t.push(s);
        }
    }
    if t.steps.is_empty() {
        return Err(Error::file(name, "has no metrics line"));
    }
    Ok(t.steps)
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

/// The steps whose `log10` of the first of `keys` they hold has `|z| > JUMP_Z` against the
/// steps before (see the module docs); steps without a positive finite value are skipped.
pub fn jumps_of(steps: &[Step], keys: &[&str]) -> Vec<Jump> {
    let series: Vec<(usize, f64, f64)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.first(keys).map(|x| (i, x)))
        .filter(|(_, x)| x.is_finite() && *x > 0.0)
        .map(|(i, x)| (i, x.log10(), x))
        .collect();
    let mut out = Vec::new();
    for k in MIN_WINDOW..series.len() {
        let mut w: Vec<f64> = series[k.saturating_sub(WINDOW)..k]
            .iter()
            .map(|p| p.1)
            .collect();
        let window = w.len();
        let med = median(&mut w);
        let mut dev: Vec<f64> = w.iter().map(|x| (x - med).abs()).collect();
        let sigma = (median(&mut dev) * 1.4826).max(MIN_SPREAD);
        let x = series[k].1;
        let z = (x - med) / sigma;
        if z.abs() > JUMP_Z {
            out.push(Jump {
                index: series[k].0,
                z,
                value: series[k].2,
                median: 10f64.powf(med),
                window,
            });
        }
    }
    out
}

/// The steps whose `log10(metric)` has `|z| > JUMP_Z` against the steps before (see the
/// module docs); steps without a positive finite value are skipped.
pub fn jumps(steps: &[Step], metric: &str) -> Vec<Jump> {
    jumps_of(steps, &[metric])
}

/// The jumps of every [`JUMP_METRICS`] metric over `steps` (sorted by step), in step order.
pub fn alerts(steps: &[Step]) -> Vec<Alert> {
    let mut out = Vec::new();
    for (label, keys) in JUMP_METRICS {
        for j in jumps_of(steps, keys) {
            let s = &steps[j.index];
            let key = keys.iter().find(|k| s.metrics.contains_key(**k)).copied();
            out.push(Alert {
                step: s.step,
                metric: label,
                key: key.unwrap_or(keys[0]),
                jump: j,
            });
        }
    }
    out.sort_by_key(|a| a.jump.index);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: i64, k3: f64) -> String {
        format!("{{\"input\": \"s{step}\", \"step\": {step}, \"trmask/k3_mean\": {k3}}}")
    }

    #[test]
    fn a_resumed_run_is_sorted_and_its_repeated_steps_keep_their_last_line() {
        let mut text = String::new();
        for s in 0..6 {
            text += &line(s, 1e-3);
            text.push('\n');
        }
        for s in 0..4 {
            text += &line(s, 2e-3);
            text.push('\n');
        }
        let mut t = Trend::new();
        for (k, l) in text.lines().enumerate() {
            for (s, f) in parse_line(l, &format!("run: line {}", k + 1), &|_| true).unwrap() {
                assert_eq!(f, LineFormat::Trmask);
                t.push(s);
            }
        }
        let steps: Vec<f64> = t.steps().iter().map(|s| s.step).collect();
        assert_eq!(steps, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(t.steps()[0].metrics["trmask/k3_mean"], 2e-3);
        assert_eq!(t.steps()[5].metrics["trmask/k3_mean"], 1e-3);
        let w = t.duplicate_warning("run.jsonl").unwrap();
        assert!(
            w.starts_with("warning: run.jsonl: steps 0, 1, 2, 3 appear"),
            "{w}"
        );
    }

    #[test]
    fn glued_lines_verl_lines_and_partial_lines() {
        let glued = format!("{}{}", line(1, 1e-3), line(2, 1e-3));
        let got = parse_line(&glued, "run: line 1", &|_| true).unwrap();
        assert_eq!(got.len(), 2);
        let verl = r#"{"step": 7, "data": {"rollout_corr/kl": 0.001, "actor/lr": 1e-6, "x": null, "t": "s"}}"#;
        let got = parse_line(verl, "run: line 1", &|k| {
            k.starts_with("rollout_corr/") || k == "x"
        })
        .unwrap();
        assert_eq!(got[0].1, LineFormat::VerlFileLogger);
        assert_eq!(got[0].0.step, 7.0);
        assert_eq!(got[0].0.metrics.len(), 2);
        assert!(got[0].0.metrics["x"].is_nan());
        let e = parse_line(&line(3, 1e-3)[..20], "run: line 9", &|_| true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("run: line 9: a partial line"), "{e}");
        assert!(parse_line("  ", "x", &|_| true).unwrap().is_empty());
        assert!(parse_line("[1]", "x", &|_| true).is_err());
    }

    #[test]
    fn a_jump_after_four_steps_is_found_with_its_window() {
        let steps: Vec<Step> = (0..6)
            .map(|s| Step {
                input: String::new(),
                step: s as f64,
                metrics: [(
                    "trmask/k3_mean".to_string(),
                    if s == 4 {
                        3e-2
                    } else {
                        4.7e-5 * (1.0 + 0.03 * s as f64)
                    },
                )]
                .into(),
            })
            .collect();
        let a = alerts(&steps);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].step, 4.0);
        assert_eq!(a[0].jump.window, 4);
        assert!(
            a[0].line()
                .starts_with("alert: step 4: k3 mean 0.0300 jumped"),
            "{}",
            a[0].line()
        );
    }
}
