//! The GPU engine against the f64 CPU reference, through one test body per op run on both
//! engines. Skips (with a message) when there is no adapter unless `TRMASK_REQUIRE_GPU=1`.
//! `TRMASK_SEED=…` replays a failure.

use crate::common;

use common::{assert_close, gpu, gpu_small_chunks, gpu_with_flavour, seed, Rng};
use trmask::cpu::CpuEngine;
use trmask::gpu::pipeline::{Flavour, Op};
use trmask::{Batch, Engine, Segments, TokenStats};

const RTOL: f64 = 2e-5;
const ATOL: f64 = 2e-6;

/// A padded batch with random row lengths (0 and 1 included), some all-masked rows, left-aligned
/// masks, log-probs around −10..0 with |lr| spanning 1e-6..30, and NaN/garbage in the padding.
struct Case {
    batch: Batch,
    roll: Vec<f64>,
    train: Vec<f64>,
}

fn random_lr(rng: &mut Rng) -> f64 {
    let mag = 10f64.powf(rng.range(-6.0, 1.3)); // up to ~20
    let mag = if rng.bool(0.02) { 30.0 } else { mag };
    if rng.bool(0.5) {
        mag
    } else {
        -mag
    }
}

fn padded_case(rng: &mut Rng, b: usize, t: usize) -> Case {
    let mut mask = vec![0.0; b * t];
    let mut roll = vec![f64::NAN; b * t];
    let mut train = vec![1e300; b * t];
    for r in 0..b {
        let len = match r % 5 {
            0 => 0,
            1 => 1.min(t),
            _ => rng.below(t + 1),
        };
        for c in 0..t {
            let i = r * t + c;
            if c < len {
                mask[i] = 1.0;
                roll[i] = rng.range(-10.0, 0.0);
                train[i] = roll[i] + random_lr(rng);
            } else if rng.bool(0.5) {
                roll[i] = rng.range(-1e30, 1e30);
            }
        }
    }
    Case {
        batch: Batch::padded(b, t, &mask).unwrap().build().unwrap(),
        roll,
        train,
    }
}

fn fields(s: &TokenStats) -> [(&'static str, &Vec<f64>); 7] {
    [
        ("log_ratio", &s.log_ratio),
        ("rho", &s.rho),
        ("k1", &s.k1),
        ("k2", &s.k2),
        ("k3", &s.k3),
        ("abs", &s.abs),
        ("ser", &s.ser),
    ]
}

fn check_token_stats(engine: &dyn Engine, case: &Case, seed: u64) -> TokenStats {
    let mask = case.batch.mask();
    let want = CpuEngine::new()
        .token_stats(&case.roll, &case.train, mask)
        .unwrap();
    let got = engine.token_stats(&case.roll, &case.train, mask).unwrap();
    for ((name, g), (_, w)) in fields(&got).into_iter().zip(fields(&want)) {
        assert_close(name, g, w, RTOL, ATOL, seed);
        for (i, &m) in mask.iter().enumerate() {
            if !m {
                assert_eq!(g[i], 0.0, "{name}[{i}] masked slot not zero (seed {seed})");
            }
        }
    }
    got
}

fn check_segments(engine: &dyn Engine, values: &[&[f64]], seg: &Segments, seed: u64) {
    let want = CpuEngine::new().segment_reduce(values, seg).unwrap();
    let got = engine.segment_reduce(values, seg).unwrap();
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.count, w.count, "stat {k} count (seed {seed})");
        assert_close(&format!("stat {k} sum"), &g.sum, &w.sum, RTOL, ATOL, seed);
        assert_close(
            &format!("stat {k} mean"),
            &g.mean,
            &w.mean,
            RTOL,
            ATOL,
            seed,
        );
        assert_close(&format!("stat {k} max"), &g.max, &w.max, RTOL, ATOL, seed);
        assert_close(&format!("stat {k} min"), &g.min, &w.min, RTOL, ATOL, seed);
        for (q, (&ga, &wa)) in g.argmax.iter().zip(&w.argmax).enumerate() {
            if ga != wa {
                // only a near-tie (within f32 rounding) may resolve differently
                let (a, _) = seg.ranges()[q];
                assert!(
                    ga >= 0,
                    "stat {k} seq {q}: argmax {ga} vs {wa} (seed {seed})"
                );
                let v = values[k][a + ga as usize];
                assert!(
                    seg.mask()[a + ga as usize]
                        && (v - w.max[q]).abs() <= RTOL * w.max[q].abs() + ATOL,
                    "stat {k} seq {q}: argmax {ga} vs {wa} (seed {seed})"
                );
            }
        }
    }
}

