//! Shared test helpers: a seeded PRNG and the "open a GPU engine or skip" helper.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use trmask::gpu::{ContextOptions, GpuEngine};

/// SplitMix64: tiny, seedable, good enough for test inputs.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.f64()
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn bool(&mut self, p_true: f64) -> bool {
        self.f64() < p_true
    }
}

/// The seed for a test: `TRMASK_SEED` if set, else a fixed default.
pub fn seed(default: u64) -> u64 {
    std::env::var("TRMASK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn require_gpu() -> bool {
    std::env::var("TRMASK_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn open(options: &ContextOptions, what: &str) -> Option<Arc<GpuEngine>> {
    match GpuEngine::with_options(options) {
        Ok(e) => Some(Arc::new(e)),
        Err(e) => {
            if require_gpu() {
                panic!("TRMASK_REQUIRE_GPU=1 but no GPU engine ({what}): {e}");
            }
            eprintln!("skipping GPU test: no adapter ({e})");
            None
        }
    }
}

/// One GPU engine per test binary (shared across test threads), or `None` (skip) when there is
/// no adapter — unless `TRMASK_REQUIRE_GPU=1`, then panic.
pub fn gpu() -> Option<Arc<GpuEngine>> {
    static ENGINE: OnceLock<Option<Arc<GpuEngine>>> = OnceLock::new();
    ENGINE
        .get_or_init(|| open(&ContextOptions::default(), "default"))
        .clone()
}

/// A second engine whose binding limit is forced to `bytes`, so that work splits into chunks.
pub fn gpu_small_chunks() -> Option<Arc<GpuEngine>> {
    static ENGINE: OnceLock<Option<Arc<GpuEngine>>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            open(
                &ContextOptions {
                    max_binding_size: Some(1024),
                    workgroup_size: Some(64),
                    ..Default::default()
                },
                "small chunks",
            )
        })
        .clone()
}

/// An engine with the reduction flavour forced to `flavour` and `workgroup` threads per
/// workgroup (a fresh device per call).
pub fn gpu_with_flavour(
    flavour: trmask::gpu::pipeline::Flavour,
    workgroup: Option<u32>,
) -> Option<Arc<GpuEngine>> {
    open(
        &ContextOptions {
            flavour: Some(flavour),
            workgroup_size: workgroup,
            ..Default::default()
        },
        "forced flavour",
    )
}

/// `|got − want| ≤ rtol·|want| + atol`.
pub fn close(got: f64, want: f64, rtol: f64, atol: f64) -> bool {
    (got - want).abs() <= rtol * want.abs() + atol
}

/// Compares two vectors with `|a − b| ≤ rtol·|b| + atol` (`b` the reference); panics naming the
/// worst index and the seed.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64, seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: length (seed {seed})");
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rtol * w.abs() + atol;
        let err = (g - w).abs();
        // equal values (±inf included) and NaN against NaN pass; any other NaN fails
        let excess = if g == w || (g.is_nan() && w.is_nan()) {
            0.0
        } else if err.is_nan() {
            f64::INFINITY
        } else {
            err / tol
        };
        if excess > 1.0 && worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((i, excess));
        }
    }
    if let Some((i, e)) = worst {
        panic!(
            "{what}: index {i}: gpu {} vs cpu {} (error {:.3}× tolerance; seed {seed})",
            got[i], want[i], e
        );
    }
}

