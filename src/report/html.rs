//! `trmask report`: one self-contained HTML page (inline SVG and CSS, no script, no network).

use super::subject::{num, output, ranking, worst_order, Subject};
use super::summary::{bound_reading, summary};
use super::svg::{esc, strip, Axis, Frame};
use std::fmt::Write as _;

const BUCKETS: usize = 64;

/// `(bucket start, mean, p90)` per position bucket.
type Buckets = Vec<(f64, f64, f64)>;
const COLORS: [&str; 5] = ["#1f6fb4", "#d1741f", "#2e9e4f", "#8e44ad", "#7f8c8d"];

/// Per-position mean and p90 of a per-token statistic over the valid tokens of every
/// sequence, in at most [`BUCKETS`] position buckets: `(bucket start, mean, p90)`.
fn by_position(s: &Subject, values: &[f64]) -> Buckets {
    let mask = s.batch.mask();
    let tmax = s
        .analysis
        .corrections
        .seq_len
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    if tmax == 0 {
        return Vec::new();
    }
    let width = tmax.div_ceil(BUCKETS).max(1);
    let mut buckets: Vec<Vec<f64>> = vec![Vec::new(); tmax.div_ceil(width)];
    for &(a, b) in s.batch.segments().ranges() {
        for (t, i) in (a..b).filter(|&i| mask[i]).enumerate() {
            if values[i].is_finite() {
                buckets[t / width].push(values[i]);
            }
        }
    }
    buckets
        .into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, mut v)| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            v.sort_by(f64::total_cmp);
            let p90 = v[((v.len() as f64 * 0.9).ceil() as usize).clamp(1, v.len()) - 1];
            ((k * width) as f64, mean, p90)
        })
        .collect()
}

fn position_chart(s: &Subject) -> String {
    let stats: Vec<(&str, &[f64])> = ["k3", "kl", "tv", "topk_kl", "topk_tv"]
        .iter()
        .filter_map(|n| output(s.analysis, n).map(|v| (*n, v)))
        .collect();
    let series: Vec<(&str, Buckets)> = stats.iter().map(|(n, v)| (*n, by_position(s, v))).collect();
    let all = series
        .iter()
        .flat_map(|(_, p)| p.iter().flat_map(|q| [q.1, q.2]));
    let y = Axis::fit(all, true);
    let x = Axis::counts(series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)));
    let mut f = Frame::new(
        x,
        y,
        "token position t (bucket start)",
        "per-token divergence",
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        f.line(
            &pts.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(),
            c,
            false,
        );
        f.line(&pts.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(), c, true);
        f.legend(i, c, name);
    }
    f.finish()
}

fn length_chart(s: &Subject) -> String {
    let c = &s.analysis.corrections;
    let Some(r) = ranking(s) else {
        return String::new();
    };
    let idx: Vec<usize> = (0..c.seq_len.len()).filter(|&i| c.seq_len[i] > 0).collect();
    let log = idx.iter().all(|&i| r.values[i] >= 0.0) && r.bounds.is_none_or(|b| b.1 > 0.0);
    let mut ys: Vec<f64> = idx.iter().map(|&i| r.values[i]).collect();
    if let Some((lo, hi)) = r.bounds {
        ys.push(hi);
        ys.extend(lo);
    }
    let y = Axis::fit(ys.into_iter(), log);
    let x = Axis::counts(idx.iter().map(|&i| c.seq_len[i] as f64));
    let mut f = Frame::new(x, y, "sequence length (valid tokens)", &r.name);
    for &i in &idx {
        let col = if c.seq_accept[i] {
            "#2e9e4f"
        } else {
            "#c0392b"
        };
        f.point(c.seq_len[i] as f64, r.values[i], col);
    }
    if let Some((lo, hi)) = r.bounds {
        f.hline(hi, &format!("threshold {}", num(hi)));
        if let Some(l) = lo {
            f.hline(l, &format!("lower {}", num(l)));
        }
    }
    f.legend(0, "#2e9e4f", "accepted");
    f.legend(1, "#c0392b", "rejected");
    f.finish()
}