#[test]
fn token_stats_padded_nasty() {
    let Some(gpu) = gpu() else { return };
    let s = seed(11);
    let mut rng = Rng::new(s);
    for &(b, t) in &[(1, 1), (3, 1), (7, 5), (33, 257), (64, 1000)] {
        let case = padded_case(&mut rng, b, t);
        check_token_stats(gpu.as_ref(), &case, s);
    }
    // empty batch
    let e = gpu.token_stats(&[], &[], &[]).unwrap();
    assert!(e.k3.is_empty());
}

#[test]
fn k3_and_ser_accurate_on_a_log_grid() {
    let Some(gpu) = gpu() else { return };
    let mut lrs = Vec::new();
    let steps = 400;
    let (lo, hi) = (1e-6f64.ln(), 20f64.ln());
    for i in 0..=steps {
        let x = (lo + (hi - lo) * i as f64 / steps as f64).exp() as f32 as f64; // f32 inputs
        lrs.push(x);
        lrs.push(-x);
    }
    let roll = vec![0.0; lrs.len()];
    let mask = vec![true; lrs.len()];
    let got = gpu.token_stats(&roll, &lrs, &mask).unwrap();
    for (i, &x) in lrs.iter().enumerate() {
        let k3 = x.exp_m1() - x;
        let rel = (got.k3[i] - k3).abs() / k3;
        assert!(
            rel <= 1e-3,
            "k3 at lr={x:e}: gpu {} vs {k3} (rel {rel:e})",
            got.k3[i]
        );
        let ser = x.exp_m1().abs();
        let rel = (got.ser[i] - ser).abs() / ser;
        assert!(
            rel <= 1e-4,
            "ser at lr={x:e}: gpu {} vs {ser} (rel {rel:e})",
            got.ser[i]
        );
        assert!(got.k3[i] >= 0.0);
    }
}

#[test]
fn extreme_log_ratios_clamp() {
    let Some(gpu) = gpu() else { return };
    let roll = [0.0, 0.0, -5.0, 0.0, f64::NAN];
    let train = [30.0, -30.0, 15.0, 20.0, 1.0];
    let mask = [true, true, true, true, false];
    let want = CpuEngine::new().token_stats(&roll, &train, &mask).unwrap();
    let got = gpu.token_stats(&roll, &train, &mask).unwrap();
    for ((name, g), (_, w)) in fields(&got).into_iter().zip(fields(&want)) {
        assert_close(name, g, w, RTOL, ATOL, 0);
    }
}

#[test]
fn segment_reduce_padded_nasty() {
    let Some(gpu) = gpu() else { return };
    let s = seed(22);
    let mut rng = Rng::new(s);
    for &(b, t) in &[(1, 1), (5, 3), (40, 300), (9, 1025)] {
        let case = padded_case(&mut rng, b, t);
        let st = CpuEngine::new()
            .token_stats(&case.roll, &case.train, case.batch.mask())
            .unwrap();
        // garbage in padding must not matter
        let mut k1 = st.k1.clone();
        for (i, &m) in case.batch.mask().iter().enumerate() {
            if !m {
                k1[i] = if i % 2 == 0 { f64::NAN } else { 1e30 };
            }
        }
        let values: Vec<&[f64]> = vec![&k1, &st.k2, &st.k3, &st.abs, &st.rho, &st.ser];
        check_segments(gpu.as_ref(), &values, case.batch.segments(), s);
    }
    // ties resolve to the first maximum; empty and all-masked sequences
    let seg = Segments::new(
        vec![(0, 4), (4, 4), (4, 7), (7, 9)],
        vec![true, true, true, true, false, false, true, true, true],
    )
    .unwrap();
    let v = [1.0, 5.0, 5.0, -1.0, 9.0, 9.0, 2.0, -3.0, -3.0];
    check_segments(gpu.as_ref(), &[&v], &seg, 0);
    let r = gpu.segment_reduce(&[&v], &seg).unwrap();
    assert_eq!(r[0].argmax, vec![1, -1, 2, 0]);
    assert_eq!(r[0].count, vec![4, 0, 1, 2]);
    assert_eq!((r[0].max[1], r[0].min[1], r[0].mean[1]), (0.0, 0.0, 0.0));
}

