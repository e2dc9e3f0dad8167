//! GRPO group effects (`trmask/group_*`) and the length-aware diagnostics from log-probs
//! (`trmask/{k1,k3,abs_log_ratio}_pos_*`, `trmask/reject_rate_len_*`, `trmask/len_corr/*`)
//! against a float64 computation written here from the definitions, on random padded batches
//! with group ids, on both engines; and `uid` through the JSON reader.

#![allow(clippy::needless_range_loop)]

use crate::common;

use common::{gpu, seed, Rng};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use trmask::cpu::CpuEngine;
use trmask::{CorrectionConfig, Corrections, Corrector, Engine, Step};

const BUCKETS: [(usize, usize); 6] = [
    (0, 16),
    (16, 64),
    (64, 256),
    (256, 1024),
    (1024, 4096),
    (4096, usize::MAX),
];

fn bucket_name(lo: usize, hi: usize) -> String {
    if hi == usize::MAX {
        format!("{lo}_inf")
    } else {
        format!("{lo}_{hi}")
    }
}

/// k3 = e^c − 1 − c of the ±20-clamped log-ratio, by its series where it would cancel.
fn k3(lr: f64) -> f64 {
    let c = lr.clamp(-20.0, 20.0);
    if c.abs() < 1e-2 {
        (2..20)
            .map(|n| c.powi(n) / (1..=n).map(f64::from).product::<f64>())
            .sum()
    } else {
        c.exp() - 1.0 - c
    }
}

struct Case {
    b: usize,
    t: usize,
    mask: Vec<f64>,
    lp: Vec<f64>,
    lq: Vec<f64>,
    uid: Vec<i64>,
}

fn case(rng: &mut Rng) -> Case {
    let (b, t) = (24 + rng.below(12), 1100);
    let (mut mask, mut lp, mut lq) = (vec![0.0; b * t], vec![f64::NAN; b * t], vec![0.0; b * t]);
    let group = 2 + rng.below(4);
    let uid: Vec<i64> = (0..b).map(|r| 1000 + (r / group) as i64 * 7).collect();
    for r in 0..b {
        let len = match r % 7 {
            0 => 0,
            1 => 1 + rng.below(15),
            2 => 16 + rng.below(48),
            3 => 1024 + rng.below(t - 1024),
            _ => rng.below(t + 1),
        };
        let drift = rng.range(0.0, 0.2);
        for c in 0..len {
            let i = r * t + c;
            mask[i] = 1.0;
            lq[i] = -rng.range(0.0, 3.0);
            lp[i] = (lq[i] + rng.range(-0.3, 0.3) + drift * (c as f64 / t as f64)).min(0.0);
        }
    }
    Case {
        b,
        t,
        mask,
        lp,
        lq,
        uid,
    }
}

fn correct(e: Arc<dyn Engine>, c: &Case, cfg: &CorrectionConfig) -> Corrections {
    let step = Step::padded(c.b, c.t)
        .response_mask(c.mask.as_slice())
        .old_log_prob(c.lp.as_slice())
        .rollout_log_prob(c.lq.as_slice())
        .uid(&c.uid);
    Corrector::new(e, cfg).unwrap().correct(&step).unwrap()
}

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-12 * want.abs().max(1e-300),
        "{what}: {got} vs {want}"
    );
}

