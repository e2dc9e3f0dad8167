//! The per-token statistics table of a batch: sampled-token estimators, exact vocabulary
//! divergences when logits are present, and top-K divergences when the rollout top-K is.

use crate::config::CorrectionConfig;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::derive::sampled_log_probs;
use crate::input::support::TrainerTopk;
use crate::math::binary_kl;
use crate::stats::{StatTable, TopkSupport};
use rayon::prelude::*;

/// The first input that the top-K statistics need and the batch lacks (`None`: all present).
/// They need `rollout_topk_ids` + `rollout_topk_log_prob`, `responses` and the full trainer
/// logits `old_logits` (plus `rollout_log_prob` where a sampled token is not in the top-K,
/// checked per row).
pub fn topk_missing_input(batch: &Batch) -> Option<&'static str> {
    if batch.rollout_topk_ids().is_none() || batch.rollout_topk_log_prob().is_none() {
        Some("rollout_topk_ids")
    } else if batch.responses().is_none() {
        Some("responses")
    } else if batch.old_logits().is_none() {
        Some("old_logits")
    } else {
        None
    }
}

/// The log-probs of the training policy: `old_log_prob` (decoupled mode), else `log_prob`.
pub fn training_log_prob(batch: &Batch) -> Option<&[f64]> {
    batch.old_log_prob().or(batch.log_prob())
}

