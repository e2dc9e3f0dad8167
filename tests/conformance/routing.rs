//! MoE routing (issue 42) on `data/moe-sample`: every `trmask/routing/*` metric against its
//! `reference_metrics.json` (float64, computed by the sample's generator), the per-token
//! outputs against a naive set-based reference written here, on every engine, padded and
//! packed, under slime's and vLLM's tensor names; the `route_flip` criteria; 1–8 data-parallel
//! ranks bit for bit; bad input named.

use crate::common;

use common::{engines, json_num, load_json, tensor_f32s, tensor_i32s, Hub, Rank};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use trmask::analysis::{analyze, analyze_shard, Analysis};
use trmask::cpu::CpuEngine;
use trmask::{Batch, CorrectionConfig};

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/moe-sample")
        .join(name)
}

/// The sample as plain arrays: `[B, T]` per-token, `[B, T, L, K]` routing.
struct Moe {
    b: usize,
    t: usize,
    l: usize,
    k: usize,
    lens: Vec<usize>,
    mask: Vec<f64>,
    roll: Vec<f64>,
    old: Vec<f64>,
    roll_re: Vec<i64>,
    old_re: Vec<i64>,
}

impl Moe {
    fn load() -> Moe {
        let bytes = std::fs::read(sample("batch.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let shape = st
            .tensor("rollout_routed_experts")
            .unwrap()
            .shape()
            .to_vec();
        let (b, t, l, k) = (shape[0], shape[1], shape[2], shape[3]);
        let mask = tensor_f32s(&st, "response_mask");
        let lens = (0..b)
            .map(|r| {
                mask[r * t..(r + 1) * t]
                    .iter()
                    .filter(|&&m| m == 1.0)
                    .count()
            })
            .collect();
        Moe {
            b,
            t,
            l,
            k,
            lens,
            mask,
            roll: tensor_f32s(&st, "rollout_log_prob"),
            old: tensor_f32s(&st, "old_log_prob"),
            roll_re: tensor_i32s(&st, "rollout_routed_experts"),
            old_re: tensor_i32s(&st, "old_routed_experts"),
        }
    }

    /// Rows `a..z` as a padded `[z − a, T]` batch.
    fn padded(&self, a: usize, z: usize) -> Batch {
        let (s, e) = (a * self.t, z * self.t);
        let lk = self.l * self.k;
        Batch::padded(z - a, self.t, &self.mask[s..e])
            .unwrap()
            .with_log_probs("rollout_log_prob", self.roll[s..e].to_vec())
            .unwrap()
            .with_log_probs("old_log_prob", self.old[s..e].to_vec())
            .unwrap()
            .with_routed_experts(
                &self.roll_re[s * lk..e * lk],
                &self.old_re[s * lk..e * lk],
                self.l,
                self.k,
            )
            .unwrap()
            .build()
            .unwrap()
    }

    /// Rows `a..z` packed: only their valid slots (each row's valid tokens are a prefix).
    fn packed(&self, a: usize, z: usize) -> Batch {
        let lk = self.l * self.k;
        let mut cu = vec![0i64];
        let (mut roll, mut old, mut rr, mut orr) = (vec![], vec![], vec![], vec![]);
        for r in a..z {
            let (s, e) = (r * self.t, r * self.t + self.lens[r]);
            cu.push(cu.last().unwrap() + self.lens[r] as i64);
            roll.extend_from_slice(&self.roll[s..e]);
            old.extend_from_slice(&self.old[s..e]);
            rr.extend_from_slice(&self.roll_re[s * lk..e * lk]);
            orr.extend_from_slice(&self.old_re[s * lk..e * lk]);
        }
        Batch::packed(&cu)
            .unwrap()
            .with_log_probs("rollout_log_prob", roll)
            .unwrap()
            .with_log_probs("old_log_prob", old)
            .unwrap()
            .with_routed_experts(&rr, &orr, self.l, self.k)
            .unwrap()
            .build()
            .unwrap()
    }

    /// The naive reference at padded slot `i` (valid): (overlap, flip, first layer, recorded).
    fn token(&self, i: usize) -> (f64, f64, f64, bool) {
        let (mut sum, mut n, mut first) = (0.0, 0usize, -1.0);
        for layer in 0..self.l {
            let at = (i * self.l + layer) * self.k;
            let a = &self.roll_re[at..at + self.k];
            let b = &self.old_re[at..at + self.k];
            if a.contains(&-1) || b.contains(&-1) {
                continue;
            }
            let (sa, sb): (BTreeSet<i64>, BTreeSet<i64>) =
                (a.iter().copied().collect(), b.iter().copied().collect());
            let o = sa.intersection(&sb).count() as f64 / self.k as f64;
            sum += o;
            n += 1;
            if o < 1.0 && first < 0.0 {
                first = layer as f64;
            }
        }
        let overlap = if n > 0 { sum / n as f64 } else { 1.0 };
        (overlap, (first >= 0.0) as u8 as f64, first, n > 0)
    }

    /// Per row: (flipped tokens, recorded tokens).
    fn row_flips(&self) -> Vec<(f64, f64)> {
        (0..self.b)
            .map(|r| {
                (0..self.lens[r]).fold((0.0, 0.0), |(f, n), j| {
                    let (_, flip, _, rec) = self.token(r * self.t + j);
                    (f + flip, n + rec as u8 as f64)
                })
            })
            .collect()
    }
}

fn reference() -> BTreeMap<String, f64> {
    let v = load_json(&sample("reference_metrics.json"));
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, x)| (k.clone(), json_num(x)))
        .collect()
}