/// The `trmask` binary, run from the crate root.
pub fn trmask_bin() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_trmask"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// A per-process scratch file `name` under a directory named after `tag`.
pub fn scratch(tag: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("trmask-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Runs `trmask ARGS`: (exit code, stdout, stderr).
pub fn run_trmask(args: &[&str]) -> (i32, String, String) {
    let out = trmask_bin().args(args).output().expect("run trmask");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Reads a JSON file.
pub fn load_json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A JSON number, or one of the strings `"NaN"`, `"Infinity"`, `"-Infinity"`.
pub fn json_num(v: &serde_json::Value) -> f64 {
    match v {
        serde_json::Value::Number(n) => n.as_f64().unwrap(),
        serde_json::Value::String(s) if s == "NaN" => f64::NAN,
        serde_json::Value::String(s) if s == "Infinity" => f64::INFINITY,
        serde_json::Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
        other => panic!("not a number: {other}"),
    }
}

/// The numbers of a (nested) JSON array, row-major.
pub fn json_flatten(v: &serde_json::Value) -> Vec<f64> {
    fn go(v: &serde_json::Value, out: &mut Vec<f64>) {
        match v {
            serde_json::Value::Array(a) => a.iter().for_each(|x| go(x, out)),
            x => out.push(json_num(x)),
        }
    }
    let mut out = Vec::new();
    go(v, &mut out);
    out
}

/// Batch metrics a data-parallel merge must reproduce exactly: counts, extrema, fractions of
/// counts, gathered quantiles and what is computed from those alone (issue 12).
pub fn exact_metric(name: &str) -> bool {
    let ends = [
        "_max",
        "_min",
        "_max_deviation",
        "fraction",
        "fraction_high",
        "fraction_low",
        "_p50",
        "_p90",
        "_less_01",
        "_less_05",
    ];
    let has = [
        "trmask/reject_rate",
        "trmask/bound_",
        "trmask/group_",
        "trmask/num_groups",
        "seq_len_",
        "_frac_above_",
    ];
    ends.iter().any(|k| name.ends_with(k)) || has.iter().any(|k| name.contains(k))
}

/// Bitwise-equal values (NaN equals NaN).
pub fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Equal to 1e-12 relative.
pub fn close12(a: f64, b: f64) -> bool {
    same(a, b) || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// A vocabulary result's seven per-row fields, named as the references name them.
pub fn vocab_fields(s: &trmask::VocabStats) -> [(&'static str, &[f64]); 7] {
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

/// Every field's bits, in `vocab_fields` order (for bit-identity checks).
pub fn vocab_bits(s: &trmask::VocabStats) -> Vec<u64> {
    vocab_fields(s)
        .iter()
        .flat_map(|(_, v)| v.iter().map(|x| x.to_bits()))
        .collect()
}

/// A packed golden batch (`data/<name>/golden.json`: per-sequence `lengths`, flat
/// `rollout_log_prob`, `old_log_prob`, `advantages`), as the OPSM, M2PO and CPPO goldens store
/// it; `v` is the whole file (cases, expected masks).
pub struct PackedGolden {
    pub v: serde_json::Value,
    pub cu: Vec<i64>,
    pub roll: Vec<f64>,
    pub old: Vec<f64>,
    pub adv: Vec<f64>,
}

impl PackedGolden {
    /// Reads `data/<name>/golden.json` of the repository.
    pub fn load(name: &str) -> Self {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(name)
            .join("golden.json");
        let v = load_json(&path);
        let mut cu = vec![0i64];
        for l in json_flatten(&v["lengths"]) {
            cu.push(cu.last().unwrap() + l as i64);
        }
        PackedGolden {
            roll: json_flatten(&v["rollout_log_prob"]),
            old: json_flatten(&v["old_log_prob"]),
            adv: json_flatten(&v["advantages"]),
            cu,
            v,
        }
    }
}

/// The CPU reference, and the GPU engine where an adapter exists.
pub fn engines() -> Vec<Arc<dyn trmask::Engine>> {
    let mut e: Vec<Arc<dyn trmask::Engine>> = vec![Arc::new(trmask::cpu::CpuEngine::new())];
    if let Some(g) = gpu() {
        e.push(g);
    }
    e
}

/// An in-process all-gather between `size` threads (the collective pattern of MPI): each
/// rank's [`Rank`] writes its bytes, waits for the others, reads everyone's.
pub struct Hub {
    pub slots: std::sync::Mutex<Vec<Vec<u8>>>,
    pub barrier: std::sync::Barrier,
}

impl Hub {
    pub fn new(size: usize) -> Self {
        Hub {
            slots: std::sync::Mutex::new(vec![Vec::new(); size]),
            barrier: std::sync::Barrier::new(size),
        }
    }
}

/// One rank of a [`Hub`]; `bytes_sent` counts what it contributed.
pub struct Rank<'a> {
    pub hub: &'a Hub,
    pub rank: usize,
    pub size: usize,
    pub bytes_sent: usize,
}

impl trmask::partial::Exchange for Rank<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&mut self, local: &[u8]) -> trmask::Result<Vec<Vec<u8>>> {
        self.bytes_sent += local.len();
        self.hub.slots.lock().unwrap()[self.rank] = local.to_vec();
        self.hub.barrier.wait();
        let all = self.hub.slots.lock().unwrap().clone();
        self.hub.barrier.wait();
        Ok(all)
    }
}

/// The bytes of `data/causal-sample/<name>`.
pub fn causal_sample(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/causal-sample")
        .join(name);
    std::fs::read(p).unwrap()
}

/// A little-endian f32 tensor of `t`, widened.
pub fn tensor_f32s(t: &safetensors::SafeTensors, name: &str) -> Vec<f64> {
    let v = t.tensor(name).unwrap();
    v.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect()
}

/// A little-endian i32 tensor of `t`, widened.
pub fn tensor_i32s(t: &safetensors::SafeTensors, name: &str) -> Vec<i64> {
    let v = t.tensor(name).unwrap();
    v.data()
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
        .collect()
}

/// `corrector.correct_into(step, …)` into fresh f32 weight and mask buffers of `n` slots:
/// `(weights, mask, what it returned)`.
pub fn correct_into_f32(
    corrector: &trmask::Corrector,
    step: &trmask::Step<'_>,
    n: usize,
) -> (Vec<f32>, Vec<f32>, trmask::Corrections) {
    use trmask::{MaskOut, Outputs, WeightsOut};
    let (mut w, mut m) = (vec![0f32; n], vec![0f32; n]);
    let out = corrector
        .correct_into(
            step,
            Outputs {
                weights: Some(WeightsOut::F32(&mut w)),
                mask: MaskOut::F32(&mut m),
            },
        )
        .unwrap();
    (w, m, out)
}
