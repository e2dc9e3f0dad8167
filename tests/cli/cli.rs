//! The command line through the binary: outputs of a good batch, exit code 2 with a message
//! naming the problem for bad ones.

use std::path::{Path, PathBuf};

use crate::common;

fn tmp(name: &str) -> PathBuf {
    common::scratch("cli", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

/// Writes `json` to a temp file and runs `analyze --backend cpu` on it.
fn analyze_json(name: &str, json: &str) -> (i32, String, String) {
    let p = tmp(name);
    std::fs::write(&p, json).unwrap();
    run(&["analyze", p.to_str().unwrap(), "--backend", "cpu"])
}

/// Writes `json` to a temp file, runs `analyze --backend cpu FLAG …json` on it (exit 0
/// expected; FLAG `--output` or `--metrics`) and returns that file's text.
fn analyze_to(name: &str, json: &str, flag: &str) -> String {
    let p = tmp(name);
    std::fs::write(&p, json).unwrap();
    let o = tmp(&format!("{name}{flag}.json"));
    let (code, _, err) = run(&[
        "analyze",
        p.to_str().unwrap(),
        "--backend",
        "cpu",
        flag,
        o.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{name}: {err}");
    std::fs::read_to_string(o).unwrap()
}

fn analyze_output(name: &str, json: &str) -> String {
    analyze_to(name, json, "--output")
}

fn assert_bad(res: (i32, String, String), needles: &[&str]) {
    let (code, _, err) = res;
    assert_eq!(code, 2, "expected exit 2, stderr: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one-line message expected: {err}"
    );
}

#[test]
fn analyze_writes_layout_preserving_outputs() {
    let out = tmp("mild_out.json");
    let (code, _, err) = run(&[
        "analyze",
        "data/verl-golden/inputs/mild.json",
        "--backend",
        "cpu",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for k in ["log_ratio", "k1", "k2", "k3", "modified_response_mask"] {
        let rows = v[k].as_array().unwrap_or_else(|| panic!("missing {k}"));
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[0].as_array().unwrap().len(), 24);
    }
    assert_eq!(v["seq_len"].as_array().unwrap().len(), 8);
}

#[test]
fn analyze_safetensors_output_roundtrips() {
    let out = tmp("sample_out.safetensors");
    let (code, stdout, err) = run(&[
        "analyze",
        "data/sample/real-small.safetensors",
        "--backend",
        "cpu",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("exact KL mean"), "{stdout}");
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kl = st.tensor("kl").unwrap();
    assert_eq!(kl.shape(), &[30]);
}

#[test]
fn missing_and_truncated_files_exit_2() {
    assert_bad(
        run(&["analyze", "does/not/exist.json", "--backend", "cpu"]),
        &["does/not/exist.json"],
    );
    let full = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/sample/real-small.safetensors"),
    )
    .unwrap();
    let p = tmp("truncated.safetensors");
    std::fs::write(&p, &full[..full.len() / 2]).unwrap();
    assert_bad(
        run(&["analyze", p.to_str().unwrap(), "--backend", "cpu"]),
        &["safetensors"],
    );
    assert_bad(
        analyze_json("broken.json", "{\"rollout_log_prob\": [1, 2"),
        &["JSON"],
    );
}

#[test]
fn bad_tensors_exit_2_naming_the_tensor() {
    let ok = r#""rollout_log_prob": [[-1, -2], [-1, 0]], "old_log_prob": [[-1, -2], [-1, 0]]"#;
    assert_bad(
        analyze_json(
            "nan.json",
            r#"{"rollout_log_prob": [[-1, "NaN"]], "old_log_prob": [[-1, -2]], "response_mask": [[1, 1]]}"#,
        ),
        &["rollout_log_prob", "[0, 1]", "finite"],
    );
    assert_bad(
        analyze_json(
            "mask.json",
            &format!(r#"{{{ok}, "response_mask": [[1, 2], [1, 0]]}}"#),
        ),
        &["response_mask", "not 0 or 1"],
    );
    assert_bad(
        analyze_json(
            "ragged.json",
            r#"{"rollout_log_prob": [[-1, -2], [-1]], "old_log_prob": [[-1, -2], [-1, 0]]}"#,
        ),
        &["rollout_log_prob", "ragged"],
    );
    assert_bad(
        analyze_json(
            "shape.json",
            r#"{"rollout_log_prob": [[-1, -2], [-1, 0]], "old_log_prob": [[-1, -2, 0], [-1, 0, 0]], "response_mask": [[1, 1], [1, 1]]}"#,
        ),
        &["old_log_prob", "shape"],
    );
    assert_bad(
        analyze_json(
            "cu.json",
            r#"{"rollout_log_prob": [-1, -2, -3], "old_log_prob": [-1, -2, -3], "cu_seqlens": [0, 2, 1, 3]}"#,
        ),
        &["cu_seqlens", "non-decreasing"],
    );
    assert_bad(
        analyze_json(
            "cu_end.json",
            r#"{"rollout_log_prob": [-1, -2, -3], "old_log_prob": [-1, -2, -3], "cu_seqlens": [0, 2]}"#,
        ),
        &["rollout_log_prob"],
    );
    assert_bad(
        analyze_json(
            "cu0.json",
            r#"{"rollout_log_prob": [-1, -2, -3], "old_log_prob": [-1, -2, -3], "cu_seqlens": [1, 3]}"#,
        ),
        &["cu_seqlens", "starts at 1"],
    );
    assert_bad(
        analyze_json("none.json", r#"{"other": [1, 2]}"#),
        &["rollout_log_prob"],
    );
    assert_bad(
        analyze_json(
            "ids.json",
            r#"{"rollout_logits": [[0, 1, 2]], "old_logits": [[0, 1, 2.5]], "responses": [3], "cu_seqlens": [0, 1]}"#,
        ),
        &["responses", "outside [0, 3)"],
    );
}

#[test]
fn padding_garbage_changes_nothing() {
    let a = r#"{"rollout_log_prob": [[-1, -2, 5], [-1, 0, 0]], "old_log_prob": [[-1.5, -2, 7], [-1, 0, 0]], "response_mask": [[1, 1, 0], [1, 0, 0]]}"#;
    let b = r#"{"rollout_log_prob": [[-1, -2, "NaN"], [-1, "Infinity", 3]], "old_log_prob": [[-1.5, -2, "-Infinity"], [-1, 99, "NaN"]], "response_mask": [[1, 1, 0], [1, 0, 0]]}"#;
    assert_eq!(analyze_output("pa.json", a), analyze_output("pb.json", b));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["analyze"]).0, 2);
    assert_eq!(run(&["frobnicate"]).0, 2);
    assert_bad(
        run(&[
            "analyze",
            "data/verl-golden/inputs/mild.json",
            "--backend",
            "tpu",
        ]),
        &["--backend"],
    );
}

#[test]
fn bounds_json_matches_the_paper() {
    let (code, out, err) = run(&["bounds", "--horizon", "4096", "--delta", "1e-4", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rel = |k: &str, want: f64| {
        let got = v[k].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-9 * want, "{k}: {got} vs {want}");
    };
    rel("classical_kl", 1677.312);
    let (code, out, err) = run(&[
        "bounds",
        "--horizon",
        "4096",
        "--delta",
        "1e-4",
        "--eps",
        "5e-3",
        "--kl-seq",
        "0.01",
        "--tv-seq",
        "0.05",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v2: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v2["argmin"], "mix_tv");
    assert!((v2["unified"].as_f64().unwrap() - 4.096).abs() < 1e-9 * 4.096);
    assert!((v2["coupling"].as_f64().unwrap() - 79.91).abs() < 1e-9 * 79.91);
    assert!((v2["pm_kl"].as_f64().unwrap() - 34.94609188629668).abs() < 1e-12 * 34.95);
    assert_bad(
        run(&["bounds", "--horizon", "0", "--delta", "1e-4"]),
        &["--horizon"],
    );
    assert_bad(
        run(&["bounds", "--horizon", "10", "--delta", "-1"]),
        &["--delta"],
    );
}

/// The GPU backend through the binary agrees with the CPU reference at the GPU tolerance.
#[test]
fn analyze_gpu_matches_cpu_through_the_binary() {
    if common::gpu().is_none() {
        return;
    }
    matches_cpu_through_the_binary("gpu");
}

/// `TRMASK_VOCAB_KERNEL` set but empty is no pin (the default runs); a value that does not parse
/// is a one-line error naming the variable (exit 2).
#[test]
fn an_empty_vocab_kernel_pin_is_no_pin() {
    if common::gpu().is_none() {
        return;
    }
    let with = |v: &str| {
        let out = common::trmask_bin()
            .env("TRMASK_VOCAB_KERNEL", v)
            .args([
                "analyze",
                "data/sample/real-small.safetensors",
                "--backend",
                "gpu",
            ])
            .output()
            .expect("run trmask");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), err)
    };
    for empty in ["", "  "] {
        let (code, err) = with(empty);
        assert_eq!(code, 0, "{empty:?}: {err}");
    }
    let (code, err) = with("wg=0");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("TRMASK_VOCAB_KERNEL"), "{err}");
}

#[test]
fn analyze_cpu_fast_matches_cpu_through_the_binary() {
    matches_cpu_through_the_binary("cpu-fast");
}

/// `trmask analyze --backend BACKEND` on the real sample against `--backend cpu`, at the GPU
/// engine's tolerance; the same decisions.
fn matches_cpu_through_the_binary(backend: &str) {
    let read = |backend: &str| -> serde_json::Value {
        let out = tmp(&format!("sample_{backend}.json"));
        let (code, _, err) = run(&[
            "analyze",
            "data/sample/real-small.safetensors",
            "--backend",
            backend,
            "--preset",
            "decoupled_k3_rs",
            "--output",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
    };
    let (g, c) = (read(backend), read("cpu"));
    assert_ne!(g["kl"], c["kl"], "{backend}: its own precision ran");
    for (k, rtol, atol) in [
        ("kl", 2e-3, 1e-7),
        ("kl_rev", 2e-3, 1e-7),
        ("tv", 2e-3, 1e-7),
        ("rollout_entropy", 1e-4, 1e-6),
        ("log_ratio", 2e-5, 2e-6),
        ("k3", 2e-5, 2e-6),
    ] {
        let (gv, cv) = (g[k].as_array().unwrap(), c[k].as_array().unwrap());
        assert_eq!(gv.len(), 30, "{k}");
        for (i, (a, b)) in gv.iter().zip(cv).enumerate() {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!(
                (a - b).abs() <= atol + rtol * b.abs(),
                "{k}[{i}]: {backend} {a} cpu {b}"
            );
        }
    }
    assert_eq!(g["seq_accept"], c["seq_accept"]);
}

/// docs/FORMAT.md (Config): `rollout_is` with `rollout_is_threshold: null` skips IS as verl does (no weights,
/// the mask and metrics of the same config without IS) with one `warning:` line.
#[test]
fn null_is_threshold_skips_importance_weighting_with_a_warning() {
    let input = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/verl-golden/inputs/mild.json"
    );
    let rs = r#""rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.001"#;
    let mut results = Vec::new();
    for (name, cfg) in [
        (
            "null-token",
            format!(r#"{{"rollout_is": "token", "rollout_is_threshold": null, {rs}}}"#),
        ),
        (
            "null-seq",
            format!(r#"{{"rollout_is": "sequence", "rollout_is_threshold": null, {rs}}}"#),
        ),
        ("no-is", format!("{{{rs}}}")),
    ] {
        let c = tmp(&format!("{name}.cfg.json"));
        std::fs::write(&c, cfg).unwrap();
        let (o, m) = (
            tmp(&format!("{name}.out.json")),
            tmp(&format!("{name}.m.json")),
        );
        let (code, _, err) = run(&[
            "analyze",
            input,
            "--config",
            c.to_str().unwrap(),
            "--backend",
            "cpu",
            "--output",
            o.to_str().unwrap(),
            "--metrics",
            m.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{name}: {err}");
        let warned = err
            .lines()
            .filter(|l| l.starts_with("warning: rollout_is is"))
            .count();
        assert_eq!(warned, usize::from(name != "no-is"), "{name}: {err}");
        let out = std::fs::read_to_string(&o).unwrap();
        assert!(!out.contains("rollout_is_weights"), "{name}");
        results.push((out, std::fs::read_to_string(&m).unwrap()));
    }
    assert_eq!(results[0], results[2]);
    assert_eq!(results[1], results[2]);
}

/// docs/FORMAT.md (Layout): empty sequences are legal, so a packed safetensors batch may hold more sequences
/// than tokens (as JSON always could).
#[test]
fn packed_batch_with_more_sequences_than_tokens() {
    use safetensors::tensor::{Dtype as D, TensorView};
    let bytes = |v: &[f64], d: D| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match d {
                D::F32 => (x as f32).to_le_bytes().to_vec(),
                D::I64 => (x as i64).to_le_bytes().to_vec(),
                _ => x.to_le_bytes().to_vec(),
            })
            .collect()
    };
    // a packed pair of log-probs with these offsets, written to `name`
    let file = |name: &str, cu: &[f64], d: D| {
        let (roll, old, cu_b) = (
            bytes(&[-1.0, -0.5], D::F64),
            bytes(&[-1.0, -0.4], D::F64),
            bytes(cu, d),
        );
        let views = vec![
            (
                "rollout_log_prob",
                TensorView::new(D::F64, vec![2], &roll).unwrap(),
            ),
            (
                "old_log_prob",
                TensorView::new(D::F64, vec![2], &old).unwrap(),
            ),
            (
                "cu_seqlens",
                TensorView::new(d, vec![cu.len()], &cu_b).unwrap(),
            ),
        ];
        let p = tmp(name);
        std::fs::write(&p, safetensors::serialize(views, None).unwrap()).unwrap();
        p
    };
    let p = file("s-gt-n.safetensors", &[0.0, 0.0, 1.0, 1.0, 2.0], D::I64);
    let o = tmp("s-gt-n.out.json");
    let (code, _, err) = run(&[
        "analyze",
        p.to_str().unwrap(),
        "--backend",
        "cpu",
        "--output",
        o.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let out = common::load_json(&o);
    assert_eq!(
        common::json_flatten(&out["seq_len"]),
        vec![0.0, 1.0, 0.0, 1.0]
    );
    // offsets are int32 / int64 (docs/FORMAT.md, Layout)
    let p = file("cu-f32.safetensors", &[0.0, 1.0, 2.0], D::F32);
    assert_bad(
        run(&["analyze", p.to_str().unwrap(), "--backend", "cpu"]),
        &["`cu_seqlens`", "F32"],
    );
    // a batch whose every sequence is empty names the packed layout's tensor
    assert_bad(
        analyze_json(
            "all-empty.json",
            r#"{"rollout_log_prob": [], "old_log_prob": [], "cu_seqlens": [0, 0, 0]}"#,
        ),
        &["`cu_seqlens`", "every sequence is empty"],
    );
}

/// docs/FORMAT.md (Input tensors): null at padding is accepted in logits too (a null at a valid row is an error
/// naming the tensor); verl's string `uid`s are group labels; booleans only in the mask.
#[test]
fn json_nulls_labels_and_booleans() {
    let good = r#"{"rollout_logits": [[[0, 1], [null, null]]], "old_logits": [[[0, 1], [0, 1]]],
        "responses": [[1, 0]], "response_mask": [[1, 0]]}"#;
    let nan = good.replace("[null, null]", r#"["NaN", "NaN"]"#);
    assert_eq!(
        analyze_output("lnull.json", good),
        analyze_output("lnan.json", &nan)
    );
    assert_bad(
        analyze_json(
            "lnull-valid.json",
            &good.replace("[[0, 1], [null", "[[0, null], [null"),
        ),
        &[
            "`rollout_logits`",
            "null at valid position [0, 0], column 1",
        ],
    );
    let lp = r#""response_mask": [[1, 1], [1, 0]], "rollout_log_prob": [[-1, -1], [-1, 0]], "old_log_prob": [[-1.1, -1], [-0.9, 0]]"#;
    let metrics =
        |name: &str, uid: &str| analyze_to(name, &format!("{{\"uid\": {uid}, {lp}}}"), "--metrics");
    assert_eq!(
        metrics("uid-s.json", r#"["a", "b"]"#),
        metrics("uid-n.json", "[4, 9]")
    );
    assert_ne!(
        metrics("uid-s.json", r#"["a", "a"]"#),
        metrics("uid-n.json", "[4, 9]")
    );
    assert_bad(
        analyze_json(
            "bool.json",
            &format!("{{{}}}", lp.replace("[[-1, -1]", "[[-1, true]")),
        ),
        &["`rollout_log_prob`", "true is not a number"],
    );
}

/// `--output` names a .safetensors or .json file: never `-` (the summary's stream), never
/// another extension (its format would be a guess).
#[test]
fn output_must_name_a_file_of_a_known_format() {
    let input = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/verl-golden/inputs/mild.json"
    );
    for bad in ["-", "out.txt", "out"] {
        let p = tmp(bad);
        let arg = if bad == "-" {
            "-".to_string()
        } else {
            p.display().to_string()
        };
        assert_bad(
            run(&["analyze", input, "--backend", "cpu", "--output", &arg]),
            &["`--output`"],
        );
        assert!(bad == "-" || !p.exists(), "{bad} was written");
    }
}

/// What a user reads: a config from a pipe (`--config <(echo …)`, as docs/CLI.md shows), the
/// DPPO line in the config's own words, warnings naming their input when several share a
/// run, integral JSONL steps, `bounds --json` listing the filled `dbar`, and `devices` saying
/// what `--backend auto` runs on.
#[test]
fn what_the_user_reads() {
    let bin = env!("CARGO_BIN_EXE_trmask");
    let topk = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/sample/real-small-topk.safetensors"
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            r#"{bin} analyze {topk} --backend cpu --config <(echo '{{"dppo": {{"delta": 1e-4, "direction": "predictive_aggregated"}}}}')"#
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("DPPO token mask: topk_kl > 1.000e-4 (direction predictive_aggregated)"),
        "{text}"
    );
    assert!(text.contains("rejected 0 sequences, "), "{text}");

    let causal = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/causal-sample/batch.safetensors"
    );
    let small = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/sample/real-small.safetensors"
    );
    let jsonl = tmp("two.jsonl");
    let _ = std::fs::remove_file(&jsonl);
    let (code, _, err) = run(&[
        "analyze",
        small,
        causal,
        "--backend",
        "cpu",
        "--metrics-jsonl",
        jsonl.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let offset = err
        .lines()
        .find(|l| l.contains("a constant offset"))
        .expect(&err);
    // several inputs: each kind of warning once, after the summaries, naming its inputs
    assert!(
        offset.starts_with("warning: log_ratio has mean")
            && offset.ends_with("(in 1 of 2 inputs: batch)"),
        "{offset}"
    );
    let lines = std::fs::read_to_string(&jsonl).unwrap();
    assert!(
        lines.lines().nth(1).unwrap().contains(r#""step":1,"#),
        "{lines}"
    );

    let (code, json, _) = run(&["bounds", "--horizon", "4096", "--delta", "1e-4", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["inputs"]["dbar"], v["inputs"]["eps"], "{json}");

    let (code, devices, _) = run(&["devices"]);
    assert_eq!(code, 0);
    assert!(
        devices.contains("--backend auto (the default) runs on: "),
        "{devices}"
    );
}
