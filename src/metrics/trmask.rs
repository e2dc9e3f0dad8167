//! trmask's own `trmask/*` metrics: acceptance, lengths, per-criterion rejection, weights, and
//! the shares and position buckets of exact divergences.

use super::ctx::{mean, Ctx};
use super::diagnostics::position_means;
use crate::batch::Segments;
use crate::error::Result;
use crate::stats::CriterionResult;
use std::collections::BTreeMap;

/// Exact divergences that get threshold shares and position buckets (see
/// [`divergence_metrics`]).
pub const DIVERGENCES: [&str; 5] = ["kl", "kl_rev", "tv", "topk_kl", "topk_tv"];

/// For an exact per-token divergence `name`: `trmask/<name>_frac_above_1e-4` and `_1e-3`
/// (share of valid tokens strictly above), and `trmask/<name>_pos_<lo>_<hi>` — the mean over
/// valid tokens whose position t in their response (0-based, counting valid tokens) lies in
/// `[lo, hi)`, for the buckets of [`POSITION_BUCKETS`](super::diagnostics::POSITION_BUCKETS) that hold a token (the last is named
/// `_pos_4096_inf`). Long responses drift more; this shows where.
pub fn divergence_metrics(
    name: &str,
    v: &[f64],
    segments: &Segments,
    metrics: &mut BTreeMap<String, f64>,
) {
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
    if n == 0 {
        return;
    }
    metrics.insert(
        format!("trmask/{name}_frac_above_1e-4"),
        above[0] as f64 / n as f64,
    );
    metrics.insert(
        format!("trmask/{name}_frac_above_1e-3"),
        above[1] as f64 / n as f64,
    );
}

/// Linear-interpolation percentile (numpy's default) of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn ess(v: &[f64]) -> f64 {
    let s: f64 = v.iter().sum();
    let s2: f64 = v.iter().map(|x| x * x).sum();
    if s2 > 0.0 {
        s * s / (v.len() as f64 * s2)
    } else {
        0.0
    }
}

pub(crate) fn trmask_metrics(
    ctx: &Ctx,
    criteria: &[CriterionResult],
    seq_accept: &[bool],
    seq_len: &[usize],
    final_mask: &[f64],
    weights: Option<&[f64]>,
    m: &mut BTreeMap<String, f64>,
) -> Result<()> {
    let nonempty: Vec<usize> = (0..ctx.b).filter(|&i| seq_len[i] > 0).collect();
    let ne = nonempty.len() as f64;
    let rejected = nonempty.iter().filter(|&&i| !seq_accept[i]).count();
    m.insert("trmask/reject_rate".into(), rejected as f64 / ne);
    for c in criteria {
        let k = nonempty.iter().filter(|&&i| c.seq_reject[i]).count();
        m.insert(format!("trmask/reject_rate/{}", c.name), k as f64 / ne);
    }
    let kept: f64 = final_mask.iter().sum();
    m.insert("trmask/token_reject_rate".into(), 1.0 - kept / ctx.n);
    let mut lens = |prefix: &str, idx: Vec<usize>| {
        if idx.is_empty() {
            return;
        }
        let mut v: Vec<f64> = idx.iter().map(|&i| seq_len[i] as f64).collect();
        v.sort_by(f64::total_cmp);
        m.insert(format!("trmask/{prefix}_mean"), mean(&v));
        m.insert(format!("trmask/{prefix}_p50"), percentile(&v, 0.5));
        m.insert(format!("trmask/{prefix}_p90"), percentile(&v, 0.9));
        m.insert(format!("trmask/{prefix}_max"), v[v.len() - 1]);
    };
    lens("seq_len", nonempty.clone());
    lens(
        "accepted_seq_len",
        nonempty
            .iter()
            .copied()
            .filter(|&i| seq_accept[i])
            .collect(),
    );
    if let Some(w) = weights {
        // final weights on the tokens the final mask keeps
        let wk = ctx.tok(|i| w[i] * final_mask[i]);
        let s = ctx.reduce(&wk)?;
        let kept_tok: Vec<f64> = (0..w.len())
            .filter(|&i| ctx.mask[i] && final_mask[i] > 0.0)
            .map(|i| w[i])
            .collect();
        if !kept_tok.is_empty() {
            m.insert("trmask/ess_token".into(), ess(&kept_tok));
        }
        let cnt = ctx.reduce(final_mask)?;
        let seq_w: Vec<f64> = (0..ctx.b)
            .filter(|&i| cnt.sum[i] > 0.0)
            .map(|i| s.sum[i] / cnt.sum[i])
            .collect();
        if !seq_w.is_empty() {
            m.insert("trmask/ess_seq".into(), ess(&seq_w));
        }
    }
    Ok(())
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
        let mut m = BTreeMap::new();
        divergence_metrics("kl", &v, &segments, &mut m);
        assert_eq!(m["trmask/kl_frac_above_1e-4"], 3.0 / 22.0);
        assert_eq!(m["trmask/kl_frac_above_1e-3"], 2.0 / 22.0);
        // [0,16): 16 tokens of seq 0 (1e-5) + 2 of seq 1 (2e-3)
        assert!((m["trmask/kl_pos_0_16"] - (16.0 * 1e-5 + 4e-3) / 18.0).abs() < 1e-18);
        assert!((m["trmask/kl_pos_16_64"] - (3.0 * 1e-5 + 5e-4) / 4.0).abs() < 1e-18);
        assert!(!m.contains_key("trmask/kl_pos_64_256"));
    }
}
