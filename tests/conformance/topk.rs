//! Top-K divergences and DPPO / PDM masks (docs/FORMAT.md, DPPO) on the CPU reference path.

use crate::common;

use common::{assert_close, close, gpu, gpu_small_chunks, gpu_with_flavour, seed, Rng};
use std::collections::BTreeMap;
use trmask::topk::{
    dppo_mask, topk_divergence, DppoConfig, DppoDirection, TopkDivergence, TopkStats, TopkSupport,
    TrainerSupportLogProbs, TrainerTopk,
};
use trmask::{Batch, BatchBuilder, DType, Engine, Error, Logits};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/real-small");

struct Real {
    n: usize,
    v: usize,
    rollout: Vec<f64>, // bf16 logits widened
    trainer_bytes: Vec<u8>,
    trainer: Vec<f64>,
    y: Vec<i64>,
    cu: Vec<i64>,
    reference: BTreeMap<String, (Vec<usize>, Vec<u8>, safetensors::Dtype)>,
}

fn load() -> Real {
    let bytes = std::fs::read(format!("{DATA}/logits.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = |name: &str| st.tensor(name).unwrap();
    let r = t("rollout_logits");
    let (n, v) = (r.shape()[0], r.shape()[1]);
    assert_eq!(r.dtype(), safetensors::Dtype::BF16);
    let rollout = (0..n * v)
        .map(|i| DType::BF16.decode(r.data(), i) as f64)
        .collect();
    let tr = t("trainer_logits");
    assert_eq!(tr.dtype(), safetensors::Dtype::F32);
    let trainer = (0..n * v)
        .map(|i| DType::F32.decode(tr.data(), i) as f64)
        .collect();
    let i32s = |name: &str| -> Vec<i64> {
        t(name)
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect()
    };
    let rbytes = std::fs::read(format!("{DATA}/reference.safetensors")).unwrap();
    let rs = safetensors::SafeTensors::deserialize(&rbytes).unwrap();
    let reference = rs
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, (v.shape().to_vec(), v.data().to_vec(), v.dtype())))
        .collect();
    Real {
        n,
        v,
        rollout,
        trainer_bytes: tr.data().to_vec(),
        trainer,
        y: i32s("sampled_ids"),
        cu: i32s("cu_seqlens"),
        reference,
    }
}

