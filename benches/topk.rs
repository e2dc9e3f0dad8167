//! Top-K divergence (docs/FORMAT.md, DPPO): the fused kernel (one streaming pass over each trainer-logits row:
//! log-sum-exp plus a gather on the support S) against the two-step approach (materialise the
//! full `[N, V]` log-softmax, then gather — what Python stacks do), in one criterion group.
//! Throughput is bytes of trainer logits read. `TRMASK_BENCH_FULL=1`: 2048 rows.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use trmask::topk::{TopkSupport, TrainerTopk};
use trmask::{Batch, DType, Logits};

mod common;
use common::{engines, full, Rng};

const K: usize = 20;

fn batch(rows: usize, vocab: usize) -> Batch {
    let mut rng = Rng(5);
    let mut logits = Vec::with_capacity(rows * vocab * 2);
    for _ in 0..rows * vocab {
        logits.extend_from_slice(
            &half::bf16::from_f32((12.0 * rng.next_f64() - 6.0) as f32).to_le_bytes(),
        );
    }
    let old = Logits::from_bytes(logits, DType::BF16, rows, vocab).unwrap();
    let mut ids = Vec::with_capacity(rows * K);
    let mut lps = Vec::with_capacity(rows * K);
    let mut responses = Vec::with_capacity(rows);
    let mut roll = Vec::with_capacity(rows);
    for _ in 0..rows {
        let start = (rng.next_f64() * (vocab - K) as f64) as i64;
        // a valid rollout distribution on K distinct ids holding 90 % of the mass
        let w: Vec<f64> = (0..K).map(|k| (-(k as f64) * 0.3).exp()).collect();
        let z: f64 = w.iter().sum();
        for (k, wk) in w.iter().enumerate() {
            ids.push(start + k as i64);
            lps.push((0.9 * wk / z).ln());
        }
        responses.push(start);
        roll.push((0.9 * w[0] / z).ln());
    }
    Batch::packed(&[0, rows as i64])
        .unwrap()
        .with_responses(responses)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll)
        .unwrap()
        .with_logits("old_logits", old)
        .unwrap()
        .with_topk(ids, lps, K)
        .unwrap()
        .build()
        .unwrap()
}

/// The two-step baseline: full log-softmax of every row into an `[N, V]` f32 tensor, then a
/// gather of the support and the reduced KL in f64.
fn two_step(b: &Batch) -> Vec<f64> {
    let logits = b.old_logits().unwrap();
    let (rows, v) = (logits.rows(), logits.vocab());
    let mut logsm = vec![0f32; rows * v];
    for r in 0..rows {
        let row = logits.row_bytes(r);
        let x: Vec<f32> = (0..v).map(|i| DType::BF16.decode(row, i)).collect();
        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + x.iter().map(|&e| (e - m).exp()).sum::<f32>().ln();
        for (o, &e) in logsm[r * v..(r + 1) * v].iter_mut().zip(&x) {
            *o = e - lse;
        }
    }
    let ids = b.rollout_topk_ids().unwrap();
    let lps = b.rollout_topk_log_prob().unwrap();
    (0..rows)
        .map(|r| {
            let (mut kl, mut mu_s, mut pi_s) = (0.0, 0.0, 0.0);
            for k in 0..K {
                let (mu, lpi) = (
                    lps[r * K + k],
                    logsm[r * v + ids[r * K + k] as usize] as f64,
                );
                kl += mu.exp() * (mu - lpi);
                mu_s += mu.exp();
                pi_s += lpi.exp();
            }
            let (mt, pt) = ((1.0f64 - mu_s).max(1e-12), (1.0f64 - pi_s).max(1e-12));
            kl + mt * (mt / pt).ln()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rows = if full() { 2048 } else { 256 };
    let vocab = 151_936;
    let b = batch(rows, vocab);
    let engines = engines();
    // The baseline computes the same quantity (up to its f32 log-softmax).
    let fused = engines
        .last()
        .unwrap()
        .1
        .topk_divergence(
            &b,
            TopkSupport::Union,
            TrainerTopk::from_batch(&b, 1.0).unwrap(),
        )
        .unwrap();
    let worst = two_step(&b)
        .iter()
        .zip(&fused.topk_kl)
        .map(|(a, f)| (a - f).abs() / (f.abs() + 1e-9))
        .fold(0.0, f64::max);
    eprintln!("bench: two-step vs fused topk_kl, worst relative difference {worst:.2e}");
    let mut g = c.benchmark_group(format!("topk_divergence_{rows}x{vocab}_BF16_K{K}"));
    g.sample_size(10);
    g.throughput(Throughput::Bytes((rows * vocab * 2) as u64));
    for (name, e) in &engines {
        let run = || {
            e.topk_divergence(
                &b,
                TopkSupport::Union,
                TrainerTopk::from_batch(&b, 1.0).unwrap(),
            )
            .unwrap()
        };
        run();
        g.bench_function(BenchmarkId::new("fused", name), |bench| {
            bench.iter(|| black_box(run()))
        });
    }
    g.bench_function(
        BenchmarkId::new("two_step_log_softmax_gather", "cpu"),
        |bench| bench.iter(|| black_box(two_step(&b))),
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
