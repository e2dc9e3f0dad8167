//! The fused lean pass (`Corrector::correct_into`) against the full path (`Corrector::correct`)
//! on random batches: every input dtype, mask dtype and output dtype, padded and packed
//! layouts, empty and all-masked sequences, NaN in the padding, for every config the lean pass
//! serves. Masks, decisions and weights are equal bit for bit, metrics to 1e-12.

use crate::common;

use common::{seed, Rng};
use half::{bf16, f16};
use std::collections::BTreeMap;
use trmask::cpu::CpuEngine;
use trmask::{
    CorrectionConfig, Corrections, Corrector, MaskOut, MaskValues, Outputs, Step, Values,
    WeightsOut,
};

/// Configs the lean pass serves: the benchmark's three, IcePop, batch normalisation, several
/// criteria at once, trmask's exact-mean and sampled-token criteria.
fn configs() -> Vec<(String, CorrectionConfig)> {
    let mut v: Vec<(String, CorrectionConfig)> = [
        r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}"#,
        r#"{"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 2.5}"#,
        r#"{"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}"#,
        r#"{"rollout_is": "token", "rollout_is_threshold": "0.5_2.0", "rollout_is_batch_normalize": true}"#,
        r#"{"rollout_is": "sequence", "rollout_is_threshold": "0.2_5.0", "rollout_is_batch_normalize": true, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.1"}"#,
        r#"{"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_rs": "seq_max_k2,token_k3,seq_mean_k3", "rollout_rs_threshold": "2.5,0.05,0.002"}"#,
        r#"{"rollout_rs": "seq_sum_abs,seq_max_ser,token_k2,seq_mean_k2", "rollout_rs_threshold": "3.0,0.5,0.02,0.001"}"#,
        r#"{"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"}"#,
        // the token veto (verl's legacy rollout_token_veto_threshold) beside IS and RS
        r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01, "token_veto": 0.5}"#,
        r#"{"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25", "token_veto": 0.9}"#,
        // OPSM (its sign from the advantages: without them both paths give the same error)
        r#"{"rollout_rs": "opsm", "rollout_rs_threshold": 0.05}"#,
        r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "opsm,seq_max_k2", "rollout_rs_threshold": "0.02,2.5", "token_veto": 0.3}"#,
        // LN-TRM (token weights from each token's rank among its sequence's valid tokens)
        r#"{"rollout_rs": "seq_lntrm", "rollout_rs_threshold": 0.1, "ln_trm": {"eps": 0.1, "delta": 0.02}}"#,
        r#"{"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_lntrm,seq_mean_k3", "rollout_rs_threshold": "0.3,0.01", "ln_trm": {"delta": 0.05}}"#,
        // M2PO (a batch-global drop of active tokens; its quadrants from the advantages)
        r#"{"rollout_rs": "m2po", "rollout_rs_threshold": 0.0004}"#,
        r#"{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_max_k2,m2po", "rollout_rs_threshold": "2.5,0.01", "token_veto": 0.3}"#,
        // CPPO (a per-sequence prefix budget from the P90 of |p − q|; direction from the advantages)
        r#"{"rollout_rs": "cppo", "rollout_rs_threshold": 0.05}"#,
        r#"{"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "m2po,cppo,seq_mean_k3", "rollout_rs_threshold": "0.001,0.02,0.01", "cppo": {"w_min": 0.5, "delta_b": 0.01}}"#,
    ]
    .iter()
    .map(|j| (j.to_string(), CorrectionConfig::from_json_str(j).unwrap()))
    .collect();
    for name in CorrectionConfig::preset_names() {
        v.push((name.to_string(), CorrectionConfig::preset(name).unwrap()));
    }
    v
}

/// A random batch: `lens[s]` valid tokens of `t` slots per row (padded), log-probs in f64.
struct Raw {
    b: usize,
    t: usize,
    mask: Vec<bool>,
    roll: Vec<f64>,
    old: Vec<f64>,
}

fn random(rng: &mut Rng, b: usize, t: usize) -> Raw {
    let n = b * t;
    let mut mask = vec![false; n];
    for s in 0..b {
        let len = match rng.below(5) {
            0 => 0,
            1 => t,
            _ => rng.below(t + 1),
        };
        // a few holes inside a row too
        for i in 0..len {
            mask[s * t + i] = !rng.bool(0.05);
        }
    }
    // 60: some log-ratios beyond the safety bound (20), the tile's slow path
    let spread = [0.01, 0.1, 1.0, 30.0, 60.0][rng.below(5)];
    let roll: Vec<f64> = (0..n).map(|_| rng.range(-4.0, -0.01)).collect();
    let old: Vec<f64> = roll
        .iter()
        .map(|r| r + spread * (rng.f64() - 0.5))
        .collect();
    // NaN / inf in the padding must not matter
    let (roll, old) = (poison(&mask, roll, rng), poison(&mask, old, rng));
    Raw {
        b,
        t,
        mask,
        roll,
        old,
    }
}

