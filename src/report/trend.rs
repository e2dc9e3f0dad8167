//! A run's trend page (`trmask report --jsonl`, `trmask watch`): one chart per quantity
//! against the step — the mismatch (k3 and exact KL means), the largest |log ρ|, the IS
//! weights' maximum and truncated fraction, the rejected sequence and token fractions overall
//! and per criterion, the kept fractions and ESS on a 0–1 axis, `B*`, MoE routing — with the jumps of
//! [`JUMP_METRICS`] marked and listed.
//!
//! Steps come sorted by step ([`crate::analysis::trend::Trend`]). A value that is not finite,
//! or beyond [`HUGE`] in magnitude, has no place on a readable axis: it is drawn clipped at the
//! frame's edge with a mark (its value in the tooltip) and listed under the charts.

use super::subject::{file_name, num};
use super::svg::{esc, Axis, Frame};
use crate::analysis::trend::{
    alerts, Alert, Step, JUMP_METRICS, JUMP_Z, MIN_SPREAD, MIN_WINDOW, WINDOW,
};
use std::collections::BTreeSet;
use std::fmt::Write as _;

const COLORS: [&str; 6] = [
    "#1f6fb4", "#d1741f", "#2e9e4f", "#8e44ad", "#7f7f7f", "#17becf",
];

/// Values beyond this magnitude are drawn clipped (a metric of 1e30 is a broken step, not a
/// scale to draw the others on).
pub const HUGE: f64 = 1e30;
/// Points of one series drawn as they are; a longer series is thinned to each pixel column's
/// lowest and highest value (spikes stay visible, the page stays small).
const MAX_POINTS: usize = 1200;
/// Clip marks drawn per chart (the rest are counted in the list under the charts).
const MAX_MARKS: usize = 100;

/// How a chart's y axis is scaled.
#[derive(Clone, Copy, PartialEq)]
enum Scale {
    Log,
    /// Linear from 0 to the data.
    Linear,
    /// A fraction: 0 to 1 whatever the data.
    Unit,
}

/// A line: its label, the keys that hold it (the first present in a step), and whether the
/// value drawn is `1 − value` (a kept fraction from a rejected one).
struct Series {
    label: String,
    keys: Vec<String>,
    complement: bool,
}

fn series(label: &str, keys: &[&str]) -> Series {
    Series {
        label: label.into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        complement: false,
    }
}

struct Chart {
    title: &'static str,
    scale: Scale,
    series: Vec<Series>,
    /// What the chart draws, in words (the keys).
    note: String,
}

const K3: &[&str] = &["trmask/k3_mean", "rollout_corr/k3_kl"];
const SEQ_REJ: &str = "rollout_corr/rollout_rs_seq_masked_fraction";
const TOK_REJ: &str = "rollout_corr/rollout_rs_masked_fraction";
const RS_PREFIX: &str = "rollout_corr/rollout_rs_";

/// The keys of a metrics line the trend page draws (the rest of a line is not kept in
/// memory): fixed keys, and the per-criterion rejected fractions
/// `rollout_corr/rollout_rs_<criterion>_{seq_,}masked_fraction`.
pub fn trend_key(k: &str) -> bool {
    const FIXED: &[&str] = &[
        "trmask/k3_mean",
        "rollout_corr/k3_kl",
        "trmask/kl_mean",
        "trmask/tv_mean",
        "trmask/abs_max",
        "rollout_corr/rollout_is_max",
        "trmask/rho_max",
        "rollout_corr/rollout_is_ratio_fraction_high",
        "rollout_corr/rollout_is_ratio_fraction_low",
        "trmask/reject_rate",
        "trmask/token_reject_rate",
        "trmask/ess_token",
        "trmask/ess_seq",
        "trmask/bound_all_unified",
        "trmask/bound_accepted_unified",
    ];
    FIXED.contains(&k) || criterion_of(k).is_some() || k == SEQ_REJ || k == TOK_REJ
}

/// `(criterion, sequence fraction?)` of a per-criterion rejected fraction key.
fn criterion_of(k: &str) -> Option<(&str, bool)> {
    let rest = k
        .strip_prefix(RS_PREFIX)?
        .strip_suffix("_masked_fraction")?;
    match rest.strip_suffix("_seq") {
        Some(c) if !c.is_empty() => Some((c, true)),
        Some(_) => None,
        None if rest != "seq" && !rest.is_empty() => Some((rest, false)),
        None => None,
    }
}

