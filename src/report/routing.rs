//! The MoE routing part of the summary and of the batch report: how often the trainer's own
//! expert choice differed from the rollout engine's, in which layers, and whether the tokens
//! that flipped carry the log-ratio. Reads the `trmask/routing/*` metrics and the per-token
//! `route_flip` / `log_ratio` outputs; computes nothing but bucket counts.

use super::subject::{num, output, Subject};
use super::svg::{esc, Axis, Frame};
use crate::metrics::routing::PREFIX;
use std::collections::BTreeMap;
use std::fmt::Write;

fn pct(x: f64) -> String {
    format!("{}%", num((x * 1e4).round() / 100.0))
}

/// Per layer, its overlap metric, in layer order (empty without routing metrics; a layer
/// without a recorded pair has none).
fn layers(m: &BTreeMap<String, f64>) -> Vec<(usize, f64)> {
    let pre = format!("{PREFIX}layer/");
    let mut v: Vec<(usize, f64)> = m
        .range(pre.clone()..)
        .take_while(|(k, _)| k.starts_with(&pre))
        .filter_map(|(k, &x)| {
            let l = k[pre.len()..].strip_suffix("/overlap_mean")?.parse().ok()?;
            Some((l, x))
        })
        .collect();
    v.sort_by_key(|p| p.0);
    v
}

/// The summary's routing line, when the batch had both sides' routed experts: mean overlap,
/// flipped-token fraction, the share of k3 the flipped tokens carry, the worst layer.
pub(super) fn routing_line(m: &BTreeMap<String, f64>) -> Option<String> {
    let get = |k: &str| m.get(&format!("{PREFIX}{k}")).copied();
    let flip = get("token_flip_fraction")?;
    let mut parts = vec![
        format!("overlap {}", num(get("overlap_mean")?)),
        format!("{} of recorded tokens flipped", pct(flip)),
    ];
    if let Some(s) = get("k3_share_flipped") {
        parts.push(format!("carrying {} of k3", pct(s)));
    }
    if let Some(&(l, v)) = layers(m).iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        parts.push(format!("worst layer {l} (overlap {})", num(v)));
    }
    if let Some(u) = get("unrecorded_fraction").filter(|&u| u > 0.0) {
        parts.push(format!("{} of (token, layer) pairs unrecorded", pct(u)));
    }
    Some(format!("routing: {}", parts.join(", ")))
}

/// The overlap-by-layer chart: `1 − overlap_mean` per layer (the share of experts that differ).
fn layer_chart(m: &BTreeMap<String, f64>) -> String {
    let ls = layers(m);
    let n = ls.last().map_or(1, |l| l.0 + 1);
    let x = Axis {
        lo: -0.5,
        hi: n as f64 - 0.5,
        log: false,
        categorical: false,
        integer: true,
    };
    // in percent: the axis labels of shares of a few per mille stay readable
    let differ = |o: f64| 100.0 * (1.0 - o);
    let y = Axis::fit(ls.iter().map(|l| 1.1 * differ(l.1)), false);
    let mut f = Frame::new(x, y, "MoE layer", "experts that differ (%)");
    for &(l, v) in &ls {
        f.bar(l as f64 - 0.4, l as f64 + 0.4, differ(v), "#1f6fb4");
    }
    if let Some(o) = m.get(&format!("{PREFIX}overlap_mean")) {
        f.hline(differ(*o), &format!("all layers: overlap {}", num(*o)));
    }
    f.finish()
}

