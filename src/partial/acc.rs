//! The accumulators of a [`Partial`], their merge (associative, order-independent to within
//! rounding; exact for counts, maxima, minima and gathered vectors) and their finish.

use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// A compensated sum (a double-double: `hi + lo`, `lo` the rounding errors of `hi`), so that
/// sums merged across ranks in any order agree to within one rounding of the exact sum.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sum {
    pub(crate) hi: f64,
    pub(crate) lo: f64,
}

impl Sum {
    /// Adds one term (Knuth's two-sum keeps the rounding error of every addition).
    pub fn add(&mut self, x: f64) {
        let s = self.hi + x;
        if s.is_finite() {
            let bb = s - self.hi;
            self.lo += (self.hi - (s - bb)) + (x - bb);
        }
        self.hi = s;
    }
    /// The sum of every term of `terms`.
    pub fn of(terms: impl IntoIterator<Item = f64>) -> Self {
        let mut s = Sum::default();
        terms.into_iter().for_each(|x| s.add(x));
        s
    }
    /// Adds another partial sum.
    pub fn merge(&mut self, o: Sum) {
        self.add(o.hi);
        if self.hi.is_finite() {
            self.lo += o.lo;
        }
    }
    /// The rounded value (`hi` alone when it is not finite).
    pub fn value(self) -> f64 {
        if self.hi.is_finite() {
            self.hi + self.lo
        } else {
            self.hi
        }
    }
}

/// What a mean, fraction or extremum finishes to when nothing was counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Empty {
    /// Compute it anyway (`0/0 = NaN`, an empty maximum is `−∞`), as verl does.
    Compute,
    /// Leave the metric out (an extremum is left out whenever it is not finite).
    Absent,
    /// Report 0.
    Zero,
}

/// How a fraction `k/n` is finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FracMode {
    /// `k / n` in f64.
    F64,
    /// `k / n` in f32, as verl's `float32` tensors give it.
    F32,
    /// `1 − k/n` in f64.
    Complement,
}

/// The bound certificate's inputs over one set of sequences (all, or the accepted ones).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CertAcc {
    /// δ̂ and ε̂ come from exact divergences (logits were given).
    pub exact: bool,
    /// An ε̂ was measured (the table has `tv`).
    pub has_eps: bool,
    /// Batch max of the per-token KL (or k3).
    pub delta: f64,
    /// Batch max of the per-token TV.
    pub eps: f64,
    /// Largest per-sequence KL sum.
    pub kl_seq: f64,
    /// Longest sequence.
    pub horizon: u64,
    /// Largest `min(½|ρ_t − 1|, 1)` at each position t (empty without `ser`).
    pub dbar: Vec<f64>,
}

impl CertAcc {
    fn merge(&mut self, o: &CertAcc) {
        self.exact &= o.exact;
        self.has_eps &= o.has_eps;
        self.delta = self.delta.max(o.delta);
        self.eps = self.eps.max(o.eps);
        self.kl_seq = self.kl_seq.max(o.kl_seq);
        self.horizon = self.horizon.max(o.horizon);
        if self.dbar.len() < o.dbar.len() {
            self.dbar.resize(o.dbar.len(), 0.0);
        }
        for (a, &b) in self.dbar.iter_mut().zip(&o.dbar) {
            *a = a.max(b);
        }
    }
}

/// One mergeable batch-level quantity.
#[derive(Clone, Debug, PartialEq)]
pub enum Acc {
    /// verl's `masked_mean` over valid tokens, `Σ / (n + 1e-8) + offset`.
    MaskedMean { sum: Sum, n: u64, offset: f64 },
    /// `Σ / n + offset`.
    Mean {
        sum: Sum,
        n: u64,
        offset: f64,
        empty: Empty,
    },
    /// A fraction `k / n`.
    Frac {
        k: u64,
        n: u64,
        mode: FracMode,
        empty: Empty,
    },
    /// A maximum.
    Max { v: f64, empty: Empty },
    /// A minimum.
    Min { v: f64, empty: Empty },
    /// verl's clipped-weight std over valid tokens: `sqrt(max(mmean(x²) − mmean(x)², 0))`, 0
    /// with at most one valid token.
    VerlStd { s1: Sum, s2: Sum, n: u64 },
    /// verl's effective sample size `1 / mmean((x / (mmean(x) + 1e-8))²)`; an error naming
    /// `key` when that mean is 0 (verl divides by zero).
    VerlEss { s1: Sum, s2: Sum, n: u64, key: u8 },
    /// torch's unbiased `std()` from (count, mean, Σ(x − mean)²), merged by Chan et al.; 0
    /// with at most one value.
    Moments { n: u64, mean: f64, m2: f64 },
    /// Pearson's correlation from co-moments merged by Chan et al.; absent with fewer than two
    /// points or a constant side.
    CoMoments {
        n: u64,
        mx: f64,
        my: f64,
        cxx: f64,
        cyy: f64,
        cxy: f64,
    },
    /// The effective sample size `(Σw)² / (n Σw²)` of a weight set (0 when `Σw² = 0`, absent
    /// when empty).
    Ess { s1: Sum, s2: Sum, n: u64 },
    /// Gathered values: finishes `<key>_mean`, `_p50`, `_p90` (numpy's linear percentiles) and
    /// `_max`; nothing when empty.
    Quantiles(Vec<f64>),
    /// GRPO groups: uid → (members, accepted members); finishes `trmask/group_*`.
    Groups(BTreeMap<i64, (u64, u64)>),
    /// The same value on every rank (a constant of the config); merge keeps the first.
    Const(f64),
    /// The bound certificate's inputs (finished by `certificate`).
    Cert(Option<CertAcc>),
    /// A count that is not a metric itself (keys starting with `#`).
    Count(u64),
    /// A fixed-bin histogram (keys starting with `#hist/`; finishes to no metric).
    Hist(super::hist::Hist),
    /// A ratio of two sums `num / den` (a share); absent when `den` is 0.
    Ratio { num: Sum, den: Sum },
}

