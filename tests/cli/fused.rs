//! `trmask analyze` on the CPU without `--output` runs the fused pass: its `--metrics` (sweeps
//! included), summary screen and warnings equal the full path's (the same run with `--output`,
//! which needs per-token outputs), on GRPO steps with advantages and `uid` and on the causal
//! sample.

use crate::common;
use std::path::Path;

/// `trmask analyze INPUT HOW --backend cpu --metrics M [--output O]` (`HOW`: `--preset P` or
/// `--config FILE`): (metrics, stdout without its `written:` line, stderr).
fn analyze(
    input: &Path,
    how: &[&str],
    tag: &str,
    full: bool,
) -> (serde_json::Value, String, String) {
    let m = common::scratch("fused", &format!("{tag}-{full}.json"));
    let o = common::scratch("fused", &format!("{tag}-out.safetensors"));
    let mut args = vec!["analyze".to_string(), input.display().to_string()];
    args.extend(how.iter().map(|a| a.to_string()));
    args.extend(["--backend".into(), "cpu".into(), "--metrics".into()]);
    args.push(m.display().to_string());
    if full {
        args.extend(["--output".into(), o.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = common::run_trmask(&args);
    assert_eq!(code, 0, "{err}");
    let out: Vec<&str> = out.lines().filter(|l| !l.starts_with("written:")).collect();
    (common::load_json(&m), out.join("\n"), err)
}

/// The two runs agree: the same keys, every number equal to 1e-12 relative (sweeps' arrays
/// element by element), the same summary and warnings; the first one ran the fused pass.
fn same_as_full_path(input: &Path, preset: &str, tag: &str) {
    let cfg = trmask::CorrectionConfig::preset(preset).unwrap();
    same_with(input, &cfg, &["--preset", preset], tag);
}

/// [`same_as_full_path`] for the config `cfg`, which `how` gives the command line.
fn same_with(input: &Path, cfg: &trmask::CorrectionConfig, how: &[&str], tag: &str) {
    let fused = trmask::analysis::analyze_file_fused(input, &Default::default(), cfg).unwrap();
    assert!(fused.is_some(), "{tag}: the fused pass serves it");
    let (fused, fs, fe) = analyze(input, how, tag, false);
    let (full, ls, le) = analyze(input, how, tag, true);
    let (f, l) = (fused.as_object().unwrap(), full.as_object().unwrap());
    let keys =
        |o: &serde_json::Map<String, serde_json::Value>| o.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(f), keys(l), "{tag}: metric keys");
    for (k, v) in l {
        let (a, b) = (numbers(&f[k]), numbers(v));
        assert_eq!(a.len(), b.len(), "{tag}: {k}");
        for (x, y) in a.iter().zip(&b) {
            assert!(common::close12(*x, *y), "{tag}: {k}: fused {x} vs full {y}");
        }
    }
    assert_eq!(fs, ls, "{tag}: summary");
    assert_eq!(fe, le, "{tag}: warnings");
}

/// The numbers of a metric: a number, or a sweep's object of arrays (its keys in order, the
/// criterion's name left out).
fn numbers(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Object(o) => o
            .values()
            .filter(|x| !x.is_string())
            .flat_map(common::json_flatten)
            .collect(),
        x => common::json_flatten(x),
    }
}

/// Writes a `[b, t]` GRPO step: variable lengths (some empty), a small mismatch with
/// outliers past the safety bound, advantages, `uid` in groups of 4; log-probs in `dtype`.
fn step(path: &Path, b: usize, t: usize, dtype: safetensors::Dtype, seed: u64) {
    let mut rng = common::Rng::new(seed);
    let (mut mask, mut roll, mut old, mut adv) = (vec![], vec![], vec![], vec![]);
    for s in 0..b {
        let len = if s % 7 == 3 { 0 } else { 1 + rng.below(t) };
        let a = rng.range(-1.0, 1.0) as f32;
        let scale = [0.005, 0.05, 0.3][rng.below(3)];
        for j in 0..t {
            mask.push(if j < len { 1f32 } else { 0.0 });
            let x = rng.range(-6.0, -0.001);
            let spike = if rng.bool(0.002) { 25.0 } else { 0.0 };
            roll.push(x);
            old.push((x + scale * rng.range(-1.0, 1.0) - spike).min(0.0));
            adv.push(if j < len { a } else { 0.0 });
        }
    }
    // a positive rollout log-prob at a valid slot (a warning)
    roll[1] = 0.25;
    let bytes = |v: &[f64]| -> Vec<u8> {
        match dtype {
            safetensors::Dtype::BF16 => v
                .iter()
                .flat_map(|&x| half::bf16::from_f64(x).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        }
    };
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let uid: Vec<u8> = (0..b as i64).flat_map(|i| (i / 4).to_le_bytes()).collect();
    let (r, o, m, a) = (bytes(&roll), bytes(&old), f32s(&mask), f32s(&adv));
    use safetensors::tensor::TensorView;
    fn tv(dt: safetensors::Dtype, shape: Vec<usize>, data: &[u8]) -> TensorView<'_> {
        TensorView::new(dt, shape, data).unwrap()
    }
    let tensors = vec![
        ("response_mask", tv(safetensors::Dtype::F32, vec![b, t], &m)),
        ("rollout_log_probs", tv(dtype, vec![b, t], &r)),
        ("old_log_prob", tv(dtype, vec![b, t], &o)),
        ("advantages", tv(safetensors::Dtype::F32, vec![b, t], &a)),
        ("uid", tv(safetensors::Dtype::I64, vec![b], &uid)),
    ];
    safetensors::serialize_to_file(tensors, None, path).unwrap();
}

#[test]
fn fused_analyze_matches_the_full_path() {
    for (tag, dtype, preset) in [
        ("f32", safetensors::Dtype::F32, "decoupled_k3_rs_token_tis"),
        (
            "bf16",
            safetensors::Dtype::BF16,
            "decoupled_k3_rs_token_tis",
        ),
        ("f32-seq-is", safetensors::Dtype::F32, "decoupled_seq_is_rs"),
    ] {
        let p = common::scratch("fused", &format!("{tag}.safetensors"));
        step(&p, 37, 1100, dtype, 7);
        same_as_full_path(&p, preset, tag);
    }
    let causal = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/causal-sample/batch.safetensors");
    same_as_full_path(&causal, "decoupled_k3_rs_token_tis", "causal");
}

/// The token veto, OPSM, M2PO, CPPO, LN-TRM and token criteria (their sweeps from every valid
/// token's value) in the fused pass: the same metrics, sweeps, summary and warnings as the full
/// path.
#[test]
fn fused_analyze_serves_the_other_criteria() {
    let p = common::scratch("fused", "more.safetensors");
    step(&p, 41, 700, safetensors::Dtype::F32, 11);
    for (tag, json) in [
        (
            "veto",
            r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 1.0, "token_veto": 0.9}"#,
        ),
        (
            "opsm",
            r#"{"rollout_rs": "opsm,seq_max_k2", "rollout_rs_threshold": "0.01,2.5"}"#,
        ),
        (
            "token-k1",
            r#"{"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}"#,
        ),
        (
            "token-k3-k2",
            r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k3,token_k2,seq_max_k2", "rollout_rs_threshold": "0.02,0.5,2.5"}"#,
        ),
        (
            "m2po-cppo",
            r#"{"rollout_rs": "m2po,cppo,seq_max_k2", "rollout_rs_threshold": "0.001,0.02,2.5"}"#,
        ),
        (
            "lntrm",
            r#"{"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_lntrm", "rollout_rs_threshold": 0.2, "ln_trm": {"eps": 0.1, "delta": 0.02}}"#,
        ),
    ] {
        let c = common::scratch("fused", &format!("{tag}.json"));
        std::fs::write(&c, json).unwrap();
        let cfg = trmask::CorrectionConfig::from_json_str(json).unwrap();
        same_with(&p, &cfg, &["--config", &c.display().to_string()], tag);
    }
}