/// Histograms of |log ρ| (log-spaced bins, each group's share of its tokens) for the tokens
/// whose routing flipped and for the rest.
fn abs_log_ratio_chart(s: &Subject) -> Option<String> {
    let (flip, lr) = (
        output(s.analysis, "route_flip")?,
        output(s.analysis, "log_ratio")?,
    );
    let mask = s.batch.mask();
    let (lo, hi, bins) = (-6.0f64, 1.0f64, 28usize);
    let mut counts = [vec![0usize; bins], vec![0usize; bins]];
    for i in (0..mask.len()).filter(|&i| mask[i] && lr[i].is_finite()) {
        let e = lr[i].abs().max(1e-300).log10();
        let b = (((e - lo) / (hi - lo) * bins as f64).floor().max(0.0) as usize).min(bins - 1);
        counts[(flip[i] > 0.0) as usize][b] += 1;
    }
    let totals = counts
        .each_ref()
        .map(|c| c.iter().sum::<usize>().max(1) as f64);
    let share = |g: usize, b: usize| counts[g][b] as f64 / totals[g];
    let y = Axis::fit(
        (0..2)
            .flat_map(|g| (0..bins).map(move |b| (g, b)))
            .map(|(g, b)| 1.1 * share(g, b)),
        false,
    );
    let x = Axis {
        lo: 10f64.powf(lo),
        hi: 10f64.powf(hi),
        log: true,
        categorical: false,
        integer: false,
    };
    let mut f = Frame::new(x, y, "|log rho| (log scale)", "share of the group's tokens");
    let colors = ["#1f6fb4", "#c0392b"];
    for (g, color) in colors.into_iter().enumerate() {
        let pts: Vec<(f64, f64)> = (0..bins)
            .flat_map(|b| {
                let (a, z) = (
                    lo + (hi - lo) * b as f64 / bins as f64,
                    lo + (hi - lo) * (b + 1) as f64 / bins as f64,
                );
                [(10f64.powf(a), share(g, b)), (10f64.powf(z), share(g, b))]
            })
            .collect();
        f.line(&pts, color, g == 0);
    }
    let m = &s.analysis.metrics;
    for (i, (g, name)) in [(1, "flipped"), (0, "unflipped")].into_iter().enumerate() {
        let mean = m
            .get(&format!("{PREFIX}abs_log_ratio_{name}_mean"))
            .map_or(String::new(), |v| format!(", mean {}", num(*v)));
        let label = format!("{name} {}{mean}", counts[g].iter().sum::<usize>());
        f.legend(i, colors[g], &label);
    }
    Some(f.finish())
}

/// The report's MoE routing section (empty without routing metrics).
pub(super) fn routing_html(s: &Subject) -> String {
    let m = &s.analysis.metrics;
    let Some(line) = routing_line(m) else {
        return String::new();
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>MoE routing: rollout vs trainer experts</h2><p class=\"note\">{}. A token flipped \
         when, in some layer recorded on both sides, the trainer's own top-K expert set differs \
         from the one the rollout engine used (order ignored).</p>",
        esc(line.trim_start_matches("routing: "))
    );
    let _ = write!(
        h,
        "<figure>{}<figcaption>Overlap by layer: the share of the top-K experts that differ, \
         100 (1 - mean overlap) over the layer's recorded tokens.</figcaption></figure>",
        layer_chart(m)
    );
    if let Some(c) = abs_log_ratio_chart(s) {
        let _ = write!(
            h,
            "<figure>{c}<figcaption>|log rho| of the tokens whose routing flipped (solid red) \
             and of the others (dashed blue; tokens with no recorded layer count here too; the \
             means are over recorded tokens).</figcaption></figure>"
        );
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_worst_layer() {
        let mut m = BTreeMap::new();
        for (k, v) in [
            ("overlap_mean", 0.998),
            ("token_flip_fraction", 0.0134),
            ("k3_share_flipped", 0.6906),
            ("unrecorded_fraction", 0.0145),
            ("layer/0/overlap_mean", 0.9992),
            ("layer/1/overlap_mean", 0.9976),
            ("layer/2/overlap_mean", 0.998),
        ] {
            m.insert(format!("{PREFIX}{k}"), v);
        }
        let line = routing_line(&m).unwrap();
        assert!(line.contains("1.34% of recorded tokens flipped"), "{line}");
        assert!(line.contains("69.06% of k3"), "{line}");
        assert!(line.contains("worst layer 1 (overlap 0.9976)"), "{line}");
        assert_eq!(layers(&m).len(), 3);
        assert!(routing_line(&BTreeMap::new()).is_none());
    }
}