/// An infinite per-token value (the reverse KL where the rollout gives a token no mass the
/// trainer gives some) makes the sequence's sum and mean that infinity on both engines, never
/// NaN (the compensated sum's error term is ∞ − ∞); with both infinities, NaN on both.
#[test]
fn segment_reduce_infinite_values_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let seg = Segments::new(vec![(0, 4), (4, 8), (8, 12)], vec![true; 12]).unwrap();
    let inf = f64::INFINITY;
    let v = [
        1e-3, inf, 2e-3, 4e-3, 0.5, 0.25, 0.125, inf, inf, 1.0, -inf, 2.0,
    ];
    let cpu = CpuEngine::new().segment_reduce(&[&v], &seg).unwrap();
    let got = gpu.segment_reduce(&[&v], &seg).unwrap();
    assert_eq!((cpu[0].sum[0], cpu[0].mean[0]), (inf, inf));
    assert_eq!((got[0].sum[0], got[0].mean[0]), (inf, inf));
    assert_eq!((got[0].sum[1], got[0].mean[1]), (inf, inf));
    assert!(cpu[0].sum[2].is_nan() && got[0].sum[2].is_nan());
    assert_eq!(got[0].max, cpu[0].max);
}

/// The same sequences as a padded and as a packed batch give identical GPU results.
#[test]
fn padded_and_packed_agree() {
    let Some(gpu) = gpu() else { return };
    let s = seed(33);
    let mut rng = Rng::new(s);
    let (b, t) = (24, 130);
    let case = padded_case(&mut rng, b, t);
    let lens = case.batch.segments().lengths();
    let mut cu = vec![0i64];
    let (mut roll, mut train) = (Vec::new(), Vec::new());
    for (r, &len) in lens.iter().enumerate() {
        roll.extend_from_slice(&case.roll[r * t..r * t + len]);
        train.extend_from_slice(&case.train[r * t..r * t + len]);
        cu.push(cu.last().unwrap() + len as i64);
    }
    let packed = Batch::packed(&cu).unwrap().build().unwrap();
    let pad = gpu
        .token_stats(&case.roll, &case.train, case.batch.mask())
        .unwrap();
    let pk = gpu.token_stats(&roll, &train, packed.mask()).unwrap();
    let mut pad_k3 = Vec::new();
    for (r, &len) in lens.iter().enumerate() {
        pad_k3.extend_from_slice(&pad.k3[r * t..r * t + len]);
    }
    assert_eq!(pad_k3, pk.k3, "seed {s}");
    let a = gpu
        .segment_reduce(&[&pad.k3, &pad.k1], case.batch.segments())
        .unwrap();
    let p = gpu
        .segment_reduce(&[&pk.k3, &pk.k1], packed.segments())
        .unwrap();
    assert_eq!(a, p, "seed {s}");
}

