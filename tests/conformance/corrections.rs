//! trmask's own criteria (LN-TRM, SER, token veto, non-verl statistics), seq_reject_bits,
//! bypass mode, extreme inputs and the CLI's config handling.

use serde_json::{json, Value};
use std::path::Path;
use trmask::analysis::analyze;
use trmask::cpu::CpuEngine;
use trmask::{Batch, CorrectionConfig};

fn cfg(v: Value) -> CorrectionConfig {
    CorrectionConfig::from_json_value(&v).unwrap()
}

/// One sequence with ρ = [1, 1.1, 0.9, 2, 0.5] plus a quiet one.
fn rho_batch() -> Batch {
    let rho = [1.0f64, 1.1, 0.9, 2.0, 0.5];
    let mut old: Vec<f64> = rho.iter().map(|r| r.ln()).collect();
    old.extend([0.001, -0.001, 0.0, 0.0, 0.0]);
    let mask = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0];
    Batch::padded(2, 5, &mask)
        .unwrap()
        .with_log_probs("rollout_log_prob", vec![0.0; 10])
        .unwrap()
        .with_log_probs("old_log_prob", old)
        .unwrap()
        .build()
        .unwrap()
}

fn seq_out<'a>(a: &'a trmask::analysis::Analysis, name: &str) -> &'a [f64] {
    &a.outputs.iter().find(|o| o.name == name).unwrap().data
}

#[test]
fn lntrm_ser_and_bits() {
    let c = cfg(json!({
        "rollout_rs": "seq_lntrm,seq_mean_ser,token_abs",
        "rollout_rs_threshold": "0.2,0.3,5",
        "ln_trm": {"eps": 0.1, "delta": 0.02},
        "token_veto": 0.6
    }));
    let a = analyze(&CpuEngine::new(), &rho_batch(), &c).unwrap();
    let ln = seq_out(&a, "seq_lntrm");
    assert!((ln[0] - 0.21389031741350378).abs() < 1e-14, "{ln:?}");
    let ser = seq_out(&a, "seq_mean_ser");
    assert!((ser[0] - 0.34).abs() < 1e-14, "{ser:?}");
    // lntrm (bit 0) and ser (bit 1) reject row 0, token_abs (bit 2) nothing, veto (bit 3: ρ=0.5<0.6)
    assert_eq!(a.corrections.seq_reject_bits, vec![0b1011, 0]);
    assert_eq!(a.corrections.seq_accept, vec![false, true]);
    assert_eq!(seq_out(&a, "seq_reject_bits"), &[11.0, 0.0]);
    assert_eq!(seq_out(&a, "seq_token_veto")[0], 0.5);
    assert_eq!(
        &a.corrections.mask[..7],
        &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    );
    assert_eq!(a.metrics["trmask/reject_rate"], 0.5);
    assert_eq!(a.metrics["trmask/reject_rate/token_veto"], 0.5);
    assert_eq!(a.metrics["trmask/accepted_seq_len_max"], 2.0);
    assert_eq!(a.metrics["trmask/seq_len_max"], 5.0);
    // a missing ln_trm term drops out of w_t
    // ρ = [2, 1.5, 1], ε only: w = [0.2, 0.1, 0] → W/Z = (0.2 + 0.05)/0.3
    let only_eps = trmask::bounds::lntrm_score(&[2.0, 1.5, 1.0], Some(0.1), None);
    assert!((only_eps - 0.25 / 0.3).abs() < 1e-15, "{only_eps}");
    // δ only: w = [sqrt(0.02), sqrt(0.01), 0]
    let only_delta = trmask::bounds::lntrm_score(&[2.0, 1.5, 1.0], None, Some(0.02));
    let (w1, w2) = (0.02f64.sqrt(), 0.01f64.sqrt());
    assert!((only_delta - (w1 + 0.5 * w2) / (w1 + w2)).abs() < 1e-15);
    // an empty sequence has Z = 0: LN-TRM is 0
    assert_eq!(trmask::bounds::lntrm_score(&[], Some(0.1), None), 0.0);
}

