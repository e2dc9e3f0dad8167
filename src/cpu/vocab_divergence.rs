//! Exact vocabulary divergences from full logits, f64, cancellation-free, parallel over rows.
//!
//! With `a = rollout/τ`, `b = train/τ`, `p = softmax(a)`, `q = softmax(b)` and `d = a − b`,
//! every row is reduced around a shift `c = c1 + c2` (`c1` = d at p's mode over the common
//! support, `c2 = E_p[d − c1]`), `u = d − c`:
//!
//! * `E_p[e^{−u}] = 1 + x` with `x = W − U − P_out` (`U = E_p[u] ≈ 0`,
//!   `W = E_p[w(u)]`, `w(u) = expm1(−u) + u ≥ 0`, `P_out` = p's mass where q = 0), and
//!   `KL(p‖q) = U + log1p(x) − log1p(−Q_out) = W + (log1p(x) − x) − log1p(−Q_out)`
//!   (`Q_out` = q's mass where p = 0, `−log1p(−Q_out)` by a log-sum-exp over the common support
//!   when `Q_out > ½`, where the plain sums underflow for ±1e4 logits; KL = ∞ when p > 0
//!   somewhere q = 0). Every term is second
//!   order in the mismatch, so KLs of 1e-15 survive logits of magnitude 100. Elements with
//!   `u < −30` (where `e^{−u}` would dominate) are summed in log space, so ±1e4 logits neither
//!   overflow nor lose the small-KL accuracy of the rest.
//! * `log q_i − log p_i = −u_i − λ` with `λ = log1p(x) − log1p(−Q_out)`, so
//!   `TV = ½(Σ p_i |expm1(−u_i − λ)| + P_out + Q_out)`.
//! * The same with the roles swapped gives `KL(q‖p)`; entropies are `log s − E_p[a − max a]`
//!   with `log s = log1p(Σ_{i≠mode} e^{a_i − max a})`.
//!
//! Rows without −∞ entries take a fast path ([`row_fast`]): decode, a vectorised min/max, a
//! vectorised exp map (two exps per element pair), one fused branch-free pass for every sum
//! (`w(u)` by its series or as `q·K − p + p·u`, so nothing overflows) and one pass for TV
//! with the exact λ; an AVX2 + FMA build is picked at run time. Other rows take
//! the general path: four streaming passes, log-space extremes, LSE fallbacks. The GPU kernel
//! (`shaders/vocab_divergence.wgsl`) uses the same decomposition in f32.

use crate::batch::{DType, Logits};
use crate::engine::VocabStats;
use crate::error::{Error, Result};
use rayon::prelude::*;

/// One row's results: `(kl, kl_rev, tv, h_p, h_q, logp_y, logq_y)`.
type Row = (f64, f64, f64, f64, f64, f64, f64);

/// Elements with `u < −T_EXT` enter `E[e^{−u}]` through log space.
const T_EXT: f64 = 30.0;

/// Checks the temperature, the shapes and the sampled ids shared by the CPU and GPU paths.
pub(crate) fn check_inputs(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<()> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::config(
            "temperature",
            format!("{temperature} must be finite and > 0"),
        ));
    }
    if rollout.vocab() != train.vocab()
        || rollout.rows() != train.rows()
        || rollout.rows() != mask.len()
    {
        return Err(Error::input(
            "old_logits",
            format!(
                "shape [{}, {}] does not match rollout_logits [{}, {}] / {} slots",
                train.rows(),
                train.vocab(),
                rollout.rows(),
                rollout.vocab(),
                mask.len()
            ),
        ));
    }
    if let Some(ids) = responses {
        if ids.len() != mask.len() {
            return Err(Error::input(
                "responses",
                format!("{} ids for {} slots", ids.len(), mask.len()),
            ));
        }
        let v = rollout.vocab() as i64;
        if let Some(r) = (0..mask.len()).find(|&r| mask[r] && !(0..v).contains(&ids[r])) {
            return Err(Error::input(
                "responses",
                format!(
                    "id {} at slot {r} is outside the vocabulary [0, {v})",
                    ids[r]
                ),
            ));
        }
    }
    Ok(())
}

/// The first NaN / +inf of row `r` (for error messages): `(column, value)`.
pub(crate) fn first_bad(l: &Logits, r: usize) -> Option<(usize, f32)> {
    let b = l.row_bytes(r);
    (0..l.vocab())
        .map(|i| (i, l.dtype().decode(b, i)))
        .find(|(_, e)| e.is_nan() || *e == f32::INFINITY)
}

