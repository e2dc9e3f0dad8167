//! Exact vocabulary divergences: CPU reference vs float64 references on real logits, GPU vs
//! those references and vs the CPU on random batches.

use crate::common;

use common::{vocab_bits as bits, vocab_fields as fields, Rng};
use safetensors::SafeTensors;
use trmask::cpu::CpuEngine;
use trmask::{DType, Engine, Logits, VocabStats};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/real-small");

struct Real {
    rollout_bf16: Logits,
    rollout_f16: Logits,
    trainer: Logits,
    sampled: Vec<i64>,
    sampled_f16: Vec<i64>,
    refs: Vec<(String, Vec<f64>)>,
}

fn f64s(st: &SafeTensors, name: &str) -> Vec<f64> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), safetensors::Dtype::F64, "{name}");
    t.data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(st: &SafeTensors, name: &str) -> Vec<i64> {
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::I32, "{name}");
    t.data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
        .collect()
}

fn logits(st: &SafeTensors, name: &str, dtype: DType) -> Logits {
    let t = st.tensor(name).unwrap();
    let shape = t.shape();
    Logits::from_bytes(t.data().to_vec(), dtype, shape[0], shape[1]).unwrap()
}

fn real() -> Real {
    let lb = std::fs::read(format!("{DATA}/logits.safetensors")).unwrap();
    let rb = std::fs::read(format!("{DATA}/reference.safetensors")).unwrap();
    let l = SafeTensors::deserialize(&lb).unwrap();
    let r = SafeTensors::deserialize(&rb).unwrap();
    let mut refs = Vec::new();
    for pre in ["bf16.", "fp16."] {
        for k in [
            "kl_rollout_trainer",
            "kl_trainer_rollout",
            "tv",
            "entropy_rollout",
            "entropy_trainer",
            "logp_rollout_sampled",
            "logp_trainer_sampled",
        ] {
            let name = format!("{pre}{k}");
            refs.push((name.clone(), f64s(&r, &name)));
        }
    }
    let cu = i32s(&l, "cu_seqlens");
    assert_eq!(cu, i32s(&r, "cu_seqlens"));
    Real {
        rollout_bf16: logits(&l, "rollout_logits", DType::BF16),
        rollout_f16: logits(&l, "rollout_fp16_logits", DType::F16),
        trainer: logits(&l, "trainer_logits", DType::F32),
        sampled: i32s(&l, "sampled_ids"),
        sampled_f16: i32s(&l, "sampled_ids_fp16"),
        refs,
    }
}

impl Real {
    fn reference(&self, name: &str) -> &[f64] {
        &self.refs.iter().find(|(n, _)| n == name).unwrap().1
    }
}

/// Checks `got` against the real-small references; returns per field the worst relative error
/// where it is meaningful (`|ref| ≥ 100·atol`) and the worst absolute error.
/// `tol(field) = (rtol, atol)`.
fn check_real(
    who: &str,
    engine: &dyn Engine,
    data: &Real,
    tol: impl Fn(&str) -> (f64, f64),
) -> Vec<(String, f64, f64)> {
    let mut worst = Vec::new();
    for (pre, roll, ids) in [
        ("bf16.", &data.rollout_bf16, &data.sampled),
        ("fp16.", &data.rollout_f16, &data.sampled_f16),
    ] {
        let n = roll.rows();
        let got = engine
            .vocab_divergence(roll, &data.trainer, Some(ids), &vec![true; n], 1.0)
            .unwrap();
        for (field, vals) in fields(&got) {
            let want = data.reference(&format!("{pre}{field}"));
            let (rtol, atol) = tol(field);
            let (mut w, mut wa) = (0.0f64, 0.0f64);
            for (i, (&g, &r)) in vals.iter().zip(want).enumerate() {
                let err = (g - r).abs();
                assert!(
                    err <= rtol * r.abs() + atol,
                    "{who} {pre}{field}[{i}]: got {g:e}, reference {r:e} (err {err:e})"
                );
                if r.abs() >= 100.0 * atol {
                    w = w.max(err / r.abs());
                }
                wa = wa.max(err);
            }
            worst.push((format!("{pre}{field}"), w, wa));
        }
    }
    worst
}

#[test]
fn cpu_matches_float64_references() {
    let data = real();
    let worst = check_real("cpu", &CpuEngine::new(), &data, |_| (1e-9, 1e-13));
    for (f, w, wa) in worst {
        println!("cpu {f}: max rel err {w:.3e} (|ref| >= 1e-11), max abs err {wa:.3e}");
    }
}

/// The `cpu-fast` precision on the real logits: the GPU engine's tolerance (its f32 path ran:
/// the results are not the reference's to the bit).
#[test]
fn cpu_fast_matches_float64_references_at_the_gpu_tolerance() {
    let data = real();
    let worst = check_real("cpu-fast", &CpuEngine::fast(), &data, gpu_tol);
    for (f, w, wa) in &worst {
        println!("cpu-fast {f}: max rel err {w:.3e} (|ref| >= 100 atol), max abs err {wa:.3e}");
    }
    let kl = worst
        .iter()
        .find(|(f, _, _)| f == "bf16.kl_rollout_trainer")
        .unwrap();
    assert!(kl.1 > 0.0, "the f32 path ran");
}

// ---------------------------------------------------------------------------------------------
// Random batches

pub(crate) fn normal(rng: &mut Rng) -> f64 {
    let (u, v) = (rng.f64().max(1e-300), rng.f64());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// Encodes f32 values in `dtype` (rounding to nearest).
pub(crate) fn encode(values: &[f32], dtype: DType, rows: usize, vocab: usize) -> Logits {
    let bytes: Vec<u8> = match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
    };
    Logits::from_bytes(bytes, dtype, rows, vocab).unwrap()
}

