//! One `GpuEngine` shared by eight threads: every op (token_stats, segment_reduce,
//! corrections_pass, vocab_divergence, topk_divergence) runs concurrently on the same device,
//! with other threads polling it, and gives bit-identical results to a single thread.

use crate::common;

use common::{gpu, Rng};
use std::sync::Arc;
use trmask::config::IsLevel;
use trmask::plan::{CorrectionsRaw, MaskAgg, MaskCriterion, MaskIs, MaskPlan, MaskSource};
use trmask::topk::{TopkStats, TopkSupport, TrainerTopk};
use trmask::{Batch, Engine, GpuEngine, Logits, SegmentStats, Segments, TokenStats, VocabStats};

struct Inputs {
    roll: Vec<f64>,
    train: Vec<f64>,
    seg: Segments,
    batch: Batch,
    rollout_logits: Logits,
    old_logits: Logits,
    responses: Vec<i64>,
}

const B: usize = 6;
const T: usize = 40;
const V: usize = 300;
const K: usize = 4;

fn inputs() -> Inputs {
    let mut rng = Rng::new(20260822);
    let n = B * T;
    let mask: Vec<f64> = (0..n)
        .map(|i| if i % T < T - (i / T) * 3 { 1.0 } else { 0.0 })
        .collect();
    let roll: Vec<f64> = (0..n).map(|_| rng.range(-4.0, -2.0)).collect();
    let train: Vec<f64> = roll.iter().map(|r| r + rng.range(-0.3, 0.3)).collect();
    let a: Vec<f32> = (0..n * V).map(|_| rng.range(-5.0, 5.0) as f32).collect();
    let b: Vec<f32> = a.iter().map(|x| x + rng.range(-0.5, 0.5) as f32).collect();
    let responses: Vec<i64> = (0..n).map(|_| rng.below(V) as i64).collect();
    let mut ids = Vec::with_capacity(n * K);
    let mut lps = Vec::with_capacity(n * K);
    for _ in 0..n {
        for k in 0..K {
            ids.push((k * 7 + rng.below(7)) as i64);
            lps.push(-2.5 - k as f64);
        }
    }
    let old_logits = Logits::from_f32(&b, n, V).unwrap();
    let batch = Batch::padded(B, T, &mask)
        .unwrap()
        .with_responses(responses.clone())
        .unwrap()
        .with_log_probs("rollout_log_prob", roll.clone())
        .unwrap()
        .with_topk(ids, lps, K)
        .unwrap()
        .with_logits("old_logits", old_logits.clone())
        .unwrap()
        .build()
        .unwrap();
    let seg = batch.segments().clone();
    Inputs {
        roll,
        train,
        seg,
        rollout_logits: Logits::from_f32(&a, n, V).unwrap(),
        old_logits,
        responses,
        batch,
    }
}

type Out = (
    TokenStats,
    Vec<SegmentStats>,
    CorrectionsRaw,
    VocabStats,
    TopkStats,
);

fn all_ops(e: &GpuEngine, x: &Inputs) -> Out {
    let m = x.seg.mask();
    let ts = e.token_stats(&x.roll, &x.train, m).unwrap();
    let sr = e.segment_reduce(&[&ts.k3, &ts.k1], &x.seg).unwrap();
    let lr: Vec<f64> = ts.log_ratio.clone();
    let plan = MaskPlan {
        criteria: vec![
            MaskCriterion {
                source: MaskSource::K3,
                agg: MaskAgg::Mean,
                lower: None,
                upper: 0.01,
            },
            MaskCriterion {
                source: MaskSource::K2,
                agg: MaskAgg::Token,
                lower: None,
                upper: 0.02,
            },
        ],
        is: Some(MaskIs {
            level: IsLevel::Sequence,
            upper: 2.0,
            lower: None,
            batch_normalize: false,
        }),
        columns: vec![],
    };
    let cp = e.corrections_pass(&lr, &x.seg, &plan).unwrap();
    let vd = e
        .vocab_divergence(&x.rollout_logits, &x.old_logits, Some(&x.responses), m, 1.0)
        .unwrap();
    let tk = Engine::topk_divergence(
        e,
        &x.batch,
        TopkSupport::Union,
        TrainerTopk::from_batch(&x.batch, 1.0).unwrap(),
    )
    .unwrap();
    (ts, sr, cp, vd, tk)
}

/// Bit-level equality through the Debug text (f64 Debug round-trips exactly).
fn same(a: &Out, b: &Out) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// Many short submissions per thread: the map callback of one thread's read-back is often run
/// by another thread's poll, after this thread's own poll has returned.
fn small_ops(e: &GpuEngine, x: &Inputs) -> (TokenStats, Vec<SegmentStats>) {
    let n = 64;
    let m = &x.seg.mask()[..n];
    let ts = e.token_stats(&x.roll[..n], &x.train[..n], m).unwrap();
    let seg = Segments::new(vec![(0, 40), (40, n)], m.to_vec()).unwrap();
    (ts.clone(), e.segment_reduce(&[&ts.k3], &seg).unwrap())
}

#[test]
fn eight_threads_share_one_engine_bit_identically() {
    let Some(gpu) = gpu() else { return };
    let x = Arc::new(inputs());
    let want = all_ops(&gpu, &x);
    let want_small = format!("{:?}", small_ops(&gpu, &x));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (gpu, x) = (gpu.clone(), x.clone());
            std::thread::spawn(move || -> (Vec<Out>, Vec<String>) {
                let mut outs = Vec::new();
                let mut small = Vec::new();
                for _ in 0..3 + t % 2 {
                    outs.push(all_ops(&gpu, &x));
                    for _ in 0..150 {
                        small.push(format!("{:?}", small_ops(&gpu, &x)));
                    }
                }
                (outs, small)
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        let (outs, small) = h.join().unwrap_or_else(|_| panic!("thread {t} panicked"));
        for (i, o) in outs.iter().enumerate() {
            assert!(
                same(o, &want),
                "thread {t}, run {i}: results differ from one thread"
            );
        }
        for (i, o) in small.iter().enumerate() {
            assert_eq!(o, &want_small, "thread {t}, small run {i}");
        }
    }
}