fn criterion_histograms(s: &Subject) -> String {
    let c = &s.analysis.corrections;
    let resolved = s.config.resolve().ok();
    let mut html = String::new();
    for crit in &c.criteria {
        let vals: Vec<f64> = (0..crit.seq_stat.len())
            .filter(|&i| c.seq_len[i] > 0 && crit.seq_stat[i].is_finite())
            .map(|i| crit.seq_stat[i])
            .collect();
        if vals.is_empty() {
            continue;
        }
        let thr = resolved
            .as_ref()
            .and_then(|r| r.criteria.iter().find(|k| k.name == crit.name))
            .filter(|k| k.agg != crate::config::Agg::Token)
            .map(|k| {
                if k.stat == crate::config::Stat::K1 {
                    k.upper.ln()
                } else {
                    k.upper
                }
            });
        let x = Axis::fit(vals.iter().copied().chain(thr), false);
        let bins = 30usize;
        let wid = (x.hi - x.lo) / bins as f64;
        let mut counts = vec![0usize; bins];
        for v in &vals {
            counts[(((v - x.lo) / wid) as usize).min(bins - 1)] += 1;
        }
        let y = Axis::counts(counts.iter().map(|&n| n as f64));
        let mut f = Frame::new(x, y, &crit.output_name, "sequences");
        for (k, &n) in counts.iter().enumerate() {
            let lo = x.lo + k as f64 * wid;
            f.bar(lo, lo + wid, n as f64, "#1f6fb4");
        }
        if let Some(t) = thr {
            f.vline(t, &format!("threshold {}", num(t)));
        }
        let _ = write!(
            html,
            "<figure>{}<figcaption>{}</figcaption></figure>",
            f.finish(),
            esc(&crit.name)
        );
    }
    if html.is_empty() {
        html.push_str("<p>No criterion configured: nothing was rejected.</p>");
    }
    html
}

fn rejections_chart(s: &Subject) -> String {
    let c = &s.analysis.corrections;
    if c.criteria.is_empty() {
        return String::new();
    }
    let counts: Vec<usize> = c
        .criteria
        .iter()
        .map(|k| k.seq_reject.iter().filter(|&&r| r).count())
        .collect();
    let n = counts.len() as f64;
    if counts.iter().all(|&k| k == 0) {
        return "<p>No sequence was rejected by any criterion.</p>".into();
    }
    let x = Axis {
        lo: 0.0,
        hi: n,
        log: false,
        categorical: true,
        integer: false,
    };
    let y = Axis::counts(counts.iter().map(|&k| k as f64));
    let names: Vec<&str> = c.criteria.iter().map(|k| k.name.as_str()).collect();
    let mut f = Frame::new(
        x,
        y,
        &format!("criterion: {}", names.join(", ")),
        "sequences rejected",
    );
    for (i, &k) in counts.iter().enumerate() {
        f.bar(i as f64 + 0.15, i as f64 + 0.85, k as f64, "#c0392b");
        f.legend(i, "#c0392b", &format!("{}: {k}", names[i]));
    }
    f.finish()
}

