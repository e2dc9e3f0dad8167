//! KPop (`rollout_rs: "binary_kl"`): both engines against the independent mpmath oracle
//! `scripts/dev/kpop_oracle.py` (fixture `data/kpop/oracle.json`, 480 tokens, 189 with p and q
//! within 1e-9 of 1, 23 with a log-prob of exactly 0). CPU: masks equal, values within 1e-12
//! relative. GPU: values within docs/FORMAT.md's relative 2e-3 (Accuracy) (no absolute slack, so the 1e-10-sized
//! values near p = q = 1 are really checked), masks equal away from ties. Also: the naive
//! formula on rounded p loses every digit there, and the config spellings and metrics.

#![allow(clippy::needless_range_loop)]

use crate::common;

use common::{gpu, json_flatten, load_json};
use serde_json::{json, Value};
use trmask::cpu::CpuEngine;
use trmask::numerics::binary_kl;
use trmask::plan::{CorrectionsRaw, MaskAgg, MaskCriterion, MaskPlan, MaskSource};
use trmask::{CorrectionConfig, Corrector, Engine, Segments, Step};

struct Oracle {
    lp: Vec<f64>,
    lq: Vec<f64>,
    val: Vec<f64>,
    near_one: Vec<bool>,
    thresholds: Vec<f64>,
    keep: Vec<Vec<bool>>,
    cu: Vec<i64>,
}

fn oracle() -> Oracle {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/kpop/oracle.json");
    let v = load_json(&path);
    let thresholds = json_flatten(&v["thresholds"]);
    let keep = thresholds
        .iter()
        .map(|t| {
            let key = if *t == 0.1 { "0.1" } else { "1e-10" };
            json_flatten(&v["keep"][key])
                .iter()
                .map(|&k| k == 1.0)
                .collect()
        })
        .collect();
    let mut cu = vec![0i64];
    for l in json_flatten(&v["lengths"]) {
        cu.push(cu.last().unwrap() + l as i64);
    }
    Oracle {
        lp: json_flatten(&v["old_log_prob"]),
        lq: json_flatten(&v["rollout_log_prob"]),
        val: json_flatten(&v["binary_kl"]),
        near_one: v["near_one"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_bool().unwrap())
            .collect(),
        thresholds,
        keep,
        cu,
    }
}

fn rel(got: f64, want: f64) -> f64 {
    if want == 0.0 {
        got.abs()
    } else {
        (got - want).abs() / want.abs()
    }
}

/// Per-token D_B criteria at each threshold plus `seq_max_binary_kl` at the first, on columns
/// 0 (the trainer log-prob) and 1 (the rollout's).
fn plan<'a>(o: &'a Oracle) -> MaskPlan<'a> {
    let crit = |agg, upper| MaskCriterion {
        source: MaskSource::BinaryKl(0),
        agg,
        lower: None,
        upper,
    };
    let mut criteria: Vec<_> = o
        .thresholds
        .iter()
        .map(|&t| crit(MaskAgg::Token, t))
        .collect();
    criteria.push(crit(MaskAgg::Max, o.thresholds[0]));
    MaskPlan {
        criteria,
        is: None,
        columns: vec![&o.lp, &o.lq],
    }
}

fn run(engine: &dyn Engine, o: &Oracle, cu: &[i64]) -> CorrectionsRaw {
    let n = o.lp.len();
    let ranges = cu
        .windows(2)
        .map(|w| (w[0] as usize, w[1] as usize))
        .collect();
    let segs = Segments::new(ranges, vec![true; n]).unwrap();
    let lr: Vec<f64> = (0..n).map(|i| o.lp[i] - o.lq[i]).collect();
    engine.corrections_pass(&lr, &segs, &plan(o)).unwrap()
}

