//! CPPO (`rollout_rs: "cppo"`, the cumulative prefix-divergence budget) against golden vectors
//! from the authors' own `_cppo_mask` (Tencent-Hunyuan/UniRL; `scripts/dev/cppo_golden.py`,
//! fixture `data/cppo/golden.json`: 12 packed sequences incl. an empty one and one with
//! advantage 0, five parameter sets), on both engines; padding, metrics and errors.

use crate::common;

use common::json_flatten;
use serde_json::{json, Value};
use trmask::cpu::CpuEngine;
use trmask::{CorrectionConfig, Corrector, Step};

type Golden = common::PackedGolden;

fn golden() -> Golden {
    Golden::load("cppo")
}

use common::engines;

fn cfg(case: &Value) -> CorrectionConfig {
    CorrectionConfig::from_json_value(&json!({
        "rollout_rs": "cppo",
        "rollout_rs_threshold": case["delta"],
        "cppo": {"w_min": case["w_min"], "delta_b": case["delta_b"]},
    }))
    .unwrap()
}

#[test]
fn masks_equal_the_authors_on_both_engines() {
    let g = golden();
    let step = Step::packed(&g.cu)
        .old_log_prob(g.old.as_slice())
        .rollout_log_prob(g.roll.as_slice())
        .advantages(g.adv.as_slice());
    let n = g.roll.len() as f64;
    let cases = g.v["cases"].as_array().unwrap();
    for e in engines() {
        let name = e.name();
        for case in cases {
            let out = Corrector::new(e.clone(), &cfg(case))
                .unwrap()
                .correct(&step)
                .unwrap();
            let keep = json_flatten(&case["keep"]);
            assert_eq!(keep, out.mask, "{name}: {case}");
            let dropped = keep.iter().filter(|&&k| k == 0.0).count() as f64;
            let m = |k: &str| out.metrics[&format!("rollout_corr/rollout_rs_cppo_{k}")];
            assert_eq!(m("masked_fraction"), dropped / (n + 1e-8), "{name}");
            // every drop is a token-threshold one or a prefix-budget one
            let parts = (m("token_masked_fraction") + m("prefix_masked_fraction")) * n;
            assert!(
                (parts - dropped).abs() < 1e-9,
                "{name}: {parts} vs {dropped}"
            );
            assert!(
                m("prefix_masked_fraction") > 0.0,
                "{name}: the budget binds"
            );
            assert_eq!(out.criteria[0].output_name, "seq_cppo");
        }
        println!("{name}: CPPO masks equal UniRL's _cppo_mask for every parameter set");
    }
}

#[test]
fn defaults_are_the_papers() {
    // without a cppo block: w_min 0.8, delta_b 0.02 (the first golden case at delta 0.15)
    let g = golden();
    let case = &g.v["cases"][0];
    assert_eq!(
        (case["w_min"].as_f64(), case["delta_b"].as_f64()),
        (Some(0.8), Some(0.02))
    );
    let c = CorrectionConfig::from_json_value(
        &json!({"rollout_rs": "cppo", "rollout_rs_threshold": case["delta"]}),
    )
    .unwrap();
    let step = Step::packed(&g.cu)
        .old_log_prob(g.old.as_slice())
        .rollout_log_prob(g.roll.as_slice())
        .advantages(g.adv.as_slice());
    let out = Corrector::new(CpuEngine::new(), &c)
        .unwrap()
        .correct(&step)
        .unwrap();
    assert_eq!(json_flatten(&case["keep"]), out.mask);
}

