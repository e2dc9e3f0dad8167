//! The `cpu-fast` precision ([`crate::Backend::CpuFast`]): the fast path of `vocab_fast.rs` in
//! f32 — logits decoded unscaled into f32, differences taken before the temperature scales them
//! (exact for bf16 / f16 inputs), 16-lane exponentials and terms, every sum accumulated in f32
//! over blocks of [`BLOCK`] elements and in f64 across blocks. One read of each logit, then one
//! pass over the stored f32 weights for TV. Accuracy is the GPU engine's (docs/FORMAT.md, Accuracy: 2e-3·|ref| +
//! 1e-7 for the divergences), not the f64 reference's 1e-9: `tests/gpu/vocab_divergence.rs` measures it
//! against the f64 path on the real logits and on random rows. Rows it does not take (−∞
//! entries, an extreme mismatch between the modes, f32 over- or underflow of the constants)
//! return `None` and take the f64 path.

use super::vocab_fast::min_max;
use super::vocab_general::{Dir, Row, Sums};
use crate::input::logits::{DType, Logits};
use crate::math::INV_FACT;

/// Lanes of the sums (two AVX2 registers, one AVX-512 register).
const LANES: usize = 16;

/// Elements summed in f32 before the block's partial sums move to f64.
const BLOCK: usize = 512;

/// `|log K|` above which a row takes the f64 path (`K = e^{mb − ma + c1}` must stay far
/// inside f32's range: `q·K` is formed for every element).
const MAX_LOG_K: f64 = 40.0;

/// Per-thread f32 row buffers, reused across rows.
pub(super) struct Scratch32 {
    a: Vec<f32>,
    b: Vec<f32>,
    wa: Vec<f32>,
    wb: Vec<f32>,
}

impl Scratch32 {
    pub(super) fn new(v: usize) -> Self {
        Scratch32 {
            a: vec![0.0; v],
            b: vec![0.0; v],
            wa: vec![0.0; v],
            wb: vec![0.0; v],
        }
    }

    /// Decodes row `r` of `rollout` / `train` (unscaled), first resizing the buffers to the
    /// vocabulary when it differs; `Err(tensor)` naming the first that holds NaN or +∞.
    pub(super) fn decode(
        &mut self,
        rollout: &Logits,
        train: &Logits,
        r: usize,
    ) -> std::result::Result<(), &'static str> {
        if self.a.len() != rollout.vocab() {
            *self = Scratch32::new(rollout.vocab());
        }
        if !decode_f32(rollout, r, &mut self.a) {
            return Err("rollout_logits");
        }
        if !decode_f32(train, r, &mut self.b) {
            return Err("old_logits");
        }
        Ok(())
    }
}

