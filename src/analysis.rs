//! One call from a batch to every per-token and per-sequence output the inputs allow
//! (SPEC §4), on any [`Engine`].

use crate::batch::Batch;
use crate::certificate::{certificate, Certificate};
use crate::config::CorrectionConfig;
use crate::correction::{self, Corrections};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::io::{seq_output, token_output, Output};
use std::collections::BTreeMap;

/// Per-token statistics by name (`log_ratio`, `rho`, `k1`, `k2`, `k3`, `abs`, `ser`, and from
/// logits `kl`, `kl_rev`, `tv`, `rollout_entropy`, `training_entropy`), one value per slot,
/// 0 at invalid slots.
#[derive(Clone, Debug, Default)]
pub struct StatTable {
    pub stats: BTreeMap<String, Vec<f64>>,
}

impl StatTable {
    /// The statistic `name`, or an error saying which inputs it needs.
    pub fn get(&self, name: &str) -> Result<&[f64]> {
        self.stats.get(name).map(|v| v.as_slice()).ok_or_else(|| {
            let need = match name {
                "kl" | "kl_rev" | "tv" | "rollout_entropy" | "training_entropy" => {
                    "rollout_logits and old_logits"
                }
                "topk_kl" | "topk_tv" | "ddot" => "rollout_topk_ids and rollout_topk_log_prob",
                _ => "rollout_log_prob and old_log_prob (or logits with responses)",
            };
            Error::config(
                name,
                format!("statistic `{name}` is not available: it needs {need}"),
            )
        })
    }
}

/// The log-probs of the training policy: `old_log_prob` (decoupled mode), else `log_prob`.
pub fn training_log_prob(batch: &Batch) -> Option<&Vec<f64>> {
    batch.old_log_prob.as_ref().or(batch.log_prob.as_ref())
}

/// The training policy's log-probs for a mode: bypass mode uses `log_prob` (π_θ); decoupled
/// mode uses `old_log_prob`, falling back to `log_prob` when the batch has none.
pub fn training_log_prob_for(batch: &Batch, bypass: bool) -> Result<Option<&Vec<f64>>> {
    if bypass {
        if batch.log_prob.is_none() && batch.old_log_prob.is_some() {
            return Err(Error::input(
                "log_prob",
                "is missing: bypass_mode uses log_prob (the current policy) as the training policy",
            ));
        }
        Ok(batch.log_prob.as_ref())
    } else {
        Ok(training_log_prob(batch))
    }
}

/// Computes every per-token statistic the batch's inputs allow (decoupled mode).
pub fn token_table(engine: &dyn Engine, batch: &Batch, temperature: f64) -> Result<StatTable> {
    token_table_for(engine, batch, temperature, false)
}

/// Computes every per-token statistic the batch's inputs allow; `bypass` selects `log_prob` as
/// the training policy. The table also holds the policies' sampled-token log-probs as
/// `rollout_log_prob` and `train_log_prob`.
pub fn token_table_for(
    engine: &dyn Engine,
    batch: &Batch,
    temperature: f64,
    bypass: bool,
) -> Result<StatTable> {
    batch.validate()?;
    let mut table = StatTable::default();
    let mask = batch.mask();
    let mut derived: Option<(Vec<f64>, Vec<f64>)> = None;
    if let (Some(r), Some(o)) = (&batch.rollout_logits, &batch.old_logits) {
        let v = engine.vocab_divergence(r, o, batch.responses.as_deref(), mask, temperature)?;
        if batch.responses.is_some() {
            derived = Some((v.rollout_logp, v.train_logp));
        }
        table.stats.insert("kl".into(), v.kl);
        table.stats.insert("kl_rev".into(), v.kl_rev);
        table.stats.insert("tv".into(), v.tv);
        table
            .stats
            .insert("rollout_entropy".into(), v.rollout_entropy);
        table
            .stats
            .insert("training_entropy".into(), v.training_entropy);
    }
    let roll = batch
        .rollout_log_prob
        .as_ref()
        .or(derived.as_ref().map(|d| &d.0));
    let train = training_log_prob_for(batch, bypass)?.or(derived.as_ref().map(|d| &d.1));
    if let (Some(r), Some(t)) = (roll, train) {
        let s = engine.token_stats(r, t, mask)?;
        let masked = |v: &Vec<f64>| -> Vec<f64> {
            v.iter()
                .zip(mask)
                .map(|(&x, &m)| if m { x } else { 0.0 })
                .collect()
        };
        table.stats.insert("rollout_log_prob".into(), masked(r));
        table.stats.insert("train_log_prob".into(), masked(t));
        for (name, v) in [
            ("log_ratio", s.log_ratio),
            ("rho", s.rho),
            ("k1", s.k1),
            ("k2", s.k2),
            ("k3", s.k3),
            ("abs", s.abs),
            ("ser", s.ser),
        ] {
            table.stats.insert(name.into(), v);
        }
    } else if table.stats.is_empty() {
        return Err(Error::input(
            if roll.is_none() {
                "rollout_log_prob"
            } else {
                "old_log_prob"
            },
            "is missing: the batch needs both policies' log-probs (or both logits with responses)",
        ));
    }
    Ok(table)
}

