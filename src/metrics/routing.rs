//! `trmask/routing/*`: where the rollout engine and the trainer routed tokens to different
//! experts and what those tokens carry, as mergeable partials (integer counts and compensated
//! sums, so data-parallel ranks merge to the single-process numbers).

use crate::input::routing::RouteTokens;
use crate::partial::{Acc, Empty, FracMode, Partial, Sum};

/// The metric prefix.
pub const PREFIX: &str = "trmask/routing/";

/// The per-layer overlap metric of layer `l` (0-based).
pub fn layer_key(l: usize) -> String {
    format!("{PREFIX}layer/{l}/overlap_mean")
}

/// Puts the routing metrics of one shard into `m`, from the routing outputs `r` and, where the
/// batch has log-probs, the statistics table's `log_ratio` and `k3` columns (0 at padding):
///
/// * `overlap_mean`: mean `o_{t,l}` over recorded (token, layer) pairs; `layer/<l>/overlap_mean`
///   per layer;
/// * `token_flip_fraction`: flipped ÷ recorded tokens;
/// * `unrecorded_fraction`: (token, layer) pairs with a −1 on either side ÷ all valid pairs;
/// * `abs_log_ratio_flipped_mean` / `abs_log_ratio_unflipped_mean`: mean |log ρ_t| over the
///   recorded flipped / unflipped tokens (absent when the group is empty);
/// * `k3_share_flipped`: Σ k3 over flipped tokens ÷ Σ k3 over recorded tokens.
pub fn routing_metrics(
    r: &RouteTokens,
    log_ratio: Option<&[f64]>,
    k3: Option<&[f64]>,
    mask: &[bool],
    m: &mut Partial,
) {
    let k = r.top_k as u64;
    let frac = |a: u64, b: u64| Acc::Frac {
        k: a,
        n: b,
        mode: FracMode::F64,
        empty: Empty::Absent,
    };
    let inter: u64 = r.layer_intersections.iter().sum();
    let pairs: u64 = r.layer_pairs.iter().sum();
    m.put(format!("{PREFIX}overlap_mean"), frac(inter, k * pairs));
    for (l, (&i, &p)) in r.layer_intersections.iter().zip(&r.layer_pairs).enumerate() {
        m.put(layer_key(l), frac(i, k * p));
    }
    let all_pairs = r.valid_tokens * r.layers() as u64;
    m.put(
        format!("{PREFIX}unrecorded_fraction"),
        frac(all_pairs - pairs, all_pairs),
    );
    let valid = |i: &usize| mask[*i] && r.recorded[*i] > 0.0;
    let recorded = (0..mask.len()).filter(valid).count() as u64;
    let flipped = (0..mask.len())
        .filter(|i| valid(i) && r.flip[*i] > 0.0)
        .count() as u64;
    m.put(
        format!("{PREFIX}token_flip_fraction"),
        frac(flipped, recorded),
    );
    if let Some(lr) = log_ratio {
        for (name, f) in [("flipped", 1.0), ("unflipped", 0.0)] {
            let v: Vec<f64> = (0..mask.len())
                .filter(|i| valid(i) && r.flip[*i] == f)
                .map(|i| lr[i].abs())
                .collect();
            m.put(
                format!("{PREFIX}abs_log_ratio_{name}_mean"),
                Acc::mean(&v, Empty::Absent),
            );
        }
    }
    if let Some(k3) = k3 {
        let rec = (0..mask.len()).filter(valid);
        m.put(
            format!("{PREFIX}k3_share_flipped"),
            Acc::Ratio {
                num: Sum::of(rec.clone().filter(|&i| r.flip[i] > 0.0).map(|i| k3[i])),
                den: Sum::of(rec.map(|i| k3[i])),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::routing::Routing;

    #[test]
    fn metrics_of_a_small_batch() {
        // 4 slots (slot 3 padding), L = 2, K = 2
        let mask = [true, true, true, false];
        let roll = [
            1, 2, 3, 4, /**/ 1, 2, 3, 4, /**/ -1, 2, 3, 4, /**/ 9, 9, 9, 9,
        ];
        let old = [
            2, 1, 3, 4, /**/ 1, 5, 3, 4, /**/ 1, 2, 3, 6, /**/ 0, 0, 0, 0,
        ];
        let pos = |i: usize| format!("[{i}]");
        let r = Routing::new(&roll, &old, 2, 2, &mask, &pos)
            .unwrap()
            .token_stats()
            .clone();
        let lr = [0.1, -0.4, 0.2, f64::NAN];
        let k3 = [0.01, 0.1, 0.02, f64::NAN];
        let mut p = Partial::new();
        routing_metrics(&r, Some(&lr), Some(&k3), &mask, &mut p);
        let m = p.finish().unwrap();
        // pairs: t0 (2,2) t1 (1,2) t2 layer 1 only (1) → inter 8 of 5 pairs × 2
        assert_eq!(m["trmask/routing/overlap_mean"], 8.0 / 10.0);
        assert_eq!(m["trmask/routing/layer/0/overlap_mean"], 3.0 / 4.0);
        assert_eq!(m["trmask/routing/layer/1/overlap_mean"], 5.0 / 6.0);
        assert_eq!(m["trmask/routing/unrecorded_fraction"], 1.0 / 6.0);
        assert_eq!(m["trmask/routing/token_flip_fraction"], 2.0 / 3.0);
        let near = |k: &str, v: f64| assert!((m[k] - v).abs() < 1e-15, "{k}: {}", m[k]);
        near("trmask/routing/abs_log_ratio_flipped_mean", 0.3);
        near("trmask/routing/abs_log_ratio_unflipped_mean", 0.1);
        near("trmask/routing/k3_share_flipped", 0.12 / 0.13);
    }
}