fn poison(mask: &[bool], mut v: Vec<f64>, rng: &mut Rng) -> Vec<f64> {
    for (x, &m) in v.iter_mut().zip(mask) {
        if !m && rng.bool(0.5) {
            *x = [f64::NAN, f64::INFINITY, -1e300, 7.0][rng.below(4)];
        }
    }
    v
}

/// Values in one of the four dtypes (held, so a step can borrow them).
enum Held {
    F64(Vec<f64>),
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Held {
    fn new(v: &[f64], k: usize) -> Held {
        match k % 4 {
            0 => Held::F64(v.to_vec()),
            1 => Held::F32(v.iter().map(|&x| x as f32).collect()),
            2 => Held::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            _ => Held::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
        }
    }
    fn values(&self) -> Values<'_> {
        match self {
            Held::F64(v) => Values::F64(v),
            Held::F32(v) => Values::F32(v),
            Held::BF16(v) => Values::BF16(v),
            Held::F16(v) => Values::F16(v),
        }
    }
}

enum HeldMask {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl HeldMask {
    fn new(m: &[bool], k: usize) -> HeldMask {
        match k % 5 {
            0 => HeldMask::Bool(m.to_vec()),
            1 => HeldMask::U8(m.iter().map(|&x| x as u8).collect()),
            2 => HeldMask::I64(m.iter().map(|&x| x as i64).collect()),
            3 => HeldMask::F32(m.iter().map(|&x| x as u8 as f32).collect()),
            _ => HeldMask::F64(m.iter().map(|&x| x as u8 as f64).collect()),
        }
    }
    fn values(&self) -> MaskValues<'_> {
        match self {
            HeldMask::Bool(v) => MaskValues::Bool(v),
            HeldMask::U8(v) => MaskValues::U8(v),
            HeldMask::I64(v) => MaskValues::I64(v),
            HeldMask::F32(v) => MaskValues::F32(v),
            HeldMask::F64(v) => MaskValues::F64(v),
        }
    }
}

/// Output buffers of one dtype choice, read back as f64.
struct Bufs {
    w64: Vec<f64>,
    w32: Vec<f32>,
    mb: Vec<bool>,
    mu: Vec<u8>,
    mi: Vec<i64>,
    mf: Vec<f32>,
    md: Vec<f64>,
}

impl Bufs {
    fn new(n: usize) -> Bufs {
        // garbage, so a slot the pass forgets shows
        Bufs {
            w64: vec![-7.0; n],
            w32: vec![-7.0; n],
            mb: vec![true; n],
            mu: vec![9; n],
            mi: vec![9; n],
            mf: vec![9.0; n],
            md: vec![9.0; n],
        }
    }
    fn outputs(&mut self, weights: bool, k: usize) -> Outputs<'_> {
        let w = weights.then(|| {
            if k.is_multiple_of(2) {
                WeightsOut::F64(&mut self.w64[..])
            } else {
                WeightsOut::F32(&mut self.w32[..])
            }
        });
        let mask = match k % 5 {
            0 => MaskOut::Bool(&mut self.mb[..]),
            1 => MaskOut::U8(&mut self.mu[..]),
            2 => MaskOut::I64(&mut self.mi[..]),
            3 => MaskOut::F32(&mut self.mf[..]),
            _ => MaskOut::F64(&mut self.md[..]),
        };
        Outputs { weights: w, mask }
    }
    fn read(&self, k: usize) -> (Vec<f64>, Vec<f64>) {
        let w = if k.is_multiple_of(2) {
            self.w64.clone()
        } else {
            self.w32.iter().map(|&x| x as f64).collect()
        };
        let m = match k % 5 {
            0 => self.mb.iter().map(|&x| x as u8 as f64).collect(),
            1 => self.mu.iter().map(|&x| x as f64).collect(),
            2 => self.mi.iter().map(|&x| x as f64).collect(),
            3 => self.mf.iter().map(|&x| x as f64).collect(),
            _ => self.md.clone(),
        };
        (w, m)
    }
}

