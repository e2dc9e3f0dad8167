//! Top-K statistics, `topk_*` criteria and the DPPO / PDM mask through the command line
//! (`trmask analyze`), on a batch built from data/real-small: the rollout's top-20 of its bf16
//! logits (ties by smaller id) with rollout log-softmax log-probs, `responses` = sampled_ids,
//! `old_logits` = trainer_logits (f32), and per-token `advantages`. The same batch is stored as
//! data/sample/real-small-topk.safetensors (checked here; `TRMASK_WRITE_SAMPLE=1` rewrites it).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use trmask::topk::{dppo_mask, topk_divergence, DppoConfig, TopkSupport, TrainerTopk};
use trmask::DType;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/real-small");
const SAMPLE: &str = "data/sample/real-small-topk.safetensors";
const K: usize = 20;

fn bin() -> Command {
    common::trmask_bin()
}

fn tmp(name: &str) -> PathBuf {
    common::scratch("cli-topk", name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::run_trmask(args)
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
        .collect()
}

/// Reads a safetensors file of F64 tensors (the `analyze --output` format) into a map.
fn read_f64_tensors(path: &Path) -> BTreeMap<String, Vec<f64>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(k, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F64, "{k}");
            (k, f64s(v.data()))
        })
        .collect()
}

fn reference(key: &str) -> Vec<f64> {
    let bytes = std::fs::read(format!("{DATA}/reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    f64s(st.tensor(key).unwrap().data())
}

/// Per-token advantages of the sample: a fixed pattern of both signs (and some zeros).
fn advantages(n: usize) -> Vec<f64> {
    (0..n)
        .map(|t| match t % 5 {
            0 | 3 => 1.0 + 0.1 * t as f64,
            1 | 4 => -0.5 - 0.05 * t as f64,
            _ => 0.0,
        })
        .collect()
}

/// The safetensors bytes of the top-K batch built from data/real-small.
fn build_sample() -> Vec<u8> {
    let bytes = std::fs::read(format!("{DATA}/logits.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let r = st.tensor("rollout_logits").unwrap();
    let (n, v) = (r.shape()[0], r.shape()[1]);
    let tr = st.tensor("trainer_logits").unwrap();
    assert_eq!(tr.dtype(), safetensors::Dtype::F32);
    let y = i32s(st.tensor("sampled_ids").unwrap().data());
    let cu = st.tensor("cu_seqlens").unwrap();
    let (mut ids, mut lps) = (Vec::<i32>::new(), Vec::<f64>::new());
    let mut roll_y = Vec::new();
    for (row, &yr) in y.iter().enumerate() {
        let a: Vec<f64> = (0..v)
            .map(|i| DType::BF16.decode(r.data(), row * v + i) as f64)
            .collect();
        // log-softmax with the max factored out and a compensated sum (exact at the mode)
        let m = a.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let arg = a.iter().position(|&x| x == m).unwrap();
        let (mut rest, mut c) = (0.0f64, 0.0f64);
        for (_, &x) in a.iter().enumerate().filter(|&(i, _)| i != arg) {
            let e = (x - m).exp();
            let t = rest + e;
            c += if rest.abs() >= e {
                (rest - t) + e
            } else {
                (e - t) + rest
            };
            rest = t;
        }
        let l1p = (rest + c).ln_1p();
        let lp = |i: usize| (a[i] - m) - l1p;
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&i, &j| a[j].partial_cmp(&a[i]).unwrap().then(i.cmp(&j)));
        for &i in &order[..K] {
            ids.push(i as i32);
            lps.push(lp(i));
        }
        roll_y.push(lp(yr as usize));
    }
    let adv = advantages(n);
    let le = |x: &[f64]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let ids_b: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (lps_b, roll_b, adv_b) = (le(&lps), le(&roll_y), le(&adv));
    use safetensors::tensor::TensorView;
    use safetensors::Dtype as D;
    let views = vec![
        (
            "cu_seqlens",
            TensorView::new(D::I32, cu.shape().to_vec(), cu.data()).unwrap(),
        ),
        (
            "responses",
            TensorView::new(D::I32, vec![n], st.tensor("sampled_ids").unwrap().data()).unwrap(),
        ),
        (
            "old_logits",
            TensorView::new(D::F32, vec![n, v], tr.data()).unwrap(),
        ),
        (
            "rollout_topk_ids",
            TensorView::new(D::I32, vec![n, K], &ids_b).unwrap(),
        ),
        (
            "rollout_topk_log_prob",
            TensorView::new(D::F64, vec![n, K], &lps_b).unwrap(),
        ),
        (
            "rollout_log_prob",
            TensorView::new(D::F64, vec![n], &roll_b).unwrap(),
        ),
        (
            "advantages",
            TensorView::new(D::F64, vec![n], &adv_b).unwrap(),
        ),
    ];
    safetensors::serialize(views, None).unwrap()
}

/// The sample file, checked against a fresh build (rewritten with `TRMASK_WRITE_SAMPLE=1`).
fn sample() -> PathBuf {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE);
    ONCE.call_once(|| {
        let fresh = build_sample();
        if std::env::var("TRMASK_WRITE_SAMPLE").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &fresh).unwrap();
        }
        let stored = std::fs::read(&path).expect("data/sample/real-small-topk.safetensors");
        assert!(
            stored == fresh,
            "{SAMPLE} is stale: rerun with TRMASK_WRITE_SAMPLE=1"
        );
    });
    path
}