/// Tiny forced binding limits (many chunks, sequences cut into pieces) give the same results.
#[test]
fn multi_chunk_matches_single_chunk() {
    let (Some(one), Some(many)) = (gpu(), gpu_small_chunks()) else {
        return;
    };
    assert_eq!(many.capabilities().max_binding_bytes, 1024);
    let s = seed(44);
    let mut rng = Rng::new(s);
    let case = padded_case(&mut rng, 17, 700);
    let a = one
        .token_stats(&case.roll, &case.train, case.batch.mask())
        .unwrap();
    let b = check_token_stats(many.as_ref(), &case, s);
    assert_eq!(a, b, "token stats differ between chunkings (seed {s})");
    let values: Vec<&[f64]> = vec![&a.k1, &a.k3, &a.rho];
    let seg = case.batch.segments();
    check_segments(many.as_ref(), &values, seg, s);
    let x = one.segment_reduce(&values, seg).unwrap();
    let y = many.segment_reduce(&values, seg).unwrap();
    for (p, q) in x.iter().zip(&y) {
        assert_eq!(p.count, q.count);
        assert_eq!(p.max, q.max);
        assert_eq!(p.min, q.min);
        assert_eq!(p.argmax, q.argmax);
        assert_close("sum", &q.sum, &p.sum, 1e-6, 1e-9, s);
    }
}

/// 4M tokens, packed, random lengths.
#[test]
fn four_million_tokens_packed() {
    let Some(gpu) = gpu() else { return };
    let s = seed(55);
    let mut rng = Rng::new(s);
    let n = 4 << 20;
    let mut cu = vec![0i64];
    while (*cu.last().unwrap() as usize) < n {
        let len = rng.below(4000).min(n - *cu.last().unwrap() as usize);
        cu.push(cu.last().unwrap() + len as i64);
    }
    let batch = Batch::packed(&cu).unwrap().build().unwrap();
    let roll: Vec<f64> = (0..n).map(|_| rng.range(-8.0, 0.0)).collect();
    let train: Vec<f64> = roll.iter().map(|r| r + rng.range(-0.3, 0.3)).collect();
    let case = Case { batch, roll, train };
    let st = check_token_stats(gpu.as_ref(), &case, s);
    check_segments(gpu.as_ref(), &[&st.k3, &st.k1], case.batch.segments(), s);
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let Some(gpu) = gpu() else { return };
    assert!(gpu.token_stats(&[0.0], &[0.0, 1.0], &[true, true]).is_err());
    // sequences past the mask cannot be built at all
    assert!(Segments::new(vec![(0, 5)], vec![true; 3]).is_err());
    assert!(Segments::new(vec![(0, 2), (1, 3)], vec![true; 3]).is_err());
    let seg = Segments::new(vec![(0, 3)], vec![true; 3]).unwrap();
    assert!(gpu.segment_reduce(&[&[1.0]], &seg).is_err());
    assert!(gpu.is_gpu());
    assert!(gpu.name().starts_with("gpu: "));
}

/// Same input, same bits: no atomics, fixed trees; and buffers are reused across calls.
#[test]
fn deterministic_and_pooled() {
    let Some(gpu) = gpu() else { return };
    let s = seed(88);
    let mut rng = Rng::new(s);
    let case = padded_case(&mut rng, 12, 900);
    let st = gpu
        .token_stats(&case.roll, &case.train, case.batch.mask())
        .unwrap();
    let a = gpu
        .segment_reduce(&[&st.k1, &st.k3], case.batch.segments())
        .unwrap();
    assert!(gpu.context().pool().idle_bytes() > 0);
    for _ in 0..3 {
        let st2 = gpu
            .token_stats(&case.roll, &case.train, case.batch.mask())
            .unwrap();
        assert_eq!(st, st2);
        let b = gpu
            .segment_reduce(&[&st.k1, &st.k3], case.batch.segments())
            .unwrap();
        assert_eq!(a, b);
    }
}