fn output<'a>(a: &'a Analysis, name: &str) -> &'a [f64] {
    &a.outputs.iter().find(|o| o.name == name).unwrap().data
}

/// Count-based metrics are exact on every engine; |log ρ| means and the k3 share come from the
/// engine's log-ratio (f64 on the CPU, f32 on the GPU: docs/FORMAT.md's accuracy).
fn check_metrics(what: &str, m: &BTreeMap<String, f64>, cpu: bool) {
    let want = reference();
    assert_eq!(
        m.keys()
            .filter(|k| k.starts_with("trmask/routing/"))
            .count(),
        want.len(),
        "{what}: the routing metrics"
    );
    for (k, &w) in &want {
        let got = m[k];
        let rtol = if cpu || !k.contains("log_ratio") && !k.contains("k3") {
            1e-9
        } else if k.contains("k3") {
            2e-3
        } else {
            1e-4
        };
        assert!(
            (got - w).abs() <= rtol * w.abs(),
            "{what}: {k} = {got}, reference {w}"
        );
    }
}

#[test]
fn moe_sample_metrics_and_outputs_on_every_engine_padded_and_packed() {
    let moe = Moe::load();
    let cfg = CorrectionConfig::default();
    let padded = moe.padded(0, moe.b);
    let packed = moe.packed(0, moe.b);
    for engine in engines() {
        let cpu = engine.name() == "cpu";
        let a = analyze(engine.as_ref(), &padded, &cfg).unwrap();
        check_metrics(&format!("{} padded", engine.name()), &a.metrics, cpu);
        let p = analyze(engine.as_ref(), &packed, &cfg).unwrap();
        check_metrics(&format!("{} packed", engine.name()), &p.metrics, cpu);
        for k in a
            .metrics
            .keys()
            .filter(|k| k.starts_with("trmask/routing/"))
        {
            assert_eq!(a.metrics[k], p.metrics[k], "{k}: padded vs packed");
        }
        // per-token outputs, exact, in both layouts
        let (ov, fl, first) = (
            output(&a, "route_overlap"),
            output(&a, "route_flip"),
            output(&a, "route_first_layer"),
        );
        let (pov, pfl, pfirst) = (
            output(&p, "route_overlap"),
            output(&p, "route_flip"),
            output(&p, "route_first_layer"),
        );
        let mut n = 0;
        for r in 0..moe.b {
            for j in 0..moe.lens[r] {
                let i = r * moe.t + j;
                let (o, f, l, _) = moe.token(i);
                assert_eq!((ov[i], fl[i], first[i]), (o, f, l), "slot {i}");
                assert_eq!((pov[n], pfl[n], pfirst[n]), (o, f, l), "packed slot {n}");
                n += 1;
            }
        }
        // the per-sequence flip fraction: flipped ÷ recorded tokens
        let seq = output(&a, "seq_mean_route_flip");
        for (r, (f, rec)) in moe.row_flips().into_iter().enumerate() {
            assert_eq!(seq[r], if rec > 0.0 { f / rec } else { 0.0 }, "row {r}");
        }
        assert_eq!(seq, output(&p, "seq_mean_route_flip"));
    }
}