/// Per-token exact divergences (see [`VocabStats`]); invalid slots hold 0.
pub fn vocab_divergence(
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    check_inputs(rollout, train, responses, mask, temperature)?;
    let v = rollout.vocab();
    let inv_t = 1.0 / temperature;
    let rows: Vec<Result<Row>> = (0..mask.len())
        .into_par_iter()
        .map(|r| {
            SCRATCH.with(|cell| {
                let sc = &mut *cell.borrow_mut();
                if sc.a.len() != v {
                    *sc = Scratch::new(v);
                }
                if !mask[r] {
                    return Ok((0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0));
                }
                for (name, l, x) in [
                    ("rollout_logits", rollout, &mut sc.a),
                    ("old_logits", train, &mut sc.b),
                ] {
                    if !decode_scaled(l, r, x, inv_t) {
                        let (i, e) = first_bad(l, r).unwrap_or((0, f32::NAN));
                        return Err(Error::input(
                            name,
                            format!("value {e} at row {r}, column {i}"),
                        ));
                    }
                }
                let y = responses.map(|ids| ids[r] as usize);
                row(sc, y).map_err(|(name, what)| Error::input(name, format!("row {r}: {what}")))
            })
        })
        .collect();
    let n = mask.len();
    let mut s = VocabStats {
        kl: vec![0.0; n],
        kl_rev: vec![0.0; n],
        tv: vec![0.0; n],
        rollout_entropy: vec![0.0; n],
        training_entropy: vec![0.0; n],
        rollout_logp: vec![0.0; n],
        train_logp: vec![0.0; n],
    };
    for (r, res) in rows.into_iter().enumerate() {
        let (kl, kr, tv, hp, hq, lp, lq) = res?;
        s.kl[r] = kl;
        s.kl_rev[r] = kr;
        s.tv[r] = tv;
        s.rollout_entropy[r] = hp;
        s.training_entropy[r] = hq;
        s.rollout_logp[r] = lp;
        s.train_logp[r] = lq;
    }
    Ok(s)
}

thread_local! {
    /// Per-thread row buffers, reused across rows and calls (no allocation or page faults per
    /// row; 4 f64 rows per thread stay allocated).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::new(0));
}

/// Per-thread row buffers, reused across rows.
struct Scratch {
    a: Vec<f64>,
    b: Vec<f64>,
    wa: Vec<f64>,
    wb: Vec<f64>,
}

impl Scratch {
    fn new(v: usize) -> Self {
        Scratch {
            a: vec![0.0; v],
            b: vec![0.0; v],
            wa: vec![0.0; v],
            wb: vec![0.0; v],
        }
    }
}

/// Decodes row `r` into `out` (scaled by `inv_t`); false if it holds NaN or +inf.
/// Branch-free loops (vectorised; an AVX2 build is picked at run time).
fn decode_scaled(l: &Logits, r: usize, out: &mut [f64], inv_t: f64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (just detected).
        return unsafe { decode_scaled_avx2(l, r, out, inv_t) };
    }
    decode_scaled_impl(l, r, out, inv_t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_scaled_avx2(l: &Logits, r: usize, out: &mut [f64], inv_t: f64) -> bool {
    decode_scaled_impl(l, r, out, inv_t)
}

#[inline(always)]
fn decode_scaled_impl(l: &Logits, r: usize, out: &mut [f64], inv_t: f64) -> bool {
    let bytes = l.row_bytes(r);
    let mut bad = false;
    match l.dtype() {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                bad |= ((w & 0x7fff_ffff) > 0x7f80_0000) | (w == 0x7f80_0000);
                *o = f32::from_bits(w) as f64;
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let h = u16::from_le_bytes([c[0], c[1]]);
                bad |= ((h & 0x7fff) > 0x7c00) | (h == 0x7c00);
                *o = half::f16::from_bits(h).to_f64();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let h = u16::from_le_bytes([c[0], c[1]]);
                bad |= ((h & 0x7fff) > 0x7f80) | (h == 0x7f80);
                *o = f32::from_bits((h as u32) << 16) as f64;
            }
        }
    }
    if inv_t != 1.0 {
        for o in out.iter_mut() {
            *o *= inv_t;
        }
    }
    !bad
}

