//! `trmask report`: one self-contained HTML page (inline SVG and CSS, no script, no network).

use super::subject::{file_name, num, output, ranking, Subject};
use super::summary::summary;
use super::svg::{esc, Axis, Frame};
use super::tables::{certificate, worst_sequences, worst_tokens, WORST_TOKENS};
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
        return "<p><b>Rejections by criterion:</b> No sequence was rejected by any criterion.</p>"
            .into();
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
        let col = COLORS[i % COLORS.len()];
        f.bar(i as f64 + 0.15, i as f64 + 0.85, k as f64, col);
        // the count over each bar: a 0 has no bar to see
        f.note(i as f64 + 0.5, k as f64, &k.to_string());
        f.legend(i, col, &format!("{}: {k}", names[i]));
    }
    f.finish()
}

/// The headline: the decision (what was rejected, by which criterion), the mismatch in
/// numbers, and the dominant warning (the data's first, else the config's).
fn headline(s: &Subject) -> String {
    let a = s.analysis;
    let c = &a.corrections;
    let live: Vec<usize> = (0..c.seq_len.len()).filter(|&i| c.seq_len[i] > 0).collect();
    let rejected = live.iter().filter(|&&i| !c.seq_accept[i]).count();
    let valid = s.batch.mask().iter().filter(|&&v| v).count();
    let kept = (0..c.mask.len())
        .filter(|&i| s.batch.mask()[i] && c.mask[i] != 0.0)
        .count();
    let pct = |k: usize, n: usize| format!("{:.1} %", 100.0 * k as f64 / n.max(1) as f64);
    let decision = if c.criteria.is_empty() {
        "No rejection criterion configured: every sequence is kept (measurement only).".to_string()
    } else if rejected == 0 && kept == valid {
        let names: Vec<&str> = c.criteria.iter().map(|k| k.name.as_str()).collect();
        format!(
            "Nothing rejected: all {} sequences and {valid} tokens pass {}.",
            live.len(),
            names.join(", ")
        )
    } else {
        let by: Vec<String> = c
            .criteria
            .iter()
            .map(|k| {
                let n = k.seq_reject.iter().filter(|&&r| r).count();
                format!("{} ({n})", k.name)
            })
            .collect();
        format!(
            "Rejected {} of sequences ({rejected} of {}) and {} of tokens ({} of {valid}) by {}.",
            pct(rejected, live.len()),
            live.len(),
            pct(valid - kept, valid),
            valid - kept,
            by.join(", ")
        )
    };
    let m = |k: &str| a.metrics.get(k).copied();
    let mut mis = Vec::new();
    if let Some(k3) = m("trmask/k3_mean") {
        mis.push(format!("mean k3 {}", num(k3)));
    }
    if let Some(kl) = m("trmask/kl_mean") {
        mis.push(format!("exact KL {} per token", num(kl)));
    }
    if let Some(lr) = output(a, "log_ratio") {
        let mask = s.batch.mask();
        let worst = (0..lr.len())
            .filter(|&i| mask[i])
            .map(|i| lr[i].abs())
            .fold(0.0f64, f64::max);
        mis.push(format!("largest |log rho| {}", num(worst)));
    }
    let mut h = format!("<p class=\"decision\">{}</p>", esc(&decision));
    if !mis.is_empty() {
        let _ = write!(h, "<p>Mismatch: {}.</p>", esc(&mis.join(", ")));
    }
    let config = s.config.warnings();
    if let Some(w) = s.warnings.first().or(config.first()) {
        // its first clause; the whole line is under Warnings
        let w = w.trim_start_matches("warning: ");
        let short = w.split_once("; ").map_or(w, |(a, _)| a);
        let _ = write!(
            h,
            "<p class=\"bad\">Warning: {}{}</p>",
            esc(short),
            if short.len() < w.len() {
                " (more under Warnings)"
            } else {
                ""
            }
        );
    }
    format!("<div class=\"lead\">{h}</div>")
}