/// Segment sums whose f32 running sum loses digits (1 + many 2^-30; alternating 1e8 and 1;
/// 2^24 + ones − 2^24) but whose TwoSum (hi, lo) pair, finished in f64 on the host, is exact:
/// catches a shader compiler that folds the TwoSum error term `(a + b) − a → b` away.
#[test]
fn segment_sums_are_compensated() {
    let mut engines = Vec::new();
    engines.extend(gpu());
    engines.extend(gpu_small_chunks());
    engines.extend(gpu_with_flavour(Flavour::Workgroup, None));
    engines.extend(gpu_with_flavour(Flavour::Workgroup, Some(192)));
    let mut values = Vec::new();
    let mut ranges = Vec::new();
    let mut push = |v: &mut Vec<f64>, seq: Vec<f64>| {
        ranges.push((v.len(), v.len() + seq.len()));
        v.extend(seq);
    };
    for &n in &[2usize, 7, 255, 256, 257, 1000, 4099] {
        // 1 + (n − 1)·2^-30: every tiny term is below half an ulp of 1.
        let mut s = vec![2f64.powi(-30); n];
        s[0] = 1.0;
        push(&mut values, s);
        // 1e8, 1, 1e8, 1, …: the ones are below half an ulp (4) of 1e8.
        push(
            &mut values,
            (0..n).map(|i| if i % 2 == 0 { 1e8 } else { 1.0 }).collect(),
        );
        // 2^24, 1, 1, …, 1, −2^24: the ones vanish in f32, the exact sum is n − 2.
        let mut s = vec![1.0; n];
        s[0] = 16_777_216.0;
        s[n - 1] = -16_777_216.0;
        push(&mut values, s);
    }
    let seg = Segments::new(ranges, vec![true; values.len()]).unwrap();
    let want = CpuEngine::new().segment_reduce(&[&values], &seg).unwrap();
    for engine in engines {
        let got = engine.segment_reduce(&[&values], &seg).unwrap();
        let wg = engine.context().workgroup_size(Op::SegmentReduce);
        let flavour = engine.context().flavour(Op::SegmentReduce);
        let mut worst = (0, 0f64);
        for (q, (&g, &w)) in got[0].sum.iter().zip(&want[0].sum).enumerate() {
            let rel = (g - w).abs() / w.abs().max(1.0);
            if rel > worst.1 {
                worst = (q, rel);
            }
        }
        let q = worst.0;
        assert!(
            worst.1 <= 1e-12,
            "segment sums not compensated on {} ({flavour:?}, wg {wg}): seq {q}: gpu {:e} vs cpu {:e} \
             (relative error {:.3e})",
            engine.name(),
            got[0].sum[q],
            want[0].sum[q],
            worst.1
        );
        assert_close("mean", &got[0].mean, &want[0].mean, 1e-12, 0.0, 0);
    }
}

/// Both reduction flavours (subgroup where the adapter has it — lavapipe: size 8 — and the
/// forced workgroup tree), at power-of-two and other workgroup sizes, agree with the CPU and
/// give bit-identical results run to run.
#[test]
fn segment_reduce_flavours_agree_and_are_deterministic() {
    let Some(default) = gpu() else { return };
    let caps = default.capabilities().clone();
    let fixed_sg = caps.subgroups && caps.subgroup_sizes.0 == caps.subgroup_sizes.1;
    eprintln!(
        "subgroups: {} (sizes {:?}); default flavour {:?}",
        caps.subgroups,
        caps.subgroup_sizes,
        default.context().flavour(Op::SegmentReduce)
    );
    if fixed_sg {
        assert_eq!(
            default.context().flavour(Op::SegmentReduce),
            Flavour::Subgroup
        );
    }
    let s = seed(99);
    let mut rng = Rng::new(s);
    let cases: Vec<Case> = [(1, 1), (6, 3), (37, 301), (9, 1025)]
        .iter()
        .map(|&(b, t)| padded_case(&mut rng, b, t))
        .collect();
    let mut subgroup_runs = 0;
    for flavour in [Flavour::Subgroup, Flavour::Workgroup] {
        for wg in [None, Some(192), Some(64), Some(24), Some(100)] {
            let Some(engine) = gpu_with_flavour(flavour, wg) else {
                return;
            };
            let ctx = engine.context();
            let used = ctx.flavour(Op::SegmentReduce);
            let size = ctx.workgroup_size(Op::SegmentReduce);
            if flavour == Flavour::Workgroup || !fixed_sg {
                assert_eq!(used, Flavour::Workgroup);
            } else if size.is_multiple_of(caps.subgroup_sizes.0) {
                assert_eq!(used, Flavour::Subgroup, "wg {size}");
                subgroup_runs += 1;
            } else {
                assert_eq!(used, Flavour::Workgroup, "wg {size} falls back");
            }
            for case in &cases {
                let st = CpuEngine::new()
                    .token_stats(&case.roll, &case.train, case.batch.mask())
                    .unwrap();
                let values: Vec<&[f64]> = vec![&st.k1, &st.k3, &st.rho, &st.abs];
                let seg = case.batch.segments();
                check_segments(engine.as_ref(), &values, seg, s);
                let a = engine.segment_reduce(&values, seg).unwrap();
                let b = engine.segment_reduce(&values, seg).unwrap();
                assert_eq!(a, b, "{used:?} wg {size}: not deterministic (seed {s})");
            }
        }
    }
    if fixed_sg {
        assert!(
            subgroup_runs >= 3,
            "subgroup flavour ran {subgroup_runs} times"
        );
    }
}

