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
