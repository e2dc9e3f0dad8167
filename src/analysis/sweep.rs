//! Threshold sweeps: for every configured rejection criterion, the fractions of sequences and
//! tokens it would reject at each threshold over the batch's range (log-spaced), counted from
//! the same per-sequence and per-token statistics and the same inclusive keep test
//! (`lower ≤ x ≤ upper`) as the mask itself, so a point is what a run with that threshold
//! rejects.
//!
//! `k1` criteria are two-sided in log space: the sweep moves the upper threshold (in ratio
//! space, as configured) and keeps the configured lower one. The token veto and DPPO / PDM
//! masks are not swept; nor are `m2po` (its threshold bounds a batch mean, not a token's
//! statistic) and `cppo` (its keep test adds a prefix budget); nor are legacy configs.

use crate::config::{Agg, Criterion, Resolved, Stat};
use crate::error::Result;
use crate::input::batch::Batch;
use crate::stats::{Corrections, StatTable};
use serde::Serialize;

/// Number of thresholds in a sweep.
pub const SWEEP_POINTS: usize = 50;

/// One criterion's counterfactual curve.
#[derive(Clone, Debug, Serialize)]
pub struct Sweep {
    /// The criterion (`seq_mean_k3`, `token_k1`, …).
    pub criterion: String,
    /// The configured (upper) threshold, in the config's space (a ratio for `k1`).
    pub configured: f64,
    /// Log-spaced thresholds over the batch's range of the statistic (and the configured one).
    pub threshold: Vec<f64>,
    /// Fraction of sequences (with at least one valid token) rejected at each threshold.
    pub rejected_seq_fraction: Vec<f64>,
    /// Fraction of valid tokens rejected at each threshold.
    pub rejected_token_fraction: Vec<f64>,
    #[serde(skip)]
    counter: Counter,
}

/// Counts rejections at any upper threshold `g` (in the statistic's space) with sorted values.
#[derive(Clone, Debug, Default)]
struct Counter {
    /// Per live sequence not rejected whatever `g`: the value compared to `g` and its tokens.
    seq: Vec<(f64, u64)>,
    /// Suffix sums of `seq`'s tokens (`seq_tokens[k]` = tokens of `seq[k..]`).
    seq_tokens: Vec<u64>,
    /// Token criteria: the per-token values compared to `g`.
    tok: Option<Vec<f64>>,
    fixed_seqs: u64,
    fixed_tokens: u64,
    n_seqs: u64,
    n_tokens: u64,
    /// `true` for k1 (thresholds in ratio space, `g = ln threshold`).
    log: bool,
}

impl Counter {
    /// `(rejected sequences, rejected tokens)` at the upper threshold `g`.
    fn at(&self, g: f64) -> (u64, u64) {
        let k = self.seq.partition_point(|&(s, _)| s <= g);
        let seqs = self.fixed_seqs + (self.seq.len() - k) as u64;
        let tokens = match &self.tok {
            None => self.fixed_tokens + self.seq_tokens[k],
            Some(t) => self.fixed_tokens + (t.len() - t.partition_point(|&x| x <= g)) as u64,
        };
        (seqs, tokens)
    }
}

impl Sweep {
    /// `(sequence fraction, token fraction)` rejected at `threshold` (config space).
    pub fn rejected_at(&self, threshold: f64) -> (f64, f64) {
        let g = if self.counter.log {
            threshold.ln()
        } else {
            threshold
        };
        let (s, t) = self.counter.at(g);
        (
            s as f64 / self.counter.n_seqs.max(1) as f64,
            t as f64 / self.counter.n_tokens.max(1) as f64,
        )
    }

    /// Number of sequences with at least one valid token (the fractions' denominator).
    pub fn sequences(&self) -> u64 {
        self.counter.n_seqs
    }

    /// True for `k1` criteria, whose thresholds are ratios (scaled as powers, not multiples).
    pub fn ratio_space(&self) -> bool {
        self.counter.log
    }
}

/// A token criterion's values as its sweep counts them, fed valid token by valid token,
/// sequence by sequence in order ([`TokenValues::add`], [`TokenValues::end_seq`]): by the
/// full path from the statistics table ([`table_token_values`]), by the fused pass from its
/// tiles' columns (`correction::lean::stats`).
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenValues {
    /// The lower bound in the statistic's space ([`token_lower`]).
    lower: Option<f64>,
    /// Per sequence with a valid token: its largest value, `None` when one of its values is
    /// below the lower bound or NaN (rejected whatever the upper threshold).
    seq: Vec<Option<f64>>,
    /// The valid values neither below the lower bound nor NaN, and how many were.
    tok: Vec<f64>,
    low: u64,
    /// The sequence being fed: one of its values low, its largest.
    cur: Option<(bool, f64)>,
}

impl TokenValues {
    pub(crate) fn new(lower: Option<f64>) -> Self {
        TokenValues {
            lower,
            ..TokenValues::default()
        }
    }