impl Real {
    fn f64s(&self, key: &str) -> Vec<f64> {
        let (_, data, dt) = &self.reference[key];
        assert_eq!(*dt, safetensors::Dtype::F64, "{key}");
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn i32s(&self, key: &str) -> Vec<i64> {
        let (_, data, _) = &self.reference[key];
        data.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect()
    }
    fn row(&self, x: &[f64], r: usize) -> Vec<f64> {
        x[r * self.v..(r + 1) * self.v].to_vec()
    }
    /// Rollout log-softmax of row r, the max factored out (exact at the mode).
    fn rollout_log_softmax(&self, r: usize) -> Vec<f64> {
        let a = self.row(&self.rollout, r);
        let m = a.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let arg = a.iter().position(|&x| x == m).unwrap();
        // Compensated sum: the tails 1 − Σ_S μ need the normaliser to ~1 ulp.
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
        let rest = rest + c;
        a.iter().map(|&x| (x - m) - rest.ln_1p()).collect()
    }
    /// Top-k ids of the rollout logits (ties by smaller id) and their log-probs.
    fn topk(&self, k: usize) -> (Vec<i64>, Vec<f64>) {
        let (mut ids, mut lps) = (vec![], vec![]);
        for r in 0..self.n {
            let a = self.row(&self.rollout, r);
            let lp = self.rollout_log_softmax(r);
            let mut order: Vec<usize> = (0..self.v).collect();
            order.sort_by(|&i, &j| a[j].partial_cmp(&a[i]).unwrap().then(i.cmp(&j)));
            for &i in &order[..k] {
                ids.push(i as i64);
                lps.push(lp[i]);
            }
        }
        (ids, lps)
    }
    fn batch(&self, k: usize) -> BatchBuilder {
        let roll_y: Vec<f64> = (0..self.n)
            .map(|r| self.rollout_log_softmax(r)[self.y[r] as usize])
            .collect();
        self.batch_without_log_probs(k)
            .with_log_probs("rollout_log_prob", roll_y)
            .unwrap()
    }
    /// The batch without `rollout_log_prob`: the responses and the rollout top-K.
    fn batch_without_log_probs(&self, k: usize) -> BatchBuilder {
        let (ids, lps) = self.topk(k);
        Batch::packed(&self.cu)
            .unwrap()
            .with_responses(self.y.clone())
            .unwrap()
            .with_topk(ids, lps, k)
            .unwrap()
            .with_logits(
                "old_logits",
                Logits::from_bytes(self.trainer_bytes.clone(), DType::F32, self.n, self.v).unwrap(),
            )
            .unwrap()
    }
}

/// Independent float64 reference, written the naive way: full softmax of both rows, gather
/// on S (given explicitly), direct tail sums over v ∉ S, docs/FORMAT.md's formulas verbatim.
struct Naive {
    kl: f64,
    tv: f64,
    agg: f64,
    uni: f64,
    mu_t: f64,
    pi_t: f64,
    pd: f64,
}

fn naive(real: &Real, r: usize, support: &[usize], mu_s: &[f64]) -> Naive {
    let soft = |x: Vec<f64>| {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|&v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect::<Vec<f64>>()
    };
    let p = soft(real.row(&real.rollout, r));
    let q = soft(real.row(&real.trainer, r));
    let y = real.y[r] as usize;
    let in_s = |v: usize| support.contains(&v);
    let mu_t: f64 = (0..real.v).filter(|&v| !in_s(v)).map(|v| p[v]).sum();
    let pi_t: f64 = (0..real.v).filter(|&v| !in_s(v)).map(|v| q[v]).sum();
    // μ on S is what the rollout reported (its log-probs), π gathered from the full softmax.
    let mu: Vec<f64> = mu_s.to_vec();
    let pi: Vec<f64> = support.iter().map(|&v| q[v]).collect();
    let (mh, ph) = (mu_t.max(1e-12), pi_t.max(1e-12));
    let kl = mu
        .iter()
        .zip(&pi)
        .map(|(a, b)| a * (a.ln() - b.ln()))
        .sum::<f64>()
        + mh * (mh.ln() - ph.ln());
    let tv = 0.5 * (mu.iter().zip(&pi).map(|(a, b)| (a - b).abs()).sum::<f64>() + (mh - ph).abs());
    let yi = support.iter().position(|&v| v == y).unwrap();
    let pd = pi[yi] - mu[yi];
    let cross: f64 = mu.iter().zip(&pi).map(|(a, b)| b * (a - b)).sum();
    let tail = ph * (mh - ph);
    let rest = real.v - support.len();
    Naive {
        kl,
        tv,
        agg: pd + cross + tail,
        uni: pd + cross + if rest > 0 { tail / rest as f64 } else { 0.0 },
        mu_t,
        pi_t,
        pd,
    }
}

#[test]
fn real_small_top20_matches_reference() {
    let real = load();
    let k = 20;
    let batch = real.batch(k).build().unwrap();
    // Our top-20 is the reference's set S.
    let ref_ids = real.i32s("bf16.topk_ids");
    let (ids, _) = real.topk(k);
    for r in 0..real.n {
        assert_eq!(
            &ids[r * k..(r + 1) * k],
            &ref_ids[r * 21..r * 21 + 20],
            "row {r}"
        );
    }
    let s = topk_divergence(
        &batch,
        TopkSupport::Union,
        TrainerTopk::from_batch(&batch, 1.0).unwrap(),
    )
    .unwrap();
    let size: Vec<u32> = real
        .i32s("bf16.topk_set_size")
        .iter()
        .map(|&x| x as u32)
        .collect();
    assert_eq!(s.support_size, size);
    assert_close(
        "topk_kl",
        &s.topk_kl,
        &real.f64s("bf16.topk_kl_rollout_trainer"),
        1e-9,
        1e-12,
        0,
    );
    assert_close(
        "rollout_tail",
        &s.rollout_tail,
        &real.f64s("bf16.topk_tail_rollout"),
        1e-9,
        1e-12,
        0,
    );
    assert_close(
        "train_tail",
        &s.train_tail,
        &real.f64s("bf16.topk_tail_trainer"),
        1e-9,
        1e-12,
        0,
    );
    // The real data spans KLs from 1e-20 to 5e-3: make sure both ends are exercised.
    let kl = real.f64s("bf16.topk_kl_rollout_trainer");
    assert!(kl.iter().cloned().fold(0.0, f64::max) > 1e-3);
    assert!(kl.iter().cloned().fold(1.0, f64::min) < 1e-15);
    for r in 0..real.n {
        let support: Vec<usize> = ref_ids[r * 21..r * 21 + 21]
            .iter()
            .filter(|&&i| i >= 0)
            .map(|&i| i as usize)
            .collect();
        let lp = real.rollout_log_softmax(r);
        let mu: Vec<f64> = support.iter().map(|&v| lp[v].exp()).collect();
        let w = naive(&real, r, &support, &mu);
        let t = |name: &str, g: f64, want: f64| {
            assert!(
                close(g, want, 1e-9, 1e-12),
                "{name}[{r}]: got {g:e}, want {want:e}"
            )
        };
        t("topk_kl", s.topk_kl[r], w.kl);
        t("topk_tv", s.topk_tv[r], w.tv);
        t("ddot_aggregated", s.ddot_aggregated[r], w.agg);
        t("ddot_uniform", s.ddot_uniform[r], w.uni);
        t("prob_diff", s.prob_diff[r], w.pd);
        t("rollout_tail", s.rollout_tail[r], w.mu_t);
        t("train_tail", s.train_tail[r], w.pi_t);
    }
}

/// Small K puts sampled tokens outside the top-K: both support rules against the naive path.
#[test]
fn real_small_small_k_both_supports() {
    let real = load();
    for k in [1usize, 2, 3] {
        let batch = real.batch(k).build().unwrap();
        let (ids, _) = real.topk(k);
        let mut outside = 0;
        for support in [TopkSupport::Union, TopkSupport::ReplaceKth] {
            let s = topk_divergence(
                &batch,
                support,
                TrainerTopk::from_batch(&batch, 1.0).unwrap(),
            )
            .unwrap();
            for r in 0..real.n {
                let y = real.y[r] as usize;
                let lp = real.rollout_log_softmax(r);
                let mut set: Vec<usize> = ids[r * k..(r + 1) * k]
                    .iter()
                    .map(|&i| i as usize)
                    .collect();
                if !set.contains(&y) {
                    outside += 1;
                    match support {
                        TopkSupport::Union => set.push(y),
                        // Rank-ordered input: the K-th (last) column is replaced.
                        TopkSupport::ReplaceKth => set[k - 1] = y,
                    }
                }
                assert_eq!(s.support_size[r] as usize, set.len());
                let mu: Vec<f64> = set.iter().map(|&v| lp[v].exp()).collect();
                let w = naive(&real, r, &set, &mu);
                let t = |name: &str, g: f64, want: f64| {
                    assert!(
                        close(g, want, 1e-9, 1e-12),
                        "K={k} {support:?} {name}[{r}]: got {g:e}, want {want:e}"
                    )
                };
                t("topk_kl", s.topk_kl[r], w.kl);
                t("topk_tv", s.topk_tv[r], w.tv);
                t("ddot_aggregated", s.ddot_aggregated[r], w.agg);
                t("ddot_uniform", s.ddot_uniform[r], w.uni);
                t("prob_diff", s.prob_diff[r], w.pd);
                t("rollout_tail", s.rollout_tail[r], w.mu_t);
                t("train_tail", s.train_tail[r], w.pi_t);
            }
        }
        assert!(outside > 0, "K={k}: every sampled token inside the top-K");
    }
}

/// Trainer log-probs given on S agree with the trainer-logits path, at τ = 1 and τ = 0.7 (the
/// logits divided by τ).
#[test]
fn trainer_log_probs_path_matches_logits_path() {
    let real = load();
    let k = 2;
    let batch = real.batch(k).build().unwrap();
    let ids = batch.rollout_topk_ids().unwrap().to_vec();
    for tau in [1.0, 0.7] {
        let q_lp: Vec<Vec<f64>> = (0..real.n)
            .map(|r| {
                let b: Vec<f64> = real.row(&real.trainer, r).iter().map(|x| x / tau).collect();
                let m = b.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + b.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
                b.iter().map(|&x| x - lse).collect()
            })
            .collect();
        let topk_lp: Vec<f64> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| q_lp[i / k][id as usize])
            .collect();
        let sampled: Vec<f64> = (0..real.n).map(|r| q_lp[r][real.y[r] as usize]).collect();
        for support in [TopkSupport::Union, TopkSupport::ReplaceKth] {
            let a = topk_divergence(
                &batch,
                support,
                TrainerTopk::from_batch(&batch, tau).unwrap(),
            )
            .unwrap();
            let b = topk_divergence(
                &batch,
                support,
                TrainerTopk::LogProbs(TrainerSupportLogProbs {
                    topk_log_prob: &topk_lp,
                    sampled_log_prob: &sampled,
                    vocab: real.v,
                }),
            )
            .unwrap();
            assert_eq!(a.support_size, b.support_size);
            for (name, x, y) in [
                ("topk_kl", &a.topk_kl, &b.topk_kl),
                ("topk_tv", &a.topk_tv, &b.topk_tv),
                ("ddot_aggregated", &a.ddot_aggregated, &b.ddot_aggregated),
                ("ddot_uniform", &a.ddot_uniform, &b.ddot_uniform),
                ("train_tail", &a.train_tail, &b.train_tail),
            ] {
                // τ = 0.7 sharpens the trainer: where π's tail is much smaller than μ's, the
                // tail term μ_t ln(μ_t/π_t) amplifies the last-bit differences of the two
                // paths' log-probs (4e-7 relative in one row's KL)
                let rtol = if tau == 1.0 { 1e-9 } else { 1e-6 };
                assert_close(&format!("{name} τ={tau}"), x, y, rtol, 1e-12, 0);
            }
        }
    }
}

