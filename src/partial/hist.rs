//! [`Hist`]: a mergeable fixed-bin histogram (the distributions a training monitor plots: log ρ
//! per valid token, each criterion's per-sequence statistic), filled in the pass that builds
//! the metrics partial and merged across ranks like every other accumulator.
//!
//! The bins are fixed (so shards merge by adding counts): [`BINS`] equal bins of the symmetric
//! log `y = sign(x)·log10(1 + |x| / LIN)` over `[-Y, Y]`, i.e. linear within ±`LIN` and a
//! quarter decade per bin beyond, up to |x| ≈ 10²; values beyond fall in the end bins, NaN is
//! not counted.

use crate::error::{Error, Result};

/// Bins of every histogram.
pub const BINS: usize = 64;
/// The linear half-width of the symmetric log scale.
const LIN: f64 = 1e-6;
/// The scale's half-range (`10^Y · LIN` ≈ 10²).
const Y: f64 = 8.0;

/// Counts of values in [`BINS`] fixed bins ([`Hist::edges`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Hist {
    /// Count per bin, lowest first.
    pub counts: Vec<u64>,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            counts: vec![0; BINS],
        }
    }
}

/// The symmetric log the bins are equal in (the tests' reference for [`bin`]).
#[cfg(test)]
fn to_y(x: f64) -> f64 {
    x.signum() * (x.abs() / LIN).ln_1p() / std::f64::consts::LN_10
}

fn from_y(y: f64) -> f64 {
    y.signum() * LIN * (10f64.powf(y.abs()) - 1.0)
}

/// The bin of `x` (`None` for NaN): bin `i` holds `edges[i] ≤ x < edges[i + 1]` of
/// [`Hist::edges`], the end bins also what lies beyond. The edge table is the definition; the
/// symmetric log only places a first guess (from the float's exponent), which at most two
/// comparisons each way correct, so filling a histogram costs a few operations per value (the
/// fused pass counts every token).
#[inline]
pub fn bin(x: f64) -> Option<usize> {
    if x.is_nan() {
        return None;
    }
    let e = edges_table();
    // log2(1 + |x|/LIN) ≈ exponent + mantissa fraction (within 0.09), so the guess is off by
    // at most one bin
    let v = 1.0 + x.abs() * (1.0 / LIN);
    let log2 = if v.is_finite() {
        let b = v.to_bits();
        let frac = f64::from_bits((b & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000) - 1.0;
        ((b >> 52) & 0x7ff) as f64 - 1023.0 + frac
    } else {
        1e9
    };
    let half = BINS as f64 / 2.0;
    let g = (half / Y * log2 * std::f64::consts::LOG10_2).min(half);
    let guess = if x < 0.0 { half - g - 1.0 } else { half + g };
    let mut i = (guess.max(0.0) as usize).min(BINS - 1);
    while i > 0 && x < e[i] {
        i -= 1;
    }
    while i + 1 < BINS && x >= e[i + 1] {
        i += 1;
    }
    Some(i)
}

/// The bin edges, computed once.
fn edges_table() -> &'static [f64; BINS + 1] {
    static EDGES: std::sync::OnceLock<[f64; BINS + 1]> = std::sync::OnceLock::new();
    EDGES.get_or_init(|| std::array::from_fn(|i| from_y(-Y + 2.0 * Y * i as f64 / BINS as f64)))
}

impl Hist {
    /// The histogram of `values`.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut h = Hist::default();
        for x in values {
            h.add(x);
        }
        h
    }

    /// Counts `x` (NaN is skipped).
    pub fn add(&mut self, x: f64) {
        if let Some(i) = bin(x) {
            self.counts[i] += 1;
        }
    }

    /// The `BINS + 1` bin edges in value space (the end bins also hold what lies beyond).
    pub fn edges() -> Vec<f64> {
        edges_table().to_vec()
    }

    /// Adds another shard's counts.
    pub fn merge(&mut self, o: &Hist, key: &str) -> Result<()> {
        if o.counts.len() != self.counts.len() {
            return Err(Error::input(
                "partial",
                format!(
                    "{key} has {} bins on one rank and {} on another",
                    self.counts.len(),
                    o.counts.len()
                ),
            ));
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        Ok(())
    }

    /// Values counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_fixed_and_merge_by_adding() {
        let e = Hist::edges();
        assert_eq!(e.len(), BINS + 1);
        assert!(e.windows(2).all(|w| w[0] < w[1]));
        assert!(e[BINS / 2].abs() < 1e-300 && (e[BINS] - LIN * (1e8 - 1.0)).abs() < 1e-9);
        let a = Hist::of([-0.5, 1e-3, 1e-3, f64::NAN, 1e9]);
        let b = Hist::of([0.0, -1e9]);
        assert_eq!(a.total(), 4);
        let mut m = a.clone();
        m.merge(&b, "h").unwrap();
        assert_eq!(m, Hist::of([-0.5, 1e-3, 1e-3, 1e9, 0.0, -1e9]));
        assert_eq!(m.counts[0], 1);
        assert_eq!(m.counts[BINS - 1], 1);
        // every value lies in its bin
        for x in [-0.5, 1e-3, 0.0, 3e-7, -42.0] {
            let i = Hist::of([x]).counts.iter().position(|&c| c == 1).unwrap();
            assert!(e[i] <= x && x <= e[i + 1], "{x} in bin {i}");
        }
        let short = Hist { counts: vec![0; 3] };
        assert!(m.merge(&short, "h").is_err());
    }

    /// The fast bin is the symmetric log's bin wherever a value is not within rounding of an
    /// edge, over 40 decades of both signs.
    #[test]
    fn fast_bins_are_the_symmetric_logs() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let x = if s & 1 == 0 { 1.0 } else { -1.0 } * 10f64.powf(-20.0 + 40.0 * u);
            let f = (to_y(x) + Y) / (2.0 * Y) * BINS as f64;
            if (f - f.round()).abs() < 1e-9 {
                continue; // on an edge: the table decides
            }
            let want = (f.floor().max(0.0) as usize).min(BINS - 1);
            assert_eq!(bin(x), Some(want), "x = {x}");
        }
        assert_eq!(bin(f64::INFINITY), Some(BINS - 1));
        assert_eq!(bin(f64::NEG_INFINITY), Some(0));
        assert_eq!(bin(f64::NAN), None);
    }
}
