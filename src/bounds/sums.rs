//! The sums behind [`crate::bounds`] in `O(1)` memory for any horizon up to 2^53: Neumaier
//! summation term by term for short horizons, closed forms per piece of the piecewise weight
//! (linear, square root, saturated) with an Euler–Maclaurin `Σ √k` beyond.

/// Compensated (Neumaier) summation of an iterator of `f64`.
pub(crate) fn sum<I: IntoIterator<Item = f64>>(values: I) -> f64 {
    let mut s = 0.0f64;
    let mut c = 0.0f64;
    for v in values {
        let t = s + v;
        if s.abs() >= v.abs() {
            c += (s - t) + v;
        } else {
            c += (v - t) + s;
        }
        s = t;
    }
    s + c
}

/// The largest horizon accepted: 2^53, the last integer every `f64` holds exactly.
pub const MAX_HORIZON: u64 = 1 << 53;

/// Up to this many positions a constant-profile sum is evaluated term by term (bit-identical
/// to the profile functions); beyond it, in closed form.
pub const EXACT_TERMS: u64 = 1 << 20;

/// The first `r` in `[0, n)` where the monotone predicate `p` holds (`n` when none does).
fn first(n: u64, p: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if p(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// `Σ_{k=lo}^{hi−1} √k`, exact to rounding: term by term for short ranges and small `k`,
/// else by Euler–Maclaurin (`Σ_{k≤N} √k = ⅔N^{3/2} + ½N^{1/2} + ζ(−½) + N^{−1/2}/24 − …`, whose
/// next term is below 1e-19 for `N ≥ 2^20`), written as differences that do not cancel.
fn sqrt_sum(lo: u64, hi: u64) -> f64 {
    if hi <= lo {
        return 0.0;
    }
    if hi - lo <= EXACT_TERMS {
        return sum((lo..hi).map(|k| (k as f64).sqrt()));
    }
    if lo < EXACT_TERMS {
        return sqrt_sum(lo, EXACT_TERMS) + sqrt_sum(EXACT_TERMS, hi);
    }
    // Σ_{k=lo}^{hi−1} √k = S(B) − S(A) with A = lo − 1, B = hi − 1.
    let (a, b) = ((lo - 1) as f64, (hi - 1) as f64);
    let n = (hi - lo) as f64; // B − A, exact
    let (ra, rb) = (a.sqrt(), b.sqrt());
    let d_sqrt = n / (rb + ra); // √B − √A
    let d_pow = n * (b * b + a * b + a * a) / (b * rb + a * ra); // B^{3/2} − A^{3/2}
    let d_inv = -d_sqrt / (ra * rb); // B^{−1/2} − A^{−1/2}
    sum([2.0 / 3.0 * d_pow, 0.5 * d_sqrt, d_inv / 24.0])
}

/// `Σ_{r=0}^{T−1} d·w(r)` with `w` the weight of [`crate::bounds::lntrm_weight`] (a missing `ε` or `δ` drops
/// its term), in `O(1)` memory. Up to [`EXACT_TERMS`] terms it is the term-by-term sum in the
/// order of the profile functions (`r` from `T−1` down to 0); beyond, the closed form of each
/// piece: `rε` below the crossing with `√(rδ/2)`, the square root up to saturation, then 1.
pub(crate) fn constant_profile_sum(
    horizon: u64,
    d: f64,
    eps: Option<f64>,
    delta: Option<f64>,
    weight: impl Fn(usize, Option<f64>, Option<f64>) -> f64,
) -> f64 {
    let lntrm_weight = &weight;
    if horizon <= EXACT_TERMS {
        return sum((0..horizon).map(|i| d * lntrm_weight((horizon - 1 - i) as usize, eps, delta)));
    }
    let w = |r: u64| lntrm_weight(r as usize, eps, delta);
    // Saturated (w = 1) from `sat` on; below it the linear term is the minimum up to `cross`.
    let sat = first(horizon, |r| w(r) >= 1.0);
    let cross = match (eps, delta) {
        (Some(e), Some(dl)) => first(sat, |r| {
            let r = r as f64;
            r * e > (r * dl / 2.0).sqrt()
        }),
        (Some(_), None) => sat,
        _ => 0,
    };
    let linear = match eps {
        // Σ_{r<cross} r = cross(cross−1)/2, exact in u128.
        Some(e) if cross > 0 => e * ((cross as u128 * (cross as u128 - 1) / 2) as f64),
        _ => 0.0,
    };
    let root = match delta {
        Some(dl) => (dl / 2.0).sqrt() * sqrt_sum(cross, sat),
        None => 0.0,
    };
    d * sum([linear, root, (horizon - sat) as f64])
}

pub(crate) fn dbar_max<S: serde::Serializer>(
    d: &Dbar,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.max())
}

/// The per-position TV profile `D̄_t` the adaptive bounds used.
#[derive(Debug, Clone, PartialEq)]
pub enum Dbar {
    /// The same value at every position (the filled profile; never materialised, so a
    /// horizon of 2^53 costs no memory).
    Constant(f64),
    /// The caller's profile, one value per position.
    Profile(Vec<f64>),
}

impl Dbar {
    /// The largest value of the profile (0 for an empty one).
    pub fn max(&self) -> f64 {
        match self {
            Dbar::Constant(v) => *v,
            Dbar::Profile(p) => p.iter().copied().fold(0.0, f64::max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensated_sum_keeps_what_plain_summation_loses() {
        // plain left-to-right summation gives 0 for the first two
        assert_eq!(sum([1.0, 1e100, 1.0, -1e100]), 2.0);
        assert_eq!(sum([1e-16, 1.0, 1e-16, -1.0]), 2e-16);
        assert_eq!(sum([0.1; 10]), 1.0);
        assert_eq!(sum([]), 0.0);
        assert_eq!(sum([-3.5]), -3.5);
    }

    #[test]
    fn an_infinite_eps_saturates_every_weight_in_closed_form() {
        // 0·∞ is NaN and min(1, NaN) = 1: every weight is 1, there is no linear piece
        let h = EXACT_TERMS + 3;
        let lntrm_weight = crate::bounds::lntrm_weight;
        let got = constant_profile_sum(h, 0.5, Some(f64::INFINITY), None, lntrm_weight);
        assert_eq!(got, 0.5 * h as f64);
    }

    #[test]
    fn sqrt_sum_closed_form_is_exact_to_rounding() {
        // Euler–Maclaurin past 2^20 against the term-by-term sum; the N^(−1/2)/24 term alone
        // moves these sums by about 1e-14 relative
        for (lo, hi) in [
            (EXACT_TERMS, 2 * EXACT_TERMS + 1),
            (EXACT_TERMS + 7, 3 * EXACT_TERMS),
            (3, 2 * EXACT_TERMS + 5),
        ] {
            let want = sum((lo..hi).map(|k| (k as f64).sqrt()));
            let got = sqrt_sum(lo, hi);
            let rel = ((got - want) / want).abs();
            assert!(
                rel < 2e-15,
                "sqrt_sum({lo}, {hi}) = {got}, want {want}, rel {rel:e}"
            );
        }
    }
}
