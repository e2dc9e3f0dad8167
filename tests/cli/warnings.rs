//! `warning:` lines: each fires on an input made for it, none fires on the sample data, and
//! none changes the exit code or the metrics.

use crate::common;

use serde_json::{json, Value};

fn analyze(name: &str, batch: &Value, extra: &[&str]) -> (i32, String, String) {
    let p = common::scratch("warn", name);
    std::fs::write(&p, batch.to_string()).unwrap();
    let mut args = vec!["analyze", p.to_str().unwrap(), "--backend", "cpu"];
    args.extend_from_slice(extra);
    common::run_trmask(&args)
}

fn warnings(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.starts_with("warning:")).collect()
}

/// [4, 16] all-valid batch: `f(rollout, k) -> old`.
fn batch(seed: u64, f: impl Fn(f64, &mut common::Rng) -> f64, round: bool) -> Value {
    let mut r = common::Rng::new(seed);
    let (mut roll, mut old) = (vec![], vec![]);
    for _ in 0..4 {
        let (mut a, mut b) = (vec![], vec![]);
        for _ in 0..16 {
            let mut x = r.range(-6.0, -0.05);
            let mut y = f(x, &mut r);
            if round {
                x = half::bf16::from_f64(x).to_f64();
                y = half::bf16::from_f64(y).to_f64();
            }
            a.push(x);
            b.push(y);
        }
        roll.push(a);
        old.push(b);
    }
    json!({"rollout_log_prob": roll, "old_log_prob": old, "response_mask": vec![vec![1; 16]; 4]})
}

fn noisy(x: f64, r: &mut common::Rng) -> f64 {
    x + r.range(-0.2, 0.2)
}

#[test]
fn clean_input_is_silent() {
    let (code, _, err) = analyze("clean.json", &batch(1, noisy, false), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(warnings(&err).is_empty(), "{err}");
}

#[test]
fn bf16_log_probs_state_the_noise_floor_and_a_threshold_below_it() {
    let b = batch(2, |x, r| x + r.range(-0.002, 0.002), true);
    let (code, _, err) = analyze("bf16.json", &b, &[]);
    assert_eq!(code, 0, "{err}");
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(
        w[0].contains("bf16-representable") && w[0].contains("measured k3 mean"),
        "{err}"
    );
    let cfg = common::scratch("warn", "tiny.json");
    std::fs::write(
        &cfg,
        r#"{"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 1e-9}"#,
    )
    .unwrap();
    let (code, _, err) = analyze("bf16b.json", &b, &["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        warnings(&err)
            .iter()
            .any(|l| l.contains("seq_mean_k3 threshold") && l.contains("noise floor")),
        "{err}"
    );
}

#[test]
fn positive_log_probs_warn() {
    let b = batch(3, |x, r| (x + r.range(-0.2, 0.2)).abs() / 6.0, false);
    let (code, _, err) = analyze("pos.json", &b, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        warnings(&err)
            .iter()
            .any(|l| l.contains("old_log_prob has 64 positive values")),
        "{err}"
    );
}

#[test]
fn temperature_without_logits_warns() {
    let (code, _, err) = analyze(
        "temp.json",
        &batch(4, noisy, false),
        &["--temperature", "0.7"],
    );
    assert_eq!(code, 0, "{err}");
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(w[0].contains("--temperature has no effect"), "{err}");
}

#[test]
fn constant_offset_warns() {
    let b = batch(5, |x, r| x - 0.5 + r.range(-0.01, 0.01), false);
    let (code, _, err) = analyze("offset.json", &b, &[]);
    assert_eq!(code, 0, "{err}");
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(w[0].contains("constant offset"), "{err}");
}

#[test]
fn sample_data_is_silent() {
    for f in [
        "data/sample/real-small.safetensors",
        "data/sample/real-small-topk.safetensors",
    ] {
        for preset in ["decoupled_k3_rs", "trm_max"] {
            let (code, _, err) =
                common::run_trmask(&["analyze", f, "--backend", "cpu", "--preset", preset]);
            assert_eq!(code, 0, "{f}: {err}");
            assert!(warnings(&err).is_empty(), "{f} {preset}: {err}");
        }
    }
}