/// `w(u) = expm1(−u) + u ≥ 0` to full f64 precision (Horner series for |u| < 0.1: terms up to
/// u¹³/13! leave < 1e-18 relative).
#[inline]
fn w_of(u: f64) -> f64 {
    if u.abs() < 0.1 {
        // Σ_{n≥2} (−u)^n / n!
        const C: [f64; 12] = [
            1.0 / 2.0,
            1.0 / 6.0,
            1.0 / 24.0,
            1.0 / 120.0,
            1.0 / 720.0,
            1.0 / 5040.0,
            1.0 / 40320.0,
            1.0 / 362880.0,
            1.0 / 3628800.0,
            1.0 / 39916800.0,
            1.0 / 479001600.0,
            1.0 / 6227020800.0,
        ];
        let x = -u;
        let mut acc = C[11];
        for &c in C[..11].iter().rev() {
            acc = acc * x + c;
        }
        x * x * acc
    } else {
        (-u).exp_m1() + u
    }
}

/// `log1p(x) − x` for x > −1, accurate for small |x|.
fn log1p_minus_x(x: f64) -> f64 {
    if x.abs() < 0.01 {
        // −x²/2 + x³/3 − … ; 13 terms reach f64 precision for |x| < 0.01
        let mut sum = 0.0;
        let mut pow = x * x;
        for n in 2..=14 {
            let term = pow / n as f64;
            sum += if n % 2 == 0 { -term } else { term };
            pow *= x;
        }
        sum
    } else {
        x.ln_1p() - x
    }
}

/// Per-direction constants: weights `wx = e^{x − m}`, sums and the shift.
struct Dir {
    m: f64,
    s: f64,
    ln_s: f64,
    out: f64, // own mass where the other side is −inf (normalised)
    entropy: f64,
    c1: f64, // d (this direction's sign) at the mode over the common support
    c2: f64, // E[d − c1]
}

/// Pass-3 sums of one direction (unnormalised).
#[derive(Default)]
struct Sums {
    u: f64,
    w: f64,
    ue: f64,
    pe: f64,
    ee: f64,
}

impl Sums {
    #[inline]
    fn push(&mut self, u: f64, wx: f64, wy: f64) {
        if u >= -T_EXT {
            self.u += wx * u;
            self.w += wx * w_of(u);
        } else {
            self.ue += wx * u;
            self.pe += wx;
            self.ee += wy;
        }
    }

    /// `(KL before the −log1p(−other_out) term, log E_x[e^{−u}])`.
    fn finish(&self, dx: &Dir, dy: &Dir) -> (f64, f64) {
        let inv = 1.0 / dx.s;
        let (uu, ww, ue, pe) = (self.u * inv, self.w * inv, self.ue * inv, self.pe * inv);
        let base = ww - uu - dx.out - pe;
        let mut x = base;
        let mut ext = 0.0;
        let mut big = None;
        if self.ee > 0.0 {
            // Σ_ext p e^{−u} = ee·e^K
            let lk = ((dy.m - dx.m) + dx.c1 + dx.c2) - dx.ln_s + self.ee.ln();
            if lk < 600.0 {
                ext = lk.exp();
                x = base + ext;
            } else {
                big = Some(lk + ((1.0 + base).max(0.0) * (-lk).exp()).ln_1p());
            }
        }
        let lam = match big {
            Some(l) => l,
            None if x > -1.0 => x.ln_1p(),
            None => f64::NEG_INFINITY,
        };
        let kl = if big.is_some() || x.abs() > 0.5 {
            uu + ue + lam
        } else {
            (ww - dx.out + (ext - pe + ue)) + log1p_minus_x(x)
        };
        (kl, lam)
    }
}

/// `a·b + c`, fused when `FMA` (only instantiated inside the `fma` target-feature build, where
/// `mul_add` is one instruction).
#[inline(always)]
fn madd<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `1/n!` for n = 0..=11: the Taylor coefficients of [`exp_neg`] and [`w_series`].
const INV_FACT: [f64; 12] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362880.0,
    1.0 / 3628800.0,
    1.0 / 39916800.0,
];

