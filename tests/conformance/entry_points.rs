//! One way in: a config with `sampling_replay` over the rollout's top-K, run through every
//! public entry point — `Corrector::correct`, `Corrector::correct_into`, `correction::correct`,
//! `correction::correct_shard` (what `distributed::correct` runs over MPI), `analysis::analyze`
//! and `trmask analyze` — gives the same weights, mask and metrics, on both engines.

use crate::common;

use common::{engines, Hub, Rank};
use trmask::{CorrectionConfig, Corrector, Step};

const CONFIG: &str = r#"{"top_p": 0.95, "sampling_replay": true,
    "rollout_is": "token", "rollout_is_threshold": 2.0,
    "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.002}"#;

fn same(
    what: &str,
    a: &std::collections::BTreeMap<String, f64>,
    b: &std::collections::BTreeMap<String, f64>,
) {
    for (k, v) in a {
        let w = b
            .get(k)
            .unwrap_or_else(|| panic!("{what}: metric {k} is missing"));
        assert!(
            v.to_bits() == w.to_bits() || (v.is_nan() && w.is_nan()),
            "{what}: {k} = {v} vs {w}"
        );
    }
}

#[test]
fn every_entry_point_gives_the_same_weights_mask_and_metrics() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/causal-sample/batch.safetensors");
    let input = trmask::io::read_input(&path, &Default::default()).unwrap();
    let batch = &input.batch;
    let cfg = CorrectionConfig::from_json_str(CONFIG).unwrap();
    // the replay changes the decision: without it the top-p offset rejects more
    let plain = CorrectionConfig::from_json_str(&CONFIG.replace("true", "false")).unwrap();
    let (b, t) = (64usize, 512usize);
    let mask = batch.mask().to_vec();
    let roll = batch.rollout_log_prob().unwrap().to_vec();
    let old = batch.old_log_prob().unwrap().to_vec();
    let adv = batch.advantages().unwrap().to_vec();
    let responses = batch.responses().unwrap().to_vec();
    let uid = batch.uid().unwrap().to_vec();
    let topk_ids = batch.rollout_topk_ids().unwrap().to_vec();
    let topk_lp = batch.rollout_topk_log_prob().unwrap().to_vec();
    let step = Step::padded(b, t)
        .response_mask(&mask[..])
        .rollout_log_prob(&roll[..])
        .old_log_prob(&old[..])
        .advantages(&adv[..])
        .responses(&responses[..])
        .uid(&uid[..])
        .rollout_topk(&topk_ids[..], &topk_lp[..]);
    // the CLI, once (CPU engine: what `--backend cpu` runs)
    let cfg_path = common::scratch("entry-points", "config.json");
    std::fs::write(&cfg_path, CONFIG).unwrap();
    let m_path = common::scratch("entry-points", "metrics.json");
    let (code, _, err) = common::run_trmask(&[
        "analyze",
        path.to_str().unwrap(),
        "--config",
        cfg_path.to_str().unwrap(),
        "--backend",
        "cpu",
        "--metrics",
        m_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let cli: std::collections::BTreeMap<String, f64> = common::load_json(&m_path)
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect();
    for e in engines() {
        let name = e.name();
        let a = trmask::analysis::analyze(e.as_ref(), batch, &cfg).unwrap();
        let without = trmask::correction::correct(e.as_ref(), batch, &plain).unwrap();
        // the replay is read: the kept mass removes top-p's offset from the statistic
        let mean = |c: &trmask::Corrections| c.criteria[0].seq_stat.iter().sum::<f64>() / 64.0;
        let (with, plain_mean) = (mean(&a.corrections), mean(&without));
        println!("{name}: mean seq_mean_k3 {with:.3e} with the replay, {plain_mean:.3e} without");
        assert!(with < 0.5 * plain_mean, "{name}: the replay is read");
        let c1 = trmask::correction::correct(e.as_ref(), batch, &cfg).unwrap();
        let hub = Hub::new(1);
        let mut one = Rank {
            hub: &hub,
            rank: 0,
            size: 1,
            bytes_sent: 0,
        };
        let c2 = trmask::correction::correct_shard(e.as_ref(), batch, &cfg, &mut one).unwrap();
        let corrector = Corrector::new(e.clone(), &cfg).unwrap();
        let c3 = corrector.correct(&step).unwrap();
        let (w, m, c4) = common::correct_into_f32(&corrector, &step, b * t);
        let want_w = a.corrections.weights.as_ref().unwrap();
        for (what, c) in [("correct", &c1), ("correct_shard", &c2), ("Corrector", &c3)] {
            assert!(c.mask == a.corrections.mask, "{name} {what}: mask");
            assert!(c.weights.as_ref() == Some(want_w), "{name} {what}: weights");
            assert!(
                c.seq_accept == a.corrections.seq_accept,
                "{name} {what}: seq_accept"
            );
            // every metric an entry point returns is the analysis's, to the bit
            same(&format!("{name} {what}"), &c.metrics, &a.metrics);
            same(
                &format!("{name} {what}"),
                &a.corrections.metrics,
                &c.metrics,
            );
        }
        same(&format!("{name} correct_into"), &c4.metrics, &a.metrics);
        assert!(
            c4.seq_accept == a.corrections.seq_accept,
            "{name} correct_into: seq_accept"
        );
        let m64: Vec<f64> = m.iter().map(|&x| f64::from(x)).collect();
        assert!(m64 == a.corrections.mask, "{name} correct_into: mask");
        for (i, (&got, &want)) in w.iter().zip(want_w).enumerate() {
            assert_eq!(got, want as f32, "{name} correct_into: weight {i}");
        }
        assert!(c3.metrics.contains_key("trmask/log_kept_mass_mean"));
        if name == "cpu" {
            same(&format!("{name} vs the CLI"), &c3.metrics, &cli);
        }
    }
}
