//! The breakdown metrics (`trmask/adv_*`, `trmask/by_prob/*`, `trmask/by_entropy/*`,
//! `trmask/turn/*`) as summary lines and small HTML tables, each shown only when it says
//! something: the advantage split when advantages were given and something was rejected, a
//! bucketing when at least two buckets hold tokens, the turns when a sequence has more than one.

use super::subject::num;
use super::svg::esc;
use crate::metrics::breakdown::{turn_label, ENTROPY_BUCKETS, PROB_BUCKETS, TURNS};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One group of one breakdown.
struct Row {
    label: String,
    share: f64,
    k3: f64,
    lr: f64,
    rejected: Option<f64>,
    seq_rejected: Option<f64>,
}

/// One breakdown worth showing: its title, its column head, and its non-empty groups.
struct Family {
    title: &'static str,
    head: &'static str,
    rows: Vec<Row>,
}

/// The non-empty groups among `(key prefix, label)`.
fn rows(m: &BTreeMap<String, f64>, groups: &[(String, String)]) -> Vec<Row> {
    groups
        .iter()
        .filter_map(|(prefix, label)| {
            let g = |k: &str| m.get(&format!("{prefix}/{k}")).copied();
            let share = g("token_fraction").filter(|&s| s > 0.0)?;
            Some(Row {
                label: label.clone(),
                share,
                k3: g("k3_mean")?,
                lr: g("log_ratio_mean")?,
                rejected: g("rejected_fraction"),
                seq_rejected: g("seq_rejected_fraction"),
            })
        })
        .collect()
}

fn families(m: &BTreeMap<String, f64>) -> Vec<Family> {
    let mut out = Vec::new();
    let under = |prefix: &str, v: &[(f64, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(_, l)| (format!("{prefix}/{l}"), l.to_string()))
            .collect()
    };
    let adv: Vec<(String, String)> = [("pos", "A > 0"), ("neg", "A < 0"), ("zero", "A = 0")]
        .iter()
        .map(|(k, l)| (format!("trmask/adv_{k}"), l.to_string()))
        .collect();
    let adv_rows = rows(m, &adv);
    let rejected_any = adv_rows
        .iter()
        .any(|r| r.rejected.unwrap_or(0.0) > 0.0 || r.seq_rejected.unwrap_or(0.0) > 0.0);
    if rejected_any {
        out.push(Family {
            title: "Rejections by advantage sign",
            head: "advantage",
            rows: adv_rows,
        });
    }
    for (title, head, groups) in [
        (
            "Mismatch by the sampled token's rollout probability",
            "p(y)",
            under("trmask/by_prob", &PROB_BUCKETS),
        ),
        (
            "Mismatch by the trainer's entropy",
            "trainer entropy (nats)",
            under("trmask/by_entropy", &ENTROPY_BUCKETS),
        ),
    ] {
        let r = rows(m, &groups);
        if r.len() >= 2 {
            out.push(Family {
                title,
                head,
                rows: r,
            });
        }
    }
    if m.get("trmask/turns_max").is_some_and(|&t| t > 1.0) {
        let groups: Vec<(String, String)> = (0..=TURNS)
            .map(|k| (format!("trmask/turn/{}", turn_label(k)), turn_label(k)))
            .collect();
        out.push(Family {
            title: "Mismatch and rejections by turn",
            head: "turn",
            rows: rows(m, &groups),
        });
    }
    out
}

fn pct(x: f64) -> String {
    format!("{}%", num((1000.0 * x).round() / 10.0))
}

/// The summary's breakdown lines (none when nothing says anything).
pub fn breakdown_lines(m: &BTreeMap<String, f64>) -> Vec<String> {
    families(m)
        .into_iter()
        .map(|f| {
            let parts: Vec<String> = f
                .rows
                .iter()
                .map(|r| {
                    let mut s = format!("{} {} ({} of tokens", r.label, num(r.k3), pct(r.share));
                    if let Some(x) = r.rejected {
                        let _ = write!(s, ", {} rejected", pct(x));
                    }
                    if let Some(x) = r.seq_rejected {
                        let _ = write!(s, ", {} of sequences", pct(x));
                    }
                    s.push(')');
                    s
                })
                .collect();
            let lead = match f.head {
                "turn" => format!(
                    "turns: mean {}, max {} per sequence; k3 mean by turn:",
                    num((m["trmask/turns_mean"] * 100.0).round() / 100.0),
                    num(m["trmask/turns_max"])
                ),
                "advantage" => "rejections by advantage sign (k3 mean):".into(),
                head => format!("k3 mean by {head}:"),
            };
            format!("{lead} {}", parts.join("; "))
        })
        .collect()
}