fn charts(steps: &[Step]) -> Vec<Chart> {
    let mut crit: BTreeSet<&str> = BTreeSet::new();
    for s in steps {
        for k in s.metrics.keys() {
            if let Some((c, _)) = criterion_of(k) {
                crit.insert(c);
            }
        }
    }
    let per = |seq: bool| -> Vec<Series> {
        let mut v = vec![series(
            "all criteria",
            &[if seq { SEQ_REJ } else { TOK_REJ }],
        )];
        for c in &crit {
            let key = format!(
                "{RS_PREFIX}{c}{}_masked_fraction",
                if seq { "_seq" } else { "" }
            );
            v.push(Series {
                label: c.to_string(),
                keys: vec![key],
                complement: false,
            });
        }
        v
    };
    let mut kept_tok = series("tokens", &["trmask/token_reject_rate", TOK_REJ]);
    kept_tok.complement = true;
    let mut kept_seq = series("sequences", &["trmask/reject_rate", SEQ_REJ]);
    kept_seq.complement = true;
    vec![
        Chart {
            title: "Mismatch",
            scale: Scale::Log,
            series: vec![
                series("k3 mean", K3),
                series("exact KL mean", &["trmask/kl_mean"]),
                series("TV mean", &["trmask/tv_mean"]),
            ],
            note: "trmask/k3_mean (verl: rollout_corr/k3_kl), trmask/kl_mean and trmask/tv_mean \
                   where logits were given"
                .into(),
        },
        Chart {
            title: "Largest |log rho|",
            scale: Scale::Log,
            series: vec![series("max |log rho|", &["trmask/abs_max"])],
            note: "trmask/abs_max: the largest |log π_train − log π_roll| of the step".into(),
        },
        Chart {
            title: "IS weight max",
            scale: Scale::Log,
            series: vec![
                series("IS weight max", &["rollout_corr/rollout_is_max"]),
                series("rho max", &["trmask/rho_max"]),
            ],
            note: "rollout_corr/rollout_is_max (verl's metric of the IS weights); \
                   trmask/rho_max, the largest ratio π_train/π_roll of the step"
                .into(),
        },
        Chart {
            title: "Truncated IS weights",
            scale: Scale::Linear,
            series: vec![
                series(
                    "above the upper threshold",
                    &["rollout_corr/rollout_is_ratio_fraction_high"],
                ),
                series(
                    "below the lower",
                    &["rollout_corr/rollout_is_ratio_fraction_low"],
                ),
            ],
            note: "rollout_corr/rollout_is_ratio_fraction_high (the truncated fraction) and \
                   _low"
                .into(),
        },
        Chart {
            title: "Rejected sequences",
            scale: Scale::Linear,
            series: per(true),
            note: "rollout_corr/rollout_rs_seq_masked_fraction, per criterion \
                   rollout_rs_<criterion>_seq_masked_fraction"
                .into(),
        },
        Chart {
            title: "Rejected tokens",
            scale: Scale::Linear,
            series: per(false),
            note: "rollout_corr/rollout_rs_masked_fraction, per criterion \
                   rollout_rs_<criterion>_masked_fraction"
                .into(),
        },
        Chart {
            title: "Kept fraction",
            scale: Scale::Unit,
            series: vec![kept_tok, kept_seq],
            note: "1 − trmask/token_reject_rate (else 1 − rollout_rs_masked_fraction), 1 − \
                   trmask/reject_rate (else 1 − rollout_rs_seq_masked_fraction)"
                .into(),
        },
        Chart {
            title: "Effective sample size",
            scale: Scale::Unit,
            series: vec![
                series("ESS (tokens)", &["trmask/ess_token"]),
                series("ESS (sequences)", &["trmask/ess_seq"]),
            ],
            note: "trmask/ess_token, trmask/ess_seq: normalised ESS of the final weights".into(),
        },
        Chart {
            title: "Bound B*",
            scale: Scale::Log,
            series: vec![
                series("B* all sequences", &["trmask/bound_all_unified"]),
                series("B* accepted", &["trmask/bound_accepted_unified"]),
            ],
            note: "trmask/bound_all_unified, trmask/bound_accepted_unified".into(),
        },
        Chart {
            title: "MoE routing",
            scale: Scale::Unit,
            series: vec![
                series("flipped tokens", &["trmask/routing/token_flip_fraction"]),
                series("k3 share of flipped", &["trmask/routing/k3_share_flipped"]),
                series("unrecorded pairs", &["trmask/routing/unrecorded_fraction"]),
            ],
            note: "trmask/routing/token_flip_fraction, trmask/routing/k3_share_flipped, \
                   trmask/routing/unrecorded_fraction (with both sides' routed experts)"
                .into(),
        },
    ]
}