/// A random pair of logits tensors: trainer = rollout + noise, both scaled by `scale`, with a
/// fraction of −inf entries and a few masked rows full of NaN.
pub(crate) struct Case {
    pub(crate) rows: usize,
    pub(crate) vocab: usize,
    pub(crate) rollout: Logits,
    pub(crate) train: Logits,
    pub(crate) responses: Vec<i64>,
    pub(crate) mask: Vec<bool>,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn case(
    seed: u64,
    rows: usize,
    vocab: usize,
    da: DType,
    db: DType,
    scale: f64,
    noise: f64,
    neg_inf: f64,
) -> Case {
    let mut rng = Rng::new(seed);
    let n = rows * vocab;
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    // every 5th row masked (not when there is a single row)
    let mask: Vec<bool> = (0..rows).map(|r| !(rows > 1 && r % 5 == 3)).collect();
    for (r, &valid) in mask.iter().enumerate() {
        let masked = !valid;
        let sharp = 0.5 + 3.0 * rng.f64();
        for i in 0..vocab {
            let k = r * vocab + i;
            if masked {
                a[k] = f32::NAN;
                b[k] = if i % 2 == 0 { f32::INFINITY } else { f32::NAN };
                continue;
            }
            let x = normal(&mut rng) * sharp;
            a[k] = (x * scale) as f32;
            b[k] = ((x + noise * normal(&mut rng)) * scale + 0.37 * scale) as f32;
            if vocab > 1 && rng.f64() < neg_inf && i != r % vocab {
                a[k] = f32::NEG_INFINITY;
                if rng.f64() < 0.7 {
                    b[k] = f32::NEG_INFINITY;
                }
            }
        }
    }
    let mut responses = vec![0i64; rows];
    for (r, y) in responses.iter_mut().enumerate() {
        *y = if mask[r] { (r % vocab) as i64 } else { -7 };
    }
    Case {
        rows,
        vocab,
        rollout: encode(&a, da, rows, vocab),
        train: encode(&b, db, rows, vocab),
        responses,
        mask,
    }
}

/// `(rtol, atol)` of the GPU against a float64 reference on the same inputs.
fn gpu_tol(field: &str) -> (f64, f64) {
    match field {
        "kl_rollout_trainer" | "kl_trainer_rollout" | "tv" => (2e-3, 1e-7),
        "entropy_rollout" | "entropy_trainer" => (1e-4, 1e-6),
        _ => (1e-4, 2e-6), // log-probs
    }
}

/// Compares two results field by field (`±inf` must match exactly), reporting the worst index.
/// `scale` multiplies the absolute tolerance (inputs of magnitude `scale`).
pub(crate) fn compare(what: &str, got: &VocabStats, want: &VocabStats, scale: f64) {
    for ((field, g), (_, w)) in fields(got).into_iter().zip(fields(want)) {
        let (rtol, atol) = gpu_tol(field);
        let atol = if field.starts_with("logp") {
            atol * scale
        } else {
            atol
        };
        let mut worst: Option<(usize, f64)> = None;
        for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
            if w.is_infinite() || g.is_infinite() {
                assert_eq!(g, w, "{what} {field}[{i}]");
                continue;
            }
            let excess = (g - w).abs() - (rtol * w.abs() + atol);
            assert!(!g.is_nan(), "{what} {field}[{i}] is NaN (want {w:e})");
            if worst.is_none_or(|(_, e)| excess > e) {
                worst = Some((i, excess));
            }
        }
        if let Some((i, e)) = worst {
            assert!(
                e <= 0.0,
                "{what} {field}[{i}]: got {:e} vs cpu {:e} (rtol {rtol:e}, atol {atol:e})",
                g[i],
                w[i]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GPU

#[test]
fn every_dtype_pair_has_kernel_keys() {
    use trmask::gpu::pipeline::{all_kernel_keys, Op};
    let keys = all_kernel_keys();
    for a in [DType::F32, DType::F16, DType::BF16] {
        for b in [DType::F32, DType::F16, DType::BF16] {
            assert!(
                keys.iter()
                    .any(|k| k.op == Op::VocabDivergence(b) && k.dtype == a),
                "no vocab_divergence key for rollout {a:?} / trainer {b:?}"
            );
        }
    }
}

#[test]
fn gpu_matches_float64_references() {
    let Some(gpu) = common::gpu() else { return };
    let data = real();
    let worst = check_real("gpu", gpu.as_ref(), &data, gpu_tol);
    for (f, w, wa) in worst {
        println!("gpu {f}: max rel err {w:.3e} (|ref| >= 100 atol), max abs err {wa:.3e}");
    }
}

pub(crate) fn run_case(gpu: &dyn Engine, c: &Case, temperature: f64, scale: f64, what: &str) {
    let cpu = CpuEngine::new()
        .vocab_divergence(
            &c.rollout,
            &c.train,
            Some(&c.responses),
            &c.mask,
            temperature,
        )
        .unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let got = gpu
        .vocab_divergence(
            &c.rollout,
            &c.train,
            Some(&c.responses),
            &c.mask,
            temperature,
        )
        .unwrap_or_else(|e| panic!("{what}: gpu: {e}"));
    compare(what, &got, &cpu, scale);
    for (r, &m) in c.mask.iter().enumerate() {
        if !m {
            for (f, v) in fields(&got) {
                assert_eq!(v[r], 0.0, "{what}: masked row {r} {f}");
            }
        }
    }
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[test]
fn gpu_matches_cpu_on_random_batches_every_dtype_pair() {
    let Some(gpu) = common::gpu() else { return };
    random_batches_every_dtype_pair(gpu.as_ref());
}

#[test]
fn cpu_fast_matches_cpu_on_random_batches_every_dtype_pair() {
    random_batches_every_dtype_pair(&CpuEngine::fast());
}

/// `engine` (the GPU, or the CPU at the `cpu-fast` precision) against the f64 CPU reference.
fn random_batches_every_dtype_pair(gpu: &dyn Engine) {
    let seed = common::seed(0x5eed_0001);
    let mut k = 0u64;
    for da in DTYPES {
        for db in DTYPES {
            for &v in &[1usize, 2, 3, 7, 255, 256, 257, 4099] {
                k += 1;
                let rows = if v < 300 { 11 } else { 6 };
                let c = case(seed + k, rows, v, da, db, 1.0, 0.05, 0.1);
                let what = format!("{da:?}/{db:?} V={v} seed={}", seed + k);
                run_case(gpu, &c, 1.0, 1.0, &what);
            }
        }
    }
}

#[test]
fn gpu_matches_cpu_on_large_vocabularies() {
    let Some(gpu) = common::gpu() else { return };
    large_vocabularies(gpu.as_ref());
}

#[test]
fn cpu_fast_matches_cpu_on_large_vocabularies() {
    large_vocabularies(&CpuEngine::fast());
}

/// `engine` (the GPU, or the CPU at the `cpu-fast` precision) against the f64 CPU reference.
fn large_vocabularies(gpu: &dyn Engine) {
    let seed = common::seed(0x5eed_0002);
    for (i, (v, rows, da, db)) in [
        (32000usize, 4usize, DType::BF16, DType::F32),
        (151_936, 2, DType::BF16, DType::F32),
        (151_936, 1, DType::F16, DType::F16),
        (30522, 3, DType::F32, DType::BF16),
    ]
    .into_iter()
    .enumerate()
    {
        let s = seed + i as u64;
        let c = case(s, rows, v, da, db, 4.0, 0.01, 0.01);
        run_case(gpu, &c, 1.0, 1.0, &format!("{da:?}/{db:?} V={v} seed={s}"));
    }
}

#[test]
fn gpu_handles_extreme_magnitudes_temperature_and_identical_inputs() {
    let Some(gpu) = common::gpu() else { return };
    extreme_magnitudes_temperature_and_identical_inputs(gpu.as_ref());
}

#[test]
fn cpu_fast_handles_extreme_magnitudes_temperature_and_identical_inputs() {
    extreme_magnitudes_temperature_and_identical_inputs(&CpuEngine::fast());
}

/// `engine` (the GPU, or the CPU at the `cpu-fast` precision) against the f64 CPU reference.
fn extreme_magnitudes_temperature_and_identical_inputs(gpu: &dyn Engine) {
    let seed = common::seed(0x5eed_0003);
    for (i, (scale, noise, temp)) in [
        (1e4, 1e-4, 1.0), // ±1e4 logits, small mismatch
        (1e4, 1.0, 1.0),  // ±1e4 logits, huge mismatch (KL ~ 1e4)
        (1.0, 0.05, 0.7), // temperature ≠ 1
        (30.0, 0.01, 1.6),
        (1.0, 0.0, 1.0), // identical up to a constant shift
    ]
    .into_iter()
    .enumerate()
    {
        for (da, db) in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
            let s = seed + i as u64;
            let c = case(s, 7, 1000, da, db, scale, noise, 0.05);
            let what = format!("scale {scale} noise {noise} T {temp} {da:?}/{db:?} seed {s}");
            run_case(gpu, &c, temp, scale, &what);
        }
    }
    // exactly identical tensors: KL, KL_rev and TV vanish
    let c = case(seed, 5, 4099, DType::BF16, DType::BF16, 10.0, 0.1, 0.05);
    let got = gpu
        .vocab_divergence(&c.rollout, &c.rollout, Some(&c.responses), &c.mask, 1.0)
        .unwrap();
    for r in 0..c.rows {
        assert!(
            got.kl[r].abs() < 1e-7 && got.kl_rev[r].abs() < 1e-7,
            "row {r}: {got:?}"
        );
        assert!(got.tv[r].abs() < 1e-6, "row {r}: tv {}", got.tv[r]);
    }
}

#[test]
fn gpu_infinite_divergences_and_errors_match_cpu() {
    let Some(gpu) = common::gpu() else { return };
    infinite_divergences_and_errors(gpu.as_ref());
}

#[test]
fn cpu_fast_infinite_divergences_and_errors_match_cpu() {
    infinite_divergences_and_errors(&CpuEngine::fast());
}

/// `engine` (the GPU, or the CPU at the `cpu-fast` precision) against the f64 CPU reference.
fn infinite_divergences_and_errors(gpu: &dyn Engine) {
    let v = 9;
    let ninf = f32::NEG_INFINITY;
    // row 0: q = 0 where p > 0 (KL = ∞); row 1: p = 0 where q > 0 (KL_rev = ∞); row 2: sampled
    // token at p = 0 is an error on both engines (zero probability under the policy that
    // sampled it), so it samples id 1; row 3: disjoint supports (both KLs ∞, TV = 1)
    let a: Vec<f32> = [
        [0.5, 1.0, 2.0, -1.0, 0.0, 0.3, 0.2, 0.1, 3.0],
        [0.5, ninf, 2.0, -1.0, 0.0, 0.3, 0.2, 0.1, 3.0],
        [ninf, 1.0, 2.0, -1.0, 0.0, 0.3, 0.2, 0.1, 3.0],
        [0.0, 1.0, ninf, ninf, ninf, ninf, ninf, ninf, ninf],
    ]
    .concat();
    let b: Vec<f32> = [
        [0.4, 1.1, ninf, -1.0, 0.1, 0.3, 0.2, 0.1, 3.1],
        [0.5, 1.0, 2.0, -1.0, 0.0, 0.3, 0.2, 0.1, 3.0],
        [ninf, 1.0, 2.1, -1.0, 0.0, 0.3, 0.2, 0.1, 3.0],
        [ninf, ninf, 2.0, 3.0, 0.5, ninf, ninf, ninf, 1.0],
    ]
    .concat();
    let la = encode(&a, DType::F32, 4, v);
    let lb = encode(&b, DType::BF16, 4, v);
    let m = [true; 4];
    let impossible = [1i64, 2, 0, 0];
    let e_cpu = CpuEngine::new()
        .vocab_divergence(&la, &lb, Some(&impossible), &m, 1.0)
        .unwrap_err();
    let e_gpu = gpu
        .vocab_divergence(&la, &lb, Some(&impossible), &m, 1.0)
        .unwrap_err();
    assert_eq!(e_gpu, e_cpu);
    assert!(e_cpu.to_string().contains("`responses`") && e_cpu.to_string().contains("slot 2"));
    let ids = [1i64, 2, 1, 0];
    let cpu = CpuEngine::new()
        .vocab_divergence(&la, &lb, Some(&ids), &m, 1.0)
        .unwrap();
    let got = gpu.vocab_divergence(&la, &lb, Some(&ids), &m, 1.0).unwrap();
    assert_eq!(got.kl[0], f64::INFINITY);
    assert_eq!(got.kl_rev[1], f64::INFINITY);
    assert_eq!(
        (got.kl[3], got.kl_rev[3], got.tv[3]),
        (f64::INFINITY, f64::INFINITY, 1.0)
    );
    assert_eq!(got.train_logp[3], f64::NEG_INFINITY);
    compare("infinities", &got, &cpu, 1.0);
    // NaN / +inf in a valid row: the same error as the CPU path
    let mut bad = a.clone();
    bad[v + 4] = f32::NAN;
    let lbad = encode(&bad, DType::F32, 4, v);
    let e_cpu = CpuEngine::new()
        .vocab_divergence(&lbad, &lb, Some(&ids), &m, 1.0)
        .unwrap_err();
    let e_gpu = gpu
        .vocab_divergence(&lbad, &lb, Some(&ids), &m, 1.0)
        .unwrap_err();
    assert_eq!(e_gpu, e_cpu);
    // every entry −inf
    let allinf = vec![ninf; 4 * v];
    let l = encode(&allinf, DType::F16, 4, v);
    let e_cpu = CpuEngine::new()
        .vocab_divergence(&la, &l, None, &m, 1.0)
        .unwrap_err();
    let e_gpu = gpu.vocab_divergence(&la, &l, None, &m, 1.0).unwrap_err();
    assert_eq!(e_gpu, e_cpu);
    // bad temperature / out-of-range ids
    assert!(gpu.vocab_divergence(&la, &lb, None, &m, 0.0).is_err());
    assert!(gpu
        .vocab_divergence(&la, &lb, Some(&[0, 9, 0, 0]), &m, 1.0)
        .is_err());
    // no rows at all
    let e = Logits::from_bytes(Vec::new(), DType::F32, 0, v).unwrap();
    let s = gpu.vocab_divergence(&e, &e, None, &[], 1.0).unwrap();
    assert!(s.kl.is_empty());
}

#[test]
fn gpu_common_support_far_below_the_other_sides_maximum() {
    let Some(gpu) = common::gpu() else { return };
    common_support_far_below(gpu.as_ref());
}

#[test]
fn cpu_fast_common_support_far_below_the_other_sides_maximum() {
    common_support_far_below(&CpuEngine::fast());
}

/// More than half of one side's mass where the other is −∞, and the common support `gap` nats
/// below that side's maximum: the elements of the common support where `u < −30` carry the
/// whole divergence, and their weights must be taken relative to the common support's maximum
/// (relative to the row's maximum they underflow: f32 at ~90 nats, f64 at ~745). Checked
/// against the f64 reference at 1e-5 (the GPU's rounding), far inside the documented 2e-3.
fn common_support_far_below(engine: &dyn Engine) {
    let ninf = f32::NEG_INFINITY;
    for gap in [100.0f32, 1000.0] {
        let g = -gap;
        let rows: [([f32; 4], [f32; 4]); 3] = [
            ([g, 5.0, 1.0, g + 1.0], [g, ninf, 0.5, g]),
            ([g + 2.0, 0.3, g, 5.0], [g, -0.4, g, ninf]),
            // the row's maximum outside the common support
            ([g, 5.0, g + 2.0, g + 1.0], [g, ninf, 0.5, g]),
        ];
        for (a, b) in rows {
            for (x, y) in [(a, b), (b, a)] {
                let (lx, ly) = (encode(&x, DType::F32, 1, 4), encode(&y, DType::F32, 1, 4));
                let want = CpuEngine::new()
                    .vocab_divergence(&lx, &ly, None, &[true], 1.0)
                    .unwrap();
                let got = engine
                    .vocab_divergence(&lx, &ly, None, &[true], 1.0)
                    .unwrap();
                for (what, g, w) in [
                    ("kl", got.kl[0], want.kl[0]),
                    ("kl_rev", got.kl_rev[0], want.kl_rev[0]),
                ] {
                    if w.is_infinite() {
                        assert_eq!(g, w, "{x:?} {y:?} {what}");
                    } else {
                        assert!(
                            (g - w).abs() <= 1e-5 * w,
                            "{x:?} {y:?} {what}: {g} vs the reference {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn multi_chunk_runs_equal_single_chunk_runs_bit_for_bit() {
    use trmask::gpu::{ContextOptions, GpuEngine};
    let Some(gpu) = common::gpu() else { return };
    let seed = common::seed(0x5eed_0004);
    // the default engine's workgroup for rows of `v` (smaller on CPU adapters), forced on the
    // small-chunk engines so that both reduce in the same order
    let wg = |v: usize, db: DType| gpu.context().vocab_workgroup_size(db, v as u64);
    // binding limit: a handful of rows per chunk (and 1 row per chunk for the widest case)
    let small = |wg: u32, mapped: Option<bool>| {
        GpuEngine::with_options(&ContextOptions {
            max_binding_size: Some(8192),
            workgroup_size: Some(wg),
            mapped_uploads: mapped,
            ..Default::default()
        })
        .expect("another engine on the same adapter")
    };
    for (i, (v, rows, da, db)) in [
        (257usize, 40usize, DType::BF16, DType::F32),
        (7, 300, DType::F16, DType::BF16),
        (1, 200, DType::F32, DType::F16),
        (1900, 6, DType::F32, DType::F32),
    ]
    .into_iter()
    .enumerate()
    {
        let s = seed + i as u64;
        let c = case(s, rows, v, da, db, 3.0, 0.05, 0.05);
        let one = gpu
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.9)
            .unwrap();
        let many = small(wg(v, db), None)
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.9)
            .unwrap();
        assert_eq!(
            bits(&one),
            bits(&many),
            "V={v} rows={rows} {da:?}/{db:?} seed {s}"
        );
    }
    // host logits through wgpu's staging copies instead of mapped slots: the same bits
    let w = wg(257, DType::F32);
    let (small, staged) = (small(w, None), small(w, Some(false)));
    assert!(!staged.capabilities().mapped_uploads);
    let c = case(seed, 40, 257, DType::BF16, DType::F32, 3.0, 0.05, 0.05);
    let (a, b) = (
        small.vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.9),
        staged.vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.9),
    );
    assert_eq!(bits(&a.unwrap()), bits(&b.unwrap()), "mapped vs staged");
    // and the forced 1 KiB limit of the shared small-chunk engine
    if let Some(tiny) = common::gpu_small_chunks() {
        let c = case(seed, 50, 33, DType::BF16, DType::F16, 2.0, 0.1, 0.1);
        let got = tiny
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 1.0)
            .unwrap();
        let cpu = CpuEngine::new()
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 1.0)
            .unwrap();
        compare("1 KiB chunks", &got, &cpu, 1.0);
    }
}

#[test]
fn zero_copy_device_buffers_match_host_upload() {
    use wgpu::util::DeviceExt;
    let Some(gpu) = common::gpu() else { return };
    let ctx = gpu.context();
    let seed = common::seed(0x5eed_0005);
    // odd vocabulary with 16-bit rows: rows start mid-word; odd byte count padded
    let c = case(seed, 9, 4099, DType::BF16, DType::F32, 5.0, 0.02, 0.02);
    let pad = |b: &[u8]| {
        let mut v = b.to_vec();
        v.resize(v.len().div_ceil(4) * 4, 0);
        v
    };
    let mk = |b: &[u8]| {
        ctx.device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("test logits"),
                contents: &pad(b),
                usage: wgpu::BufferUsages::STORAGE,
            })
    };
    let (ba, bb) = (mk(c.rollout.bytes()), mk(c.train.bytes()));
    let da = Logits::device(ba, 0, DType::BF16, c.rows, c.vocab).unwrap();
    let db = Logits::device(bb, 0, DType::F32, c.rows, c.vocab).unwrap();
    let dev = gpu
        .vocab_divergence(&da, &db, Some(&c.responses), &c.mask, 1.0)
        .unwrap();
    // the CPU engine has no access to device memory: a clear error naming the tensor
    let err = CpuEngine::new()
        .vocab_divergence(&da, &db, Some(&c.responses), &c.mask, 1.0)
        .unwrap_err();
    assert!(err.to_string().contains("rollout_logits"), "{err}");
    let host = gpu
        .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 1.0)
        .unwrap();
    assert_eq!(bits(&dev), bits(&host));
}

#[test]
fn gpu_more_rows_than_one_dispatch_dimension_and_odd_workgroup() {
    use trmask::gpu::{ContextOptions, GpuEngine};
    if common::gpu().is_none() {
        return;
    }
    let seed = common::seed(0x5eed_0006);
    // 66,000 rows > 65,535 workgroups per dimension: a 2-D grid (small workgroups: lavapipe
    // runs every invocation on 2 cores)
    let small_wg = GpuEngine::with_options(&ContextOptions {
        workgroup_size: Some(64),
        ..Default::default()
    })
    .expect("engine with workgroup 64");
    let c = case(seed, 66_000, 1, DType::F16, DType::F32, 2.0, 0.1, 0.0);
    run_case(&small_wg, &c, 1.0, 1.0, &format!("66000 rows seed {seed}"));
    // a non-power-of-two workgroup (192) reduces with the same tree code
    let odd = GpuEngine::with_options(&ContextOptions {
        workgroup_size: Some(192),
        ..Default::default()
    })
    .expect("engine with workgroup 192");
    let c = case(seed + 1, 9, 30522, DType::BF16, DType::F32, 3.0, 0.02, 0.01);
    run_case(&odd, &c, 1.0, 1.0, &format!("wg 192 seed {}", seed + 1));
}

/// The `cpu-fast` precision keeps the rule of docs/FORMAT.md (Accuracy): a KL of 1e-7 stays resolvable (to
/// 2e-3 relative, not just under the 1e-7 absolute tolerance) next to logits of magnitude
/// 100 (f32 inputs; bf16 / f16 inputs at their own spacing), at τ ≠ 1 too; rows with −∞ entries take the f64 path and equal
/// the reference to the bit.
#[test]
fn cpu_fast_resolves_a_1e_7_kl_next_to_logits_of_100() {
    let mut rng = Rng::new(common::seed(0x5eed_0005));
    let (rows, v) = (4, 32_000);
    for dt in DTYPES {
        for temperature in [1.0, 0.7] {
            let mut a = vec![0f32; rows * v];
            let mut b = vec![0f32; rows * v];
            for k in 0..rows * v {
                a[k] = (100.0 + 3.0 * normal(&mut rng)) as f32;
                b[k] = a[k];
            }
            // f32: a 5e-4 mismatch on every column; bf16 / f16: one unit in the last place on
            // every 97th column (exact once encoded)
            let la = encode(&a, dt, rows, v);
            let (step, stride) = match dt {
                DType::F32 => (5e-4, 1),
                _ => (0.0, 97),
            };
            for r in 0..rows {
                for i in (0..v).step_by(stride) {
                    let k = r * v + i;
                    let x = la.dtype().decode(la.row_bytes(r), i) as f64;
                    b[k] = if step > 0.0 {
                        (x + step * normal(&mut rng)) as f32
                    } else {
                        // the next representable value (bf16/f16 spacing at |x| ≤ 400)
                        let e = half_ulp(dt, x as f32);
                        (x + e) as f32
                    };
                }
            }
            let lb = encode(&b, dt, rows, v);
            let mask = vec![true; rows];
            let want = CpuEngine::new()
                .vocab_divergence(&la, &lb, None, &mask, temperature)
                .unwrap();
            let got = CpuEngine::fast()
                .vocab_divergence(&la, &lb, None, &mask, temperature)
                .unwrap();
            for r in 0..rows {
                let (g, w) = (got.kl[r], want.kl[r]);
                // f32: KL ≈ 1e-7; bf16 / f16: their spacing at 100 (0.5, 0.0625) sets it
                let hi = if dt == DType::F32 { 1e-6 } else { 1e-2 };
                assert!(
                    w > 1e-8 && w < hi,
                    "{dt:?} τ {temperature} row {r}: kl {w:e}"
                );
                assert!(
                    (g - w).abs() <= 2e-3 * w,
                    "{dt:?} τ {temperature} row {r}: cpu-fast kl {g:e} vs {w:e}"
                );
                let (g, w) = (got.kl_rev[r], want.kl_rev[r]);
                assert!(
                    (g - w).abs() <= 2e-3 * w,
                    "{dt:?} τ {temperature} row {r}: cpu-fast kl_rev {g:e} vs {w:e}"
                );
                assert!(g != w || got.tv[r] != want.tv[r], "the f32 path ran");
            }
            // −∞ entries: the f64 path, bit for bit
            let mut ai = a.clone();
            ai[3] = f32::NEG_INFINITY;
            let lai = encode(&ai, dt, rows, v);
            let want = CpuEngine::new()
                .vocab_divergence(&lai, &lb, None, &mask, temperature)
                .unwrap();
            let got = CpuEngine::fast()
                .vocab_divergence(&lai, &lb, None, &mask, temperature)
                .unwrap();
            assert_eq!(got.kl[0].to_bits(), want.kl[0].to_bits());
            assert_eq!(got.tv[0].to_bits(), want.tv[0].to_bits());
            assert_eq!(
                got.rollout_entropy[0].to_bits(),
                want.rollout_entropy[0].to_bits()
            );
        }
    }
}

/// The spacing of `dt` at `x` (one unit in the last place; bf16 and f16 only).
fn half_ulp(dt: DType, x: f32) -> f64 {
    let (mant, min_exp) = match dt {
        DType::BF16 => (7, -126),
        _ => (10, -14),
    };
    let e = (x.abs().log2().floor() as i32).max(min_exp);
    2f64.powi(e - mant)
}

/// Each of the kernel's row paths — pass 1's plain and masked loops, pass 2's lean loop, its
/// general loop, and the third read — is taken by some rows here (counted by
/// `Context::last_vocab_passes`) and every one matches the f64 reference at the GPU tolerance:
/// near rows, rows whose mismatch puts many elements past the lean loop's series (|u| > ½),
/// rows far apart (large λ0: the general loop), logits of 1e4, temperature ≠ 1, −inf entries
/// (every row that holds one takes the masked pass 1, no other row does).
#[test]
fn gpu_lean_general_and_third_pass_rows_match_the_reference() {
    let Some(gpu) = common::gpu() else { return };
    // the default engine keeps rows of 3001 on-chip (one read whatever the passes); eight
    // threads per workgroup cannot (8 · 8 · ONCHIP_OCTS < 3001), so every pass reads the row
    let streamed = trmask::gpu::GpuEngine::with_options(&trmask::gpu::ContextOptions {
        workgroup_size: Some(8),
        ..Default::default()
    })
    .expect("another engine on the same adapter");
    for (engine, on_chip) in [(gpu.as_ref(), true), (&streamed, false)] {
        lean_general_and_third_pass_rows(engine, on_chip);
    }
}

fn lean_general_and_third_pass_rows(gpu: &trmask::gpu::GpuEngine, on_chip: bool) {
    let seed = common::seed(0x5eed_0017);
    let mut total = trmask::gpu::VocabPasses::default();
    for (i, (scale, noise, temp, neg_inf, want_lean)) in [
        (4.0, 0.01, 1.0, 0.01, Some(true)), // near rows: all lean
        (1.0, 0.4, 1.0, 0.0, None),         // |u| > ½ for many elements
        (1.0, 0.4, 0.7, 0.05, None),
        (3.0, 1.5, 1.0, 0.0, Some(false)), // far apart: |λ0| > ¼
        (1e4, 1e-4, 1.0, 0.05, None),
        (1e4, 1.0, 1.0, 0.0, None), // lean only where both argmaxes coincide
        (1.0, 0.0, 1.0, 0.02, Some(true)), // identical up to a shift
    ]
    .into_iter()
    .enumerate()
    {
        let s = seed + i as u64;
        let c = case(s, 24, 3001, DType::BF16, DType::F32, scale, noise, neg_inf);
        let what = format!("scale {scale} noise {noise} T {temp} -inf {neg_inf} seed {s}");
        run_case(gpu, &c, temp, scale, &what);
        let p = gpu.context().last_vocab_passes().expect("counted");
        let valid = c.mask.iter().filter(|&&m| m).count() as u64;
        assert_eq!(p.rows, valid, "{what}: {p:?}");
        println!("{what}: {p:?}");
        match want_lean {
            Some(true) => assert_eq!(p.lean_rows, p.rows, "{what}: {p:?}"),
            Some(false) => assert_eq!(p.lean_rows, 0, "{what}: {p:?}"),
            None => {}
        }
        let with_neg_inf = (0..c.mask.len())
            .filter(|&r| c.mask[r])
            .filter(|&r| {
                let (mut x, mut y) = (vec![0.0; c.vocab], vec![0.0; c.vocab]);
                c.rollout.row_f64(r, &mut x);
                c.train.row_f64(r, &mut y);
                x.iter().chain(&y).any(|v| v.is_infinite())
            })
            .count() as u64;
        assert_eq!(p.masked_pass1_rows, with_neg_inf, "{what}: {p:?}");
        assert_eq!(p.on_chip_rows, if on_chip { p.rows } else { 0 }, "{p:?}");
        check_reads(&p);
        total.rows += p.rows;
        total.lean_rows += p.lean_rows;
        total.masked_pass1_rows += p.masked_pass1_rows;
        total.third_pass_rows += p.third_pass_rows;
        total.row_reads += p.row_reads;
    }
    // p's mass outside q's support, its common support 200 nats down: that mass underflows in
    // pass 1, so the row is read a third time (deterministically, whatever the seed)
    let ninf = f32::NEG_INFINITY;
    let (x, y) = ([0.0f32, -200.0, -201.0, -199.5], [ninf, 0.0, 0.5, 1.0]);
    let (lx, ly) = (encode(&x, DType::F32, 1, 4), encode(&y, DType::F32, 1, 4));
    let want = CpuEngine::new()
        .vocab_divergence(&lx, &ly, Some(&[2]), &[true], 1.0)
        .unwrap();
    let got = gpu
        .vocab_divergence(&lx, &ly, Some(&[2]), &[true], 1.0)
        .unwrap();
    compare("common support underflowing", &got, &want, 1.0);
    let p = gpu.context().last_vocab_passes().expect("counted");
    assert_eq!((p.third_pass_rows, p.masked_pass1_rows), (1, 1), "{p:?}");
    total.rows += p.rows;
    total.masked_pass1_rows += p.masked_pass1_rows;
    total.third_pass_rows += p.third_pass_rows;
    total.row_reads += p.row_reads;
    assert!(
        total.lean_rows > 0
            && total.lean_rows < total.rows
            && total.third_pass_rows > 0
            && total.masked_pass1_rows > 0
            && total.masked_pass1_rows < total.rows,
        "every path taken: {total:?}"
    );
    check_reads(&p); // four elements: on-chip on both engines
    assert_eq!(p.on_chip_rows, 1, "{p:?}");
    let r = total.reads_per_logit();
    assert!(if on_chip { r == 1.0 } else { r > 2.0 }, "{total:?}");
}

/// Reads counted from each row's flags: one per row kept on-chip, else one per pass (calls
/// whose rows all took the same path).
fn check_reads(p: &trmask::gpu::VocabPasses) {
    let want = match p.on_chip_rows {
        0 => 2 * p.rows + p.masked_pass1_rows + p.third_pass_rows,
        n if n == p.rows => p.rows,
        _ => panic!("mixed paths in one call: {p:?}"),
    } as f64;
    assert_eq!(p.row_reads, want, "{p:?}");
}

#[test]
fn wide_and_narrow_loads_give_the_same_bits() {
    use trmask::gpu::pipeline::Op;
    use wgpu::util::DeviceExt;
    if common::gpu().is_none() {
        return;
    }
    // an engine of its own: its cache shows which variants this test's calls built
    let gpu = trmask::gpu::GpuEngine::new().unwrap();
    let ctx = gpu.context();
    let seed = common::seed(0x5eed_0006);
    let wide_built = |da: DType, db: DType, wide: bool| {
        ctx.built_kernels()
            .iter()
            .any(|k| k.op == Op::VocabDivergence(db) && k.dtype == da && k.variant == wide)
    };
    // a vocabulary that is a multiple of 8: host rows start on 16-byte boundaries (eight
    // logits per vec4<u32> load, the WIDE variant); the same rows one element into a device
    // buffer do not (read one by one). Same workgroup, same order: the same bits.
    for (i, (da, db)) in [(DType::BF16, DType::BF16), (DType::F16, DType::F32)]
        .into_iter()
        .enumerate()
    {
        let c = case(seed + i as u64, 12, 1000, da, db, 4.0, 0.03, 0.03);
        let mk = |b: &[u8], esize: usize| {
            let mut v = vec![0u8; esize];
            v.extend_from_slice(b);
            v.resize(v.len().div_ceil(4) * 4, 0);
            ctx.device()
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("test logits"),
                    contents: &v,
                    usage: wgpu::BufferUsages::STORAGE,
                })
        };
        let (sa, sb) = (da.size(), db.size());
        let la = Logits::device(mk(c.rollout.bytes(), sa), sa as u64, da, c.rows, c.vocab).unwrap();
        let lb = Logits::device(mk(c.train.bytes(), sb), sb as u64, db, c.rows, c.vocab).unwrap();
        let narrow = gpu
            .vocab_divergence(&la, &lb, Some(&c.responses), &c.mask, 0.8)
            .unwrap();
        assert!(wide_built(da, db, false), "{da:?}/{db:?}: narrow variant");
        assert!(
            !wide_built(da, db, true),
            "{da:?}/{db:?}: no wide variant yet"
        );
        let wide = gpu
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.8)
            .unwrap();
        assert!(wide_built(da, db, true), "{da:?}/{db:?}: wide variant");
        assert_eq!(bits(&narrow), bits(&wide), "{da:?}/{db:?}");
        let cpu = CpuEngine::new()
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.8)
            .unwrap();
        compare("wide loads", &wide, &cpu, 0.8);
    }
}

