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
//! parallel ranks merge to the single process's numbers. The one accumulator behind them is
//! `metrics::diag`.

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
