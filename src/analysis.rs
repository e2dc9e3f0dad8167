//! One call from a batch to every per-token and per-sequence output the inputs allow
//! (SPEC §4), on any [`Engine`].

use crate::batch::{Batch, Segments};
use crate::certificate::{certificate, Certificate};
use crate::config::CorrectionConfig;
use crate::correction::{self, Corrections};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::io::{seq_output, token_output, Output};
use crate::topk::{TopkStats, TopkSupport, TrainerTopk};
use std::collections::BTreeMap;

/// Per-token statistics by name (`log_ratio`, `rho`, `k1`, `k2`, `k3`, `abs`, `ser`, from
/// logits `kl`, `kl_rev`, `tv`, `rollout_entropy`, `training_entropy`, and from the rollout
/// top-K `topk_kl`, `topk_tv`, `ddot` (aggregated tail), `ddot_uniform`), one value per slot,
/// 0 at invalid slots.
#[derive(Clone, Debug, Default)]
pub struct StatTable {
    pub stats: BTreeMap<String, Vec<f64>>,
    /// The full top-K statistics (tails, `π_y − μ_y`, support sizes) when the batch has a
    /// rollout top-K, `responses` and `old_logits`; read by the DPPO / PDM mask.
    pub topk: Option<TopkStats>,
}

/// The first input that the top-K statistics need and the batch lacks (`None`: all present).
/// They need `rollout_topk_ids` + `rollout_topk_log_prob`, `responses` and the full trainer
/// logits `old_logits` (plus `rollout_log_prob` where a sampled token is not in the top-K,
/// checked per row).
pub fn topk_missing_input(batch: &Batch) -> Option<&'static str> {
    if batch.rollout_topk_ids.is_none() || batch.rollout_topk_log_prob.is_none() {
        Some("rollout_topk_ids")
    } else if batch.responses.is_none() {
        Some("responses")
    } else if batch.old_logits.is_none() {
        Some("old_logits")
    } else {
        None
    }
}

