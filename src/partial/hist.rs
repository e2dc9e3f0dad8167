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
/// [`Hist::edges`], the end bins also what lies beyond. The edge table is the definition; a
/// table by the float's exponent and first mantissa bits gives the bin up to one comparison,
/// so filling a histogram costs a few operations per value (the fused pass counts every
/// token).
#[inline]
pub fn bin(x: f64) -> Option<usize> {
    if x.is_nan() {
        return None;
    }
    Some(from_cell(cells_table()[cell(x.abs())], x, edges_table()))
}

/// [`bin`] of eight values at once, [`BINS`] for NaN (loops of table lookups that
/// vectorise).
#[inline(always)]
pub(crate) fn bins8(x: &[f64; 8]) -> [usize; 8] {
    let (e, cells) = (edges_table(), cells_table());
    let mut out = [0usize; 8];
    for (o, &x) in out.iter_mut().zip(x) {
        // the cell's bin is exact (a cell holds at most one edge: the tests check every cell)
        let b = from_cell(cells[cell(x.abs())], x, e);
        *o = if x.is_nan() { BINS } else { b };
    }
    out
}

/// Cells of |x| by its float's exponent and first [`CELL_BITS`] mantissa bits, from
/// 2^[`LO_EXP`] (below the first edge) to 2^[`HI_EXP`] (above the last): a cell spans a
/// factor 2^(1/64), successive edges lie at least a factor 1.7 apart, so a cell holds at most
/// one edge.
const CELL_BITS: u32 = 6;
const LO_EXP: i64 = -40;
const HI_EXP: i64 = 10;
const CELLS: usize = ((HI_EXP - LO_EXP) as usize) << CELL_BITS;

/// The cell of `a` ≥ 0 (∞ in the last; branch-free).
#[inline(always)]
fn cell(a: f64) -> usize {
    let lo = (1023 + LO_EXP) << CELL_BITS;
    ((a.to_bits() >> (52 - CELL_BITS)) as i64 - lo).clamp(0, CELLS as i64 - 1) as usize
}

/// Per cell: how many of the positive edges `e[BINS/2 + k]`, `k = 1..BINS/2`, lie at or
/// below the cell's lower end.
fn cells_table() -> &'static [u32; CELLS] {
    static CELLS_AT: std::sync::OnceLock<[u32; CELLS]> = std::sync::OnceLock::new();
    CELLS_AT.get_or_init(|| {
        let (e, half) = (edges_table(), BINS / 2);
        std::array::from_fn(|c| {
            let lo = f64::from_bits((((1023 + LO_EXP) << CELL_BITS) as u64 + c as u64) << 46);
            (1..half).filter(|&k| e[half + k] <= lo).count() as u32
        })
    })
}

/// The bin of `x` (not NaN) from its cell's count `at`: one comparison with the next edge.
#[inline(always)]
fn from_cell(at: u32, x: f64, e: &[f64; BINS + 1]) -> usize {
    let (half, a) = (BINS / 2, x.abs());
    // at most half − 1 (the table's counts), so every index below is in range
    let at = (at as usize).min(half - 1);
    // edges ≤ a
    let up = at + usize::from((at + 1 < half) & (e[half + at + 1] <= a));
    // bin i holds e[i] ≤ x < e[i + 1]: below 0, the edges < a count down from the middle
    let lt = up - usize::from((up > 0) & (e[half + up] == a));
    // no branch on the sign (a coin toss for log-ratios)
    let neg = usize::from(x < 0.0).wrapping_neg();
    ((half - 1 - lt) & neg) | ((half + up) & !neg)
}

/// The bin of `x` from the guess `i` by the edge table `e` alone (the tests' check that
/// [`from_cell`] needs no correction).
#[cfg(test)]
fn settle(mut i: usize, x: f64, e: &[f64; BINS + 1]) -> usize {
    while i > 0 && x < e[i] {
        i -= 1;
    }
    while i + 1 < BINS && x >= e[i + 1] {
        i += 1;
    }
    i
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
        let mut u = crate::math::test_uniform();
        for _ in 0..200_000 {
            let sign = if u() < 0.5 { 1.0 } else { -1.0 };
            let x = sign * 10f64.powf(-20.0 + 40.0 * u());
            let f = (to_y(x) + Y) / (2.0 * Y) * BINS as f64;
            if (f - f.round()).abs() < 1e-9 {
                continue; // on an edge: the table decides
            }
            let want = (f.floor().max(0.0) as usize).min(BINS - 1);
            assert_eq!(bin(x), Some(want), "x = {x}");
            let guess = from_cell(cells_table()[cell(x.abs())], x, edges_table());
            assert_eq!(guess, want, "the cell table's bin of {x}");
        }
        assert_eq!(bin(f64::INFINITY), Some(BINS - 1));
        // a cell holds at most one edge, so its bin needs one comparison
        let e = edges_table();
        for c in 0..CELLS {
            let at =
                |c: usize| f64::from_bits((((1023 + LO_EXP) << CELL_BITS) as u64 + c as u64) << 46);
            let inside = e.iter().filter(|&&x| x >= at(c) && x < at(c + 1)).count();
            assert!(inside <= 1, "cell {c} holds {inside} edges");
        }
        // at and beside every edge, both signs: the cell table's bin needs no correction
        let e = edges_table();
        let mut xs = vec![0.0, -0.0, f64::MIN_POSITIVE, 1e300, -1e300, f64::MAX];
        for &x in e.iter() {
            for y in [
                x,
                x.next_up(),
                x.next_down(),
                -x,
                (-x).next_up(),
                (-x).next_down(),
            ] {
                xs.push(y);
            }
        }
        for x in xs {
            let guess = from_cell(cells_table()[cell(x.abs())], x, e);
            assert_eq!(settle(guess, x, e), guess, "x = {x}");
            assert_eq!(bins8(&[x; 8]), [guess; 8]);
        }
        assert_eq!(bin(f64::NEG_INFINITY), Some(0));
        assert_eq!(bin(f64::NAN), None);
    }
}
