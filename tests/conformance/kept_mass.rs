//! The kept mass of a top-p sampler on `data/causal-sample` (a top-p 0.95 engine that stored
//! raw and processed rollout log-probs and the raw top-20): `log S_t` from the top-20 equals
//! raw − processed on every token whose kept set fits in the top-20 (to 1e-6), the kept count
//! equals the generator's `top_p_kept`, the others are flagged with a bound that holds, and
//! replaying the kept set (`old_log_prob − log S_t`) brings the mean k3 down to the raw
//! log-probs' level.

use safetensors::SafeTensors;
use trmask::kept_mass::{kept_mass_from_topk, Truncation};

use crate::common::{causal_sample as read, tensor_f32s as f32s, tensor_i32s as i32s};

fn k3(x: f64) -> f64 {
    x.exp_m1() - x
}

#[test]
fn top20_kept_mass_equals_raw_minus_processed_and_replay_removes_the_offset() {
    let (bb, eb) = (read("batch.safetensors"), read("extras.safetensors"));
    let b = SafeTensors::deserialize(&bb).unwrap();
    let e = SafeTensors::deserialize(&eb).unwrap();
    let mask = f32s(&b, "response_mask");
    let proc = f32s(&b, "rollout_log_prob");
    let raw = f32s(&b, "rollout_log_prob_raw");
    let old = f32s(&b, "old_log_prob");
    let topk = f32s(&b, "rollout_topk_log_prob");
    let kept_true = i32s(&e, "top_p_kept");
    let t = Truncation {
        top_p: 0.95,
        ..Default::default()
    };
    let (mut n, mut exact, mut worst) = (0usize, 0usize, 0.0f64);
    let (mut k3_proc, mut k3_raw, mut k3_replay) = (0.0, 0.0, 0.0);
    let mut flagged_fit = 0usize;
    for i in 0..mask.len() {
        if mask[i] != 1.0 {
            continue;
        }
        n += 1;
        let k = kept_mass_from_topk(&topk[i * 20..(i + 1) * 20], &t).unwrap();
        let truth = raw[i] - proc[i]; // = log S_t (processed = raw − log S)
        if k.exact {
            exact += 1;
            worst = worst.max((k.log_kept_mass - truth).abs());
            assert_eq!(k.kept, Some(kept_true[i] as usize), "slot {i}: kept count");
        } else {
            if kept_true[i] <= 20 {
                flagged_fit += 1; // a decision within float32 rounding of 0.95
            }
            // the bound holds (plus float32 rounding of the stored log-probs)
            assert!(
                (k.log_kept_mass - truth).abs() <= k.max_error + 2e-6,
                "slot {i}: {} vs {truth}, bound {}",
                k.log_kept_mass,
                k.max_error
            );
        }
        k3_proc += k3(old[i] - proc[i]);
        k3_raw += k3(old[i] - raw[i]);
        k3_replay += k3(old[i] - k.log_kept_mass - proc[i]);
    }
    let nf = n as f64;
    let (k3_proc, k3_raw, k3_replay) = (k3_proc / nf, k3_raw / nf, k3_replay / nf);
    println!(
        "{n} valid tokens: kept set known from the top-20 on {exact} ({:.2}%), flagged {} \
         ({flagged_fit} of them fit but sit within the float32 margin of top_p); max |log S − \
         (raw − processed)| on the known ones {worst:.3e}",
        100.0 * exact as f64 / nf,
        n - exact
    );
    println!(
        "mean k3: processed {k3_proc:.4e}, raw {k3_raw:.4e}, replayed (old − log S − processed) \
         {k3_replay:.4e}"
    );
    assert_eq!(n, 24_560);
    assert!(exact > 0 && worst <= 1e-6, "worst {worst}");
    assert!(k3_proc > 20.0 * k3_raw);
    assert!(k3_replay <= 1.25 * k3_raw, "{k3_replay} vs raw {k3_raw}");
}

