//! Two analysed batches compared (an A/B of a change: an fp16 rollout, routing replay, a new
//! engine version): per statistic the quantiles of the per-sequence means in A and B, the
//! shift of the median and a two-sided Mann–Whitney p-value, the rejected-fraction deltas per
//! criterion, and a verdict line.
//!
//! The test runs on per-sequence means (`seq_mean_<stat>`), not on tokens: tokens of one
//! sequence are not independent, sequences of a batch nearly are.
//!
//! ```
//! # use trmask::{analysis::analyze, cpu::CpuEngine, Batch, CorrectionConfig};
//! let make = |offset: f64| -> Batch {
//!     let roll: Vec<f64> = (0..64).map(|i| -0.1 - 0.01 * (i % 7) as f64).collect();
//!     let old: Vec<f64> = roll.iter().enumerate()
//!         .map(|(i, x)| x + offset + 1e-3 * ((i * 37 % 11) as f64 - 5.0)).collect();
//!     Batch::padded(16, 4, &[1.0; 64]).unwrap()
//!         .with_log_probs("rollout_log_prob", roll).unwrap()
//!         .with_log_probs("old_log_prob", old).unwrap()
//!         .build().unwrap()
//! };
//! let cfg = CorrectionConfig::default();
//! let a = analyze(&CpuEngine::new(), &make(0.0), &cfg)?;
//! let b = analyze(&CpuEngine::new(), &make(0.05), &cfg)?;
//! let c = trmask::compare::compare(&a, &b);
//! let lr = c.stats.iter().find(|s| s.statistic == "log_ratio").unwrap();
//! assert!((lr.shift - 0.05).abs() < 1e-12);
//! assert!(lr.p_value < 1e-3);
//! println!("{}", c.verdict);
//! # Ok::<(), trmask::Error>(())
//! ```

use crate::analysis::Analysis;
use serde::Serialize;

/// The statistics compared, when both batches have them.
pub const COMPARED: [&str; 4] = ["log_ratio", "k3", "kl", "tv"];

/// The p-value under which a shift is called significant.
pub const ALPHA: f64 = 0.01;

/// Quantiles and mean of one distribution.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Quantiles {
    pub n: usize,
    pub mean: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// One statistic in A and in B.
#[derive(Clone, Debug, Serialize)]
pub struct StatComparison {
    /// The per-token statistic (`k3`, `log_ratio`, …), compared through its sequence means.
    pub statistic: String,
    pub a: Quantiles,
    pub b: Quantiles,
    /// `median(B) − median(A)` of the sequence means.
    pub shift: f64,
    /// Two-sided Mann–Whitney U p-value (normal approximation, tie-corrected); 1 without data.
    pub p_value: f64,
    /// The sequence means themselves (for the plots), A then B.
    #[serde(skip)]
    pub values: (Vec<f64>, Vec<f64>),
}

/// One criterion's rejected fraction of sequences in A and B.
#[derive(Clone, Debug, Serialize)]
pub struct CriterionDelta {
    pub criterion: String,
    pub a: f64,
    pub b: f64,
    /// `b − a`.
    pub delta: f64,
}

/// MoE routing in A and B (routing replay on vs off): the flipped-token fraction
/// (`trmask/routing/token_flip_fraction`) of each and the p-value of the shift of the
/// per-sequence flip fractions (`seq_mean_route_flip`, the same Mann–Whitney test).
#[derive(Clone, Debug, Serialize)]
pub struct RoutingDelta {
    pub a: f64,
    pub b: f64,
    /// `b − a`.
    pub delta: f64,
    pub p_value: f64,
}

/// Everything `trmask compare` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub stats: Vec<StatComparison>,
    /// When both batches carry both sides' routed experts.
    pub routing: Option<RoutingDelta>,
    /// Per criterion, and `"any"` for the mask as a whole (sequences with a rejected token).
    pub rejected: Vec<CriterionDelta>,
    /// One sentence: which statistics shifted, and which way.
    pub verdict: String,
}

fn quantiles(v: &[f64]) -> Quantiles {
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(f64::total_cmp);
    let q = |p: f64| -> f64 {
        if s.is_empty() {
            return f64::NAN;
        }
        // linear interpolation between closest ranks (NumPy's default)
        let h = p * (s.len() - 1) as f64;
        let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
        s[lo] + (h - lo as f64) * (s[hi] - s[lo])
    };
    Quantiles {
        n: s.len(),
        mean: if s.is_empty() {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / s.len() as f64
        },
        p10: q(0.1),
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
    }
}