/// `e^x` for `x ≤ 0` (0 below −708 and for −∞), within 1e-14 relative (far inside the 1e-9
/// the results need): branch-free so loops over it vectorise (round-to-nearest by the 1.5·2⁵²
/// trick, Taylor polynomial to r¹¹ on `|r| ≤ ln2/2`, scaling by the exponent bits).
#[inline(always)]
fn exp_neg<const FMA: bool>(x: f64) -> f64 {
    const MAGIC: f64 = 6755399441055744.0; // 1.5·2^52
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000); // fdlibm ln2_hi
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76); // fdlibm ln2_lo
    let xc = x.max(-708.0);
    let t = xc * std::f64::consts::LOG2_E + MAGIC;
    let k = t - MAGIC;
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    // Σ_{n=0}^{11} rⁿ/n! by Horner
    let mut p = INV_FACT[11];
    for &c in INV_FACT[..11].iter().rev() {
        p = madd::<FMA>(p, r, c);
    }
    let ki = t.to_bits().wrapping_sub(MAGIC.to_bits()); // k as a two's complement integer
    let scale = f64::from_bits(ki.wrapping_add(1023) << 52);
    if x < -708.0 {
        0.0
    } else {
        p * scale
    }
}

/// `Σ_{n=2}^{11} (−u)^n / n!` by Horner: `w(u)` within 1e-16 relative for `|u| < 0.1`.
#[inline(always)]
fn w_series<const FMA: bool>(u: f64) -> f64 {
    let x = -u;
    let mut acc = INV_FACT[11];
    for &c in INV_FACT[2..11].iter().rev() {
        acc = madd::<FMA>(acc, x, c);
    }
    x * x * acc
}

/// Sums of the fused pass of [`row_fast`] (unnormalised), summed over lanes.
#[derive(Default, Clone, Copy)]
struct FastSums {
    ra: f64, // Σ_{i≠ia} e^{a−ma}
    rb: f64,
    ha: f64, // Σ e^{a−ma}(a − ma)
    hb: f64,
    oa: f64, // Σ e^{a−ma} where b = −∞
    ob: f64,
    up: f64, // Σ_common e^{a−ma}·u
    wp: f64, // Σ_common e^{a−ma}·w(u)
    uq: f64,
    wq: f64,
}

/// `(min, max)` of a NaN-free slice in LANES independent lanes (vectorises, unlike
/// `f64::min`/`max` folds).
#[inline(always)]
fn min_max(v: &[f64]) -> (f64, f64) {
    let mut lo = [f64::INFINITY; LANES];
    let mut hi = [f64::NEG_INFINITY; LANES];
    let body = v.len() / LANES * LANES;
    for c in v[..body].chunks_exact(LANES) {
        for l in 0..LANES {
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
        }
    }
    for &x in &v[body..] {
        lo[0] = if x < lo[0] { x } else { lo[0] };
        hi[0] = if x > hi[0] { x } else { hi[0] };
    }
    let (mut l, mut h) = (lo[0], hi[0]);
    for k in 1..LANES {
        l = if lo[k] < l { lo[k] } else { l };
        h = if hi[k] > h { hi[k] } else { h };
    }
    (l, h)
}

/// One element pair's terms of the fused pass of [`row_fast`] (all finite):
/// `[ea, eb, ea·(x−ma), eb·(z−mb), ea·u, ea·w(u), eb·ur, eb·w(ur)]`.
#[inline(always)]
fn fast_terms<const FMA: bool>(
    x: f64,
    z: f64,
    ea: f64,
    eb: f64,
    (ma, mb, c1p, c1q, kp, kq): (f64, f64, f64, f64, f64, f64),
) -> [f64; 8] {
    let d = x - z;
    let u = d - c1p;
    let ur = -d - c1q;
    // both branches computed (cheap, and it keeps the loop branch-free), then a select
    let (sp, kp_) = (ea * w_series::<FMA>(u), (eb * kp - ea) + ea * u);
    let (sq, kq_) = (eb * w_series::<FMA>(ur), (ea * kq - eb) + eb * ur);
    let wpu = if u.abs() < 0.1 { sp } else { kp_ };
    let wqu = if ur.abs() < 0.1 { sq } else { kq_ };
    [
        ea,
        eb,
        ea * (x - ma),
        eb * (z - mb),
        ea * u,
        wpu,
        eb * ur,
        wqu,
    ]
}

/// Lanes of the fused pass (independent partial sums: vectorisable, and pairwise-ish rounding).
const LANES: usize = 4;

