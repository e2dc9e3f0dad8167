//! Worst-case error bounds on the surrogate objective under rollout/trainer mismatch
//! (Li et al., *Trust Region Masking*, arXiv 2512.23075; docs/FORMAT.md (Bound certificate)).
//!
//! `T` is the horizon (response length), rewards lie in `[0, 1]`, `δ` bounds the per-token
//! KL divergence `D_KL^tok`, `ε` the per-token total variation `D_TV^tok`, `D_KL^seq` and
//! `D_TV^seq` the sequence-level divergences, and `D̄_t` the per-position TV profile.
//! Every bound is a compensated `f64` sum over `t = 1..=T`, in `O(1)` memory: summed term by
//! term up to [`EXACT_TERMS`] positions, and beyond that in closed form per piece of the
//! piecewise weight (linear, square root, saturated at 1), with an Euler–Maclaurin tail for
//! `Σ √k` that is exact to rounding. Horizons above [`MAX_HORIZON`] = 2^53 (where `f64`
//! stops counting exactly) are rejected.
//!
//! Inputs that are not given are filled by the paper's relaxations, in this order:
//!
//! * `eps` ← `√(δ/2)` (Pinsker),
//! * `kl_seq` ← `T·δ` (chain rule),
//! * `tv_seq` ← `√(D_KL^seq/2)` (Pinsker, on the possibly filled `kl_seq`),
//! * `dbar` ← `min(1, ε, √(δ/2))` at every position (on the possibly filled `eps`).
//!
//! [`Bounds::filled`] lists the names of the filled ones.
//!
//! ```
//! use trmask::bounds::{compute, BoundInputs};
//! let inputs = BoundInputs {
//!     horizon: 4096,
//!     delta: 1e-4,
//!     eps: Some(5e-3),
//!     kl_seq: Some(0.01),
//!     tv_seq: Some(0.05),
//!     dbar: None,
//! };
//! let b = compute(&inputs)?;
//! assert!((b.classical_kl - 1677.312).abs() < 1e-9);
//! assert!((b.unified - 4.096).abs() < 1e-12);
//! assert_eq!(b.argmin, "mix_tv");
//! assert_eq!(b.filled, vec!["dbar"]);
//! println!("{}", b.table());
//! # Ok::<(), trmask::Error>(())
//! ```

pub use crate::bounds::sums::Dbar;
use crate::bounds::sums::{constant_profile_sum, dbar_max, sum};
pub use crate::bounds::sums::{EXACT_TERMS, MAX_HORIZON};
use crate::error::{Error, Result};
use serde::Serialize;

/// Names of the six bounds whose minimum is the unified bound `B*`, in tie-breaking order
/// (on a tie, the first one listed is reported as the argmin).
pub const UNIFIED_CANDIDATES: [&str; 6] =
    ["pm_kl", "pm_tv", "mix_kl", "mix_tv", "coupling", "adaptive"];

/// `T(T−1)` as `f64` (exact for every horizon below 2^26; 0 for `T ≤ 1`).
fn pairs(horizon: usize) -> f64 {
    if horizon < 2 {
        0.0
    } else {
        horizon as f64 * (horizon - 1) as f64
    }
}

/// Classical bound, KL form: `T(T−1)·δ`.
///
/// ```
/// assert!((trmask::bounds::classical_kl(4096, 1e-4) - 1677.312).abs() < 1e-9);
/// assert_eq!(trmask::bounds::classical_kl(1, 0.5), 0.0);
/// ```
pub fn classical_kl(horizon: usize, delta: f64) -> f64 {
    pairs(horizon) * delta
}

/// Classical bound, TV form: `2T(T−1)·ε²`.
///
/// With `ε = √(δ/2)` (Pinsker) it equals [`classical_kl`]; in general it is `≤ T(T−1)δ`.
///
/// ```
/// assert!((trmask::bounds::classical_tv(3, 0.1) - 0.12).abs() < 1e-15);
/// ```
pub fn classical_tv(horizon: usize, eps: f64) -> f64 {
    if horizon < 2 {
        return 0.0; // T(T−1) = 0, whatever ε² is
    }
    2.0 * pairs(horizon) * eps * eps
}