/// Short sequences (mean length ≤ `SERIAL_MEAN`) take the SERIAL segment reduction (one thread
/// per sequence and statistic, no tree), long ones the workgroup per sequence: both agree with
/// the CPU, keep TwoSum's compensation (1 + 6·2^-30; 2^24 + ones − 2^24) and run to run bits,
/// with the default and with odd forced workgroup sizes (pieces per workgroup).
#[test]
fn short_sequences_reduce_one_thread_each() {
    use trmask::gpu::pipeline::SERIAL_MEAN;
    use trmask::gpu::segment_reduce;
    let mut engines: Vec<_> = gpu().into_iter().collect();
    engines.extend(gpu_with_flavour(Flavour::Workgroup, Some(24)));
    engines.extend(gpu_with_flavour(Flavour::Workgroup, Some(7)));
    let s = seed(31);
    let mut rng = Rng::new(s);
    for (nseq, max_len) in [(3000usize, 7usize), (40, 300)] {
        let mut ranges = Vec::new();
        let mut values = Vec::new();
        for q in 0..nseq {
            let at = values.len();
            let len = 1 + rng.below(max_len);
            match q % 3 {
                0 => values.extend((0..len).map(|i| if i == 0 { 1.0 } else { 2f64.powi(-30) })),
                1 => values.extend((0..len).map(|i| match i {
                    0 => 16_777_216.0,
                    _ if i + 1 == len && len > 1 => -16_777_216.0,
                    _ => 1.0,
                })),
                _ => values.extend((0..len).map(|_| rng.range(-3.0, 3.0))),
            }
            ranges.push((at, values.len()));
        }
        let mask: Vec<bool> = (0..values.len()).map(|i| i % 11 != 5).collect();
        let seg = Segments::new(ranges, mask).unwrap();
        let mean = seg.mask().iter().filter(|&&m| m).count() as f64 / nseq as f64;
        let neg: Vec<f64> = values.iter().map(|v| -v).collect();
        let stats: [&[f64]; 2] = [&values, &neg];
        let want = CpuEngine::new().segment_reduce(&stats, &seg).unwrap();
        for engine in &engines {
            let got = engine.segment_reduce(&stats, &seg).unwrap();
            check_segments(engine.as_ref(), &stats, &seg, s);
            // the first two kinds of sequence hold f32-exact values: their sums are exact
            for (g, w) in got.iter().zip(&want) {
                for q in (0..nseq).filter(|q| q % 3 != 2) {
                    let (a, b) = (g.sum[q], w.sum[q]);
                    assert!(
                        (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                        "seq {q}: {a} vs {b}"
                    );
                }
            }
            assert_eq!(got, engine.segment_reduce(&stats, &seg).unwrap());
            assert_eq!(mean, segment_reduce::mean_valid(&seg));
            let key = segment_reduce::kernel_key(engine.context(), mean);
            assert_eq!(
                key.variant,
                mean <= SERIAL_MEAN,
                "mean {mean}: {}",
                key.label()
            );
            assert!(engine.context().built_kernels().contains(&key));
        }
    }
}
