//! verl's 19 rollout-correction presets (HEAD `RolloutCorrectionConfig` factories), the
//! dataclass default, and the paper's aliases.

use super::types::{CorrectionConfig, ThresholdSpec};
use crate::error::{Error, Result};
use crate::stats::IsLevel;

/// A threshold as a preset writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    Number(f64),
    Text(&'static str),
}

impl Threshold {
    fn spec(self) -> ThresholdSpec {
        match self {
            Threshold::Number(x) => ThresholdSpec::Number(x),
            Threshold::Text(t) => ThresholdSpec::Text(t.into()),
        }
    }
}

/// One verl preset, field for field.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub rollout_is: Option<IsLevel>,
    pub rollout_is_threshold: Threshold,
    pub rollout_rs: Option<&'static str>,
    pub rollout_rs_threshold: Option<Threshold>,
    pub bypass_mode: bool,
    pub loss_type: &'static str,
}

/// The 19 verl presets.
pub const PRESETS: [Preset; 19] = [
    Preset {
        name: "bypass_pg_geo_rs",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: true,
        loss_type: "reinforce",
    },
    Preset {
        name: "bypass_pg_geo_rs_seq_tis",
        rollout_is: Some(IsLevel::Sequence),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: true,
        loss_type: "reinforce",
    },
    Preset {
        name: "bypass_pg_geo_rs_token_tis",
        rollout_is: Some(IsLevel::Token),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: true,
        loss_type: "reinforce",
    },
    Preset {
        name: "bypass_pg_is",
        rollout_is: Some(IsLevel::Sequence),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: true,
        loss_type: "reinforce",
    },
    Preset {
        name: "bypass_pg_token_icepop",
        rollout_is: Some(IsLevel::Token),
        rollout_is_threshold: Threshold::Text("0.5_5.0"),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: true,
        loss_type: "reinforce",
    },
    Preset {
        name: "bypass_ppo_clip",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: true,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "bypass_ppo_clip_geo_rs",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: true,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "bypass_ppo_clip_k3_rs",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k3"),
        rollout_rs_threshold: Some(Threshold::Number(0.01)),
        bypass_mode: true,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_geo_rs",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_geo_rs_seq_tis",
        rollout_is: Some(IsLevel::Sequence),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_geo_rs_token_tis",
        rollout_is: Some(IsLevel::Token),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.999_1.001")),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_k3_rs",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k3"),
        rollout_rs_threshold: Some(Threshold::Number(0.01)),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_k3_rs_seq_tis",
        rollout_is: Some(IsLevel::Sequence),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k3"),
        rollout_rs_threshold: Some(Threshold::Number(0.01)),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_k3_rs_token_tis",
        rollout_is: Some(IsLevel::Token),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_mean_k3"),
        rollout_rs_threshold: Some(Threshold::Number(0.01)),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_seq_is",
        rollout_is: Some(IsLevel::Sequence),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_seq_is_rs",
        rollout_is: Some(IsLevel::Sequence),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: Some("seq_sum_k1"),
        rollout_rs_threshold: Some(Threshold::Text("0.5_2.0")),
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_token_icepop",
        rollout_is: Some(IsLevel::Token),
        rollout_is_threshold: Threshold::Text("0.5_5.0"),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "decoupled_token_is",
        rollout_is: Some(IsLevel::Token),
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
    Preset {
        name: "disabled",
        rollout_is: None,
        rollout_is_threshold: Threshold::Number(2.0),
        rollout_rs: None,
        rollout_rs_threshold: None,
        bypass_mode: false,
        loss_type: "ppo_clip",
    },
];

/// Paper names → verl presets or trmask configs (unambiguous ones only).
/// `trm_avg` = `decoupled_k3_rs` (TRM-avg from samples: `seq_mean_k3 ≤ 0.01`),
/// `geo_mask` = `decoupled_geo_rs` (`seq_mean_k1` in `"0.999_1.001"`),
/// `seq_mis` = `decoupled_seq_is_rs` (sequence IS + `seq_sum_k1` in `"0.5_2.0"`),
/// `trm_max` = TRM-max from samples: `seq_max_k2 ≤ 2.5` (decoupled, no IS).
pub const ALIASES: [(&str, &str); 4] = [
    ("trm_avg", "decoupled_k3_rs"),
    ("geo_mask", "decoupled_geo_rs"),
    ("seq_mis", "decoupled_seq_is_rs"),
    ("trm_max", "<trm_max>"),
];

impl CorrectionConfig {
    /// Names of every preset (verl's 19) and alias.
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS
            .iter()
            .map(|p| p.name)
            .chain(ALIASES.iter().map(|a| a.0))
            .collect()
    }

    /// A verl preset by name (`decoupled_k3_rs`, …, `<dataclass default>`) or paper alias
    /// (`trm_max`, `trm_avg`, `geo_mask`, `seq_mis`).
    pub fn preset(name: &str) -> Result<Self> {
        if name == "<dataclass default>" || name == "default" {
            return Ok(CorrectionConfig {
                rollout_is: Some(IsLevel::Sequence),
                loss_type: Some("ppo_clip".into()),
                ..Default::default()
            });
        }
        if name == "trm_max" {
            return Ok(CorrectionConfig {
                rollout_rs: Some("seq_max_k2".into()),
                rollout_rs_threshold: Some(ThresholdSpec::Number(2.5)),
                loss_type: Some("ppo_clip".into()),
                ..Default::default()
            });
        }
        let name = ALIASES
            .iter()
            .find(|a| a.0 == name)
            .map(|a| a.1)
            .unwrap_or(name);
        let p = PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
            Error::config(
                "preset",
                format!(
                    "unknown preset `{name}`; known: {}",
                    Self::preset_names().join(", ")
                ),
            )
        })?;
        Ok(CorrectionConfig {
            rollout_is: p.rollout_is,
            rollout_is_threshold: Some(p.rollout_is_threshold.spec()),
            rollout_is_batch_normalize: false,
            rollout_rs: p.rollout_rs.map(String::from),
            rollout_rs_threshold: p.rollout_rs_threshold.map(Threshold::spec),
            bypass_mode: p.bypass_mode,
            loss_type: Some(p.loss_type.into()),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_resolve() {
        for name in CorrectionConfig::preset_names() {
            CorrectionConfig::preset(name).unwrap().resolve().unwrap();
        }
        assert!(CorrectionConfig::preset("nope").is_err());
    }
}
