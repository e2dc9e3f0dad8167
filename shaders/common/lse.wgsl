// f32 helpers for cancellation-free log-sum-exp / KL accumulation.
// Series are used where the closed form would cancel at first order.

// expm1(x), relative error ~1e-7 for every |x| (series for |x| <= 0.5).
fn expm1_acc(x: f32) -> f32 {
    if (abs(x) <= 0.5) {
        return x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0
            + x * (1.0 / 720.0 + x * (1.0 / 5040.0 + x * (1.0 / 40320.0))))))));
    }
    return exp(x) - 1.0;
}

// w(u) = expm1(-u) + u >= 0, second order in u: u^2/2 - u^3/6 + ...
fn w_of(u: f32) -> f32 {
    if (abs(u) <= 0.5) {
        return u * u * (0.5 + u * (-1.0 / 6.0 + u * (1.0 / 24.0 + u * (-1.0 / 120.0
            + u * (1.0 / 720.0 + u * (-1.0 / 5040.0 + u * (1.0 / 40320.0 - u * (1.0 / 362880.0))))))));
    }
    return exp(-u) - 1.0 + u;
}

// log1p(x) - x (<= 0), second order in x; x > -1.
fn log1p_minus_x(x: f32) -> f32 {
    if (abs(x) <= 0.0625) {
        return x * x * (-0.5 + x * (1.0 / 3.0 + x * (-0.25 + x * (0.2 + x * (-1.0 / 6.0
            + x * (1.0 / 7.0 + x * (-0.125)))))));
    }
    return log(1.0 + x) - x;
}

fn log1p_acc(x: f32) -> f32 {
    if (abs(x) <= 0.0625) {
        return x + log1p_minus_x(x);
    }
    return log(1.0 + x);
}
