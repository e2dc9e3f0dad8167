//! `trmask::compare`: the Mann–Whitney p-value against an independent f64 computation, and a
//! batch against itself and against a copy with the trainer's log-probs offset, on both
//! engines.

use trmask::analysis::analyze;
use trmask::compare::{compare, mann_whitney};
use trmask::cpu::CpuEngine;
use trmask::{Batch, CorrectionConfig, Engine};

use crate::common;

#[test]
fn mann_whitney_matches_the_normal_approximation_oracle() {
    // ties included; the oracle: average ranks, tie-corrected variance, continuity 0.5 and
    // Python's math.erfc (scipy's mannwhitneyu(method="asymptotic") gives the same)
    let x = [0.1, 0.4, 0.4, 0.9, 1.3, 2.0, 2.0, 2.5, 3.1, 4.0];
    let y = [0.4, 1.1, 2.0, 2.7, 3.3, 3.9, 4.2, 5.0, 5.5, 6.1, 7.0];
    let want = 0.021759001358933636;
    for p in [mann_whitney(&x, &y), mann_whitney(&y, &x)] {
        assert!(((p - want) / want).abs() < 1e-6, "{p} vs {want}");
    }
    assert_eq!(mann_whitney(&x, &[]), 1.0);
    assert_eq!(mann_whitney(&[1.0, 1.0], &[1.0, 1.0, 1.0]), 1.0);
}

fn batch(seed: u64, offset: f64) -> Batch {
    let mut rng = common::Rng::new(seed);
    let (b, t) = (48, 12);
    let (mut mask, mut roll, mut old) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..b {
        let len = 1 + rng.below(t);
        for j in 0..t {
            mask.push(if j < len { 1.0 } else { 0.0 });
            let x = rng.range(-3.0, -0.3);
            roll.push(x);
            old.push(x + 0.05 * rng.range(-1.0, 1.0));
        }
    }
    let old: Vec<f64> = old.iter().map(|x| x + offset).collect();
    Batch::padded(b, t, &mask)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll)
        .unwrap()
        .with_log_probs("old_log_prob", old)
        .unwrap()
        .build()
        .unwrap()
}

fn check(engine: &dyn Engine, name: &str) {
    let cfg = CorrectionConfig::from_json_value(
        &serde_json::json!({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 6e-4}),
    )
    .unwrap();
    let a = analyze(engine, &batch(3, 0.0), &cfg).unwrap();
    let same = compare(&a, &analyze(engine, &batch(3, 0.0), &cfg).unwrap());
    assert!(
        same.verdict.starts_with("verdict: no shift"),
        "{name}: {}",
        same.verdict
    );
    for s in &same.stats {
        assert_eq!(s.shift, 0.0, "{name} {}", s.statistic);
        assert!(s.p_value > 0.9, "{name} {}", s.statistic);
        assert_eq!(s.a, s.b);
    }
    assert!(same.rejected.iter().all(|r| r.delta == 0.0));
    let off = compare(&a, &analyze(engine, &batch(3, 0.03), &cfg).unwrap());
    let lr = off
        .stats
        .iter()
        .find(|s| s.statistic == "log_ratio")
        .unwrap();
    // f32 log-ratios on the GPU: the shift to f32 rounding of the values
    assert!((lr.shift - 0.03).abs() < 1e-6, "{name}: {}", lr.shift);
    assert!(lr.p_value < 1e-6, "{name}: {}", lr.p_value);
    let k3 = off.stats.iter().find(|s| s.statistic == "k3").unwrap();
    assert!(
        k3.shift > 0.0 && k3.p_value < trmask::compare::ALPHA,
        "{name}: k3 {} {}",
        k3.shift,
        k3.p_value
    );
    assert!(
        off.verdict.contains("B's mismatch is larger than A's"),
        "{}",
        off.verdict
    );
    let any = off.rejected.iter().find(|r| r.criterion == "any").unwrap();
    assert!(any.delta > 0.0, "{name}: {any:?}");
}

#[test]
fn self_and_offset_cpu() {
    check(&CpuEngine::new(), "cpu");
}

#[test]
fn self_and_offset_gpu() {
    let Some(gpu) = common::gpu() else {
        eprintln!("no GPU adapter: skipped");
        return;
    };
    check(gpu.as_ref(), "gpu");
}