impl StatTable {
    /// The statistic `name`, or an error saying which inputs it needs.
    pub fn get(&self, name: &str) -> Result<&[f64]> {
        self.stats.get(name).map(|v| v.as_slice()).ok_or_else(|| {
            let need = match name {
                "kl" | "kl_rev" | "tv" | "rollout_entropy" | "training_entropy" => {
                    "rollout_logits and old_logits"
                }
                "topk_kl" | "topk_tv" | "ddot" | "ddot_uniform" => {
                    "rollout_topk_ids, rollout_topk_log_prob, responses and old_logits"
                }
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
/// (`dppo.top_k_support`, default union).
pub fn token_table_config(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
) -> Result<StatTable> {
    token_table_with_support(
        engine,
        batch,
        config.temperature,
        config.bypass_mode,
        config.top_k_support(),
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
    // Without full rollout logits, the sampled-token log-probs may come from the top-K (the
    // rollout's, where every valid y_t is among it) and from old_logits (the trainer's).
    let mut roll = batch
        .rollout_log_prob
        .as_ref()
        .or(derived.as_ref().map(|d| &d.0));
    let mut train = training_log_prob_for(batch, bypass)?.or(derived.as_ref().map(|d| &d.1));
    let from_topk;
    if roll.is_none() {
        from_topk = topk_sampled_rollout_log_prob(batch);
        roll = from_topk.as_ref();
    }
    let from_logits;
    if train.is_none() {
        if let (Some(logits), Some(y)) = (&batch.old_logits, &batch.responses) {
            from_logits = Some(sampled_log_probs(batch, logits, y, temperature)?);
            train = from_logits.as_ref();
        }
    }
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
    if topk_missing_input(batch).is_none() {
        let s =
            engine.topk_divergence(batch, support, TrainerTopk::from_batch(batch, temperature)?)?;
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
        batch.rollout_topk_ids.as_ref()?,
        batch.rollout_topk_log_prob.as_ref()?,
        batch.responses.as_ref()?,
    );
    let k = batch.topk;
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

/// `log softmax(logits / temperature)[y_t]` per valid slot (0 elsewhere), f64 on the host:
/// the max factored out and a compensated sum, so log-probs near 0 keep full precision.
fn sampled_log_probs(
    batch: &Batch,
    logits: &crate::Logits,
    responses: &[i64],
    temperature: f64,
) -> Result<Vec<f64>> {
    use rayon::prelude::*;
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::config(
            "temperature",
            format!("{temperature} must be finite and > 0"),
        ));
    }
    let mask = batch.mask();
    let v = logits.vocab();
    if logits.rows() != mask.len() || responses.len() != mask.len() {
        return Err(Error::input(
            "old_logits",
            format!("has {} rows, the batch {} slots", logits.rows(), mask.len()),
        ));
    }
    let inv_t = 1.0 / temperature;
    (0..mask.len())
        .into_par_iter()
        .map_init(
            || vec![0f64; v],
            |buf, r| {
                if !mask[r] {
                    return Ok(0.0);
                }
                let y = responses[r];
                if y < 0 || y as usize >= v {
                    return Err(Error::input(
                        "responses",
                        format!(
                            "token id {y} at valid position {} is outside [0, {v})",
                            batch.position(r)
                        ),
                    ));
                }
                logits.row_f64(r, buf);
                let (mut m, mut arg) = (f64::NEG_INFINITY, usize::MAX);
                for (i, x) in buf.iter_mut().enumerate() {
                    if x.is_nan() || *x == f64::INFINITY {
                        return Err(Error::input(
                            "old_logits",
                            format!("value {x} at row {}, column {i}", batch.position(r)),
                        ));
                    }
                    *x *= inv_t;
                    if *x > m {
                        m = *x;
                        arg = i;
                    }
                }
                if arg == usize::MAX {
                    return Err(Error::input(
                        "old_logits",
                        format!("row {}: every entry is -inf", batch.position(r)),
                    ));
                }
                let rest = crate::cpu::neumaier_sum(
                    buf.iter()
                        .enumerate()
                        .filter(|&(i, _)| i != arg)
                        .map(|(_, &x)| (x - m).exp()),
                );
                Ok((buf[y as usize] - m) - rest.ln_1p())
            },
        )
        .collect()
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
pub const TOKEN_OUTPUTS: [&str; 12] = [
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
    "ddot",
];

/// Exact divergences that get threshold shares and position buckets (see
/// [`divergence_metrics`]).
const DIVERGENCES: [&str; 5] = ["kl", "kl_rev", "tv", "topk_kl", "topk_tv"];

/// Upper ends of the response-position buckets of `trmask/<stat>_pos_<lo>_<hi>`.
pub const POSITION_BUCKETS: [usize; 6] = [16, 64, 256, 1024, 4096, usize::MAX];

/// For an exact per-token divergence `name`: `trmask/<name>_frac_above_1e-4` and `_1e-3`
/// (share of valid tokens strictly above), and `trmask/<name>_pos_<lo>_<hi>` — the mean over
/// valid tokens whose position t in their response (0-based, counting valid tokens) lies in
/// `[lo, hi)`, for the buckets of [`POSITION_BUCKETS`] that hold a token (the last is named
/// `_pos_4096_inf`). Long responses drift more; this shows where.
pub fn divergence_metrics(
    name: &str,
    v: &[f64],
    segments: &Segments,
    metrics: &mut BTreeMap<String, f64>,
) {
    let mut n = 0usize;
    let mut above = [0usize; 2];
    let mut bucket_sum = [0f64; POSITION_BUCKETS.len()];
    let mut bucket_n = [0usize; POSITION_BUCKETS.len()];
    for &(a, b) in &segments.ranges {
        let valid = v[a..b].iter().zip(&segments.mask[a..b]).filter(|(_, &m)| m);
        for (t, (&x, _)) in valid.enumerate() {
            n += 1;
            above[0] += (x > 1e-4) as usize;
            above[1] += (x > 1e-3) as usize;
            let k = POSITION_BUCKETS
                .iter()
                .position(|&hi| t < hi)
                .unwrap_or(POSITION_BUCKETS.len() - 1);
            bucket_sum[k] += x;
            bucket_n[k] += 1;
        }
    }
    if n == 0 {
        return;
    }
    metrics.insert(
        format!("trmask/{name}_frac_above_1e-4"),
        above[0] as f64 / n as f64,
    );
    metrics.insert(
        format!("trmask/{name}_frac_above_1e-3"),
        above[1] as f64 / n as f64,
    );
    let mut lo = 0usize;
    for (k, &hi) in POSITION_BUCKETS.iter().enumerate() {
        if bucket_n[k] > 0 {
            let hi_name = if hi == usize::MAX {
                "inf".to_string()
            } else {
                hi.to_string()
            };
            metrics.insert(
                format!("trmask/{name}_pos_{lo}_{hi_name}"),
                bucket_sum[k] / bucket_n[k] as f64,
            );
        }
        lo = hi;
    }
}

/// Runs the estimators (and vocabulary divergences when logits are present), reduces them per
/// sequence, and computes the configured IS weights, rejection masks and metrics
/// ([`crate::correction`]). The single entry point used by `trmask analyze`.
pub fn analyze(engine: &dyn Engine, batch: &Batch, config: &CorrectionConfig) -> Result<Analysis> {
    let resolved = config.resolve()?;
    let table = token_table_config(engine, batch, config)?;
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
        if DIVERGENCES.contains(name) {
            divergence_metrics(name, v, batch.segments(), &mut metrics);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_shares_and_position_buckets() {
        // sequence 0: 20 valid tokens (positions 0..20) with a masked slot in between;
        // sequence 1: 2 tokens.
        let mut mask = vec![true; 21];
        mask[5] = false;
        mask.extend([true, true]);
        let segments = Segments {
            ranges: vec![(0, 21), (21, 23)],
            mask,
        };
        let mut v: Vec<f64> = (0..23).map(|i| if i < 21 { 1e-5 } else { 2e-3 }).collect();
        v[5] = f64::NAN; // padding is never read
        v[20] = 5e-4; // position 19 of sequence 0 → bucket [16, 64)
        let mut m = BTreeMap::new();
        divergence_metrics("kl", &v, &segments, &mut m);
        assert_eq!(m["trmask/kl_frac_above_1e-4"], 3.0 / 22.0);
        assert_eq!(m["trmask/kl_frac_above_1e-3"], 2.0 / 22.0);
        // [0,16): 16 tokens of seq 0 (1e-5) + 2 of seq 1 (2e-3)
        assert!((m["trmask/kl_pos_0_16"] - (16.0 * 1e-5 + 4e-3) / 18.0).abs() < 1e-18);
        assert!((m["trmask/kl_pos_16_64"] - (3.0 * 1e-5 + 5e-4) / 4.0).abs() < 1e-18);
        assert!(!m.contains_key("trmask/kl_pos_64_256"));
    }
}
