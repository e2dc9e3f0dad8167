//! Per-token estimators and segmented reductions on 1M tokens, GPU and CPU in one group.
//! Throughput is bytes of log-probs read (two f64 inputs per token on the host side).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use trmask::Batch;

mod common;
use common::{engines, Rng};

fn batch(n_tokens: usize, seq: usize) -> Batch {
    let mut rng = Rng(7);
    let cu: Vec<i64> = (0..=n_tokens / seq).map(|s| (s * seq) as i64).collect();
    let roll: Vec<f64> = (0..n_tokens).map(|_| -2.0 * rng.next_f64()).collect();
    let old: Vec<f64> = roll.iter().map(|r| r + 0.05 * rng.normal()).collect();
    Batch::packed(&cu)
        .unwrap()
        .with_log_probs("rollout_log_prob", roll)
        .unwrap()
        .with_log_probs("old_log_prob", old)
        .unwrap()
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let n = 1 << 20;
    let b = batch(n, 1024);
    let engines = engines();
    let (r, o) = (b.rollout_log_prob().unwrap(), b.old_log_prob().unwrap());
    let mut g = c.benchmark_group("token_stats_1M");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((2 * n * 8) as u64));
    for (name, e) in &engines {
        e.token_stats(r, o, b.mask()).unwrap(); // warm-up: pipelines and buffers
        g.bench_function(BenchmarkId::from_parameter(name), |bench| {
            bench.iter(|| black_box(e.token_stats(r, o, b.mask()).unwrap()))
        });
    }
    g.finish();
    let k3 = engines
        .last()
        .unwrap()
        .1
        .token_stats(r, o, b.mask())
        .unwrap()
        .k3;
    let mut g = c.benchmark_group("segment_reduce_1M");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((n * 8) as u64));
    for (name, e) in &engines {
        e.segment_reduce(&[&k3], b.segments()).unwrap();
        g.bench_function(BenchmarkId::from_parameter(name), |bench| {
            bench.iter(|| black_box(e.segment_reduce(&[&k3], b.segments()).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
