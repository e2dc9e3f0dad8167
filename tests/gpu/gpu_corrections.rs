//! The fused corrections pass (`Engine::corrections_pass`): the GPU engine (one submission:
//! token stats, per-sequence reductions, decisions, mask, IS weights) against the f64 CPU
//! reference on random batches for several plans; masks may differ only where the reference
//! statistic is within `2e-5·|thr| + 2e-6` of its threshold (docs/FORMAT.md, Accuracy). Also: padded and packed
//! layouts give identical results, NaN/garbage in the padding is never read, chunked and
//! fallback paths agree, and steady-state calls reuse pooled device buffers.

#![allow(clippy::needless_range_loop)]

use crate::common;

use common::{assert_close, gpu, gpu_small_chunks, seed, Rng};
use trmask::config::IsLevel;
use trmask::cpu::CpuEngine;
use trmask::plan::{CorrectionsRaw, MaskAgg, MaskCriterion, MaskIs, MaskPlan, MaskSource};
use trmask::{Engine, Segments, TokenStats};

const RTOL: f64 = 2e-5;
const ATOL: f64 = 2e-6;

fn near(x: f64, thr: f64) -> bool {
    (x - thr).abs() <= RTOL * thr.abs() + ATOL
}

/// A padded layout (`b` rows of `t` slots, random left-aligned lengths incl. 0 and 1) with
/// log-ratios mostly in ±0.4, a few spikes, and NaN in the padding; plus a per-slot column.
struct Case {
    segs: Segments,
    lr: Vec<f64>,
    col: Vec<f64>,
    b: usize,
    t: usize,
}

fn case(rng: &mut Rng, b: usize, t: usize) -> Case {
    let mut mask = vec![false; b * t];
    let mut lr = vec![f64::NAN; b * t];
    let mut col = vec![f64::NAN; b * t];
    let mut ranges = Vec::with_capacity(b);
    for r in 0..b {
        let len = match r % 6 {
            0 => 0,
            1 => 1.min(t),
            _ => rng.below(t + 1),
        };
        let drift = rng.range(-0.1, 0.1);
        for c in 0..len {
            let i = r * t + c;
            mask[i] = true;
            lr[i] = if rng.bool(0.03) {
                rng.range(-25.0, 25.0)
            } else {
                drift + rng.range(-0.3, 0.3)
            };
            col[i] = rng.range(0.0, 0.05);
        }
        ranges.push((r * t, (r + 1) * t));
    }
    Case {
        segs: Segments::new(ranges, mask).unwrap(),
        lr,
        col,
        b,
        t,
    }
}

fn crit(source: MaskSource, agg: MaskAgg, lower: Option<f64>, upper: f64) -> MaskCriterion {
    MaskCriterion {
        source,
        agg,
        lower,
        upper,
    }
}

/// Plans covering token + sequence criteria, k1's two-sided log-space test, verl and exact
/// means, max, LN-TRM's weighted mean, host columns, token / sequence TIS and IcePop.
fn plans<'a>(col: &'a [f64]) -> Vec<(&'static str, MaskPlan<'a>)> {
    use MaskAgg::*;
    use MaskSource::*;
    let tis = |level, upper| {
        Some(MaskIs {
            level,
            upper,
            lower: None,
            batch_normalize: false,
        })
    };
    let icepop = |level, lower, upper| {
        Some(MaskIs {
            level,
            upper,
            lower: Some(lower),
            batch_normalize: false,
        })
    };
    vec![
        (
            "token_k2 + seq_mean_k3(verl) + token TIS",
            MaskPlan {
                criteria: vec![
                    crit(K2, Token, None, 0.02),
                    crit(K3Verl, MeanVerl, None, 0.01),
                ],
                is: tis(IsLevel::Token, 2.0),
                columns: vec![],
            },
        ),
        (
            "seq_sum_k1 two-sided + seq_max_k2 + sequence TIS",
            MaskPlan {
                criteria: vec![
                    crit(K1, Sum, Some(0.5f64.ln()), 2f64.ln()),
                    crit(K2, Max, None, 0.08),
                ],
                is: tis(IsLevel::Sequence, 5.0),
                columns: vec![],
            },
        ),
        (
            "token_k1 two-sided + seq_mean_abs (exact) + token IcePop",
            MaskPlan {
                criteria: vec![
                    crit(K1, Token, Some(0.7f64.ln()), 1.3f64.ln()),
                    crit(Abs, Mean, None, 0.15),
                    crit(K3, Mean, None, 0.02),
                ],
                is: icepop(IsLevel::Token, 0.8, 1.25),
                columns: vec![],
            },
        ),
        (
            "LN-TRM + column criterion + ser token + sequence IcePop",
            MaskPlan {
                criteria: vec![
                    crit(SerWeighted(0), WeightedMean(0), None, 0.2),
                    crit(Column(0), Max, None, 0.045),
                    crit(Ser, Token, None, 0.35),
                ],
                is: icepop(IsLevel::Sequence, 0.5, 2.0),
                columns: vec![col],
            },
        ),
        (
            "no criteria, no IS",
            MaskPlan {
                criteria: vec![],
                is: None,
                columns: vec![],
            },
        ),
    ]
}