/// A padded [2, 3] batch, V = 6, K = 2; row 1, t ≥ 1 are padding full of garbage.
fn small_batch(ids: Vec<i64>, lps: Vec<f64>) -> BatchBuilder {
    let nan = f64::NAN;
    small_batch_without_log_probs(ids, lps)
        .with_log_probs("rollout_log_prob", vec![-1.0, -1.0, -3.0, -2.0, nan, nan])
        .unwrap()
}

/// [`small_batch`] without `rollout_log_prob`.
fn small_batch_without_log_probs(ids: Vec<i64>, lps: Vec<f64>) -> BatchBuilder {
    let v = 6;
    let logits: Vec<f32> = (0..6 * v).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
    Batch::padded(2, 3, &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
        .unwrap()
        .with_responses(vec![0, 1, 5, 2, -7, 99])
        .unwrap()
        .with_topk(ids, lps, 2)
        .unwrap()
        .with_logits("old_logits", Logits::from_f32(&logits, 6, v).unwrap())
        .unwrap()
}

fn good_ids() -> (Vec<i64>, Vec<f64>) {
    // Padding slots (4, 5) hold duplicates, out-of-range ids and NaN: never read.
    (
        vec![0, 1, 1, 2, 3, 4, 2, 0, 7, 7, -1, 100],
        vec![
            -0.5,
            -1.5,
            -0.9,
            -1.1,
            -0.2,
            -2.5,
            -0.4,
            -1.6,
            f64::NAN,
            5.0,
            f64::INFINITY,
            0.0,
        ],
    )
}

fn run(b: &Batch) -> trmask::Result<TopkStats> {
    topk_divergence(
        b,
        TopkSupport::Union,
        TrainerTopk::from_batch(b, 1.0).unwrap(),
    )
}

#[test]
fn padding_is_ignored() {
    let (ids, lps) = good_ids();
    let s = run(&small_batch(ids, lps).build().unwrap()).unwrap();
    assert_eq!(s.support_size, vec![2, 2, 3, 2, 0, 0]);
    for x in [&s.topk_kl, &s.topk_tv, &s.ddot_aggregated, &s.rollout_tail] {
        assert_eq!(&x[4..], &[0.0, 0.0]);
        assert!(x[..4].iter().all(|v| v.is_finite()));
    }
    assert!(s.topk_kl[..4].iter().all(|&v| v > 0.0));
}

fn expect_err(b: BatchBuilder, tensor: &str, needle: &str) {
    match b.build().and_then(|b| run(&b)) {
        Err(Error::InvalidInput { tensor: t, problem }) => {
            assert_eq!(t, tensor, "{problem}");
            assert!(
                problem.contains(needle),
                "`{problem}` does not name `{needle}`"
            );
        }
        other => panic!("expected an error on {tensor}, got {other:?}"),
    }
}

#[test]
fn bad_topk_inputs_name_the_row() {
    // Duplicate id in row [1, 0] (slot 3).
    let (mut ids, lps) = good_ids();
    ids[6] = 5;
    ids[7] = 5;
    expect_err(small_batch(ids, lps.clone()), "rollout_topk_ids", "[1, 0]");
    // Id ≥ V at [0, 2].
    let (mut ids, _) = good_ids();
    ids[5] = 6;
    expect_err(small_batch(ids, lps.clone()), "rollout_topk_ids", "[0, 2]");
    let (mut ids, _) = good_ids();
    ids[0] = -1;
    expect_err(small_batch(ids, lps.clone()), "rollout_topk_ids", "[0, 0]");
    // Σμ > 1 at [0, 1].
    let (ids, mut lps2) = good_ids();
    lps2[2] = -0.1;
    lps2[3] = -0.2;
    expect_err(small_batch(ids, lps2), "rollout_topk_log_prob", "[0, 1]");
    // Σμ > 1 only once y joins the support at [0, 2] (y = 5 ∉ {3, 4}).
    let (ids, mut lps2) = good_ids();
    lps2[4] = -0.5;
    lps2[5] = -1.5;
    let b = small_batch(ids, lps2)
        .with_log_probs("rollout_log_prob", vec![0.0, 0.0, -0.9, 0.0, 0.0, 0.0])
        .unwrap();
    expect_err(b, "rollout_topk_log_prob", "[0, 2]");
    // Non-finite log-prob at a valid slot.
    let (ids, mut lps2) = good_ids();
    lps2[1] = f64::NAN;
    expect_err(small_batch(ids, lps2), "rollout_topk_log_prob", "[0, 0]");
    // Sampled token outside the top-K without rollout_log_prob.
    let (ids, lps) = good_ids();
    expect_err(
        small_batch_without_log_probs(ids, lps),
        "rollout_log_prob",
        "[0, 2]",
    );
    // A NaN trainer logit at a valid row.
    let (ids, lps) = good_ids();
    let mut logits: Vec<f32> = vec![0.5; 36];
    logits[3 * 6 + 4] = f32::NAN;
    let b = small_batch(ids, lps)
        .with_logits("old_logits", Logits::from_f32(&logits, 6, 6).unwrap())
        .unwrap();
    expect_err(b, "old_logits", "[1, 0]");
    // Trainer log-probs on S that sum past 1.
    let (ids, lps) = good_ids();
    let b = small_batch(ids, lps).build().unwrap();
    let train = vec![-0.1; 12];
    let err = topk_divergence(
        &b,
        TopkSupport::Union,
        TrainerTopk::LogProbs(TrainerSupportLogProbs {
            topk_log_prob: &train,
            sampled_log_prob: &[-1.0; 6],
            vocab: 6,
        }),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { tensor, problem } if tensor == "old_topk_log_prob" && problem.contains("[0, 0]")),
        "{err}"
    );
    // Σμ within 1 + 1e-5 is accepted.
    let (ids, mut lps2) = good_ids();
    lps2[0] = (0.6f64).ln();
    lps2[1] = (0.400_009f64).ln();
    assert!(run(&small_batch(ids, lps2).build().unwrap()).is_ok());
}