/// `Σ_{t=1..T} min(1, √((t−1)δ/2))`, shared by the Pinsker-Marginal bounds.
fn pm_sum(horizon: usize, delta: f64) -> f64 {
    let t = horizon as u64;
    if t <= EXACT_TERMS {
        return sum((0..t).map(|k| (k as f64 * delta / 2.0).sqrt().min(1.0)));
    }
    constant_profile_sum(t, 1.0, None, Some(delta), lntrm_weight)
}

/// Pinsker-Marginal bound, KL form: `4·min(1, √(δ/2))·Σ_{t=1..T} min(1, √((t−1)δ/2))`.
///
/// ```
/// let b = trmask::bounds::pm_kl(4096, 1e-4);
/// assert!((b - 34.94609188629668).abs() < 1e-12 * b);
/// ```
pub fn pm_kl(horizon: usize, delta: f64) -> f64 {
    4.0 * (delta / 2.0).sqrt().min(1.0) * pm_sum(horizon, delta)
}

/// Pinsker-Marginal bound, TV form: `4·min(1, ε)·Σ_{t=1..T} min(1, √((t−1)δ/2))`.
///
/// ```
/// // T = 2, δ = 0.02: the sum is 0 + √0.01 = 0.1.
/// assert!((trmask::bounds::pm_tv(2, 0.02, 0.5) - 0.2).abs() < 1e-15);
/// ```
pub fn pm_tv(horizon: usize, delta: f64, eps: f64) -> f64 {
    4.0 * eps.min(1.0) * pm_sum(horizon, delta)
}

/// Mixed bound, KL form: `4T·min(1, √(δ/2))·min(1, √(D_KL^seq/2))`.
///
/// ```
/// // 4·10·√0.01·√0.02
/// let b = trmask::bounds::mix_kl(10, 0.02, 0.04);
/// assert!((b - 40.0 * 0.1 * 0.02f64.sqrt()).abs() < 1e-15);
/// ```
pub fn mix_kl(horizon: usize, delta: f64, kl_seq: f64) -> f64 {
    4.0 * horizon as f64 * (delta / 2.0).sqrt().min(1.0) * (kl_seq / 2.0).sqrt().min(1.0)
}

/// Mixed bound, TV form: `4T·min(1, ε)·min(1, D_TV^seq)`.
///
/// ```
/// let b = trmask::bounds::mix_tv(4096, 5e-3, 0.05);
/// assert!((b - 4.096).abs() < 1e-12);
/// ```
pub fn mix_tv(horizon: usize, eps: f64, tv_seq: f64) -> f64 {
    4.0 * horizon as f64 * eps.min(1.0) * tv_seq.min(1.0)
}

/// Coupling bound: `4·min(1, ε)·Σ_{t=1..T} min(1, (t−1)ε)`.
///
/// ```
/// let b = trmask::bounds::coupling(4096, 5e-3);
/// assert!((b - 79.91).abs() < 1e-9 * 79.91);
/// ```
pub fn coupling(horizon: usize, eps: f64) -> f64 {
    let t = horizon as u64;
    let s = if t <= EXACT_TERMS {
        sum((0..t).map(|k| (k as f64 * eps).min(1.0)))
    } else {
        constant_profile_sum(t, 1.0, Some(eps), None, lntrm_weight)
    };
    4.0 * eps.min(1.0) * s
}

/// LN-TRM / adaptive weight of a token with `remaining = T − t` tokens after it (t 1-based):
/// `min(1, (T−t)ε, √((T−t)δ/2))`, where a missing `ε` or `δ` drops its term.
pub fn lntrm_weight(remaining: usize, eps: Option<f64>, delta: Option<f64>) -> f64 {
    let r = remaining as f64;
    let mut w = 1.0f64;
    if let Some(e) = eps {
        w = w.min(r * e);
    }
    if let Some(d) = delta {
        w = w.min((r * d / 2.0).sqrt());
    }
    w
}

