//! The breakdowns practitioners ask for, as mergeable `trmask/*` metrics:
//!
//! * rejections by advantage sign (when advantages are given): `trmask/adv_{pos,neg,zero}/…`
//!   — the share of valid tokens with that sign (`token_fraction`), the share of them the
//!   corrections rejected (`rejected_fraction`), and per sequence (sign of the sequence's mean
//!   advantage) the share rejected (`seq_rejected_fraction`);
//! * the mismatch by the sampled token's rollout probability (`trmask/by_prob/<bucket>/…`) and,
//!   when logits give it, by the trainer's entropy (`trmask/by_entropy/<bucket>/…`): mean k3,
//!   mean log-ratio and the bucket's share of the valid tokens;
//! * per turn of multi-turn responses — a turn is a contiguous run of valid tokens
//!   (`response_mask` segments) within a sequence: `trmask/turns_{mean,max}` per sequence with a
//!   valid token, and per turn index `trmask/turn/<k>/…` (k = 1…7, then `8+`): mean k3, mean
//!   log-ratio, rejected share, share of the valid tokens.
//!
//! Every key is written on every rank (a bucket with no token finishes to nothing), so data-
//! parallel ranks merge to the single process's numbers.

use crate::input::batch::Batch;
use crate::partial::{Acc, Empty, FracMode, Partial, Sum};
use crate::stats::{Corrections, StatTable};

/// Bucket edges of the sampled token's rollout probability and their labels.
pub const PROB_BUCKETS: [(f64, &str); 5] = [
    (0.01, "0-0.01"),
    (0.1, "0.01-0.1"),
    (0.5, "0.1-0.5"),
    (0.9, "0.5-0.9"),
    (f64::INFINITY, "0.9-1"),
];

/// Bucket edges of the trainer's entropy (nats) and their labels.
pub const ENTROPY_BUCKETS: [(f64, &str); 5] = [
    (0.5, "0-0.5"),
    (1.0, "0.5-1"),
    (2.0, "1-2"),
    (4.0, "2-4"),
    (f64::INFINITY, "4+"),
];

/// Turn indices reported one by one; later turns are pooled under `8+`.
pub const TURNS: usize = 7;

/// The label of turn index `k` (0-based).
pub fn turn_label(k: usize) -> String {
    if k < TURNS {
        (k + 1).to_string()
    } else {
        format!("{}+", TURNS + 1)
    }
}

/// Per-group tallies: Σk3, Σlog-ratio, tokens, rejected tokens.
#[derive(Clone, Default)]
struct Tally {
    k3: Vec<f64>,
    lr: Vec<f64>,
    rejected: usize,
}

impl Tally {
    fn add(&mut self, k3: f64, lr: f64, rejected: bool) {
        self.k3.push(k3);
        self.lr.push(lr);
        self.rejected += rejected as usize;
    }
    fn n(&self) -> usize {
        self.k3.len()
    }
    fn put(&self, p: &mut Partial, prefix: &str, valid: usize, rejected: bool) {
        let mean = |v: &[f64]| Acc::Mean {
            sum: Sum::of(v.iter().copied()),
            n: v.len() as u64,
            offset: 0.0,
            empty: Empty::Absent,
        };
        p.put(format!("{prefix}/k3_mean"), mean(&self.k3));
        p.put(format!("{prefix}/log_ratio_mean"), mean(&self.lr));
        // the share of the valid tokens (0 for an empty group; absent without valid tokens)
        p.put(
            format!("{prefix}/token_fraction"),
            Acc::frac(self.n(), valid, FracMode::F64, Empty::Absent),
        );
        if rejected {
            p.put(
                format!("{prefix}/rejected_fraction"),
                Acc::frac(self.rejected, self.n(), FracMode::F64, Empty::Absent),
            );
        }
    }
}

fn bucket(edges: &[(f64, &str)], x: f64) -> usize {
    edges
        .iter()
        .position(|(hi, _)| x < *hi)
        .unwrap_or(edges.len() - 1)
}