fn value(s: &Step, se: &Series) -> Option<f64> {
    let v = se.keys.iter().find_map(|k| s.metrics.get(k).copied())?;
    Some(if se.complement { 1.0 - v } else { v })
}

/// Whether a value is drawn clipped on a chart of this scale.
fn clipped(v: f64, scale: Scale) -> bool {
    !v.is_finite() || v.abs() > HUGE || (scale == Scale::Unit && !(0.0..=1.0).contains(&v))
}

/// `pts` thinned to at most about [`MAX_POINTS`]: per run of points, the lowest and the
/// highest in step order.
fn thin(pts: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if pts.len() <= MAX_POINTS {
        return pts;
    }
    let per = pts.len().div_ceil(MAX_POINTS / 2);
    let mut out = Vec::with_capacity(MAX_POINTS + 2);
    for c in pts.chunks(per) {
        let lo = c.iter().min_by(|a, b| a.1.total_cmp(&b.1)).copied();
        let hi = c.iter().max_by(|a, b| a.1.total_cmp(&b.1)).copied();
        if let (Some(lo), Some(hi)) = (lo, hi) {
            if lo.0 <= hi.0 {
                out.extend([lo, hi]);
            } else {
                out.extend([hi, lo]);
            }
        }
    }
    out.dedup_by(|a, b| a == b);
    out
}

/// A value drawn clipped, for the list under the charts.
struct Clip {
    step: f64,
    chart: &'static str,
    label: String,
    value: f64,
}

/// What a trend page shows besides its steps.
#[derive(Default)]
pub struct TrendPage<'a> {
    /// The run (file or directory) as named on the command line.
    pub name: &'a str,
    /// `warning:` lines to show (duplicated steps, unreadable steps, …).
    pub warnings: &'a [String],
    /// Reload the page in the browser every so many seconds (a page being watched).
    pub refresh: Option<u32>,
    /// A status line under the title (what is watched, when it was last looked at).
    pub status: Option<&'a str>,
}

/// The whole page for the run file named `name` as given (shown by its file name).
pub fn render_trend_html(steps: &[Step], name: &str) -> String {
    render_trend_page(
        steps,
        &TrendPage {
            name,
            ..TrendPage::default()
        },
    )
}

