//! Bad shapes through the public engine API give the same verdict on both engines: an `Err`
//! naming the tensor, never a panic (the CPU reference used to index and slice unchecked).

mod common;

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
    let batch = Batch::padded(2, 3, &[1.0; 6]).unwrap();
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
    let batch = Batch::padded(2, 2, &[1.0; 4]).unwrap();
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
