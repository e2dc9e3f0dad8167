// Per-token estimator helpers shared by token_stats.wgsl and masks.wgsl (needs the prelude).

// expm1(x) - x - (nothing): the series x^2/2! + ... + x^11/11! for |x| < 0.5 (relative
// truncation error < 1e-10), exp(x) - 1 - x above (no cancellation there).
fn k3_of(x: f32) -> f32 {
    if abs(x) < 0.5 {
        var t = 1.0 / 39916800.0;           // 1/11!
        t = t * x + 1.0 / 3628800.0;        // 1/10!
        t = t * x + 1.0 / 362880.0;
        t = t * x + 1.0 / 40320.0;
        t = t * x + 1.0 / 5040.0;
        t = t * x + 1.0 / 720.0;
        t = t * x + 1.0 / 120.0;
        t = t * x + 1.0 / 24.0;
        t = t * x + 1.0 / 6.0;
        t = t * x + 0.5;
        return t * x * x;
    }
    return (exp(x) - 1.0) - x;
}

// expm1(x) without cancellation for small |x|.
fn expm1_of(x: f32) -> f32 {
    if abs(x) < 0.5 {
        return x + k3_of(x);
    }
    return exp(x) - 1.0;
}

// The seven per-token estimators of SPEC §1, in output order: log_ratio (unclamped), rho, k1, k2,
// k3, abs, ser, from lr = log pi_train - log pi_roll clamped to +-SAFETY_BOUND (verl).
fn estimators(lr: f32) -> array<f32, 7> {
    let c = clamp(lr, -SAFETY_BOUND, SAFETY_BOUND);
    return array<f32, 7>(lr, exp(c), -c, 0.5 * c * c, k3_of(c), abs(c), abs(expm1_of(c)));
}