/// The whole page, with its warnings, status line and reload interval.
pub fn render_trend_page(steps: &[Step], page: &TrendPage) -> String {
    let alerts = alerts(steps);
    let mut h = super::html::page_start("trmask run trend");
    if let Some(s) = page.refresh {
        h = h.replacen(
            "<head>",
            &format!("<head><meta http-equiv=\"refresh\" content=\"{s}\">"),
            1,
        );
    }
    let (lo, hi) = steps
        .iter()
        .map(|s| s.step)
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    let range = if steps.is_empty() {
        "no step yet".to_string()
    } else {
        format!(
            "{} step{} ({} to {})",
            steps.len(),
            if steps.len() == 1 { "" } else { "s" },
            num(lo),
            num(hi)
        )
    };
    let watched: Vec<&str> = JUMP_METRICS.iter().map(|m| m.0).collect();
    let jump_steps: BTreeSet<usize> = alerts.iter().map(|a| a.jump.index).collect();
    let _ = write!(
        h,
        "<h1>trmask run trend: {}</h1><p class=\"lead\">{range}; {}</p>",
        esc(&file_name(page.name)),
        if alerts.is_empty() {
            format!(
                "no jump of the {} (robust z over the {WINDOW} steps before, |z| &gt; {JUMP_Z})",
                esc(&watched.join(", "))
            )
        } else {
            format!(
                "jumps at {} step{} (robust z over the {WINDOW} steps before, |z| &gt; \
                 {JUMP_Z}), marked in red",
                jump_steps.len(),
                if jump_steps.len() == 1 { "" } else { "s" }
            )
        }
    );
    if let Some(s) = page.status {
        let _ = write!(h, "<p class=\"note\">{}</p>", esc(s));
    }
    let mut clips: Vec<Clip> = Vec::new();
    let mut figures = String::new();
    for chart in charts(steps) {
        figures.push_str(&figure(steps, &chart, &alerts, &mut clips));
    }
    let mut warned: Vec<String> = page.warnings.to_vec();
    if !clips.is_empty() {
        warned.push(format!(
            "warning: {} value{} not finite or beyond {HUGE:e} in magnitude (or, on a 0–1 axis, \
             outside [0, 1]): drawn clipped at the chart's edge and listed below the charts",
            clips.len(),
            if clips.len() == 1 { " is" } else { "s are" }
        ));
    }
    if !warned.is_empty() {
        h.push_str("<h2>Warnings</h2><ul>");
        for w in &warned {
            let _ = write!(
                h,
                "<li class=\"bad\">{}</li>",
                esc(w.trim_start_matches("warning: "))
            );
        }
        h.push_str("</ul>");
    }
    if !steps.is_empty() {
        let _ = write!(h, "<div class=\"grid\">{figures}</div>");
    }
    if !alerts.is_empty() {
        h.push_str(
            "<h2>Jumps</h2><table><tr><th>step</th><th>metric</th><th>input</th><th>value</th>\
             <th>median of the window</th><th>steps in the window</th><th>robust z</th></tr>",
        );
        for a in &alerts {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{:+.1}</td></tr>",
                num(a.step),
                esc(a.metric),
                esc(&file_name(&steps[a.jump.index].input)),
                num(a.jump.value),
                num(a.jump.median),
                a.jump.window,
                a.jump.z
            );
        }
        h.push_str("</table>");
    }
    if !clips.is_empty() {
        h.push_str(
            "<h2>Values drawn clipped</h2><table><tr><th>step</th><th>chart</th><th>series</th>\
             <th>value</th></tr>",
        );
        for c in clips.iter().take(200) {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                num(c.step),
                esc(c.chart),
                esc(&c.label),
                num(c.value)
            );
        }
        h.push_str("</table>");
        if clips.len() > 200 {
            let _ = write!(h, "<p class=\"note\">… and {} more</p>", clips.len() - 200);
        }
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">Jumps: robust z-score of log10 of each of the {} against the median \
         and MAD (×1.4826, at least {MIN_SPREAD} decades) of the (at most) {WINDOW} steps \
         before, from the step with {MIN_WINDOW} steps before it on; |z| &gt; {JUMP_Z}.</p>\
         </body></html>",
        esc(&watched.join(", "))
    );
    h
}