#[test]
fn cpu_values_and_masks_match_the_mpmath_oracle() {
    let o = oracle();
    let n = o.lp.len();
    let (mut worst_near, mut worst_all) = (0f64, 0f64);
    for i in 0..n {
        let v = binary_kl(o.lp[i], o.lq[i], o.lp[i] - o.lq[i]);
        let r = rel(v, o.val[i]);
        if o.near_one[i] {
            worst_near = worst_near.max(r);
        }
        worst_all = worst_all.max(r);
        assert!(
            r <= 1e-12,
            "token {i}: lp {} lq {}: {v} vs oracle {} (rel {r:e})",
            o.lp[i],
            o.lq[i],
            o.val[i]
        );
    }
    println!(
        "cpu binary_kl vs mpmath: worst rel {worst_near:e} on {} tokens with p, q in [1-1e-9, 1), \
         {worst_all:e} on all {n}",
        o.near_one.iter().filter(|&&b| b).count()
    );
    // one token per sequence: seq_max is the token value; then the fixture's sequences
    let single: Vec<i64> = (0..=n as i64).collect();
    for cu in [&single, &o.cu] {
        let raw = run(&CpuEngine::new(), &o, cu);
        for (ci, keep) in o.keep.iter().enumerate() {
            for i in 0..n {
                assert_eq!(
                    (raw.token_reject[i] >> ci) & 1 == 0,
                    keep[i],
                    "cpu mask, threshold {}, token {i}",
                    o.thresholds[ci]
                );
            }
        }
        // sequence max: rejected iff a token of the sequence is over the threshold
        for (s, w) in cu.windows(2).enumerate() {
            let any = (w[0] as usize..w[1] as usize).any(|i| !o.keep[0][i]);
            assert_eq!((raw.seq_reject[s] >> 2) & 1 == 1, any, "seq {s}");
        }
    }
    let kept: Vec<usize> = o
        .keep
        .iter()
        .map(|k| k.iter().filter(|&&b| b).count())
        .collect();
    println!(
        "cpu masks equal the oracle's at thresholds {:?} (kept {kept:?} of {n})",
        o.thresholds
    );
}

#[test]
fn gpu_values_and_masks_match_the_mpmath_oracle() {
    let Some(g) = gpu() else { return };
    let o = oracle();
    let n = o.lp.len();
    let single: Vec<i64> = (0..=n as i64).collect();
    let raw = run(g.as_ref(), &o, &single);
    let mut worst = 0f64;
    for i in 0..n {
        let v = raw.seq_stat[2][i];
        // docs/FORMAT.md (Accuracy) (2e-3 relative); the absolute 1e-7 only where the value is not tiny
        let tol = 2e-3 * o.val[i].abs() + if o.near_one[i] { 0.0 } else { 1e-7 };
        assert!(
            (v - o.val[i]).abs() <= tol,
            "gpu token {i}: lp {} lq {}: {v} vs oracle {}",
            o.lp[i],
            o.lq[i],
            o.val[i]
        );
        if o.val[i] > 0.0 {
            worst = worst.max(rel(v, o.val[i]));
        }
    }
    let mut ties = 0;
    for cu in [&single, &o.cu] {
        let raw = run(g.as_ref(), &o, cu);
        for (ci, keep) in o.keep.iter().enumerate() {
            let t = o.thresholds[ci];
            for i in 0..n {
                let got = (raw.token_reject[i] >> ci) & 1 == 0;
                if (o.val[i] - t).abs() <= 2e-3 * t {
                    ties += usize::from(got != keep[i]);
                    continue;
                }
                assert_eq!(got, keep[i], "gpu mask, threshold {t}, token {i}");
            }
        }
    }
    println!("gpu binary_kl vs mpmath: worst rel {worst:e}; masks equal away from ties ({ties} tie flips)");
}

/// p, q in [1 − 1e-9, 1): the textbook formula on `p = exp(lp)` keeps only a few of f64's
/// digits (1 − p has lost 7 to 10 of them), AReaL's f32 evaluation (clamp to [1e-8, 1 − 1e-8],
/// whose upper end is 1.0 in f32) gives NaN, i.e. a masked token; trmask stays within 1e-12.
#[test]
fn naive_complements_lose_every_digit_near_one() {
    let o = oracle();
    let db = |p: f64, q: f64| p * (p / q).ln() + (1.0 - p) * ((1.0 - p) / (1.0 - q)).ln();
    let db32 = |lp: f64, lq: f64| {
        let c = |x: f64| ((x as f32).exp()).clamp(1e-8, 1.0 - 1e-8);
        let (p, q) = (c(lp), c(lq));
        p * (p / q).ln() + (1.0 - p) * ((1.0 - p) / (1.0 - q)).ln()
    };
    let (mut naive_worst, mut ours_worst, mut m, mut nan32) = (0f64, 0f64, 0, 0);
    for i in (0..o.lp.len()).filter(|&i| o.near_one[i] && o.val[i] > 0.0) {
        let (p, q) = (o.lp[i].exp(), o.lq[i].exp());
        let naive = db(p, q).max(db(q, p));
        naive_worst = naive_worst.max(rel(naive, o.val[i]));
        let ours = binary_kl(o.lp[i], o.lq[i], o.lp[i] - o.lq[i]);
        ours_worst = ours_worst.max(rel(ours, o.val[i]));
        let areal = db32(o.lp[i], o.lq[i]).max(db32(o.lq[i], o.lp[i]));
        nan32 += usize::from(areal.is_nan()); // AReaL's keep test `<= upper` fails on NaN
        m += 1;
    }
    println!(
        "p, q in [1-1e-9, 1), {m} tokens: naive f64 worst rel {naive_worst:e}, trmask {ours_worst:e}; \
         AReaL-style f32 gives NaN (masked) on {nan32}/{m}"
    );
    assert!(m > 100);
    assert!(
        naive_worst > 1e-3,
        "the naive f64 formula should lose >= 13 digits here"
    );
    assert_eq!(nan32, m, "AReaL's f32 clamp makes every one of them NaN");
    assert!(ours_worst <= 1e-12);
}

