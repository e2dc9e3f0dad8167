//! Bad shapes through the public engine API give the same verdict on both engines: an `Err`
//! naming the tensor, never a panic (the CPU reference used to index and slice unchecked).

use crate::common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use trmask::cpu::CpuEngine;
use trmask::{Batch, Engine, Logits};

fn engines() -> Vec<(String, std::sync::Arc<dyn Engine>)> {
    let mut v: Vec<(String, std::sync::Arc<dyn Engine>)> =
        vec![("cpu".into(), std::sync::Arc::new(CpuEngine::new()))];
    if let Some(g) = common::gpu() {
        v.push(("gpu".into(), g));
    }
    v
}

/// Runs `f`, failing the test on a panic; returns the error text (or "ok").
fn verdict<T>(what: &str, f: impl FnOnce() -> trmask::Result<T>) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(_)) => "ok".into(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("{what}: panicked instead of returning an error"),
    }
}

#[test]
fn token_stats_length_mismatch_is_an_error_on_both_engines() {
    let mask = vec![true; 5];
    for (name, e) in engines() {
        let short = verdict(&name, || e.token_stats(&[0.0; 5], &[0.0; 3], &mask));
        assert!(short.contains("has 3 values"), "{name}: {short}");
        let long = verdict(&name, || e.token_stats(&[0.0; 7], &[0.0; 5], &mask));
        assert!(long.contains("has 7 values"), "{name}: {long}");
    }
}

#[test]
fn segment_reduce_length_mismatch_is_an_error_on_both_engines() {
    let batch = Batch::padded(2, 3, &[1.0; 6]).unwrap().build().unwrap();
    let segs = batch.segments();
    for (name, e) in engines() {
        let short = [1.0; 4];
        let v = verdict(&name, || e.segment_reduce(&[&short], segs));
        assert!(
            v.contains("values[0]") && v.contains("has 4 values"),
            "{name}: {v}"
        );
        let good = [1.0; 6];
        let v = verdict(&name, || e.segment_reduce(&[&good, &short], segs));
        assert!(v.contains("values[1]"), "{name}: {v}");
        let v = verdict(&name, || e.segment_reduce(&[&good], segs));
        assert_eq!(v, "ok", "{name}");
    }
}

#[test]
fn corrections_pass_and_vocab_mismatches_are_errors_on_both_engines() {
    let batch = Batch::padded(2, 2, &[1.0; 4]).unwrap().build().unwrap();
    let plan = Default::default();
    let logits = Logits::from_f32(&[0.0; 8], 2, 4).unwrap();
    let other = Logits::from_f32(&[0.0; 12], 3, 4).unwrap();
    for (name, e) in engines() {
        let v = verdict(&name, || {
            e.corrections_pass(&[0.0; 3], batch.segments(), &plan)
        });
        assert!(v.contains("has 3 values"), "{name}: {v}");
        let v = verdict(&name, || {
            e.vocab_divergence(&logits, &other, None, &[true; 2], 1.0)
        });
        assert_ne!(v, "ok", "{name}: mismatched logits rows accepted");
        let v = verdict(&name, || {
            e.vocab_divergence(&logits, &logits, Some(&[0]), &[true; 2], 1.0)
        });
        assert_ne!(v, "ok", "{name}: short responses accepted");
        let v = verdict(&name, || {
            e.vocab_divergence(&logits, &logits, None, &[true; 3], 1.0)
        });
        assert_ne!(v, "ok", "{name}: mask longer than the rows accepted");
    }
}

/// The engine's `topk_divergence` passes its inputs' errors on and, on the CPU, gives the
/// free function's statistics (the `Engine` glue of `cpu/mod.rs`; no other CPU-engine test
/// reaches it outside the CLI).
#[test]
fn topk_divergence_errors_on_both_engines_and_the_cpu_engine_is_the_reference() {
    use trmask::topk::{topk_divergence, TopkSupport, TrainerTopk};
    let logits: Vec<f32> = (0..3 * 6).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
    let batch = |lps: Vec<f64>| {
        Batch::padded(1, 3, &[1.0; 3])
            .unwrap()
            .with_responses(vec![0, 1, 5])
            .unwrap()
            .with_log_probs("rollout_log_prob", vec![-1.0, -1.0, -3.0])
            .unwrap()
            .with_topk(vec![0, 1, 1, 2, 3, 4], lps, 2)
            .unwrap()
            .with_logits("old_logits", Logits::from_f32(&logits, 3, 6).unwrap())
            .unwrap()
            .build()
            .unwrap()
    };
    let good = batch(vec![-0.5, -1.5, -0.9, -1.1, -0.2, -2.5]);
    let bad = batch(vec![-0.5, f64::NAN, -0.9, -1.1, -0.2, -2.5]);
    let run = |e: &dyn Engine, b: &Batch| {
        e.topk_divergence(
            b,
            TopkSupport::Union,
            TrainerTopk::from_batch(b, 1.0).unwrap(),
        )
    };
    let want = topk_divergence(
        &good,
        TopkSupport::Union,
        TrainerTopk::from_batch(&good, 1.0).unwrap(),
    )
    .unwrap();
    assert!(want.topk_kl.iter().all(|&v| v > 0.0), "{want:?}");
    for (name, e) in engines() {
        let v = verdict(&name, || run(&*e, &bad));
        assert!(
            v.contains("rollout_topk_log_prob") && v.contains("[0, 0]"),
            "{name}: {v}"
        );
        let got = verdict(&name, || run(&*e, &good));
        assert_eq!(got, "ok", "{name}");
    }
    assert_eq!(run(&CpuEngine::new(), &good).unwrap(), want);
    assert_eq!(run(&CpuEngine::fast(), &good).unwrap(), want);
}
