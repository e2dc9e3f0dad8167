//! M2PO (`rollout_rs: "m2po"`, the second-moment trust region) against golden vectors from the
//! reference code (`scripts/dev/m2po_golden.py`, fixture `data/m2po/golden.json`: the M2PO
//! authors' trust-region tokens, AReaL's masking loop; 14 packed sequences incl. an empty one
//! and two with advantage 0, six thresholds), on both engines; the batch-global selection over
//! 1–8 simulated ranks equals one process bit for bit (half the batches with `cppo` beside
//! it); ties, metrics and errors.

use crate::common;

use common::{close12, exact_metric, json_flatten, same, Rng};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use trmask::cpu::CpuEngine;
use trmask::{CorrectionConfig, Corrections, Corrector, MaskOut, Outputs, Step};

type Golden = common::PackedGolden;

fn golden() -> Golden {
    Golden::load("m2po")
}

use common::engines;

fn cfg(v: Value) -> CorrectionConfig {
    CorrectionConfig::from_json_value(&v).unwrap()
}

fn m2po(tau: f64) -> CorrectionConfig {
    cfg(json!({"rollout_rs": "m2po", "rollout_rs_threshold": tau}))
}

#[test]
fn masks_equal_the_references_on_both_engines() {
    let g = golden();
    let step = Step::packed(&g.cu)
        .old_log_prob(g.old.as_slice())
        .rollout_log_prob(g.roll.as_slice())
        .advantages(g.adv.as_slice());
    let n = g.roll.len() as f64;
    let active = g.v["active"].as_f64().unwrap();
    for e in engines() {
        let name = e.name();
        for tau in json_flatten(&g.v["thresholds"]) {
            let out = Corrector::new(e.clone(), &m2po(tau))
                .unwrap()
                .correct(&step)
                .unwrap();
            let case = &g.v["cases"][format!("{tau:?}")];
            let keep = json_flatten(&case["keep"]);
            assert_eq!(keep, out.mask, "{name}: tau {tau}");
            let dropped = case["dropped"].as_f64().unwrap();
            let m = |k: &str| out.metrics[&format!("rollout_corr/rollout_rs_m2po_{k}")];
            assert_eq!(m("masked_fraction"), dropped / (n + 1e-8), "{name}");
            assert_eq!(m("active_fraction"), active / n, "{name}");
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-300);
            assert!(close(m("m2"), case["m2"].as_f64().unwrap()), "{name}");
            assert!(
                close(m("m2_after"), case["m2_after"].as_f64().unwrap()),
                "{name}: tau {tau}"
            );
            assert!(m("m2_after") <= tau, "{name}: tau {tau}");
            assert_eq!(
                out.metrics
                    .contains_key("rollout_corr/rollout_rs_m2po_cutoff"),
                dropped > 0.0,
                "{name}: the cutoff only when something is dropped"
            );
            // a token criterion: no sequence statistic but its rejected share
            assert_eq!(out.criteria[0].output_name, "seq_m2po");
        }
        println!("{name}: M2PO masks equal the references at every threshold");
    }
}

use common::{Hub, Rank};

/// Packed sequences `a..b` of (cu, rollout, old, adv) as owned arrays.
fn cut(cu: &[i64], v: &[&[f64]; 3], a: usize, b: usize) -> (Vec<i64>, [Vec<f64>; 3]) {
    let (s, t) = (cu[a] as usize, cu[b] as usize);
    let cu2 = cu[a..=b].iter().map(|x| x - cu[a]).collect();
    (cu2, [0, 1, 2].map(|k| v[k][s..t].to_vec()))
}