/// `tol` = (rtol, atol) of the per-token estimator means: the table's estimators are f64 on the
/// CPU and f32 on the GPU (docs/FORMAT.md, Accuracy); everything derived from decisions is exact on both.
fn check(c: &Case, out: &Corrections, m: &BTreeMap<String, f64>, who: &str, tol: (f64, f64)) {
    let near = |got: f64, want: f64, what: &str| {
        assert!(
            (got - want).abs() <= tol.0 * want.abs() + tol.1,
            "{who}: {what}: {got} vs {want}"
        )
    };
    let len: Vec<usize> = (0..c.b)
        .map(|r| (0..c.t).filter(|&j| c.mask[r * c.t + j] == 1.0).count())
        .collect();
    // ---- groups, from uid and the per-sequence decisions ----
    let mut groups: BTreeMap<i64, Vec<bool>> = BTreeMap::new();
    for r in 0..c.b {
        groups.entry(c.uid[r]).or_default().push(out.seq_accept[r]);
    }
    let ng = groups.len() as f64;
    let count = |f: &dyn Fn(&Vec<bool>) -> bool| groups.values().filter(|g| f(g)).count() as f64;
    let acc = |g: &Vec<bool>| g.iter().filter(|&&a| a).count();
    close(
        m["trmask/group_rejected_fraction"],
        count(&|g| g.contains(&false)) / ng,
        "group_rejected",
    );
    close(
        m["trmask/group_fully_rejected_fraction"],
        count(&|g| acc(g) == 0) / ng,
        "fully",
    );
    close(
        m["trmask/group_degenerate_fraction"],
        count(&|g| acc(g) < 2) / ng,
        "degenerate",
    );
    let mean_acc = groups.values().map(|g| acc(g) as f64).sum::<f64>() / ng;
    close(
        m["trmask/group_accepted_size_mean"],
        mean_acc,
        "accepted_size_mean",
    );
    assert!(
        m["trmask/group_rejected_fraction"] > 0.0,
        "{who}: some group must be hit"
    );
    // ---- per-position buckets of k1, k3, |log ρ| and their count-weighted mean ----
    for (name, f) in [
        (
            "k1",
            &(|x: f64| -x.clamp(-20.0, 20.0)) as &dyn Fn(f64) -> f64,
        ),
        ("k3", &k3),
        ("abs_log_ratio", &|x: f64| x.clamp(-20.0, 20.0).abs()),
    ] {
        let (mut tot, mut n_all) = (0.0, 0usize);
        let mut weighted = 0.0;
        for &(lo, hi) in &BUCKETS {
            let (mut s, mut n) = (0.0, 0usize);
            for r in 0..c.b {
                for pos in lo..hi.min(len[r]) {
                    let i = r * c.t + pos; // valid tokens are left-aligned
                    s += f(c.lp[i] - c.lq[i]);
                    n += 1;
                }
            }
            let key = format!("trmask/{name}_pos_{}", bucket_name(lo, hi));
            if n == 0 {
                assert!(!m.contains_key(&key), "{who}: {key} with no token");
                continue;
            }
            near(m[&key], s / n as f64, &key);
            weighted += m[&key] * n as f64;
            tot += s;
            n_all += n;
        }
        let key = format!("trmask/{name}_mean");
        near(m[&key], tot / n_all as f64, &key);
        // the count-weighted mean of the buckets is the token mean
        let wm = weighted / n_all as f64;
        close(wm, m[&key], &format!("{who}: weighted buckets of {name}"));
        if name == "k3" {
            println!(
                "{who}: k3 buckets' weighted mean {wm:.17e} vs trmask/k3_mean {:.17e}",
                m[&key]
            );
        }
    }
    // ---- rejection rate by length bucket, length correlation ----
    let nonempty: Vec<usize> = (0..c.b).filter(|&r| len[r] > 0).collect();
    for &(lo, hi) in &BUCKETS {
        let inb: Vec<usize> = nonempty
            .iter()
            .copied()
            .filter(|&r| len[r] >= lo && len[r] < hi)
            .collect();
        let key = format!("trmask/reject_rate_len_{}", bucket_name(lo, hi));
        if inb.is_empty() {
            assert!(!m.contains_key(&key), "{who}: {key}");
            continue;
        }
        let rej = inb.iter().filter(|&&r| !out.seq_accept[r]).count();
        close(m[&key], rej as f64 / inb.len() as f64, &key);
    }
    for cr in &out.criteria {
        let x: Vec<f64> = nonempty.iter().map(|&r| len[r] as f64).collect();
        let y: Vec<f64> = nonempty.iter().map(|&r| cr.seq_stat[r]).collect();
        let k = x.len() as f64;
        let (mx, my) = (x.iter().sum::<f64>() / k, y.iter().sum::<f64>() / k);
        let cov: f64 = x.iter().zip(&y).map(|(a, b)| (a - mx) * (b - my)).sum();
        let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
        let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
        let r = cov / (vx * vy).sqrt();
        let got = m[&format!("trmask/len_corr/{}", cr.name)];
        assert!(
            (got - r).abs() <= 1e-12,
            "{who}: len_corr/{}: {got} vs {r}",
            cr.name
        );
    }
}

#[test]
fn group_and_length_metrics_match_float64() {
    let s = seed(15);
    let cfg = CorrectionConfig::from_json_value(&json!({
        "rollout_rs": "seq_mean_k3,binary_kl,seq_max_abs",
        "rollout_rs_threshold": "0.02,0.15,0.6",
    }))
    .unwrap();
    let mut engines: Vec<Arc<dyn Engine>> = vec![Arc::new(CpuEngine::new())];
    if let Some(g) = gpu() {
        engines.push(g);
    }
    for k in 0..3 {
        let mut rng = Rng::new(s + k);
        let c = case(&mut rng);
        for e in &engines {
            let who = format!("{} seed {}", e.name(), s + k);
            let out = correct(e.clone(), &c, &cfg);
            let tol = if e.name().starts_with("cpu") {
                (1e-12, 0.0)
            } else {
                (2e-3, 1e-7)
            };
            check(&c, &out, &out.metrics, &who, tol);
            let m = &out.metrics;
            println!(
                "{who}: groups {} rejected {:.4} fully {:.4} degenerate {:.4} accepted_mean {:.4}; reject_rate_len_1024_4096 {:?}",
                m["trmask/num_groups"],
                m["trmask/group_rejected_fraction"],
                m["trmask/group_fully_rejected_fraction"],
                m["trmask/group_degenerate_fraction"],
                m["trmask/group_accepted_size_mean"],
                m.get("trmask/reject_rate_len_1024_4096"),
            );
        }
    }
}

#[test]
fn uid_from_json_and_shape_errors() {
    let text = json!({
        "response_mask": [[1, 1, 0], [1, 0, 0], [1, 1, 1]],
        "old_log_prob": [[-0.1, -0.2, 0.0], [-0.3, 0.0, 0.0], [-0.1, -0.1, -0.1]],
        "rollout_log_prob": [[-0.1, -0.9, 0.0], [-0.3, 0.0, 0.0], [-0.1, -0.1, -0.1]],
        "uid": [4, 4, 9],
    })
    .to_string();
    let batch = trmask::io::batch_from_json(&text).unwrap();
    assert_eq!(batch.uid(), Some(&[4, 4, 9][..]));
    for bad in [json!([4, 4]), json!([[4], [4], [9]]), json!([4.5, 4, 9])] {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["uid"] = bad.clone();
        let e = trmask::io::batch_from_json(&v.to_string()).unwrap_err();
        assert!(e.to_string().contains("uid"), "{bad}: {e}");
    }
    // packed: one id per sequence
    let text = json!({
        "cu_seqlens": [0, 2, 3],
        "old_log_prob": [-0.1, -0.2, -0.3],
        "rollout_log_prob": [-0.1, -0.9, -0.3],
        "uid": [1, 1],
    })
    .to_string();
    let batch = trmask::io::batch_from_json(&text).unwrap();
    assert_eq!(batch.uid(), Some(&[1, 1][..]));
}
