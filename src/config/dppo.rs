//! The `dppo` configuration block: DPPO's top-K trust region and Predictive Divergence Masks.

use crate::error::{Error, Result};
use crate::stats::{DppoDirection, TopkDivergence, TopkSupport};
use serde::{Deserialize, Serialize};

/// The `dppo` configuration block (docs/FORMAT.md, Config):
/// `{"divergence": "topk_kl"|"topk_tv", "delta": δ, "delta_low": δ_low, "delta_high": δ_high,
///   "direction": "ratio"|"predictive_aggregated"|"predictive_uniform",
///   "top_k_support": "union"|"replace_kth"}` (`support` is accepted for `top_k_support`).
///
/// **Threshold rule.** A token's threshold is `δ_high` when `π_y > μ_y` (the ratio
/// `π_train/π_roll` of the sampled token is above 1) and `δ_low` otherwise (`π_y ≤ μ_y`),
/// whatever the `direction`; each defaults to `delta` when absent. The sign of `π_y − μ_y`
/// always picks the side, also for the predictive directions.
///
/// Deserialize it with [`DppoConfig::from_json`] (which validates and names the bad key), or
/// embed it in a larger serde struct and call [`DppoConfig::validate`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DppoConfig {
    /// D: `topk_kl` (default) or `topk_tv`.
    #[serde(default)]
    pub divergence: TopkDivergence,
    /// δ, finite and > 0 (required).
    pub delta: f64,
    /// δ for tokens with `π_y ≤ μ_y`; defaults to `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_low: Option<f64>,
    /// δ for tokens with `π_y > μ_y`; defaults to `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_high: Option<f64>,
    /// The direction test (default `ratio`).
    #[serde(default)]
    pub direction: DppoDirection,
    /// The support S (default `union`); JSON key `top_k_support` or `support`.
    #[serde(default, rename = "top_k_support", alias = "support")]
    pub support: TopkSupport,
}

impl DppoConfig {
    /// A configuration with the given divergence, δ and direction, symmetric thresholds and
    /// the union support.
    pub fn new(divergence: TopkDivergence, delta: f64, direction: DppoDirection) -> Self {
        DppoConfig {
            divergence,
            delta,
            delta_low: None,
            delta_high: None,
            direction,
            support: TopkSupport::Union,
        }
    }

    /// Parses a `dppo` JSON object and validates it. Errors name the key (`dppo.delta`, …).
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let obj = value
            .as_object()
            .ok_or_else(|| Error::config("dppo", format!("expected an object, got {value}")))?;
        const KEYS: [&str; 7] = [
            "divergence",
            "delta",
            "delta_low",
            "delta_high",
            "direction",
            "top_k_support",
            "support",
        ];
        for k in obj.keys() {
            if !KEYS.contains(&k.as_str()) {
                return Err(Error::config(
                    format!("dppo.{k}"),
                    format!("unknown key; expected one of {}", KEYS.join(", ")),
                ));
            }
        }
        if obj.contains_key("support") && obj.contains_key("top_k_support") {
            return Err(Error::config(
                "dppo.support",
                "given together with its alias `top_k_support`; give one",
            ));
        }
        fn field<T: serde::de::DeserializeOwned>(
            obj: &serde_json::Map<String, serde_json::Value>,
            key: &str,
        ) -> Result<Option<T>> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => serde_json::from_value(v.clone())
                    .map(Some)
                    .map_err(|e| Error::config(format!("dppo.{key}"), format!("{v}: {e}"))),
            }
        }
        let delta = field::<f64>(obj, "delta")?
            .ok_or_else(|| Error::config("dppo.delta", "is required"))?;
        let cfg = DppoConfig {
            divergence: field(obj, "divergence")?.unwrap_or_default(),
            delta,
            delta_low: field(obj, "delta_low")?,
            delta_high: field(obj, "delta_high")?,
            direction: field(obj, "direction")?.unwrap_or_default(),
            support: match field(obj, "top_k_support")? {
                Some(s) => s,
                None => field(obj, "support")?.unwrap_or_default(),
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that every δ is finite and > 0.
    pub fn validate(&self) -> Result<()> {
        for (key, v) in [
            ("dppo.delta", Some(self.delta)),
            ("dppo.delta_low", self.delta_low),
            ("dppo.delta_high", self.delta_high),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(Error::config(key, format!("{v} must be finite and > 0")));
                }
            }
        }
        Ok(())
    }

    /// δ_low (`delta` when absent).
    pub fn delta_low(&self) -> f64 {
        self.delta_low.unwrap_or(self.delta)
    }
    /// δ_high (`delta` when absent).
    pub fn delta_high(&self) -> f64 {
        self.delta_high.unwrap_or(self.delta)
    }
    /// The threshold of a token whose sampled-token probability difference is `prob_diff`
    /// (`π_y − μ_y`): δ_high when it is > 0, δ_low otherwise.
    pub fn threshold(&self, prob_diff: f64) -> f64 {
        if prob_diff > 0.0 {
            self.delta_high()
        } else {
            self.delta_low()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json() {
        let c = DppoConfig::from_json(&serde_json::json!({
            "divergence": "topk_tv", "delta": 0.1, "direction": "predictive_uniform",
            "top_k_support": "replace_kth", "delta_high": 0.2}))
        .unwrap();
        assert_eq!(c.divergence, TopkDivergence::TopkTv);
        assert_eq!(c.direction, DppoDirection::PredictiveUniform);
        assert_eq!(c.support, TopkSupport::ReplaceKth);
        assert_eq!((c.delta_low(), c.delta_high()), (0.1, 0.2));
        assert_eq!(c.threshold(1e-9), 0.2);
        assert_eq!(c.threshold(0.0), 0.1);
        let c2: DppoConfig =
            serde_json::from_str(r#"{"delta": 0.1, "support": "replace_kth"}"#).unwrap();
        assert_eq!(c2.support, TopkSupport::ReplaceKth);
        assert_eq!(c2.divergence, TopkDivergence::TopkKl);
        assert_eq!(c2.direction, DppoDirection::Ratio);
        let back: DppoConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        for (bad, key) in [
            (serde_json::json!({"delta": 0.0}), "dppo.delta"),
            (serde_json::json!({"delta": -1.0}), "dppo.delta"),
            (serde_json::json!({}), "dppo.delta"),
            (
                serde_json::json!({"delta": 0.1, "delta_low": 0.0}),
                "dppo.delta_low",
            ),
            (serde_json::json!({"delta": "x"}), "dppo.delta"),
            (
                serde_json::json!({"delta": 0.1, "direction": "up"}),
                "dppo.direction",
            ),
            (
                serde_json::json!({"delta": 0.1, "divergence": "kl"}),
                "dppo.divergence",
            ),
            (
                serde_json::json!({"delta": 0.1, "support": "all"}),
                "dppo.support",
            ),
            (serde_json::json!({"delta": 0.1, "detla": 1}), "dppo.detla"),
        ] {
            match DppoConfig::from_json(&bad) {
                Err(Error::InvalidConfig { key: k, .. }) => assert_eq!(k, key, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let mut c = DppoConfig::new(TopkDivergence::TopkKl, f64::NAN, DppoDirection::Ratio);
        assert!(c.validate().is_err());
        c.delta = 1.0;
        c.delta_high = Some(f64::INFINITY);
        assert!(c.validate().is_err());
    }
}
