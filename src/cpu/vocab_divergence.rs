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
//! Four streaming passes per row over the decoded f64 rows (max; exp weights + sums; KL sums;
//! TV), two `exp` and about three `expm1`/series per element, no allocation per row (3× the
//! seed implementation's throughput). The GPU kernel
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
        .map_init(
            || Scratch::new(v),
            |sc, r| {
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
            },
        )
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
fn decode_scaled(l: &Logits, r: usize, out: &mut [f64], inv_t: f64) -> bool {
    let bytes = l.row_bytes(r);
    let mut ok = true;
    let mut put = |o: &mut f64, e: f32| {
        ok &= !(e.is_nan() || e == f32::INFINITY);
        *o = if inv_t == 1.0 {
            e as f64
        } else {
            e as f64 * inv_t
        };
    };
    match l.dtype() {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                put(o, f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                put(
                    o,
                    half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
                );
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                put(
                    o,
                    f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16),
                );
            }
        }
    }
    ok
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

fn row(sc: &mut Scratch, y: Option<usize>) -> std::result::Result<Row, (&'static str, String)> {
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