/// Hand-made statistics: one token per sign combination of (A, π_y − μ_y, ddot), all over δ,
/// plus tokens under δ and an invalid slot.
fn sign_cases() -> (TopkStats, Vec<f64>, Vec<bool>) {
    let mut s = TopkStats::zeros(0);
    let mut adv = vec![];
    let mut mask = vec![];
    let mut push = |kl: f64, pd: f64, agg: f64, uni: f64, a: f64, valid: bool| {
        s.topk_kl.push(kl);
        s.topk_tv.push(kl / 2.0);
        s.prob_diff.push(pd);
        s.ddot_aggregated.push(agg);
        s.ddot_uniform.push(uni);
        s.rollout_tail.push(0.01);
        s.train_tail.push(0.02);
        s.support_size.push(3);
        adv.push(a);
        mask.push(valid);
    };
    for a in [1.0, -1.0] {
        for pd in [0.1, -0.1] {
            for dd in [0.2, -0.2] {
                push(0.5, pd, dd, -dd, a, true); // over δ = 0.1
            }
        }
    }
    push(0.05, 0.1, 0.2, 0.2, 1.0, true); // under δ: kept whatever the signs
    push(0.5, 0.1, 0.2, 0.2, 0.0, true); // A = 0: kept
    push(9.0, 0.1, 0.2, 0.2, 1.0, false); // invalid slot
    (s, adv, mask)
}

