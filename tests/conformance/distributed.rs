//! Issue 12, item 4: equality is the test. Random batches split into R = 1…8 shards in any
//! proportions (empty and one-sequence shards included), each shard analysed by its own rank
//! (threads exchanging partial bytes through a barrier, the same collective pattern as MPI):
//! the merged metrics equal the whole batch's to 1e-12 relative (exactly for counts, maxima,
//! minima, fractions, quantiles and the certificate), and each rank's outputs — weights, mask,
//! per-sequence statistics and decisions — equal its rows of the whole-batch run.

use crate::common;

use common::{seed, Rng};
use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use trmask::analysis::{analyze, analyze_shard, Analysis};
use trmask::cpu::CpuEngine;
use trmask::partial::{Acc, Partial, Sum};
use trmask::{Batch, CorrectionConfig, Logits};

use common::{Hub, Rank};

/// Per sequence: rollout logits, trainer logits, sampled tokens, and per slot the sampler's
/// kept set (the sampled token and a random subset of the vocabulary).
type SeqLogits = (
    Vec<Vec<f32>>,
    Vec<Vec<f32>>,
    Vec<Vec<i64>>,
    Vec<Vec<Vec<i64>>>,
);

/// A whole batch as plain arrays, so any run of sequences can be cut out as a shard.
struct Whole {
    t: usize,
    packed: bool,
    /// Per sequence: (valid length, slots) — padded rows have T slots, packed sequences `len`.
    lens: Vec<usize>,
    mask: Vec<Vec<f64>>,
    rollout: Vec<Vec<f64>>,
    old: Vec<Vec<f64>>,
    /// Per-token advantages (a sign per sequence, sometimes 0): the `trmask/adv_*` split.
    adv: Vec<Vec<f64>>,
    uid: Vec<i64>,
    vocab: usize,
    logits: Option<SeqLogits>,
}

impl Whole {
    fn random(rng: &mut Rng, with_logits: bool) -> Whole {
        let b = 1 + rng.below(20);
        let t = 1 + rng.below(12);
        let packed = rng.bool(0.4);
        let vocab = 2 + rng.below(6);
        let drift = rng.range(0.01, 0.6);
        let mut w = Whole {
            t,
            packed,
            lens: vec![],
            mask: vec![],
            rollout: vec![],
            old: vec![],
            adv: vec![],
            uid: vec![],
            vocab,
            logits: with_logits.then(|| (vec![], vec![], vec![], vec![])),
        };
        for s in 0..b {
            // some empty sequences; padded rows get random holes
            let len = if rng.bool(0.15) { 0 } else { 1 + rng.below(t) };
            let slots = if packed { len } else { t };
            let mask: Vec<f64> = (0..slots)
                .map(|i| (i < len && (packed || i == 0 || rng.bool(0.9))) as u8 as f64)
                .collect();
            let r: Vec<f64> = (0..slots).map(|_| rng.range(-3.0, -0.01)).collect();
            let o: Vec<f64> = r.iter().map(|x| x + rng.range(-drift, drift)).collect();
            if let Some((rl, ol, resp, kept)) = &mut w.logits {
                let mut a = Vec::new();
                let mut c = Vec::new();
                let mut y = Vec::new();
                let mut k = Vec::new();
                for _ in 0..slots {
                    for _ in 0..vocab {
                        let x = rng.range(-2.0, 2.0) as f32;
                        a.push(x);
                        c.push(x + rng.range(-drift, drift) as f32);
                    }
                    let yt = rng.below(vocab) as i64;
                    y.push(yt);
                    let set: Vec<i64> = (0..vocab as i64)
                        .filter(|&j| j == yt || rng.bool(0.5))
                        .collect();
                    k.push(set);
                }
                rl.push(a);
                ol.push(c);
                resp.push(y);
                kept.push(k);
            }
            w.lens.push(len);
            w.mask.push(mask);
            w.rollout.push(r);
            w.old.push(o);
            let a = [-1.0, 0.0, 1.0][rng.below(3)] * rng.range(0.1, 2.0);
            w.adv.push(vec![a; slots]);
            w.uid.push((s / 3) as i64 * 7 + 1);
        }
        w
    }