/// The HTML report's breakdown tables (one per breakdown worth showing), with a bar of each
/// group's mean k3 against the largest.
pub fn breakdown_html(m: &BTreeMap<String, f64>) -> String {
    let mut h = String::new();
    for f in families(m) {
        let rej = f.rows.iter().any(|r| r.rejected.is_some());
        let seq = f.rows.iter().any(|r| r.seq_rejected.is_some());
        let top = f.rows.iter().map(|r| r.k3).fold(0.0, f64::max);
        let _ = write!(
            h,
            "<h2>{}</h2><table><tr><th>{}</th><th>tokens</th><th>mean k3</th>\
             <th>mean log &rho;</th>{}{}<th>mean k3 (bar: largest = full)</th></tr>",
            esc(f.title),
            esc(f.head),
            if rej { "<th>tokens rejected</th>" } else { "" },
            if seq {
                "<th>sequences rejected</th>"
            } else {
                ""
            },
        );
        for r in &f.rows {
            let w = if top > 0.0 { 200.0 * r.k3 / top } else { 0.0 };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                esc(&r.label),
                pct(r.share),
                num(r.k3),
                num(r.lr)
            );
            if rej {
                let _ = write!(h, "<td>{}</td>", r.rejected.map(pct).unwrap_or_default());
            }
            if seq {
                let _ = write!(
                    h,
                    "<td>{}</td>",
                    r.seq_rejected.map(pct).unwrap_or_default()
                );
            }
            let _ = write!(
                h,
                "<td><svg width=\"204\" height=\"12\" role=\"img\"><rect x=\"0\" y=\"1\" \
                 width=\"{w:.1}\" height=\"10\" fill=\"#1f6fb4\"/></svg></td></tr>"
            );
        }
        h.push_str("</table>");
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_only_when_they_say_something() {
        let mut m: BTreeMap<String, f64> = BTreeMap::new();
        assert!(breakdown_lines(&m).is_empty() && breakdown_html(&m).is_empty());
        let mut put = |k: &str, v: f64| {
            m.insert(k.to_string(), v);
        };
        // one probability bucket, one turn, nothing rejected: nothing to say
        put("trmask/by_prob/0.9-1/token_fraction", 1.0);
        put("trmask/by_prob/0.9-1/k3_mean", 1e-4);
        put("trmask/by_prob/0.9-1/log_ratio_mean", 0.0);
        put("trmask/by_prob/0-0.01/token_fraction", 0.0);
        put("trmask/turns_max", 1.0);
        put("trmask/turns_mean", 1.0);
        for s in ["pos", "neg"] {
            put(&format!("trmask/adv_{s}/token_fraction"), 0.5);
            put(&format!("trmask/adv_{s}/k3_mean"), 1e-3);
            put(&format!("trmask/adv_{s}/log_ratio_mean"), 0.0);
            put(&format!("trmask/adv_{s}/rejected_fraction"), 0.0);
            put(&format!("trmask/adv_{s}/seq_rejected_fraction"), 0.0);
        }
        assert!(breakdown_lines(&m).is_empty(), "{:?}", breakdown_lines(&m));
        // a second bucket, a second turn, a rejection: three lines
        m.insert("trmask/by_prob/0.1-0.5/token_fraction".into(), 0.25);
        m.insert("trmask/by_prob/0.1-0.5/k3_mean".into(), 2e-3);
        m.insert("trmask/by_prob/0.1-0.5/log_ratio_mean".into(), -0.01);
        m.insert("trmask/adv_neg/seq_rejected_fraction".into(), 0.5);
        m.insert("trmask/turns_max".into(), 2.0);
        for (k, v) in [("1", 0.6), ("2", 0.4)] {
            m.insert(format!("trmask/turn/{k}/token_fraction"), v);
            m.insert(format!("trmask/turn/{k}/k3_mean"), 1e-3);
            m.insert(format!("trmask/turn/{k}/log_ratio_mean"), 0.0);
            m.insert(format!("trmask/turn/{k}/rejected_fraction"), 0.1);
        }
        let lines = breakdown_lines(&m);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].starts_with("rejections by advantage sign"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("A < 0 0.001 (50% of tokens, 0% rejected, 50% of sequences)"),
            "{}",
            lines[0]
        );
        assert!(lines[1].starts_with("k3 mean by p(y): 0.1-0.5 0.002 (25% of tokens)"));
        assert!(
            lines[2].starts_with("turns: mean 1, max 2 per sequence"),
            "{}",
            lines[2]
        );
        let html = breakdown_html(&m);
        assert_eq!(html.matches("<table>").count(), 3);
        assert!(html.contains("Mismatch and rejections by turn"));
    }
}