fn worst_table(s: &Subject) -> String {
    let Some(r) = ranking(s) else {
        return String::new();
    };
    let c = &s.analysis.corrections;
    let lr = output(s.analysis, "log_ratio").unwrap_or(&[]);
    let mask = s.batch.mask();
    let mut html = format!(
        "<table><tr><th>seq</th><th>length</th><th>{}</th><th>decision</th>\
         <th>|log &rho;| along the sequence (darker = larger; scale = batch max)</th></tr>",
        esc(&r.name)
    );
    let max = (0..lr.len())
        .filter(|&i| mask[i])
        .map(|i| lr[i].abs())
        .fold(0.0, f64::max);
    for &i in worst_order(s, &r).iter().take(10) {
        let (a, b) = s.batch.segments().ranges()[i];
        let vals: Vec<f64> = (a..b)
            .filter(|&j| mask[j])
            .map(|j| lr.get(j).map_or(0.0, |x| x.abs()))
            .collect();
        let _ = write!(
            html,
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            c.seq_len[i],
            num(r.values[i]),
            if c.seq_accept[i] { "ok" } else { "bad" },
            if c.seq_accept[i] { "accept" } else { "reject" },
            strip(&vals, max, 640.0)
        );
    }
    html.push_str("</table>");
    html
}

fn certificate(s: &Subject) -> String {
    let Some(cert) = &s.analysis.certificate else {
        return "<p>No certificate: the batch has no valid token or an infinite divergence.</p>"
            .into();
    };
    let mut html = String::from(
        "<table><tr><th>set</th><th>T</th><th>&delta;</th><th>&epsilon;</th><th>classical KL</th>\
         <th>PM-KL</th><th>PM-TV</th><th>Mix-KL</th><th>Mix-TV</th><th>coupling</th><th>adaptive</th>\
         <th>B* (the least of the six after classical)</th><th>argmin</th><th>reading</th></tr>",
    );
    for (set, b) in [("all", &cert.all), ("accepted", &cert.accepted)] {
        let Some(b) = b else {
            let _ = write!(
                html,
                "<tr><td>{set}</td><td colspan=\"13\">no {set} sequence</td></tr>"
            );
            continue;
        };
        let _ = write!(
            html,
            "<tr><td>{set}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><b>{}</b></td><td>{}</td><td>{}</td></tr>",
            b.inputs.horizon,
            num(b.inputs.delta),
            num(b.inputs.eps),
            num(b.classical_kl),
            num(b.pm_kl),
            num(b.pm_tv),
            num(b.mix_kl),
            num(b.mix_tv),
            num(b.coupling),
            num(b.adaptive),
            num(b.unified),
            b.argmin,
            bound_reading(b.unified)
        );
    }
    let _ = write!(
        html,
        "</table><p class=\"note\">{}</p>",
        esc(crate::bounds::certificate::CAVEAT)
    );
    html
}

/// The first screen's sentence: the batch's mismatch in numbers, and what the mask did.
fn lead(s: &Subject) -> String {
    let a = s.analysis;
    let m = |k: &str| a.metrics.get(k).copied();
    let mut mis = Vec::new();
    if let Some(k3) = m("trmask/k3_mean") {
        mis.push(format!("a mean k3 of {}", num(k3)));
    }
    if let Some(kl) = m("trmask/kl_mean") {
        mis.push(format!("an exact KL of {} per token", num(kl)));
    }
    if let Some(lr) = output(a, "log_ratio") {
        let mask = s.batch.mask();
        let worst = (0..lr.len())
            .filter(|&i| mask[i])
            .map(|i| lr[i].abs())
            .fold(0.0f64, f64::max);
        mis.push(format!("a largest |log rho| of {}", num(worst)));
    }
    let c = &a.corrections;
    let live: Vec<usize> = (0..c.seq_len.len()).filter(|&i| c.seq_len[i] > 0).collect();
    let rejected = live.iter().filter(|&&i| !c.seq_accept[i]).count();
    let valid = s.batch.mask().iter().filter(|&&v| v).count();
    let kept = (0..c.mask.len())
        .filter(|&i| s.batch.mask()[i] && c.mask[i] != 0.0)
        .count();
    let mask = if c.criteria.is_empty() {
        "no rejection criterion is configured, so the mask keeps every token".to_string()
    } else {
        let names: Vec<&str> = c.criteria.iter().map(|k| k.name.as_str()).collect();
        format!(
            "the mask ({}) rejected {rejected} of {} sequences ({:.1} %) and {} of {valid} tokens",
            names.join(", "),
            live.len(),
            100.0 * rejected as f64 / live.len().max(1) as f64,
            valid - kept
        )
    };
    let bound = m("trmask/bound_accepted_unified")
        .map(|b| format!("; the bound B* over the accepted sequences is {}", num(b)))
        .unwrap_or_default();
    format!(
        "This batch's rollout/trainer mismatch: {}; {mask}{bound}.",
        if mis.is_empty() {
            "not measured".to_string()
        } else {
            mis.join(", ")
        }
    )
}