    fn seqs(&self) -> usize {
        self.lens.len()
    }

    /// Sequences `a..b` as a batch (a padded `[b − a, T]` or packed batch; may be empty).
    fn shard(&self, a: usize, b: usize) -> Batch {
        let cat = |v: &[Vec<f64>]| v[a..b].concat();
        let mut batch = if self.packed {
            let mut cu = vec![0i64];
            for s in a..b {
                cu.push(cu.last().unwrap() + self.mask[s].len() as i64);
            }
            Batch::packed(&cu).unwrap()
        } else {
            Batch::padded(b - a, self.t, &cat(&self.mask)).unwrap()
        };
        batch = batch
            .with_log_probs("rollout_log_prob", cat(&self.rollout))
            .unwrap()
            .with_log_probs("old_log_prob", cat(&self.old))
            .unwrap()
            .with_log_probs("advantages", cat(&self.adv))
            .unwrap()
            .with_uid(self.uid[a..b].to_vec())
            .unwrap();
        if let Some((rl, ol, resp, kept)) = &self.logits {
            let slots: usize = self.mask[a..b].iter().map(Vec::len).sum();
            let r = Logits::from_f32(&rl[a..b].concat(), slots, self.vocab).unwrap();
            let o = Logits::from_f32(&ol[a..b].concat(), slots, self.vocab).unwrap();
            // the kept sets, one span per slot (those at padding are ignored)
            let (mut ids, mut off) = (Vec::new(), vec![0i64]);
            for set in kept[a..b].iter().flatten() {
                ids.extend_from_slice(set);
                off.push(ids.len() as i64);
            }
            batch = batch.with_kept_sets(ids, &off).unwrap();
            batch = batch
                .with_responses(resp[a..b].concat())
                .unwrap()
                .with_logits("rollout_logits", r)
                .unwrap()
                .with_logits("old_logits", o)
                .unwrap();
        }
        batch.build().unwrap()
    }

    /// Slot range of sequences `a..b` in a per-token output.
    fn slots(&self, a: usize, b: usize) -> (usize, usize) {
        let before: usize = self.mask[..a].iter().map(Vec::len).sum();
        let inside: usize = self.mask[a..b].iter().map(Vec::len).sum();
        (before, before + inside)
    }
}