struct Analyzed {
    outputs: BTreeMap<String, Vec<f64>>,
    metrics: BTreeMap<String, f64>,
}

/// `trmask analyze SAMPLE --backend B [--config CFG]`, outputs and metrics.
fn analyze(tag: &str, backend: &str, config: Option<&str>) -> Analyzed {
    let input = sample();
    let out = tmp(&format!("{tag}-{backend}.safetensors"));
    let met = tmp(&format!("{tag}-{backend}.json"));
    let mut args = vec![
        "analyze".to_string(),
        input.to_str().unwrap().to_string(),
        "--backend".into(),
        backend.into(),
        "--output".into(),
        out.to_str().unwrap().into(),
        "--metrics".into(),
        met.to_str().unwrap().into(),
    ];
    if let Some(c) = config {
        let p = tmp(&format!("{tag}-{backend}-config.json"));
        std::fs::write(&p, c).unwrap();
        args.push("--config".into());
        args.push(p.to_str().unwrap().into());
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run(&a);
    assert_eq!(code, 0, "{tag} {backend}: {err}");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&met).unwrap()).unwrap();
    let metrics = m
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect();
    Analyzed {
        outputs: read_f64_tensors(&out),
        metrics,
    }
}

fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * w.abs() + atol,
            "{what}[{i}]: got {g:e}, want {w:e}"
        );
    }
}

/// The library's top-K statistics of the sample (CPU reference, union support).
fn library_stats(support: TopkSupport) -> (trmask::topk::TopkStats, trmask::Batch) {
    let batch = trmask::io::read_batch(&sample()).unwrap();
    let s = topk_divergence(
        &batch,
        support,
        TrainerTopk::from_batch(&batch, 1.0).unwrap(),
    )
    .unwrap();
    (s, batch)
}

fn gpu_available() -> bool {
    common::gpu().is_some()
}

