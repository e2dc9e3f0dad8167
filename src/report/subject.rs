//! What every view of a report shares: the analysed batch, its outputs by name, number
//! formatting, the ranking of sequences by the first criterion and the config in words.

use crate::analysis::Analysis;
use crate::config::{Agg, CorrectionConfig, Stat};
use crate::input::batch::Batch;

/// One analysed input and how it was analysed.
pub struct Subject<'a> {
    /// The input path as given.
    pub input: &'a str,
    pub batch: &'a Batch,
    /// `(trmask name, name in the file, dtype)` of every tensor read.
    pub sources: &'a [(String, String, String)],
    pub config: &'a CorrectionConfig,
    /// The preset name, when the config is one.
    pub preset: Option<&'a str>,
    pub analysis: &'a Analysis,
    /// The engine's name.
    pub engine: &'a str,
    /// The data's `warning:` lines ([`super::warnings()`]), as printed on stderr.
    pub warnings: &'a [String],
    /// A token id's text (`trmask report --tokenizer`), for the worst-tokens table.
    pub decode: Option<&'a dyn Fn(i64) -> Option<String>>,
}

/// The last component of a path as given: a page names its input without the directories it
/// sat in (a page is shared; the directories are the author's).
pub(crate) fn file_name(path: &str) -> String {
    std::path::Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
}

/// An output tensor of the analysis by name.
pub(crate) fn output<'a>(a: &'a Analysis, name: &str) -> Option<&'a [f64]> {
    a.outputs
        .iter()
        .find(|o| o.name == name)
        .map(|o| o.data.as_slice())
}

/// A short number: integers as integers, the rest with 3 significant digits.
pub(crate) fn num(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else if x == x.trunc() && x.abs() < 1e9 {
        format!("{}", x as i64)
    } else if x != 0.0 && !(1e-3..1e5).contains(&x.abs()) {
        format!("{x:.3e}")
    } else {
        // four significant digits below 1 (0.001411, not 0.0014), four decimals above
        let decimals = if x.abs() < 1.0 {
            (3 - x.abs().log10().floor() as i32).clamp(4, 6) as usize
        } else {
            4
        };
        let s = format!("{x:.decimals$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The sequence statistic the summary and report rank by: the first configured criterion's
/// (with its bounds `(lower, upper)` in the statistic's own space), else `seq_mean_k3`.
pub(crate) struct Ranking<'a> {
    pub name: String,
    pub values: &'a [f64],
    pub bounds: Option<(Option<f64>, f64)>,
}

pub(crate) fn ranking<'a>(s: &Subject<'a>) -> Option<Ranking<'a>> {
    let resolved = s.config.resolve().ok();
    if let Some(c) = s.analysis.corrections.criteria.first() {
        let crit = resolved
            .as_ref()
            .and_then(|r| r.criteria.iter().find(|k| k.name == c.name));
        let bounds = crit.and_then(|k| {
            (k.agg != Agg::Token).then(|| {
                if k.stat == Stat::K1 {
                    (k.lower.map(f64::ln), k.upper.ln())
                } else {
                    (None, k.upper)
                }
            })
        });
        let name = if bounds.is_some() || crit.is_none() {
            c.output_name.clone()
        } else {
            format!("{} (rejected token fraction)", c.name)
        };
        return Some(Ranking {
            name,
            values: &c.seq_stat,
            bounds,
        });
    }
    output(s.analysis, "seq_mean_k3").map(|v| Ranking {
        name: "seq_mean_k3".into(),
        values: v,
        bounds: None,
    })
}

/// Sequence indices ordered from the worst (largest statistic, rejected first) down.
pub(crate) fn worst_order(s: &Subject, r: &Ranking) -> Vec<usize> {
    let acc = &s.analysis.corrections.seq_accept;
    let len = &s.analysis.corrections.seq_len;
    let mut idx: Vec<usize> = (0..r.values.len()).filter(|&i| len[i] > 0).collect();
    let key = |i: usize| {
        let v = r.values[i];
        let over = match r.bounds {
            Some((lo, hi)) => v > hi || lo.is_some_and(|l| v < l),
            None => false,
        };
        (
            !acc[i] as u8 + over as u8,
            if v.is_nan() { f64::INFINITY } else { v.abs() },
        )
    };
    idx.sort_by(|&a, &b| {
        let (ka, kb) = (key(a), key(b));
        kb.0.cmp(&ka.0).then(kb.1.total_cmp(&ka.1))
    });
    idx
}

/// The configuration in words, one line per part.
pub(crate) fn config_words(config: &CorrectionConfig, preset: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let head = match preset {
        Some(p) => format!("preset {p}"),
        None => "config".to_string(),
    };
    let Ok(r) = config.resolve() else {
        return vec![format!("{head}: (does not resolve)")];
    };
    let mut parts = Vec::new();
    if let Some(is) = &r.is {
        parts.push(format!(
            "IS {} weights, truncated at {}{}{}",
            is.level.name(),
            num(is.upper),
            is.lower
                .map(|l| format!(", masked below {}", num(l)))
                .unwrap_or_default(),
            if is.batch_normalize {
                ", batch-normalised"
            } else {
                ""
            }
        ));
    }
    for c in &r.criteria {
        let unit = if c.agg == Agg::Token {
            "token"
        } else {
            "sequence"
        };
        parts.push(match (c.stat == Stat::K1, c.lower) {
            _ if c.stat == Stat::Cppo => format!(
                "drop outward tokens with w_t|p - q| over CPPO's prefix-budgeted threshold (delta {}, \
                 w_min {}, delta_b {})",
                num(c.upper),
                num(r.cppo.w_min),
                num(r.cppo.delta_b)
            ),
            _ if c.stat == Stat::M2po => format!(
                "drop the active tokens with the largest (log rho)^2 until their mean <= {}",
                num(c.upper)
            ),
            (true, Some(lo)) => format!(
                "reject {unit} unless ln {} <= {} <= ln {}",
                num(lo),
                c.name,
                num(c.upper)
            ),
            _ => format!("reject {unit} if {} > {}", c.name, num(c.upper)),
        });
    }
    if let Some(v) = r.token_veto {
        parts.push(format!("veto sequence if any rho < {}", num(v)));
    }
    if let Some(d) = &r.dppo {
        parts.push(format!(
            "DPPO token mask: {} > {} (direction {})",
            d.divergence.name(),
            num(d.delta),
            d.direction.name()
        ));
    }
    if r.legacy.is_some() {
        parts.push("legacy verl rejection".into());
    }
    if config.bypass_mode {
        parts.push("bypass mode (log_prob is the training policy)".into());
    }
    if parts.is_empty() {
        out.push(format!(
            "{head}: no correction configured (measurement only)"
        ));
    } else {
        out.push(format!("{head}: {}", parts.join("; ")));
    }
    out
}