/// The fast path for ordinary rows: two exps per element pair, one fused pass for every sum
/// (`w(u)` by its series for `|u| < 0.1`, else `p·e^{−u} − p + p·u` with `p·e^{−u} = q·K`
/// from the stored weights, so nothing overflows), one more pass for TV. In f64 the shift needs
/// no p-mean correction: the cancellation factor `E_p[u²]/Var_p(u)` is at most `1/p_mode`
/// when `u` is centred at p's mode, so ≤ V ≈ 1.5e5 (≤ 2e-11 relative). `None` for rows that
/// need the general path (every entry −∞ on a side, mode of one side outside the other's
/// support, out-of-support mass > ½, |log K| > 600). Compiled twice: for the baseline target
/// and, picked at run time, with AVX2 + FMA (fused polynomial steps: results may differ from
/// the baseline build in the last bits, far inside the 1e-9 accuracy target).
fn row_fast(sc: &mut Scratch, y: Option<usize>) -> Option<Row> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present (just detected).
        return unsafe { row_fast_avx2(sc, y) };
    }
    row_fast_impl::<false>(sc, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_fast_avx2(sc: &mut Scratch, y: Option<usize>) -> Option<Row> {
    row_fast_impl::<true>(sc, y)
}

#[inline(always)]
fn row_fast_impl<const FMA: bool>(sc: &mut Scratch, y: Option<usize>) -> Option<Row> {
    let Scratch { a, b, wa, wb } = sc;
    let n = a.len();
    let ninf = f64::NEG_INFINITY;
    let (lo_a, ma) = min_max(a);
    let (lo_b, mb) = min_max(b);
    let lo = lo_a.min(lo_b);
    if lo == ninf || ma == ninf || mb == ninf {
        return None; // −∞ entries: the general path
    }
    let ia = a.iter().position(|&x| x == ma)?;
    let ib = b.iter().position(|&x| x == mb)?;
    if b[ia] == ninf || a[ib] == ninf {
        return None;
    }
    let c1p = a[ia] - b[ia];
    let c1q = b[ib] - a[ib];
    let (lkp, lkq) = (mb - ma + c1p, ma - mb + c1q);
    if lkp.abs() > 600.0 || lkq.abs() > 600.0 {
        return None;
    }
    let (kp, kq) = (lkp.exp(), lkq.exp());
    // the weights first: a plain map, which vectorises
    for (w, &x) in wa.iter_mut().zip(a.iter()) {
        *w = exp_neg::<FMA>(x - ma);
    }
    for (w, &z) in wb.iter_mut().zip(b.iter()) {
        *w = exp_neg::<FMA>(z - mb);
    }
    // per block: the terms by a map (vectorises), then sums in LANES independent lanes
    // (acc: [_, _, ha, hb, up, wp, uq, wq])
    const BLOCK: usize = 256;
    let mut acc = [[0.0f64; LANES]; 8];
    let mut terms = [[0.0f64; BLOCK]; 8];
    let body = n / LANES * LANES;
    let mut j = 0;
    while j < body {
        let len = BLOCK.min(body - j);
        let (ca, cb) = (&a[j..j + len], &b[j..j + len]);
        let (cwa, cwb) = (&wa[j..j + len], &wb[j..j + len]);
        for k in 0..len {
            let t = fast_terms::<FMA>(ca[k], cb[k], cwa[k], cwb[k], (ma, mb, c1p, c1q, kp, kq));
            for q in 2..8 {
                terms[q][k] = t[q];
            }
        }
        for q in 2..8 {
            for c in terms[q][..len].chunks_exact(LANES) {
                for l in 0..LANES {
                    acc[q][l] += c[l];
                }
            }
        }
        j += len;
    }
    for i in body..n {
        let t = fast_terms::<FMA>(a[i], b[i], wa[i], wb[i], (ma, mb, c1p, c1q, kp, kq));
        for k in 2..8 {
            acc[k][0] += t[k];
        }
    }
    let sum = |k: usize| (acc[k][0] + acc[k][1]) + (acc[k][2] + acc[k][3]);
    // Σ_{i≠mode} weights (the mode's weight is exactly 1; leaving it out keeps log1p exact)
    let rest = |w: &mut [f64], mode: usize| {
        w[mode] = 0.0;
        let mut r = [0.0f64; LANES];
        for c in w[..body].chunks_exact(LANES) {
            for l in 0..LANES {
                r[l] += c[l];
            }
        }
        let tail: f64 = w[body..].iter().sum();
        w[mode] = 1.0;
        ((r[0] + r[1]) + (r[2] + r[3])) + tail
    };
    let t = FastSums {
        ra: rest(wa, ia),
        rb: rest(wb, ib),
        ha: sum(2),
        hb: sum(3),
        up: sum(4),
        wp: sum(5),
        uq: sum(6),
        wq: sum(7),
        ..FastSums::default()
    };
    let dir = |m: f64, rest: f64, out: f64, h: f64, c1: f64| {
        let s = 1.0 + rest;
        let ln_s = rest.ln_1p();
        Dir {
            m,
            s,
            ln_s,
            out: out / s,
            entropy: (ln_s - h / s).max(0.0),
            c1,
            c2: 0.0,
        }
    };
    let dp = dir(ma, t.ra, t.oa, t.ha, c1p);
    let dq = dir(mb, t.rb, t.ob, t.hb, c1q);
    if dp.out > 0.5 || dq.out > 0.5 {
        return None;
    }
    let fp = Sums {
        u: t.up,
        w: t.wp,
        ..Sums::default()
    };
    let fq = Sums {
        u: t.uq,
        w: t.wq,
        ..Sums::default()
    };
    let (klp, lam_p) = fp.finish(&dp, &dq);
    let (klq, lam_q) = fq.finish(&dq, &dp);
    let nq = -(-dq.out).ln_1p();
    let np = -(-dp.out).ln_1p();
    let lam = lam_p + nq;
    if !(lam.is_finite() && lam_q.is_finite()) {
        return None;
    }
    let kl = (klp + nq).max(0.0);
    let kl_rev = (klq + np).max(0.0);
    // TV: p_i·|q_i/p_i − 1| with q_i/p_i = e^{−u_i − λ}, i.e. |wb·K e^{−λ} − wa| / s_a
    let cst = (lkp - lam).exp();
    let mut acc = [0.0f64; LANES];
    for (ca, cb) in wa[..body]
        .chunks_exact(LANES)
        .zip(wb[..body].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] += (cb[l] * cst - ca[l]).abs();
        }
    }
    for i in body..n {
        acc[0] += (wb[i] * cst - wa[i]).abs();
    }
    let tv = ((acc[0] + acc[1]) + (acc[2] + acc[3])) / dp.s;
    let tv = (0.5 * (tv + dp.out + dq.out)).clamp(0.0, 1.0);
    let (lp, lq) = match y {
        Some(y) => (a[y] - ma - dp.ln_s, b[y] - mb - dq.ln_s),
        None => (0.0, 0.0),
    };
    Some((kl, kl_rev, tv, dp.entropy, dq.entropy, lp, lq))
}