/// Decodes row `r` of `l` into `out` (unscaled); false if it holds NaN or +∞.
fn decode_f32(l: &Logits, r: usize, out: &mut [f32]) -> bool {
    let bytes = l.row_bytes(r);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present (just detected).
            return unsafe { decode_f32_avx512(l.dtype(), bytes, out) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (just detected).
            return unsafe { decode_f32_avx2(l.dtype(), bytes, out) };
        }
    }
    decode_f32_impl(l.dtype(), bytes, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn decode_f32_avx512(dt: DType, bytes: &[u8], out: &mut [f32]) -> bool {
    decode_f32_impl(dt, bytes, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_f32_avx2(dt: DType, bytes: &[u8], out: &mut [f32]) -> bool {
    decode_f32_impl(dt, bytes, out)
}

#[inline(always)]
fn decode_f32_impl(dt: DType, bytes: &[u8], out: &mut [f32]) -> bool {
    let mut bad = false;
    match dt {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                bad |= (w & 0x7fff_ffff) > 0x7f80_0000 || w == 0x7f80_0000;
                *o = f32::from_bits(w);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let h = u16::from_le_bytes([c[0], c[1]]);
                bad |= (h & 0x7fff) > 0x7c00 || h == 0x7c00;
                *o = half::f16::from_bits(h).to_f32();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let h = u16::from_le_bytes([c[0], c[1]]);
                bad |= (h & 0x7fff) > 0x7f80 || h == 0x7f80;
                *o = f32::from_bits((h as u32) << 16);
            }
        }
    }
    !bad
}

/// `a·b + c`, fused when `FMA`.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `1/n!` for n = 0..=7 in f32 (from [`INV_FACT`]).
const INV_FACT32: [f32; 8] = {
    let mut t = [0.0f32; 8];
    let mut n = 0;
    while n < 8 {
        t[n] = INV_FACT[n] as f32;
        n += 1;
    }
    t
};

/// `e^x` in f32 for `x ≤ 0` (0 below −87 and for −∞), within 2 ulp: branch-free (round to
/// nearest by the 1.5·2²³ trick, Cephes' two-part ln 2, Taylor polynomial to r⁷ on
/// `|r| ≤ ln2/2`, scaling by the exponent bits).
#[inline(always)]
pub(super) fn exp_neg32<const FMA: bool>(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5·2^23
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375, exact in 9 bits
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.max(-87.0);
    let t = madd::<FMA>(xc, std::f32::consts::LOG2_E, MAGIC);
    let k = t - MAGIC;
    let r = madd::<FMA>(-k, LN2_LO, madd::<FMA>(-k, LN2_HI, xc));
    let mut p = INV_FACT32[7];
    for &c in INV_FACT32[..7].iter().rev() {
        p = madd::<FMA>(p, r, c);
    }
    let ki = t.to_bits().wrapping_sub(MAGIC.to_bits()); // k as a two's complement integer
    let scale = f32::from_bits(ki.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `w(u) = e^{−u} − 1 + u` by its series `Σ_{n=2}^{7} (−u)^n / n!`, for `|u| < 0.1` (within
/// 1e-9 relative).
#[inline(always)]
fn w_series32<const FMA: bool>(u: f32) -> f32 {
    let x = -u;
    let mut acc = INV_FACT32[7];
    for &c in INV_FACT32[2..7].iter().rev() {
        acc = madd::<FMA>(acc, x, c);
    }
    x * x * acc
}

/// The row constants of the fused pass, in f32 (scaled units unless said).
#[derive(Clone, Copy)]
struct Consts {
    ma: f32, // unscaled maxima
    mb: f32,
    s: f32, // 1/τ
    c1p: f32,
    c1q: f32,
    kp: f32,
    kq: f32,
}

/// One element pair's terms of the fused pass (weights given):
/// `[ea·(a − ma)/τ, eb·(b − mb)/τ, ea·u, ea·w(u), eb·ur, eb·w(ur)]`.
#[inline(always)]
fn terms<const FMA: bool>(x: f32, z: f32, ea: f32, eb: f32, c: &Consts) -> [f32; 6] {
    let d = (x - z) * c.s;
    let u = d - c.c1p;
    let ur = -d - c.c1q;
    // both branches computed (cheap, and it keeps the loop branch-free), then a select
    let sp = ea * w_series32::<FMA>(u);
    let kp_ = madd::<FMA>(ea, u, madd::<FMA>(eb, c.kp, -ea));
    let sq = eb * w_series32::<FMA>(ur);
    let kq_ = madd::<FMA>(eb, ur, madd::<FMA>(ea, c.kq, -eb));
    [
        ea * ((x - c.ma) * c.s),
        eb * ((z - c.mb) * c.s),
        ea * u,
        if u.abs() < 0.1 { sp } else { kp_ },
        eb * ur,
        if ur.abs() < 0.1 { sq } else { kq_ },
    ]
}

/// `Σ v` in LANES f32 lanes per block of BLOCK elements, the blocks added in f64.
#[inline(always)]
fn sum_f32(v: &[f32]) -> f64 {
    let mut total = 0.0f64;
    for blk in v.chunks(BLOCK) {
        total += lanes_sum(blk);
    }
    total
}

/// `Σ v` for one block: LANES f32 lanes, then f64.
#[inline(always)]
fn lanes_sum(v: &[f32]) -> f64 {
    let mut lanes = [0.0f32; LANES];
    let body = v.len() / LANES * LANES;
    for c in v[..body].chunks_exact(LANES) {
        for l in 0..LANES {
            lanes[l] += c[l];
        }
    }
    let tail: f64 = v[body..].iter().map(|&x| x as f64).sum();
    lanes.iter().map(|&x| x as f64).sum::<f64>() + tail
}

/// The f32 fast path (see the module). `None` for rows the f64 path takes.
pub(super) fn row_fast32(sc: &mut Scratch32, inv_t: f64, y: Option<usize>) -> Option<Row> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX-512F and FMA are present (just detected).
            return unsafe { row_fast32_avx512(sc, inv_t, y) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present (just detected).
            return unsafe { row_fast32_avx2(sc, inv_t, y) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // NEON and fused multiply-add are part of the aarch64 baseline
        return row_fast32_impl::<true>(sc, inv_t, y);
    }
    #[allow(unreachable_code)]
    row_fast32_impl::<false>(sc, inv_t, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn row_fast32_avx512(sc: &mut Scratch32, inv_t: f64, y: Option<usize>) -> Option<Row> {
    row_fast32_impl::<true>(sc, inv_t, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_fast32_avx2(sc: &mut Scratch32, inv_t: f64, y: Option<usize>) -> Option<Row> {
    row_fast32_impl::<true>(sc, inv_t, y)
}

#[inline(always)]
fn row_fast32_impl<const FMA: bool>(
    sc: &mut Scratch32,
    inv_t: f64,
    y: Option<usize>,
) -> Option<Row> {
    let Scratch32 { a, b, wa, wb } = sc;
    let n = a.len();
    let (lo_a, ma) = min_max::<f32, LANES>(a);
    let (lo_b, mb) = min_max::<f32, LANES>(b);
    if lo_a == f32::NEG_INFINITY || lo_b == f32::NEG_INFINITY || n == 0 {
        return None; // −∞ entries (or every entry): the general f64 path
    }
    let ia = a.iter().position(|&x| x == ma)?;
    let ib = b.iter().position(|&x| x == mb)?;
    // the constants in f64 (scaled), then f32
    let c1p = (a[ia] as f64 - b[ia] as f64) * inv_t;
    let c1q = (b[ib] as f64 - a[ib] as f64) * inv_t;
    let (maf, mbf) = (ma as f64 * inv_t, mb as f64 * inv_t);
    let (lkp, lkq) = (mbf - maf + c1p, maf - mbf + c1q);
    if !(lkp.abs() <= MAX_LOG_K && lkq.abs() <= MAX_LOG_K) {
        return None;
    }
    let c = Consts {
        ma,
        mb,
        s: inv_t as f32,
        c1p: c1p as f32,
        c1q: c1q as f32,
        kp: lkp.exp() as f32,
        kq: lkq.exp() as f32,
    };
    // the weights first: a plain map, which vectorises
    for (w, &x) in wa.iter_mut().zip(a.iter()) {
        *w = exp_neg32::<FMA>((x - ma) * c.s);
    }
    for (w, &z) in wb.iter_mut().zip(b.iter()) {
        *w = exp_neg32::<FMA>((z - mb) * c.s);
    }
    // per block: the terms by a map (vectorises), then each sum in f32 lanes, then f64
    let mut acc = [0.0f64; 6];
    let mut t = [[0.0f32; BLOCK]; 6];
    let mut j = 0;
    while j < n {
        let len = BLOCK.min(n - j);
        let (ca, cb) = (&a[j..j + len], &b[j..j + len]);
        let (cwa, cwb) = (&wa[j..j + len], &wb[j..j + len]);
        for k in 0..len {
            let e = terms::<FMA>(ca[k], cb[k], cwa[k], cwb[k], &c);
            for q in 0..6 {
                t[q][k] = e[q];
            }
        }
        for q in 0..6 {
            acc[q] += lanes_sum(&t[q][..len]);
        }
        j += len;
    }
    // Σ_{i≠mode} weights (the mode's weight is exactly 1; leaving it out keeps log1p exact)
    let rest = |w: &mut [f32], mode: usize| {
        w[mode] = 0.0;
        let r = sum_f32(w);
        w[mode] = 1.0;
        r
    };
    let (ra, rb) = (rest(wa, ia), rest(wb, ib));
    let dp = Dir::new(maf, ra, 0.0, acc[0], c1p, 0.0);
    let dq = Dir::new(mbf, rb, 0.0, acc[1], c1q, 0.0);
    let fp = Sums {
        u: acc[2],
        w: acc[3],
        ..Sums::default()
    };
    let fq = Sums {
        u: acc[4],
        w: acc[5],
        ..Sums::default()
    };
    let (klp, lam) = fp.finish(&dp);
    let (klq, lam_q) = fq.finish(&dq);
    if !(lam.is_finite() && lam_q.is_finite() && (lkp - lam).abs() <= MAX_LOG_K) {
        return None;
    }
    // TV: Σ p_i |q_i/p_i − 1| with q_i/p_i = e^{−u_i − λ}, i.e. |wb·K e^{−λ} − wa| / s_a
    let cst = (lkp - lam).exp() as f32;
    let mut tv = 0.0f64;
    for (ba, bb) in wa.chunks(BLOCK).zip(wb.chunks(BLOCK)) {
        let mut lanes = [0.0f32; LANES];
        let body = ba.len() / LANES * LANES;
        for (ca, cb) in ba[..body]
            .chunks_exact(LANES)
            .zip(bb[..body].chunks_exact(LANES))
        {
            for l in 0..LANES {
                lanes[l] += madd::<FMA>(cb[l], cst, -ca[l]).abs();
            }
        }
        let tail: f64 = (body..ba.len())
            .map(|i| madd::<FMA>(bb[i], cst, -ba[i]).abs() as f64)
            .sum();
        tv += lanes.iter().map(|&x| x as f64).sum::<f64>() + tail;
    }
    let tv = (0.5 * tv / dp.s).clamp(0.0, 1.0);
    let (lp, lq) = match y {
        Some(y) => (
            (a[y] as f64 - ma as f64) * inv_t - dp.ln_s,
            (b[y] as f64 - mb as f64) * inv_t - dq.ln_s,
        ),
        None => (0.0, 0.0),
    };
    Some((
        klp.max(0.0),
        klq.max(0.0),
        tv,
        dp.entropy,
        dq.entropy,
        lp,
        lq,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64* in [0, 1).
    fn uniform(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn min_max_is_the_fold() {
        let mut u = uniform(7);
        for n in 1..80 {
            // coarse values: ties between lanes and with the tail
            let v: Vec<f32> = (0..n).map(|_| (u() * 16.0).floor() as f32 - 8.0).collect();
            let lo = v.iter().cloned().fold(f32::INFINITY, f32::min);
            let hi = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(min_max::<f32, LANES>(&v), (lo, hi), "n = {n}");
            // the extremes in the tail only
            let mut w = v.clone();
            w[n - 1] = -100.0;
            if n > 1 {
                w[n - 2] = 100.0;
            }
            let lo = w.iter().cloned().fold(f32::INFINITY, f32::min);
            let hi = w.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(
                min_max::<f32, LANES>(&w),
                (lo, hi),
                "n = {n}, extremes last"
            );
        }
    }

    #[test]
    fn decode_flags_nan_and_plus_infinity_in_every_dtype() {
        let mut sc = Scratch32::new(0);
        let vals = [1.5f32, -2.25, f32::NEG_INFINITY, 0.0, 96.0];
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let enc = |v: &[f32]| -> Logits {
                let bytes: Vec<u8> = match dt {
                    DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    DType::F16 => v
                        .iter()
                        .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
                        .collect(),
                    DType::BF16 => v
                        .iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
                        .collect(),
                };
                Logits::from_bytes(bytes, dt, 1, v.len()).unwrap()
            };
            let good = enc(&vals);
            assert_eq!(sc.decode(&good, &good, 0), Ok(()), "{dt:?}");
            assert_eq!(sc.a, vals, "{dt:?}: decoded exactly");
            for (k, bad) in [f32::NAN, f32::INFINITY].into_iter().enumerate() {
                for at in [0, 4] {
                    let mut v = vals;
                    v[at] = bad;
                    let l = enc(&v);
                    assert_eq!(sc.decode(&l, &good, 0), Err("rollout_logits"), "{dt:?} {k}");
                    assert_eq!(sc.decode(&good, &l, 0), Err("old_logits"), "{dt:?} {k}");
                }
            }
        }
        // a vocabulary change resizes the buffers
        let l = Logits::from_f32(&[0.5; 3], 1, 3).unwrap();
        assert_eq!(sc.decode(&l, &l, 0), Ok(()));
        assert_eq!((sc.a.len(), sc.wb.len()), (3, 3));
    }

    /// Every row length (lanes, the tail, blocks of 512) takes the f32 path, with the maxima
    /// anywhere, and agrees with the f64 reference at the GPU tolerance; −∞ entries do not.
    #[test]
    fn the_f32_path_takes_every_row_length() {
        use crate::cpu::vocab_divergence;
        let mut u = uniform(11);
        for n in [1usize, 2, 7, 15, 16, 17, 33, 511, 512, 513, 1100] {
            for place in [0, n / 2, n - 1] {
                let mut a: Vec<f32> = (0..n).map(|_| (3.0 * u()) as f32).collect();
                let mut b: Vec<f32> = a.iter().map(|&x| x + (0.3 * u()) as f32).collect();
                a[place] = 9.0;
                b[n - 1 - place] = 8.0;
                let (la, lb) = (
                    Logits::from_f32(&a, 1, n).unwrap(),
                    Logits::from_f32(&b, 1, n).unwrap(),
                );
                let y = n / 3;
                let mut sc = Scratch32::new(n);
                sc.decode(&la, &lb, 0).unwrap();
                for t in [1.0, 0.8] {
                    let got = row_fast32(&mut sc, 1.0 / t, Some(y))
                        .unwrap_or_else(|| panic!("n {n} at {place}: the f32 path"));
                    let w = vocab_divergence(&la, &lb, Some(&[y as i64]), &[true], t).unwrap();
                    let want = [
                        w.kl[0],
                        w.kl_rev[0],
                        w.tv[0],
                        w.rollout_entropy[0],
                        w.training_entropy[0],
                        w.rollout_logp[0],
                        w.train_logp[0],
                    ];
                    let got = [got.0, got.1, got.2, got.3, got.4, got.5, got.6];
                    let tol = [2e-3, 2e-3, 2e-3, 1e-5, 1e-5, 1e-5, 1e-5];
                    for k in 0..7 {
                        let err = (got[k] - want[k]).abs();
                        assert!(
                            err <= tol[k] * want[k].abs() + 1e-7,
                            "n {n} at {place} τ {t} field {k}: {} vs {}",
                            got[k],
                            want[k]
                        );
                    }
                }
                a[(place + 1) % n] = f32::NEG_INFINITY;
                if n > 1 {
                    let la = Logits::from_f32(&a, 1, n).unwrap();
                    sc.decode(&la, &lb, 0).unwrap();
                    assert!(row_fast32(&mut sc, 1.0, None).is_none(), "n {n}: −∞");
                }
            }
        }
    }

    /// `exp_neg32` against f64's `exp`, on a grid over its domain and at the cut.
    #[test]
    fn exp_neg32_is_within_two_ulp() {
        for fma in [false, true] {
            let mut x = 0.0f32;
            while x > -90.0 {
                let got = if fma {
                    exp_neg32::<true>(x)
                } else {
                    exp_neg32::<false>(x)
                };
                let want = (x as f64).exp();
                if x < -87.0 {
                    assert_eq!(got, 0.0, "x = {x}");
                } else {
                    let rel = (got as f64 - want).abs() / want;
                    assert!(rel < 2.5e-7, "x = {x}: {got} vs {want} ({rel:e})");
                }
                x -= 0.001_37;
            }
            assert_eq!(
                exp_neg32::<false>(0.0),
                1.0,
                "the mode's weight is exactly 1"
            );
            assert_eq!(exp_neg32::<false>(f32::NEG_INFINITY), 0.0);
        }
    }

    /// The series for `w(u)` against f64's `exp_m1(−u) + u` on `|u| < 0.1`.
    #[test]
    fn w_series32_matches_f64() {
        for k in -1000..1000 {
            let u = k as f32 * 1e-4 + 3.7e-6;
            let got = w_series32::<true>(u) as f64;
            let uf = u as f64;
            let want = (-uf).exp_m1() + uf;
            assert!(
                (got - want).abs() <= 3e-7 * want + 1e-30,
                "u = {u}: {got} vs {want}"
            );
        }
    }
}