#[test]
fn lntrm_needs_params_and_unknown_options_fail() {
    let bad = CorrectionConfig::from_json_value(
        &json!({"rollout_rs": "seq_lntrm", "rollout_rs_threshold": 0.1}),
    );
    assert!(bad.unwrap_err().to_string().contains("ln_trm"));
    for opt in ["seq_max_k1", "token_k4", "geometric", "seq_mean_foo"] {
        let e = CorrectionConfig::from_json_value(
            &json!({"rollout_rs": opt, "rollout_rs_threshold": 1.5}),
        );
        assert!(e.is_err(), "{opt}");
    }
    // statistics that need logits are looked up in the table and reported by name
    let c = cfg(json!({"rollout_rs": "seq_max_kl", "rollout_rs_threshold": 0.1}));
    let e = analyze(&CpuEngine::new(), &rho_batch(), &c).unwrap_err();
    assert!(e.to_string().contains("kl"), "{e}");
}

#[test]
fn bypass_mode_uses_log_prob() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/verl-golden");
    let gold: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("head/rollout_corr__mild.json")).unwrap(),
    )
    .unwrap();
    let want = &gold["offpolicy"]["float64"]
        ["compute_rollout_corr_metrics_from_logprobs(log_prob,rollout)"];
    let batch = trmask::io::read_batch(&root.join("inputs/mild.json")).unwrap();
    let a = analyze(
        &CpuEngine::new(),
        &batch,
        &cfg(json!({"bypass_mode": true})),
    )
    .unwrap();
    for (k, v) in want.as_object().unwrap() {
        let (g, w) = (a.metrics[k], v.as_f64().unwrap());
        assert!((g - w).abs() <= 1e-9 * w.abs() + 1e-15, "{k}: {g} vs {w}");
    }
}

#[test]
fn extreme_inputs_every_preset() {
    // ±30 past the clamp, a length-1 row, an empty row, a spike, a drift
    let (b, t) = (5, 6);
    let mut mask = vec![0.0; b * t];
    let lens = [6, 1, 0, 3, 6];
    for (r, &l) in lens.iter().enumerate() {
        mask[r * t..r * t + l].iter_mut().for_each(|m| *m = 1.0);
    }
    let mut old = vec![f64::NAN; b * t];
    let mut roll = vec![f64::NAN; b * t];
    for i in 0..b * t {
        if mask[i] == 1.0 {
            roll[i] = -1.0;
            old[i] = -1.0 + 0.01 * (i % 7) as f64;
        }
    }
    old[0] = 29.0; // lr = +30
    old[6] = -31.0; // length-1 row with lr = −30
    old[19] = 11.0; // spike
    for j in 0..6 {
        old[24 + j] = -1.0 + 0.05 * j as f64; // drift
    }
    let batch = Batch::padded(b, t, &mask)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll)
        .unwrap()
        .with_log_probs("old_log_prob", old.clone())
        .unwrap()
        .with_log_probs("log_prob", old)
        .unwrap()
        .build()
        .unwrap();
    for name in CorrectionConfig::preset_names() {
        let c = CorrectionConfig::preset(name).unwrap();
        let a = analyze(&CpuEngine::new(), &batch, &c).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (k, v) in &a.metrics {
            assert!(v.is_finite(), "{name}: {k} = {v}");
        }
        if let Some(w) = &a.corrections.weights {
            assert!(w.iter().all(|x| x.is_finite() && *x >= 0.0), "{name}");
        }
        assert_eq!(a.corrections.seq_len, vec![6, 1, 0, 3, 6]);
        assert!(a.corrections.seq_accept[2], "empty rows are never rejected");
    }
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_trmask"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_config_errors_exit_2() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let input = root.join("data/verl-golden/inputs/mild.json");
    let dir = std::env::temp_dir().join(format!("trmask-corr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("c.json");
    std::fs::write(&p, r#"{"rollout_is": "token", "rollout_iz": 1}"#).unwrap();
    let o = cli(&[
        "analyze",
        input.to_str().unwrap(),
        "--config",
        p.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("rollout_iz"));
    let o = cli(&[
        "analyze",
        input.to_str().unwrap(),
        "--preset",
        "nope",
        "--backend",
        "cpu",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let m = dir.join("m.json");
    let o = cli(&[
        "analyze",
        input.to_str().unwrap(),
        "--preset",
        "decoupled_k3_rs",
        "--backend",
        "cpu",
        "--metrics",
        m.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mv: Value = serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    assert!(mv.get("rollout_corr/rollout_rs_seq_mean_k3_mean").is_some());
    assert!(mv.get("trmask/reject_rate").is_some());
    let _ = std::fs::remove_dir_all(&dir);
}