    /// One valid token's value.
    #[inline(always)]
    pub(crate) fn add(&mut self, x: f64) {
        let low = x.is_nan() || self.lower.is_some_and(|l| x < l);
        match low {
            true => self.low += 1,
            false => self.tok.push(x),
        }
        let (any, m) = self.cur.get_or_insert((false, f64::NEG_INFINITY));
        *any |= low;
        *m = m.max(x);
    }

    /// The sequence ends (one without a valid token leaves no entry).
    pub(crate) fn end_seq(&mut self) {
        if let Some((any_low, m)) = self.cur.take() {
            self.seq.push((!any_low).then_some(m));
        }
    }

    /// The next shard's sequences after this one's.
    pub(crate) fn append(&mut self, o: TokenValues) {
        self.seq.extend(o.seq);
        self.tok.extend(o.tok);
        self.low += o.low;
    }
}

/// The criteria whose sweep counts tokens: the swept criteria (see the module docs) that test
/// each token.
pub(crate) fn swept_token_criteria(cfg: &Resolved) -> impl Iterator<Item = &Criterion> {
    cfg.criteria
        .iter()
        .filter(move |c| cfg.legacy.is_none() && c.agg == Agg::Token && swept(c))
}

/// The criterion has a sweep.
fn swept(c: &Criterion) -> bool {
    !matches!(c.stat, Stat::M2po | Stat::Cppo)
}

/// A swept criterion's lower bound in its statistic's space (k1's in log space).
pub(crate) fn token_lower(c: &Criterion) -> Option<f64> {
    match c.is_k1() {
        true => c.lower.map(f64::ln),
        false => None,
    }
}

/// Each of [`swept_token_criteria`]'s values from the batch's statistics table (the full
/// path). verl's k3 (`exp(c) − 1 − c`) is read as the table's `k3` (`expm1(c) − c`): the same
/// number to rounding on the CPU, and what the GPU's mask kernel evaluates (in f32, without
/// the cancellation of `ρ − 1`).
pub(crate) fn table_token_values(
    batch: &Batch,
    table: &StatTable,
    cfg: &Resolved,
) -> Result<Vec<TokenValues>> {
    let mask = batch.mask();
    let mut out = Vec::new();
    for c in swept_token_criteria(cfg) {
        let v = table.get(c.stat.name())?;
        let mut t = TokenValues::new(token_lower(c));
        for &(start, end) in batch.segments().ranges() {
            (start..end).filter(|&j| mask[j]).for_each(|j| t.add(v[j]));
            t.end_seq();
        }
        out.push(t);
    }
    Ok(out)
}

/// The sweep of every swept criterion of `cfg` (see the module docs), from the corrections
/// (sequence criteria: each sequence's statistic and valid tokens) and, for token criteria,
/// `tokens`: the values of each of [`swept_token_criteria`] in order (without them a token
/// criterion is not swept).
pub(crate) fn sweeps(
    tokens: Option<Vec<TokenValues>>,
    cfg: &Resolved,
    corrections: &Corrections,
) -> Result<Vec<Sweep>> {
    if cfg.legacy.is_some() {
        return Ok(Vec::new());
    }
    let mut tokens = tokens.map(Vec::into_iter);
    let mut out = Vec::new();
    for (c, r) in cfg.criteria.iter().zip(&corrections.criteria) {
        // taken in [`swept_token_criteria`]'s order whatever is skipped below
        let tv = match c.agg == Agg::Token && swept(c) {
            true => Some(tokens.as_mut().and_then(Iterator::next)),
            false => None,
        };
        if c.name != r.name || !swept(c) {
            continue;
        }
        let log = c.is_k1();
        let (lower, upper) = (token_lower(c), if log { c.upper.ln() } else { c.upper });
        let low = |x: f64| x.is_nan() || lower.is_some_and(|l| x < l);
        let mut k = Counter {
            log,
            ..Counter::default()
        };
        let mut tv = match tv {
            None => None,
            Some(None) => continue,
            Some(Some(t)) => Some(t),
        };
        let mut seqs = tv.as_ref().map(|t| t.seq.iter());
        for (i, &len) in corrections.seq_len.iter().enumerate() {
            if len == 0 {
                continue;
            }
            k.n_seqs += 1;
            k.n_tokens += len as u64;
            let score = match seqs.as_mut() {
                None => {
                    let s = r.seq_stat[i];
                    (!low(s)).then_some(s)
                }
                Some(it) => it.next().copied().flatten(),
            };
            match score {
                Some(s) => k.seq.push((s, len as u64)),
                None => {
                    k.fixed_seqs += 1;
                    if seqs.is_none() {
                        k.fixed_tokens += len as u64;
                    }
                }
            }
        }
        k.seq.sort_by(|a, b| a.0.total_cmp(&b.0));
        k.seq_tokens = vec![0; k.seq.len() + 1];
        for j in (0..k.seq.len()).rev() {
            k.seq_tokens[j] = k.seq_tokens[j + 1] + k.seq[j].1;
        }
        if let Some(t) = tv.as_mut() {
            let mut tok = std::mem::take(&mut t.tok);
            // the counts read only where a threshold falls: any order of equal values
            crate::math::par_sort_total(&mut tok);
            k.fixed_tokens += t.low;
            k.tok = Some(tok);
        }
        let grid = grid(k.seq.iter().map(|p| p.0), upper);
        let threshold: Vec<f64> = grid
            .iter()
            .map(|&g| if log { g.exp() } else { g })
            .collect();
        let mut sweep = Sweep {
            criterion: c.name.clone(),
            configured: c.upper,
            threshold,
            rejected_seq_fraction: Vec::new(),
            rejected_token_fraction: Vec::new(),
            counter: k,
        };
        for j in 0..sweep.threshold.len() {
            let (s, t) = sweep.rejected_at(sweep.threshold[j]);
            sweep.rejected_seq_fraction.push(s);
            sweep.rejected_token_fraction.push(t);
        }
        out.push(sweep);
    }
    Ok(out)
}