#[test]
fn dppo_and_pdm_sign_combinations() {
    let (s, adv, mask) = sign_cases();
    let cfg = |dir| DppoConfig::new(TopkDivergence::TopkKl, 0.1, dir);
    // Tokens 0..8: (A, pd, agg) = (+,+,+) (+,+,−) (+,−,+) (+,−,−) (−,+,+) (−,+,−) (−,−,+) (−,−,−);
    // ddot_uniform = −agg.
    let (keep, m) = dppo_mask(&s, &adv, &mask, &cfg(DppoDirection::Ratio)).unwrap();
    assert_eq!(keep, [0., 0., 1., 1., 1., 1., 0., 0., 1., 1., 0.]);
    assert_eq!(m["trmask/dppo_masked_fraction"], 4.0 / 10.0);
    assert_eq!(m["trmask/dppo_masked_fraction_pos_adv"], 2.0 / 5.0);
    assert_eq!(m["trmask/dppo_masked_fraction_neg_adv"], 2.0 / 4.0);
    // Over δ: 8 signed tokens + the A = 0 one; ratio vs aggregated test disagree on 4.
    assert_eq!(m["trmask/dppo_direction_disagreement"], 4.0 / 9.0);
    let (keep, m) = dppo_mask(&s, &adv, &mask, &cfg(DppoDirection::PredictiveAggregated)).unwrap();
    assert_eq!(keep, [0., 1., 0., 1., 1., 0., 1., 0., 1., 1., 0.]);
    assert_eq!(m["trmask/dppo_masked_fraction"], 4.0 / 10.0);
    assert_eq!(m["trmask/dppo_direction_disagreement"], 4.0 / 9.0);
    let (keep, m) = dppo_mask(&s, &adv, &mask, &cfg(DppoDirection::PredictiveUniform)).unwrap();
    assert_eq!(keep, [1., 0., 1., 0., 0., 1., 0., 1., 1., 1., 0.]);
    assert_eq!(m["trmask/dppo_direction_disagreement"], 4.0 / 9.0);
    // topk_tv = kl/2 = 0.25 > 0.1 too: same as KL; with δ = 0.3 TV drops nothing.
    let tv = DppoConfig::new(TopkDivergence::TopkTv, 0.3, DppoDirection::Ratio);
    let (keep, m) = dppo_mask(&s, &adv, &mask, &tv).unwrap();
    assert_eq!(keep, [1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 0.]);
    assert_eq!(m["trmask/dppo_masked_fraction"], 0.0);
    assert_eq!(m["trmask/dppo_direction_disagreement"], 0.0);
    // Statistic metrics: valid KLs 0.5 ×9 and 0.05.
    assert!((m["trmask/topk_kl_mean"] - (0.5 * 9.0 + 0.05) / 10.0).abs() < 1e-15);
    assert_eq!(m["trmask/topk_kl_max"], 0.5);
    assert_eq!(m["trmask/topk_kl_less_01"], 0.1);
    assert_eq!(m["trmask/topk_kl_less_05"], 0.1);
    assert!((m["trmask/topk_tail_mass_mean"] - 0.01).abs() < 1e-15);
    assert_eq!(m["trmask/topk_tail_mass_max"], 0.01);
    assert_eq!(m.len(), 10);
}

