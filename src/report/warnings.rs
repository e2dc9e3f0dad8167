//! `warning:` lines: things that make the numbers mean less than they seem, without changing
//! any result or the exit code. Each needs enough valid tokens to be more than noise.

use super::subject::num;
use crate::analysis::Analysis;
use crate::config::{Agg, CorrectionConfig, Stat};
use crate::input::batch::Batch;

/// Fewer valid tokens than this and the data-driven warnings stay silent.
pub const MIN_TOKENS: usize = 32;

/// What the warnings look at.
pub struct WarningInputs<'a> {
    pub batch: &'a Batch,
    pub analysis: &'a Analysis,
    pub config: &'a CorrectionConfig,
    /// `--temperature` was given on the command line.
    pub temperature_flag: bool,
}

/// The kind of a [`warnings`] line, a short stable name (`trmask/warn/<kind>` in Python's
/// metrics): `temperature_unused`, `kept_sets_unused`, `positive_log_prob`, `quantised`,
/// `log_ratio_offset`, `threshold_below_noise`; `other` for a line of none of them.
pub fn kind(line: &str) -> &'static str {
    let body = line.strip_prefix("warning: ").unwrap_or(line);
    if body.starts_with("--temperature has no effect") {
        "temperature_unused"
    } else if body.starts_with("rollout_sampling_mask_ids is unused") {
        "kept_sets_unused"
    } else if body.contains("positive value") {
        "positive_log_prob"
    } else if body.starts_with("the log-probs are exactly") {
        "quantised"
    } else if body.starts_with("log_ratio has mean") {
        "log_ratio_offset"
    } else if body.contains("below the quantisation noise floor") {
        "threshold_below_noise"
    } else {
        "other"
    }
}

/// Every warning for one analysed batch, each a full line starting with `warning:`.
pub fn warnings(w: &WarningInputs) -> Vec<String> {
    let mut out = Vec::new();
    let b = w.batch;
    let f = &w.analysis.findings;
    let valid = f.valid as usize;
    if w.temperature_flag && b.rollout_logits().is_none() && b.old_logits().is_none() {
        out.push(
            "warning: --temperature has no effect: the input has no logits, and log-probs are \
             used as given (they must already be at the sampling temperature)"
                .into(),
        );
    }
    if b.kept_sets().is_some()
        && b.rollout_logits().is_none()
        && b.rollout_topk_log_prob().is_none()
    {
        out.push(
            "warning: rollout_sampling_mask_ids is unused: the kept mass needs the rollout's \
             logits (rollout_logits) or its raw top-K log-probs (rollout_topk_log_prob) beside \
             the kept sets"
                .into(),
        );
    }
    if valid < MIN_TOKENS {
        return out;
    }
    for (name, n, top, slot) in &f.positive {
        out.push(format!(
            "warning: {name} has {n} positive value{} at valid positions (largest {} at {}): \
             log-probabilities are <= 0; are these logits, probabilities or scores?",
            if *n == 1 { "" } else { "s" },
            num(*top),
            b.position(*slot)
        ));
    }
    // quantisation noise floor of k3: each rounded log-prob carries an error of variance
    // ulp²/12, so lr has variance (ulp_r² + ulp_o²)/12 and E[k3] ≈ E[lr²]/2 ≥ that / 2.
    let mut floor = None;
    if let Some((nr, nt, m, fl)) = f.quantised {
        let k3 = w
            .analysis
            .metrics
            .get("trmask/k3_mean")
            .copied()
            .unwrap_or(0.0);
        let fmt = if nr == nt {
            nr.to_string()
        } else {
            format!("{nr}/{nt}")
        };
        let ratio = k3 / fl;
        out.push(format!(
            "warning: the log-probs are exactly {fmt}-representable: rounding (~2^-{} \
             relative) puts a noise floor of about {} under k3 (ulp^2/12 per log-prob); \
             measured k3 mean is {} ({}x the floor){}",
            m + 1,
            num(fl),
            num(k3),
            num((ratio * 10.0).round() / 10.0),
            if ratio < 3.0 {
                ": the measured mismatch is within rounding noise"
            } else {
                ""
            }
        ));
        floor = Some(fl);
    }
    if let Some((mean, sd)) = f.log_ratio {
        let replayed = w.analysis.metrics.contains_key("trmask/log_kept_mass_mean");
        if mean.abs() > 1e-3 && mean.abs() > 3.0 * sd && mean < 0.0 && !replayed {
            // the trainer − processed-rollout offset of a top-p sampler is log S ≥ log top_p
            out.push(format!(
                "warning: log_ratio has mean {} but spread only {}: a constant offset, not \
                 token-level mismatch; it looks like top-p sampling with top_p ≈ {} (rollout \
                 log-probs of the renormalised distribution): set \"top_p\" (or top_k / min_p) \
                 and \"sampling_replay\": true with the raw rollout top-K \
                 (rollout_topk_log_prob) or the engine's kept sets (rollout_sampling_mask_ids / \
                 _offsets), or pass the engine's raw log-probs",
                num(mean),
                num(sd),
                num((mean.exp() * 1000.0).round() / 1000.0)
            ));
        } else if mean.abs() > 1e-3 && mean.abs() > 3.0 * sd {
            out.push(format!(
                "warning: log_ratio has mean {} but spread only {}: a constant offset, not \
                 token-level mismatch (top-p / top-k sampling, whose rollout log-probs are of \
                 the renormalised distribution? different temperatures? log-probs of different \
                 tokens? a missing normalisation?)",
                num(mean),
                num(sd)
            ));
        }
    }
    if let (Some(f), Ok(r)) = (floor, w.config.resolve()) {
        for c in &r.criteria {
            let per_token = matches!(c.agg, Agg::Token | Agg::SeqMean | Agg::SeqMax);
            let scale = match c.stat {
                Stat::K2 | Stat::K3 | Stat::Kl => Some(f),
                Stat::Abs | Stat::Ser => Some((2.0 * f).sqrt()),
                _ => None,
            };
            if let (true, Some(s)) = (per_token, scale) {
                if c.upper < s {
                    out.push(format!(
                        "warning: {} threshold {} is below the quantisation noise floor {} of \
                         the log-probs: it rejects rounding noise",
                        c.name,
                        num(c.upper),
                        num(s)
                    ));
                }
            }
        }
    }
    out
}

