//! The vocabulary kernel's accuracy on real logits against the float64 references, for every
//! kernel variant a context can pick (workgroup sizes; wide loads on the 8192-vocabulary
//! causal sample, one-by-one loads on real-small's 30,522), and its determinism: a pinned
//! config gives the same bits run to run and engine to engine.
//!
//! The rule: entropies within `1e-4·|ref| + 1e-6`, sampled-token log-probs within
//! `1e-4·|ref| + 2e-6`, KL / KL_rev / TV within `2e-3·|ref| + 1e-7`.

use crate::common;
use common::{vocab_bits as bits, vocab_fields as fields};

use safetensors::SafeTensors;
use trmask::gpu::{ContextOptions, GpuEngine};
use trmask::{DType, Engine, Logits, VocabStats};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `(rtol, atol)` per result field.
fn tol(field: &str) -> (f64, f64) {
    match field {
        "kl_rollout_trainer" | "kl_trainer_rollout" | "tv" => (2e-3, 1e-7),
        "entropy_rollout" | "entropy_trainer" => (1e-4, 1e-6),
        _ => (1e-4, 2e-6),
    }
}

fn tensor_bytes(st: &SafeTensors, name: &str) -> (Vec<u8>, Vec<usize>) {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    (t.data().to_vec(), t.shape().to_vec())
}

fn logits(st: &SafeTensors, name: &str, dtype: DType) -> Logits {
    let (b, shape) = tensor_bytes(st, name);
    Logits::from_bytes(b, dtype, shape[0], shape[1]).unwrap()
}

fn i32s(st: &SafeTensors, name: &str) -> Vec<i64> {
    let (b, _) = tensor_bytes(st, name);
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
        .collect()
}