fn source_stat(t: &TokenStats, plan: &MaskPlan, src: MaskSource, i: usize) -> f64 {
    match src {
        MaskSource::K1 => t.k1[i],
        MaskSource::K2 => t.k2[i],
        MaskSource::K3 | MaskSource::K3Verl => t.k3[i],
        MaskSource::Abs => t.abs[i],
        MaskSource::Ser => t.ser[i],
        MaskSource::Column(j) => plan.columns[j][i],
        MaskSource::SerWeighted(j) => t.ser[i] * plan.columns[j][i],
        MaskSource::BinaryKl(j) => {
            trmask::numerics::binary_kl(plan.columns[j][i], plan.columns[j + 1][i], t.log_ratio[i])
        }
    }
}

/// GPU against CPU: token stats and weights within tolerance, per-criterion decisions equal
/// except at near-threshold statistics; returns the number of accepted flips.
fn check(
    what: &str,
    gpu: &CorrectionsRaw,
    cpu: &CorrectionsRaw,
    segs: &Segments,
    plan: &MaskPlan,
    seed: u64,
) -> usize {
    for (name, g, c) in [
        ("log_ratio", &gpu.tokens.log_ratio, &cpu.tokens.log_ratio),
        ("rho", &gpu.tokens.rho, &cpu.tokens.rho),
        ("k1", &gpu.tokens.k1, &cpu.tokens.k1),
        ("k2", &gpu.tokens.k2, &cpu.tokens.k2),
        ("k3", &gpu.tokens.k3, &cpu.tokens.k3),
        ("abs", &gpu.tokens.abs, &cpu.tokens.abs),
        ("ser", &gpu.tokens.ser, &cpu.tokens.ser),
    ] {
        assert_close(&format!("{what}: {name}"), g, c, RTOL, ATOL, seed);
    }
    assert_close(
        &format!("{what}: seq_log_ratio_sum"),
        &gpu.seq_log_ratio_sum,
        &cpu.seq_log_ratio_sum,
        RTOL,
        ATOL,
        seed,
    );
    let owner = segs.slot_owner();
    let mut flips = 0;
    for (ci, c) in plan.criteria.iter().enumerate() {
        let bit = 1u32 << ci;
        let near_thr = |x: f64| near(x, c.upper) || c.lower.is_some_and(|l| near(x, l));
        if c.agg != MaskAgg::Token {
            for s in 0..segs.len() {
                let (g, r) = (gpu.seq_stat[ci][s], cpu.seq_stat[ci][s]);
                assert!(
                    (g - r).abs() <= RTOL * r.abs() + ATOL,
                    "{what}: criterion {ci} seq {s}: gpu {g} vs cpu {r} (seed {seed})"
                );
            }
        }
        for i in 0..segs.slots() {
            if (gpu.token_reject[i] ^ cpu.token_reject[i]) & bit == 0 {
                continue;
            }
            let x = match c.agg {
                MaskAgg::Token => source_stat(&cpu.tokens, plan, c.source, i),
                _ => cpu.seq_stat[ci][owner[i]],
            };
            assert!(
                near_thr(x),
                "{what}: criterion {ci} decision differs at slot {i}: statistic {x} is not \
                 within tolerance of its threshold (seed {seed})"
            );
            flips += 1;
        }
    }
    for i in 0..segs.slots() {
        if gpu.mask[i] != cpu.mask[i] {
            assert_ne!(gpu.token_reject[i], cpu.token_reject[i], "{what}: slot {i}");
        }
        if !segs.mask()[i] {
            assert!(
                !gpu.mask[i] && gpu.token_reject[i] == 0,
                "{what}: invalid slot {i}"
            );
        }
    }
    match (&gpu.weights, &cpu.weights, plan.is) {
        (None, None, None) => {}
        (Some(g), Some(c), Some(is)) => {
            for i in 0..g.len() {
                let ok = (g[i] - c[i]).abs() <= RTOL * c[i].abs() + ATOL;
                // IcePop may flip a weight to 0 only at a bound
                let raw = match is.level {
                    IsLevel::Token => cpu.tokens.rho[i],
                    IsLevel::Sequence => cpu.seq_log_ratio_sum[owner[i]].clamp(-20.0, 20.0).exp(),
                };
                let tie = is.lower.is_some_and(|l| near(raw, l)) || near(raw, is.upper);
                assert!(
                    ok || tie,
                    "{what}: weight {i}: gpu {} vs cpu {} (seed {seed})",
                    g[i],
                    c[i]
                );
            }
        }
        _ => panic!("{what}: weights presence differs"),
    }
    assert_eq!(
        gpu.seq_reject.len(),
        cpu.seq_reject.len(),
        "{what}: seq_reject length"
    );
    flips
}