fn cfg(v: Value) -> CorrectionConfig {
    CorrectionConfig::from_json_value(&v).unwrap()
}

#[test]
fn config_spellings_thresholds_and_metrics() {
    // binary_kl and token_binary_kl are one criterion
    let a = cfg(json!({"rollout_rs": "binary_kl", "rollout_rs_threshold": 0.1}));
    let b = cfg(json!({"rollout_rs": "token_binary_kl,binary_kl", "rollout_rs_threshold": 0.1}));
    assert_eq!(a.resolve().unwrap().criteria, b.resolve().unwrap().criteria);
    for bad in [json!("0.05_0.1"), json!(0.0), json!(-1.0)] {
        let v = json!({"rollout_rs": "binary_kl", "rollout_rs_threshold": bad});
        let r = CorrectionConfig::from_json_value(&v).and_then(|c| c.resolve());
        let e = r.expect_err("threshold must be rejected").to_string();
        assert!(e.contains("rollout_rs_threshold"), "{bad}: {e}");
    }
    for ok in [
        "seq_max_binary_kl",
        "seq_mean_binary_kl",
        "binary_kl,seq_mean_k3",
    ] {
        let c = cfg(json!({"rollout_rs": ok, "rollout_rs_threshold": "0.1"}));
        assert!(c.resolve().is_ok(), "{ok}");
    }

    // end to end on the oracle's tokens (packed), CPU and GPU
    let o = oracle();
    let n = o.lp.len();
    let c = cfg(json!({"rollout_rs": "binary_kl", "rollout_rs_threshold": 0.1}));
    let step = Step::packed(&o.cu)
        .old_log_prob(o.lp.as_slice())
        .rollout_log_prob(o.lq.as_slice());
    let mut engines: Vec<std::sync::Arc<dyn Engine>> = vec![std::sync::Arc::new(CpuEngine::new())];
    if let Some(g) = gpu() {
        engines.push(g);
    }
    for e in engines {
        let out = Corrector::new(e.clone(), &c)
            .unwrap()
            .correct(&step)
            .unwrap();
        let name = e.name();
        let rejected = o.keep[0].iter().filter(|&&k| !k).count();
        for i in 0..n {
            assert_eq!(out.mask[i] == 1.0, o.keep[0][i], "{name}: token {i}");
        }
        let m = |k: &str| out.metrics[&format!("rollout_corr/rollout_rs_binary_kl_{k}")];
        let mean: f64 = o.val.iter().sum::<f64>() / (n as f64 + 1e-8);
        assert!((m("mean") - mean).abs() <= 1e-12 * mean, "{name}: mean");
        let max = o.val.iter().cloned().fold(0.0, f64::max);
        assert!((m("max") - max).abs() <= 1e-12 * max, "{name}: max");
        assert_eq!(m("min"), 0.0);
        let frac = rejected as f64 / (n as f64 + 1e-8);
        assert!((m("masked_fraction") - frac).abs() < 1e-15, "{name}");
        assert!((m("fraction_high") - frac).abs() < 1e-15, "{name}");
        let seqs = o.cu.windows(2).count();
        let seq_rej =
            o.cu.windows(2)
                .filter(|w| (w[0] as usize..w[1] as usize).any(|i| !o.keep[0][i]))
                .count();
        assert_eq!(
            m("seq_masked_fraction"),
            seq_rej as f64 / seqs as f64,
            "{name}"
        );
        assert!(m("std") > 0.0);
        println!(
            "{name}: end-to-end mask equal to the oracle's; masked_fraction {} ({rejected}/{n})",
            m("masked_fraction")
        );
    }
}