fn f64s(st: &SafeTensors, name: &str) -> Vec<f64> {
    let (b, _) = tensor_bytes(st, name);
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// One real data set: both logits tensors, the sampled ids, the references per field.
struct Set {
    name: String,
    rollout: Logits,
    train: Logits,
    ids: Vec<i64>,
    refs: Vec<Vec<f64>>,
}

fn sets() -> Vec<Set> {
    let read = |p: &str| std::fs::read(format!("{ROOT}/data/{p}")).unwrap();
    let mut out = Vec::new();
    let (lb, rb) = (
        read("real-small/logits.safetensors"),
        read("real-small/reference.safetensors"),
    );
    let (l, r) = (
        SafeTensors::deserialize(&lb).unwrap(),
        SafeTensors::deserialize(&rb).unwrap(),
    );
    for (pre, roll, dt, ids) in [
        ("bf16.", "rollout_logits", DType::BF16, "sampled_ids"),
        (
            "fp16.",
            "rollout_fp16_logits",
            DType::F16,
            "sampled_ids_fp16",
        ),
    ] {
        out.push(Set {
            name: format!("real-small {pre}"),
            rollout: logits(&l, roll, dt),
            train: logits(&l, "trainer_logits", DType::F32),
            ids: i32s(&l, ids),
            refs: fields(&VocabStats::default())
                .iter()
                .map(|(f, _)| f64s(&r, &format!("{pre}{f}")))
                .collect(),
        });
    }
    let (lb, rb) = (
        read("causal-sample/logits.safetensors"),
        read("causal-sample/reference.safetensors"),
    );
    let (l, r) = (
        SafeTensors::deserialize(&lb).unwrap(),
        SafeTensors::deserialize(&rb).unwrap(),
    );
    out.push(Set {
        name: "causal-sample".into(),
        rollout: logits(&l, "rollout_logits", DType::BF16),
        train: logits(&l, "old_logits", DType::F32),
        ids: i32s(&l, "responses"),
        refs: fields(&VocabStats::default())
            .iter()
            .map(|(f, _)| f64s(&r, f))
            .collect(),
    });
    out
}

/// The worst `|got − ref| / (rtol·|ref| + atol)` over every field of `got` (≤ 1: within).
fn worst_ratio(set: &Set, got: &VocabStats) -> (f64, String) {
    let mut worst = (0.0f64, String::new());
    for ((field, vals), want) in fields(got).iter().zip(&set.refs) {
        assert_eq!(vals.len(), want.len(), "{} {field}", set.name);
        let (rtol, atol) = tol(field);
        for (i, (&g, &w)) in vals.iter().zip(want).enumerate() {
            let ratio = (g - w).abs() / (rtol * w.abs() + atol);
            assert!(!ratio.is_nan(), "{} {field}[{i}]: {g} vs {w}", set.name);
            if ratio > worst.0 {
                worst = (ratio, format!("{field}[{i}]: got {g:e}, reference {w:e}"));
            }
        }
    }
    worst
}

fn run(engine: &GpuEngine, s: &Set) -> VocabStats {
    let mask = vec![true; s.rollout.rows()];
    engine
        .vocab_divergence(&s.rollout, &s.train, Some(&s.ids), &mask, 1.0)
        .unwrap_or_else(|e| panic!("{}: {e}", s.name))
}

#[test]
fn every_workgroup_size_meets_the_accuracy_rule_on_real_logits() {
    let Some(default) = common::gpu() else { return };
    let sets = sets();
    let mut engines: Vec<(String, std::sync::Arc<GpuEngine>)> = vec![("default".into(), default)];
    for wg in [32u32, 64, 128, 256] {
        let opts = ContextOptions {
            workgroup_size: Some(wg),
            ..Default::default()
        };
        engines.push((
            format!("workgroup {wg}"),
            GpuEngine::with_options(&opts).unwrap().into(),
        ));
    }
    for (what, e) in &engines {
        for s in &sets {
            let (r, at) = worst_ratio(s, &run(e, s));
            println!("{what} {}: worst tolerance ratio {r:.3} ({at})", s.name);
            assert!(r <= 1.0, "{what} {}: {at} (ratio {r})", s.name);
        }
    }
}

#[test]
fn a_pinned_config_gives_the_same_bits_run_to_run_and_engine_to_engine() {
    let Some(_) = common::gpu() else { return };
    let opts = ContextOptions {
        workgroup_size: Some(64),
        ..Default::default()
    };
    let (a, b) = (
        GpuEngine::with_options(&opts).unwrap(),
        GpuEngine::with_options(&opts).unwrap(),
    );
    for s in sets() {
        let first = bits(&run(&a, &s));
        assert_eq!(first, bits(&run(&a, &s)), "{}: run to run", s.name);
        assert_eq!(first, bits(&run(&b, &s)), "{}: engine to engine", s.name);
    }
}

#[test]
fn every_kernel_configuration_meets_the_accuracy_rule_on_real_logits() {
    use trmask::gpu::{vocab_divergence_with, VocabVariant};
    let Some(gpu) = common::gpu() else { return };
    let ctx = gpu.context();
    for s in sets() {
        let (rows, vocab) = (s.rollout.rows() as u64, s.rollout.vocab() as u64);
        let mut variants = Vec::new();
        let short = [(64, 1024), (256, 4096), (32, 0)].map(|(workgroup, slice)| VocabVariant {
            workgroup,
            slice,
            masked_first: false,
            ..VocabVariant::default()
        });
        // subgroup trees, and one subgroup per row (several rows per workgroup), where usable
        let lanes = ctx.vocab_subgroup_lanes();
        let sg = lanes.into_iter().flat_map(|l| {
            [(64.max(l), 1024, 1), (l, 0, 1), (l, 0, 256 / l)].map(|(workgroup, slice, rows)| {
                VocabVariant {
                    workgroup,
                    slice,
                    subgroups: true,
                    rows,
                    ..VocabVariant::default()
                }
            })
        });
        for v in ctx
            .vocab_variants(s.train.dtype(), rows, vocab)
            .into_iter()
            .chain(short)
            .chain(sg)
        {
            for masked_first in [false, true] {
                let v = VocabVariant { masked_first, ..v };
                if !variants.contains(&v) {
                    variants.push(v);
                }
            }
        }
        let mask = vec![true; s.rollout.rows()];
        for v in variants {
            let got =
                vocab_divergence_with(ctx, &s.rollout, &s.train, Some(&s.ids), &mask, 1.0, Some(v))
                    .unwrap_or_else(|e| panic!("{} {}: {e}", s.name, v.label()));
            let (r, at) = worst_ratio(&s, &got);
            println!(
                "{} {}: worst tolerance ratio {r:.3} ({at})",
                v.label(),
                s.name
            );
            assert!(r <= 1.0, "{} {}: {at} (ratio {r})", v.label(), s.name);
        }
    }
}