/// One chart's `<figure>`, or nothing when no step holds any of its series.
fn figure(steps: &[Step], chart: &Chart, alerts: &[Alert], clips: &mut Vec<Clip>) -> String {
    let data: Vec<(&Series, Vec<(f64, f64)>)> = chart
        .series
        .iter()
        .map(|se| {
            let pts = steps
                .iter()
                .filter_map(|s| value(s, se).map(|v| (s.step, v)))
                .collect::<Vec<_>>();
            (se, pts)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    if data.is_empty() {
        return String::new();
    }
    // the steps' own range (a resumed run at step 5000 is not drawn from 0)
    let (lo, hi) = steps
        .iter()
        .map(|s| s.step)
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    let x = if lo < hi {
        Axis {
            lo,
            hi,
            integer: lo.fract() == 0.0 && hi.fract() == 0.0,
            ..Axis::fit([lo, hi].into_iter(), false)
        }
    } else {
        Axis::fit(steps.iter().map(|s| s.step), false)
    };
    let y = match chart.scale {
        Scale::Unit => Axis::fit([0.0, 1.0].into_iter(), false),
        s => Axis::fit(
            data.iter()
                .flat_map(|(_, v)| v.iter().map(|p| p.1))
                .filter(|&v| !clipped(v, s)),
            s == Scale::Log,
        ),
    };
    let mut f = Frame::new(x, y, "step", chart.title);
    let mut marks = 0;
    for (k, (se, pts)) in data.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        // the line: clipped values at the edge they are clipped to, broken at NaN
        let mut segment: Vec<(f64, f64)> = Vec::new();
        let mut segments = Vec::new();
        for &(sx, v) in pts {
            if v.is_nan() {
                segments.push(std::mem::take(&mut segment));
                continue;
            }
            let drawn = if clipped(v, chart.scale) || y.clips(v) {
                if v > y.hi {
                    y.hi
                } else {
                    y.lo
                }
            } else if chart.scale == Scale::Log && v <= 0.0 {
                y.lo
            } else {
                v
            };
            segment.push((sx, drawn));
        }
        segments.push(segment);
        for s in segments.into_iter().filter(|s| !s.is_empty()) {
            let s = thin(s);
            if s.len() == 1 {
                f.point(s[0].0, s[0].1, color);
            }
            f.line(&s, color, k > 0);
        }
        for &(sx, v) in pts {
            if clipped(v, chart.scale) || y.clips(v) {
                clips.push(Clip {
                    step: sx,
                    chart: chart.title,
                    label: se.label.clone(),
                    value: v,
                });
                if marks < MAX_MARKS {
                    marks += 1;
                    f.clip_mark(
                        sx,
                        v,
                        "#c00",
                        &format!("step {}: {} = {}", num(sx), se.label, num(v)),
                    );
                }
            } else if chart.scale == Scale::Log && v <= 0.0 {
                f.point(sx, v, color);
            }
        }
        f.legend(k, color, &se.label);
    }
    // the jumps of the metrics this chart draws, in red
    for a in alerts {
        if let Some((se, _)) = data
            .iter()
            .find(|(se, _)| se.keys.iter().any(|k| k == a.key))
        {
            let s = &steps[a.jump.index];
            if let Some(v) = value(s, se) {
                if !clipped(v, chart.scale) {
                    f.point(s.step, v, "#c00");
                }
            }
        }
    }
    format!(
        "<figure>{}<figcaption>{}</figcaption><p class=\"note\">{}</p></figure>",
        f.finish(),
        esc(chart.title),
        esc(&chart.note)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_keys() {
        assert_eq!(
            criterion_of("rollout_corr/rollout_rs_seq_mean_k3_seq_masked_fraction"),
            Some(("seq_mean_k3", true))
        );
        assert_eq!(
            criterion_of("rollout_corr/rollout_rs_seq_mean_k3_masked_fraction"),
            Some(("seq_mean_k3", false))
        );
        assert_eq!(criterion_of(SEQ_REJ), None);
        assert_eq!(criterion_of(TOK_REJ), None);
        assert!(trend_key(SEQ_REJ) && trend_key("trmask/k3_mean") && !trend_key("actor/lr"));
    }

    #[test]
    fn huge_infinite_and_nan_values_are_drawn_clipped_and_listed() {
        let steps: Vec<Step> = [1e-3, 1.1e308, f64::INFINITY, f64::NAN, 2e-3, -1.0]
            .iter()
            .enumerate()
            .map(|(i, &v)| Step {
                input: format!("s{i}"),
                step: i as f64,
                metrics: [
                    ("trmask/k3_mean".to_string(), v),
                    ("trmask/ess_token".to_string(), v),
                    (TOK_REJ.to_string(), v),
                ]
                .into(),
            })
            .collect();
        let html = render_trend_html(&steps, "run.jsonl");
        assert!(html.contains("Values drawn clipped"), "no list");
        assert!(html.contains("class=\"clipped\""), "no mark");
        assert!(html.contains("1.100e308"), "the value is not named");
        assert!(html.contains("6 steps (0 to 5)"));
        assert!(html.len() < 200_000);
    }

    #[test]
    fn ten_thousand_steps_are_thinned() {
        let steps: Vec<Step> = (0..10_000)
            .map(|i| Step {
                input: String::new(),
                step: i as f64,
                metrics: [("trmask/k3_mean".to_string(), 1e-3 * (1.0 + (i % 7) as f64))].into(),
            })
            .collect();
        let html = render_trend_html(&steps, "run.jsonl");
        assert!(html.len() < 100_000, "{}", html.len());
    }
}