#[test]
fn gpu_matches_cpu_on_random_batches() {
    let Some(g) = gpu() else { return };
    let cpu = CpuEngine::new();
    let s = seed(0x6d61_736b);
    let mut rng = Rng::new(s);
    let mut flips = 0;
    let mut rejected = 0;
    let mut variants = Vec::new();
    for (b, t) in [(1, 1), (7, 5), (24, 40), (9, 300), (3, 1000)] {
        let c = case(&mut rng, b, t);
        // short sequences: one thread each (SERIAL); long ones: a workgroup each
        let mean = trmask::gpu::segment_reduce::mean_valid(&c.segs);
        variants.push(trmask::gpu::masks::kernel_key(g.context(), mean).variant);
        for (name, plan) in plans(&c.col) {
            let what = format!("{name} ({b}x{t})");
            let fused = trmask::gpu::masks::corrections_pass(g.context(), &c.lr, &c.segs, &plan);
            assert!(fused.unwrap().is_some(), "{what}: the fused kernel ran");
            let gr = g.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
            let cr = cpu.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
            flips += check(&what, &gr, &cr, &c.segs, &plan, s);
            rejected += cr
                .mask
                .iter()
                .zip(c.segs.mask())
                .filter(|(k, v)| **v && !**k)
                .count();
        }
    }
    assert!(
        variants.contains(&true) && variants.contains(&false),
        "both masks variants: {variants:?}"
    );
    println!("gpu vs cpu corrections pass: {flips} decision flips at ties, {rejected} rejections");
    assert!(rejected > 0, "the plans should reject something");
}

#[test]
fn chunked_and_fallback_paths_match_cpu() {
    // 1 KiB bindings: 28 slots per chunk; rows of 20 slots → many chunks of whole sequences,
    // rows of 40 → the sequence does not fit and the engine falls back to token_stats +
    // one segment_reduce (which split long sequences)
    let Some(g) = gpu_small_chunks() else { return };
    let cpu = CpuEngine::new();
    let s = seed(0x6368_756e);
    let mut rng = Rng::new(s);
    for (b, t) in [(13, 20), (5, 40)] {
        let c = case(&mut rng, b, t);
        for (name, plan) in plans(&c.col) {
            let what = format!("{name} ({b}x{t}, small chunks)");
            let fused = trmask::gpu::masks::corrections_pass(g.context(), &c.lr, &c.segs, &plan);
            assert_eq!(
                fused.unwrap().is_some(),
                t == 20,
                "{what}: fused or fallback"
            );
            let gr = g.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
            let cr = cpu.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
            check(&what, &gr, &cr, &c.segs, &plan, s);
        }
    }
}

/// The packed layout of a padded case: valid tokens only, `cu_seqlens` from the lengths.
fn packed(c: &Case) -> (Segments, Vec<f64>, Vec<f64>, Vec<usize>) {
    let (mut lr, mut col, mut ranges, mut slot) = (vec![], vec![], vec![], vec![]);
    for r in 0..c.b {
        let a = lr.len();
        for i in r * c.t..(r + 1) * c.t {
            if c.segs.mask()[i] {
                lr.push(c.lr[i]);
                col.push(c.col[i]);
                slot.push(i);
            }
        }
        ranges.push((a, lr.len()));
    }
    let n = lr.len();
    (Segments::new(ranges, vec![true; n]).unwrap(), lr, col, slot)
}