/// [`SWEEP_POINTS`] log-spaced values from just below the smallest positive finite value to
/// just above the largest (the configured threshold included in the range).
fn grid(values: impl Iterator<Item = f64>, configured: f64) -> Vec<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values
        .chain([configured])
        .filter(|v| v.is_finite() && *v > 0.0)
    {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        // no positive value: around the configured threshold (or 0)
        let c = if configured.is_finite() {
            configured
        } else {
            0.0
        };
        return vec![c];
    }
    if hi <= lo {
        return vec![lo];
    }
    // a little past the data at both ends, so that no end point is a value itself
    let (a, b) = (lo.ln() - 0.1, hi.ln() + 0.1);
    let n = SWEEP_POINTS;
    (0..n)
        .map(|i| (a + (b - a) * i as f64 / (n - 1) as f64).exp())
        .collect()
}

/// The `--metrics` JSON of `trmask analyze`: the metrics of [`crate::io::metrics_bytes`] and,
/// per sweep, `trmask/sweep/<criterion>`: `{"configured", "threshold": [...],
/// "rejected_seq_fraction": [...], "rejected_token_fraction": [...]}`.
pub fn metrics_bytes(
    metrics: &std::collections::BTreeMap<String, f64>,
    sweeps: &[Sweep],
) -> Result<Vec<u8>> {
    let base = crate::io::metrics_bytes(metrics)?;
    if sweeps.is_empty() {
        return Ok(base);
    }
    let bad = |e: serde_json::Error| crate::error::Error::file("<metrics>", e.to_string());
    let mut v: serde_json::Value = serde_json::from_slice(&base).map_err(bad)?;
    if let Some(obj) = v.as_object_mut() {
        for s in sweeps {
            let sv = serde_json::to_value(s).map_err(bad)?;
            obj.insert(format!("trmask/sweep/{}", s.criterion), sv);
        }
    }
    let mut text = serde_json::to_string_pretty(&v).map_err(bad)?;
    text.push('\n');
    Ok(text.into_bytes())
}

/// The threshold (config space) at which the criterion of `sweeps` (one criterion, one sweep
/// per batch) rejects `round(rate · N)` of the `N` sequences of all the batches together:
/// halfway between the largest value kept and the smallest rejected; when every sequence is to
/// be rejected, halfway between 0 and the smallest value. `None` when no threshold does: more
/// sequences than that are rejected whatever the threshold (a `k1` lower bound, a NaN
/// statistic), a tie straddles the target, or the smallest value is not positive.
pub fn threshold_for_rate(sweeps: &[&Sweep], rate: f64) -> Option<f64> {
    let log = sweeps.first()?.counter.log;
    let n: u64 = sweeps.iter().map(|s| s.counter.n_seqs).sum();
    let fixed: u64 = sweeps.iter().map(|s| s.counter.fixed_seqs).sum();
    let want = (rate * n as f64).round() as u64;
    let mut v: Vec<f64> = sweeps
        .iter()
        .flat_map(|s| s.counter.seq.iter().map(|p| p.0))
        .collect();
    v.sort_by(f64::total_cmp);
    let m = want.checked_sub(fixed)? as usize;
    if m == v.len() && !v.is_empty() {
        // every sequence rejected: no value is kept, so the threshold is halfway between 0 and
        // the smallest value (the statistics are >= 0, a k1 criterion's log-ratio above ln 1)
        return (v[0] > 0.0).then(|| if log { (v[0] / 2.0).exp() } else { v[0] / 2.0 });
    }
    if m >= v.len() {
        return None;
    }
    let kept = v[v.len() - m - 1];
    let g = if m == 0 {
        kept
    } else {
        let rejected = v[v.len() - m];
        if rejected == kept {
            return None; // a tie straddles the target
        }
        kept + (rejected - kept) / 2.0
    };
    Some(if log { g.exp() } else { g })
}