// ---------------------------------------------------------------------------------------------
// Host logits in chunks (`ContextOptions::host_chunk_bytes`): mapped slots and staging buffers

/// An engine with host chunks of `chunk` bytes (`None`: the default 64 MiB) and mapped slots
/// forced on or off (`None`: the adapter's choice; lavapipe maps them).
fn chunked(chunk: Option<u64>, mapped: Option<bool>) -> trmask::gpu::GpuEngine {
    trmask::gpu::GpuEngine::with_options(&trmask::gpu::ContextOptions {
        host_chunk_bytes: chunk,
        mapped_uploads: mapped,
        ..Default::default()
    })
    .expect("another engine on the same adapter")
}

/// Rows straddling chunk ends (and the 4-byte words of 16-bit logits), one row larger than a
/// chunk, V = 1 and many tiny rows: every chunking gives the one-chunk call's bits (same
/// kernel config), through mapped slots and through staging buffers alike, one submission per
/// chunk, and matches the f64 reference.
#[test]
fn host_chunk_boundaries_match_the_reference_and_one_chunk_bit_for_bit() {
    if common::gpu().is_none() {
        return;
    }
    let seed = common::seed(0x5eed_0029);
    let whole_engine = chunked(None, None);
    for (i, &(rows, vocab, da, db, chunk, what)) in [
        (
            60,
            37,
            DType::BF16,
            DType::F32,
            1100,
            "7 rows of 74 / 148 bytes per chunk",
        ),
        (
            3,
            5000,
            DType::F32,
            DType::BF16,
            4096,
            "one row larger than a chunk",
        ),
        (40, 1, DType::BF16, DType::F16, 256, "V = 1"),
        (3000, 3, DType::BF16, DType::BF16, 4096, "many tiny rows"),
        (
            20,
            4099,
            DType::F16,
            DType::F32,
            20_000,
            "rows of 8198 / 16396 bytes",
        ),
    ]
    .iter()
    .enumerate()
    {
        let s = seed + i as u64;
        let c = case(s, rows, vocab, da, db, 1.0, 0.1, 0.02);
        let what = format!("{what}: {rows} x {vocab} {da:?}/{db:?}, chunks of {chunk} B, seed {s}");
        let before = whole_engine.context().submissions();
        let whole = whole_engine
            .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.7)
            .unwrap_or_else(|e| panic!("{what}: one chunk: {e}"));
        assert_eq!(whole_engine.context().submissions() - before, 1, "{what}");
        for mapped in [None, Some(false)] {
            let e = chunked(Some(chunk), mapped);
            let before = e.context().submissions();
            let got = e
                .vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 0.7)
                .unwrap_or_else(|err| panic!("{what}: mapped {mapped:?}: {err}"));
            let subs = e.context().submissions() - before;
            assert!(subs > 1, "{what}: {subs} submissions");
            assert_eq!(bits(&got), bits(&whole), "{what}: mapped {mapped:?}");
            run_case(&e, &c, 0.7, 1.0, &what);
        }
    }
}