#[test]
fn padded_and_packed_agree_and_padding_is_never_read() {
    let engines: Vec<(&str, std::sync::Arc<dyn Engine>)> = match gpu() {
        Some(g) => vec![("gpu", g), ("cpu", std::sync::Arc::new(CpuEngine::new()))],
        None => vec![("cpu", std::sync::Arc::new(CpuEngine::new()))],
    };
    let s = seed(0x7061_636b);
    let mut rng = Rng::new(s);
    let c = case(&mut rng, 11, 37);
    let (psegs, plr, pcol, slot) = packed(&c);
    // the same padded batch with zeros instead of NaN in the padding
    let clean_lr: Vec<f64> = (0..c.lr.len())
        .map(|i| if c.segs.mask()[i] { c.lr[i] } else { 0.0 })
        .collect();
    let clean_col: Vec<f64> = (0..c.col.len())
        .map(|i| if c.segs.mask()[i] { c.col[i] } else { 0.0 })
        .collect();
    for (ename, e) in &engines {
        for ((name, plan), ((_, pplan), (_, cplan))) in plans(&c.col)
            .into_iter()
            .zip(plans(&pcol).into_iter().zip(plans(&clean_col)))
        {
            let what = format!("{ename}: {name}");
            let a = e.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
            let z = e.corrections_pass(&clean_lr, &c.segs, &cplan).unwrap();
            assert_eq!(a, z, "{what}: NaN in the padding changed the result");
            let p = e.corrections_pass(&plr, &psegs, &pplan).unwrap();
            assert_eq!(a.seq_stat, p.seq_stat, "{what}: seq_stat padded vs packed");
            assert_eq!(a.seq_reject, p.seq_reject, "{what}: seq_reject");
            assert_eq!(
                a.seq_log_ratio_sum, p.seq_log_ratio_sum,
                "{what}: seq_log_ratio_sum"
            );
            for (k, &i) in slot.iter().enumerate() {
                assert_eq!(a.mask[i], p.mask[k], "{what}: mask at slot {i}");
                assert_eq!(a.token_reject[i], p.token_reject[k], "{what}: bits {i}");
                assert_eq!(a.tokens.k3[i], p.tokens.k3[k], "{what}: k3 {i}");
                if let (Some(wa), Some(wp)) = (&a.weights, &p.weights) {
                    assert_eq!(wa[i], wp[k], "{what}: weight at slot {i}");
                }
            }
            for i in 0..c.lr.len() {
                if !c.segs.mask()[i] {
                    assert!(!a.mask[i], "{what}: padding slot {i} kept");
                    assert_eq!(a.tokens.rho[i], 0.0, "{what}: padding slot {i}");
                    if let Some(w) = &a.weights {
                        assert_eq!(w[i], 0.0, "{what}: padding weight {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn steady_state_reuses_pooled_buffers() {
    if gpu().is_none() {
        return;
    }
    // an engine of its own: the shared one's pool is used by the other tests concurrently
    let g = trmask::GpuEngine::new().unwrap();
    let mut rng = Rng::new(seed(0x706f_6f6c));
    let c = case(&mut rng, 16, 64);
    let plan = plans(&c.col).swap_remove(3).1;
    let first = g.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
    let idle = g.context().pool().idle_bytes();
    for _ in 0..3 {
        let again = g.corrections_pass(&c.lr, &c.segs, &plan).unwrap();
        assert_eq!(again, first, "repeated calls are deterministic");
        assert_eq!(
            g.context().pool().idle_bytes(),
            idle,
            "every device buffer of a steady-state call comes back from the pool"
        );
    }
}

/// Per-sequence sums through the fused pass survive cancellation only if they are compensated:
/// `+16`, 2,046 values of `3e-7` (each below half an ulp of 16, so a plain f32 sum drops them
/// next to the 16) and `−16`, in three orders. The sum of the log-ratio (sequence IS weight) and a `seq_sum_k1`
/// statistic must come out as ≈ 6.1e-4, for IS off, sequence TIS and sequence IcePop.
#[test]
fn fused_sequence_sums_are_compensated() {
    let Some(gpu) = gpu() else { return };
    let n = 2048;
    let mut lr = vec![3e-7; n];
    lr[0] = 16.0;
    lr[n - 1] = -16.0;
    // a second sequence in the other order, and a third with the big values mid-way
    let mut lr2 = lr.clone();
    lr2.reverse();
    // a third where every value lands on the same thread (slots 0, 256, 512, … of a
    // 256-thread workgroup): a plain f32 sum there gives exactly 0
    let n3 = 256 * 2048;
    let mut lr3 = vec![0.0; n3];
    for k in 1..2047 {
        lr3[256 * k] = 3e-7;
    }
    lr3[0] = 16.0;
    lr3[256 * 2047] = -16.0;
    let all: Vec<f64> = [lr, lr2, lr3].concat();
    let seg = Segments::new(
        vec![(0, n), (n, 2 * n), (2 * n, 2 * n + n3)],
        vec![true; 2 * n + n3],
    )
    .unwrap();
    let sum = 2046.0 * 3e-7;
    let modes = [
        ("IS off", None),
        (
            "sequence TIS",
            Some(MaskIs {
                level: IsLevel::Sequence,
                upper: 2.0,
                lower: None,
                batch_normalize: false,
            }),
        ),
        (
            "sequence IcePop",
            Some(MaskIs {
                level: IsLevel::Sequence,
                upper: 2.0,
                lower: Some(0.5),
                batch_normalize: false,
            }),
        ),
    ];
    for (what, is) in modes {
        let plan = MaskPlan {
            criteria: vec![crit(MaskSource::K1, MaskAgg::Sum, None, 1.0)],
            is,
            columns: vec![],
        };
        let got = gpu.corrections_pass(&all, &seg, &plan).unwrap();
        let want = CpuEngine::new()
            .corrections_pass(&all, &seg, &plan)
            .unwrap();
        for s in 0..3 {
            let (g, w) = (got.seq_log_ratio_sum[s], want.seq_log_ratio_sum[s]);
            assert!((w - sum).abs() < 1e-12, "{what}: reference {w}");
            assert!(
                (g - w).abs() <= 1e-3 * w.abs(),
                "{what}: sequence {s}: GPU sum of log-ratios {g:e}, reference {w:e}"
            );
            let (g, w) = (got.seq_stat[0][s], want.seq_stat[0][s]);
            assert!(
                (g - w).abs() <= 1e-3 * w.abs(),
                "{what}: sequence {s}: GPU seq_sum_k1 {g:e}, reference {w:e}"
            );
        }
        if let (Some(g), Some(w)) = (&got.weights, &want.weights) {
            assert_close(&format!("{what} weights"), g, w, 1e-6, 0.0, 0);
        }
    }
}

/// `backend auto` chooses the executor by the work: on a GPU engine, a corrector that chooses
/// by the work runs the fused CPU pass for host log-probs (same mask, weights and metrics as
/// the CPU engine's), one that does not runs the GPU's full path.
#[test]
fn auto_runs_host_log_probs_on_the_fused_cpu_pass() {
    use trmask::{Corrector, Step};
    let Some(gpu) = common::gpu() else { return };
    let cfg = trmask::CorrectionConfig::preset("decoupled_k3_rs_token_tis").unwrap();
    let plain = Corrector::new((*gpu).clone(), &cfg).unwrap();
    let by_work = Corrector::new((*gpu).clone(), &cfg)
        .unwrap()
        .choose_executor_by_work(true);
    assert!(!plain.has_lean_pass());
    assert!(by_work.has_lean_pass());
    let cpu = Corrector::new(trmask::cpu::CpuEngine::new(), &cfg).unwrap();
    let (b, t) = (4usize, 50usize);
    let roll: Vec<f32> = (0..b * t).map(|i| -0.5 - (i % 7) as f32 * 0.1).collect();
    let old: Vec<f32> = (0..b * t)
        .map(|i| roll[i] + if i / t == 2 { 0.3 } else { 0.01 })
        .collect();
    let mask: Vec<f32> = (0..b * t)
        .map(|i| f32::from(i % t < 10 + 9 * (i / t)))
        .collect();
    let step = Step::padded(b, t)
        .response_mask(&mask[..])
        .rollout_log_prob(&roll[..])
        .old_log_prob(&old[..]);
    let (w1, m1, c1) = common::correct_into_f32(&by_work, &step, b * t);
    let (w2, m2, c2) = common::correct_into_f32(&cpu, &step, b * t);
    assert!(
        w1 == w2 && m1 == m2,
        "the fused pass on a GPU engine = the CPU engine's"
    );
    assert_eq!(c1.metrics, c2.metrics);
    assert!(
        m1[2 * t..2 * t + 10].iter().all(|&x| x == 0.0),
        "sequence 2 rejected"
    );
}
