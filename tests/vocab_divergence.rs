//! Exact vocabulary divergences: CPU reference vs float64 references on real logits, GPU vs
//! those references and vs the CPU on random batches.

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

fn fields(s: &VocabStats) -> [(&'static str, &[f64]); 7] {
    [
        ("kl_rollout_trainer", &s.kl),
        ("kl_trainer_rollout", &s.kl_rev),
        ("tv", &s.tv),
        ("entropy_rollout", &s.rollout_entropy),
        ("entropy_trainer", &s.training_entropy),
        ("logp_rollout_sampled", &s.rollout_logp),
        ("logp_trainer_sampled", &s.train_logp),
    ]
}

/// Checks `got` against the real-small references; returns the worst relative error per field.
/// `tol(field) = (rtol, atol)`.
fn check_real(
    who: &str,
    engine: &dyn Engine,
    data: &Real,
    tol: impl Fn(&str) -> (f64, f64),
) -> Vec<(String, f64)> {
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
            let mut w = 0.0f64;
            for (i, (&g, &r)) in vals.iter().zip(want).enumerate() {
                let err = (g - r).abs();
                assert!(
                    err <= rtol * r.abs() + atol,
                    "{who} {pre}{field}[{i}]: got {g:e}, reference {r:e} (err {err:e})"
                );
                if r != 0.0 {
                    w = w.max(err / r.abs());
                }
            }
            worst.push((format!("{pre}{field}"), w));
        }
    }
    worst
}

#[test]
fn cpu_matches_float64_references() {
    let data = real();
    let worst = check_real("cpu", &CpuEngine::new(), &data, |_| (1e-9, 1e-13));
    for (f, w) in worst {
        println!("cpu {f}: max rel err {w:.3e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Random batches

/// splitmix64: a seeded in-test PRNG (seed printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unif(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unif().max(1e-300), self.unif());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Encodes f32 values in `dtype` (rounding to nearest).
fn encode(values: &[f32], dtype: DType, rows: usize, vocab: usize) -> Logits {
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
struct Case {
    rows: usize,
    vocab: usize,
    rollout: Logits,
    train: Logits,
    responses: Vec<i64>,
    mask: Vec<bool>,
}

#[allow(clippy::too_many_arguments)]
fn case(
    seed: u64,
    rows: usize,
    vocab: usize,
    da: DType,
    db: DType,
    scale: f64,
    noise: f64,
    neg_inf: f64,
) -> Case {
    let mut rng = Rng(seed);
    let n = rows * vocab;
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    let mut mask = vec![true; rows];
    for r in 0..rows {
        // every 5th row masked (not when there is a single row)
        let masked = rows > 1 && r % 5 == 3;
        mask[r] = !masked;
        let sharp = 0.5 + 3.0 * rng.unif();
        for i in 0..vocab {
            let k = r * vocab + i;
            if masked {
                a[k] = f32::NAN;
                b[k] = if i % 2 == 0 { f32::INFINITY } else { f32::NAN };
                continue;
            }
            let x = rng.normal() * sharp;
            a[k] = (x * scale) as f32;
            b[k] = ((x + noise * rng.normal()) * scale + 0.37 * scale) as f32;
            if vocab > 1 && rng.unif() < neg_inf && i != r % vocab {
                a[k] = f32::NEG_INFINITY;
                if rng.unif() < 0.7 {
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
        _ => (1e-5, 1e-5), // log-probs
    }
}

/// Compares two results field by field (`±inf` must match exactly), reporting the worst index.
/// `scale` multiplies the absolute tolerance (inputs of magnitude `scale`).
fn compare(what: &str, got: &VocabStats, want: &VocabStats, scale: f64) {
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
                "{what} {field}[{i}]: gpu {:e} vs cpu {:e} (rtol {rtol:e}, atol {atol:e})",
                g[i],
                w[i]
            );
        }
    }
}
