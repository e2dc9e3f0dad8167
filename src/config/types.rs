//! The configuration as written: verl's `rollout_corr` keys plus trmask's own.

use super::dppo::DppoConfig;
use super::temperature::check_temperature;
use crate::stats::IsLevel;

/// A threshold as written in the config: a number or a string (`"2.0"`, `"0.5_5.0"`, `"0.5_2,2.5"`).
#[derive(Clone, Debug, PartialEq)]
pub enum ThresholdSpec {
    Number(f64),
    Text(String),
}

/// LN-TRM parameters (`ln_trm: {eps, delta}`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LnTrm {
    pub eps: Option<f64>,
    pub delta: Option<f64>,
}

/// CPPO's parameters (`cppo: {w_min, delta_b}`): the floor of the linear position weight and
/// the floor of the per-sequence prefix-average budget (the paper's defaults 0.8 and 0.02).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cppo {
    pub w_min: f64,
    pub delta_b: f64,
}

impl Default for Cppo {
    fn default() -> Self {
        Cppo {
            w_min: 0.8,
            delta_b: 0.02,
        }
    }
}

/// The rollout-correction configuration (verl keys + trmask keys).
#[derive(Clone, Debug, PartialEq)]
pub struct CorrectionConfig {
    pub rollout_is: Option<IsLevel>,
    /// `None` only when the key was given as `null` (an error when `rollout_is` is set).
    pub rollout_is_threshold: Option<ThresholdSpec>,
    pub rollout_is_batch_normalize: bool,
    pub rollout_rs: Option<String>,
    pub rollout_rs_threshold: Option<ThresholdSpec>,
    pub bypass_mode: bool,
    pub loss_type: Option<String>,
    /// The sampling temperature both logits tensors are divided by (1 when not given; unused
    /// without logits: log-probs are taken as given). Set it with
    /// [`CorrectionConfig::set_temperature`]; [`check_temperature`] is its rule.
    pub temperature: f64,
    pub ln_trm: Option<LnTrm>,
    /// CPPO's `{w_min, delta_b}` (`rollout_rs: "cppo"`); `None` uses the paper's defaults.
    pub cppo: Option<Cppo>,
    pub token_veto: Option<f64>,
    /// The DPPO / PDM token mask (docs/FORMAT.md, DPPO), ANDed into `modified_response_mask`.
    pub dppo: Option<DppoConfig>,
    /// verl's legacy API (commit 9b718e1a, before PR #4544): `rollout_rs` ∈ {token, sequence,
    /// geometric} with `rollout_rs_threshold` / `rollout_rs_threshold_lower` on the IS ratio,
    /// and `rollout_token_veto_threshold`. Set by `"legacy": true` or by either legacy key.
    pub legacy: bool,
    pub rollout_rs_threshold_lower: Option<f64>,
    pub rollout_token_veto_threshold: Option<f64>,
    /// The rollout engine's truncation (`top_p`, `top_k`, `min_p`): with the raw rollout
    /// top-K it gives the kept mass `log S_t` of every token (`trmask::kept_mass`).
    pub sampling: crate::sampling::kept_mass::Truncation,
    /// `sampling_replay: true`: every estimator, mask and weight uses the trainer log-prob
    /// renormalised over the kept set, `old_log_prob − log S_t` (`old_log_prob_kept`).
    pub sampling_replay: bool,
}

impl Default for CorrectionConfig {
    /// Everything off (verl's `disabled` preset): metrics only.
    fn default() -> Self {
        CorrectionConfig {
            rollout_is: None,
            rollout_is_threshold: Some(ThresholdSpec::Number(2.0)),
            rollout_is_batch_normalize: false,
            rollout_rs: None,
            rollout_rs_threshold: None,
            bypass_mode: false,
            loss_type: None,
            temperature: 1.0,
            ln_trm: None,
            cppo: None,
            token_veto: None,
            dppo: None,
            legacy: false,
            rollout_rs_threshold_lower: None,
            rollout_token_veto_threshold: None,
            sampling: Default::default(),
            sampling_replay: false,
        }
    }
}

impl CorrectionConfig {
    /// Sets the sampling temperature after checking it with [`check_temperature`]; `key` names
    /// where it came from (`temperature`, `--temperature`). The config's own key, the CLI flag
    /// and Python all set it here.
    ///
    /// ```
    /// let mut c = trmask::CorrectionConfig::default();
    /// c.set_temperature("temperature", 0.7)?;
    /// assert_eq!(c.temperature, 0.7);
    /// let e = c.set_temperature("--temperature", 0.0).unwrap_err().to_string();
    /// assert!(e.contains("--temperature") && e.contains("out of range"), "{e}");
    /// assert_eq!(c.temperature, 0.7);
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn set_temperature(&mut self, key: &str, t: f64) -> crate::error::Result<()> {
        check_temperature(key, t)?;
        self.temperature = t;
        Ok(())
    }
}