#[test]
fn analyze_writes_the_kept_mass_and_replays_only_when_asked() {
    use trmask::cpu::CpuEngine;
    use trmask::CorrectionConfig;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/causal-sample/batch.safetensors");
    let batch = trmask::io::read_batch(&path).unwrap();
    let run = |cfg: &str| {
        let c = CorrectionConfig::from_json_str(cfg).unwrap();
        trmask::analysis::analyze(&CpuEngine::new(), &batch, &c).unwrap()
    };
    let plain = run("{}");
    assert!(
        !plain.metrics.keys().any(|k| k.contains("kept")),
        "no truncation configured"
    );
    assert!(!plain.outputs.iter().any(|o| o.name == "log_kept_mass"));
    let measured = run(r#"{"top_p": 0.95}"#);
    let replayed = run(r#"{"top_p": 0.95, "sampling_replay": true}"#);
    for a in [&measured, &replayed] {
        assert!(a.outputs.iter().any(|o| o.name == "log_kept_mass"));
        let m = |k: &str| a.metrics[k];
        assert!((m("trmask/log_kept_mass_mean") + 0.0505).abs() < 1e-3);
        assert!(m("trmask/log_kept_mass_min") >= 0.95f64.ln() - 1e-6);
        assert!((m("trmask/kept_set_known_fraction") - 1903.0 / 24560.0).abs() < 1e-12);
        assert!(m("trmask/k3_mean_raw_trainer") > 1e-3);
        assert!(m("trmask/k3_mean_kept_trainer") < 5e-5);
    }
    // the estimators follow the replayed trainer log-prob only with sampling_replay
    let k3 = |a: &trmask::analysis::Analysis| a.metrics["trmask/k3_mean"];
    assert!((k3(&measured) - k3(&plain)).abs() < 1e-15);
    assert!(k3(&replayed) < 5e-5 && k3(&plain) > 1e-3);
    assert!(replayed
        .outputs
        .iter()
        .any(|o| o.name == "old_log_prob_kept"));
    assert!(!measured
        .outputs
        .iter()
        .any(|o| o.name == "old_log_prob_kept"));
    println!(
        "trmask/k3_mean: plain {:.4e}, top_p measured {:.4e}, sampling_replay {:.4e}",
        k3(&plain),
        k3(&measured),
        k3(&replayed)
    );
    // replay needs the truncation and the top-K
    let c = CorrectionConfig::from_json_str(r#"{"sampling_replay": true}"#).unwrap();
    let e = trmask::analysis::analyze(&CpuEngine::new(), &batch, &c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sampling_replay"), "{e}");
    assert!(CorrectionConfig::from_json_str(r#"{"top_p": 1.5}"#).is_err());
    assert!(CorrectionConfig::from_json_str(r#"{"top_k": 2.5}"#).is_err());
}

#[test]
fn the_corrector_never_ignores_sampling_replay() {
    use trmask::cpu::CpuEngine;
    use trmask::{CorrectionConfig, Corrector, Step};
    let c = CorrectionConfig::from_json_str(r#"{"top_p": 0.9, "sampling_replay": true}"#).unwrap();
    let cu = [0i64, 2];
    let step = Step::packed(&cu)
        .old_log_prob(&[-1.0, -1.0][..])
        .rollout_log_prob(&[-0.9, -0.9][..]);
    let e = Corrector::new(CpuEngine::new(), &c)
        .unwrap()
        .correct(&step)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout_topk_log_prob"), "{e}");
    // measuring only: no top-K, no kept-mass metrics, no error
    let c = CorrectionConfig::from_json_str(r#"{"top_p": 0.9}"#).unwrap();
    let out = Corrector::new(CpuEngine::new(), &c)
        .unwrap()
        .correct(&step)
        .unwrap();
    assert!(!out.metrics.keys().any(|k| k.contains("kept")));
}