/// [`lntrm_weight`] of the valid token of rank `rank` (1 for the first) among a sequence's
/// `len` valid tokens: what both correction executors weight LN-TRM's tokens by.
pub(crate) fn lntrm_rank_weight(len: u64, rank: u64, eps: Option<f64>, delta: Option<f64>) -> f64 {
    lntrm_weight(len.saturating_sub(rank) as usize, eps, delta)
}

/// `4·Σ_t D̄_t·w_t` with the weights of [`lntrm_weights`]; the horizon is `dbar.len()`.
fn adaptive_sum(dbar: &[f64], eps: Option<f64>, delta: Option<f64>) -> f64 {
    let horizon = dbar.len();
    4.0 * sum(dbar
        .iter()
        .enumerate()
        .map(|(i, &d)| d * lntrm_weight(horizon - 1 - i, eps, delta)))
}

/// Adaptive bound, KL only: `4·Σ_{t=1..T} D̄_t·min(1, √((T−t)δ/2))`; `T = dbar.len()`.
///
/// ```
/// // T = 3, δ = 0.02: weights √0.02, √0.01, 0.
/// let b = trmask::bounds::adaptive_kl(0.02, &[0.5, 0.5, 0.5]);
/// assert!((b - 2.0 * (0.02f64.sqrt() + 0.1)).abs() < 1e-15);
/// ```
pub fn adaptive_kl(delta: f64, dbar: &[f64]) -> f64 {
    adaptive_sum(dbar, None, Some(delta))
}

/// Adaptive bound, TV only: `4·Σ_{t=1..T} D̄_t·min(1, (T−t)ε)`; `T = dbar.len()`.
///
/// ```
/// // T = 3, ε = 0.4: weights min(1, 0.8) = 0.8, 0.4, 0.
/// let b = trmask::bounds::adaptive_tv(0.4, &[1.0, 0.5, 1.0]);
/// assert!((b - 4.0 * (0.8 + 0.2)).abs() < 1e-15);
/// ```
pub fn adaptive_tv(eps: f64, dbar: &[f64]) -> f64 {
    adaptive_sum(dbar, Some(eps), None)
}

/// Adaptive bound: `4·Σ_{t=1..T} D̄_t·min(1, (T−t)ε, √((T−t)δ/2))`; `T = dbar.len()`.
///
/// It is never larger than [`adaptive_kl`] or [`adaptive_tv`].
///
/// ```
/// use trmask::bounds::{adaptive, adaptive_kl, adaptive_tv};
/// let dbar = [0.1, 0.2, 0.3, 0.4];
/// let b = adaptive(0.05, 0.02, &dbar);
/// assert!(b <= adaptive_kl(0.02, &dbar) && b <= adaptive_tv(0.05, &dbar));
/// ```
pub fn adaptive(eps: f64, delta: f64, dbar: &[f64]) -> f64 {
    adaptive_sum(dbar, Some(eps), Some(delta))
}

/// LN-TRM position weights `w_t = min(1, (T−t)ε, √((T−t)δ/2))` for `t = 1..=T`.
///
/// A missing `eps` or `delta` drops its term (both missing: every weight is 1). The last
/// position always gets weight 0 unless both are missing.
///
/// ```
/// let w = trmask::bounds::lntrm_weights(3, Some(0.1), Some(0.02));
/// assert_eq!(w.len(), 3);
/// assert!((w[0] - 0.02f64.sqrt()).abs() < 1e-15 && (w[1] - 0.1).abs() < 1e-15 && w[2] == 0.0);
/// ```
pub fn lntrm_weights(horizon: usize, eps: Option<f64>, delta: Option<f64>) -> Vec<f64> {
    (1..=horizon)
        .map(|t| lntrm_weight(horizon - t, eps, delta))
        .collect()
}