#[test]
fn topk_outputs_match_reference_cpu() {
    let a = analyze("plain", "cpu", None);
    let want = reference("bf16.topk_kl_rollout_trainer");
    assert_close("topk_kl", &a.outputs["topk_kl"], &want, 1e-9, 1e-12);
    let (lib, _) = library_stats(TopkSupport::Union);
    assert_close("topk_tv", &a.outputs["topk_tv"], &lib.topk_tv, 1e-12, 0.0);
    assert_close("ddot", &a.outputs["ddot"], &lib.ddot_aggregated, 1e-12, 0.0);
    // sampled-token estimators from the rollout top-K and old_logits
    assert_close(
        "log_ratio",
        &a.outputs["log_ratio"],
        &reference("bf16.log_ratio"),
        1e-9,
        1e-13,
    );
    let mean = want.iter().sum::<f64>() / want.len() as f64;
    let max = want.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert_close(
        "mean",
        &[a.metrics["trmask/topk_kl_mean"]],
        &[mean],
        1e-9,
        1e-12,
    );
    assert_close(
        "max",
        &[a.metrics["trmask/topk_kl_max"]],
        &[max],
        1e-9,
        1e-12,
    );
    for k in [
        "trmask/topk_tv_mean",
        "trmask/topk_tv_max",
        "trmask/ddot_mean",
        "trmask/ddot_max",
    ] {
        assert!(a.metrics.contains_key(k), "{k}");
    }
    // per-sequence summaries of the top-K statistics
    assert_close(
        "seq_max_topk_kl",
        &a.outputs["seq_max_topk_kl"],
        &reference("bf16.seq_max.topk_kl_rollout_trainer"),
        1e-9,
        1e-12,
    );
    // no mask without a config
    assert!(a.outputs["modified_response_mask"]
        .iter()
        .all(|&m| m == 1.0));
}

#[test]
fn topk_outputs_match_reference_gpu() {
    if !gpu_available() {
        return;
    }
    let a = analyze("plain", "gpu", None);
    let want = reference("bf16.topk_kl_rollout_trainer");
    assert_close("gpu topk_kl", &a.outputs["topk_kl"], &want, 2e-3, 2e-7);
    let (lib, _) = library_stats(TopkSupport::Union);
    assert_close(
        "gpu topk_tv",
        &a.outputs["topk_tv"],
        &lib.topk_tv,
        2e-3,
        2e-7,
    );
    assert_close(
        "gpu ddot",
        &a.outputs["ddot"],
        &lib.ddot_aggregated,
        2e-3,
        1e-6,
    );
}