#[test]
fn asymmetric_thresholds() {
    let (s, adv, mask) = sign_cases();
    // δ_high = 1 (pd > 0 side never drops), δ_low = 0.1.
    let mut cfg = DppoConfig::new(TopkDivergence::TopkKl, 0.1, DppoDirection::Ratio);
    cfg.delta_high = Some(1.0);
    let (keep, _) = dppo_mask(&s, &adv, &mask, &cfg).unwrap();
    assert_eq!(keep, [1., 1., 1., 1., 1., 1., 0., 0., 1., 1., 0.]);
    // The side is chosen by π_y − μ_y also for the predictive direction.
    cfg.direction = DppoDirection::PredictiveAggregated;
    let (keep, _) = dppo_mask(&s, &adv, &mask, &cfg).unwrap();
    assert_eq!(keep, [1., 1., 0., 1., 1., 1., 1., 0., 1., 1., 0.]);
    // δ_low = 1: only the pd > 0 side can drop.
    let mut cfg = DppoConfig::new(TopkDivergence::TopkKl, 0.1, DppoDirection::Ratio);
    cfg.delta_low = Some(1.0);
    let (keep, _) = dppo_mask(&s, &adv, &mask, &cfg).unwrap();
    assert_eq!(keep, [0., 0., 1., 1., 1., 1., 1., 1., 1., 1., 0.]);
    // D equal to δ is kept (strict >).
    let mut cfg = DppoConfig::new(TopkDivergence::TopkKl, 0.5, DppoDirection::Ratio);
    let (keep, _) = dppo_mask(&s, &adv, &mask, &cfg).unwrap();
    assert!(keep[..10].iter().all(|&k| k == 1.0));
    cfg.delta = -1.0;
    assert!(dppo_mask(&s, &adv, &mask, &cfg).is_err());
    assert!(dppo_mask(
        &s,
        &adv[..3],
        &mask,
        &DppoConfig::new(TopkDivergence::TopkKl, 0.1, DppoDirection::Ratio)
    )
    .is_err());
}

#[test]
fn empty_batch_metrics_are_zero() {
    let s = TopkStats::zeros(2);
    let cfg = DppoConfig::new(TopkDivergence::TopkKl, 0.1, DppoDirection::Ratio);
    let (keep, m) = dppo_mask(&s, &[1.0, 1.0], &[false, false], &cfg).unwrap();
    assert_eq!(keep, [0.0, 0.0]);
    assert!(m.values().all(|&v| v == 0.0));
}

/// End to end on real data: masks from real statistics agree with the hand rule.
#[test]
fn real_small_masks() {
    let real = load();
    let batch = real.batch(20).build().unwrap();
    let s = run(&batch).unwrap();
    let adv: Vec<f64> = (0..real.n)
        .map(|i| if i % 3 == 0 { -1.0 } else { 0.7 })
        .collect();
    for dir in [
        DppoDirection::Ratio,
        DppoDirection::PredictiveAggregated,
        DppoDirection::PredictiveUniform,
    ] {
        let cfg = DppoConfig::new(TopkDivergence::TopkKl, 1e-4, dir);
        let (keep, m) = dppo_mask(&s, &adv, batch.mask(), &cfg).unwrap();
        let q = s.direction(dir);
        let want: Vec<f64> = (0..real.n)
            .map(|t| {
                if s.topk_kl[t] > 1e-4 && adv[t] * q[t] > 0.0 {
                    0.0
                } else {
                    1.0
                }
            })
            .collect();
        assert_eq!(keep, want, "{dir:?}");
        let dropped = want.iter().filter(|&&k| k == 0.0).count();
        assert!(dropped > 0, "{dir:?}: nothing dropped");
        assert_eq!(
            m["trmask/dppo_masked_fraction"],
            dropped as f64 / real.n as f64
        );
    }
}

// ---------------------------------------------------------------------------------------------
// GPU vs the f64 reference (skipped without an adapter unless TRMASK_REQUIRE_GPU=1).

use trmask::gpu::pipeline::{Flavour, Op};

const GPU_RTOL: f64 = 2e-3;
const GPU_ATOL: f64 = 2e-7;
const GPU_DDOT_ATOL: f64 = 2e-7 + 1e-6;

fn compare_gpu(what: &str, g: &TopkStats, c: &TopkStats, seed: u64) {
    assert_eq!(g.support_size, c.support_size, "{what}: support sizes");
    let fields: [(&str, &Vec<f64>, &Vec<f64>, f64); 7] = [
        ("topk_kl", &g.topk_kl, &c.topk_kl, GPU_ATOL),
        ("topk_tv", &g.topk_tv, &c.topk_tv, GPU_ATOL),
        (
            "ddot_aggregated",
            &g.ddot_aggregated,
            &c.ddot_aggregated,
            GPU_DDOT_ATOL,
        ),
        (
            "ddot_uniform",
            &g.ddot_uniform,
            &c.ddot_uniform,
            GPU_DDOT_ATOL,
        ),
        ("rollout_tail", &g.rollout_tail, &c.rollout_tail, GPU_ATOL),
        ("train_tail", &g.train_tail, &c.train_tail, GPU_ATOL),
        ("prob_diff", &g.prob_diff, &c.prob_diff, GPU_ATOL),
    ];
    for (name, a, b, atol) in fields {
        assert_close(&format!("{what} {name}"), a, b, GPU_RTOL, atol, seed);
    }
}

/// Rounds f32 logits to a 16-bit dtype; returns the stored bytes.
fn to_dtype_bytes(vals: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => vals
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => vals
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
    }
}