/// Runs every shard on its own thread; returns each rank's analysis and bytes sent.
fn run_ranks(whole: &Whole, cuts: &[usize], config: &CorrectionConfig) -> Vec<(Analysis, usize)> {
    let size = cuts.len() - 1;
    let hub = Hub::new(size);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (hub, cuts) = (&hub, cuts);
                s.spawn(move || {
                    let batch = whole.shard(cuts[rank], cuts[rank + 1]);
                    let mut ex = Rank {
                        hub,
                        rank,
                        size,
                        bytes_sent: 0,
                    };
                    let a = analyze_shard(&CpuEngine::new(), &batch, config, &mut ex).unwrap();
                    (a, ex.bytes_sent)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

use common::{close12 as close, exact_metric, same};

fn check(whole: &Whole, cuts: &[usize], config: &CorrectionConfig, what: &str) {
    let full = analyze(&CpuEngine::new(), &whole.shard(0, whole.seqs()), config).unwrap();
    let ranks = run_ranks(whole, cuts, config);
    let ctx = format!(
        "{what}: {} seqs, packed {}, cuts {cuts:?}",
        whole.seqs(),
        whole.packed
    );
    for (r, (a, _)) in ranks.iter().enumerate() {
        // metrics: the same keys and values on every rank
        let keys = |m: &BTreeMap<String, f64>| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            keys(&a.metrics),
            keys(&full.metrics),
            "{ctx}: rank {r} metric keys"
        );
        for (k, &want) in &full.metrics {
            let got = a.metrics[k];
            let ok = if exact_metric(k) {
                same(got, want)
            } else {
                close(got, want)
            };
            assert!(ok, "{ctx}: rank {r} {k} = {got:e}, whole batch {want:e}");
        }
        // per-token and per-sequence outputs: this shard's rows of the whole-batch run
        let (a0, a1) = (cuts[r], cuts[r + 1]);
        let (t0, t1) = whole.slots(a0, a1);
        assert_eq!(
            a.outputs.len(),
            full.outputs.len(),
            "{ctx}: rank {r} outputs"
        );
        for (o, f) in a.outputs.iter().zip(&full.outputs) {
            assert_eq!(o.name, f.name, "{ctx}: rank {r} output order");
            let rows = if o.name.starts_with("seq_") {
                &f.data[a0..a1]
            } else {
                &f.data[t0..t1]
            };
            assert_eq!(
                o.data.len(),
                rows.len(),
                "{ctx}: rank {r} {} length",
                o.name
            );
            for (i, (&x, &y)) in o.data.iter().zip(rows).enumerate() {
                let ok = if o.name == "rollout_is_weights" {
                    close(x, y)
                } else {
                    same(x, y)
                };
                assert!(
                    ok,
                    "{ctx}: rank {r} {}[{i}] = {x:e}, whole batch {y:e}",
                    o.name
                );
            }
        }
        assert_eq!(
            a.corrections.seq_accept,
            full.corrections.seq_accept[a0..a1],
            "{ctx}: rank {r} seq_accept"
        );
    }
}

/// R shards with random cut points (repeats make empty shards; forced one-sequence shards).
fn random_cuts(rng: &mut Rng, seqs: usize, r: usize) -> Vec<usize> {
    let mut inner: Vec<usize> = (0..r - 1).map(|_| rng.below(seqs + 1)).collect();
    if r > 2 && seqs > 2 && rng.bool(0.5) {
        let s = rng.below(seqs - 1);
        inner[0] = s;
        inner[1] = s + 1; // sequence s alone
    }
    inner.sort_unstable();
    let mut cuts = vec![0];
    cuts.extend(inner);
    cuts.push(seqs);
    cuts
}

fn configs() -> Vec<(&'static str, CorrectionConfig)> {
    let json = |s: &str| CorrectionConfig::from_json_str(s).unwrap();
    vec![
        (
            "token TIS, batch-normalised, seq_mean_k3",
            json(
                r#"{"rollout_is": "token", "rollout_is_threshold": 2.0,
                     "rollout_is_batch_normalize": true,
                     "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}"#,
            ),
        ),
        (
            "sequence IcePop, batch-normalised, geo mask, token veto",
            json(
                r#"{"rollout_is": "sequence", "rollout_is_threshold": "0.5_2.0",
                     "rollout_is_batch_normalize": true,
                     "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.1",
                     "token_veto": 0.2}"#,
            ),
        ),
        (
            "token and max criteria, LN-TRM",
            json(
                r#"{"rollout_rs": "token_k3,seq_max_k2,seq_lntrm",
                     "rollout_rs_threshold": "0.2,0.3,0.05",
                     "ln_trm": {"eps": 0.01, "delta": 0.001}}"#,
            ),
        ),
        (
            "legacy geometric RS, token IS batch-normalised, veto",
            json(
                r#"{"rollout_is": "token", "rollout_is_threshold": 2.0,
                     "rollout_is_batch_normalize": true,
                     "rollout_rs": "geometric", "rollout_rs_threshold": 1.3,
                     "rollout_rs_threshold_lower": 0.8,
                     "rollout_token_veto_threshold": 0.1}"#,
            ),
        ),
        (
            "preset decoupled_k3_rs",
            CorrectionConfig::preset("decoupled_k3_rs").unwrap(),
        ),
    ]
}

#[test]
fn merged_shards_equal_the_whole_batch() {
    let seed = seed(12);
    let mut rng = Rng::new(seed);
    let configs = configs();
    let mut trials = 0;
    for round in 0..6 {
        for r in 1..=8 {
            let whole = Whole::random(&mut rng, round % 3 == 2);
            // the whole batch needs a valid token
            if whole.lens.iter().all(|&l| l == 0) {
                continue;
            }
            let cuts = random_cuts(&mut rng, whole.seqs(), r);
            let (name, cfg) = &configs[(round + r) % configs.len()];
            check(&whole, &cuts, cfg, &format!("seed {seed}, {name}"));
            trials += 1;
        }
    }
    assert!(trials >= 40, "only {trials} trials ran");
}