/// Error keys a [`Acc::VerlEss`] can name (its `key`).
pub(crate) const ESS_KEYS: [&str; 3] = ["rollout_is_threshold", "rollout_is", "rollout_rs"];

fn chan(na: u64, ma: f64, nb: u64, mb: f64) -> (u64, f64, f64, f64) {
    let n = na + nb;
    let d = mb - ma;
    let w = na as f64 * nb as f64 / n as f64;
    (n, ma + d * (nb as f64 / n as f64), d, w)
}

impl Acc {
    /// A masked mean of per-token values (invalid slots read as 0 and are not counted).
    pub fn masked_mean(sum: Sum, n: usize) -> Acc {
        Acc::MaskedMean {
            sum,
            n: n as u64,
            offset: 0.0,
        }
    }
    /// `Σ values / count`.
    pub fn mean(values: &[f64], empty: Empty) -> Acc {
        Acc::Mean {
            sum: Sum::of(values.iter().copied()),
            n: values.len() as u64,
            offset: 0.0,
            empty,
        }
    }
    /// A fraction.
    pub fn frac(k: usize, n: usize, mode: FracMode, empty: Empty) -> Acc {
        Acc::Frac {
            k: k as u64,
            n: n as u64,
            mode,
            empty,
        }
    }
    /// The maximum of `values` (`−∞` when empty).
    pub fn max(values: impl IntoIterator<Item = f64>, empty: Empty) -> Acc {
        let v = values.into_iter().fold(f64::NEG_INFINITY, f64::max);
        Acc::Max { v, empty }
    }
    /// The minimum of `values` (`+∞` when empty).
    pub fn min(values: impl IntoIterator<Item = f64>, empty: Empty) -> Acc {
        let v = values.into_iter().fold(f64::INFINITY, f64::min);
        Acc::Min { v, empty }
    }
    /// Count, mean and `Σ(x − mean)²` of `values` (two passes).
    pub fn moments(values: &[f64]) -> Acc {
        let n = values.len();
        if n == 0 {
            return Acc::Moments {
                n: 0,
                mean: 0.0,
                m2: 0.0,
            };
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let m2 = values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>();
        Acc::Moments {
            n: n as u64,
            mean,
            m2,
        }
    }
    /// Co-moments of paired values (two passes).
    pub fn co_moments(x: &[f64], y: &[f64]) -> Acc {
        let n = x.len().min(y.len());
        let (mut mx, mut my, mut cxx, mut cyy, mut cxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
        if n > 0 {
            mx = x[..n].iter().sum::<f64>() / n as f64;
            my = y[..n].iter().sum::<f64>() / n as f64;
            for (a, b) in x.iter().zip(y) {
                cxy += (a - mx) * (b - my);
                cxx += (a - mx) * (a - mx);
                cyy += (b - my) * (b - my);
            }
        }
        Acc::CoMoments {
            n: n as u64,
            mx,
            my,
            cxx,
            cyy,
            cxy,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Acc::MaskedMean { .. } => "masked mean",
            Acc::Mean { .. } => "mean",
            Acc::Frac { .. } => "fraction",
            Acc::Max { .. } => "maximum",
            Acc::Min { .. } => "minimum",
            Acc::VerlStd { .. } => "std",
            Acc::VerlEss { .. } => "verl ESS",
            Acc::Moments { .. } => "moments",
            Acc::CoMoments { .. } => "co-moments",
            Acc::Ess { .. } => "ESS",
            Acc::Quantiles(_) => "quantiles",
            Acc::Groups(_) => "groups",
            Acc::Const(_) => "constant",
            Acc::Cert(_) => "certificate",
            Acc::Count(_) => "count",
            Acc::Hist(_) => "histogram",
            Acc::Ratio { .. } => "ratio",
        }
    }

    /// Merges `o` (the same quantity over another shard) into `self`.
    pub fn merge(&mut self, o: &Acc, key: &str) -> Result<()> {
        let (mine, theirs) = (self.kind(), o.kind());
        let mismatch = || {
            Error::input(
                "partial",
                format!(
                    "{key} is a {mine} on one rank and a {theirs} on another \
                     (ranks must run the same config)"
                ),
            )
        };
        match (self, o) {
            (Acc::MaskedMean { sum, n, .. }, Acc::MaskedMean { sum: s, n: m, .. })
            | (Acc::Mean { sum, n, .. }, Acc::Mean { sum: s, n: m, .. }) => {
                sum.merge(*s);
                *n += m;
            }
            (Acc::Frac { k, n, .. }, Acc::Frac { k: k2, n: n2, .. }) => {
                *k += k2;
                *n += n2;
            }
            (Acc::Max { v, .. }, Acc::Max { v: w, .. }) => *v = v.max(*w),
            (Acc::Min { v, .. }, Acc::Min { v: w, .. }) => *v = v.min(*w),
            (Acc::VerlStd { s1, s2, n }, Acc::VerlStd { s1: a, s2: b, n: m })
            | (
                Acc::VerlEss { s1, s2, n, .. },
                Acc::VerlEss {
                    s1: a, s2: b, n: m, ..
                },
            )
            | (Acc::Ess { s1, s2, n }, Acc::Ess { s1: a, s2: b, n: m }) => {
                s1.merge(*a);
                s2.merge(*b);
                *n += m;
            }
            (
                Acc::Moments { n, mean, m2 },
                Acc::Moments {
                    n: nb,
                    mean: mb,
                    m2: qb,
                },
            ) => {
                if *nb > 0 {
                    if *n == 0 {
                        (*n, *mean, *m2) = (*nb, *mb, *qb);
                    } else {
                        let (nn, m, d, w) = chan(*n, *mean, *nb, *mb);
                        *m2 += qb + d * d * w;
                        (*n, *mean) = (nn, m);
                    }
                }
            }
            (
                Acc::CoMoments {
                    n,
                    mx,
                    my,
                    cxx,
                    cyy,
                    cxy,
                },
                Acc::CoMoments {
                    n: nb,
                    mx: xb,
                    my: yb,
                    cxx: xxb,
                    cyy: yyb,
                    cxy: xyb,
                },
            ) => {
                if *nb > 0 {
                    if *n == 0 {
                        (*n, *mx, *my, *cxx, *cyy, *cxy) = (*nb, *xb, *yb, *xxb, *yyb, *xyb);
                    } else {
                        let (nn, x, dx, w) = chan(*n, *mx, *nb, *xb);
                        let (_, y, dy, _) = chan(*n, *my, *nb, *yb);
                        *cxx += xxb + dx * dx * w;
                        *cyy += yyb + dy * dy * w;
                        *cxy += xyb + dx * dy * w;
                        (*n, *mx, *my) = (nn, x, y);
                    }
                }
            }
            (Acc::Quantiles(v), Acc::Quantiles(w)) => v.extend_from_slice(w),
            (Acc::Groups(g), Acc::Groups(h)) => {
                for (uid, (n, a)) in h {
                    let e = g.entry(*uid).or_default();
                    e.0 += n;
                    e.1 += a;
                }
            }
            (Acc::Const(_), Acc::Const(_)) => {}
            (Acc::Cert(a), Acc::Cert(b)) => match (a.as_mut(), b) {
                (Some(x), Some(y)) => x.merge(y),
                (None, Some(y)) => *a = Some(y.clone()),
                _ => {}
            },
            (Acc::Count(a), Acc::Count(b)) => *a += b,
            (Acc::Hist(a), Acc::Hist(b)) => a.merge(b, key)?,
            (Acc::Ratio { num, den }, Acc::Ratio { num: a, den: b }) => {
                num.merge(*a);
                den.merge(*b);
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// The metrics this accumulator finishes to, under `key` (several for quantiles and groups).
    pub(crate) fn finish(&self, key: &str, out: &mut BTreeMap<String, f64>) -> Result<()> {
        let mut put = |k: &str, v: f64| {
            out.insert(k.to_string(), v);
        };
        let empty_val = |e: Empty, v: f64| match e {
            Empty::Compute => Some(v),
            Empty::Absent => None,
            Empty::Zero => Some(0.0),
        };
        match self {
            Acc::MaskedMean { sum, n, offset } => {
                put(key, sum.value() / (*n as f64 + 1e-8) + offset)
            }
            Acc::Mean {
                sum,
                n,
                offset,
                empty,
            } => {
                let v = sum.value() / *n as f64 + offset;
                if let Some(v) = if *n == 0 {
                    empty_val(*empty, v)
                } else {
                    Some(v)
                } {
                    put(key, v);
                }
            }
            Acc::Frac { k, n, mode, empty } => {
                let v = match mode {
                    FracMode::F64 => *k as f64 / *n as f64,
                    FracMode::F32 => (*k as f32 / *n as f32) as f64,
                    FracMode::Complement => 1.0 - *k as f64 / *n as f64,
                };
                if let Some(v) = if *n == 0 {
                    empty_val(*empty, v)
                } else {
                    Some(v)
                } {
                    put(key, v);
                }
            }
            Acc::Max { v, empty } | Acc::Min { v, empty } => {
                // nothing seen: the fold's start (−∞ for a maximum, +∞ for a minimum)
                let none = *v
                    == if matches!(self, Acc::Max { .. }) {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    };
                let v = match empty {
                    Empty::Absent => v.is_finite().then_some(*v),
                    e if none => empty_val(*e, *v),
                    _ => Some(*v),
                };
                if let Some(v) = v {
                    put(key, v);
                }
            }
            Acc::VerlStd { s1, s2, n } => {
                let d = *n as f64 + 1e-8;
                let std = if *n > 1 {
                    let m = s1.value() / d;
                    (s2.value() / d - m * m).max(0.0).sqrt()
                } else {
                    0.0
                };
                put(key, std);
            }
            Acc::VerlEss { s1, s2, n, key: e } => {
                let d = *n as f64 + 1e-8;
                let c = s1.value() / d + 1e-8;
                let denom = s2.value() / (c * c) / d;
                if denom == 0.0 {
                    let name = ESS_KEYS.get(*e as usize).copied().unwrap_or("rollout_is");
                    return Err(Error::config(
                        name,
                        "every IS weight is zero, so the effective sample size is 1/0 \
                         (verl raises ZeroDivisionError: float division by zero)",
                    ));
                }
                put(key, 1.0 / denom);
            }
            Acc::Moments { n, m2, .. } => {
                put(
                    key,
                    if *n > 1 {
                        (m2 / (*n as f64 - 1.0)).sqrt()
                    } else {
                        0.0
                    },
                );
            }
            Acc::CoMoments {
                n, cxx, cyy, cxy, ..
            } => {
                let r = cxy / (cxx * cyy).sqrt();
                if *n >= 2 && *cxx > 0.0 && *cyy > 0.0 && r.is_finite() {
                    put(key, r.clamp(-1.0, 1.0));
                }
            }
            Acc::Ess { s1, s2, n } => {
                if *n > 0 {
                    let (s, q) = (s1.value(), s2.value());
                    put(
                        key,
                        if q > 0.0 {
                            s * s / (*n as f64 * q)
                        } else {
                            0.0
                        },
                    );
                }
            }
            Acc::Quantiles(v) => {
                if !v.is_empty() {
                    let mut v = v.clone();
                    v.sort_by(f64::total_cmp);
                    let pct = |q: f64| {
                        let pos = q * (v.len() - 1) as f64;
                        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
                        v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
                    };
                    put(
                        &format!("{key}_mean"),
                        v.iter().sum::<f64>() / v.len() as f64,
                    );
                    put(&format!("{key}_p50"), pct(0.5));
                    put(&format!("{key}_p90"), pct(0.9));
                    put(&format!("{key}_max"), v[v.len() - 1]);
                }
            }
            Acc::Groups(g) => {
                if !g.is_empty() {
                    let ng = g.len() as f64;
                    let frac = |f: &dyn Fn(u64, u64) -> bool| {
                        g.values().filter(|&&(n, a)| f(n, a)).count() as f64 / ng
                    };
                    put(&format!("{key}num_groups"), ng);
                    put(
                        &format!("{key}group_rejected_fraction"),
                        frac(&|n, a| a < n),
                    );
                    put(
                        &format!("{key}group_fully_rejected_fraction"),
                        frac(&|_, a| a == 0),
                    );
                    put(
                        &format!("{key}group_degenerate_fraction"),
                        frac(&|_, a| a < 2),
                    );
                    let acc: u64 = g.values().map(|g| g.1).sum();
                    put(&format!("{key}group_accepted_size_mean"), acc as f64 / ng);
                }
            }
            Acc::Const(v) => put(key, *v),
            Acc::Cert(_) | Acc::Count(_) | Acc::Hist(_) => {}
            Acc::Ratio { num, den } => {
                if den.value() != 0.0 {
                    put(key, num.value() / den.value());
                }
            }
        }
        Ok(())
    }
}