#[test]
fn gpu_real_small_matches_reference() {
    let Some(engine) = gpu() else { return };
    let real = load();
    let trainer_f32: Vec<f32> = real.trainer.iter().map(|&x| x as f32).collect();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let bytes = to_dtype_bytes(&trainer_f32, dtype);
        for (k, support) in [
            (20, TopkSupport::Union),
            (3, TopkSupport::Union),
            (3, TopkSupport::ReplaceKth),
        ] {
            let batch = real
                .batch(k)
                .with_logits(
                    "old_logits",
                    Logits::from_bytes(bytes.clone(), dtype, real.n, real.v).unwrap(),
                )
                .unwrap()
                .build()
                .unwrap();
            let tr = TrainerTopk::from_batch(&batch, 1.0).unwrap();
            let c = topk_divergence(&batch, support, tr).unwrap();
            let g = engine.topk_divergence(&batch, support, tr).unwrap();
            compare_gpu(
                &format!("real-small {dtype:?} K={k} {support:?}"),
                &g,
                &c,
                0,
            );
        }
    }
}

/// A random padded batch: V, K, temperature, −inf trainer logits, logits up to ±`scale`,
/// empty and all-masked rows, garbage (NaN, bad ids) in the padding.
fn random_batch(rng: &mut Rng, b: usize, t: usize, v: usize, k: usize, scale: f64) -> BatchBuilder {
    let slots = b * t;
    let mut mask = vec![0.0; slots];
    for r in 0..b {
        let len = if r % 4 == 0 { 0 } else { rng.below(t + 1) };
        mask[r * t..r * t + len].iter_mut().for_each(|m| *m = 1.0);
    }
    let mut train = vec![f32::NAN; slots * v];
    let mut ids = vec![-3i64; slots * k];
    let mut lps = vec![f64::NAN; slots * k];
    let mut y = vec![i64::MAX; slots];
    let mut roll_y = vec![f64::NAN; slots];
    for s in (0..slots).filter(|&s| mask[s] == 1.0) {
        // Trainer logits; the rollout's are a perturbation of them.
        let sharp = rng.range(0.05, 1.0) * scale;
        let b_row: Vec<f64> = (0..v).map(|_| rng.range(-1.0, 1.0) * sharp).collect();
        let noise = 10f64.powf(rng.range(-4.0, -0.5));
        let a: Vec<f64> = b_row
            .iter()
            .map(|&x| x + rng.range(-1.0, 1.0) * noise * (1.0 + x.abs() * 0.01))
            .collect();
        for (i, &x) in b_row.iter().enumerate() {
            train[s * v + i] = if v > 2 && rng.bool(0.03) {
                f32::NEG_INFINITY
            } else {
                x as f32
            };
        }
        let m = a.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + a.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&i, &j| a[j].partial_cmp(&a[i]).unwrap().then(i.cmp(&j)));
        for (j, &i) in order[..k].iter().enumerate() {
            ids[s * k + j] = i as i64;
            lps[s * k + j] = a[i] - lse;
        }
        let yy = if rng.bool(0.5) {
            order[rng.below(k)]
        } else {
            rng.below(v)
        };
        y[s] = yy as i64;
        roll_y[s] = a[yy] - lse;
    }
    Batch::padded(b, t, &mask)
        .unwrap()
        .with_responses(y)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll_y)
        .unwrap()
        .with_topk(ids, lps, k)
        .unwrap()
        .with_logits("old_logits", Logits::from_f32(&train, slots, v).unwrap())
        .unwrap()
}

#[test]
fn gpu_random_inputs_match_reference() {
    let Some(engine) = gpu() else { return };
    let small = gpu_small_chunks();
    // host rows of odd byte length through wgpu's staging copies instead of mapped slots
    let staged = trmask::gpu::GpuEngine::with_options(&trmask::gpu::ContextOptions {
        max_binding_size: Some(1024),
        workgroup_size: Some(64),
        mapped_uploads: Some(false),
        ..Default::default()
    })
    .ok();
    // the other reduction flavour than the default's (subgroups where the adapter has them)
    let tree = gpu_with_flavour(Flavour::Workgroup, Some(192));
    let caps = engine.capabilities();
    if caps.subgroups && caps.subgroup_sizes.0 == caps.subgroup_sizes.1 {
        assert_eq!(
            engine.context().flavour(Op::TopkDivergence),
            Flavour::Subgroup
        );
    }
    let s0 = seed(0x70_9c);
    let mut rng = Rng::new(s0);
    for (case, &(v, k, scale)) in [
        (1usize, 1usize, 5.0f64),
        (2, 1, 5.0),
        (7, 3, 10.0),
        (257, 8, 30.0),
        (4099, 20, 60.0),
        (32000, 5, 100.0),
    ]
    .iter()
    .enumerate()
    {
        let builder = random_batch(&mut rng, 5, 4, v, k, scale);
        let batch = builder.clone().build().unwrap();
        for (support, temperature) in [(TopkSupport::Union, 1.0), (TopkSupport::ReplaceKth, 0.7)] {
            // Rounding the trainer logits to 16 bits first: the reference sees the same values.
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let old = batch.old_logits().unwrap();
                let vals: Vec<f32> = (0..old.rows() * v)
                    .map(|i| DType::F32.decode(old.bytes(), i))
                    .collect();
                let b = builder
                    .clone()
                    .with_logits(
                        "old_logits",
                        Logits::from_bytes(to_dtype_bytes(&vals, dtype), dtype, old.rows(), v)
                            .unwrap(),
                    )
                    .unwrap()
                    .build()
                    .unwrap();
                let tr = TrainerTopk::from_batch(&b, temperature).unwrap();
                let c = topk_divergence(&b, support, tr).unwrap();
                let what = format!("case {case} V={v} K={k} {support:?} {dtype:?} τ={temperature}");
                let g = engine.topk_divergence(&b, support, tr).unwrap();
                compare_gpu(&what, &g, &c, s0);
                if let Some(e) = tree.as_ref() {
                    let h = e.topk_divergence(&b, support, tr).unwrap();
                    compare_gpu(&format!("{what} (workgroup tree)"), &h, &c, s0);
                }
                if let Some(e) = small.as_ref().filter(|_| v * dtype.size() <= 1024) {
                    let g = e.topk_divergence(&b, support, tr).unwrap();
                    compare_gpu(&format!("{what} (small chunks)"), &g, &c, s0);
                }
                if let Some(e) = staged.as_ref().filter(|_| v * dtype.size() <= 1024) {
                    let g = e.topk_divergence(&b, support, tr).unwrap();
                    compare_gpu(
                        &format!("{what} (small chunks, staged uploads)"),
                        &g,
                        &c,
                        s0,
                    );
                }
            }
        }
    }
}

