//! The bounds inverted: the largest per-token KL bound `δ` whose unified bound `B*` stays
//! within a target error `E`, for a horizon `T` and, optionally, a fixed per-token TV bound `ε`.
//!
//! `B*(δ)` is [`crate::bounds::compute`]'s `unified` with `D_KL^seq = T·δ`,
//! `D_TV^seq = √(D_KL^seq/2)`, `D̄_t = min(1, ε, √(δ/2))` filled and `ε = √(δ/2)` (Pinsker)
//! unless given. Every one of its six candidates is non-decreasing in `δ`, so `B*` is too, and
//! it is constant for `δ ≥ 2` (every `min(1, ·)` saturated). [`invert`] bisects on the exact
//! sums themselves: the answer `δ` has `B*(δ) ≤ E < B*(next f64 above δ)`.
//!
//! ```
//! use trmask::bounds_inverse::invert;
//! // the paper's example: T = 4096, ε = 5e-3, and the B* that δ = 1e-4 gives
//! let e = trmask::bounds::compute(&trmask::bounds::BoundInputs {
//!     eps: Some(5e-3),
//!     ..trmask::bounds::BoundInputs::new(4096, 1e-4)
//! })?
//! .unified;
//! let inv = invert(e, 4096, Some(5e-3))?;
//! assert!((inv.delta - 1e-4).abs() < 1e-12);
//! assert!((inv.bounds.unified - e).abs() <= 1e-12 * e);
//! println!("δ = {}, attained by {}", inv.delta, inv.bounds.argmin);
//! # Ok::<(), trmask::Error>(())
//! ```

use crate::bounds::{compute, BoundInputs, Bounds, MAX_HORIZON};
use crate::error::{Error, Result};
use serde::Serialize;

/// Past this `δ` the unified bound no longer changes.
const SATURATED_DELTA: f64 = 2.0;

/// The answer of [`invert`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inverted {
    /// `E`, the target error.
    pub target_error: f64,
    /// The largest per-token KL bound `δ` with `B*(δ) ≤ E`.
    pub delta: f64,
    /// The per-token TV bound at the answer: the one given, or `√(δ/2)` (Pinsker).
    pub eps: f64,
    /// `"given"` or `"pinsker"`.
    pub eps_from: &'static str,
    /// Every bound at the answer; `bounds.unified` is `B*` and `bounds.argmin` the bound that
    /// attains it.
    pub bounds: Bounds,
}

fn at(horizon: usize, delta: f64, eps: Option<f64>) -> Result<Bounds> {
    compute(&BoundInputs {
        eps,
        ..BoundInputs::new(horizon, delta)
    })
}

/// The largest `δ` for which the unified bound `B*` is at most `target_error`, for the
/// horizon `T` and either a fixed `ε` or `ε = √(δ/2)`.
///
/// Errors (naming the flag): `target_error` not finite and `> 0`, `horizon` outside
/// `[1, 2^53]`, `eps` not finite and `≥ 0`, or a target that no `δ` reaches (`B*` stays below
/// it for every `δ`, e.g. `T = 1`, or a small fixed `ε` whose coupling bound is already `≤ E`).
pub fn invert(target_error: f64, horizon: usize, eps: Option<f64>) -> Result<Inverted> {
    if !(target_error.is_finite() && target_error > 0.0) {
        return Err(Error::config(
            "--target-error",
            format!("must be finite and > 0, got {target_error}"),
        ));
    }
    if horizon == 0 || horizon as u64 > MAX_HORIZON {
        return Err(Error::config(
            "--horizon",
            format!("{horizon} is out of range [1, 2^53]"),
        ));
    }
    let unified = |d: f64| at(horizon, d, eps).map(|b| b.unified);
    let top = at(horizon, SATURATED_DELTA, eps)?;
    if top.unified <= target_error {
        return Err(Error::config(
            "--target-error",
            format!(
                "{target_error} is never exceeded: B* is at most {} ({}) for every δ{}",
                top.unified,
                top.argmin,
                if eps.is_some() {
                    " with this --eps"
                } else {
                    ""
                }
            ),
        ));
    }
    // invariant: B*(lo) ≤ E < B*(hi); B*(0) = 0
    let (mut lo, mut hi) = (0.0f64, SATURATED_DELTA);
    loop {
        let mid = if lo == 0.0 {
            hi / 2.0
        } else if hi > 2.0 * lo {
            (lo * hi).sqrt()
        } else {
            lo + (hi - lo) / 2.0
        };
        if mid <= lo || mid >= hi {
            break;
        }
        if unified(mid)? <= target_error {
            lo = mid;
        } else {
            hi = mid;
        }
        if lo == 0.0 && hi < f64::MIN_POSITIVE {
            break; // B* exceeds E for every normal δ > 0: the answer is 0
        }
    }
    let bounds = at(horizon, lo, eps)?;
    Ok(Inverted {
        target_error,
        delta: lo,
        eps: bounds.inputs.eps,
        eps_from: if eps.is_some() { "given" } else { "pinsker" },
        bounds,
    })
}

impl Inverted {
    /// The answer in one line, then the bound table at it.
    pub fn table(&self) -> String {
        format!(
            "largest delta with B* <= {}: delta = {:.9e}, eps = {:.9e} ({}); B* = {:.9e} \
             attained by {}\n\n{}",
            self.target_error,
            self.delta,
            self.eps,
            self.eps_from,
            self.bounds.unified,
            self.bounds.argmin,
            self.bounds.table()
        )
    }
}
