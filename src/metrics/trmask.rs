//! trmask's own `trmask/*` metrics: acceptance, lengths, per-criterion rejection, weights, and
//! the shares and position buckets of exact divergences, as mergeable partials.

use super::diagnostics::position_means;
use crate::input::batch::Segments;
use crate::partial::hist::Hist;
use crate::partial::{Acc, Empty, FracMode, Partial};
use crate::stats::CriterionResult;

/// Exact divergences that get threshold shares and position buckets (see
/// [`divergence_metrics`]).
pub const DIVERGENCES: [&str; 5] = ["kl", "kl_rev", "tv", "topk_kl", "topk_tv"];

/// For an exact per-token divergence `name`: `trmask/<name>_frac_above_1e-4` and `_1e-3`
/// (share of valid tokens strictly above), and `trmask/<name>_pos_<lo>_<hi>` — the mean over
/// valid tokens whose position t in their response (0-based, counting valid tokens) lies in
/// `[lo, hi)`, for the buckets of [`POSITION_BUCKETS`](super::diagnostics::POSITION_BUCKETS) that hold a token (the last is named
/// `_pos_4096_inf`). Long responses drift more; this shows where.
pub fn divergence_metrics(name: &str, v: &[f64], segments: &Segments, metrics: &mut Partial) {
    let mut above = [0usize; 2];
    for &(a, b) in segments.ranges() {
        for (&x, _) in v[a..b]
            .iter()
            .zip(&segments.mask()[a..b])
            .filter(|(_, &m)| m)
        {
            above[0] += (x > 1e-4) as usize;
            above[1] += (x > 1e-3) as usize;
        }
    }
    let n = position_means(name, v, segments, false, metrics);
    for (k, t) in above.iter().zip(["1e-4", "1e-3"]) {
        metrics.put(
            format!("trmask/{name}_frac_above_{t}"),
            Acc::frac(*k, n, FracMode::F64, Empty::Absent),
        );
    }
}

/// Valid slots the final mask keeps.
pub(crate) fn kept_tokens(mask: &[bool], final_mask: &[f64]) -> u64 {
    mask.iter()
        .zip(final_mask)
        .filter(|&(&m, &f)| m && f > 0.0)
        .count() as u64
}

/// trmask's sequence-level metrics: `trmask/reject_rate` and `trmask/reject_rate/<criterion>`
/// over non-empty sequences, `trmask/token_reject_rate` (valid tokens the final mask drops, of
/// `n_valid`), and the quantiles of `trmask/seq_len` and `trmask/accepted_seq_len`. Both
/// executors call it with their per-sequence decisions.
pub(crate) fn trmask_metrics(
    seq_len: &[usize],
    seq_accept: &[bool],
    criteria: &[CriterionResult],
    n_valid: u64,
    n_kept: u64,
    m: &mut Partial,
) {
    let nonempty: Vec<usize> = (0..seq_len.len()).filter(|&i| seq_len[i] > 0).collect();
    let ne = nonempty.len();
    let frac = |k: usize| Acc::frac(k, ne, FracMode::F64, Empty::Compute);
    let rejected = nonempty.iter().filter(|&&i| !seq_accept[i]).count();
    m.put("trmask/reject_rate", frac(rejected));
    for c in criteria {
        let k = nonempty.iter().filter(|&&i| c.seq_reject[i]).count();
        m.put(format!("trmask/reject_rate/{}", c.name), frac(k));
    }
    m.put(
        "trmask/token_reject_rate",
        Acc::frac(
            n_kept as usize,
            n_valid as usize,
            FracMode::Complement,
            Empty::Compute,
        ),
    );
    let lens = |idx: &mut dyn Iterator<Item = &usize>| {
        Acc::Quantiles(idx.map(|&i| seq_len[i] as f64).collect())
    };
    m.put("trmask/seq_len", lens(&mut nonempty.iter()));
    m.put(
        "trmask/accepted_seq_len",
        lens(&mut nonempty.iter().filter(|&&i| seq_accept[i])),
    );
}

/// Each criterion's statistic over non-empty sequences as a histogram (`#hist/<criterion>`;
/// log ρ's comes with the token diagnostics, `metrics::diag`).
pub(crate) fn seq_histograms(criteria: &[(&str, &[f64])], seq_len: &[usize], m: &mut Partial) {
    for (name, stat) in criteria {
        let seqs = (0..seq_len.len()).filter(|&i| seq_len[i] > 0);
        m.put(
            format!("#hist/{name}"),
            Acc::Hist(Hist::of(seqs.map(|i| stat[i]))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_shares_and_position_buckets() {
        // sequence 0: 20 valid tokens (positions 0..20) with a masked slot in between;
        // sequence 1: 2 tokens.
        let mut mask = vec![true; 21];
        mask[5] = false;
        mask.extend([true, true]);
        let segments = Segments::new(vec![(0, 21), (21, 23)], mask).unwrap();
        let mut v: Vec<f64> = (0..23).map(|i| if i < 21 { 1e-5 } else { 2e-3 }).collect();
        v[5] = f64::NAN; // padding is never read
        v[20] = 5e-4; // position 19 of sequence 0 → bucket [16, 64)
        let mut p = Partial::new();
        divergence_metrics("kl", &v, &segments, &mut p);
        let m = p.finish().unwrap();
        assert_eq!(m["trmask/kl_frac_above_1e-4"], 3.0 / 22.0);
        assert_eq!(m["trmask/kl_frac_above_1e-3"], 2.0 / 22.0);
        // [0,16): 16 tokens of seq 0 (1e-5) + 2 of seq 1 (2e-3)
        assert!((m["trmask/kl_pos_0_16"] - (16.0 * 1e-5 + 4e-3) / 18.0).abs() < 1e-18);
        assert!((m["trmask/kl_pos_16_64"] - (3.0 * 1e-5 + 5e-4) / 4.0).abs() < 1e-18);
        assert!(!m.contains_key("trmask/kl_pos_64_256"));
    }
}
