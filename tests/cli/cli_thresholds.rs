//! The threshold commands through the binary: `bounds --target-error`, `check`, `calibrate`,
//! `compare`, `report --jsonl`, and the sweep in `analyze --metrics`.

use std::path::PathBuf;

use crate::common;

fn tmp(name: &str) -> PathBuf {
    common::scratch("cli_thresholds", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

#[test]
fn bounds_target_error_round_trips() {
    let (code, out, err) = run(&[
        "bounds",
        "--horizon",
        "4096",
        "--target-error",
        "4.096",
        "--eps",
        "5e-3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let delta = v["delta"].as_f64().unwrap();
    assert_eq!(v["eps_from"], "given");
    let b = trmask::bounds::compute(&trmask::bounds::BoundInputs {
        eps: Some(5e-3),
        ..trmask::bounds::BoundInputs::new(4096, delta)
    })
    .unwrap();
    assert!((b.unified - 4.096).abs() <= 1e-9 * 4.096, "{}", b.unified);
    assert_eq!(v["bounds"]["argmin"], b.argmin);
    // the table names the answer and the bound attaining it
    let (code, out, _) = run(&["bounds", "--horizon", "4096", "--target-error", "1"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("largest delta with B* <= 1: delta = "),
        "{out}"
    );
    assert!(
        out.contains("(pinsker)") && out.contains("attained by"),
        "{out}"
    );
    // neither --delta nor --target-error; both; a target no δ reaches
    for args in [
        vec!["bounds", "--horizon", "10"],
        vec![
            "bounds",
            "--horizon",
            "10",
            "--delta",
            "1e-3",
            "--target-error",
            "1",
        ],
        vec!["bounds", "--horizon", "1", "--target-error", "1"],
        vec!["bounds", "--horizon", "10", "--target-error", "0"],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// A random padded batch as JSON: `b` sequences of up to `t` tokens, rollout log-probs in
/// [−3, −0.01], the trainer's = rollout's + `offset` + noise of scale `noise` (bitwise equal
/// when both are 0).
fn batch_json(seed: u64, b: usize, t: usize, offset: f64, noise: f64) -> String {
    let mut rng = common::Rng::new(seed);
    let mut roll = Vec::new();
    let mut train = Vec::new();
    let mut mask = Vec::new();
    for _ in 0..b {
        let len = 1 + rng.below(t);
        let (mut r, mut o, mut m) = (Vec::new(), Vec::new(), Vec::new());
        for j in 0..t {
            let x = rng.range(-3.0, -0.3);
            let shift = if noise == 0.0 && offset == 0.0 {
                0.0
            } else {
                offset + noise * rng.range(-1.0, 1.0)
            };
            r.push(x);
            o.push(if shift == 0.0 { x } else { x + shift });
            m.push(u8::from(j < len));
        }
        roll.push(r);
        train.push(o);
        mask.push(m);
    }
    serde_json::json!({"rollout_log_prob": roll, "old_log_prob": train, "response_mask": mask})
        .to_string()
}

fn write(name: &str, text: &str) -> String {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn check_exit_codes() {
    let same = write("check_same.json", &batch_json(1, 8, 16, 0.0, 0.0));
    let off = write("check_off.json", &batch_json(2, 8, 16, 0.0, 0.05));
    // a bitwise-identical stack passes the zero limit, a mismatched one does not
    let (code, out, err) = run(&[
        "check",
        &same,
        "--backend",
        "cpu",
        "--max-abs-log-ratio",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok: "), "{out}");
    let (code, out, err) = run(&[
        "check",
        &off,
        "--backend",
        "cpu",
        "--max-abs-log-ratio",
        "0",
    ]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("violation: ") && out.contains("--max-abs-log-ratio"));
    // a loose limit passes; two violated limits give two lines
    let (code, _, err) = run(&[
        "check",
        &off,
        "--backend",
        "cpu",
        "--max-abs-log-ratio",
        "0.06",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = run(&[
        "check",
        &off,
        "--backend",
        "cpu",
        "--max-abs-log-ratio",
        "0.01",
        "--max-mean-k3",
        "1e-9",
    ]);
    assert_eq!(code, 3);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("violation: ")).count(),
        2,
        "{out}"
    );
    // the reject rate under a preset: every sequence rejected at a tiny threshold
    let cfg = write(
        "check_cfg.json",
        r#"{"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 1e-9}"#,
    );
    let (code, out, err) = run(&[
        "check",
        &off,
        "--backend",
        "cpu",
        "--config",
        &cfg,
        "--max-reject-rate",
        "0.5",
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(out.contains("8 of 8 sequences"), "{out}");
    let (code, _, err) = run(&[
        "check",
        &same,
        "--backend",
        "cpu",
        "--config",
        &cfg,
        "--max-reject-rate",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    // the same verdicts on the GPU engine (a software adapter here)
    if common::gpu().is_some() {
        for (input, limit, want) in [(&same, "0", 0), (&off, "0", 3), (&off, "0.06", 0)] {
            let (code, _, err) = run(&[
                "check",
                input,
                "--backend",
                "gpu",
                "--max-abs-log-ratio",
                limit,
            ]);
            assert_eq!(code, want, "gpu {input} {limit}: {err}");
        }
    }
    // usage errors stay 2: no limit, a bad limit, a missing file
    for args in [
        vec!["check", same.as_str(), "--backend", "cpu"],
        vec!["check", same.as_str(), "--max-mean-k3", "-1"],
        vec!["check", same.as_str(), "--max-reject-rate", "2"],
        vec!["check", "/nonexistent/x.json", "--max-mean-k3", "1"],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}

#[test]
fn analyze_metrics_carry_the_sweep_and_the_summary_says_it() {
    let input = write("sweep_in.json", &batch_json(5, 20, 12, 0.0, 0.05));
    let cfg = write(
        "sweep_cfg.json",
        r#"{"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 3e-4}"#,
    );
    let m = tmp("sweep_metrics.json");
    let (code, out, err) = run(&[
        "analyze",
        &input,
        "--backend",
        "cpu",
        "--config",
        &cfg,
        "--metrics",
        m.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("sweep: seq_mean_k3 = 3.000e-4 rejects "),
        "{out}"
    );
    let v = common::load_json(&m);
    let s = &v["trmask/sweep/seq_mean_k3"];
    assert_eq!(s["configured"].as_f64(), Some(3e-4));
    let t = s["threshold"].as_array().unwrap();
    let f = s["rejected_seq_fraction"].as_array().unwrap();
    assert_eq!(t.len(), 50);
    assert_eq!(f.len(), 50);
    assert_eq!(s["rejected_token_fraction"].as_array().unwrap().len(), 50);
    // still every scalar metric
    assert!(v["trmask/k3_mean"].is_number());
}

/// `(rejected, live)` sequences of `input` with `option` at `threshold` (the library's own run).
fn recount(input: &str, option: &str, threshold: f64) -> (usize, usize) {
    let b = trmask::io::read_batch(std::path::Path::new(input)).unwrap();
    let cfg = trmask::CorrectionConfig::from_json_value(
        &serde_json::json!({"rollout_rs": option, "rollout_rs_threshold": threshold}),
    )
    .unwrap();
    let a = trmask::analysis::analyze(&trmask::cpu::CpuEngine::new(), &b, &cfg).unwrap();
    let c = &a.corrections;
    let live: Vec<usize> = (0..c.seq_len.len()).filter(|&i| c.seq_len[i] > 0).collect();
    (
        live.iter().filter(|&&i| !c.seq_accept[i]).count(),
        live.len(),
    )
}

#[test]
fn calibrate_hits_the_target_rate() {
    let inputs: Vec<String> = (0..4)
        .map(|k| {
            write(
                &format!("cal{k}.json"),
                &batch_json(10 + k, 30 + 7 * k as usize, 16, 0.0, 0.05),
            )
        })
        .collect();
    for (option, rate) in [
        ("seq_mean_k3", 0.1),
        ("seq_max_k2", 0.25),
        ("token_abs", 0.05),
    ] {
        let mut args = vec!["calibrate"];
        args.extend(inputs.iter().map(String::as_str));
        let r = rate.to_string();
        args.extend([
            "--criterion",
            option,
            "--target-reject-rate",
            &r,
            "--backend",
            "cpu",
            "--json",
        ]);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{option}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let t = v["threshold"].as_f64().unwrap();
        let (mut rejected, mut total) = (0usize, 0usize);
        for (k, input) in inputs.iter().enumerate() {
            let (rej, live) = recount(input, option, t);
            rejected += rej;
            total += live;
            // the batch's own threshold hits the rate in that batch within one sequence
            let own = v["batches"][k]["threshold"].as_f64().unwrap();
            let (rej_own, _) = recount(input, option, own);
            let want = rate * live as f64;
            assert!(
                (rej_own as f64 - want).abs() <= 1.0,
                "{option} batch {k}: {rej_own} vs {want}"
            );
        }
        // pooled: within one sequence per batch of the target over all of them
        let want = rate * total as f64;
        assert!(
            (rejected as f64 - want).abs() <= inputs.len() as f64,
            "{option}: {rejected} of {total} rejected, target {want}"
        );
        let s = &v["spread"];
        assert!(s["min"].as_f64().unwrap() <= s["median"].as_f64().unwrap());
        assert!(s["median"].as_f64().unwrap() <= s["max"].as_f64().unwrap());
        assert_eq!(v["noise_floor"]["rollout"], "f64");
    }
}

#[test]
fn calibrate_refuses_a_threshold_below_the_bf16_floor() {
    // bf16 log-probs whose mismatch is mostly one rounding step
    let mut rng = common::Rng::new(77);
    let bf = |x: f64| half::bf16::from_f64(x).to_f64();
    let (mut roll, mut old) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        let r: Vec<f64> = (0..8).map(|_| bf(rng.range(-3.0, -0.3))).collect();
        let o: Vec<f64> = r
            .iter()
            .map(|&x| bf(x + 1e-4 * rng.range(-1.0, 1.0)))
            .collect();
        roll.push(r);
        old.push(o);
    }
    let text = serde_json::json!({"rollout_log_prob": roll, "old_log_prob": old,
        "response_mask": vec![vec![1; 8]; 40]})
    .to_string();
    let input = write("cal_bf16.json", &text);
    let (code, _, err) = run(&[
        "calibrate",
        &input,
        "--criterion",
        "seq_mean_k3",
        "--target-reject-rate",
        "0.5",
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("noise floor") && err.contains("bf16"), "{err}");
    // a rate whose threshold is above the floor is answered, and the floor stated
    let (code, out, err) = run(&[
        "calibrate",
        &input,
        "--criterion",
        "seq_mean_k3",
        "--target-reject-rate",
        "0.0",
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("noise floor: bf16/bf16"), "{out}");
    // bad rates and criteria
    for args in [
        vec![
            "calibrate",
            input.as_str(),
            "--criterion",
            "seq_mean_k3",
            "--target-reject-rate",
            "1",
        ],
        vec![
            "calibrate",
            input.as_str(),
            "--criterion",
            "nonsense",
            "--target-reject-rate",
            "0.1",
        ],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}

#[test]
fn compare_self_and_a_known_offset() {
    let base = batch_json(21, 60, 16, 0.0, 0.05);
    let a = write("cmp_a.json", &base);
    // the same batch with the trainer's log-probs offset by 0.02
    let mut v: serde_json::Value = serde_json::from_str(&base).unwrap();
    for row in v["old_log_prob"].as_array_mut().unwrap() {
        for x in row.as_array_mut().unwrap() {
            *x = serde_json::json!(x.as_f64().unwrap() + 0.02);
        }
    }
    let b = write("cmp_b.json", &v.to_string());
    let cfg = write(
        "cmp_cfg.json",
        r#"{"rollout_rs": "token_k1", "rollout_rs_threshold": "0.97_1.2"}"#,
    );
    let json_of = |x: &str, y: &str| -> serde_json::Value {
        let (code, out, err) = run(&[
            "compare",
            x,
            y,
            "--backend",
            "cpu",
            "--config",
            &cfg,
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let same = json_of(&a, &a);
    for s in same["stats"].as_array().unwrap() {
        assert_eq!(s["shift"].as_f64(), Some(0.0), "{s}");
        assert!(s["p_value"].as_f64().unwrap() > 0.9, "{s}");
    }
    assert!(same["verdict"]
        .as_str()
        .unwrap()
        .starts_with("verdict: no shift"));
    for r in same["rejected"].as_array().unwrap() {
        assert_eq!(r["delta"].as_f64(), Some(0.0));
    }
    let off = json_of(&a, &b);
    let lr = off["stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["statistic"] == "log_ratio")
        .unwrap();
    let shift = lr["shift"].as_f64().unwrap();
    assert!((shift - 0.02).abs() < 1e-9, "shift {shift}");
    assert!(lr["p_value"].as_f64().unwrap() < 0.01, "{lr}");
    assert!(off["verdict"]
        .as_str()
        .unwrap()
        .contains("log_ratio median +2.000e-2"));
    // the offset pushes tokens past the k1 bound: more sequences rejected in B
    let any = off["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["criterion"] == "any")
        .unwrap();
    assert!(any["delta"].as_f64().unwrap() > 0.0, "{any}");
    // the text form and the page
    let page = tmp("cmp.html");
    let (code, out, err) = run(&[
        "compare",
        &a,
        &b,
        "--backend",
        "cpu",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l.starts_with("verdict: ")), "{out}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<svg") && html.contains("verdict: "));
    // an output that is an input, a missing input
    assert_eq!(run(&["compare", &a, &b, "-o", &a]).0, 2);
    assert_eq!(run(&["compare", &a, "/nonexistent.json"]).0, 2);
}

#[test]
fn report_jsonl_trend_marks_the_jump() {
    let mut inputs = Vec::new();
    for s in 0..30u64 {
        let noise = if s == 22 { 0.5 } else { 0.05 };
        let mut v: serde_json::Value =
            serde_json::from_str(&batch_json(100 + s, 20, 12, 0.0, noise)).unwrap();
        v["step"] = serde_json::json!(s);
        inputs.push(write(&format!("run{s}.json"), &v.to_string()));
    }
    let run_file = tmp("run.jsonl");
    let _ = std::fs::remove_file(&run_file);
    let mut args = vec![
        "analyze",
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs_token_tis",
    ];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--metrics-jsonl", run_file.to_str().unwrap()]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let page = tmp("run.html");
    let (code, out, err) = run(&[
        "report",
        "--jsonl",
        run_file.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(30 steps)"), "{out}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("jumps at 1 step"), "no single jump marked");
    assert!(html.contains("run22.json"), "the jump is not step 22's");
    for title in [
        "Mismatch",
        "Largest |log rho|",
        "IS weight max",
        "Truncated IS weights",
        "Rejected sequences",
        "Rejected tokens",
        "Kept fraction",
        "Effective sample size",
        "Bound B*",
    ] {
        assert!(
            html.contains(&format!("<figcaption>{title}</figcaption>")),
            "{title}"
        );
    }
    // a line that is not JSON names the file and line; INPUT and --jsonl together are refused
    let bad = write("bad.jsonl", "{\"step\": 1}\nnot json\n");
    let (code, _, err) = run(&["report", "--jsonl", &bad, "-o", page.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2"), "{err}");
    let (code, _, _) = run(&[
        "report",
        &inputs[0],
        "--jsonl",
        &bad,
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    // flags that do not apply to a run's metrics are refused, not ignored
    let (code, _, err) = run(&[
        "report",
        "--jsonl",
        run_file.to_str().unwrap(),
        "--preset",
        "trm_avg",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--jsonl"), "{err}");
}

/// `check` cannot pass a gate that cannot fail: `--max-reject-rate` without a rejection
/// criterion is a usage error, as is no limit at all (which names the flags).
#[test]
fn check_refuses_a_gate_that_cannot_fail() {
    let b = "data/causal-sample/stale.safetensors";
    let (code, _, err) = run(&["check", b, "--backend", "cpu", "--max-reject-rate", "0.1"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--max-reject-rate can never be exceeded"),
        "{err}"
    );
    let (code, _, err) = run(&["check", b, "--backend", "cpu"]);
    assert_eq!(code, 2, "{err}");
    for flag in ["--max-abs-log-ratio", "--max-mean-k3", "--max-reject-rate"] {
        assert!(err.contains(flag), "{err}");
    }
    assert!(!err.contains("invalid config"), "{err}");
    // with a criterion the same gate trips: every sequence of the stale batch is over 0.01
    let (code, out, err) = run(&[
        "check",
        b,
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs",
        "--max-reject-rate",
        "0.1",
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(out.contains("64 of 64 sequences"), "{out}");
}

/// `--preset` with `--config`: the preset, with the config file's keys overriding its own.
#[test]
fn preset_with_config_overrides_the_presets_keys() {
    let (code, out, err) = run(&[
        "analyze",
        "data/causal-sample/stale.safetensors",
        "--backend",
        "cpu",
        "--preset",
        "decoupled_k3_rs_token_tis",
        "--config",
        "data/causal-sample/stale.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "preset decoupled_k3_rs_token_tis overridden by stale.yaml: IS token weights, \
             truncated at 2; reject sequence if seq_mean_k3 > 0.035"
        ),
        "{out}"
    );
    assert!(out.contains("rejected 19 sequences"), "{out}");
    // the IS line: verl's own metrics of the weights applied
    assert!(
        out.contains(
            "IS weights (token, truncated at 2): mean 0.9959, max 2, 0.5 % truncated, ESS"
        ),
        "{out}"
    );
}

/// One spiky step among 12 (the causal sample's run, step 07 scored by a stale trainer): the
/// pooled threshold is far above the per-step median, and a warning names the step.
#[test]
fn calibrate_names_the_step_that_dominates() {
    let mut args = vec!["calibrate".to_string()];
    args.extend((0..12).map(|k| format!("data/causal-sample/run/step-{k:02}.safetensors")));
    args.extend(
        [
            "--criterion",
            "seq_mean_k3",
            "--target-reject-rate",
            "0.05",
            "--backend",
            "cpu",
        ]
        .map(String::from),
    );
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = run(&a);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("per-step median threshold 5.694741e-5"),
        "{out}"
    );
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("warning: the pooled"))
        .collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(
        warned[0].contains("step-07.safetensors holds most"),
        "{err}"
    );
    assert!(!warned[0].contains("step-06"), "{err}");
    // the 12 steps' own threshold median is the JSON's too
    let mut j = a.clone();
    j.push("--json");
    let (_, out, _) = run(&j);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["dominated_by"][0],
        "data/causal-sample/run/step-07.safetensors"
    );
    assert!((v["per_step_median"].as_f64().unwrap() - 5.694741e-5).abs() < 1e-10);
}

/// A target that rounds to every sequence: half the smallest value rejects them all.
#[test]
fn calibrate_answers_a_reject_all_target() {
    let input = "data/causal-sample/run/step-00.safetensors";
    let (code, out, err) = run(&[
        "calibrate",
        input,
        "--criterion",
        "seq_mean_k3",
        "--target-reject-rate",
        "0.999999",
        "--backend",
        "cpu",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = v["threshold"].as_f64().unwrap();
    let (rejected, live) = recount(input, "seq_mean_k3", t);
    assert_eq!((rejected, live), (5, 5));
    assert_eq!(
        recount(input, "seq_mean_k3", 2.0 * t).0,
        4,
        "t is half the smallest value"
    );
}

#[test]
fn bounds_ends_with_a_reading() {
    let (code, out, err) = run(&["bounds", "--horizon", "4096", "--delta", "1e-4"]);
    assert_eq!(code, 0, "{err}");
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("reading: B* = 34.9") && last.contains("vacuous"),
        "{last}"
    );
    let (_, out, _) = run(&["bounds", "--horizon", "16", "--delta", "1e-6"]);
    let last = out.lines().last().unwrap();
    assert!(last.contains("is tight"), "{last}");
}