/// Each rank's corrections of its own shard (cuts between sequences), run on `size` threads.
/// Each rank's corrections; `fused`: through `correct_shard_into` (the fused pass where it
/// serves the config), its mask read back from the caller's buffer.
fn sharded(
    cu: &[i64],
    v: &[&[f64]; 3],
    cuts: &[usize],
    c: &CorrectionConfig,
    fused: bool,
) -> Vec<Corrections> {
    let size = cuts.len() - 1;
    let hub = Hub::new(size);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..size)
            .map(|r| {
                let hub = &hub;
                let (cu2, [roll, old, adv]) = cut(cu, v, cuts[r], cuts[r + 1]);
                sc.spawn(move || {
                    let step = Step::packed(&cu2)
                        .rollout_log_prob(roll.as_slice())
                        .old_log_prob(old.as_slice())
                        .advantages(adv.as_slice());
                    let mut ex = Rank {
                        hub,
                        rank: r,
                        size,
                        bytes_sent: 0,
                    };
                    let corrector = Corrector::new(CpuEngine::new(), c).unwrap();
                    if !fused {
                        return corrector.correct_shard(&step, &mut ex).unwrap();
                    }
                    let mut mask = vec![9.0f64; roll.len()];
                    let out = Outputs {
                        weights: None,
                        mask: MaskOut::F64(&mut mask),
                    };
                    let mut got = corrector.correct_shard_into(&step, out, &mut ex).unwrap();
                    got.mask = mask;
                    got
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A random batch: packed lengths (some empty), log-probs with a heavy-tailed drift, per-token
/// advantages (per sequence, some zero, some changing sign inside a sequence), and with
/// `ties` log-ratios on a coarse grid so that many active values are equal.
fn random(rng: &mut Rng, ties: bool) -> (Vec<i64>, [Vec<f64>; 3]) {
    let b = 1 + rng.below(24);
    let mut cu = vec![0i64];
    let (mut roll, mut old, mut adv) = (vec![], vec![], vec![]);
    for _ in 0..b {
        let len = if rng.bool(0.15) { 0 } else { rng.below(40) };
        let a = match rng.below(4) {
            0 => 0.0,
            _ => rng.range(-2.0, 2.0),
        };
        let flips = rng.bool(0.2);
        for j in 0..len {
            let r = rng.range(-5.0, -0.01);
            let d = if ties {
                (rng.below(9) as f64 - 4.0) * 0.125
            } else {
                let u = rng.range(-1.0, 1.0);
                0.3 * u * u * u / (1.0 - u.abs()).max(0.05)
            };
            roll.push(r);
            old.push(r + d);
            adv.push(if flips && j % 3 == 0 { -a } else { a });
        }
        cu.push(roll.len() as i64);
    }
    (cu, [roll, old, adv])
}

#[test]
fn one_to_eight_ranks_equal_one_process_bit_for_bit() {
    let seed = common::seed(0x3270);
    let mut rng = Rng::new(seed);
    let (mut checked, mut dropping, mut cppo_dropping) = (0, 0, 0);
    for case in 0..48 {
        let (cu, [roll, old, adv]) = random(&mut rng, case % 3 == 0);
        let b = cu.len() - 1;
        let tau = [1e-3, 0.01, 0.04, 0.2][case % 4];
        // every other batch with CPPO beside it (per sequence: shards need no exchange)
        let c = if case % 2 == 1 {
            cfg(json!({"rollout_rs": "m2po,cppo", "rollout_rs_threshold": format!("{tau},0.15")}))
        } else {
            m2po(tau)
        };
        let v = [roll.as_slice(), old.as_slice(), adv.as_slice()];
        let whole_step = Step::packed(&cu)
            .rollout_log_prob(roll.as_slice())
            .old_log_prob(old.as_slice())
            .advantages(adv.as_slice());
        let whole = match Corrector::new(CpuEngine::new(), &c)
            .unwrap()
            .correct(&whole_step)
        {
            Ok(w) => w,
            Err(e) => {
                // a batch without a valid token is refused by one process and by the ranks
                assert!(e.to_string().contains("cu_seqlens"), "{e}");
                continue;
            }
        };
        dropping += whole
            .metrics
            .contains_key("rollout_corr/rollout_rs_m2po_cutoff") as usize;
        cppo_dropping += whole
            .metrics
            .get("rollout_corr/rollout_rs_cppo_masked_fraction")
            .is_some_and(|&f| f > 0.0) as usize;
        for size in 1..=8usize {
            // random cut points between sequences (empty shards allowed)
            let mut cuts: Vec<usize> = (0..size - 1).map(|_| rng.below(b + 1)).collect();
            cuts.push(0);
            cuts.push(b);
            cuts.sort();
            // every other split through the fused pass (M2PO alone: its gather between ranks)
            let ranks = sharded(&cu, &v, &cuts, &c, size % 2 == 0);
            let mut mask = Vec::new();
            for (r, out) in ranks.iter().enumerate() {
                mask.extend_from_slice(&out.mask);
                let keys = |m: &BTreeMap<String, f64>| m.keys().cloned().collect::<Vec<_>>();
                assert_eq!(keys(&out.metrics), keys(&whole.metrics));
                for (k, &want) in &whole.metrics {
                    let got = out.metrics[k];
                    // M2PO's own numbers come from the same gathered vector: exact
                    let m2po_own = ["_m2", "_m2_after", "_cutoff", "_active_fraction"]
                        .iter()
                        .any(|e| k == &format!("rollout_corr/rollout_rs_m2po{e}"));
                    let ok = if m2po_own || exact_metric(k) {
                        same(got, want)
                    } else {
                        close12(got, want)
                    };
                    assert!(
                        ok,
                        "seed {seed}, case {case}, {size} ranks: rank {r}'s {k}: {got} vs {want}"
                    );
                }
            }
            assert_eq!(mask, whole.mask, "seed {seed}, case {case}, {size} ranks");
            checked += 1;
        }
    }
    assert!(
        checked > 200 && dropping > 20 && cppo_dropping > 5,
        "{checked} runs, {dropping} batches dropping, {cppo_dropping} with CPPO drops"
    );
}

#[test]
fn ties_drop_the_earliest_tokens_and_the_mean_bound_holds() {
    // five active tokens with (log r)^2 = 0.25 and two with 0.0625: tau 0.15 drops four of the
    // five tied ones, the earliest four in batch order
    let roll = [-1.0f64; 8];
    let lr = [0.5, 0.25, 0.5, -0.5, 0.5, 0.25, 0.5, 0.0];
    let old: Vec<f64> = roll.iter().zip(&lr).map(|(r, d)| r + d).collect();
    // A > 0 everywhere except slot 3 (A < 0, lr < 0: active too); slot 7 has lr = 0: inactive
    let adv = [1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0];
    let cu = [0i64, 4, 8];
    let step = Step::packed(&cu)
        .rollout_log_prob(&roll[..])
        .old_log_prob(old.as_slice())
        .advantages(&adv[..]);
    for e in engines() {
        let out = Corrector::new(e.clone(), &m2po(0.15))
            .unwrap()
            .correct(&step)
            .unwrap();
        // active: 0.25 at slots 0, 2, 3, 4, 6 and 0.0625 at 1, 5 (seven tokens, sum 1.375)
        // drop 1: 1.125/6 = 0.1875; drop 2: 0.875/5 = 0.175; drop 3: 0.625/4 = 0.15625;
        // drop 4: 0.375/3 = 0.125 <= 0.15
        assert_eq!(
            out.mask,
            vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0],
            "{}",
            e.name()
        );
        assert_eq!(out.seq_accept, vec![false, false], "{}", e.name());
        let m = |k: &str| out.metrics[&format!("rollout_corr/rollout_rs_m2po_{k}")];
        assert_eq!(m("m2_after"), 0.125);
        assert_eq!(m("cutoff"), 0.25);
        assert_eq!(m("active_fraction"), 7.0 / 8.0);
    }
}

#[test]
fn config_and_input_errors() {
    for bad in [json!(0.0), json!(-0.04), json!("0.01_0.04")] {
        let v = json!({"rollout_rs": "m2po", "rollout_rs_threshold": bad});
        let e = CorrectionConfig::from_json_value(&v)
            .and_then(|c| c.resolve())
            .expect_err("threshold must be rejected")
            .to_string();
        assert!(e.contains("rollout_rs_threshold"), "{bad}: {e}");
    }
    for bad in ["seq_mean_m2po", "token_m2po"] {
        let v = json!({"rollout_rs": bad, "rollout_rs_threshold": 0.04});
        let r = CorrectionConfig::from_json_value(&v).and_then(|c| c.resolve());
        assert!(r.is_err(), "{bad}");
    }
    let c = cfg(json!({"rollout_rs": "m2po,seq_mean_k3", "rollout_rs_threshold": "0.04,0.01"}));
    assert_eq!(c.resolve().unwrap().criteria.len(), 2);
    let cu = [0i64, 2];
    let step = Step::packed(&cu)
        .old_log_prob(&[-1.0, -1.0][..])
        .rollout_log_prob(&[-1.0, -1.0][..]);
    let e = Corrector::new(CpuEngine::new(), &c)
        .unwrap()
        .correct(&step)
        .expect_err("advantages are needed")
        .to_string();
    assert!(e.contains("`advantages`"), "{e}");
}

#[test]
fn padding_never_changes_the_mask() {
    // the golden batch padded to [B, T] with garbage (NaN, ±inf) at masked slots
    let g = golden();
    let lens: Vec<usize> = g.cu.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
    let t = *lens.iter().max().unwrap();
    let b = lens.len();
    let garbage = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 3e38];
    let (mut mask, mut roll, mut old, mut adv) = (vec![], vec![], vec![], vec![]);
    for (s, &l) in lens.iter().enumerate() {
        let o = g.cu[s] as usize;
        for j in 0..t {
            let valid = j < l;
            mask.push(valid as u8 as f64);
            let z = garbage[(s + j) % 4];
            roll.push(if valid { g.roll[o + j] } else { z });
            old.push(if valid { g.old[o + j] } else { z });
            adv.push(if valid { g.adv[o + j] } else { z });
        }
    }
    let step = Step::padded(b, t)
        .response_mask(mask.as_slice())
        .rollout_log_prob(roll.as_slice())
        .old_log_prob(old.as_slice())
        .advantages(adv.as_slice());
    for e in engines() {
        let out = Corrector::new(e.clone(), &m2po(0.04))
            .unwrap()
            .correct(&step)
            .unwrap();
        let keep = json_flatten(&g.v["cases"]["0.04"]["keep"]);
        let got: Vec<f64> = (0..b)
            .flat_map(|s| out.mask[s * t..s * t + lens[s]].to_vec())
            .collect();
        assert_eq!(got, keep, "{}", e.name());
        assert!((0..b).all(|s| out.mask[s * t + lens[s]..(s + 1) * t]
            .iter()
            .all(|&m| m == 0.0)));
    }
}

#[test]
fn the_cli_summary_says_what_m2po_dropped() {
    let g = golden();
    let batch = json!({
        "cu_seqlens": g.cu,
        "rollout_log_prob": g.roll,
        "old_log_prob": g.old,
        "advantages": g.adv,
    });
    let input = common::scratch("m2po", "batch.json");
    std::fs::write(&input, batch.to_string()).unwrap();
    let config = common::scratch("m2po", "config.json");
    let cfg = json!({"rollout_rs": "m2po", "rollout_rs_threshold": 0.04});
    std::fs::write(&config, cfg.to_string()).unwrap();
    let (code, out, err) = common::run_trmask(&[
        "analyze",
        input.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 0, "{err}");
    let dropped = g.v["cases"]["0.04"]["dropped"].as_f64().unwrap();
    let line = out.lines().find(|l| l.starts_with("m2po: ")).expect(&out);
    assert!(
        line.starts_with(&format!(
            "m2po: {dropped} of {} active tokens dropped",
            g.v["active"]
        )),
        "{line}"
    );
    assert!(line.ends_with("(tau 0.04)"), "{line}");
    assert!(
        out.contains(
            "config: drop the active tokens with the largest (log rho)^2 until their mean <= 0.04"
        ),
        "{out}"
    );
    // no m2po line without the criterion
    let (_, out, _) = common::run_trmask(&["analyze", input.to_str().unwrap(), "--backend", "cpu"]);
    assert!(!out.contains("m2po: "), "{out}");
    // neither m2po nor cppo is a threshold on one statistic: calibrate refuses them
    for c in ["m2po", "cppo"] {
        let (code, _, err) = common::run_trmask(&[
            "calibrate",
            "--criterion",
            c,
            "--target-reject-rate",
            "0.1",
            input.to_str().unwrap(),
            "--backend",
            "cpu",
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("{c} cannot be calibrated")), "{err}");
    }
}