/// The head of every trmask HTML page (one stylesheet for the report, compare and trend
/// pages) up to the opened `<body>`.
pub(super) fn page_start(title: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>\
         body{{font-family:sans-serif;margin:16px auto;padding:0 16px;max-width:1240px;\
         color:#222;font-size:15px}}\
         h1{{font-size:22px;overflow-wrap:anywhere}}\
         h2{{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}}\
         pre{{background:#f4f4f4;padding:10px;font-size:13px;white-space:pre-wrap;\
         overflow-wrap:anywhere}}\
         .grid{{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:12px}}\
         figure{{margin:0;min-width:0}}figure svg{{display:block;width:100%;height:auto}}\
         figcaption{{text-align:center;font-size:13px}}\
         .lead{{font-size:16px;background:#eef4fa;padding:4px 14px;border-left:4px solid #1f6fb4}}\
         .decision{{font-size:18px;font-weight:bold}}\
         table{{border-collapse:collapse;font-size:13px;max-width:100%}}table.wide{{width:100%}}\
         td,th{{border:1px solid #ccc;padding:3px 6px;overflow-wrap:anywhere}}\
         td.strip{{width:55%;min-width:160px}}code{{white-space:pre}}\
         summary{{cursor:pointer;font-weight:bold}}\
         .bad{{color:#c0392b;font-weight:bold}}.ok{{color:#2e9e4f}}.note{{font-size:13px;color:#555}}\
         </style></head><body>",
        esc(title)
    )
}

/// The whole page. The input is named by its file name alone.
pub fn render_html(s: &Subject) -> String {
    let name = file_name(s.input);
    let s = &Subject { input: &name, ..*s };
    let mut h = page_start(&format!("trmask report: {name}"));
    let _ = write!(h, "<h1>trmask report: {}</h1>", esc(&name));
    h.push_str(&headline(s));
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
        "<h2>Where the mismatch is</h2><p class=\"note\">Left: k3 from the sampled-token \
         log-probs{} per position bucket, the mean (solid) and the 90th percentile (dashed), log \
         scale. Right: each sequence's length against the statistic the mask ranks by.</p>\
         <div class=\"grid\"><figure>{}<figcaption>Divergence by token position</figcaption>\
         </figure><figure>{}<figcaption>Sequence length vs sequence statistic</figcaption>\
         </figure></div>",
        match (
            output(s.analysis, "kl").is_some(),
            output(s.analysis, "topk_kl").is_some()
        ) {
            (true, true) => ", exact KL and TV from the logits, top-K KL and TV from the top-K,",
            (true, false) => ", exact KL and TV from the logits,",
            (false, true) => ", KL and TV on the rollout top-K support,",
            (false, false) => "",
        },
        position_chart(s),
        length_chart(s)
    );
    let _ = write!(
        h,
        "<h2>Criteria: statistic vs threshold</h2><div class=\"grid\">{}",
        criterion_histograms(s)
    );
    let rej = rejections_chart(s);
    if rej.starts_with("<svg") {
        let _ = write!(
            h,
            "<figure>{rej}<figcaption>Rejections by criterion</figcaption></figure>"
        );
    }
    h.push_str("</div>");
    if !rej.starts_with("<svg") {
        h.push_str(&rej);
    }
    if !s.analysis.sweeps.is_empty() {
        let _ = write!(
            h,
            "<h2>Threshold sweep</h2><p class=\"note\">What each criterion would reject at \
             other thresholds over this batch's range: sequences (wide pale line) and tokens \
             (dashed).</p><div class=\"grid\">{}</div>",
            super::sweep::sweep_charts(&s.analysis.sweeps)
        );
    }
    h.push_str(&super::breakdown::breakdown_html(&s.analysis.metrics));
    h.push_str(&super::routing::routing_html(s));
    let _ = write!(h, "<h2>Worst sequences</h2>{}", worst_sequences(s));
    let tokens = worst_tokens(s);
    if !tokens.is_empty() {
        let _ = write!(
            h,
            "<h2>Worst tokens</h2><p class=\"note\">The {WORST_TOKENS} valid tokens with the \
             largest k3{}.</p>{tokens}",
            if s.decode.is_some() {
                ", decoded with the given tokenizer"
            } else {
                " (give --tokenizer tokenizer.json for their text)"
            }
        );
    }
    let _ = write!(h, "<h2>Bound certificate</h2>{}", certificate(s));
    h.push_str("</body></html>\n");
    h
}
