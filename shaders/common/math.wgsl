// The one WGSL math library: every formula the kernels share and the one set of finite
// sentinels (WGSL has no infinity literals). Concatenated into every kernel right after the
// prelude; needs nothing from it. Series are used wherever the closed form would cancel at first
// order; each series stops at x^9 / 9!, whose truncation error is below 3e-9 relative for
// |x| <= 0.5 (f32 rounding is 6e-8).

// Finite sentinels. Decoders (unpack.wgsl) map a -inf logit (p = 0) to NEG_SENTINEL and NaN /
// +inf to BAD_SENTINEL; BIG / -BIG are also the identities of max / min and "no bound".
const BIG: f32 = 3.0e38;
const NEG_SENTINEL: f32 = -3.0e38;
const BAD_SENTINEL: f32 = 3.0e38;
// Running maximum of an empty online-softmax state: below every finite logit, yet
// (EMPTY_MAX - x) * (1 / temperature) stays finite, so rescaling an empty state never makes
// 0 * inf.
const EMPTY_MAX: f32 = -1.0e30;
// verl's clamp of the log-ratio before exp and in k1/k2/k3 (docs/FORMAT.md, log-ratio).
const SAFETY_BOUND: f32 = 20.0;
// log2(e) and ln(2): e^{z·it} is computed as exp2(z·(it·LOG2E)), the constant folded into the
// scaling a loop already does (GPUs compute exp as exp2 of a product anyway).
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;

fn is_neg_inf(x: f32) -> bool {
    return x < -1.0e38;
}

fn is_bad(x: f32) -> bool {
    return x > 1.0e38;
}

// k3(x) = expm1(x) - x >= 0, second order in x: x^2/2! + ... + x^9/9! for |x| <= 0.5.
fn k3_of(x: f32) -> f32 {
    if abs(x) <= 0.5 {
        return k3_series(x);
    }
    return (exp(x) - 1.0) - x;
}

// k3's Taylor series through x^9, for |x| <= 0.5 (truncation below 3e-9 relative there); no
// branch, so a caller can select between it and a closed form without evaluating both sides
// of an `if` (software rasterizers run both).
fn k3_series(x: f32) -> f32 {
    return x * x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0
        + x * (1.0 / 720.0 + x * (1.0 / 5040.0 + x * (1.0 / 40320.0 + x * (1.0 / 362880.0))))))));
}

// w(u) = k3(−u) and w(−u) = k3(u) from one evaluation of k3's series (through u^9, for
// |u| <= 0.5): k3(u) = E(u) + O(u) with E the even part u^2/2! + u^4/4! + ... and O the odd
// part u^3/3! + u^5/5! + ..., both polynomials in u^2, so w(u) = E − O and w(−u) = E + O
// (E ≥ |O| there: no cancellation). 12 operations instead of two series' 20.
fn w_pair(u: f32) -> vec2<f32> {
    let u2 = u * u;
    let ev = u2 * (0.5 + u2 * (1.0 / 24.0 + u2 * (1.0 / 720.0 + u2 * (1.0 / 40320.0))));
    let od = (u * u2) * (1.0 / 6.0 + u2 * (1.0 / 120.0 + u2 * (1.0 / 5040.0 + u2 * (1.0 / 362880.0))));
    return vec2<f32>(ev - od, ev + od);
}

// expm1(x) with ~1 ulp relative error for every |x|.
fn expm1_acc(x: f32) -> f32 {
    if abs(x) <= 0.5 {
        return x + k3_of(x);
    }
    return exp(x) - 1.0;
}

// w(u) = expm1(-u) + u = k3(-u) >= 0 (the vocabulary kernel's second-order weight).
fn w_of(u: f32) -> f32 {
    return k3_of(-u);
}

// log1p(x) - x <= 0, second order in x (series for |x| <= 1/16); x > -1.
fn log1p_minus_x(x: f32) -> f32 {
    if abs(x) <= 0.0625 {
        return x * x * (-0.5 + x * (1.0 / 3.0 + x * (-0.25 + x * (0.2 + x * (-1.0 / 6.0
            + x * (1.0 / 7.0 + x * (-0.125 + x * (1.0 / 9.0))))))));
    }
    return log(1.0 + x) - x;
}

// log1p(x) with ~1 ulp relative error for every x > -1.
fn log1p_acc(x: f32) -> f32 {
    if abs(x) <= 0.0625 {
        return x + log1p_minus_x(x);
    }
    return log(1.0 + x);
}

// The seven per-token estimators of docs/FORMAT.md, in output order: log_ratio (unclamped), rho, k1,
// k2, k3, abs, ser, from lr = log pi_train - log pi_roll clamped to +-SAFETY_BOUND (verl).
fn estimators(lr: f32) -> array<f32, 7> {
    let c = clamp(lr, -SAFETY_BOUND, SAFETY_BOUND);
    return array<f32, 7>(lr, exp(c), -c, 0.5 * c * c, k3_of(c), abs(c), abs(expm1_acc(c)));
}