/// The sample's tensors under other frameworks' keys, written as safetensors.
fn renamed(keys: &[(&str, &str)], tag: &str) -> PathBuf {
    let bytes = std::fs::read(sample("batch.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names: Vec<String> = st.names().into_iter().map(String::from).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = names
        .iter()
        .map(|n| {
            let key = keys
                .iter()
                .find(|(from, _)| from == n)
                .map_or(n.as_str(), |(_, to)| to);
            (key.to_string(), st.tensor(n).unwrap())
        })
        .collect();
    let p = common::scratch("routing", &format!("{tag}.safetensors"));
    std::fs::write(&p, safetensors::serialize(views, None).unwrap()).unwrap();
    p
}

#[test]
fn slime_and_vllm_names_read_the_same_batch() {
    let cfg = CorrectionConfig::default();
    let slime = renamed(
        &[
            ("rollout_log_prob", "rollout_log_probs"),
            ("old_log_prob", "log_probs"),
        ],
        "slime",
    );
    let vllm = renamed(&[("rollout_routed_experts", "routed_experts")], "vllm");
    for engine in engines() {
        let cpu = engine.name() == "cpu";
        for (what, p) in [("slime", &slime), ("vLLM", &vllm)] {
            let input = trmask::io::read_input(p, &Default::default()).unwrap();
            assert!(input.batch.routing().is_some(), "{what}");
            let a = analyze(engine.as_ref(), &input.batch, &cfg).unwrap();
            check_metrics(&format!("{} {what}", engine.name()), &a.metrics, cpu);
        }
    }
}

#[test]
fn route_flip_criteria_on_both_engines() {
    let moe = Moe::load();
    let flips = moe.row_flips();
    let cfg = CorrectionConfig::from_json_str(
        r#"{"rollout_rs": "seq_mean_route_flip,seq_sum_route_flip,seq_max_route_flip,token_route_flip",
            "rollout_rs_threshold": "0.02,4,1,1"}"#,
    )
    .unwrap();
    for batch in [moe.padded(0, moe.b), moe.packed(0, moe.b)] {
        let mut decisions = Vec::new();
        for engine in engines() {
            let a = analyze(engine.as_ref(), &batch, &cfg).unwrap();
            let c = &a.corrections.criteria;
            for (r, &(f, rec)) in flips.iter().enumerate() {
                let mean = if rec > 0.0 { f / rec } else { 0.0 };
                let got = c[0].seq_stat[r];
                assert!(
                    (got - mean).abs() <= 1e-6 * mean,
                    "{}: {got} {mean}",
                    engine.name()
                );
                assert_eq!(c[1].seq_stat[r], f, "{} seq_sum row {r}", engine.name());
                assert_eq!(c[2].seq_stat[r], (f > 0.0) as u8 as f64, "seq_max row {r}");
                assert!(!c[3].seq_reject[r], "token_route_flip <= 1 keeps all");
                let keep = mean <= 0.02 && f <= 4.0;
                // decisions may differ only within f32 rounding of the threshold
                if (mean - 0.02).abs() > 1e-6 {
                    assert_eq!(
                        a.corrections.seq_accept[r],
                        keep,
                        "{} row {r}",
                        engine.name()
                    );
                }
            }
            decisions.push(a.corrections.seq_accept.clone());
            assert_eq!(output(&a, "seq_mean_route_flip"), &c[0].seq_stat[..]);
        }
        assert!(decisions.windows(2).all(|w| w[0] == w[1]));
        let rejected = decisions[0].iter().filter(|&&k| !k).count();
        assert!(
            rejected > 0 && rejected < moe.b,
            "the criteria decide: {rejected}"
        );
    }
    // without routing tensors the criterion names what it needs
    let bare = Batch::padded(1, 1, &[1.0])
        .unwrap()
        .with_log_probs("rollout_log_prob", vec![-1.0])
        .unwrap()
        .with_log_probs("old_log_prob", vec![-1.0])
        .unwrap()
        .build()
        .unwrap();
    let e = analyze(&CpuEngine::new(), &bare, &cfg)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout_routed_experts"), "{e}");
}

#[test]
fn ranks_merge_bit_for_bit() {
    let moe = Moe::load();
    let cfg = CorrectionConfig::from_json_str(
        r#"{"rollout_rs": "seq_mean_route_flip", "rollout_rs_threshold": 0.02}"#,
    )
    .unwrap();
    let whole = analyze(&CpuEngine::new(), &moe.padded(0, moe.b), &cfg).unwrap();
    for size in 1..=8usize {
        // uneven cuts, an empty shard where there are enough ranks
        let mut cuts: Vec<usize> = (0..=size).map(|r| r * moe.b / size).collect();
        if size >= 3 {
            cuts[1] = 0;
        }
        let hub = Hub::new(size);
        let results: Vec<Analysis> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..size)
                .map(|rank| {
                    let (hub, cuts, moe, cfg) = (&hub, &cuts, &moe, &cfg);
                    s.spawn(move || {
                        let batch = moe.padded(cuts[rank], cuts[rank + 1]);
                        let mut ex = Rank {
                            hub,
                            rank,
                            size,
                            bytes_sent: 0,
                        };
                        analyze_shard(&CpuEngine::new(), &batch, cfg, &mut ex).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, a) in results.iter().enumerate() {
            for (k, v) in whole
                .metrics
                .iter()
                .filter(|(k, _)| k.starts_with("trmask/routing/"))
            {
                assert_eq!(a.metrics[k].to_bits(), v.to_bits(), "{size} ranks, {k}");
            }
            let (a0, z0) = (cuts[rank], cuts[rank + 1]);
            assert_eq!(
                output(a, "route_flip"),
                &output(&whole, "route_flip")[a0 * moe.t..z0 * moe.t]
            );
            assert_eq!(
                a.corrections.criteria[0].seq_stat,
                whole.corrections.criteria[0].seq_stat[a0..z0]
            );
        }
    }
}

#[test]
fn bad_routing_input_is_named() {
    let moe = Moe::load();
    let (t, lk) = (moe.t, moe.l * moe.k);
    let base = || Batch::padded(1, t, &moe.mask[..t]).unwrap();
    let err = |r: &[i64], o: &[i64], l: usize, k: usize| {
        base()
            .with_routed_experts(r, o, l, k)
            .unwrap_err()
            .to_string()
    };
    let (r, o) = (&moe.roll_re[..t * lk], &moe.old_re[..t * lk]);
    // padding of row 0 holds garbage (ids < -1, duplicates): never read
    assert!(base().with_routed_experts(r, o, moe.l, moe.k).is_ok());
    let mut dup = r.to_vec();
    dup[1] = dup[0];
    let e = err(&dup, o, moe.l, moe.k);
    assert!(
        e.contains("rollout_routed_experts") && e.contains("[0, 0], layer 0"),
        "{e}"
    );
    let mut neg = o.to_vec();
    neg[lk + 3] = -2;
    let e = err(r, &neg, moe.l, moe.k);
    assert!(
        e.contains("old_routed_experts") && e.contains("[0, 1], layer 1"),
        "{e}"
    );
    let e = err(r, &o[..o.len() - moe.k], moe.l, moe.k);
    assert!(
        e.contains("old_routed_experts") && e.contains("expected"),
        "{e}"
    );
    // one line each
    assert!(!e.contains('\n'));
}