/// The breakdowns (advantage sign, probability and entropy buckets, turns) are mergeable:
/// over 1–8 ranks they equal the whole batch's (`check` compares every metric).
#[test]
fn breakdowns_merge_over_ranks() {
    let mut rng = Rng::new(seed(3030));
    let (_, plain) = &configs()[0];
    // with logits the batch carries kept sets: replay over them (the kept mass merges too)
    let replay = CorrectionConfig::from_json_str(
        r#"{"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01, "sampling_replay": true}"#,
    )
    .unwrap();
    let mut seen = BTreeMap::new();
    for round in 0..3 {
        for r in 1..=8 {
            let logits = (round + r) % 2 == 0;
            let cfg = if logits { &replay } else { plain };
            let whole = Whole::random(&mut rng, logits);
            if whole.lens.iter().all(|&l| l == 0) {
                continue;
            }
            let full = analyze(&CpuEngine::new(), &whole.shard(0, whole.seqs()), cfg).unwrap();
            for k in [
                "trmask/log_kept_mass_mean",
                "trmask/turn/2/k3_mean",
                "trmask/adv_neg/rejected_fraction",
                "trmask/adv_pos/seq_rejected_fraction",
                "trmask/by_prob/0.1-0.5/log_ratio_mean",
                "trmask/by_entropy/0.5-1/k3_mean",
            ] {
                *seen.entry(k).or_insert(0) += full.metrics.contains_key(k) as usize;
            }
            let cuts = random_cuts(&mut rng, whole.seqs(), r);
            check(&whole, &cuts, cfg, "breakdowns");
        }
    }
    assert!(seen.values().all(|&n| n > 0), "{seen:?}");
}

#[test]
fn exact_divergences_merge_with_the_certificate() {
    let mut rng = Rng::new(seed(1212));
    let cfg = CorrectionConfig::from_json_str(
        r#"{"rollout_is": "token", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": true,
            "rollout_rs": "seq_max_kl,seq_mean_tv", "rollout_rs_threshold": "0.08,0.1"}"#,
    )
    .unwrap();
    for r in [1, 2, 3, 5, 8] {
        let whole = Whole::random(&mut rng, true);
        if whole.lens.iter().all(|&l| l == 0) {
            continue;
        }
        let cuts = random_cuts(&mut rng, whole.seqs(), r);
        check(&whole, &cuts, &cfg, "exact divergences");
    }
}

#[test]
fn every_shard_empty_but_one_and_all_empty() {
    let mut rng = Rng::new(seed(7));
    let cfg = configs().remove(0).1;
    let mut whole = Whole::random(&mut rng, false);
    whole.lens[0] = whole.lens[0].max(1);
    whole.mask[0][0] = 1.0;
    let n = whole.seqs();
    check(&whole, &[0, 0, 0, n, n], &cfg, "three empty shards");
    // no valid token anywhere: every rank gets the single-process error
    let empty = Whole {
        lens: vec![0, 0],
        mask: vec![vec![0.0; whole.t], vec![0.0; whole.t]],
        rollout: vec![vec![-1.0; whole.t]; 2],
        old: vec![vec![-1.0; whole.t]; 2],
        uid: vec![1, 2],
        packed: false,
        logits: None,
        ..whole
    };
    let size = 2;
    let hub = Hub::new(size);
    std::thread::scope(|s| {
        for rank in 0..size {
            let (hub, empty, cfg) = (&hub, &empty, &cfg);
            s.spawn(move || {
                let batch = empty.shard(rank, rank + 1);
                let mut ex = Rank {
                    hub,
                    rank,
                    size,
                    bytes_sent: 0,
                };
                let e = analyze_shard(&CpuEngine::new(), &batch, cfg, &mut ex).unwrap_err();
                assert!(e.to_string().contains("response_mask"), "{e}");
            });
        }
    });
}