/// The breakdown metrics of one shard (`table` holds `k3`, `log_ratio`, `rollout_log_prob`
/// and, from logits, `training_entropy`; `c` the shard's corrections).
pub(crate) fn breakdown_partial(batch: &Batch, table: &StatTable, c: &Corrections) -> Partial {
    let mut p = Partial::new();
    let (Some(k3), Some(lr)) = (table.stats.get("k3"), table.stats.get("log_ratio")) else {
        return p;
    };
    let mask = batch.mask();
    let valid = mask.iter().filter(|&&m| m).count();
    let rejected = |i: usize| c.mask.get(i).is_some_and(|&m| m == 0.0);
    // by rollout probability and trainer entropy
    let groups = [
        (
            "by_prob",
            table.stats.get("rollout_log_prob"),
            &PROB_BUCKETS,
            true,
        ),
        (
            "by_entropy",
            table.stats.get("training_entropy"),
            &ENTROPY_BUCKETS,
            false,
        ),
    ];
    for (name, source, edges, is_log) in groups {
        let Some(v) = source else { continue };
        let mut t = vec![Tally::default(); edges.len()];
        for i in (0..mask.len()).filter(|&i| mask[i]) {
            let x = if is_log { v[i].exp() } else { v[i] };
            t[bucket(edges, x)].add(k3[i], lr[i], rejected(i));
        }
        for (tally, (_, label)) in t.iter().zip(edges.iter()) {
            tally.put(&mut p, &format!("trmask/{name}/{label}"), valid, false);
        }
    }
    // by advantage sign: tokens, and sequences by the sign of their mean advantage
    if let Some(adv) = batch.advantages.as_deref() {
        let mut t = vec![Tally::default(); 3];
        let mut seqs = [(0usize, 0usize); 3];
        let sign = |a: f64| {
            if a > 0.0 {
                0
            } else if a < 0.0 {
                1
            } else {
                2
            }
        };
        for (s, &(a, b)) in batch.segments().ranges().iter().enumerate() {
            let idx: Vec<usize> = (a..b).filter(|&i| mask[i]).collect();
            for &i in &idx {
                t[sign(adv[i])].add(k3[i], lr[i], rejected(i));
            }
            if !idx.is_empty() {
                let mean = idx.iter().map(|&i| adv[i]).sum::<f64>() / idx.len() as f64;
                let g = &mut seqs[sign(mean)];
                g.0 += 1;
                g.1 += !c.seq_accept.get(s).copied().unwrap_or(true) as usize;
            }
        }
        for (g, label) in ["pos", "neg", "zero"].iter().enumerate() {
            let prefix = format!("trmask/adv_{label}");
            t[g].put(&mut p, &prefix, valid, true);
            p.put(
                format!("{prefix}/seq_rejected_fraction"),
                Acc::frac(seqs[g].1, seqs[g].0, FracMode::F64, Empty::Absent),
            );
        }
    }
    // per turn: contiguous runs of valid tokens within a sequence
    let mut t = vec![Tally::default(); TURNS + 1];
    let mut turns = Vec::new();
    for &(a, b) in batch.segments().ranges() {
        let mut k = 0usize;
        for i in a..b {
            if !mask[i] {
                continue;
            }
            if i == a || !mask[i - 1] {
                k += 1;
            }
            t[(k - 1).min(TURNS)].add(k3[i], lr[i], rejected(i));
        }
        if k > 0 {
            turns.push(k as f64);
        }
    }
    p.put("trmask/turns_mean", Acc::mean(&turns, Empty::Absent));
    p.put(
        "trmask/turns_max",
        Acc::max(turns.iter().copied(), Empty::Absent),
    );
    for (k, tally) in t.iter().enumerate() {
        tally.put(
            &mut p,
            &format!("trmask/turn/{}", turn_label(k)),
            valid,
            true,
        );
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partial::Partial;

    fn table(k3: &[f64], lr: &[f64], lp: &[f64]) -> StatTable {
        let mut stats = std::collections::BTreeMap::new();
        stats.insert("k3".to_string(), k3.to_vec());
        stats.insert("log_ratio".to_string(), lr.to_vec());
        stats.insert("rollout_log_prob".to_string(), lp.to_vec());
        StatTable {
            stats,
            ..StatTable::default()
        }
    }

    #[test]
    fn turns_signs_and_buckets_by_hand() {
        // one row of 7 slots: turns [0, 2), [3, 4), [5, 7); row 2 one turn
        let mask = [1., 1., 0., 1., 0., 1., 1., 1., 1., 0., 0., 0., 0., 0.];
        let batch = Batch::padded(2, 7, &mask)
            .unwrap()
            .with_log_probs(
                "advantages",
                vec![1.0; 7].into_iter().chain(vec![-2.0; 7]).collect(),
            )
            .unwrap();
        let k3: Vec<f64> = (0..14).map(|i| i as f64).collect();
        let lr: Vec<f64> = (0..14).map(|i| -(i as f64)).collect();
        let lp: Vec<f64> = (0..14)
            .map(|i| if i % 2 == 0 { -0.01 } else { -3.0 })
            .collect();
        let c = Corrections {
            weights: None,
            mask: mask
                .iter()
                .enumerate()
                .map(|(i, &m)| if i == 5 { 0.0 } else { m })
                .collect(),
            seq_accept: vec![false, true],
            seq_len: vec![5, 2],
            seq_reject_bits: vec![1, 0],
            criteria: vec![],
            metrics: Default::default(),
        };
        let m = breakdown_partial(&batch, &table(&k3, &lr, &lp), &c)
            .finish()
            .unwrap();
        assert_eq!(m["trmask/turns_max"], 3.0);
        assert_eq!(m["trmask/turns_mean"], 2.0);
        assert_eq!(m["trmask/turn/1/k3_mean"], (0.0 + 1.0 + 7.0 + 8.0) / 4.0);
        assert_eq!(m["trmask/turn/2/k3_mean"], 3.0);
        assert_eq!(m["trmask/turn/3/k3_mean"], 5.5);
        assert_eq!(m["trmask/turn/3/rejected_fraction"], 0.5);
        assert_eq!(m["trmask/turn/1/token_fraction"], 4.0 / 7.0);
        assert!(!m.contains_key("trmask/turn/4/k3_mean"));
        assert_eq!(m["trmask/adv_pos/token_fraction"], 5.0 / 7.0);
        assert_eq!(m["trmask/adv_pos/rejected_fraction"], 0.2);
        assert_eq!(m["trmask/adv_neg/rejected_fraction"], 0.0);
        assert_eq!(m["trmask/adv_pos/seq_rejected_fraction"], 1.0);
        assert_eq!(m["trmask/adv_neg/seq_rejected_fraction"], 0.0);
        assert_eq!(m["trmask/adv_zero/token_fraction"], 0.0);
        assert!(!m.contains_key("trmask/adv_zero/k3_mean"));
        // p = e^-0.01 ≈ 0.99 at even slots, e^-3 ≈ 0.05 at odd ones
        // valid slots 0, 1, 3, 5, 6, 7, 8
        assert_eq!(m["trmask/by_prob/0.9-1/k3_mean"], (0.0 + 6.0 + 8.0) / 3.0);
        assert_eq!(
            m["trmask/by_prob/0.01-0.1/log_ratio_mean"],
            -(1.0 + 3.0 + 5.0 + 7.0) / 4.0
        );
        assert!(!m.keys().any(|k| k.starts_with("trmask/by_entropy")));
        // no advantages: no sign split; an empty shard writes the same keys
        let plain = Batch::padded(2, 7, &mask).unwrap();
        let m = breakdown_partial(&plain, &table(&k3, &lr, &lp), &c)
            .finish()
            .unwrap();
        assert!(!m.keys().any(|k| k.starts_with("trmask/adv_")));
        let empty = Batch::padded(0, 7, &[]).unwrap();
        let none = Corrections {
            mask: vec![],
            seq_accept: vec![],
            ..c.clone()
        };
        let e = breakdown_partial(&empty, &table(&[], &[], &[]), &none);
        let full = breakdown_partial(&plain, &table(&k3, &lr, &lp), &c);
        let mut merged = Partial::new();
        merged.merge(&e).unwrap();
        merged.merge(&full).unwrap();
        assert_eq!(merged.finish().unwrap(), full.finish().unwrap());
    }
}