/// A warning with its numbers blanked: the same kind of warning on two inputs.
fn shape(w: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for ch in w.chars() {
        if ch.is_ascii_digit() || matches!(ch, '.' | 'e' | '-' | '+') {
            run.push(ch);
        } else {
            flush(&mut run, &mut out);
            out.push(ch);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// The `warning:` lines of several inputs `(name, lines)`, one line per kind of warning (its
/// numbers may differ between inputs): `warning: <the first input's text> (in 12 of 12
/// inputs: step-00, step-01 … step-11)`, in the order first seen. Inputs are named by their
/// file stem unless two share one.
pub fn aggregate_warnings(per_input: &[(String, Vec<String>)]) -> Vec<String> {
    let stem = |p: &str| {
        std::path::Path::new(p)
            .file_stem()
            .map_or_else(|| p.to_string(), |s| s.to_string_lossy().into_owned())
    };
    let stems: Vec<String> = per_input.iter().map(|(p, _)| stem(p)).collect();
    let unique = {
        let mut s = stems.clone();
        s.sort();
        s.dedup();
        s.len() == stems.len()
    };
    let mut groups: Vec<(String, String, Vec<usize>)> = Vec::new();
    for (k, (_, lines)) in per_input.iter().enumerate() {
        for w in lines {
            let key = shape(w);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) if g.2.last() != Some(&k) => g.2.push(k),
                Some(_) => {}
                None => groups.push((key, w.clone(), vec![k])),
            }
        }
    }
    let n = per_input.len();
    groups
        .into_iter()
        .map(|(_, text, who)| {
            let name = |k: usize| {
                if unique {
                    stems[k].clone()
                } else {
                    per_input[k].0.clone()
                }
            };
            let names = if who.len() <= 4 {
                who.iter().map(|&k| name(k)).collect::<Vec<_>>().join(", ")
            } else {
                format!(
                    "{}, {} … {}",
                    name(who[0]),
                    name(who[1]),
                    name(who[who.len() - 1])
                )
            };
            let body = text.strip_prefix("warning: ").unwrap_or(&text);
            format!("warning: {body} (in {} of {n} inputs: {names})", who.len())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{aggregate_warnings, kind};

    #[test]
    fn one_line_per_kind_across_inputs() {
        let w = |x: &str| {
            vec![format!(
                "warning: log_ratio has mean {x} but spread only 0.004"
            )]
        };
        let inputs: Vec<(String, Vec<String>)> = (0..12)
            .map(|k| {
                (
                    format!("run/step-{k:02}.safetensors"),
                    w(&format!("-0.05{k}")),
                )
            })
            .chain([(
                "run/other.json".to_string(),
                vec!["warning: something else".into()],
            )])
            .collect();
        let out = aggregate_warnings(&inputs);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            out[0],
            "warning: log_ratio has mean -0.050 but spread only 0.004 (in 12 of 13 inputs: \
             step-00, step-01 … step-11)"
        );
        assert_eq!(out[1], "warning: something else (in 1 of 13 inputs: other)");
    }

    #[test]
    fn every_line_has_its_kind() {
        for (line, k) in [
            (
                "warning: --temperature has no effect: x",
                "temperature_unused",
            ),
            (
                "warning: rollout_sampling_mask_ids is unused: x",
                "kept_sets_unused",
            ),
            (
                "warning: old_log_prob has 3 positive values at valid positions",
                "positive_log_prob",
            ),
            (
                "warning: the log-probs are exactly bf16-representable",
                "quantised",
            ),
            (
                "warning: log_ratio has mean -0.1 but spread only 0.01",
                "log_ratio_offset",
            ),
            (
                "warning: seq_mean_k3 threshold 1e-9 is below the quantisation noise floor 1e-6",
                "threshold_below_noise",
            ),
            ("warning: something new", "other"),
        ] {
            assert_eq!(kind(line), k, "{line}");
        }
    }
}