/// Everything computed for one batch.
#[derive(Clone, Debug)]
pub struct Analysis {
    /// Per-token and per-sequence output tensors, in the batch's layout.
    pub outputs: Vec<Output>,
    /// Metrics by name (verl's `rollout_corr/*`, trmask's `trmask/*`).
    pub metrics: BTreeMap<String, f64>,
    /// Weights, mask, per-sequence decisions (also in `outputs` / `metrics`).
    pub corrections: Corrections,
    /// The TRM paper's bounds estimated from this batch (also as `trmask/bound_*` metrics);
    /// `None` when the batch has no valid token or an infinite KL.
    pub certificate: Option<Certificate>,
}

/// Per-token outputs of SPEC §4 written by `trmask analyze`.
pub const TOKEN_OUTPUTS: [&str; 9] = [
    "log_ratio",
    "k1",
    "k2",
    "k3",
    "kl",
    "kl_rev",
    "tv",
    "rollout_entropy",
    "training_entropy",
];

/// Runs the estimators (and vocabulary divergences when logits are present), reduces them per
/// sequence, and computes the configured IS weights, rejection masks and metrics
/// ([`crate::correction`]). The single entry point used by `trmask analyze`.
pub fn analyze(engine: &dyn Engine, batch: &Batch, config: &CorrectionConfig) -> Result<Analysis> {
    let resolved = config.resolve()?;
    let table = token_table_for(engine, batch, config.temperature, config.bypass_mode)?;
    let corrections = correction::compute(engine, batch, &table, &resolved)?;
    let mut outputs = Vec::new();
    let mut metrics = BTreeMap::new();
    // trmask/<stat>_mean (exact, over valid tokens) and _max of every per-token statistic
    let stat_names: Vec<&str> = table
        .stats
        .keys()
        .map(String::as_str)
        .filter(|n| !matches!(*n, "rollout_log_prob" | "train_log_prob"))
        .collect();
    let stat_values: Vec<&[f64]> = stat_names
        .iter()
        .map(|n| table.stats[*n].as_slice())
        .collect();
    let reduced = engine.segment_reduce(&stat_values, batch.segments())?;
    let valid = batch.mask().iter().filter(|&&m| m).count();
    let criterion_outputs: Vec<&str> = corrections
        .criteria
        .iter()
        .map(|c| c.output_name.as_str())
        .collect();
    for ((name, v), r) in stat_names.iter().zip(&stat_values).zip(&reduced) {
        let mean = if valid > 0 {
            r.sum.iter().sum::<f64>() / valid as f64
        } else {
            0.0
        };
        let max = r
            .max
            .iter()
            .zip(&r.count)
            .filter(|(_, &c)| c > 0)
            .map(|(&m, _)| m)
            .fold(f64::NEG_INFINITY, f64::max);
        metrics.insert(format!("trmask/{name}_mean"), mean);
        if max.is_finite() {
            metrics.insert(format!("trmask/{name}_max"), max);
        }
        if !TOKEN_OUTPUTS.contains(name) {
            continue;
        }
        outputs.push(token_output(batch, name, v.to_vec()));
        for (agg, data) in [("mean", &r.mean), ("max", &r.max)] {
            let out = format!("seq_{agg}_{name}");
            // a criterion of the same name writes its own (decision-making) values below
            if !criterion_outputs.contains(&out.as_str()) {
                outputs.push(seq_output(&out, data.clone()));
            }
        }
    }
    if let Some(w) = &corrections.weights {
        outputs.push(token_output(batch, "rollout_is_weights", w.clone()));
    }
    outputs.push(token_output(
        batch,
        "modified_response_mask",
        corrections.mask.clone(),
    ));
    outputs.push(seq_output(
        "seq_len",
        corrections.seq_len.iter().map(|&l| l as f64).collect(),
    ));
    for c in &corrections.criteria {
        outputs.push(seq_output(&c.output_name, c.seq_stat.clone()));
    }
    outputs.push(seq_output(
        "seq_accept",
        corrections
            .seq_accept
            .iter()
            .map(|&a| a as u8 as f64)
            .collect(),
    ));
    outputs.push(seq_output(
        "seq_reject_bits",
        corrections
            .seq_reject_bits
            .iter()
            .map(|&b| b as f64)
            .collect(),
    ));
    metrics.extend(corrections.metrics.iter().map(|(k, v)| (k.clone(), *v)));
    let certificate = certificate(&table, batch.segments(), &corrections.seq_accept)?;
    if let Some(c) = &certificate {
        metrics.extend(c.metrics());
    }
    Ok(Analysis {
        outputs,
        metrics,
        corrections,
        certificate,
    })
}
