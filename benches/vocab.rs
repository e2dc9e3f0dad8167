//! Exact vocabulary divergence from full logits: bytes of logits read per second (both
//! tensors), GPU and CPU in one group, beside this machine's memory-copy bandwidth measured in
//! the same run. Default shapes suit a 2-core box; `TRMASK_BENCH_FULL=1` runs 2048 × 151936.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use trmask::backend::{open_engine, Backend};
use trmask::{DType, Logits};

mod common;
use common::{engines, full, Rng};

fn logits(rows: usize, vocab: usize, dtype: DType) -> (Logits, Logits) {
    let mut rng = Rng(11);
    let n = rows * vocab;
    let mut a = Vec::with_capacity(n * dtype.size());
    let mut b = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let x = (6.0 * rng.next_f64() - 3.0) as f32;
        let y = x + (0.02 * (rng.next_f64() - 0.5)) as f32;
        match dtype {
            DType::F32 => {
                a.extend_from_slice(&x.to_le_bytes());
                b.extend_from_slice(&y.to_le_bytes());
            }
            DType::F16 => {
                a.extend_from_slice(&half::f16::from_f32(x).to_le_bytes());
                b.extend_from_slice(&half::f16::from_f32(y).to_le_bytes());
            }
            DType::BF16 => {
                a.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes());
                b.extend_from_slice(&half::bf16::from_f32(y).to_le_bytes());
            }
        }
    }
    (
        Logits::from_bytes(a, dtype, rows, vocab).unwrap(),
        Logits::from_bytes(b, dtype, rows, vocab).unwrap(),
    )
}

fn bench(c: &mut Criterion) {
    let mut engines = engines();
    // the `cpu-fast` precision changes only this op: its row here, not in the other benches
    let mut notes = Vec::new();
    engines.push((
        "cpu-fast",
        open_engine(Backend::CpuFast, &mut notes).expect("cpu-fast"),
    ));
    let rows = if full() { 2048 } else { 64 };
    let vocab = 151_936;

    // Memory-copy bandwidth of this machine: bytes read per second by a large memcpy.
    {
        let src = vec![1u8; 256 << 20];
        let mut dst = vec![0u8; 256 << 20];
        let mut g = c.benchmark_group("memcpy");
        g.sample_size(10);
        g.throughput(Throughput::Bytes(src.len() as u64));
        g.bench_function("256MiB", |bench| {
            bench.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(&dst);
            })
        });
        g.finish();
    }

    for dtype in [DType::BF16, DType::F32] {
        let (a, b) = logits(rows, vocab, dtype);
        let mask = vec![true; rows];
        let mut g = c.benchmark_group(format!("vocab_divergence_{rows}x{vocab}_{}", dtype.name()));
        g.sample_size(10);
        g.throughput(Throughput::Bytes(
            (a.bytes().len() + b.bytes().len()) as u64,
        ));
        for (name, e) in &engines {
            e.vocab_divergence(&a, &b, None, &mask, 1.0).unwrap();
            g.bench_function(BenchmarkId::from_parameter(name), |bench| {
                bench.iter(|| black_box(e.vocab_divergence(&a, &b, None, &mask, 1.0).unwrap()))
            });
        }
        g.finish();
    }

    // Latency: small vocabulary, and a tiny batch of 8 rows.
    for (label, rows, vocab) in [
        ("small_v_256x32000", 256, 32_000),
        ("tiny_batch_8x151936", 8, 151_936),
    ] {
        let (a, b) = logits(rows, vocab, DType::BF16);
        let mask = vec![true; rows];
        let mut g = c.benchmark_group(format!("vocab_latency_{label}_BF16"));
        g.sample_size(10);
        g.throughput(Throughput::Bytes(
            (a.bytes().len() + b.bytes().len()) as u64,
        ));
        for (name, e) in &engines {
            e.vocab_divergence(&a, &b, None, &mask, 1.0).unwrap();
            g.bench_function(BenchmarkId::from_parameter(name), |bench| {
                bench.iter(|| black_box(e.vocab_divergence(&a, &b, None, &mask, 1.0).unwrap()))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