/// Without its sweeps (what the Python package's data warnings read) the fused pass gives the
/// same metrics, findings and warning lines as the full path, and no sweep; the warnings need
/// of the step only its shape (`Step::shape`).
#[test]
fn unswept_fused_analysis_gives_the_warnings_inputs() {
    let p = common::scratch("fused", "token.safetensors");
    step(&p, 37, 900, safetensors::Dtype::F32, 13);
    let opts = Default::default();
    let input = trmask::io::read_input(&p, &opts).unwrap();
    for json in [
        r#"{"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}"#,
        r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k3,seq_max_k2", "rollout_rs_threshold": "0.02,2.5"}"#,
    ] {
        let cfg = trmask::CorrectionConfig::from_json_str(json).unwrap();
        let mapped = trmask::io::map_step(&p, &opts).unwrap().unwrap();
        let (step, layout) = mapped.step().unwrap();
        let fused = trmask::analysis::analyze_fused_unswept(&step, &layout, &cfg)
            .unwrap()
            .expect("the fused pass serves it without the sweeps");
        let engine = trmask::cpu::CpuEngine::new();
        let full = trmask::analysis::analyze(&engine, &input.batch, &cfg).unwrap();
        assert!(fused.sweeps.is_empty() && !full.sweeps.is_empty(), "{json}");
        let keys = |a: &trmask::analysis::Analysis| a.metrics.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&fused), keys(&full), "{json}: metric keys");
        for (k, v) in &full.metrics {
            let f = fused.metrics[k];
            assert!(common::close12(f, *v), "{json}: {k}: fused {f} vs full {v}");
        }
        // the log-ratio's mean and spread to rounding (sums in another order), the rest equal
        let (mut ff, fl) = (fused.findings.clone(), &full.findings);
        let ((m1, s1), (m2, s2)) = (ff.log_ratio.unwrap(), fl.log_ratio.unwrap());
        assert!(
            common::close12(m1, m2) && common::close12(s1, s2),
            "{json}: log-ratio"
        );
        ff.log_ratio = fl.log_ratio;
        assert_eq!(&ff, fl, "{json}: findings");
        let lines = |a: &trmask::analysis::Analysis| {
            trmask::report::warnings(&trmask::report::WarningInputs {
                batch: &input.batch,
                analysis: a,
                config: &cfg,
                temperature_flag: false,
            })
        };
        let warned = lines(&fused);
        assert!(
            !warned.is_empty(),
            "{json}: the step's positive log-prob is warned of"
        );
        assert_eq!(warned, lines(&full), "{json}: warnings");
        // the step's shape (its layout and mask, no tensor) is all the warnings read of it
        let shape = step.shape().expect("a padded step with a 0/1 mask");
        assert_eq!(shape.layout(), &layout, "{json}: layout");
        let on_shape = trmask::report::warnings(&trmask::report::WarningInputs {
            batch: &shape,
            analysis: &fused,
            config: &cfg,
            temperature_flag: false,
        });
        assert_eq!(on_shape, warned, "{json}: warnings on the step's shape");
    }
}