/// Equal to `tol` relative (absolute below 1).
fn close(a: f64, b: f64, tol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * a.abs().max(b.abs()).max(1.0)
}

/// Metrics to 1e-12, or to `t · 2⁻⁵²` for rows of `t > 4096` slots: the full path sums a
/// sequence criterion's value once per token (plain f64, so `t` roundings), the lean pass
/// multiplies it by the length.
fn same_metrics(got: &BTreeMap<String, f64>, want: &BTreeMap<String, f64>, t: usize, what: &str) {
    let tol = 1e-12f64.max(t as f64 * f64::EPSILON);
    let (gk, wk): (Vec<_>, Vec<_>) = (got.keys().collect(), want.keys().collect());
    assert_eq!(gk, wk, "{what}: metric keys");
    for (k, &v) in want {
        assert!(
            close(got[k], v, tol),
            "{what}: {k} lean {} full {v}",
            got[k]
        );
    }
}

fn same_details(got: &Corrections, want: &Corrections, what: &str) {
    assert_eq!(got.seq_accept, want.seq_accept, "{what}: seq_accept");
    assert_eq!(got.seq_len, want.seq_len, "{what}: seq_len");
    assert_eq!(got.seq_reject_bits, want.seq_reject_bits, "{what}: bits");
    assert_eq!(got.criteria.len(), want.criteria.len(), "{what}: criteria");
    for (g, w) in got.criteria.iter().zip(&want.criteria) {
        assert_eq!((&g.name, &g.output_name), (&w.name, &w.output_name));
        assert_eq!(g.seq_reject, w.seq_reject, "{what}: {} seq_reject", g.name);
        assert_eq!(g.seq_stat, w.seq_stat, "{what}: {} seq_stat", g.name);
    }
}

/// Weights: what the full path's f64 weights round to in the buffer's dtype.
fn want_weights(c: &Corrections, k: usize) -> Vec<f64> {
    let w = c.weights.clone().unwrap();
    if k.is_multiple_of(2) {
        w
    } else {
        w.iter().map(|&x| x as f32 as f64).collect()
    }
}

/// Runs `step` through the full path (`full_path_only`) and the lean pass (`correct_into`) and checks
/// they agree: the same error, or masks equal, weights equal (within `ulps` last bits),
/// decisions equal and metrics to 1e-12; `correct` (the fused pass into its own buffers where
/// it serves) gives `correct_into`'s mask, weights, decisions and metrics. Returns the full
/// path's result (`None` when both failed) and whether the lean pass ran.
fn lean_against_full(
    corrector: &Corrector,
    step: &Step<'_>,
    (b, t, k): (usize, usize, usize),
    ulps: u64,
    what: &str,
) -> Option<(Corrections, bool)> {
    let full = corrector.clone().full_path_only(true).correct(step);
    let mut bufs = Bufs::new(b * t);
    let lean = corrector.correct_into(step, bufs.outputs(corrector.has_weights(), k));
    let owned = corrector.correct(step);
    let (full, lean) = match (full, lean) {
        (Ok(f), Ok(l)) => (f, l),
        (Err(f), Err(l)) => {
            assert_eq!(f.to_string(), l.to_string(), "{what}: errors");
            assert_eq!(
                owned.unwrap_err().to_string(),
                f.to_string(),
                "{what}: errors"
            );
            return None;
        }
        (f, l) => panic!("{what}: full {:?} lean {:?}", f.err(), l.err()),
    };
    let (w, m) = bufs.read(k);
    assert!(m == full.mask, "{what}: mask");
    if corrector.has_weights() {
        let want = want_weights(&full, k);
        if ulps == 0 {
            assert_eq!(w, want, "{what}: weights");
        } else {
            let bad = (0..w.len()).find(|&i| w[i].to_bits().abs_diff(want[i].to_bits()) > ulps);
            assert!(
                bad.is_none(),
                "{what}: weight {bad:?}: lean {:?} full {:?}",
                bad.map(|i| w[i]),
                bad.map(|i| want[i])
            );
        }
    }
    same_details(&lean, &full, what);
    same_metrics(&lean.metrics, &full.metrics, t, what);
    // `correct`: the same pass into buffers of its own
    let owned = owned.unwrap_or_else(|e| panic!("{what}: correct: {e}"));
    assert!(owned.mask == full.mask, "{what}: correct's mask");
    if corrector.has_weights() {
        let (want, got) = (want_weights(&full, 0), want_weights(&owned, 0));
        let bad = (0..got.len()).find(|&i| got[i].to_bits().abs_diff(want[i].to_bits()) > ulps);
        assert!(bad.is_none(), "{what}: correct's weight {bad:?}");
    }
    same_details(&owned, &lean, what);
    assert_eq!(owned.metrics, lean.metrics, "{what}: correct's metrics");
    // the diagnostics' per-token sums: one feed in lanes on both paths, so the same bits
    let lanes = [
        "trmask/by_prob/",
        "trmask/adv_",
        "trmask/turn/",
        "trmask/k1_pos_",
        "trmask/k3_pos_",
        "trmask/abs_log_ratio_pos_",
    ];
    for (k, &v) in &full.metrics {
        if lanes.iter().any(|p| k.starts_with(p)) {
            assert_eq!(lean.metrics[k].to_bits(), v.to_bits(), "{what}: {k} bits");
        }
    }
    Some((full, corrector.has_lean_pass()))
}