#[test]
fn partial_bytes_round_trip_and_reject_garbage() {
    let mut p = Partial::new();
    p.put("a", Acc::masked_mean(Sum::of([1.0, 1e-17, 2.0]), 3));
    p.put("b", Acc::Quantiles(vec![3.0, 1.0, 2.0]));
    p.put("c", Acc::moments(&[1.0, 2.0, 4.0]));
    let bytes = p.to_bytes();
    assert_eq!(Partial::from_bytes(&bytes).unwrap(), p);
    for cut in [0, 3, 9, bytes.len() - 1] {
        let e = Partial::from_bytes(&bytes[..cut]).unwrap_err();
        assert!(e.to_string().contains("partial"), "{e}");
    }
    // a vector length larger than the buffer is an error, not an allocation
    let mut huge = bytes.clone();
    let at = huge.windows(1).position(|w| w[0] == 10).unwrap(); // the Quantiles tag
    huge[at + 1..at + 9].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Partial::from_bytes(&huge).is_err());
    // merging is order-independent for the moments (Chan) to within rounding
    let mut x = Partial::new();
    x.put("m", Acc::moments(&[1.0, 2.0]));
    let mut y = Partial::new();
    y.put("m", Acc::moments(&[4.0, 8.0, 16.0]));
    let mut xy = x.clone();
    xy.merge(&y).unwrap();
    let mut yx = y.clone();
    yx.merge(&x).unwrap();
    let want = Acc::moments(&[1.0, 2.0, 4.0, 8.0, 16.0]);
    let mut whole = Partial::new();
    whole.put("m", want);
    let (a, b, w) = (
        xy.finish_one("m").unwrap().unwrap(),
        yx.finish_one("m").unwrap().unwrap(),
        whole.finish_one("m").unwrap().unwrap(),
    );
    assert!(close(a, w) && close(b, w), "{a} {b} {w}");
}

#[test]
fn corrector_correct_shard_equals_correct() {
    use trmask::{Corrector, Step};
    let mut rng = Rng::new(seed(99));
    let (b, t) = (9, 7);
    let mask: Vec<bool> = (0..b * t).map(|i| i % t < 1 + (i / t) % t).collect();
    let roll: Vec<f32> = (0..b * t).map(|_| rng.range(-3.0, -0.1) as f32).collect();
    let old: Vec<f32> = roll
        .iter()
        .map(|x| x + rng.range(-0.3, 0.3) as f32)
        .collect();
    let cfg = configs().remove(1).1;
    let corrector = Corrector::new(CpuEngine::new(), &cfg).unwrap();
    let whole = corrector
        .correct(
            &Step::padded(b, t)
                .response_mask(&mask[..])
                .rollout_log_prob(&roll[..])
                .old_log_prob(&old[..]),
        )
        .unwrap();
    let cuts = [0, 4, 9];
    let hub = Hub {
        slots: Mutex::new(vec![Vec::new(); 2]),
        barrier: Barrier::new(2),
    };
    let shards: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (hub, corrector, mask, roll, old) = (&hub, &corrector, &mask, &roll, &old);
                s.spawn(move || {
                    let (a, z) = (cuts[rank] * t, cuts[rank + 1] * t);
                    let step = Step::padded(cuts[rank + 1] - cuts[rank], t)
                        .response_mask(&mask[a..z])
                        .rollout_log_prob(&roll[a..z])
                        .old_log_prob(&old[a..z]);
                    let mut ex = Rank {
                        hub,
                        rank,
                        size: 2,
                        bytes_sent: 0,
                    };
                    corrector.correct_shard(&step, &mut ex).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, c) in shards.iter().enumerate() {
        let (a, z) = (cuts[r] * t, cuts[r + 1] * t);
        assert_eq!(c.mask, whole.mask[a..z], "rank {r} mask");
        let (w, ww) = (c.weights.as_ref().unwrap(), whole.weights.as_ref().unwrap());
        assert!(
            w.iter().zip(&ww[a..z]).all(|(x, y)| close(*x, *y)),
            "rank {r} weights"
        );
        assert_eq!(
            c.metrics.len(),
            whole.metrics.len(),
            "rank {r} metric count"
        );
        for (k, &v) in &whole.metrics {
            assert!(
                close(c.metrics[k], v),
                "rank {r} {k}: {} vs {v}",
                c.metrics[k]
            );
        }
    }
}