/// The whole page.
/// The head of every trmask HTML page (one stylesheet for the report, compare and trend
/// pages) up to the opened `<body>`.
pub(super) fn page_start(title: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:sans-serif;margin:24px;max-width:1240px;color:#222}}\
         h1{{font-size:22px}}h2{{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}}\
         pre{{background:#f4f4f4;padding:10px;font-size:12px;overflow-x:auto}}\
         figure{{display:inline-block;vertical-align:top;margin:6px;width:calc(50% - 14px)}}\
         figure svg{{width:100%;height:auto}}body>svg{{width:70%;height:auto}}figcaption{{text-align:center;font-size:13px}}\
         .lead{{font-size:16px;background:#eef4fa;padding:10px 14px;border-left:4px solid #1f6fb4}}\
         table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ccc;padding:3px 6px}}\
         .bad{{color:#c0392b;font-weight:bold}}.ok{{color:#2e9e4f}}.note{{font-size:12px;color:#555}}\
         </style></head><body>",
        esc(title)
    )
}

pub fn render_html(s: &Subject) -> String {
    let mut h = page_start("trmask report");
    let _ = write!(h, "<h1>trmask report: {}</h1>", esc(s.input));
    let _ = write!(h, "<p class=\"lead\">{}</p>", esc(&lead(s)));
    let _ = write!(h, "<h2>Summary</h2><pre>{}</pre>", esc(&summary(s, &[])));
    // the `warning:` lines the command line printed for this config and input
    let mut warned = s.config.warnings();
    warned.extend_from_slice(s.warnings);
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
    let _ = write!(
        h,
        "<h2>Divergence by token position</h2><p class=\"note\">k3 from the sampled-token \
         log-probs{}; per position bucket the mean (solid) and the 90th percentile (dashed); log \
         scale.</p>{}",
        match (
            output(s.analysis, "kl").is_some(),
            output(s.analysis, "topk_kl").is_some()
        ) {
            (true, true) => ", exact KL and TV from the logits, top-K KL and TV from the top-K",
            (true, false) => ", exact KL and TV from the logits",
            (false, true) => ", KL and TV on the rollout top-K support",
            (false, false) => "",
        },
        position_chart(s)
    );
    let _ = write!(
        h,
        "<h2>Sequence length vs sequence statistic</h2>{}",
        length_chart(s)
    );
    let _ = write!(
        h,
        "<h2>Criteria: statistic vs threshold</h2>{}",
        criterion_histograms(s)
    );
    if !s.analysis.sweeps.is_empty() {
        let _ = write!(
            h,
            "<h2>Threshold sweep</h2><p class=\"note\">What each criterion would reject at \
             other thresholds over this batch's range: sequences (solid) and tokens (dashed).\
             </p>{}",
            super::sweep::sweep_charts(&s.analysis.sweeps)
        );
    }
    let rej = rejections_chart(s);
    if !rej.is_empty() {
        let _ = write!(h, "<h2>Rejections by criterion</h2>{rej}");
    }
    h.push_str(&super::breakdown::breakdown_html(&s.analysis.metrics));
    h.push_str(&super::routing::routing_html(s));
    let _ = write!(h, "<h2>Worst sequences</h2>{}", worst_table(s));
    let _ = write!(h, "<h2>Bound certificate</h2>{}", certificate(s));
    h.push_str("</body></html>\n");
    h
}
