//! Threshold sweeps (`Analysis::sweeps`): every point equals a direct recount, a run of the
//! same batch with that threshold, on both engines.

use serde_json::json;
use trmask::analysis::analyze;
use trmask::cpu::CpuEngine;
use trmask::{Batch, CorrectionConfig, Engine};

use crate::common;

/// `b` sequences of 1..=`t` valid tokens, trainer − rollout log-prob a mix of small noise and
/// a few large outliers.
fn batch(seed: u64, b: usize, t: usize) -> Batch {
    let mut rng = common::Rng::new(seed);
    let mut mask = Vec::new();
    let mut roll = Vec::new();
    let mut old = Vec::new();
    for _ in 0..b {
        let len = 1 + rng.below(t);
        let scale = [0.002, 0.02, 0.2][rng.below(3)];
        for j in 0..t {
            mask.push(if j < len { 1.0 } else { 0.0 });
            let x = rng.range(-4.0, -0.01);
            roll.push(x);
            let spike = if rng.bool(0.03) { 1.5 } else { 0.0 };
            old.push(x + scale * rng.range(-1.0, 1.0) + spike);
        }
    }
    Batch::padded(b, t, &mask)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll)
        .unwrap()
        .with_log_probs("old_log_prob", old)
        .unwrap()
        .build()
        .unwrap()
}

/// (rejected sequences, rejected tokens) of a run with `option` at `threshold`.
fn recount(engine: &dyn Engine, b: &Batch, option: &str, threshold: &str) -> (usize, usize) {
    let cfg = CorrectionConfig::from_json_value(
        &json!({"rollout_rs": option, "rollout_rs_threshold": threshold}),
    )
    .unwrap();
    let a = analyze(engine, b, &cfg).unwrap();
    let c = &a.corrections;
    let seqs = (0..c.seq_len.len())
        .filter(|&i| c.seq_len[i] > 0 && !c.seq_accept[i])
        .count();
    let mask = b.mask();
    let tokens = (0..mask.len())
        .filter(|&i| mask[i] && c.mask[i] == 0.0)
        .count();
    (seqs, tokens)
}

const OPTIONS: [(&str, &str); 7] = [
    ("seq_mean_k3", "0.001"),
    ("seq_sum_k2", "0.01"),
    ("seq_max_k2", "0.05"),
    ("token_k3", "0.01"),
    ("token_abs", "0.1"),
    ("seq_mean_k1", "0.999_1.002"),
    ("token_k1", "0.9_1.2"),
];

fn check_engine(engine: &dyn Engine, name: &str) {
    for seed in [1u64, 2, 3] {
        let b = batch(seed, 40, 24);
        let n_seqs = b.segments().lengths().iter().filter(|&&l| l > 0).count();
        let n_tokens = b.mask().iter().filter(|&&m| m).count();
        for (option, threshold) in OPTIONS {
            let cfg = CorrectionConfig::from_json_value(
                &json!({"rollout_rs": option, "rollout_rs_threshold": threshold}),
            )
            .unwrap();
            let a = analyze(engine, &b, &cfg).unwrap();
            assert_eq!(a.sweeps.len(), 1, "{option}");
            let s = &a.sweeps[0];
            assert_eq!(s.criterion, option);
            assert!(
                s.threshold.len() >= 40,
                "{name} {option}: {} points",
                s.threshold.len()
            );
            assert!(s.threshold.windows(2).all(|w| w[0] < w[1]), "{option}");
            // the fractions fall as the threshold rises
            assert!(s.rejected_seq_fraction.windows(2).all(|w| w[0] >= w[1]));
            let lower = threshold.split_once('_').map(|(l, _)| l);
            let mut varied = 0;
            for (k, &t) in s.threshold.iter().enumerate() {
                if k % 4 != 0 && k != s.threshold.len() - 1 {
                    continue;
                }
                let text = match lower {
                    Some(l) => format!("{l}_{t}"),
                    None => format!("{t}"),
                };
                let (seqs, tokens) = recount(engine, &b, option, &text);
                let want_s = seqs as f64 / n_seqs as f64;
                let want_t = tokens as f64 / n_tokens as f64;
                assert_eq!(
                    s.rejected_seq_fraction[k], want_s,
                    "{name} seed {seed} {option} at {t}: sequences"
                );
                assert_eq!(
                    s.rejected_token_fraction[k], want_t,
                    "{name} seed {seed} {option} at {t}: tokens"
                );
                varied += usize::from(seqs > 0 && seqs < n_seqs);
            }
            assert!(
                varied >= 2,
                "{name} {option}: the sweep never crosses the batch"
            );
            // the configured threshold's point is this run's own rejection
            let (seqs, _) = recount(engine, &b, option, threshold);
            assert_eq!(s.rejected_at(s.configured).0, seqs as f64 / n_seqs as f64);
        }
    }
}

#[test]
fn sweep_points_equal_a_recount_cpu() {
    check_engine(&CpuEngine::new(), "cpu");
}

#[test]
fn sweep_points_equal_a_recount_gpu() {
    let Some(gpu) = common::gpu() else {
        eprintln!("no GPU adapter: skipped");
        return;
    };
    check_engine(gpu.as_ref(), "gpu");
}

#[test]
fn no_criterion_no_sweep() {
    let a = analyze(
        &CpuEngine::new(),
        &batch(9, 4, 8),
        &CorrectionConfig::default(),
    )
    .unwrap();
    assert!(a.sweeps.is_empty());
}
