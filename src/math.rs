//! The one f64 copy of the shared formulas (layer 0): k3 = `expm1(x) − x`, `w(u) = expm1(−u) + u`,
//! `log1p(x) − x` with their series for small arguments, Neumaier summation and a log-sum-exp
//! that keeps small complements. The CPU engine, the top-K path and the metrics all call these;
//! `shaders/common/math.wgsl` is their f32 twin.

/// `e^x` for `|x| ≤ 700` (callers clamp: the ratios clamp the log-ratio to ±20), within one
/// ulp of the exact value, with the same bits on every x86-64 or ARM CPU (no table, no FMA):
/// `x = k·ln 2 + r` with `|r| ≤ ln 2 / 2` (Cody–Waite), `e^r − 1` by its Taylor series to
/// degree 13 (truncation below 0.03 ulp), scaled by `2^k` through the exponent bits. Written
/// branch-free so that a loop over a slice vectorises; NaN stays NaN (tested against libm
/// below).
#[inline(always)]
pub fn exp_bounded(x: f64) -> f64 {
    // 1.5 · 2^52: adding it rounds to an integer (ties to even) in the low mantissa bits
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    // fdlibm's split of ln 2: the high part has 32 trailing zero bits, so k·LN2_HI is exact
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    let kd = x * std::f64::consts::LOG2_E + SHIFT;
    let k = kd - SHIFT;
    let ki = (kd.to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // e^r − 1 = r + r²·P(r), P(r) = Σ_{n≥2} r^{n−2}/n! (Horner, degree 13 in all)
    let mut p = 1.0 / 6_227_020_800.0; // 1/13!
    p = p * r + 1.0 / 479_001_600.0;
    p = p * r + 1.0 / 39_916_800.0;
    p = p * r + 1.0 / 3_628_800.0;
    p = p * r + 1.0 / 362_880.0;
    p = p * r + 1.0 / 40_320.0;
    p = p * r + 1.0 / 5_040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    let em1 = r + (r * r) * p;
    let scale = f64::from_bits((ki.wrapping_add(1023) as u64) << 52);
    (1.0 + em1) * scale
}

/// `x`'s place in [`f64::total_cmp`]'s order as an unsigned integer (integer keys sort faster
/// than a comparator); [`from_order_bits`] inverts it.
#[inline(always)]
pub(crate) fn order_bits(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

/// The f64 of [`order_bits`].
#[inline(always)]
pub(crate) fn from_order_bits(u: u64) -> f64 {
    f64::from_bits(if u >> 63 == 1 { u & !(1 << 63) } else { !u })
}

/// `v` sorted by [`f64::total_cmp`] (equal values in any order), in parallel on integer keys,
/// in place.
pub(crate) fn par_sort_total(v: &mut [f64]) {
    use rayon::slice::ParallelSliceMut;
    let keys: &mut [u64] = bytemuck::cast_slice_mut(v);
    keys.iter_mut()
        .for_each(|k| *k = order_bits(f64::from_bits(*k)));
    keys.par_sort_unstable();
    keys.iter_mut()
        .for_each(|k| *k = from_order_bits(*k).to_bits());
}

/// Lanes of a [`LaneSum`]: slot `i` of a sequence adds into lane `i mod LANES`.
pub const LANES: usize = 8;

/// A sum over the slots of one sequence in [`LANES`] interleaved lanes (slot `i` into lane
/// `i mod LANES`), folded lane 0 first: the same bits whichever way the slots are visited,
/// whole or in tiles of a multiple of `LANES`, and a loop that vectorises. Up to `LANES`
/// terms it equals the plain left-to-right sum. The CPU engine's segment sums and the lean
/// pass both sum this way, so their sequence statistics agree to the bit.
/// The `LANES` elements of `s` from `j0` (one bounds check for the octet).
#[inline(always)]
pub(crate) fn octet<T>(s: &[T], j0: usize) -> &[T; LANES] {
    s[j0..j0 + LANES].try_into().expect("an octet")
}

#[derive(Clone, Copy, Debug, Default)]
pub struct LaneSum([f64; LANES]);

impl LaneSum {
    /// Adds `xs`, whose first element is a slot at a multiple of [`LANES`] from the
    /// sequence's start (only the sequence's last call may have a length that is not a
    /// multiple of `LANES`).
    #[inline(always)]
    pub fn add(&mut self, xs: &[f64]) {
        let mut it = xs.chunks_exact(LANES);
        for c in &mut it {
            for (l, x) in self.0.iter_mut().zip(c) {
                *l += x;
            }
        }
        for (l, x) in self.0.iter_mut().zip(it.remainder()) {
            *l += x;
        }
    }
    /// Adds one slot per lane (`xs[l]` into lane `l`): [`LaneSum::add`] of `LANES` slots.
    #[inline(always)]
    pub fn add8(&mut self, xs: &[f64; LANES]) {
        for (l, x) in self.0.iter_mut().zip(xs) {
            *l += x;
        }
    }
    /// Adds one slot's `x` to lane `l` (the slot's index from the sequence's start, mod
    /// [`LANES`]): [`LaneSum::add8`] of an octet whose other slots are 0.
    #[inline(always)]
    pub fn add_at(&mut self, l: usize, x: f64) {
        self.0[l % LANES] += x;
    }
    /// Adds `xs[l]` where `m[l]` is all ones, 0 where it is 0 (the same bits as skipping
    /// them: a lane is never −0).
    #[inline(always)]
    pub fn add8_where(&mut self, xs: &[f64; LANES], m: &[u64; LANES]) {
        for ((l, x), &m) in self.0.iter_mut().zip(xs).zip(m) {
            *l += f64::from_bits(x.to_bits() & m);
        }
    }
    /// Adds `xs[i]` where `keep[i]`, 0 elsewhere (the same bits as skipping them: a lane is
    /// never −0).
    #[inline(always)]
    pub fn add_where(&mut self, xs: &[f64], keep: &[bool]) {
        let mut it = xs.chunks_exact(LANES).zip(keep.chunks_exact(LANES));
        for (c, k) in &mut it {
            for ((l, x), &k) in self.0.iter_mut().zip(c).zip(k) {
                *l += if k { *x } else { 0.0 };
            }
        }
        let done = xs.len() / LANES * LANES;
        for ((l, x), &k) in self.0.iter_mut().zip(&xs[done..]).zip(&keep[done..]) {
            *l += if k { *x } else { 0.0 };
        }
    }
    /// The sum: lane 0, plus lane 1, … (left to right).
    pub fn value(&self) -> f64 {
        self.0[1..].iter().fold(self.0[0], |s, &x| s + x)
    }
}

/// `1/n!` for `n = 2..=14`: the Taylor coefficients of `expm1(x) − x`.
const K3_SERIES: [f64; 13] = [
    0.5,
    0.16666666666666666,
    0.041666666666666664,
    0.008333333333333333,
    0.001388888888888889,
    0.0001984126984126984,
    2.48015873015873e-05,
    2.7557319223985893e-06,
    2.755731922398589e-07,
    2.505210838544172e-08,
    2.08767569878681e-09,
    1.6059043836821613e-10,
    1.1470745597729725e-11,
];

/// `expm1(x) − x` for `|x| < 0.1` by its Taylor series to `x¹⁴` in Horner form (no division,
/// no branch: a loop over values vectorises), to full f64 precision there.
#[inline(always)]
pub fn k3_series(x: f64) -> f64 {
    let mut p = K3_SERIES[12];
    for &c in K3_SERIES[..12].iter().rev() {
        p = p * x + c;
    }
    p * x * x
}

/// `expm1(x) − x`, accurate to the last bits for every x (series for small |x|).
#[inline]
pub fn k3_from_log_ratio(x: f64) -> f64 {
    if x.abs() < 0.1 {
        k3_series(x)
    } else {
        x.exp_m1() - x
    }
}

/// `w(u) = expm1(−u) + u ≥ 0` to full f64 precision: the k3 of `−u`.
#[inline]
pub fn w_of(u: f64) -> f64 {
    k3_from_log_ratio(-u)
}

/// `log1p(x) − x` for x > −1, accurate for small |x|.
pub fn log1p_minus_x(x: f64) -> f64 {
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

/// Σ of `terms` with Neumaier's compensation (error ≈ 1 ulp of the result, any length).
pub fn neumaier_sum(terms: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for x in terms {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
    }
    s + c
}

/// `ln Σ exp(x_i)` with the largest term factored out and `ln_1p` of the rest, so that
/// `−expm1` of it keeps a small complement.
pub fn log_sum_exp(x: &[f64]) -> f64 {
    let (mut m, mut arg) = (f64::NEG_INFINITY, usize::MAX);
    for (i, &v) in x.iter().enumerate() {
        if v > m {
            m = v;
            arg = i;
        }
    }
    if arg == usize::MAX {
        return f64::NEG_INFINITY;
    }
    let rest: f64 = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != arg)
        .map(|(_, &v)| (v - m).exp())
        .sum();
    m + rest.ln_1p()
}

/// `ln(1 − eˣ)` for x < 0 (log1mexp, Mächler's switch at −ln 2); `−∞` at x = 0.
pub fn log1mexp(x: f64) -> f64 {
    if x > -std::f64::consts::LN_2 {
        (-x.exp_m1()).ln()
    } else {
        (-x.exp()).ln_1p()
    }
}

/// The complement `1 − p` that stands in when a log-prob is ≥ 0 (p rounds to 1; AReaL's clamp
/// `p ≤ 1 − 1e-8`). Complements that are merely tiny (p within 1e-9 of 1) are used exactly.
pub const BINARY_KL_FLOOR: f64 = 1e-8;

/// `x·(e^u − 1 − u)` given `y = x·e^u` and `s = k3_series(u)`: a term of a KL in the
/// `Σ x·k3(ln(y/x))` form, never negative up to rounding and free of cancellation (series for
/// small u, `y − x(1+u)` for u > 1).
#[inline(always)]
fn kl_term(x: f64, y: f64, u: f64, s: f64) -> f64 {
    if u > 1.0 {
        y - x * (1.0 + u)
    } else if u.abs() < 0.1 {
        x * s
    } else {
        x * (u.exp_m1() - u)
    }
}

/// KPop's bidirectional binary KL `max(D_B(p‖q), D_B(q‖p))` of the sampled token, from the
/// trainer log-prob `lp`, the rollout's `lq` and the log-ratio `lr = lp − lq` (passed
/// separately: a difference taken in higher precision, or one that keeps its relative
/// precision where `lp − lq` is computed from rounded inputs), where
/// `D_B(p‖q) = p ln(p/q) + (1−p) ln((1−p)/(1−q))`. Each direction is evaluated as
/// `p·k3(lq − lp) + (1−p)·k3(ln((1−q)/(1−p)))` (both terms ≥ 0, so nothing cancels), with
/// `1 − p = −expm1(lp)` and `ln((1−q)/(1−p)) = log1p(q·expm1(lr)/(1−p))`: full precision when p
/// and q are both within 1e-9 of 1. A log-prob ≥ 0 counts as `p = 1 − BINARY_KL_FLOOR`
/// (see docs/CORRECTIONS.md); equal inputs give exactly 0.
pub fn binary_kl(lp: f64, lq: f64, lr: f64) -> f64 {
    let em1 = lr.exp_m1();
    let k3 = if lr.abs() < 0.1 {
        k3_series(lr)
    } else {
        em1 - lr
    };
    binary_kl_given(lp, lq, lr, em1, k3)
}

/// [`binary_kl`] given `em1 = expm1(lr)` and `k3 = k3_from_log_ratio(lr)` (a caller that has
/// them already: the same bits, two functions fewer).
pub fn binary_kl_given(lp: f64, lq: f64, lr: f64, em1: f64, k3: f64) -> f64 {
    let b = BinaryKl::new(lp, lq, lr, em1, k3);
    b.finish(k3_series(-b.d), k3_series(b.v), k3_series(-b.v))
}

/// [`binary_kl_given`] of eight slots: the same bits, its three k3 series per slot in loops
/// over the eight (one vector each).
#[inline(always)]
pub fn binary_kl_given8(
    lp: &[f64; 8],
    lq: &[f64; 8],
    lr: &[f64; 8],
    em1: &[f64; 8],
    k3: &[f64; 8],
) -> [f64; 8] {
    // plain loops over the lanes (`array::from_fn`'s closures stay calls)
    let (mut d, mut v) = ([0.0; 8], [0.0; 8]);
    let mut b = [BinaryKl::default(); 8];
    for l in 0..8 {
        b[l] = BinaryKl::new(lp[l], lq[l], lr[l], em1[l], k3[l]);
        (d[l], v[l]) = (b[l].d, b[l].v);
    }
    let (mut s1, mut s2, mut s3) = ([0.0; 8], [0.0; 8], [0.0; 8]);
    for l in 0..8 {
        s1[l] = k3_series(-d[l]);
        s2[l] = k3_series(v[l]);
        s3[l] = k3_series(-v[l]);
    }
    let mut out = [0.0; 8];
    for l in 0..8 {
        out[l] = b[l].finish(s1[l], s2[l], s3[l]);
    }
    out
}

/// One slot of [`binary_kl`] up to its k3 series.
#[derive(Clone, Copy, Default)]
struct BinaryKl {
    p: f64,
    a: f64,
    q: f64,
    b: f64,
    d: f64,
    v: f64,
    k3: f64,
}

impl BinaryKl {
    #[inline(always)]
    fn new(lp: f64, lq: f64, lr: f64, em1: f64, k3: f64) -> Self {
        let floor = |x: f64| {
            if x >= 0.0 {
                (-BINARY_KL_FLOOR).ln_1p()
            } else {
                x
            }
        };
        let (lp, lq, d, em1, k3) = if lp >= 0.0 || lq >= 0.0 {
            // a clamped side: the ratio follows the clamped log-probs
            let (cp, cq) = (floor(lp), floor(lq));
            let d = cp - cq;
            (cp, cq, d, d.exp_m1(), k3_from_log_ratio(d))
        } else {
            (lp, lq, lr, em1, k3)
        };
        // p = e^lp and its complement a = 1 − p from one call: e^lp below −ln 2 (then
        // a ∈ (½, 1) is `1 − p` to half an ulp), else −expm1(lp) (then p ∈ [½, 1) is `1 − a`
        // likewise)
        let split = |x: f64| {
            if x < -std::f64::consts::LN_2 {
                let e = x.exp();
                (e, 1.0 - e)
            } else {
                let c = -x.exp_m1();
                (1.0 - c, c)
            }
        };
        let ((p, a), (q, b)) = (split(lp), split(lq));
        // v = ln(b/a), (b − a)/a = (p − q)/a = q·expm1(d)/a
        let t = q * em1 / a;
        let v = if t.abs() < 0.5 {
            t.ln_1p()
        } else {
            log1mexp(lq) - log1mexp(lp)
        };
        BinaryKl {
            p,
            a,
            q,
            b,
            d,
            v,
            k3,
        }
    }

    /// The divergence, given `k3_series` of −d, v and −v.
    #[inline(always)]
    fn finish(&self, s1: f64, s2: f64, s3: f64) -> f64 {
        let BinaryKl {
            p,
            a,
            q,
            b,
            d,
            v,
            k3,
        } = *self;
        let fwd = kl_term(p, q, -d, s1) + kl_term(a, b, v, s2);
        // kl_term(q, p, d), its k3 given
        let qd = if d > 1.0 { p - q * (1.0 + d) } else { q * k3 };
        let rev = qd + kl_term(b, a, -v, s3);
        fwd.max(rev)
    }
}

/// `1/n!` for n = 0..=11: the Taylor coefficients shared by the CPU vocabulary fast path.
pub const INV_FACT: [f64; 12] = [
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

/// Unit in the last place of `x` in a float format with `mantissa` explicit bits (0 for 0).
pub fn ulp(x: f64, mantissa: i32) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        (2f64).powi(x.abs().log2().floor() as i32 - mantissa)
    }
}

/// Whether `x` is exactly a bf16 value and exactly an f16 value.
#[inline]
pub fn half_exact(x: f64) -> (bool, bool) {
    (
        half::bf16::from_f64(x).to_f64() == x,
        half::f16::from_f64(x).to_f64() == x,
    )
}

/// A deterministic stream of uniform values in `[0, 1)` (xorshift64) for the crate's tests.
#[cfg(test)]
pub(crate) fn test_uniform() -> impl FnMut() -> f64 {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {

    /// The integer keys keep `total_cmp`'s order and invert to the same bits; the parallel
    /// sort gives the comparator sort's bits (−0 before +0, NaN last, both signs, ±∞).
    #[test]
    fn total_order_keys_sort_as_total_cmp() {
        let mut u = super::test_uniform();
        let mut v: Vec<f64> = (0..20_000)
            .map(|i| match i % 9 {
                0 => -0.0,
                1 => 0.0,
                2 => f64::NAN,
                3 => f64::INFINITY,
                4 => f64::NEG_INFINITY,
                _ => (u() - 0.5) * 10f64.powi((u() * 20.0) as i32 - 10),
            })
            .collect();
        for w in v.windows(2) {
            let (a, b) = (w[0], w[1]);
            assert_eq!(
                super::from_order_bits(super::order_bits(a)).to_bits(),
                a.to_bits()
            );
            assert_eq!(
                super::order_bits(a).cmp(&super::order_bits(b)),
                a.total_cmp(&b)
            );
        }
        let mut want = v.clone();
        want.sort_by(f64::total_cmp);
        super::par_sort_total(&mut v);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&v), bits(&want));
    }

    #[test]
    fn lane_sum_is_order_free_and_plain_up_to_lanes() {
        let xs: Vec<f64> = (0..1037)
            .map(|i| ((i * 7919) % 1013) as f64 * 0.1 - 37.3)
            .collect();
        let keep: Vec<bool> = (0..xs.len()).map(|i| i % 5 != 3).collect();
        let mut whole = LaneSum::default();
        whole.add_where(&xs, &keep);
        let mut tiled = LaneSum::default();
        for (c, k) in xs.chunks(64).zip(keep.chunks(64)) {
            tiled.add_where(c, k);
        }
        assert_eq!(whole.value().to_bits(), tiled.value().to_bits());
        let kept: Vec<f64> = xs
            .iter()
            .zip(&keep)
            .map(|(&x, &k)| if k { x } else { 0.0 })
            .collect();
        let mut plain = LaneSum::default();
        plain.add(&kept);
        assert_eq!(plain.value().to_bits(), whole.value().to_bits());
        let want: f64 = kept.iter().sum();
        assert!((whole.value() - want).abs() < 1e-9);
        let mut few = LaneSum::default();
        few.add(&[0.1, 0.2, 0.3, -0.6, 1e-17]);
        assert_eq!(few.value(), 0.1 + 0.2 + 0.3 + -0.6 + 1e-17);
    }

    #[test]
    fn exp_bounded_within_one_ulp_of_libm() {
        // deterministic sweep plus the interval ends and the reduction's boundaries
        let mut xs: Vec<f64> = (0..200_001)
            .map(|i| -20.0 + 40.0 * i as f64 / 200_000.0)
            .collect();
        let mut u = test_uniform();
        for _ in 0..200_000 {
            xs.push((u() - 0.5) * 1400.0);
        }
        xs.extend([
            0.0,
            -0.0,
            1e-300,
            -1e-300,
            0.5 * std::f64::consts::LN_2,
            700.0,
            -700.0,
        ]);
        let mut worst = 0.0f64;
        for &x in &xs {
            let (got, want) = (exp_bounded(x), x.exp());
            let ulp = (want.to_bits() as i64 - got.to_bits() as i64).abs();
            worst = worst.max(ulp as f64);
            assert!(ulp <= 1, "exp_bounded({x:e}) = {got:e}, libm {want:e}");
        }
        assert!(worst <= 1.0);
        assert_eq!(exp_bounded(0.0), 1.0);
        assert!(exp_bounded(f64::NAN).is_nan());
    }
    use super::*;

    /// `(x, e^x − 1 − x)` rounded to f64 from an 80-digit evaluation.
    const K3_REFERENCE: [(f64, f64); 15] = [
        (1e-12, 5.000000000001666e-25),
        (-1e-12, 4.999999999998333e-25),
        (1e-08, 5.0000000166666667e-17),
        (-1e-08, 4.999999983333334e-17),
        (3e-06, 4.500004500003375e-12),
        (1e-05, 5.000016666708334e-11),
        (-0.00025, 3.124739599608561e-08),
        (0.003, 4.504503377026013e-06),
        (-0.05, 0.0012294245007140093),
        (0.0999, 0.00516040650951046),
        (-0.0999, 0.00482790630210107),
        (0.1, 0.005170918075647625),
        (-0.1, 0.0048374180359595734),
        (0.5, 0.14872127070012814),
        (-2.0, 1.1353352832366126),
    ];

    #[test]
    fn k3_is_accurate_to_1e15_for_small_log_ratios() {
        for (x, want) in K3_REFERENCE {
            let got = k3_from_log_ratio(x);
            let rel = ((got - want) / want).abs();
            // The series region (|x| < 0.1) is good to a few ulps; expm1(x) − x beyond it loses
            // up to log2(x / k3) bits to cancellation.
            let tol = if x.abs() < 0.1 { 1e-15 } else { 2e-14 };
            assert!(
                rel <= tol,
                "k3({x:e}) = {got:e}, want {want:e}, rel {rel:e}"
            );
            let w = w_of(-x);
            assert_eq!(w.to_bits(), got.to_bits(), "w(u) is k3(-u)");
        }
    }

    /// Relative error of `got` against `want` (exact match for zeros).
    fn rel(got: f64, want: f64) -> f64 {
        if got == want {
            0.0
        } else {
            ((got - want) / want).abs()
        }
    }

    #[test]
    fn log1p_minus_x_against_an_80_digit_reference() {
        // (x, ln(1 + x) − x) rounded to f64 from an mpmath evaluation at 60 digits.
        const REF: [(f64, f64); 12] = [
            (1e-12, -4.999999999996667e-25),
            (-1e-12, -5.000000000003333e-25),
            (1e-06, -4.999996666669166e-13),
            (-0.0003, -4.500900202548611e-08),
            (0.005, -1.2458488960926388e-05),
            (-0.0099, -4.933085366808252e-05),
            (0.0099, -4.868394962581728e-05),
            (0.01, -4.966914683191715e-05),
            (-0.01, -5.0335853501441186e-05),
            (0.3, -0.03763573553250894),
            (-0.5, -0.19314718055994531),
            (2.0, -0.9013877113318903),
        ];
        for (x, want) in REF {
            let got = log1p_minus_x(x);
            // the series (|x| < 0.01) to a few ulps; ln_1p(x) − x loses log2(x / result) bits
            let tol = if x.abs() < 0.01 { 2e-15 } else { 1e-13 };
            assert!(
                rel(got, want) <= tol,
                "log1p_minus_x({x:e}) = {got:e}, want {want:e}"
            );
        }
    }

    #[test]
    fn log1mexp_on_both_sides_of_the_switch() {
        // (x, ln(1 − eˣ)) from mpmath at 60 digits; the switch is at −ln 2 ≈ −0.693.
        const REF: [(f64, f64); 8] = [
            (-1e-10, -23.025850929990458),
            (-0.01, -4.610166019324897),
            (-0.5, -0.9327521295671886),
            (-0.69, -0.6963042971440567),
            (-0.7, -0.6863410028083852),
            (-1.0, -0.4586751453870819),
            (-5.0, -0.006760749449488557),
            (-40.0, -4.248354255291589e-18),
        ];
        for (x, want) in REF {
            let got = log1mexp(x);
            assert!(
                rel(got, want) <= 1e-15,
                "log1mexp({x:e}) = {got:e}, want {want:e}"
            );
        }
        assert_eq!(log1mexp(0.0), f64::NEG_INFINITY);
    }

    #[test]
    fn neumaier_sum_keeps_what_plain_summation_loses() {
        // plain left-to-right summation gives 0 for both
        let big = [1.0, 1e100, 1.0, -1e100];
        assert_eq!(neumaier_sum(big.iter().copied()), 2.0);
        let small_first = [1e-16, 1.0, 1e-16, -1.0];
        assert_eq!(neumaier_sum(small_first.iter().copied()), 2e-16);
        let tenths = [0.1; 10];
        assert_eq!(neumaier_sum(tenths.iter().copied()), 1.0);
        assert_eq!(neumaier_sum(std::iter::empty()), 0.0);
        assert_eq!(neumaier_sum([-3.5].into_iter()), -3.5);
    }

    #[test]
    fn log_sum_exp_against_a_reference() {
        // ln Σ eˣ from mpmath at 60 digits
        let cases: [(&[f64], f64); 4] = [
            (&[0.0, -1.0, -2.0], 0.4076059644443803),
            (&[-3.0, 1.5, 1.5, -0.25], 2.2815622527365087),
            (&[2.0, -30.0], 2.000000000000013),
            (&[-7.25], -7.25),
        ];
        for (x, want) in cases {
            let got = log_sum_exp(x);
            assert!(
                rel(got, want) <= 4e-16,
                "lse({x:?}) = {got:e}, want {want:e}"
            );
        }
        // a lone −∞ (or all −∞) has no maximum above −∞
        assert_eq!(log_sum_exp(&[f64::NEG_INFINITY]), f64::NEG_INFINITY);
    }

    #[test]
    fn binary_kl_against_a_reference() {
        // max(D_B(p‖q), D_B(q‖p)) from mpmath at 60 digits: both branches of ln((1−q)/(1−p))
        // (|t| < 0.5 and the log1mexp difference) and both branches of the KL terms (u > 1).
        const REF: [(f64, f64, f64); 11] = [
            // p and q within 1e-7 relative: ln((1−q)/(1−p)) must not be a difference of logs
            (-0.5, -0.500000001, 7.707469967621045e-19),
            (-2.0, -2.0000001, 7.825881769345972e-16),
            (-0.001, -0.0010000001, 4.997500253241786e-18),
            (-1e-10, -2e-10, 3.862943610812612e-11),
            (-0.2, -1.7, 0.9568883939085879),
            (-1.7, -0.2, 0.9568883939085879),
            (-0.5, -0.52, 0.0003011598719085032),
            (-3.0, -2.9, 0.00028062380632226696),
            (-0.001, -5.0, 6.8213095867438325),
            (-2e-09, -1e-09, 3.862943607335963e-10),
            (-0.05, -0.04, 0.0011285211281419172),
        ];
        for (lp, lq, want) in REF {
            let got = binary_kl(lp, lq, lp - lq);
            assert!(
                rel(got, want) <= 1e-13,
                "binary_kl({lp:e}, {lq:e}) = {got:e}, want {want:e}"
            );
        }
    }

    #[test]
    fn inv_fact_is_one_over_n_factorial() {
        let mut fact = 1.0f64; // n! is exact in f64 up to 22!
        for (n, &c) in INV_FACT.iter().enumerate() {
            if n > 0 {
                fact *= n as f64;
            }
            assert_eq!(c, 1.0 / fact, "INV_FACT[{n}]");
        }
    }

    #[test]
    fn lse_keeps_small_complements() {
        let lp = [-1e-20f64, -50.0];
        let t = -log_sum_exp(&lp).exp_m1();
        // 1 − (e^{−1e-20} + e^{−50}) = 1e-20 − e^{−50} + O(1e-40)
        let want = 1e-20 - (-50f64).exp();
        assert!((t - want).abs() < 1e-30, "{t} {want}");
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
    }

    #[test]
    fn binary_kl_edges() {
        let bk = |lp: f64, lq: f64| binary_kl(lp, lq, lp - lq);
        assert_eq!(bk(-0.3, -0.3), 0.0);
        assert_eq!(bk(0.0, 0.0), 0.0);
        assert_eq!(bk(1e-3, 1e-3), 0.0);
        assert_eq!(bk(0.0, 2e-3), 0.0);
        // p = 1 (log-prob 0) counts as 1 − 1e-8: finite, equal to the clamped value
        let fl = (-BINARY_KL_FLOOR).ln_1p();
        let want = bk(fl, -0.1);
        assert_eq!(bk(0.0, -0.1), want);
        assert_eq!(bk(-0.1, 0.0), want);
        assert!(want.is_finite() && want > 0.0);
        // symmetric in p, q
        let (lp, lq) = (-0.2f64, -1.7f64);
        assert!((bk(lp, lq) - bk(lq, lp)).abs() < 1e-15);
        // moderate values against the textbook formula
        let (p, q) = (lp.exp(), lq.exp());
        let db = |p: f64, q: f64| p * (p / q).ln() + (1.0 - p) * ((1.0 - p) / (1.0 - q)).ln();
        let naive = db(p, q).max(db(q, p));
        assert!((bk(lp, lq) - naive).abs() < 1e-14 * naive);
    }
}
