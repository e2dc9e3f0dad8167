//! The general path of the CPU vocabulary divergences (any row, including −∞ entries): four
//! streaming passes, log-space extremes and log-sum-exp fallbacks; plus the per-thread row
//! buffers and the decoding both paths share.

use crate::input::logits::{DType, Logits};
use crate::math::{log1p_minus_x, w_of};

/// One row's results: `(kl, kl_rev, tv, h_p, h_q, logp_y, logq_y)`.
pub(super) type Row = (f64, f64, f64, f64, f64, f64, f64);

/// Elements with `u < −T_EXT` enter `E[e^{−u}]` through log space.
const T_EXT: f64 = 30.0;

/// Per-thread row buffers, reused across rows.
pub(super) struct Scratch {
    pub(super) a: Vec<f64>,
    pub(super) b: Vec<f64>,
    pub(super) wa: Vec<f64>,
    pub(super) wb: Vec<f64>,
}

impl Scratch {
    pub(super) fn new(v: usize) -> Self {
        Scratch {
            a: vec![0.0; v],
            b: vec![0.0; v],
            wa: vec![0.0; v],
            wb: vec![0.0; v],
        }
    }
}

/// Decodes row `r` into `out` (scaled by `inv_t`); false if it holds NaN or +inf.
pub(super) fn decode_scaled(l: &Logits, r: usize, out: &mut [f64], inv_t: f64) -> bool {
    decode_scaled_range(l, r, 0, out, inv_t)
}