#[test]
fn lean_pass_equals_the_full_path() {
    let mut rng = Rng::new(seed(2801));
    let mut lean_runs = 0;
    for (ci, (name, cfg)) in configs().iter().enumerate() {
        let corrector = Corrector::new(CpuEngine::new(), cfg)
            .unwrap()
            .verl_metrics_only(true);
        for trial in 0..6 {
            let (b, t) = [(1, 1), (3, 5), (7, 33), (16, 300), (2, 70000), (5, 17)][trial];
            let raw = random(&mut rng, b, t);
            let k = ci + trial;
            let (roll, old) = (Held::new(&raw.roll, k), Held::new(&raw.old, k + trial % 2));
            let mask = HeldMask::new(&raw.mask, k);
            let step = Step::padded(raw.b, raw.t)
                .response_mask(mask.values())
                .rollout_log_prob(roll.values())
                .old_log_prob(old.values());
            let what = format!("{name} [{b}, {t}] trial {trial}");
            if let Some((_, lean)) = lean_against_full(&corrector, &step, (b, t, k), 0, &what) {
                lean_runs += usize::from(lean);
            }
        }
    }
    assert!(lean_runs > 60, "the lean pass ran {lean_runs} times");
}

/// With trmask's own metrics (the trainer's diagnostics: advantages and GRPO group ids given),
/// the fused pass feeds the same diagnostics accumulator from its tiles as the full path from
/// its table: the same keys, the same values to 1e-12 (per-sequence plain sums), the same
/// mask and weights to the bit.
#[test]
fn lean_pass_with_diagnostics_equals_the_full_path() {
    let mut rng = Rng::new(seed(3801));
    let mut lean_runs = 0;
    for (ci, (name, cfg)) in configs().iter().enumerate() {
        let corrector = Corrector::new(CpuEngine::new(), cfg).unwrap();
        // sequence IS normalised over the batch: the full path's normaliser sums each
        // sequence's weight once per token, the lean pass multiplies it by the length (as for
        // the metrics above), so a weight may differ in its last bits through the normaliser
        let ulps = if name.contains("\"sequence\"") && name.contains("batch_normalize\": true") {
            4
        } else {
            0
        };
        for trial in 0..5 {
            let (b, t) = [(3, 5), (7, 33), (16, 300), (2, 9000), (5, 17)][trial];
            let raw = random(&mut rng, b, t);
            let k = ci + trial;
            let (roll, old) = (Held::new(&raw.roll, k), Held::new(&raw.old, k + trial % 2));
            let mask = HeldMask::new(&raw.mask, k);
            // per-token advantages: a sign per sequence, some zero, some mixed within a row
            let adv: Vec<f64> = (0..b * t)
                .map(|i| match (i / t) % 4 {
                    0 => 1.5,
                    1 => -0.5,
                    2 => 0.0,
                    _ => rng.range(-1.0, 1.0),
                })
                .collect();
            let adv = Held::new(&adv, k + 1);
            let uid: Vec<i64> = (0..b as i64).map(|s| s / 2).collect();
            let step = Step::padded(raw.b, raw.t)
                .response_mask(mask.values())
                .rollout_log_prob(roll.values())
                .old_log_prob(old.values())
                .advantages(adv.values())
                .uid(&uid);
            let what = format!("{name} [{b}, {t}] trial {trial} (diagnostics)");
            if let Some((full, lean)) = lean_against_full(&corrector, &step, (b, t, k), ulps, &what)
            {
                lean_runs += usize::from(lean);
                assert!(
                    full.metrics.contains_key("trmask/adv_pos/token_fraction")
                        || raw.mask.iter().all(|m| !m)
                );
            }
        }
    }
    assert!(lean_runs > 50, "the lean pass ran {lean_runs} times");
}