/// Chunks large enough to be filled by several threads (≥ 4 MiB): a pool of one thread and a
/// pool of four give the same bits as the one-chunk call, mapped or staged.
#[test]
fn host_chunks_filled_by_several_threads_give_the_same_bits() {
    if common::gpu().is_none() {
        return;
    }
    let s = common::seed(0x5eed_0030);
    let c = case(s, 64, 32_768, DType::F32, DType::BF16, 2.0, 0.05, 0.0);
    let call = |e: &trmask::gpu::GpuEngine| {
        e.vocab_divergence(&c.rollout, &c.train, Some(&c.responses), &c.mask, 1.0)
            .unwrap()
    };
    let whole = bits(&call(&chunked(Some(64 << 20), None)));
    for mapped in [None, Some(false)] {
        // 6 MiB chunks: 48 rows of 128 KiB f32, then 16
        let e = chunked(Some(6 << 20), mapped);
        for threads in [1, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let got = pool.install(|| call(&e));
            assert_eq!(
                bits(&got),
                whole,
                "mapped {mapped:?}, {threads} threads, seed {s}"
            );
        }
    }
    run_case(
        &chunked(Some(6 << 20), Some(false)),
        &c,
        1.0,
        2.0,
        "staged, 6 MiB chunks",
    );
}