/// LN-TRM per-sequence certificate `W/Z`, with `W = Σ_t |ρ_t − 1|·w_t`, `Z = Σ_t w_t` and the
/// weights of [`lntrm_weights`] for `T = rho.len()`; 0 when `Z = 0` (e.g. `T ≤ 1`, `ε = 0`).
///
/// The caller validates `rho` (finite, positive) and `eps`, `delta` (finite, `≥ 0`).
///
/// ```
/// let s = trmask::bounds::lntrm_score(&[1.0, 1.1, 0.9, 2.0, 0.5], Some(0.1), Some(0.02));
/// assert!((s - 0.21389031741350378).abs() < 1e-12);
/// ```
pub fn lntrm_score(rho: &[f64], eps: Option<f64>, delta: Option<f64>) -> f64 {
    let weights = lntrm_weights(rho.len(), eps, delta);
    let z = sum(weights.iter().copied());
    if z == 0.0 {
        return 0.0;
    }
    let w = sum(rho.iter().zip(&weights).map(|(r, w)| (r - 1.0).abs() * w));
    w / z
}

/// Sequence-level SER score: the mean of `|ρ_t − 1|` over the sequence; 0 for an empty one.
///
/// ```
/// let s = trmask::bounds::ser_score(&[1.0, 1.1, 0.9, 2.0, 0.5]);
/// assert!((s - 0.34).abs() < 1e-12);
/// ```
pub fn ser_score(rho: &[f64]) -> f64 {
    if rho.is_empty() {
        return 0.0;
    }
    sum(rho.iter().map(|r| (r - 1.0).abs())) / rho.len() as f64
}

/// What the bounds are computed from (the flags of `trmask bounds`).
///
/// `None` means "not measured": [`compute`] fills it by the paper's relaxations
/// (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BoundInputs {
    /// `T`, the horizon (`--horizon`), at least 1.
    pub horizon: usize,
    /// `δ`, the per-token KL bound (`--delta`), finite, `≥ 0`.
    pub delta: f64,
    /// `ε`, the per-token TV bound (`--eps`), finite, `≥ 0`.
    pub eps: Option<f64>,
    /// `D_KL^seq`, the sequence-level KL (`--kl-seq`), finite, `≥ 0`.
    pub kl_seq: Option<f64>,
    /// `D_TV^seq`, the sequence-level TV (`--tv-seq`), in `[0, 1]`.
    pub tv_seq: Option<f64>,
    /// `D̄_t`, the per-position TV profile (`--dbar`), `horizon` values in `[0, 1]`.
    pub dbar: Option<Vec<f64>>,
}

impl BoundInputs {
    /// Inputs with only the horizon and `δ`; everything else is filled.
    pub fn new(horizon: usize, delta: f64) -> Self {
        BoundInputs {
            horizon,
            delta,
            ..Default::default()
        }
    }

    /// Checks every input; the error names the CLI flag (`--horizon`, `--delta`, `--eps`,
    /// `--kl-seq`, `--tv-seq`, `--dbar`) and what is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.horizon == 0 {
            return Err(Error::config("--horizon", "must be at least 1"));
        }
        nonneg_finite("--delta", self.delta)?;
        if let Some(e) = self.eps {
            nonneg_finite("--eps", e)?;
        }
        if let Some(k) = self.kl_seq {
            nonneg_finite("--kl-seq", k)?;
        }
        if let Some(v) = self.tv_seq {
            unit_interval("--tv-seq", v)?;
        }
        if let Some(d) = &self.dbar {
            if d.len() != self.horizon {
                return Err(Error::config(
                    "--dbar",
                    format!("has {} values, the horizon is {}", d.len(), self.horizon),
                ));
            }
            for (i, &v) in d.iter().enumerate() {
                if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                    return Err(Error::config(
                        "--dbar",
                        format!("value {v} at position {} is not in [0, 1]", i + 1),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn nonneg_finite(key: &str, v: f64) -> Result<()> {
    if !v.is_finite() {
        Err(Error::config(key, format!("must be finite, got {v}")))
    } else if v < 0.0 {
        Err(Error::config(key, format!("must be >= 0, got {v}")))
    } else {
        Ok(())
    }
}

fn unit_interval(key: &str, v: f64) -> Result<()> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Error::config(key, format!("must be in [0, 1], got {v}")))
    }
}

/// The inputs the bounds were computed from, after filling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResolvedInputs {
    /// `T`.
    pub horizon: usize,
    /// `δ`.
    pub delta: f64,
    /// `ε` (given, or `√(δ/2)`).
    pub eps: f64,
    /// `D_KL^seq` (given, or `T·δ`).
    pub kl_seq: f64,
    /// `D_TV^seq` (given, or `√(D_KL^seq/2)`).
    pub tv_seq: f64,
    /// `D̄_t` for `t = 1..=T` (given, or `min(1, ε, √(δ/2))` everywhere). Serialized as its
    /// maximum (the filled constant, or the largest value of the caller's own profile).
    #[serde(serialize_with = "dbar_max")]
    pub dbar: Dbar,
}