/// `erfc(x)` (Numerical Recipes' Chebyshev fit, relative error below 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Two-sided Mann–Whitney U test of `x` against `y`: the p-value of the normal approximation
/// with the tie correction and a continuity correction; 1 when either side is empty or every
/// value ties.
///
/// ```
/// let p = trmask::compare::mann_whitney(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.0, 4.0]);
/// assert!(p > 0.9);
/// let x: Vec<f64> = (0..30).map(f64::from).collect();
/// let y: Vec<f64> = (0..30).map(|i| f64::from(i) + 20.0).collect();
/// assert!(trmask::compare::mann_whitney(&x, &y) < 1e-4);
/// ```
pub fn mann_whitney(x: &[f64], y: &[f64]) -> f64 {
    let (n1, n2) = (x.len() as f64, y.len() as f64);
    if x.is_empty() || y.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = x
        .iter()
        .map(|&v| (v, true))
        .chain(y.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = n1 + n2;
    let (mut r1, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        r1 += rank * all[i..=j].iter().filter(|p| p.1).count() as f64;
        i = j + 1;
    }
    let u = r1 - n1 * (n1 + 1.0) / 2.0;
    let mu = n1 * n2 / 2.0;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = ((u - mu).abs() - 0.5).max(0.0) / var.sqrt();
    erfc(z / std::f64::consts::SQRT_2).min(1.0)
}

fn seq_means(a: &Analysis, stat: &str) -> Option<Vec<f64>> {
    let name = format!("seq_mean_{stat}");
    let o = a.outputs.iter().find(|o| o.name == name)?;
    let len = &a.corrections.seq_len;
    Some(
        (0..o.data.len())
            .filter(|&i| len.get(i).is_some_and(|&l| l > 0) && o.data[i].is_finite())
            .map(|i| o.data[i])
            .collect(),
    )
}

fn rejected_fraction(a: &Analysis, pick: &dyn Fn(usize) -> bool) -> f64 {
    let live: Vec<usize> = (0..a.corrections.seq_len.len())
        .filter(|&i| a.corrections.seq_len[i] > 0)
        .collect();
    live.iter().filter(|&&i| pick(i)).count() as f64 / live.len().max(1) as f64
}

/// Compares batch A's analysis with batch B's (see the module docs).
pub fn compare(a: &Analysis, b: &Analysis) -> Comparison {
    let mut stats = Vec::new();
    for stat in COMPARED {
        let (Some(x), Some(y)) = (seq_means(a, stat), seq_means(b, stat)) else {
            continue;
        };
        let (qa, qb) = (quantiles(&x), quantiles(&y));
        stats.push(StatComparison {
            statistic: stat.to_string(),
            shift: qb.p50 - qa.p50,
            p_value: mann_whitney(&x, &y),
            a: qa,
            b: qb,
            values: (x, y),
        });
    }
    let mut rejected = Vec::new();
    for ca in &a.corrections.criteria {
        if let Some(cb) = b.corrections.criteria.iter().find(|c| c.name == ca.name) {
            let fa = rejected_fraction(a, &|i| ca.seq_reject[i]);
            let fb = rejected_fraction(b, &|i| cb.seq_reject[i]);
            rejected.push(CriterionDelta {
                criterion: ca.name.clone(),
                a: fa,
                b: fb,
                delta: fb - fa,
            });
        }
    }
    if !a.corrections.criteria.is_empty() {
        let fa = rejected_fraction(a, &|i| !a.corrections.seq_accept[i]);
        let fb = rejected_fraction(b, &|i| !b.corrections.seq_accept[i]);
        rejected.push(CriterionDelta {
            criterion: "any".into(),
            a: fa,
            b: fb,
            delta: fb - fa,
        });
    }
    let routing = routing_delta(a, b);
    let mut verdict = verdict(&stats, &rejected);
    if let Some(r) = routing
        .as_ref()
        .filter(|r| r.p_value < ALPHA && r.delta != 0.0)
    {
        verdict.push_str(&format!(
            "; the routing differs: it flips on {:.2} % of B's recorded tokens vs {:.2} % of \
             A's (p = {:.1e})",
            100.0 * r.b,
            100.0 * r.a,
            r.p_value
        ));
    }
    Comparison {
        stats,
        routing,
        rejected,
        verdict,
    }
}

fn routing_delta(a: &Analysis, b: &Analysis) -> Option<RoutingDelta> {
    let key = "trmask/routing/token_flip_fraction";
    let (fa, fb) = (*a.metrics.get(key)?, *b.metrics.get(key)?);
    let (x, y) = (seq_means(a, "route_flip")?, seq_means(b, "route_flip")?);
    Some(RoutingDelta {
        a: fa,
        b: fb,
        delta: fb - fa,
        p_value: mann_whitney(&x, &y),
    })
}

fn verdict(stats: &[StatComparison], rejected: &[CriterionDelta]) -> String {
    let shifted: Vec<&StatComparison> = stats
        .iter()
        .filter(|s| s.p_value < ALPHA && s.shift != 0.0)
        .collect();
    if shifted.is_empty() {
        return format!(
            "verdict: no shift: no statistic's sequence means differ at p < {ALPHA} (Mann-Whitney)"
        );
    }
    let words: Vec<String> = shifted
        .iter()
        .map(|s| {
            format!(
                "{} median {:+.3e} (p = {:.1e})",
                s.statistic, s.shift, s.p_value
            )
        })
        .collect();
    let magnitude = shifted
        .iter()
        .find(|s| matches!(s.statistic.as_str(), "k3" | "kl" | "tv"));
    let head = match magnitude {
        Some(s) if s.shift > 0.0 => "B's mismatch is larger than A's",
        Some(_) => "B's mismatch is smaller than A's",
        None => "B's log-ratio is offset from A's",
    };
    let rej = rejected
        .iter()
        .find(|r| r.criterion == "any")
        .filter(|r| r.delta != 0.0)
        .map(|r| {
            format!(
                "; the mask rejects {:.1} % of B's sequences vs {:.1} % of A's",
                100.0 * r.b,
                100.0 * r.a
            )
        })
        .unwrap_or_default();
    format!("verdict: {head}: {}{rej}", words.join(", "))
}
