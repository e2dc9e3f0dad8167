//! [`CorrectionConfig`]: verl's rollout-correction keys verbatim plus trmask's own, the 19 verl
//! presets (and paper aliases), and verl's threshold grammar with its exact rules and errors.
//!
//! JSON keys (unknown keys are an error naming the key):
//!
//! | key | meaning |
//! |---|---|
//! | `rollout_is` | `null`, `"token"` or `"sequence"` |
//! | `rollout_is_threshold` | number `U` (TIS: `w = min(raw, U)`) or `"L_U"` (IcePop); default 2.0 |
//! | `rollout_is_batch_normalize` | bool, default false |
//! | `rollout_rs` | comma-separated `<agg>_<stat>` criteria (ANDed, duplicates dropped) |
//! | `rollout_rs_threshold` | one threshold per criterion, or one broadcast to all |
//! | `bypass_mode`, `loss_type` | verl's preset fields; `bypass_mode: true` makes `log_prob` the training policy |
//! | `temperature` | softmax temperature for logits (default 1) |
//! | `ln_trm` | `{eps, delta}` for `seq_lntrm`; a missing one drops its term from `w_t` |
//! | `cppo` | `{w_min, delta_b}` for `cppo` (default 0.8, 0.02: the position-weight floor and the prefix-budget floor) |
//! | `token_veto` | τ: reject a sequence if any ρ_t < τ |
//! | `dppo` | `{divergence, delta, delta_low, delta_high, direction, top_k_support}`: the DPPO / PDM token mask ([`DppoConfig`]; errors name `dppo.<key>`); `top_k_support` also picks the support of the `topk_*` statistics |
//! | `legacy`, `rollout_rs_threshold_lower`, `rollout_token_veto_threshold` | verl's legacy API (see [`CorrectionConfig::legacy`]) |
//!
//! Threshold grammar (verl's `_parse_rollout_rs_thresholds`): for `k1` criteria `"L_U"` keeps
//! `ln L ≤ k1 ≤ ln U`, a single `U` means `L = 1/U` (so `U ≥ 1`). Since `k1 = −log ρ =
//! log(π_roll/π_train)`, the bounds apply to `1/ρ`, not to ρ. Every other statistic takes one
//! upper bound `U` (keep if `stat ≤ U`, `U > 0`). Comparisons are inclusive.
//!
//! The module is split by job: [`types`](CorrectionConfig) (the config as written), presets
//! (verl's 19 factories and the paper's aliases), JSON, verl's threshold grammar, and resolution
//! into a [`Resolved`] plan whose criteria carry a typed [`Stat`] and [`Agg`].

mod dppo;
mod grammar;
mod json;
mod presets;
mod resolve;
mod temperature;
mod types;

pub use crate::stats::IsLevel;
pub use dppo::DppoConfig;
pub use temperature::{check_temperature, MIN_TEMPERATURE};
pub use types::{CorrectionConfig, Cppo, LnTrm, ThresholdSpec};

// The resolved plan and the grammar are internal (documented in place, hidden from the API).
#[doc(hidden)]
pub use grammar::{parse_is_threshold, parse_rs_thresholds, py_float};
#[doc(hidden)]
pub use presets::{Preset, Threshold, ALIASES, PRESETS};
#[doc(hidden)]
pub use resolve::{Agg, Criterion, IsSpec, LegacyRs, LegacySpec, Resolved, Stat, VERL_OPTIONS};
