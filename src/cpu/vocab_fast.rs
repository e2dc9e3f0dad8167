//! The fast path of the CPU vocabulary divergences for rows without −∞ entries: a vectorised
//! min/max, a vectorised exp map, one fused branch-free pass for every sum and one pass for TV
//! with the exact λ; an AVX2 + FMA build is picked at run time.

use super::vocab_general::{Dir, Row, Scratch, Sums};
use crate::math::INV_FACT;

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

/// `e^x` for `x ≤ 0` (0 below −708 and for −∞), within 1e-14 relative (far inside the 1e-9
/// the results need): branch-free so loops over it vectorise (round-to-nearest by the 1.5·2⁵²
/// trick, Taylor polynomial to r¹¹ on `|r| ≤ ln2/2`, scaling by the exponent bits).
#[inline(always)]
pub(super) fn exp_neg<const FMA: bool>(x: f64) -> f64 {
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
    up: f64, // Σ_common e^{a−ma}·u
    wp: f64, // Σ_common e^{a−ma}·w(u)
    uq: f64,
    wq: f64,
}

/// The infinities of a float type, for [`min_max`].
pub(super) trait Float: Copy + PartialOrd {
    const INF: Self;
    const NEG_INF: Self;
}
impl Float for f64 {
    const INF: f64 = f64::INFINITY;
    const NEG_INF: f64 = f64::NEG_INFINITY;
}
impl Float for f32 {
    const INF: f32 = f32::INFINITY;
    const NEG_INF: f32 = f32::NEG_INFINITY;
}

/// `(min, max)` of a NaN-free slice in `L` independent lanes (vectorises, unlike
/// `min`/`max` folds); both precisions' fast paths use it.
#[inline(always)]
pub(super) fn min_max<T: Float, const L: usize>(v: &[T]) -> (T, T) {
    let mut lo = [T::INF; L];
    let mut hi = [T::NEG_INF; L];
    let body = v.len() / L * L;
    for c in v[..body].chunks_exact(L) {
        for l in 0..L {
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
        }
    }
    for &x in &v[body..] {
        lo[0] = if x < lo[0] { x } else { lo[0] };
        hi[0] = if x > hi[0] { x } else { hi[0] };
    }
    let (mut l, mut h) = (lo[0], hi[0]);
    for k in 1..L {
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
/// need the general path (any −∞ entry, |log K| > 600, a non-finite λ). Compiled twice: for the baseline target
/// and, picked at run time, with AVX2 + FMA (fused polynomial steps: results may differ from
/// the baseline build in the last bits, far inside the 1e-9 accuracy target).
pub(super) fn row_fast(sc: &mut Scratch, y: Option<usize>) -> Option<Row> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX-512F and FMA are present (just detected).
            return unsafe { row_fast_avx512(sc, y) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present (just detected).
            return unsafe { row_fast_avx2(sc, y) };
        }
    }
    row_fast_impl::<false>(sc, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn row_fast_avx512(sc: &mut Scratch, y: Option<usize>) -> Option<Row> {
    row_fast_impl::<true>(sc, y)
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
    let (lo_a, ma) = min_max::<f64, LANES>(a);
    let (lo_b, mb) = min_max::<f64, LANES>(b);
    if lo_a.min(lo_b) == f64::NEG_INFINITY {
        return None; // −∞ entries: the general path
    }
    let ia = a.iter().position(|&x| x == ma)?;
    let ib = b.iter().position(|&x| x == mb)?;
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
    };
    // no −∞ entries here: no mass outside the other side's support
    let dp = Dir::new(ma, t.ra, 0.0, t.ha, c1p, 0.0);
    let dq = Dir::new(mb, t.rb, 0.0, t.hb, c1q, 0.0);
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
    let (klp, lam) = fp.finish(&dp);
    let (klq, lam_q) = fq.finish(&dq);
    if !(lam.is_finite() && lam_q.is_finite()) {
        return None;
    }
    let kl = klp.max(0.0);
    let kl_rev = klq.max(0.0);
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
    let tv = (0.5 * tv).clamp(0.0, 1.0);
    let (lp, lq) = match y {
        Some(y) => (a[y] - ma - dp.ln_s, b[y] - mb - dq.ln_s),
        None => (0.0, 0.0),
    };
    Some((kl, kl_rev, tv, dp.entropy, dq.entropy, lp, lq))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-wise extremes equal a plain fold for every length (empty, under one lane set,
    /// with a tail) and every position of the extremes (each lane, the tail, the lane merge).
    #[test]
    fn min_max_is_the_fold() {
        for n in 0..14usize {
            for at in 0..n.max(1) {
                for far in [1.0, 1e300] {
                    let mut v: Vec<f64> = (0..n).map(|i| ((i * 7 + 3) % 11) as f64 - 5.0).collect();
                    if n > 0 {
                        v[at] = far;
                        v[n - 1 - at] = -far;
                    }
                    let want = v
                        .iter()
                        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
                            (l.min(x), h.max(x))
                        });
                    assert_eq!(min_max::<f64, LANES>(&v), want, "n={n} at={at} {v:?}");
                }
            }
        }
        let v = [0.5, f64::NEG_INFINITY, 2.0, -1.0, 7.0];
        assert_eq!(min_max::<f64, LANES>(&v), (f64::NEG_INFINITY, 7.0));
    }

    /// `exp_neg` at the underflow cut: e^−708 is still a normal number, below it 0.
    #[test]
    fn exp_neg_at_the_cut() {
        for x in [-708.0, -707.9, -700.0] {
            let (e, r) = (exp_neg::<false>(x), f64::exp(x));
            assert!((e - r).abs() <= 1e-14 * r, "{x}: {e:e} vs {r:e}");
        }
        assert_eq!(exp_neg::<false>(-708.000_000_1), 0.0);
        assert_eq!(exp_neg::<false>(-1e10), 0.0);
    }
}