/// Every bound of docs/FORMAT.md (Bound certificate) for one set of inputs. Serializes to JSON with the keys
/// `classical_kl`, `classical_tv`, `pm_kl`, `pm_tv`, `mix_kl`, `mix_tv`, `coupling`,
/// `adaptive_kl`, `adaptive_tv`, `adaptive`, `unified`, `argmin`, `filled`, `inputs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bounds {
    /// [`classical_kl`]: `T(T−1)δ`.
    pub classical_kl: f64,
    /// [`classical_tv`]: `2T(T−1)ε²`.
    pub classical_tv: f64,
    /// [`pm_kl`].
    pub pm_kl: f64,
    /// [`pm_tv`].
    pub pm_tv: f64,
    /// [`mix_kl`].
    pub mix_kl: f64,
    /// [`mix_tv`].
    pub mix_tv: f64,
    /// [`coupling`].
    pub coupling: f64,
    /// [`adaptive_kl`].
    pub adaptive_kl: f64,
    /// [`adaptive_tv`].
    pub adaptive_tv: f64,
    /// [`adaptive`] (the min form).
    pub adaptive: f64,
    /// `B* = min(pm_kl, pm_tv, mix_kl, mix_tv, coupling, adaptive)`.
    pub unified: f64,
    /// Which of [`UNIFIED_CANDIDATES`] attains `B*` (the first one on a tie).
    pub argmin: &'static str,
    /// The inputs that were filled by relaxations, among `eps`, `kl_seq`, `tv_seq`, `dbar`.
    pub filled: Vec<&'static str>,
    /// The inputs after filling.
    pub inputs: ResolvedInputs,
}

/// Validates the inputs, fills the missing ones and computes every bound.
///
/// Fails (naming the flag) on invalid inputs, or when a classical bound overflows `f64`.
pub fn compute(inputs: &BoundInputs) -> Result<Bounds> {
    inputs.validate()?;
    if inputs.horizon as u64 > MAX_HORIZON {
        return Err(Error::config(
            "--horizon",
            format!(
                "{} is out of range (at most 2^53 = {MAX_HORIZON})",
                inputs.horizon
            ),
        ));
    }
    let t = inputs.horizon;
    let delta = inputs.delta;
    let mut filled = Vec::new();
    let pinsker = (delta / 2.0).sqrt();

    let eps = inputs.eps.unwrap_or_else(|| {
        filled.push("eps");
        pinsker
    });
    let kl_seq = inputs.kl_seq.unwrap_or_else(|| {
        filled.push("kl_seq");
        t as f64 * delta
    });
    let tv_seq = inputs.tv_seq.unwrap_or_else(|| {
        filled.push("tv_seq");
        (kl_seq / 2.0).sqrt()
    });
    let dbar = match &inputs.dbar {
        Some(d) => Dbar::Profile(d.clone()),
        None => {
            filled.push("dbar");
            Dbar::Constant(eps.min(pinsker).min(1.0))
        }
    };

    let classical_kl = classical_kl(t, delta);
    if !classical_kl.is_finite() {
        return Err(Error::config(
            "--delta",
            "too large: the classical bound T(T-1)δ overflows f64",
        ));
    }
    let classical_tv = classical_tv(t, eps);
    if !classical_tv.is_finite() {
        return Err(Error::config(
            "--eps",
            "too large: the classical bound 2T(T-1)ε² overflows f64",
        ));
    }

    let pm_kl = pm_kl(t, delta);
    let pm_tv = pm_tv(t, delta, eps);
    let mix_kl = mix_kl(t, delta, kl_seq);
    let mix_tv = mix_tv(t, eps, tv_seq);
    let coupling = coupling(t, eps);
    let profile = |e: Option<f64>, d: Option<f64>| match &dbar {
        Dbar::Profile(p) => adaptive_sum(p, e, d),
        Dbar::Constant(v) => 4.0 * constant_profile_sum(t as u64, *v, e, d, lntrm_weight),
    };
    let adaptive_kl = profile(None, Some(delta));
    let adaptive_tv = profile(Some(eps), None);
    let adaptive = profile(Some(eps), Some(delta));

    let candidates = [pm_kl, pm_tv, mix_kl, mix_tv, coupling, adaptive];
    let mut best = 0;
    for (i, &v) in candidates.iter().enumerate() {
        if v < candidates[best] {
            best = i;
        }
    }

    Ok(Bounds {
        classical_kl,
        classical_tv,
        pm_kl,
        pm_tv,
        mix_kl,
        mix_tv,
        coupling,
        adaptive_kl,
        adaptive_tv,
        adaptive,
        unified: candidates[best],
        argmin: UNIFIED_CANDIDATES[best],
        filled,
        inputs: ResolvedInputs {
            horizon: t,
            delta,
            eps,
            kl_seq,
            tv_seq,
            dbar,
        },
    })
}

