//! One call from a batch to every per-token and per-sequence output and every metric
//! (docs/FORMAT.md, Outputs), on any [`Engine`].

use crate::bounds::certificate::{certificate_finish, certificate_partial, Certificate};
use crate::config::CorrectionConfig;
use crate::correction;
use crate::engine::Engine;
use crate::error::Result;
use crate::input::batch::Batch;
use crate::io::{seq_output, token_output, Output};
use crate::metrics::{divergence_metrics, DIVERGENCES};
use crate::partial::{exchange, Acc, Empty, Exchange, Partial, SingleProcess, Sum};
use crate::stats::Corrections;
use std::collections::BTreeMap;

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
    /// Per configured rejection criterion, the rejected fractions at thresholds over the
    /// batch's range ([`crate::analysis::sweep`]); empty for a data-parallel shard (its range is not
    /// the whole batch's).
    pub sweeps: Vec<crate::analysis::sweep::Sweep>,
    /// What the summary screen and the warnings read besides the metrics.
    pub findings: crate::stats::Findings,
}

/// Per-token outputs (docs/FORMAT.md, Outputs) written by `trmask analyze` (`ddot` is added as a copy of
/// the one the configured DPPO / PDM direction uses, see [`ddot_used`]).
pub const TOKEN_OUTPUTS: [&str; 14] = [
    "log_ratio",
    "k1",
    "k2",
    "k3",
    "kl",
    "kl_rev",
    "tv",
    "rollout_entropy",
    "training_entropy",
    "topk_kl",
    "topk_tv",
    "ddot_aggregated",
    "ddot_uniform",
    "binary_kl",
];

/// The `ddot` variant the configured direction uses: `ddot_uniform` with
/// `dppo.direction = predictive_uniform`, else `ddot_aggregated`.
pub fn ddot_used(config: &CorrectionConfig) -> &'static str {
    match config.dppo.as_ref().map(|d| d.direction) {
        Some(crate::stats::DppoDirection::PredictiveUniform) => "ddot_uniform",
        _ => "ddot_aggregated",
    }
}

/// Runs the estimators (and vocabulary divergences when logits are present), reduces them per
/// sequence, and computes the configured IS weights, rejection masks and metrics
/// ([`crate::correction`]). The single entry point used by `trmask analyze`.
pub fn analyze(engine: &dyn Engine, batch: &Batch, config: &CorrectionConfig) -> Result<Analysis> {
    analyze_shard(engine, batch, config, &mut SingleProcess)
}

/// [`analyze`] for one data-parallel rank holding `batch`, a shard of the whole batch (whole
/// sequences; any number of them, none included). Every rank calls it collectively with the
/// same config; `ex` carries the partials (`crate::partial`): once for the batch-normalised IS
/// weights when they are configured, once for the metrics. Outputs, weights and masks are this
/// shard's rows of the whole-batch run; `metrics` and `certificate` are the whole batch's,
/// identical on every rank.
pub fn analyze_shard(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
    ex: &mut dyn Exchange,
) -> Result<Analysis> {
    let plan = crate::correction::plan::Plan::compile(config)?;
    let original = batch;
    let crate::correction::run::Shard {
        batch,
        kept,
        table,
        mut corrections,
        partial: corr_partial,
    } = crate::correction::run::shard(engine, &plan, batch, true, ex)?;
    let batch: &Batch = &batch;
    let sweeps = if ex.size() <= 1 {
        let tokens = crate::analysis::sweep::table_token_values(batch, &table, &plan.cfg)?;
        crate::analysis::sweep::sweeps(Some(tokens), &plan.cfg, &corrections)?
    } else {
        Vec::new()
    };
    let mut outputs = Vec::new();
    let mut partial = Partial::new();
    // trmask/<stat>_mean (exact, over valid tokens) and _max of every per-token statistic
    // the table's `ddot` is the aggregated one; the output `ddot` is the one the mask used
    let keys: Vec<&str> = table
        .stats
        .keys()
        .map(String::as_str)
        // route_flip's outputs and means are over recorded tokens (analysis::routing)
        .filter(|n| !matches!(*n, "rollout_log_prob" | "train_log_prob" | "route_flip"))
        .collect();
    let mut stat_names: Vec<&str> = keys
        .iter()
        .map(|&n| if n == "ddot" { "ddot_aggregated" } else { n })
        .collect();
    let mut stat_values: Vec<&[f64]> = keys.iter().map(|n| table.stats[*n].as_slice()).collect();
    let used = ddot_used(config);
    if let Some(i) = stat_names.iter().position(|n| *n == used) {
        stat_names.push("ddot");
        stat_values.push(stat_values[i]);
    }
    let reduced = engine.segment_reduce(&stat_values, batch.segments())?;
    let valid = batch.mask().iter().filter(|&&m| m).count() as u64;
    let criterion_outputs: Vec<&str> = corrections
        .criteria
        .iter()
        .map(|c| c.output_name.as_str())
        .collect();
    for ((name, v), r) in stat_names.iter().zip(&stat_values).zip(&reduced) {
        let mean = Acc::Mean {
            sum: Sum::of(r.sum.iter().copied()),
            n: valid,
            offset: 0.0,
            empty: Empty::Zero,
        };
        let max = r
            .max
            .iter()
            .zip(&r.count)
            .filter(|(_, &c)| c > 0)
            .map(|(&m, _)| m);
        partial.put(format!("trmask/{name}_mean"), mean);
        partial.put(format!("trmask/{name}_max"), Acc::max(max, Empty::Absent));
        if DIVERGENCES.contains(name) {
            divergence_metrics(name, v, batch.segments(), &mut partial);
        }
        if !TOKEN_OUTPUTS.contains(name) && *name != "ddot" {
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
    outputs.extend(crate::analysis::routing::routing_outputs(
        engine,
        batch,
        &table,
        &criterion_outputs,
    )?);
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
    if let Some((k, replayed)) = &kept {
        outputs.push(token_output(
            original,
            "log_kept_mass",
            k.log_kept_mass.clone(),
        ));
        if let Some(name) = replayed {
            let v = match *name {
                "old_log_prob" => batch.old_log_prob().map(<[f64]>::to_vec),
                _ => batch.log_prob().map(<[f64]>::to_vec),
            };
            outputs.push(token_output(
                batch,
                &format!("{name}_kept"),
                v.unwrap_or_default(),
            ));
        }
        partial.extend(k.metrics(original));
    }
    let corr_keys = corr_partial.clone();
    partial.extend(corr_partial);
    certificate_partial(
        &table,
        batch.segments(),
        &corrections.seq_accept,
        &mut partial,
    );
    // the whole batch's statistics: every rank's partial merged (as is with one process)
    let merged = exchange(ex, partial)?;
    correction::check_valid_tokens(&merged, batch.layout())?;
    let certificate = certificate_finish(&merged)?;
    let mut metrics = merged.finish()?;
    corrections.metrics = merged.restricted_to(&corr_keys).finish()?;
    if let Some(c) = &certificate {
        metrics.extend(c.metrics());
    }
    let findings = super::findings::findings(batch, &table, &corrections);
    Ok(Analysis {
        outputs,
        metrics,
        corrections,
        certificate,
        sweeps,
        findings,
    })
}
