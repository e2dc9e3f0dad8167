//! The front door: framework-named dumps, explicit layouts, Python-written JSON, YAML configs,
//! the one-screen summary, `--metrics -` and `--metrics-jsonl`.

use crate::common;

use serde_json::{json, Map, Value};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    common::scratch("front", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

/// A padded [6, 9] batch with docs/FORMAT.md's names; `nan_pad` puts NaN (as Python writes it: a bare
/// literal, added by the caller) at padding, else plain numbers.
fn batch(seed: u64) -> Map<String, Value> {
    let mut r = common::Rng::new(seed);
    let (b, t) = (6, 9);
    let mut roll = Vec::new();
    let mut old = Vec::new();
    let mut mask = Vec::new();
    let mut ids = Vec::new();
    let mut adv = Vec::new();
    for s in 0..b {
        let len = 2 + r.below(t - 1);
        let a = r.range(-1.0, 1.0);
        adv.push(a);
        let (mut rr, mut oo, mut mm, mut ii) = (vec![], vec![], vec![], vec![]);
        for p in 0..t {
            let x = r.range(-4.0, -0.01);
            rr.push(x);
            oo.push(x + r.range(-0.3, 0.3) * (1.0 + s as f64 / 2.0));
            mm.push((p < len) as u8);
            ii.push(r.below(1000));
        }
        roll.push(rr);
        old.push(oo);
        mask.push(mm);
        ids.push(ii);
    }
    let mut m = Map::new();
    m.insert("rollout_log_prob".into(), json!(roll));
    m.insert("old_log_prob".into(), json!(old));
    m.insert("response_mask".into(), json!(mask));
    m.insert("responses".into(), json!(ids));
    m.insert("seq_adv".into(), json!(adv));
    m
}

fn renamed(m: &Map<String, Value>, map: &[(&str, &str)]) -> Map<String, Value> {
    m.iter()
        .map(|(k, v)| {
            let k = map.iter().find(|p| p.0 == k).map_or(k.as_str(), |p| p.1);
            (k.to_string(), v.clone())
        })
        .collect()
}

fn analyze_metrics(name: &str, text: &str, extra: &[&str]) -> (i32, String, String, Value) {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    let mp = tmp(&format!("{name}.metrics.json"));
    let _ = std::fs::remove_file(&mp);
    let mut args = vec![
        "analyze",
        p.to_str().unwrap(),
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs",
        "--metrics",
        mp.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = run(&args);
    let m = if code == 0 {
        common::load_json(&mp)
    } else {
        Value::Null
    };
    (code, out, err, m)
}

#[test]
fn verl_and_trl_names_give_the_spec_metrics() {
    let base = batch(7);
    let spec = Value::Object(base.clone()).to_string();
    let (code, _, err, want) = analyze_metrics("spec.json", &spec, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("input:"), "no mapping for plain names: {err}");
    let verl = renamed(
        &base,
        &[
            ("old_log_prob", "old_log_probs"),
            ("rollout_log_prob", "rollout_log_probs"),
        ],
    );
    let (code, _, err, got) = analyze_metrics("verl.json", &Value::Object(verl).to_string(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("input: verl names (old_log_probs → old_log_prob, rollout_log_probs → rollout_log_prob)"),
        "{err}"
    );
    assert_eq!(got, want);
    let trl = renamed(
        &base,
        &[
            ("old_log_prob", "old_per_token_logps"),
            ("rollout_log_prob", "sampling_per_token_logps"),
            ("response_mask", "completion_mask"),
            ("responses", "completion_ids"),
        ],
    );
    let (code, _, err, got) = analyze_metrics("trl.json", &Value::Object(trl).to_string(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("input: TRL names ("), "{err}");
    assert!(err.contains("completion_mask → response_mask"), "{err}");
    assert_eq!(got, want);
    // SkyRL and slime spellings map too
    let sky = renamed(
        &base,
        &[
            ("old_log_prob", "action_log_probs"),
            ("rollout_log_prob", "rollout_logprobs"),
            ("response_mask", "loss_mask"),
        ],
    );
    let (code, _, err, got) = analyze_metrics("sky.json", &Value::Object(sky).to_string(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("input: SkyRL names"), "{err}");
    assert_eq!(got, want);
}

#[test]
fn trl_per_sequence_advantages_broadcast_over_the_row() {
    let mut base = batch(8);
    let adv = base.remove("seq_adv").unwrap();
    let rows: Vec<Vec<f64>> = adv
        .as_array()
        .unwrap()
        .iter()
        .map(|a| vec![a.as_f64().unwrap(); 9])
        .collect();
    let mut full = base.clone();
    full.insert("advantages".into(), json!(rows));
    let mut per_seq = base;
    per_seq.insert("advantages".into(), adv);
    let a = trmask::io::batch_from_json(&Value::Object(full).to_string()).unwrap();
    let b = trmask::io::batch_from_json(&Value::Object(per_seq).to_string()).unwrap();
    assert_eq!(a.advantages(), b.advantages());
    assert!(a.advantages().is_some());
}

#[test]
fn ambiguous_and_missing_names_are_errors_naming_them() {
    let mut m = batch(9);
    m.insert("old_log_probs".into(), m["old_log_prob"].clone());
    let (code, _, err, _) = analyze_metrics("amb.json", &Value::Object(m).to_string(), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`old_log_prob`") && err.contains("`old_log_probs`"),
        "{err}"
    );
    let m = renamed(&batch(9), &[("rollout_log_prob", "rollout_logprob")]);
    let (code, _, err, _) = analyze_metrics("miss.json", &Value::Object(m).to_string(), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`rollout_log_prob`") && err.contains("found `rollout_logprob`"),
        "{err}"
    );
    // AReaL's inverted "old" is suggested, never mapped
    let m = renamed(&batch(9), &[("rollout_log_prob", "old_logprobs")]);
    let (code, _, err, _) = analyze_metrics("areal.json", &Value::Object(m).to_string(), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("found `old_logprobs`") && err.contains("AReaL"),
        "{err}"
    );
}

#[test]
fn layouts_are_never_guessed() {
    // [B, T] without response_mask or cu_seqlens
    let mut m = batch(10);
    m.remove("response_mask");
    let text = Value::Object(m).to_string();
    let (code, _, err, _) = analyze_metrics("nomask.json", &text, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("response_mask") && err.contains("cu_seqlens"),
        "{err}"
    );
    assert!(err.lines().count() == 1, "one line: {err}");
    let (code, _, err, _) = analyze_metrics("nomask2.json", &text, &["--all-valid"]);
    assert_eq!(code, 0, "{err}");
    // 1-D without cu_seqlens
    let one = r#"{"rollout_log_prob": [-1, -2, -0.5], "old_log_prob": [-1.1, -2, -0.4]}"#;
    let (code, _, err, _) = analyze_metrics("flat.json", one, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("response_mask") && err.contains("cu_seqlens"),
        "{err}"
    );
    let (code, _, err, m) = analyze_metrics("flat2.json", one, &["--all-valid"]);
    assert_eq!(code, 0, "{err}");
    let packed = r#"{"rollout_log_prob": [-1, -2, -0.5], "old_log_prob": [-1.1, -2, -0.4], "cu_seqlens": [0, 3]}"#;
    let (code, _, err, m2) = analyze_metrics("flat3.json", packed, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(m, m2, "--all-valid on [N] is one sequence");
}

#[test]
fn a_sampled_token_with_minus_infinity_rollout_logit_is_exit_2() {
    for backend in ["cpu", "auto"] {
        let text = r#"{"rollout_logits": [[[0, -Infinity, 1], [0, 0, 0]]],
            "old_logits": [[[0, 0.1, 1], [0, 0, 0.2]]],
            "responses": [[1, 2]], "response_mask": [[1, 1]]}"#;
        let p = tmp("neginf.json");
        std::fs::write(&p, text).unwrap();
        let (code, _, err) = run(&["analyze", p.to_str().unwrap(), "--backend", backend]);
        assert_eq!(code, 2, "{backend}: {err}");
        assert!(
            err.contains("`responses`") && err.contains("[0, 0]"),
            "{err}"
        );
        // the same -inf at padding, or at an unsampled id, is legal
        let ok = text.replace("\"response_mask\": [[1, 1]]", "\"response_mask\": [[0, 1]]");
        std::fs::write(&p, ok).unwrap();
        let (code, _, err) = run(&["analyze", p.to_str().unwrap(), "--backend", backend]);
        assert_eq!(code, 0, "{backend}: {err}");
    }
    // the engine-level check agrees (library users who skip Batch::validate)
    let l = trmask::Logits::from_f32(&[0.0, f32::NEG_INFINITY, 1.0], 1, 3).unwrap();
    let e = trmask::cpu::vocab_divergence(&l, &l, Some(&[1]), &[true], 1.0).unwrap_err();
    assert!(
        e.to_string().contains("`responses`") && e.to_string().contains("slot 0"),
        "{e}"
    );
}

#[test]
fn python_json_with_nan_and_null_at_padding_gives_identical_metrics() {
    let base = batch(11);
    let (code, _, err, want) =
        analyze_metrics("py0.json", &Value::Object(base.clone()).to_string(), &[]);
    assert_eq!(code, 0, "{err}");
    // padding as Python's json.dump writes float('nan') and None
    let mask: Vec<Vec<f64>> = common::json_flatten(&base["response_mask"])
        .chunks(9)
        .map(|c| c.to_vec())
        .collect();
    let mut text = String::from("{");
    for (i, name) in ["rollout_log_prob", "old_log_prob", "responses"]
        .iter()
        .enumerate()
    {
        let v = common::json_flatten(&base[*name]);
        let rows: Vec<String> = v
            .chunks(9)
            .enumerate()
            .map(|(b, row)| {
                let cells: Vec<String> = row
                    .iter()
                    .enumerate()
                    .map(|(t, x)| match (mask[b][t] == 0.0, i) {
                        (true, 0) => "NaN".into(),
                        (true, 1) => "null".into(),
                        (true, _) => "null".into(),
                        _ => format!("{x:?}"),
                    })
                    .collect();
                format!("[{}]", cells.join(", "))
            })
            .collect();
        text.push_str(&format!("\"{name}\": [{}], ", rows.join(", ")));
    }
    text.push_str(&format!(
        "\"response_mask\": {}, \"note\": NaN}}",
        base["response_mask"]
    ));
    let (code, _, err, got) = analyze_metrics("py1.json", &text, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(got, want);
    // null at a valid position names the tensor and the position
    let mut bad = base.clone();
    bad["rollout_log_prob"][0][0] = Value::Null;
    let bad = Value::Object(bad).to_string();
    let (code, _, err, _) = analyze_metrics("py2.json", &bad, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`rollout_log_prob`") && err.contains("null at valid position [0, 0]"),
        "{err}"
    );
}

#[test]
fn yaml_config_with_verl_nesting() {
    let base = batch(12);
    let p = tmp("y.json");
    std::fs::write(&p, Value::Object(base).to_string()).unwrap();
    let y = tmp("cfg.yaml");
    std::fs::write(
        &y,
        "algorithm:\n  rollout_correction:\n    rollout_is: token\n    rollout_is_threshold: 2.0\n    rollout_rs: seq_mean_k3\n    rollout_rs_threshold: 0.01\n",
    )
    .unwrap();
    let j = tmp("cfg.json");
    std::fs::write(
        &j,
        r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}"#,
    )
    .unwrap();
    let mut got = Vec::new();
    for cfg in [&y, &j] {
        let (code, out, err) = run(&[
            "analyze",
            p.to_str().unwrap(),
            "--backend",
            "cpu",
            "--config",
            cfg.to_str().unwrap(),
            "--metrics",
            "-",
        ]);
        assert_eq!(code, 0, "{err}");
        let m: Value = serde_json::from_str(&out).expect("stdout is the metrics JSON");
        assert!(
            err.contains("reject sequence if seq_mean_k3 > 0.01"),
            "{err}"
        );
        got.push(m);
    }
    assert_eq!(got[0], got[1]);
}

#[test]
fn summary_fits_one_screen_and_names_the_preset() {
    let (code, out, err) = run(&[
        "analyze",
        "data/sample/real-small.safetensors",
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() <= 40, "{out}");
    assert!(out.contains("preset decoupled_k3_rs"), "{out}");
    assert!(out.contains("reject sequence if seq_mean_k3 > "), "{out}");
    assert!(out.contains("k3 mean"), "{out}");
    assert!(out.contains("worst sequences by seq_mean_k3"), "{out}");
    assert!(out.contains("B* = "), "{out}");
    assert!(
        !out.contains("rollout_corr/"),
        "full table only with --all-metrics: {out}"
    );
    let accepted = out.lines().find(|l| l.starts_with("accepted:")).unwrap();
    assert!(
        !accepted.contains('.') || accepted.contains("mean length"),
        "{accepted}"
    );
    let (code, all, _) = run(&[
        "analyze",
        "data/sample/real-small.safetensors",
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs",
        "--all-metrics",
    ]);
    assert_eq!(code, 0);
    assert!(
        all.contains("rollout_corr/rollout_rs_seq_mean_k3_masked_fraction")
            || all.contains("rollout_corr/"),
        "{all}"
    );
    let (code, none, _) = run(&[
        "analyze",
        "data/sample/real-small.safetensors",
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 0);
    assert!(none.contains("no correction configured"), "{none}");
    let (_, help, _) = run(&["analyze", "--help"]);
    assert!(
        help.contains("decoupled_k3_rs") && help.contains("trm_max"),
        "{help}"
    );
    assert!(!help.contains("SPEC"), "{help}");
}

#[test]
fn many_steps_append_one_json_line_each() {
    let dir = tmp("steps");
    std::fs::create_dir_all(&dir).unwrap();
    let mut paths = Vec::new();
    for k in 0..3 {
        let mut m = batch(20 + k);
        if k == 1 {
            m.insert("step".into(), json!(41));
        }
        let p = dir.join(format!("s{k}.json"));
        std::fs::write(&p, Value::Object(m).to_string()).unwrap();
        paths.push(p.to_str().unwrap().to_string());
    }
    let jl = dir.join("m.jsonl");
    let _ = std::fs::remove_file(&jl);
    let mut args = vec!["analyze"];
    args.extend(paths.iter().map(String::as_str));
    args.extend(["--backend", "cpu", "--metrics-jsonl", jl.to_str().unwrap()]);
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("trmask analyze").count(), 3, "{out}");
    let lines: Vec<Value> = std::fs::read_to_string(&jl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let steps: Vec<f64> = lines.iter().map(|l| l["step"].as_f64().unwrap()).collect();
    assert_eq!(steps, vec![0.0, 41.0, 2.0]);
    for (l, p) in lines.iter().zip(&paths) {
        assert_eq!(l["input"], json!(p));
        assert!(l["trmask/k3_mean"].as_f64().unwrap() > 0.0);
    }
    assert_ne!(lines[0]["trmask/k3_mean"], lines[2]["trmask/k3_mean"]);
}

#[test]
fn ddot_output_is_the_one_the_mask_used() {
    let batch = trmask::io::read_batch(std::path::Path::new(
        "data/sample/real-small-topk.safetensors",
    ))
    .unwrap();
    let engine = trmask::cpu::CpuEngine::new();
    let get = |a: &trmask::analysis::Analysis, n: &str| {
        a.outputs
            .iter()
            .find(|o| o.name == n)
            .unwrap_or_else(|| panic!("no output {n}"))
            .data
            .clone()
    };
    let mut seen = Vec::new();
    for (direction, want) in [
        ("predictive_uniform", "ddot_uniform"),
        ("predictive_aggregated", "ddot_aggregated"),
        ("ratio", "ddot_aggregated"),
    ] {
        let cfg = trmask::CorrectionConfig::from_json_str(&format!(
            r#"{{"dppo": {{"delta": 0.05, "direction": "{direction}"}}}}"#
        ))
        .unwrap();
        let a = trmask::analysis::analyze(&engine, &batch, &cfg).unwrap();
        let (agg, uni) = (get(&a, "ddot_aggregated"), get(&a, "ddot_uniform"));
        assert_ne!(agg, uni, "the sample distinguishes the two");
        assert_eq!(get(&a, "ddot"), get(&a, want), "{direction}");
        assert_eq!(
            a.metrics["trmask/ddot_mean"],
            a.metrics[&format!("trmask/{want}_mean")]
        );
        seen.push(get(&a, "ddot"));
    }
    assert_ne!(seen[0], seen[1]);
}