/// Sequence decisions of `<agg>_topk_kl` criteria against the reference's per-sequence values.
#[test]
fn seq_topk_kl_criteria() {
    let tok = reference("bf16.topk_kl_rollout_trainer");
    let cu = [0usize, 8, 13, 17, 20, 24, 26, 29, 30];
    let sums: Vec<f64> = cu
        .windows(2)
        .map(|w| tok[w[0]..w[1]].iter().sum())
        .collect();
    let cases: [(&str, f64, Vec<f64>); 3] = [
        (
            "seq_max_topk_kl",
            1e-3,
            reference("bf16.seq_max.topk_kl_rollout_trainer"),
        ),
        (
            "seq_mean_topk_kl",
            3e-4,
            reference("bf16.seq_mean.topk_kl_rollout_trainer"),
        ),
        ("seq_sum_topk_kl", 2e-3, sums),
    ];
    for backend in ["cpu", "gpu"] {
        if backend == "gpu" && !gpu_available() {
            continue;
        }
        for (crit, thr, per_seq) in &cases {
            // thresholds far from every sequence's value: decisions are backend-independent
            for s in per_seq {
                assert!(
                    (s - thr).abs() > 0.02 * thr,
                    "{crit}: {s} too close to {thr}"
                );
            }
            let expect: Vec<f64> = per_seq.iter().map(|&s| (s <= *thr) as u8 as f64).collect();
            assert!(
                expect.contains(&0.0) && expect.contains(&1.0),
                "{crit}: {expect:?}"
            );
            let cfg = format!(r#"{{"rollout_rs": "{crit}", "rollout_rs_threshold": {thr}}}"#);
            let a = analyze(crit, backend, Some(&cfg));
            assert_eq!(a.outputs["seq_accept"], expect, "{crit} {backend}");
            let (rtol, atol) = if backend == "cpu" {
                (1e-9, 1e-12)
            } else {
                (2e-3, 2e-7)
            };
            assert_close(crit, &a.outputs[*crit], per_seq, rtol, atol);
            let mask: Vec<f64> = (0..30)
                .map(|t| expect[cu.windows(2).position(|w| t < w[1]).unwrap()])
                .collect();
            assert_eq!(
                a.outputs["modified_response_mask"], mask,
                "{crit} {backend}"
            );
            let rejected = expect.iter().filter(|&&e| e == 0.0).count() as f64 / 8.0;
            assert!((a.metrics["trmask/reject_rate"] - rejected).abs() < 1e-15);
        }
    }
    // token_topk_tv: a token criterion against the library's topk_tv
    let (lib, _) = library_stats(TopkSupport::Union);
    let thr = 5e-3;
    let a = analyze(
        "token_topk_tv",
        "cpu",
        Some(r#"{"rollout_rs": "token_topk_tv", "rollout_rs_threshold": 5e-3}"#),
    );
    let want: Vec<f64> = lib
        .topk_tv
        .iter()
        .map(|&v| (v <= thr) as u8 as f64)
        .collect();
    assert!(want.contains(&0.0) && want.contains(&1.0));
    assert_eq!(a.outputs["modified_response_mask"], want);
}

/// DPPO / PDM configs through `--config` give the library's `dppo_mask`, ANDed with the
/// sequence criteria.
#[test]
fn dppo_and_pdm_masks_match_library() {
    let configs = [
        r#"{"divergence": "topk_kl", "delta": 1e-4, "direction": "ratio"}"#,
        r#"{"divergence": "topk_tv", "delta": 5e-3, "direction": "predictive_aggregated"}"#,
        r#"{"divergence": "topk_kl", "delta_low": 1e-5, "delta": 1e-4, "direction": "predictive_uniform", "top_k_support": "replace_kth"}"#,
    ];
    for d in configs {
        let cfg = DppoConfig::from_json(&serde_json::from_str(d).unwrap()).unwrap();
        let (stats, batch) = library_stats(cfg.support);
        let adv = batch.advantages().unwrap();
        let (keep, metrics) = dppo_mask(&stats, adv, batch.mask(), &cfg).unwrap();
        assert!(keep.contains(&0.0) && keep.contains(&1.0), "{d}: {keep:?}");
        let a = analyze("dppo", "cpu", Some(&format!(r#"{{"dppo": {d}}}"#)));
        assert_eq!(a.outputs["modified_response_mask"], keep, "{d}");
        for (k, v) in &metrics {
            assert!((a.metrics[k] - v).abs() <= 1e-12 * v.abs(), "{d} {k}");
        }
        let dropped = keep.iter().filter(|&&k| k == 0.0).count() as f64 / 30.0;
        assert!((a.metrics["trmask/token_reject_rate"] - dropped).abs() < 1e-12);
        // the token mask does not reject sequences
        assert!(a.outputs["seq_accept"].iter().all(|&s| s == 1.0));

        // ANDed with a sequence criterion
        let a2 = analyze(
            "dppo_rs",
            "cpu",
            Some(&format!(
                r#"{{"dppo": {d}, "rollout_rs": "seq_max_topk_kl", "rollout_rs_threshold": 1e-3}}"#
            )),
        );
        let seq = analyze(
            "rs_only",
            "cpu",
            Some(r#"{"rollout_rs": "seq_max_topk_kl", "rollout_rs_threshold": 1e-3}"#),
        );
        let both: Vec<f64> = keep
            .iter()
            .zip(&seq.outputs["modified_response_mask"])
            .map(|(a, b)| a * b)
            .collect();
        assert_eq!(a2.outputs["modified_response_mask"], both, "{d}");
        assert_eq!(a2.outputs["seq_accept"], seq.outputs["seq_accept"]);

        if gpu_available() {
            // GPU: masks may differ only where D is within the GPU tolerance of δ
            let g = analyze("dppo", "gpu", Some(&format!(r#"{{"dppo": {d}}}"#)));
            let dv = stats.divergence(cfg.divergence);
            for t in 0..30 {
                if g.outputs["modified_response_mask"][t] != keep[t] {
                    let thr = cfg.threshold(stats.prob_diff[t]);
                    assert!(
                        (dv[t] - thr).abs() <= 2e-3 * thr + 2e-7,
                        "{d}: gpu mask differs at {t}"
                    );
                }
            }
        }
    }
}

fn assert_bad(res: (i32, String, String), needles: &[&str]) {
    let (code, _, err) = res;
    assert_eq!(code, 2, "expected exit 2, stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    assert_eq!(err.trim().lines().count(), 1, "one-line message: {err}");
}

/// A small packed batch (2 tokens, V = 4, K = 2) with the given top-K.
fn small_json(ids: &str, lps: &str) -> String {
    format!(
        r#"{{"cu_seqlens": [0, 2], "responses": [0, 1], "advantages": [1.0, -1.0],
            "old_logits": [[2.0, 1.0, 0.0, -1.0], [0.0, 1.0, -0.5, -2.0]],
            "rollout_topk_ids": {ids}, "rollout_topk_log_prob": {lps}}}"#
    )
}

fn analyze_json(name: &str, json: &str, config: Option<&str>) -> (i32, String, String) {
    let p = tmp(name);
    std::fs::write(&p, json).unwrap();
    let mut args = vec!["analyze", p.to_str().unwrap(), "--backend", "cpu"];
    let c = tmp(&format!("{name}.config.json"));
    if let Some(cfg) = config {
        std::fs::write(&c, cfg).unwrap();
        args.push("--config");
        args.push(c.to_str().unwrap());
    }
    let out = bin().args(&args).output().expect("run trmask");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_topk_inputs_exit_2_naming_the_row() {
    let good_lps = "[[-0.4, -1.3], [-1.0, -0.6]]";
    let (code, _, err) = analyze_json("good.json", &small_json("[[0, 1], [1, 0]]", good_lps), None);
    assert_eq!(code, 0, "{err}");
    assert_bad(
        analyze_json("dup.json", &small_json("[[0, 1], [1, 1]]", good_lps), None),
        &["rollout_topk_ids", "twice", "row [1]"],
    );
    assert_bad(
        analyze_json(
            "range.json",
            &small_json("[[0, 1], [1, 4]]", good_lps),
            None,
        ),
        &["rollout_topk_ids", "row [1]", "outside [0, 4)"],
    );
    assert_bad(
        analyze_json(
            "mass.json",
            &small_json("[[0, 1], [1, 0]]", "[[-0.1, -0.5], [-1.0, -0.6]]"),
            None,
        ),
        &["rollout_topk_log_prob", "row [0]", "sum to"],
    );
    // DPPO without advantages, and a bad dppo key
    let no_adv =
        small_json("[[0, 1], [1, 0]]", good_lps).replace(r#""advantages": [1.0, -1.0],"#, "");
    assert_bad(
        analyze_json("noadv.json", &no_adv, Some(r#"{"dppo": {"delta": 0.1}}"#)),
        &["advantages"],
    );
    assert_bad(
        analyze_json(
            "badkey.json",
            &small_json("[[0, 1], [1, 0]]", good_lps),
            Some(r#"{"dppo": {"delta": 0.1, "direction": "sideways"}}"#),
        ),
        &["dppo.direction"],
    );
    // a topk criterion without a top-K names the inputs it needs
    assert_bad(
        analyze_json(
            "nok.json",
            r#"{"rollout_log_prob": [[-1, -2]], "old_log_prob": [[-1, -2]], "response_mask": [[1, 1]]}"#,
            Some(r#"{"rollout_rs": "seq_max_topk_kl", "rollout_rs_threshold": 0.1}"#),
        ),
        &["topk_kl", "rollout_topk_ids"],
    );
}
