//! Held-back-like verl inputs (`mixed`, `large`, `uniform_shift` look-alikes and extremes:
//! one non-empty row, B = 1, T = 1) against stored outputs of an independent numpy float64
//! transcription of verl HEAD (`scripts/dev/verl_oracle.py`, itself checked against every case of
//! `data/verl-golden/head/rollout_corr__*.json`). The data is produced by
//! `python3 scripts/dev/verl_fuzz.py regress data/verl-fuzz`; this test runs the CLI
//! (`trmask analyze --backend cpu`) for every config of the golden catalogue.
//!
//! Tolerances (docs/FORMAT.md, Accuracy): rtol 1e-9; fractions verl rounds to f32 atol 2e-7; `*_std` compared
//! via the variance (the std of near-constant values is rounding-dominated, see `std_var_tol`);
//! atol 1e-15 for means of cancelling terms (e.g. `log_ppl_diff` of `uniform_shift`).

use crate::common;

use common::{json_flatten as flatten, json_num as num, load_json as load};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn trmask_cli(args: &[&str]) -> std::process::Output {
    common::trmask_bin().args(args).output().unwrap()
}

fn close(got: f64, want: f64, rtol: f64, atol: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= atol + rtol * want.abs()
}

fn f32_fraction(key: &str) -> bool {
    key.ends_with("_fraction_high")
        || key.ends_with("_fraction_low")
        || key.ends_with("seq_masked_fraction")
}

/// verl's std is `sqrt(E[x²] − E[x]²)`: each term carries a few ε·E[x²] of rounding, so the
/// variance is compared at `1e-14 + 64 ε E[x²]`, E[x²] estimated from the case's own metrics
/// (IS: the weights' mean; RS: the largest of |mean|, |max|, |min| of the statistic).
fn std_var_tol(key: &str, want: &BTreeMap<String, f64>) -> f64 {
    let p = &key[..key.len() - "_std".len()];
    let get = |s: &str| want.get(&format!("{p}{s}")).copied().unwrap_or(0.0);
    let m2 = if p.ends_with("rollout_is") {
        get("_mean").powi(2)
    } else {
        ["_mean", "_max", "_min"]
            .iter()
            .map(|s| get(s).powi(2))
            .fold(0.0, f64::max)
    };
    1e-14 + 64.0 * f64::EPSILON * (want[key].powi(2) + m2)
}

fn check_metric(key: &str, got: f64, want: &BTreeMap<String, f64>) -> bool {
    let w = want[key];
    if close(got, w, 1e-9, 1e-15) {
        return true;
    }
    if key.ends_with("_std") {
        return (got * got - w * w).abs() <= std_var_tol(key, want);
    }
    let want = w;
    f32_fraction(key) && close(got, want, 0.0, 2e-7)
}

fn compare_case(file: &Value, case: &Value, out: &Value, met: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    // IS weights
    let want_w = case["weights"]
        .as_str()
        .map(|k| flatten(&file["weights"][k]));
    let got_w = out
        .get("rollout_is_weights")
        .filter(|v| !v.is_null())
        .map(flatten);
    match (&got_w, &want_w) {
        (None, None) => {}
        (Some(g), Some(w)) => {
            if g.len() != w.len() {
                errs.push(format!("weights: {} slots, want {}", g.len(), w.len()));
            } else if let Some(i) = (0..g.len()).find(|&i| !close(g[i], w[i], 1e-9, 0.0)) {
                errs.push(format!("weights[{i}] = {} want {}", g[i], w[i]));
            }
        }
        _ => errs.push(format!(
            "weights present: {} want {}",
            got_w.is_some(),
            want_w.is_some()
        )),
    }
    // mask
    let want_m: Vec<f64> = case["mask"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r.as_str()
                .unwrap()
                .bytes()
                .map(|b| if b == b'1' { 1.0 } else { 0.0 })
                .collect::<Vec<_>>()
        })
        .collect();
    let got_m = flatten(&out["modified_response_mask"]);
    if got_m != want_m {
        errs.push("modified_response_mask differs".into());
    }
    // metrics: identical key sets over rollout_corr/*
    let mut want: BTreeMap<String, f64> = BTreeMap::new();
    for r in case["metrics"].as_array().unwrap() {
        let part = &file["metric_pool"][r.as_u64().unwrap() as usize];
        for (k, v) in part.as_object().unwrap() {
            want.insert(k.clone(), num(v));
        }
    }
    let got: BTreeMap<String, f64> = met
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("rollout_corr/"))
        .map(|(k, v)| (k.clone(), num(v)))
        .collect();
    let gk: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let wk: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    if !gk.is_empty() || !wk.is_empty() {
        errs.push(format!("metric keys: extra {gk:?} missing {wk:?}"));
    }
    for (k, w) in &want {
        if let Some(g) = got.get(k) {
            if !check_metric(k, *g, &want) {
                errs.push(format!("{k} = {g:e} want {w:e}"));
            }
        }
    }
    errs
}

#[test]
fn verl_fuzz_cli_cpu_matches_oracle() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/verl-fuzz");
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no data in {}", root.display());
    let dir = std::env::temp_dir().join(format!("trmask-verl-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut total, mut fails) = (0, Vec::new());
    for f in &files {
        let file = load(f);
        let name = file["input"]["name"].as_str().unwrap().to_string();
        let inp = dir.join(format!("{name}.json"));
        std::fs::write(&inp, file["input"].to_string()).unwrap();
        for (i, case) in file["cases"].as_array().unwrap().iter().enumerate() {
            total += 1;
            let id = case["id"].as_str().unwrap();
            let cfg = dir.join(format!("{name}-cfg{i}.json"));
            let out = dir.join(format!("{name}-out{i}.json"));
            let met = dir.join(format!("{name}-met{i}.json"));
            std::fs::write(&cfg, case["config"].to_string()).unwrap();
            let o = trmask_cli(&[
                "analyze",
                inp.to_str().unwrap(),
                "--backend",
                "cpu",
                "--config",
                cfg.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--metrics",
                met.to_str().unwrap(),
            ]);
            let errs = if case.get("error").is_some() {
                if o.status.code() == Some(2) && !o.stderr.is_empty() {
                    vec![]
                } else {
                    vec![format!(
                        "verl raises ({}), CLI exit {:?}",
                        case["error"],
                        o.status.code()
                    )]
                }
            } else if !o.status.success() {
                vec![format!(
                    "exit {:?}: {}",
                    o.status.code(),
                    String::from_utf8_lossy(&o.stderr)
                )]
            } else {
                compare_case(&file, case, &load(&out), &load(&met))
            };
            if !errs.is_empty() {
                fails.push(format!("{name}/{id}: {}", errs.join("; ")));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "verl fuzz (cli, cpu): {}/{total} cases match the oracle",
        total - fails.len()
    );
    for f in fails.iter().take(30) {
        println!("FAIL {f}");
    }
    assert!(fails.is_empty(), "{} of {total} cases failed", fails.len());
}
