//! The one way a batch gets corrected: kept mass and its replay, the statistics table, the
//! engine's corrections pass and the metric partials, for one data-parallel shard. Every
//! entry point — [`Corrector`](crate::Corrector), [`correct`](super::correct),
//! `distributed::correct` and [`analyze`](crate::analysis::analyze) — runs this, so one config
//! gives the same weights, mask and metrics whichever way it comes in.

use super::head::{check_valid_tokens, compute_partial};
use super::plan::Plan;
use crate::config::Stat;
use crate::engine::passes::correction_table;
use crate::engine::Engine;
use crate::error::Result;
use crate::input::batch::Batch;
use crate::partial::{exchange, Exchange, Partial};
use crate::sampling::kept_mass::{batch_kept_mass, BatchKeptMass};
use crate::stats::{Corrections, StatTable};
use std::borrow::Cow;

/// One shard's corrections before the partials are exchanged.
pub(crate) struct Shard<'b> {
    /// The batch the corrections read: the input, or its replay over the kept sets.
    pub(crate) batch: Cow<'b, Batch>,
    /// The kept mass (its replayed batch moved to `batch`).
    pub(crate) kept: Option<(BatchKeptMass, Option<&'static str>)>,
    pub(crate) table: StatTable,
    pub(crate) corrections: Corrections,
    /// verl's and trmask's correction metrics (`correction::head`).
    pub(crate) partial: Partial,
}

/// Runs the shard (`plan` compiled from `resolved`): `binary_kl` adds KPop's binary KL column even when no criterion reads it
/// (`trmask analyze` writes it out).
pub(crate) fn shard<'b>(
    engine: &dyn Engine,
    plan: &Plan,
    batch: &'b Batch,
    binary_kl: bool,
    ex: &mut dyn Exchange,
) -> Result<Shard<'b>> {
    let config = &plan.config;
    let kept = batch_kept_mass(
        batch,
        &config.sampling,
        config.sampling_replay,
        config.bypass_mode,
        config.temperature,
    )?;
    let (batch, kept) = match kept {
        Some(mut k) => match k.replayed.take() {
            Some((name, b)) => (Cow::Owned(b), Some((k, Some(name)))),
            None => (Cow::Borrowed(batch), Some((k, None))),
        },
        None => (Cow::Borrowed(batch), None),
    };
    let bkl = binary_kl || plan.cfg.criteria.iter().any(|c| c.stat == Stat::BinaryKl);
    let table = correction_table(engine, &batch, config, bkl)?;
    let (corrections, partial) = compute_partial(engine, &batch, &table, plan, ex)?;
    Ok(Shard {
        batch,
        kept,
        table,
        corrections,
        partial,
    })
}

/// [`shard`] finished as a correction: with trmask's metrics on, the kept-mass and breakdown
/// partials join the correction's; every rank's partial merged; the metrics finished once.
pub(crate) fn correct_shard(
    engine: &dyn Engine,
    plan: &Plan,
    batch: &Batch,
    ex: &mut dyn Exchange,
) -> Result<Corrections> {
    let s = shard(engine, plan, batch, false, ex)?;
    let mut p = s.partial;
    let mut c = s.corrections;
    if !plan.cfg.verl_metrics_only {
        if let Some((k, _)) = &s.kept {
            // the kept mass is read on the input's valid tokens (the replay keeps the mask)
            p.extend(k.metrics(&s.batch));
        }
    }
    let merged = exchange(ex, p)?;
    check_valid_tokens(&merged, s.batch.layout())?;
    c.metrics = merged.finish()?;
    c.histograms = merged.histograms();
    Ok(c)
}
