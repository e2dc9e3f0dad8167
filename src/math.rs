//! The one f64 copy of the shared formulas (layer 0): k3 = `expm1(x) − x`, `w(u) = expm1(−u) + u`,
//! `log1p(x) − x` with their series for small arguments, Neumaier summation and a log-sum-exp
//! that keeps small complements. The CPU engine, the top-K path and the metrics all call these;
//! `shaders/common/math.wgsl` is their f32 twin.

/// `expm1(x) − x`, accurate to the last bits for every x (series for small |x|).
pub fn k3_from_log_ratio(x: f64) -> f64 {
    if x.abs() < 0.1 {
        // x²/2 + x³/6 + … ; 12 terms reach full f64 precision for |x| < 0.1.
        let mut term = x * x / 2.0;
        let mut sum = term;
        for n in 3..=14 {
            term *= x / n as f64;
            sum += term;
        }
        sum
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lse_keeps_small_complements() {
        let lp = [-1e-20f64, -50.0];
        let t = -log_sum_exp(&lp).exp_m1();
        // 1 − (e^{−1e-20} + e^{−50}) = 1e-20 − e^{−50} + O(1e-40)
        let want = 1e-20 - (-50f64).exp();
        assert!((t - want).abs() < 1e-30, "{t} {want}");
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
    }
}