fn row(sc: &mut Scratch, y: Option<usize>) -> std::result::Result<Row, (&'static str, String)> {
    if let Some(r) = row_fast(sc, y) {
        return Ok(r);
    }
    row_general(sc, y)
}

/// The general path (any row): four passes, log-space extremes, LSE fallbacks.
fn row_general(
    sc: &mut Scratch,
    y: Option<usize>,
) -> std::result::Result<Row, (&'static str, String)> {
    let Scratch { a, b, wa, wb } = sc;
    let ninf = f64::NEG_INFINITY;
    // pass 1: maxima, and the modes over the common support
    let (mut ia, mut ib) = (usize::MAX, usize::MAX); // first index of max a / max b
    let (mut ca, mut cb) = (usize::MAX, usize::MAX); // mode of a / b where both finite
    for i in 0..a.len() {
        let (x, z) = (a[i], b[i]);
        if x > ninf && (ia == usize::MAX || x > a[ia]) {
            ia = i;
        }
        if z > ninf && (ib == usize::MAX || z > b[ib]) {
            ib = i;
        }
        if x > ninf && z > ninf {
            if ca == usize::MAX || x > a[ca] {
                ca = i;
            }
            if cb == usize::MAX || z > b[cb] {
                cb = i;
            }
        }
    }
    if ia == usize::MAX {
        return Err(("rollout_logits", "every entry is -inf".into()));
    }
    if ib == usize::MAX {
        return Err(("old_logits", "every entry is -inf".into()));
    }
    let (ma, mb) = (a[ia], b[ib]);
    let common = ca != usize::MAX;
    let (c1p, c1q) = if common {
        (a[ca] - b[ca], b[cb] - a[cb])
    } else {
        (0.0, 0.0)
    };
    // pass 2: weights and first-order sums
    let (mut ra, mut rb) = (0.0, 0.0); // Σ_{i≠mode} weights
    let (mut oa, mut ob) = (0.0, 0.0); // out-of-support masses
    let (mut ha, mut hb) = (0.0, 0.0);
    let (mut sua, mut sub) = (0.0, 0.0);
    let (mut ina, mut inb) = (0.0, 0.0);
    let (mut inf_fwd, mut inf_rev) = (false, false);
    for i in 0..a.len() {
        let (x, z) = (a[i], b[i]);
        let ex = if x > ninf { (x - ma).exp() } else { 0.0 };
        let ez = if z > ninf { (z - mb).exp() } else { 0.0 };
        wa[i] = ex;
        wb[i] = ez;
        if i != ia {
            ra += ex;
        }
        if i != ib {
            rb += ez;
        }
        if x > ninf {
            ha += ex * (x - ma);
        }
        if z > ninf {
            hb += ez * (z - mb);
        }
        match (x > ninf, z > ninf) {
            (true, true) => {
                let d = x - z;
                ina += ex;
                inb += ez;
                sua += ex * (d - c1p);
                sub += ez * (-d - c1q);
            }
            (true, false) => {
                oa += ex;
                inf_fwd = true;
            }
            (false, true) => {
                ob += ez;
                inf_rev = true;
            }
            (false, false) => {}
        }
    }
    let dir = |m: f64, rest: f64, out: f64, h: f64, su: f64, s_in: f64, c1: f64| {
        let s = 1.0 + rest;
        let ln_s = rest.ln_1p();
        Dir {
            m,
            s,
            ln_s,
            out: out / s,
            entropy: (ln_s - h / s).max(0.0),
            c1,
            c2: if s_in > 0.0 { su / s_in } else { 0.0 },
        }
    };
    let dp = dir(ma, ra, oa, ha, sua, ina, c1p);
    let dq = dir(mb, rb, ob, hb, sub, inb, c1q);
    let (lp, lq) = match y {
        Some(y) => (a[y] - ma - dp.ln_s, b[y] - mb - dq.ln_s),
        None => (0.0, 0.0),
    };
    if !common {
        return Ok((
            f64::INFINITY,
            f64::INFINITY,
            1.0,
            dp.entropy,
            dq.entropy,
            lp,
            lq,
        ));
    }
    // pass 3: second-order sums around the shifts
    let (mut fp, mut fq) = (Sums::default(), Sums::default());
    for i in 0..a.len() {
        let (x, z) = (a[i], b[i]);
        if x > ninf && z > ninf {
            let d = x - z;
            fp.push((d - c1p) - dp.c2, wa[i], wb[i]);
            fq.push((-d - c1q) - dq.c2, wb[i], wa[i]);
        }
    }
    let (klp, lam_p) = fp.finish(&dp, &dq);
    let (klq, _) = fq.finish(&dq, &dp);
    // −log(mass on the other side's support): log1p while that mass is ≥ ½, else a log-sum-exp
    // over the common support around its own maximum (the plain sums may underflow there).
    let neg_log_in = |own: &[f64], other: &[f64], mode: usize, m: f64, d: &Dir| -> f64 {
        if d.out <= 0.5 {
            return -(-d.out).ln_1p();
        }
        let top = own[mode];
        let s: f64 = own
            .iter()
            .zip(other.iter())
            .filter(|(&x, &y)| x > ninf && y > ninf)
            .map(|(&x, _)| (x - top).exp())
            .sum();
        d.ln_s - ((top - m) + s.ln())
    };
    let nq = neg_log_in(b, a, cb, mb, &dq);
    let np = neg_log_in(a, b, ca, ma, &dp);
    let kl = if inf_fwd {
        f64::INFINITY
    } else {
        (klp + nq).max(0.0)
    };
    let kl_rev = if inf_rev {
        f64::INFINITY
    } else {
        (klq + np).max(0.0)
    };
    // pass 4: TV with the exact λ
    let lam = lam_p + nq;
    let (isa, isb) = (1.0 / dp.s, 1.0 / dq.s);
    let mut tv = 0.0;
    for i in 0..a.len() {
        let (x, z) = (a[i], b[i]);
        if x > ninf && z > ninf {
            let u = ((x - z) - c1p) - dp.c2;
            let v = -u - lam;
            let p = wa[i] * isa;
            tv += if v.abs() <= 1.0 {
                p * v.exp_m1().abs()
            } else {
                (p - wb[i] * isb).abs()
            };
        }
    }
    let tv = (0.5 * (tv + dp.out + dq.out)).clamp(0.0, 1.0);
    Ok((kl, kl_rev, tv, dp.entropy, dq.entropy, lp, lq))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(a: &[f32], b: &[f32], v: usize) -> VocabStats {
        let rows = a.len() / v;
        let la = Logits::from_f32(a, rows, v).unwrap();
        let lb = Logits::from_f32(b, rows, v).unwrap();
        vocab_divergence(&la, &lb, None, &vec![true; rows], 1.0).unwrap()
    }

    #[test]
    fn closed_forms() {
        // KL(p‖p) = 0, shift invariance
        let a = [1.0f32, 2.0, 3.0, -1.0];
        let b = [101.0f32, 102.0, 103.0, 99.0];
        let s = stats(&a, &b, 4);
        assert!(s.kl[0].abs() < 1e-15 && s.tv[0].abs() < 1e-15 && s.kl_rev[0].abs() < 1e-15);
        // KL(one-hot ‖ uniform) = log V ; entropy of uniform = log V
        let a = [
            0.0f32,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
        ];
        let b = [5.0f32; 4];
        let s = stats(&a, &b, 4);
        assert!((s.kl[0] - 4f64.ln()).abs() < 1e-14);
        assert!((s.training_entropy[0] - 4f64.ln()).abs() < 1e-14);
        assert_eq!(s.rollout_entropy[0], 0.0);
        assert!((s.tv[0] - 0.75).abs() < 1e-15);
        assert_eq!(s.kl_rev[0], f64::INFINITY);
    }

    #[test]
    fn fast_path_matches_general_path() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for (v, scale, noise, ninf) in [
            (1000usize, 1.0, 0.05, 0.0),
            (4099, 3.0, 0.01, 0.05),
            (257, 30.0, 0.3, 0.1),
            (5000, 1.0, 1e-4, 0.0),
            (100, 0.1, 2.0, 0.2),
            (2, 1.0, 0.5, 0.0),
        ] {
            let mut sc = Scratch::new(v);
            for i in 0..v {
                let x = (rnd() - 0.5) * 6.0 * scale;
                sc.a[i] = x;
                sc.b[i] = x + (rnd() - 0.5) * noise * scale + 0.37;
                if i > 1 && rnd() < ninf {
                    sc.a[i] = f64::NEG_INFINITY;
                    if rnd() < 0.7 {
                        sc.b[i] = f64::NEG_INFINITY;
                    }
                }
            }
            let Some(fast) = row_fast(&mut sc, Some(1)) else {
                assert!(ninf > 0.0, "V={v}: no fast path");
                continue;
            };
            let slow = row_general(&mut sc, Some(1)).unwrap();
            let f = [fast.0, fast.1, fast.2, fast.3, fast.4, fast.5, fast.6];
            let g = [slow.0, slow.1, slow.2, slow.3, slow.4, slow.5, slow.6];
            for k in 0..7 {
                if g[k].is_infinite() {
                    assert_eq!(f[k], g[k], "V={v} field {k}");
                } else {
                    let err = (f[k] - g[k]).abs();
                    assert!(
                        err <= 1e-11 * g[k].abs() + 1e-15,
                        "V={v} field {k}: fast {:e} general {:e}",
                        f[k],
                        g[k]
                    );
                }
            }
        }
        // exp_neg against std
        for i in 0..9_900 {
            let x = -(i as f64) * 0.0713;
            let (e, r) = (exp_neg::<false>(x), x.exp());
            assert!((e - r).abs() <= 1e-14 * r, "{x}: {e} vs {r}");
        }
        assert_eq!(exp_neg::<false>(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg::<false>(0.0), 1.0);
    }

    #[test]
    fn matches_naive_on_moderate_values() {
        let a = [0.3f32, -1.2, 2.0, 0.7, 0.0];
        let b = [0.1f32, -1.0, 2.5, 0.2, 0.4];
        let s = stats(&a, &b, 5);
        let sm = |x: &[f32]| {
            let z: f64 = x.iter().map(|&e| (e as f64).exp()).sum();
            x.iter().map(|&e| (e as f64).exp() / z).collect::<Vec<_>>()
        };
        let (p, q) = (sm(&a), sm(&b));
        let kl: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        let kr: f64 = p.iter().zip(&q).map(|(p, q)| q * (q / p).ln()).sum();
        let tv: f64 = 0.5 * p.iter().zip(&q).map(|(p, q)| (p - q).abs()).sum::<f64>();
        let h: f64 = -p.iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((s.kl[0] - kl).abs() < 1e-14, "{} {}", s.kl[0], kl);
        assert!((s.kl_rev[0] - kr).abs() < 1e-14);
        assert!((s.tv[0] - tv).abs() < 1e-14);
        assert!((s.rollout_entropy[0] - h).abs() < 1e-14);
    }
}