/// Decodes `out.len()` elements of row `r` from column `start` into `out` (scaled by `inv_t`);
/// false if they hold NaN or +inf. Branch-free loops (vectorised; an AVX2 build is picked at
/// run time).
pub(super) fn decode_scaled_range(
    l: &Logits,
    r: usize,
    start: usize,
    out: &mut [f64],
    inv_t: f64,
) -> bool {
    let es = l.dtype().size();
    let bytes = &l.row_bytes(r)[start * es..(start + out.len()) * es];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present (just detected).
            return unsafe { decode_scaled_avx512(l.dtype(), bytes, out, inv_t) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (just detected).
            return unsafe { decode_scaled_avx2(l.dtype(), bytes, out, inv_t) };
        }
    }
    decode_scaled_impl(l.dtype(), bytes, out, inv_t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn decode_scaled_avx512(dt: DType, bytes: &[u8], out: &mut [f64], inv_t: f64) -> bool {
    decode_scaled_impl(dt, bytes, out, inv_t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_scaled_avx2(dt: DType, bytes: &[u8], out: &mut [f64], inv_t: f64) -> bool {
    decode_scaled_impl(dt, bytes, out, inv_t)
}

#[inline(always)]
fn decode_scaled_impl(dt: DType, bytes: &[u8], out: &mut [f64], inv_t: f64) -> bool {
    let mut bad = false;
    match dt {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                bad |= (w & 0x7fff_ffff) > 0x7f80_0000 || w == 0x7f80_0000;
                *o = f32::from_bits(w) as f64;
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let h = u16::from_le_bytes([c[0], c[1]]);
                bad |= (h & 0x7fff) > 0x7c00 || h == 0x7c00;
                *o = half::f16::from_bits(h).to_f64();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let h = u16::from_le_bytes([c[0], c[1]]);
                bad |= (h & 0x7fff) > 0x7f80 || h == 0x7f80;
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

/// Per-direction constants: weights `wx = e^{x − m}`, sums and the shift.
pub(super) struct Dir {
    pub(super) m: f64,
    pub(super) s: f64,
    pub(super) ln_s: f64,
    pub(super) out: f64, // own mass where the other side is −inf (normalised)
    pub(super) entropy: f64,
    pub(super) c1: f64, // d (this direction's sign) at the mode over the common support
    pub(super) c2: f64, // E[d − c1]
}

/// Pass-3 sums of one direction (unnormalised).
#[derive(Default)]
pub(super) struct Sums {
    pub(super) u: f64,
    pub(super) w: f64,
    pub(super) ue: f64,
    pub(super) pe: f64,
    /// `Σ_ext e^{y − top}`: the other side's weights of the extreme elements, relative to
    /// `top` (the other side's maximum over the common support, so that a common support far
    /// below the other side's maximum does not underflow them all)
    pub(super) ee: f64,
    pub(super) top: f64,
}

impl Dir {
    /// From the row's maximum `m`, `rest = Σ_{i≠mode} e^{x_i − m}`, the unnormalised own mass
    /// where the other side is −∞, `h = Σ e^{x_i − m}(m − x_i)`, and the shift's two parts.
    pub(super) fn new(m: f64, rest: f64, out: f64, h: f64, c1: f64, c2: f64) -> Dir {
        let s = 1.0 + rest;
        let ln_s = rest.ln_1p();
        Dir {
            m,
            s,
            ln_s,
            out: out / s,
            entropy: (ln_s - h / s).max(0.0),
            c1,
            c2,
        }
    }
}

impl Sums {
    #[inline]
    fn push(&mut self, u: f64, wx: f64, y: f64) {
        if u >= -T_EXT {
            self.u += wx * u;
            self.w += wx * w_of(u);
        } else {
            self.ue += wx * u;
            self.pe += wx;
            self.ee += (y - self.top).exp();
        }
    }

    /// `(KL before the −log1p(−other_out) term, log E_x[e^{−u}])`.
    pub(super) fn finish(&self, dx: &Dir) -> (f64, f64) {
        let inv = 1.0 / dx.s;
        let (uu, ww, ue, pe) = (self.u * inv, self.w * inv, self.ue * inv, self.pe * inv);
        let base = ww - uu - dx.out - pe;
        let mut x = base;
        let mut ext = 0.0;
        let mut big = None;
        if self.ee > 0.0 {
            // Σ_ext p e^{−u} = ee·e^K
            let lk = ((self.top - dx.m) + dx.c1 + dx.c2) - dx.ln_s + self.ee.ln();
            if lk < 600.0 {
                ext = lk.exp();
                x = base + ext;
            } else {
                // log(1 + base + e^lk) = lk + log1p((1 + base)·e^−lk), and 1 + base ≤ e^30
                // (w(u) ≤ e^30 where u ≥ −30): the log1p term is below e^−570, far under
                // lk's last bit
                big = Some(lk);
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

/// Where a row's elements come from: the whole row already decoded in the scratch (weights
/// stored on the first weighted visit), or the row's bytes read in blocks of the scratch's
/// length (decoded again, weights recomputed, on every visit), so that the scratch does not grow
/// with the vocabulary.
pub(super) struct RowSrc<'a> {
    sc: &'a mut Scratch,
    blocks: Option<(&'a Logits, &'a Logits, usize, f64)>, // rollout, train, row, 1/τ
    weighted: bool,
}

impl<'a> RowSrc<'a> {
    /// The row decoded in `sc.a` / `sc.b` (all of it).
    pub(super) fn whole(sc: &'a mut Scratch) -> Self {
        RowSrc {
            sc,
            blocks: None,
            weighted: false,
        }
    }

    /// Row `r` of `rollout` / `train`, scaled by `inv_t`, in blocks of `sc.a.len()` elements.
    pub(super) fn blocked(
        sc: &'a mut Scratch,
        rollout: &'a Logits,
        train: &'a Logits,
        r: usize,
        inv_t: f64,
    ) -> Self {
        RowSrc {
            sc,
            blocks: Some((rollout, train, r, inv_t)),
            weighted: false,
        }
    }

    /// Calls `f(i, a_i, b_i, wa_i, wb_i)` for every element in order, with the weights
    /// `wa = e^{a − ma}`, `wb = e^{b − mb}` (0 at −∞) when `w = Some((ma, mb))`, else 0.
    /// `Err(tensor)` if a block holds NaN or +∞ (the bytes changed since they were checked).
    fn visit(
        &mut self,
        w: Option<(f64, f64)>,
        mut f: impl FnMut(usize, f64, f64, f64, f64),
    ) -> std::result::Result<(), &'static str> {
        let Scratch { a, b, wa, wb } = &mut *self.sc;
        let Some((lr, lt, r, inv_t)) = self.blocks else {
            match w {
                None => (0..a.len()).for_each(|i| f(i, a[i], b[i], 0.0, 0.0)),
                Some(_) if self.weighted => {
                    (0..a.len()).for_each(|i| f(i, a[i], b[i], wa[i], wb[i]))
                }
                Some((ma, mb)) => {
                    for i in 0..a.len() {
                        (wa[i], wb[i]) = (weight(a[i], ma), weight(b[i], mb));
                        f(i, a[i], b[i], wa[i], wb[i]);
                    }
                    self.weighted = true;
                }
            }
            return Ok(());
        };
        let (v, step) = (lr.vocab(), a.len());
        let mut start = 0;
        while start < v {
            let n = step.min(v - start);
            if !decode_scaled_range(lr, r, start, &mut a[..n], inv_t) {
                return Err("rollout_logits");
            }
            if !decode_scaled_range(lt, r, start, &mut b[..n], inv_t) {
                return Err("old_logits");
            }
            for i in 0..n {
                let (x, z) = (a[i], b[i]);
                let (ex, ez) = w.map_or((0.0, 0.0), |(ma, mb)| (weight(x, ma), weight(z, mb)));
                f(start + i, x, z, ex, ez);
            }
            start += n;
        }
        Ok(())
    }
}

/// `e^{x − m}`, 0 at `x = −∞`.
#[inline(always)]
fn weight(x: f64, m: f64) -> f64 {
    if x > f64::NEG_INFINITY {
        (x - m).exp()
    } else {
        0.0
    }
}

/// The general path on a whole decoded row (see [`row_general_src`]).
pub(super) fn row_general(
    sc: &mut Scratch,
    y: Option<usize>,
) -> std::result::Result<Row, (&'static str, String)> {
    row_general_src(&mut RowSrc::whole(sc), y)
}

/// The general path (any row): four passes, log-space extremes, LSE fallbacks; over a whole
/// decoded row or a row read in blocks (identical results: the same operations in the same
/// order).
pub(super) fn row_general_src(
    src: &mut RowSrc,
    y: Option<usize>,
) -> std::result::Result<Row, (&'static str, String)> {
    let changed = |name: &'static str| (name, "holds NaN or +inf (the input changed)".into());
    let ninf = f64::NEG_INFINITY;
    // pass 1: maxima (first index), the modes over the common support, the sampled values
    let (mut ia, mut ib) = (usize::MAX, usize::MAX);
    let (mut ma, mut mb) = (ninf, ninf);
    let (mut ca, mut cb) = (usize::MAX, usize::MAX); // mode of a / b where both finite
    let (mut ca_v, mut cb_v) = ((ninf, ninf), (ninf, ninf)); // (a, b) at ca / at cb
    let mut at_y = (0.0, 0.0);
    src.visit(None, |i, x, z, _, _| {
        if x > ninf && (ia == usize::MAX || x > ma) {
            (ia, ma) = (i, x);
        }
        if z > ninf && (ib == usize::MAX || z > mb) {
            (ib, mb) = (i, z);
        }
        if x > ninf && z > ninf {
            if ca == usize::MAX || x > ca_v.0 {
                (ca, ca_v) = (i, (x, z));
            }
            if cb == usize::MAX || z > cb_v.1 {
                (cb, cb_v) = (i, (x, z));
            }
        }
        if Some(i) == y {
            at_y = (x, z);
        }
    })
    .map_err(changed)?;
    if ia == usize::MAX {
        return Err(("rollout_logits", "every entry is -inf".into()));
    }
    if ib == usize::MAX {
        return Err(("old_logits", "every entry is -inf".into()));
    }
    let common = ca != usize::MAX;
    let (c1p, c1q) = if common {
        (ca_v.0 - ca_v.1, cb_v.1 - cb_v.0)
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
    src.visit(Some((ma, mb)), |i, x, z, ex, ez| {
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
    })
    .map_err(changed)?;
    let dir = |m: f64, rest: f64, out: f64, h: f64, su: f64, s_in: f64, c1: f64| {
        Dir::new(
            m,
            rest,
            out,
            h,
            c1,
            if s_in > 0.0 { su / s_in } else { 0.0 },
        )
    };
    let dp = dir(ma, ra, oa, ha, sua, ina, c1p);
    let dq = dir(mb, rb, ob, hb, sub, inb, c1q);
    let (lp, lq) = match y {
        Some(_) => (at_y.0 - ma - dp.ln_s, at_y.1 - mb - dq.ln_s),
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
    // pass 3: second-order sums around the shifts; with it, the common-support sums of
    // e^{x − top} that −log(mass on the other side's support) needs when that mass is < ½
    let fp_top = Sums {
        top: cb_v.1,
        ..Sums::default()
    };
    let fq_top = Sums {
        top: ca_v.0,
        ..Sums::default()
    };
    let (mut fp, mut fq) = (fp_top, fq_top);
    let (need_a, need_b) = (dp.out > 0.5, dq.out > 0.5);
    let (mut lse_a, mut lse_b) = (0.0, 0.0);
    src.visit(Some((ma, mb)), |_, x, z, ex, ez| {
        if x > ninf && z > ninf {
            let d = x - z;
            fp.push((d - c1p) - dp.c2, ex, z);
            fq.push((-d - c1q) - dq.c2, ez, x);
            if need_a {
                lse_a += (x - ca_v.0).exp();
            }
            if need_b {
                lse_b += (z - cb_v.1).exp();
            }
        }
    })
    .map_err(changed)?;
    let (klp, lam_p) = fp.finish(&dp);
    let (klq, _) = fq.finish(&dq);
    // −log(mass on the other side's support): log1p while that mass is ≥ ½, else a log-sum-exp
    // over the common support around its own maximum (the plain sums may underflow there).
    let neg_log_in = |top: f64, s: f64, m: f64, d: &Dir| -> f64 {
        if d.out <= 0.5 {
            return -(-d.out).ln_1p();
        }
        d.ln_s - ((top - m) + s.ln())
    };
    let nq = neg_log_in(cb_v.1, lse_b, mb, &dq);
    let np = neg_log_in(ca_v.0, lse_a, ma, &dp);
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
    src.visit(Some((ma, mb)), |_, x, z, ex, ez| {
        if x > ninf && z > ninf {
            let u = ((x - z) - c1p) - dp.c2;
            let v = -u - lam;
            let p = ex * isa;
            tv += if v.abs() <= 1.0 {
                p * v.exp_m1().abs()
            } else {
                (p - ez * isb).abs()
            };
        }
    })
    .map_err(changed)?;
    let tv = (0.5 * (tv + dp.out + dq.out)).clamp(0.0, 1.0);
    Ok((kl, kl_rev, tv, dp.entropy, dq.entropy, lp, lq))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype: NaN and +∞ make the row bad, −∞ and the largest finite value do not, and
    /// the values come out scaled by `inv_t`.
    #[test]
    fn decode_flags_nan_and_plus_infinity_in_every_dtype() {
        // bit patterns: (largest finite, +inf, a quiet NaN, a NaN with the sign bit, −inf, 1.5)
        let f32s: [u32; 6] = [
            0x7f7f_ffff,
            0x7f80_0000,
            0x7fc0_0000,
            0xffc0_0001,
            0xff80_0000,
            0x3fc0_0000,
        ];
        let f16s: [u16; 6] = [0x7bff, 0x7c00, 0x7e00, 0xfe01, 0xfc00, 0x3e00];
        let bf16s: [u16; 6] = [0x7f7f, 0x7f80, 0x7fc0, 0xffc1, 0xff80, 0x3fc0];
        let cases: [(DType, Vec<Vec<u8>>); 3] = [
            (
                DType::F32,
                f32s.iter().map(|w| w.to_le_bytes().to_vec()).collect(),
            ),
            (
                DType::F16,
                f16s.iter().map(|w| w.to_le_bytes().to_vec()).collect(),
            ),
            (
                DType::BF16,
                bf16s.iter().map(|w| w.to_le_bytes().to_vec()).collect(),
            ),
        ];
        for (dt, words) in cases {
            let row = |ks: &[usize]| {
                let bytes: Vec<u8> = ks.iter().flat_map(|&k| words[k].clone()).collect();
                Logits::from_bytes(bytes, dt, 1, ks.len()).unwrap()
            };
            let good = row(&[0, 4, 5]);
            let mut out = [0.0; 3];
            assert!(decode_scaled(&good, 0, &mut out, 0.5), "{dt:?}");
            let max = dt.decode(good.row_bytes(0), 0) as f64;
            assert_eq!(out, [max * 0.5, f64::NEG_INFINITY, 0.75], "{dt:?}");
            for bad in [1, 2, 3] {
                let l = row(&[5, bad, 0]);
                assert!(!decode_scaled(&l, 0, &mut out, 1.0), "{dt:?} word {bad}");
            }
        }
    }
}
