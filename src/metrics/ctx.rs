//! Per-shard context for metric partials: segments, mask, lengths, and verl's masked means as
//! mergeable accumulators ([`crate::partial`]).

use crate::error::Result;
use crate::input::batch::Segments;
use crate::partial::{Acc, Empty, Sum};
use crate::stats::SegmentStats;

pub(crate) struct Ctx<'a> {
    pub(crate) segs: &'a Segments,
    pub(crate) mask: &'a [bool],
    pub(crate) owner: Vec<usize>,
    pub(crate) len: Vec<f64>,
    /// Valid tokens of this shard.
    pub(crate) n: usize,
    pub(crate) b: usize,
}

impl Ctx<'_> {
    /// Host f64 reduction for metric finishing (the engines' per-token and per-sequence
    /// results come from `Engine::corrections_pass`; no device round trip per metric).
    pub(crate) fn reduce(&self, v: &[f64]) -> Result<SegmentStats> {
        Ok(crate::cpu::segment_reduce(v, self.segs))
    }
    /// Per-slot array from a per-token function (0 at invalid slots).
    pub(crate) fn tok(&self, f: impl Fn(usize) -> f64) -> Vec<f64> {
        (0..self.mask.len())
            .map(|i| if self.mask[i] { f(i) } else { 0.0 })
            .collect()
    }
    /// verl's per-row `masked_mean`: `Σ / (L + 1e-8)`.
    pub(crate) fn mmean_rows(&self, s: &SegmentStats) -> Vec<f64> {
        s.sum
            .iter()
            .zip(&self.len)
            .map(|(x, l)| x / (l + 1e-8))
            .collect()
    }
    /// verl's batch `masked_mean` `Σ / (N + 1e-8)` of per-row sums, as a partial.
    pub(crate) fn mmean_all(&self, s: &SegmentStats) -> Acc {
        Acc::masked_mean(Sum::of(s.sum.iter().copied()), self.n)
    }
    /// verl's batch `masked_mean` of per-slot values (0 at invalid slots), as a partial.
    pub(crate) fn mmean(&self, v: &[f64]) -> Acc {
        let s = (0..v.len()).filter(|&i| self.mask[i]).map(|i| v[i]);
        Acc::masked_mean(Sum::of(s), self.n)
    }
    /// verl's std and effective sample size of (already clipped) weights `wc`:
    /// `std = sqrt(mmean(wc²) − mmean(wc)²)` (0 with a single valid token) and
    /// `ESS = 1 / mmean((wc / (mmean(wc) + 1e-8))²)`, an error naming `ESS_KEYS[ess_key]` when
    /// that mean is 0 (verl divides by zero).
    pub(crate) fn std_and_ess(&self, wc: &[f64], ess_key: u8) -> (Acc, Acc) {
        let (mut s1, mut s2) = (Sum::default(), Sum::default());
        for i in (0..wc.len()).filter(|&i| self.mask[i]) {
            s1.add(wc[i]);
            s2.add(wc[i] * wc[i]);
        }
        let n = self.n as u64;
        (
            Acc::VerlStd { s1, s2, n },
            Acc::VerlEss {
                s1,
                s2,
                n,
                key: ess_key,
            },
        )
    }
    pub(crate) fn valid(&self, b: usize) -> bool {
        self.len[b] > 0.0
    }
    /// The largest per-token value over non-empty rows (`−∞` when none).
    pub(crate) fn tok_max(&self, s: &SegmentStats) -> Acc {
        Acc::max(
            (0..self.b).filter(|&b| s.count[b] > 0).map(|b| s.max[b]),
            Empty::Compute,
        )
    }
    pub(crate) fn tok_min(&self, s: &SegmentStats) -> Acc {
        Acc::min(
            (0..self.b).filter(|&b| s.count[b] > 0).map(|b| s.min[b]),
            Empty::Compute,
        )
    }
}

/// The mean of per-row values (`NaN` when there is none, as torch gives it).
pub(crate) fn mean(v: &[f64]) -> Acc {
    Acc::mean(v, Empty::Compute)
}

/// torch's unbiased `std()` (0 with a single value).
pub(crate) fn std_unbiased(v: &[f64]) -> Acc {
    Acc::moments(v)
}

pub(crate) fn vmax(v: impl IntoIterator<Item = f64>) -> Acc {
    Acc::max(v, Empty::Compute)
}
pub(crate) fn vmin(v: impl IntoIterator<Item = f64>) -> Acc {
    Acc::min(v, Empty::Compute)
}

/// A verl fraction `k / n` rounded to f32.
pub(crate) fn f32_frac(k: usize, n: usize) -> Acc {
    Acc::frac(k, n, crate::partial::FracMode::F32, Empty::Compute)
}