#[test]
fn gpu_errors_and_infinities() {
    let Some(engine) = gpu() else { return };
    let (ids, lps) = good_ids();
    // NaN trainer logit at valid slot [1, 0]; NaN in padding rows is ignored.
    let mut logits: Vec<f32> = vec![0.5; 36];
    logits[3 * 6 + 4] = f32::NAN;
    logits[5 * 6] = f32::NAN;
    let b = small_batch(ids.clone(), lps.clone())
        .with_logits("old_logits", Logits::from_f32(&logits, 6, 6).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let tr = TrainerTopk::from_batch(&b, 1.0).unwrap();
    match engine.topk_divergence(&b, TopkSupport::Union, tr) {
        Err(Error::InvalidInput { tensor, problem }) => {
            assert_eq!(tensor, "old_logits");
            assert!(problem.contains("[1, 0]"), "{problem}");
        }
        other => panic!("{other:?}"),
    }
    // π = 0 on S (−inf trainer logit at id 1 of row [0, 0]) gives KL = +inf on both paths.
    let mut logits: Vec<f32> = (0..36).map(|i| (i % 5) as f32 * 0.4).collect();
    logits[1] = f32::NEG_INFINITY;
    logits[5 * 6 + 2] = f32::NAN;
    let b = small_batch(ids, lps)
        .with_logits("old_logits", Logits::from_f32(&logits, 6, 6).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let tr = TrainerTopk::from_batch(&b, 1.0).unwrap();
    let c = topk_divergence(&b, TopkSupport::Union, tr).unwrap();
    let g = engine.topk_divergence(&b, TopkSupport::Union, tr).unwrap();
    assert_eq!(c.topk_kl[0], f64::INFINITY);
    compare_gpu("infinite KL", &g, &c, 0);
    // Bad top-K input errors come from the shared validation.
    let (mut ids, lps) = good_ids();
    ids[5] = 6;
    let b = small_batch(ids, lps).build().unwrap();
    let tr = TrainerTopk::from_batch(&b, 1.0).unwrap();
    assert!(engine.topk_divergence(&b, TopkSupport::Union, tr).is_err());
}

/// docs/FORMAT.md (Input tensors): logits without log-probs give the sampled-token log-probs, also where y_t is
/// outside the rollout top-K (the support then needs log π_roll(y_t)).
#[test]
fn logits_without_log_probs_give_the_support_its_sampled_log_prob() {
    let real = load();
    let k = 2;
    let (ids, _) = real.topk(k);
    let outside = (0..real.n)
        .filter(|&r| !ids[r * k..(r + 1) * k].contains(&real.y[r]))
        .count();
    assert!(
        outside > 0,
        "the test needs sampled tokens outside the top-K"
    );
    let bf16: Vec<u8> = real
        .rollout
        .iter()
        .flat_map(|&x| half::bf16::from_f64(x).to_le_bytes())
        .collect();
    let rollout = Logits::from_bytes(bf16, DType::BF16, real.n, real.v).unwrap();
    let given = real.batch(k).with_logits("rollout_logits", rollout.clone());
    let given = given.unwrap().build().unwrap();
    let derived = real
        .batch_without_log_probs(k)
        .with_logits("rollout_logits", rollout);
    let derived = derived.unwrap().build().unwrap();
    let cpu = trmask::cpu::CpuEngine::new();
    let cfg = trmask::CorrectionConfig::default();
    let a = trmask::analysis::analyze(&cpu, &given, &cfg).unwrap();
    let b = trmask::analysis::analyze(&cpu, &derived, &cfg).unwrap();
    let get = |an: &trmask::analysis::Analysis, n: &str| {
        an.outputs
            .iter()
            .find(|o| o.name == n)
            .unwrap_or_else(|| panic!("no output {n}"))
            .data
            .clone()
    };
    for name in [
        "topk_kl",
        "topk_tv",
        "ddot_aggregated",
        "ddot_uniform",
        "log_ratio",
        "k3",
    ] {
        assert_close(name, &get(&b, name), &get(&a, name), 1e-9, 1e-15, 0);
    }
}