/// Formats a value with 7 significant digits: fixed notation in `[1e-4, 1e7)`, scientific
/// outside it.
fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".to_string()
    } else if (1e-4..1e7).contains(&a) {
        let decimals = (6 - a.log10().floor() as i32).max(0) as usize;
        format!("{v:.decimals$}")
    } else {
        format!("{v:.6e}")
    }
}

impl Bounds {
    /// `(name, value)` of every bound, in the order of the JSON keys.
    pub fn entries(&self) -> [(&'static str, f64); 11] {
        [
            ("classical_kl", self.classical_kl),
            ("classical_tv", self.classical_tv),
            ("pm_kl", self.pm_kl),
            ("pm_tv", self.pm_tv),
            ("mix_kl", self.mix_kl),
            ("mix_tv", self.mix_tv),
            ("coupling", self.coupling),
            ("adaptive_kl", self.adaptive_kl),
            ("adaptive_tv", self.adaptive_tv),
            ("adaptive", self.adaptive),
            ("unified", self.unified),
        ]
    }

    /// A human-readable, aligned table: the resolved inputs (filled ones marked), one row per
    /// bound with the argmin of `B*` marked, and the list of filled inputs.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let i = &self.inputs;
        let mark = |name: &str| {
            if self.filled.contains(&name) {
                "  (filled)"
            } else {
                ""
            }
        };
        let mut out = String::new();
        let _ = writeln!(out, "inputs");
        let _ = writeln!(out, "  {:<14}{:>16}", "horizon", i.horizon);
        let _ = writeln!(out, "  {:<14}{:>16}", "delta", fmt_value(i.delta));
        for (name, v) in [("eps", i.eps), ("kl_seq", i.kl_seq), ("tv_seq", i.tv_seq)] {
            let _ = writeln!(out, "  {:<14}{:>16}{}", name, fmt_value(v), mark(name));
        }
        match &i.dbar {
            Dbar::Constant(v) => {
                let _ = writeln!(out, "  {:<14}{:>16}  (filled)", "dbar", fmt_value(*v));
            }
            Dbar::Profile(p) => {
                let _ = writeln!(
                    out,
                    "  {:<14}{:>16}  (max of {} values)",
                    "dbar",
                    fmt_value(i.dbar.max()),
                    p.len()
                );
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "  {:<14}{:>16}", "bound", "value");
        for (name, v) in self.entries() {
            let note = if name == "unified" {
                format!("  = {}", self.argmin)
            } else if name == self.argmin {
                "  <- argmin".to_string()
            } else {
                String::new()
            };
            let _ = writeln!(out, "  {:<14}{:>16}{}", name, fmt_value(v), note);
        }
        let _ = writeln!(out);
        if self.filled.is_empty() {
            let _ = write!(out, "filled: none");
        } else {
            let _ = write!(out, "filled: {}", self.filled.join(", "));
        }
        out
    }
}