#[test]
fn padding_never_changes_the_mask() {
    let g = golden();
    let lens: Vec<usize> = g.cu.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
    let t = *lens.iter().max().unwrap();
    let b = lens.len();
    let garbage = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 3e38];
    let (mut mask, mut roll, mut old, mut adv) = (vec![], vec![], vec![], vec![]);
    for (s, &l) in lens.iter().enumerate() {
        let o = g.cu[s] as usize;
        for j in 0..t {
            let valid = j < l;
            mask.push(valid as u8 as f64);
            let z = garbage[(s + j) % 4];
            roll.push(if valid { g.roll[o + j] } else { z });
            old.push(if valid { g.old[o + j] } else { z });
            adv.push(if valid { g.adv[o + j] } else { z });
        }
    }
    let step = Step::padded(b, t)
        .response_mask(mask.as_slice())
        .rollout_log_prob(roll.as_slice())
        .old_log_prob(old.as_slice())
        .advantages(adv.as_slice());
    let case = &g.v["cases"][1];
    for e in engines() {
        let out = Corrector::new(e.clone(), &cfg(case))
            .unwrap()
            .correct(&step)
            .unwrap();
        let got: Vec<f64> = (0..b)
            .flat_map(|s| out.mask[s * t..s * t + lens[s]].to_vec())
            .collect();
        assert_eq!(got, json_flatten(&case["keep"]), "{}", e.name());
    }
}

#[test]
fn config_and_input_errors() {
    let bad_blocks = [
        (json!({"w_min": 0.0}), "cppo.w_min"),
        (json!({"w_min": 1.5}), "cppo.w_min"),
        (json!({"delta_b": -0.01}), "cppo.delta_b"),
        (json!({"delta": 0.1}), "cppo.delta"),
        (json!(0.2), "cppo"),
    ];
    for (block, key) in bad_blocks {
        let v = json!({"rollout_rs": "cppo", "rollout_rs_threshold": 0.2, "cppo": block});
        let e = CorrectionConfig::from_json_value(&v)
            .expect_err("bad cppo block")
            .to_string();
        assert!(e.contains(key), "{block}: {e}");
    }
    for bad in [json!(0.0), json!(-0.2), json!("0.1_0.2")] {
        let v = json!({"rollout_rs": "cppo", "rollout_rs_threshold": bad});
        let e = CorrectionConfig::from_json_value(&v)
            .and_then(|c| c.resolve())
            .expect_err("threshold must be rejected")
            .to_string();
        assert!(e.contains("rollout_rs_threshold"), "{bad}: {e}");
    }
    // the block round-trips through the config's JSON
    let v = json!({"rollout_rs": "cppo", "rollout_rs_threshold": 0.2, "cppo": {"w_min": 0.5}});
    let c = CorrectionConfig::from_json_value(&v).unwrap();
    let again = CorrectionConfig::from_json_value(&c.to_json_value()).unwrap();
    assert_eq!(c, again);
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

#[test]
fn the_cli_summary_splits_the_drops_by_rule() {
    let g = golden();
    let batch = json!({
        "cu_seqlens": g.cu,
        "rollout_log_prob": g.roll,
        "old_log_prob": g.old,
        "advantages": g.adv,
    });
    let input = common::scratch("cppo", "batch.json");
    std::fs::write(&input, batch.to_string()).unwrap();
    let config = common::scratch("cppo", "config.json");
    let cfg = json!({"rollout_rs": "cppo", "rollout_rs_threshold": 0.15});
    std::fs::write(&config, cfg.to_string()).unwrap();
    let (code, out, err) = common::run_trmask(&[
        "analyze",
        input.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 0, "{err}");
    let keep = json_flatten(&g.v["cases"][0]["keep"]);
    let dropped = keep.iter().filter(|&&k| k == 0.0).count();
    let line = out.lines().find(|l| l.starts_with("cppo: ")).expect(&out);
    assert!(
        line.starts_with(&format!("cppo: {dropped} tokens dropped")),
        "{line}"
    );
    assert!(line.ends_with("by the prefix budget"), "{line}");
    let (_, out, _) = common::run_trmask(&["analyze", input.to_str().unwrap(), "--backend", "cpu"]);
    assert!(!out.contains("cppo: "), "{out}");
}
