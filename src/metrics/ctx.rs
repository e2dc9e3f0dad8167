//! Per-batch context for finishing metrics: segments, mask, lengths, and verl's masked means.

use crate::batch::Segments;
use crate::error::Result;
use crate::stats::SegmentStats;

pub(crate) struct Ctx<'a> {
    pub(crate) segs: &'a Segments,
    pub(crate) mask: &'a [bool],
    pub(crate) owner: Vec<usize>,
    pub(crate) len: Vec<f64>,
    pub(crate) n: f64,
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
    /// verl's batch `masked_mean`: `Σ / (N + 1e-8)`.
    pub(crate) fn mmean_all(&self, s: &SegmentStats) -> f64 {
        s.sum.iter().sum::<f64>() / (self.n + 1e-8)
    }
    /// verl's std and effective sample size of (already clipped) weights `wc`:
    /// `std = sqrt(mmean(wc²) − mmean(wc)²)` (0 with a single valid token) and
    /// `ESS = 1 / mmean((wc / (mmean(wc) + 1e-8))²)`, `None` when that mean is 0 (verl divides by
    /// zero).
    pub(crate) fn std_and_ess(&self, wc: &[f64]) -> Result<(f64, Option<f64>)> {
        let mean_c = self.mmean(wc)?;
        let std = if self.n > 1.0 {
            let wc2 = self.tok(|i| wc[i] * wc[i]);
            (self.mmean(&wc2)? - mean_c * mean_c).max(0.0).sqrt()
        } else {
            0.0
        };
        let norm2 = self.tok(|i| {
            let x = wc[i] / (mean_c + 1e-8);
            x * x
        });
        let denom = self.mmean(&norm2)?;
        Ok((std, (denom != 0.0).then(|| 1.0 / denom)))
    }

    pub(crate) fn mmean(&self, v: &[f64]) -> Result<f64> {
        Ok(self.mmean_all(&self.reduce(v)?))
    }
    pub(crate) fn valid(&self, b: usize) -> bool {
        self.len[b] > 0.0
    }
    pub(crate) fn tok_max(&self, s: &SegmentStats) -> f64 {
        (0..self.b)
            .filter(|&b| s.count[b] > 0)
            .map(|b| s.max[b])
            .fold(f64::NEG_INFINITY, f64::max)
    }
    pub(crate) fn tok_min(&self, s: &SegmentStats) -> f64 {
        (0..self.b)
            .filter(|&b| s.count[b] > 0)
            .map(|b| s.min[b])
            .fold(f64::INFINITY, f64::min)
    }
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// torch's unbiased `std()`.
pub(crate) fn std_unbiased(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - 1.0)).sqrt()
}

pub(crate) fn vmax(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(f64::NEG_INFINITY, f64::max)
}
pub(crate) fn vmin(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}