/// The training policy's log-probs for a mode: bypass mode uses `log_prob` (π_θ); decoupled
/// mode uses `old_log_prob`, falling back to `log_prob` when the batch has none.
pub fn training_log_prob_for(batch: &Batch, bypass: bool) -> Result<Option<&[f64]>> {
    if bypass {
        if batch.log_prob().is_none() && batch.old_log_prob().is_some() {
            return Err(Error::input(
                "log_prob",
                "is missing: bypass_mode uses log_prob (the current policy) as the training policy",
            ));
        }
        Ok(batch.log_prob())
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
/// `rollout_log_prob` and `train_log_prob`. Top-K statistics use the union support.
pub fn token_table_for(
    engine: &dyn Engine,
    batch: &Batch,
    temperature: f64,
    bypass: bool,
) -> Result<StatTable> {
    token_table_with_support(engine, batch, temperature, bypass, TopkSupport::Union)
}

/// [`token_table_for`] with the config's temperature, mode and top-K support
/// (`dppo.top_k_support`, default union): the first step of every analysis and correction, so
/// it starts with [`Engine::prepare`] (the GPU engine builds the batch's kernels in parallel).
pub fn token_table_config(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
) -> Result<StatTable> {
    engine.prepare(batch);
    token_table_with_support(
        engine,
        batch,
        config.temperature,
        config.bypass_mode,
        config.top_k_support(),
    )
}

/// [`token_table_config`] for a correction (the trainer's hot path): the same table, with
/// KPop's binary KL column only when `binary_kl` (a criterion reads it; `trmask analyze`
/// always writes it out).
pub fn correction_table(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
    binary_kl: bool,
) -> Result<StatTable> {
    engine.prepare(batch);
    table_inner(
        engine,
        batch,
        config.temperature,
        config.bypass_mode,
        config.top_k_support(),
        binary_kl,
    )
}

/// [`token_table_for`] with an explicit top-K support.
///
/// When the batch has `rollout_topk_ids` / `rollout_topk_log_prob`, `responses` and
/// `old_logits`, [`Engine::topk_divergence`] runs on the trainer logits divided by
/// `temperature` (in bypass mode too: `old_logits` are the trainer's logits) and the table gets
/// `topk_kl`, `topk_tv`, `ddot` (aggregated tail) and `ddot_uniform`; a batch with a top-K but
/// without trainer logits simply has no top-K statistics (criteria that need them then fail
/// naming the inputs). Bad top-K inputs (duplicate ids, ids ≥ V, `Σ_S μ > 1`) are errors
/// naming the tensor and the row.
pub fn token_table_with_support(
    engine: &dyn Engine,
    batch: &Batch,
    temperature: f64,
    bypass: bool,
    support: TopkSupport,
) -> Result<StatTable> {
    table_inner(engine, batch, temperature, bypass, support, true)
}

fn table_inner(
    engine: &dyn Engine,
    batch: &Batch,
    temperature: f64,
    bypass: bool,
    support: TopkSupport,
    binary_kl_column: bool,
) -> Result<StatTable> {
    if batch.rollout_logits().is_some() || batch.old_logits().is_some() {
        crate::config::check_temperature("temperature", temperature)?;
    }
    let mut table = StatTable::default();
    let mask = batch.mask();
    let mut derived: Option<(Vec<f64>, Vec<f64>)> = None;
    if let (Some(r), Some(o)) = (batch.rollout_logits(), batch.old_logits()) {
        // π_train(y) = 0 makes KL(π_roll‖π_train) infinite and the sampled log-ratio −∞
        // (non-finite log-probs are errors, docs/FORMAT.md (Layout)): one verdict on every engine.
        if let Some(ids) = batch.responses() {
            if let Some(i) = crate::input::logits::impossible_sample(o, ids, mask) {
                return Err(Error::input(
                    "old_logits",
                    format!(
                        "the logit of token id {} at valid position {} is -inf: the training \
                         policy gives the sampled token zero probability, so the exact KL is \
                         infinite",
                        ids[i],
                        batch.position(i)
                    ),
                ));
            }
        }
        let v = engine.vocab_divergence(r, o, batch.responses(), mask, temperature)?;
        if batch.responses().is_some() {
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
    // Without log-probs, the sampled-token log-probs come from the logits (docs/FORMAT.md, Input tensors: a
    // log-softmax gather of `responses`), else, for the rollout, from its top-K where every
    // valid y_t is among it.
    let mut roll = batch
        .rollout_log_prob()
        .or(derived.as_ref().map(|d| d.0.as_slice()));
    let mut train =
        training_log_prob_for(batch, bypass)?.or(derived.as_ref().map(|d| d.1.as_slice()));
    let from_topk;
    if roll.is_none() {
        from_topk = match (batch.rollout_logits(), batch.responses()) {
            // docs/FORMAT.md (Input tensors): logits without log-probs give the sampled-token log-probs
            (Some(logits), Some(y)) => Some(sampled_log_probs(
                batch,
                ("rollout_logits", logits),
                y,
                temperature,
            )?),
            _ => topk_sampled_rollout_log_prob(batch),
        };
        roll = from_topk.as_deref();
    }
    let from_logits;
    if train.is_none() {
        if let (Some(logits), Some(y)) = (batch.old_logits(), batch.responses()) {
            from_logits = Some(sampled_log_probs(
                batch,
                ("old_logits", logits),
                y,
                temperature,
            )?);
            train = from_logits.as_deref();
        }
    }
    if let (Some(r), Some(t)) = (roll, train) {
        let s = engine.token_stats(r, t, mask)?;
        let masked = |v: &[f64]| -> Vec<f64> {
            v.par_iter()
                .zip(mask)
                .map(|(&x, &m)| if m { x } else { 0.0 })
                .collect()
        };
        table.stats.insert("rollout_log_prob".into(), masked(r));
        table.stats.insert("train_log_prob".into(), masked(t));
        // KPop's bidirectional binary KL (f64 on the host, from both log-probs)
        if binary_kl_column {
            let bkl = (0..mask.len())
                .into_par_iter()
                .map(|i| {
                    if mask[i] {
                        binary_kl(t[i], r[i], t[i] - r[i])
                    } else {
                        0.0
                    }
                })
                .collect();
            table.stats.insert("binary_kl".into(), bkl);
        }
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
    } else if table.stats.is_empty() && topk_missing_input(batch).is_some() {
        return Err(Error::input(
            if roll.is_none() {
                "rollout_log_prob"
            } else {
                "old_log_prob"
            },
            "is missing: the batch needs both policies' log-probs (or both logits with responses)",
        ));
    }
    if let Some(r) = batch.routing() {
        // the one computation of the routing outputs (input::routing)
        let t = r.token_stats().clone();
        table.stats.insert("route_flip".into(), t.flip.clone());
        table.routing = Some(t);
    }
    if topk_missing_input(batch).is_none() {
        // the support needs log π_roll(y) where y is outside the top-K: derived from the
        // rollout logits when the batch carries no `rollout_log_prob` (logits are shared)
        let with_log_prob;
        let topk_batch = match (batch.rollout_log_prob(), roll) {
            (None, Some(r)) if batch.rollout_logits().is_some() => {
                with_log_prob = batch.with_derived("rollout_log_prob", r.to_vec())?;
                &with_log_prob
            }
            _ => batch,
        };
        let s = engine.topk_divergence(
            topk_batch,
            support,
            TrainerTopk::from_batch(batch, temperature)?,
        )?;
        for (name, v) in [
            ("topk_kl", &s.topk_kl),
            ("topk_tv", &s.topk_tv),
            ("ddot", &s.ddot_aggregated),
            ("ddot_uniform", &s.ddot_uniform),
        ] {
            table.stats.insert(name.into(), v.clone());
        }
        table.topk = Some(s);
    }
    Ok(table)
}

/// log π_roll(y_t) from the rollout top-K, where every valid y_t is among it (else `None`).
fn topk_sampled_rollout_log_prob(batch: &Batch) -> Option<Vec<f64>> {
    let (ids, lps, y) = (
        batch.rollout_topk_ids()?,
        batch.rollout_topk_log_prob()?,
        batch.responses()?,
    );
    let k = batch.topk();
    let mask = batch.mask();
    let mut out = vec![0.0; mask.len()];
    for r in (0..mask.len()).filter(|&r| mask[r]) {
        let j = ids
            .get(r * k..(r + 1) * k)?
            .iter()
            .position(|&i| i == y[r])?;
        out[r] = lps[r * k + j];
    }
    Some(out)
}
