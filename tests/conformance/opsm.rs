//! OPSM (`rollout_rs: "opsm"`, DeepSeek-V3.2's off-policy sequence masking) against golden
//! vectors from slime's own `compute_opsm_mask` (`scripts/dev/opsm_golden.py`, fixture
//! `data/opsm/golden.json`: 12 packed sequences incl. an empty one and a zero-advantage one, four
//! thresholds), on both engines; the per-token advantage sign case where slime splits a
//! sequence and trmask does not; config errors and metrics.

use crate::common;

use common::json_flatten;
use serde_json::{json, Value};
use trmask::cpu::CpuEngine;
use trmask::{CorrectionConfig, Corrector, Step};

type Golden = common::PackedGolden;

fn golden() -> Golden {
    Golden::load("opsm")
}

use common::engines;

fn cfg(v: Value) -> CorrectionConfig {
    CorrectionConfig::from_json_value(&v).unwrap()
}

#[test]
fn masks_equal_slimes_on_both_engines() {
    let g = golden();
    let step = Step::packed(&g.cu)
        .old_log_prob(g.old.as_slice())
        .rollout_log_prob(g.roll.as_slice())
        .advantages(g.adv.as_slice());
    let seq_mean = json_flatten(&g.v["seq_mean_log_ratio_roll_over_train"]);
    let seq_adv: Vec<f64> =
        g.cu.windows(2)
            .map(|w| g.adv[w[0] as usize..w[1] as usize].iter().sum())
            .collect();
    for e in engines() {
        let name = e.name();
        for d in json_flatten(&g.v["thresholds"]) {
            let c = cfg(json!({"rollout_rs": "opsm", "rollout_rs_threshold": d}));
            let out = Corrector::new(e.clone(), &c)
                .unwrap()
                .correct(&step)
                .unwrap();
            let case = &g.v["cases"][format!("{d:?}")];
            let keep = json_flatten(&case["keep"]);
            assert_eq!(keep.len(), out.mask.len());
            for (i, (&k, &m)) in keep.iter().zip(&out.mask).enumerate() {
                assert_eq!(k, m, "{name}: delta {d}, token {i}");
            }
            let rejected: Vec<bool> = (0..seq_mean.len())
                .map(|s| seq_adv[s] < 0.0 && seq_mean[s] > d)
                .collect();
            let acc: Vec<bool> = rejected.iter().map(|r| !r).collect();
            assert_eq!(out.seq_accept, acc, "{name}: delta {d}");
            // the sequence statistic: the mean of log(pi_roll/pi_train) of negative-advantage
            // sequences, 0 for the others (f32 on the GPU)
            let st = &out.criteria[0];
            assert_eq!(st.output_name, "seq_opsm");
            for s in 0..seq_mean.len() {
                let want = if seq_adv[s] < 0.0 { seq_mean[s] } else { 0.0 };
                let tol = if name.starts_with("cpu") { 1e-12 } else { 2e-6 };
                assert!(
                    (st.seq_stat[s] - want).abs() <= tol * (1.0 + want.abs()),
                    "{name}: seq {s}"
                );
            }
            let m = |k: &str| out.metrics[&format!("rollout_corr/rollout_rs_opsm_{k}")];
            let n_rej_tok = keep.iter().filter(|&&k| k == 0.0).count() as f64;
            let n = keep.len() as f64;
            assert!(
                (m("masked_fraction") - n_rej_tok / (n + 1e-8)).abs() < 1e-15,
                "{name}"
            );
            let nonempty = g.cu.windows(2).filter(|w| w[1] > w[0]).count() as f64;
            let k = rejected.iter().filter(|&&r| r).count() as f64;
            assert!(
                (m("seq_masked_fraction") - k / nonempty).abs() < 1e-15,
                "{name}"
            );
            // slime's opsm_clipfrac counts the masked sequences (token share per sequence, summed)
            assert_eq!(case["clipfrac"].as_f64().unwrap(), k, "{name}: delta {d}");
        }
        println!("{name}: OPSM masks equal slime's at every threshold");
    }
}

#[test]
fn a_sequence_is_rejected_whole_where_slime_tests_per_token_signs() {
    let g = golden();
    let p = &g.v["per_token_sign"];
    let adv = json_flatten(&p["advantages"]);
    let slime = json_flatten(&p["slime_keep"]);
    let d = p["delta"].as_f64().unwrap();
    let step = Step::packed(&g.cu)
        .old_log_prob(g.old.as_slice())
        .rollout_log_prob(g.roll.as_slice())
        .advantages(adv.as_slice());
    let c = cfg(json!({"rollout_rs": "opsm", "rollout_rs_threshold": d}));
    let (a, b) = (g.cu[8] as usize, g.cu[9] as usize);
    for e in engines() {
        let out = Corrector::new(e.clone(), &c)
            .unwrap()
            .correct(&step)
            .unwrap();
        // sequence 8: mean log(pi_roll/pi_train) > delta, advantages -1 and +1 (mean < 0)
        assert!(out.mask[a..b].iter().all(|&m| m == 0.0), "{}", e.name());
        let slime_kept = slime[a..b].iter().filter(|&&k| k == 1.0).count();
        assert_eq!(
            slime_kept,
            (b - a).div_ceil(3),
            "slime keeps the A > 0 tokens"
        );
        // elsewhere both agree
        for i in (0..a).chain(b..slime.len()) {
            assert_eq!(out.mask[i], slime[i], "{}: token {i}", e.name());
        }
    }
}

#[test]
fn config_and_input_errors() {
    for bad in [json!(0.0), json!(-1e-4), json!("1e-4_1e-3")] {
        let v = json!({"rollout_rs": "opsm", "rollout_rs_threshold": bad});
        let e = CorrectionConfig::from_json_value(&v)
            .and_then(|c| c.resolve())
            .expect_err("threshold must be rejected")
            .to_string();
        assert!(e.contains("rollout_rs_threshold"), "{bad}: {e}");
    }
    for bad in ["seq_mean_opsm", "token_opsm"] {
        let v = json!({"rollout_rs": bad, "rollout_rs_threshold": 1e-4});
        let r = CorrectionConfig::from_json_value(&v).and_then(|c| c.resolve());
        assert!(r.is_err(), "{bad}");
    }
    let c = cfg(json!({"rollout_rs": "opsm,seq_mean_k3", "rollout_rs_threshold": "1e-4,0.01"}));
    assert_eq!(c.resolve().unwrap().criteria.len(), 2);
    let cu = [0i64, 2];
    let step = Step::packed(&cu)
        .old_log_prob(&[-1.0, -1.0][..])
        .rollout_log_prob(&[-1.0, -1.0][..]);
    let e = Corrector::new(CpuEngine::new(), &c)
        .unwrap()
        .correct(&step)
        .expect_err("advantages are needed")
        .to_string();
    assert!(e.contains("`advantages`"), "{e}");
}