#[test]
fn lean_pass_serves_the_benchmark_and_verl_presets() {
    for (name, cfg) in configs().iter().take(18) {
        let c = Corrector::new(CpuEngine::new(), cfg)
            .unwrap()
            .verl_metrics_only(true);
        assert!(c.has_lean_pass(), "{name}");
    }
    let served: Vec<&str> = CorrectionConfig::preset_names()
        .into_iter()
        .filter(|n| {
            let cfg = CorrectionConfig::preset(n).unwrap();
            Corrector::new(CpuEngine::new(), &cfg)
                .unwrap()
                .verl_metrics_only(true)
                .has_lean_pass()
        })
        .collect();
    for p in ["decoupled_k3_rs_token_tis", "decoupled_k3_rs"] {
        assert!(served.contains(&p), "{p} not served: {served:?}");
    }
}

#[test]
fn packed_steps_and_padding_values_do_not_change_results() {
    let mut rng = Rng::new(seed(2802));
    let lens = [0usize, 5, 1, 40, 0, 13];
    let cu: Vec<i64> = std::iter::once(0)
        .chain(lens.iter().scan(0i64, |a, &l| {
            *a += l as i64;
            Some(*a)
        }))
        .collect();
    let n = *cu.last().unwrap() as usize;
    let roll: Vec<f32> = (0..n).map(|_| rng.range(-3.0, -0.1) as f32).collect();
    let old: Vec<f32> = roll
        .iter()
        .map(|x| x + rng.range(-0.2, 0.2) as f32)
        .collect();
    // advantages (OPSM reads their sign): per token, of either sign
    let adv: Vec<f32> = (0..n).map(|_| rng.range(-1.0, 0.6) as f32).collect();
    for (name, cfg) in configs().iter().take(18) {
        let c = Corrector::new(CpuEngine::new(), cfg)
            .unwrap()
            .verl_metrics_only(true);
        let step = Step::packed(&cu)
            .rollout_log_prob(&roll[..])
            .old_log_prob(&old[..])
            .advantages(&adv[..]);
        let full = c.clone().full_path_only(true).correct(&step).unwrap();
        let mut bufs = Bufs::new(n);
        let lean = c
            .correct_into(&step, bufs.outputs(c.has_weights(), 3))
            .unwrap();
        let (w, m) = bufs.read(3);
        assert_eq!(m, full.mask, "{name}: packed mask");
        if c.has_weights() {
            assert_eq!(w, want_weights(&full, 3), "{name}: packed weights");
        }
        same_details(&lean, &full, name);
        same_metrics(&lean.metrics, &full.metrics, 40, name);
        // the same sequences padded, with different garbage in the padding: same results
        let t = 40;
        let mut results = Vec::new();
        for junk in [f32::NAN, 1e30, -0.5] {
            let (mut r, mut o, mut mk) = (vec![junk; 6 * t], vec![junk; 6 * t], vec![false; 6 * t]);
            let mut ad = vec![junk; 6 * t];
            for (s, &l) in lens.iter().enumerate() {
                let a = cu[s] as usize;
                r[s * t..s * t + l].copy_from_slice(&roll[a..a + l]);
                o[s * t..s * t + l].copy_from_slice(&old[a..a + l]);
                ad[s * t..s * t + l].copy_from_slice(&adv[a..a + l]);
                mk[s * t..s * t + l].iter_mut().for_each(|m| *m = true);
            }
            let step = Step::padded(6, t)
                .response_mask(&mk[..])
                .rollout_log_prob(&r[..])
                .old_log_prob(&o[..])
                .advantages(&ad[..]);
            let mut bufs = Bufs::new(6 * t);
            let out = c
                .correct_into(&step, bufs.outputs(c.has_weights(), 3))
                .unwrap();
            results.push((bufs.read(3), out.metrics, out.seq_accept));
        }
        assert!(
            results.windows(2).all(|p| p[0] == p[1]),
            "{name}: padding changed a result"
        );
        assert_eq!(
            results[0].2, lean.seq_accept,
            "{name}: padded vs packed decisions"
        );
    }
}

