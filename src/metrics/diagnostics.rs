//! Length-aware and GRPO-group diagnostics (`trmask/*`), from log-probs alone: per-position
//! bucket means of the sampled-token estimators, rejection rate by response length, the
//! correlation of length with each criterion's sequence statistic, and what rejection leaves
//! of each prompt's group.

use crate::input::batch::Segments;
use crate::partial::{Acc, Empty, FracMode, Partial, Sum};
use std::collections::BTreeMap;

/// Upper ends of the response-position (and length) buckets of `trmask/<stat>_pos_<lo>_<hi>`
/// and `trmask/reject_rate_len_<lo>_<hi>`.
pub const POSITION_BUCKETS: [usize; 6] = [16, 64, 256, 1024, 4096, usize::MAX];

/// `lo_hi` bucket names of [`POSITION_BUCKETS`] (`4096_inf` for the last).
fn bucket_names() -> Vec<String> {
    let mut lo = 0usize;
    POSITION_BUCKETS
        .iter()
        .map(|&hi| {
            let h = if hi == usize::MAX {
                "inf".to_string()
            } else {
                hi.to_string()
            };
            let name = format!("{lo}_{h}");
            lo = hi;
            name
        })
        .collect()
}

/// The bucket of [`POSITION_BUCKETS`] holding `x` (`[lo, hi)`).
pub(crate) fn bucket_of(x: usize) -> usize {
    POSITION_BUCKETS
        .iter()
        .position(|&hi| x < hi)
        .unwrap_or(POSITION_BUCKETS.len() - 1)
}

/// `trmask/<name>_pos_<lo>_<hi>`: the mean of `v` over valid tokens whose position t in their
/// response (0-based, counting valid tokens) lies in `[lo, hi)`, for the buckets that hold a
/// token; also `trmask/<name>_mean` over every valid token when `with_mean`. Returns the
/// number of valid tokens.
pub(crate) fn position_means(
    name: &str,
    v: &[f64],
    segments: &Segments,
    with_mean: bool,
    metrics: &mut Partial,
) -> usize {
    let nb = POSITION_BUCKETS.len();
    let (mut sum, mut cnt) = ([Sum::default(); 6], [0u64; 6]);
    for &(a, b) in segments.ranges() {
        let valid = v[a..b]
            .iter()
            .zip(&segments.mask()[a..b])
            .filter(|(_, &m)| m);
        for (t, (&x, _)) in valid.enumerate() {
            let k = bucket_of(t);
            sum[k].add(x);
            cnt[k] += 1;
        }
    }
    debug_assert_eq!(nb, sum.len());
    put_position_means(name, &sum, &cnt, with_mean, metrics) as usize
}

/// The metrics of [`position_means`] from each bucket's sum and count (the one place they are
/// written: the fused pass's diagnostics and the exact divergences both come here).
pub(crate) fn put_position_means(
    name: &str,
    sum: &[Sum; 6],
    cnt: &[u64; 6],
    with_mean: bool,
    metrics: &mut Partial,
) -> u64 {
    let mean = |sum: Sum, n: u64| Acc::Mean {
        sum,
        n,
        offset: 0.0,
        empty: Empty::Absent,
    };
    for (k, bucket) in bucket_names().iter().enumerate() {
        metrics.put(format!("trmask/{name}_pos_{bucket}"), mean(sum[k], cnt[k]));
    }
    let n: u64 = cnt.iter().sum();
    if with_mean {
        let mut all = Sum::default();
        sum.iter().for_each(|s| all.merge(*s));
        metrics.put(format!("trmask/{name}_mean"), mean(all, n));
    }
    n
}

/// Pearson correlation of `x` and `y` (`None` with fewer than 2 points or a constant side).
#[cfg(test)]
pub(crate) fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
    let mut p = Partial::new();
    p.put("r", Acc::co_moments(x, y));
    p.finish_one("r").ok().flatten()
}

/// Length-aware diagnostics over non-empty sequences: `trmask/reject_rate_len_<lo>_<hi>`
/// (share of the sequences whose valid length lies in `[lo, hi)` that were rejected, for
/// buckets holding a sequence) and `trmask/len_corr/<criterion>` (Pearson correlation of the
/// valid length with the criterion's per-sequence statistic; absent when undefined). The
/// per-position estimator means come from the diagnostics accumulator (`metrics::diag`).
pub(crate) fn length_metrics(
    len: &[usize],
    seq_accept: &[bool],
    criteria: &[(&str, &[f64])],
    m: &mut Partial,
) {
    let nonempty: Vec<usize> = (0..len.len()).filter(|&i| len[i] > 0).collect();
    let nb = POSITION_BUCKETS.len();
    let (mut rej, mut cnt) = (vec![0usize; nb], vec![0usize; nb]);
    for &i in &nonempty {
        let k = bucket_of(len[i]);
        cnt[k] += 1;
        rej[k] += usize::from(!seq_accept[i]);
    }
    for (k, bucket) in bucket_names().iter().enumerate() {
        m.put(
            format!("trmask/reject_rate_len_{bucket}"),
            Acc::frac(rej[k], cnt[k], FracMode::F64, Empty::Absent),
        );
    }
    let x: Vec<f64> = nonempty.iter().map(|&i| len[i] as f64).collect();
    for (name, stat) in criteria {
        let y: Vec<f64> = nonempty.iter().map(|&i| stat[i]).collect();
        m.put(format!("trmask/len_corr/{name}"), Acc::co_moments(&x, &y));
    }
}

/// GRPO group effects of rejection, with `uid` the group id of each sequence (every sequence,
/// empty ones included, is a member; a sequence is rejected when `seq_accept` is false):
/// `trmask/group_rejected_fraction` (groups with at least one rejected sequence),
/// `trmask/group_fully_rejected_fraction`, `trmask/group_degenerate_fraction` (groups left
/// with fewer than 2 accepted sequences: no within-group baseline) and
/// `trmask/group_accepted_size_mean`; plus `trmask/num_groups`.
pub(crate) fn group_metrics(uid: &[i64], seq_accept: &[bool], m: &mut Partial) {
    // group → (size, accepted)
    let mut groups: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    for (&g, &a) in uid.iter().zip(seq_accept) {
        let e = groups.entry(g).or_default();
        e.0 += 1;
        e.1 += u64::from(a);
    }
    m.put("trmask/", Acc::Groups(groups));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pearson_edges() {
        assert_eq!(pearson(&[1.0], &[2.0]), None);
        assert_eq!(pearson(&[1.0, 2.0], &[3.0, 3.0]), None);
        let r = pearson(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.5]).unwrap();
        assert!(r > 0.99 && r <= 1.0);
        assert_eq!(pearson(&[1.0, 2.0], &[2.0, 1.0]), Some(-1.0));
    }

    #[test]
    fn groups_by_hand() {
        // groups 7: {acc, rej, acc}, 3: {rej, rej}, 5: {acc}
        let uid = [7, 3, 7, 5, 3, 7];
        let acc = [true, false, false, true, false, true];
        let mut p = Partial::new();
        group_metrics(&uid, &acc, &mut p);
        let m = p.finish().unwrap();
        assert_eq!(m["trmask/num_groups"], 3.0);
        assert_eq!(m["trmask/group_rejected_fraction"], 2.0 / 3.0);
        assert_eq!(m["trmask/group_fully_rejected_fraction"], 1.0 / 3.0);
        assert_eq!(m["trmask/group_degenerate_fraction"], 2.0 / 3.0);
        assert_eq!(m["trmask/group_accepted_size_mean"], 1.0);
    }
}
