//! `trmask report --jsonl RUN.jsonl`: a run's trend page, one chart per quantity against the
//! step (mismatch, rejection rates, kept token fraction, ESS, B*, MoE routing), jumps of the mismatch marked.

use super::subject::num;
use super::svg::{esc, Axis, Frame};
use crate::analysis::trend::{jumps, Step, JUMP_Z, WINDOW};
use std::fmt::Write as _;

const COLORS: [&str; 4] = ["#1f6fb4", "#d1741f", "#2e9e4f", "#8e44ad"];

/// A chart: title, log y axis, `(label, metric or derived key)` per line.
type Chart = (&'static str, bool, &'static [(&'static str, &'static str)]);

/// The charts of the page.
const CHARTS: [Chart; 6] = [
    (
        "Mismatch",
        true,
        &[
            ("k3 mean", "trmask/k3_mean"),
            ("exact KL mean", "trmask/kl_mean"),
            ("TV mean", "trmask/tv_mean"),
        ],
    ),
    (
        "Rejection rates",
        false,
        &[
            ("sequences", "rollout_corr/rollout_rs_seq_masked_fraction"),
            ("tokens", "rollout_corr/rollout_rs_masked_fraction"),
        ],
    ),
    ("Kept token fraction", false, &[("kept tokens", "kept")]),
    (
        "Effective sample size",
        false,
        &[
            ("ESS (tokens)", "trmask/ess_token"),
            ("ESS (sequences)", "trmask/ess_seq"),
        ],
    ),
    (
        "Bound B*",
        true,
        &[
            ("B* all sequences", "trmask/bound_all_unified"),
            ("B* accepted", "trmask/bound_accepted_unified"),
        ],
    ),
    (
        "MoE routing",
        false,
        &[
            ("flipped tokens", "trmask/routing/token_flip_fraction"),
            ("k3 share of flipped", "trmask/routing/k3_share_flipped"),
            ("unrecorded pairs", "trmask/routing/unrecorded_fraction"),
        ],
    ),
];

fn value(s: &Step, key: &str) -> Option<f64> {
    if key == "kept" {
        return s
            .metrics
            .get("rollout_corr/rollout_rs_masked_fraction")
            .map(|f| 1.0 - f);
    }
    s.metrics.get(key).copied()
}

/// The whole page for the run file named `name` as given.
pub fn render_trend_html(steps: &[Step], name: &str) -> String {
    let jumps = jumps(steps, "trmask/k3_mean");
    let mut h = super::html::page_start("trmask run trend");
    let first = steps.first().map_or(0.0, |s| s.step);
    let last = steps.last().map_or(0.0, |s| s.step);
    let _ = write!(
        h,
        "<h1>trmask run trend: {}</h1><p class=\"lead\">{} steps ({} to {}); {}</p>",
        esc(name),
        steps.len(),
        num(first),
        num(last),
        if jumps.is_empty() {
            format!(
                "no step's k3 mean jumps (robust z over the {WINDOW} steps before, |z| > {JUMP_Z})"
            )
        } else {
            format!(
                "the k3 mean jumps at {} step{} (robust z over the {WINDOW} steps before, |z| > \
                 {JUMP_Z}), marked in red",
                jumps.len(),
                if jumps.len() == 1 { "" } else { "s" }
            )
        }
    );
    for (title, log, series) in CHARTS {
        let data: Vec<(&str, Vec<(f64, f64)>)> = series
            .iter()
            .map(|(label, key)| {
                (
                    *label,
                    steps
                        .iter()
                        .filter_map(|s| value(s, key).map(|v| (s.step, v)))
                        .filter(|p| p.1.is_finite() && (!log || p.1 > 0.0))
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, v)| !v.is_empty())
            .collect();
        if data.is_empty() {
            continue;
        }
        let x = Axis::fit(steps.iter().map(|s| s.step), false);
        let y = Axis::fit(data.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)), log);
        let mut f = Frame::new(x, y, "step", title);
        for (k, (label, pts)) in data.iter().enumerate() {
            f.line(pts, COLORS[k % COLORS.len()], k > 0);
            f.legend(k, COLORS[k % COLORS.len()], label);
        }
        if title == "Mismatch" {
            for j in &jumps {
                let s = &steps[j.index];
                if let Some(v) = s.metrics.get("trmask/k3_mean") {
                    f.point(s.step, *v, "#c00");
                }
            }
        }
        let _ = write!(
            h,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            f.finish(),
            esc(title)
        );
    }
    if !jumps.is_empty() {
        h.push_str(
            "<h2>Jumps of the k3 mean</h2><table><tr><th>step</th><th>input</th><th>k3 mean</th>\
             <th>robust z</th></tr>",
        );
        for j in &jumps {
            let s = &steps[j.index];
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:+.1}</td></tr>",
                num(s.step),
                esc(&s.input),
                num(s.metrics.get("trmask/k3_mean").copied().unwrap_or(f64::NAN)),
                j.z
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</body></html>\n");
    h
}