#[test]
fn bad_inputs_give_the_full_paths_errors() {
    let cfg = &configs()[0].1;
    let c = Corrector::new(CpuEngine::new(), cfg)
        .unwrap()
        .verl_metrics_only(true);
    let roll = [-1.0f32, -0.5, -0.2, -2.0];
    let old = [-1.0f32, f32::NAN, -0.2, -1.0];
    let mask = [1.0f32, 1.0, 0.0, 0.5];
    let all_masked = [0u8; 4];
    let cases: Vec<Step> = vec![
        Step::padded(2, 2)
            .response_mask(&mask[..])
            .rollout_log_prob(&roll[..])
            .old_log_prob(&roll[..]),
        Step::padded(2, 2)
            .response_mask(&[true; 4][..])
            .rollout_log_prob(&roll[..])
            .old_log_prob(&old[..]),
        Step::padded(2, 2)
            .response_mask(&all_masked[..])
            .rollout_log_prob(&roll[..])
            .old_log_prob(&old[..]),
        Step::padded(2, 3)
            .response_mask(&[true; 6][..])
            .rollout_log_prob(&roll[..])
            .old_log_prob(&roll[..]),
    ];
    for (i, step) in cases.iter().enumerate() {
        let want = c
            .clone()
            .full_path_only(true)
            .correct(step)
            .unwrap_err()
            .to_string();
        assert_eq!(
            c.correct(step).unwrap_err().to_string(),
            want,
            "case {i}: correct"
        );
        let mut bufs = Bufs::new(step_slots(i));
        let got = c
            .correct_into(step, bufs.outputs(true, 0))
            .unwrap_err()
            .to_string();
        assert_eq!(got, want, "case {i}");
    }
    // a missing weights buffer is an error naming it
    let step = Step::padded(2, 2)
        .response_mask(&[true; 4][..])
        .rollout_log_prob(&roll[..])
        .old_log_prob(&roll[..]);
    let mut bufs = Bufs::new(4);
    let e = c
        .correct_into(&step, bufs.outputs(false, 0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout_is_weights"), "{e}");
}

fn step_slots(i: usize) -> usize {
    if i == 3 {
        6
    } else {
        4
    }
}

/// M2PO's cut inside a run of ties that spans several of the fused pass's tasks (40 rows of
/// 1024 slots: five tasks): the dropped ties are the earliest in batch order on both paths.
#[test]
fn m2po_ties_across_tasks_drop_the_earliest_tokens() {
    let mut rng = Rng::new(seed(4801));
    let (b, t) = (40, 1024);
    let cfg =
        CorrectionConfig::from_json_str(r#"{"rollout_rs": "m2po", "rollout_rs_threshold": 0.03}"#)
            .unwrap();
    let c = Corrector::new(CpuEngine::new(), &cfg)
        .unwrap()
        .verl_metrics_only(true);
    assert!(c.has_lean_pass());
    let mask: Vec<bool> = (0..b * t).map(|i| i % t < 600 + (i / t) * 9).collect();
    let roll: Vec<f64> = (0..b * t).map(|_| rng.range(-3.0, -0.5)).collect();
    // log-ratios of ±0.25 or ±0.125 (exact in f64): lr² takes two values, each many times
    let old: Vec<f64> = roll
        .iter()
        .map(|r| r + [-0.25, -0.125, 0.125, 0.25][rng.below(4)])
        .collect();
    let adv: Vec<f64> = (0..b * t)
        .map(|i| if (i / t) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let step = Step::padded(b, t)
        .response_mask(&mask[..])
        .rollout_log_prob(&roll[..])
        .old_log_prob(&old[..])
        .advantages(&adv[..]);
    let (full, lean) = lean_against_full(&c, &step, (b, t, 0), 0, "m2po ties").unwrap();
    assert!(lean, "the fused pass did not run");
    // the active tokens whose lr² is the larger value: a prefix of them dropped, the rest kept
    let big: Vec<usize> = (0..b * t)
        .filter(|&i| {
            let lr = old[i] - roll[i];
            mask[i] && lr * adv[i] > 0.0 && lr.abs() == 0.25
        })
        .collect();
    let dropped: Vec<bool> = big.iter().map(|&i| full.mask[i] == 0.0).collect();
    let k = dropped.iter().filter(|&&d| d).count();
    assert!(
        k > 0 && k < big.len(),
        "the cut is not inside the ties: {k} of {}",
        big.len()
    );
    assert!(
        dropped[..k].iter().all(|&d| d),
        "a later tie was dropped before an earlier one"
    );
    assert_eq!(full.metrics["rollout_corr/rollout_rs_m2po_cutoff"], 0.0625);
}
