//! `trmask calibrate`: the threshold of one criterion that rejects a target fraction of the
//! sequences of several batches, its spread across them, and the inputs' quantisation floor.

use crate::{analyse_one, setup, Common};
use std::path::PathBuf;

/// The flags of `trmask calibrate`.
#[derive(clap::Args)]
pub struct Args {
    /// The batch files (.safetensors or .json), e.g. several steps' dumps.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The rejection criterion to calibrate (a `rollout_rs` option: seq_mean_k3, token_k1, …).
    #[arg(long)]
    criterion: String,
    /// The fraction of sequences to reject, in [0, 1).
    #[arg(long = "target-reject-rate", allow_negative_numbers = true)]
    target_reject_rate: f64,
    /// auto, gpu, cpu or cpu-fast (as for analyze).
    #[arg(long, default_value = "auto", value_parser = crate::backend_parser())]
    pub backend: trmask::backend::Backend,
    /// Every slot is a valid token (as for analyze).
    #[arg(long)]
    all_valid: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(a: Args) -> Result<(), trmask::Error> {
    let rate = a.target_reject_rate;
    if !(rate.is_finite() && (0.0..1.0).contains(&rate)) {
        return Err(trmask::Error::config(
            "--target-reject-rate",
            format!("must be in [0, 1), got {rate}"),
        ));
    }
    // k1 criteria: the upper threshold is calibrated, no lower one rejects
    let k1 = a.criterion.ends_with("k1");
    let placeholder = if k1 { "1e-300_2" } else { "1" };
    let cfg = trmask::CorrectionConfig::from_json_value(&serde_json::json!({
        "rollout_rs": a.criterion, "rollout_rs_threshold": placeholder
    }))
    .map_err(|e| trmask::Error::config("--criterion", e.to_string()))?;
    let crit = cfg.resolve()?.criteria;
    if crit.len() != 1 {
        return Err(trmask::Error::config(
            "--criterion",
            "takes one rejection criterion",
        ));
    }
    if matches!(
        crit[0].stat,
        trmask::config::Stat::M2po | trmask::config::Stat::Cppo
    ) {
        return Err(trmask::Error::config(
            "--criterion",
            format!(
                "{} cannot be calibrated: its keep test is not a threshold on one statistic \
                 (m2po bounds a batch mean, cppo adds a per-sequence prefix budget)",
                crit[0].name
            ),
        ));
    }
    let common = Common {
        backend: a.backend,
        config: None,
        preset: None,
        temperature: None,
        all_valid: a.all_valid,
    };
    let mut ctx = setup(&common)?;
    ctx.cfg = cfg;
    let several = a.inputs.len() > 1;
    let mut sweeps = Vec::new();
    let mut floor: Option<trmask::calibrate::NoiseFloor> = None;
    for path in &a.inputs {
        let d = analyse_one(
            &ctx,
            (path, several),
            &common,
            &mut |b| trmask::analysis::analyze(ctx.engine.as_ref(), b, &ctx.cfg),
            false,
        )?;
        let s = d.analysis.sweeps.into_iter().next().ok_or_else(|| {
            trmask::Error::config("--criterion", "cannot be swept (a legacy option?)")
        })?;
        if let Some(f) = trmask::calibrate::noise_floor(&d.input.batch, &crit[0]) {
            if floor.as_ref().is_none_or(|g| f.statistic > g.statistic) {
                floor = Some(f);
            }
        }
        sweeps.push((path.display().to_string(), s));
    }
    let all: Vec<&trmask::sweep::Sweep> = sweeps.iter().map(|(_, s)| s).collect();
    let pooled = trmask::sweep::threshold_for_rate(&all, rate).ok_or_else(|| {
        trmask::Error::config(
            "--target-reject-rate",
            format!(
                "no threshold of {} rejects {rate} of the sequences",
                a.criterion
            ),
        )
    })?;
    let total: u64 = all.iter().map(|s| s.sequences()).sum();
    let in_stat = |t: f64| if k1 { t.ln() } else { t };
    let mut pooled = pooled;
    if let Some(f) = &floor {
        let at_floor = if k1 { f.statistic.exp() } else { f.statistic };
        let count = |t: f64| (pooled_rate(&all, t) * total as f64).round() as u64;
        if in_stat(pooled) < f.statistic && count(at_floor) == count(pooled) {
            // the floor itself rejects the same sequences: suggest it instead
            pooled = at_floor;
        }
        if in_stat(pooled) < f.statistic {
            return Err(trmask::Error::config(
                "--target-reject-rate",
                format!(
                    "{rate} needs {} <= {pooled:.4e}, below the noise floor {:.4e} of the \
                     inputs' {}/{} log-probs: it would reject rounding noise, not mismatch",
                    a.criterion,
                    if k1 { f.statistic.exp() } else { f.statistic },
                    f.rollout,
                    f.train
                ),
            ));
        }
    }
    let per_batch: Vec<(String, Option<f64>, f64)> = sweeps
        .iter()
        .map(|(name, s)| {
            let t = trmask::sweep::threshold_for_rate(&[s], rate);
            (name.clone(), t, s.rejected_at(pooled).0)
        })
        .collect();
    let found: Vec<f64> = per_batch.iter().filter_map(|p| p.1).collect();
    let spread = (!found.is_empty()).then(|| {
        let lo = found.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = found.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, median(found.clone()), hi)
    });
    // the pooled threshold against the typical step's: when they differ by more than
    // DOMINANCE×, a few steps decide the pooled one; name the fewest that hold most of its
    // rejections
    let dominating = spread
        .filter(|&(_, mid, _)| {
            let r = in_stat(pooled) / in_stat(mid);
            !(r.is_finite() && (1.0 / DOMINANCE..=DOMINANCE).contains(&r))
        })
        .map(|_| dominating_steps(&sweeps, pooled))
        .unwrap_or_default();
    if a.json {
        let v = serde_json::json!({
            "criterion": a.criterion,
            "target_reject_rate": rate,
            "threshold": pooled,
            "per_step_median": spread.map(|s| s.1),
            "dominated_by": dominating,
            "spread": spread.map(|(lo, mid, hi)| serde_json::json!({"min": lo, "median": mid, "max": hi})),
            "noise_floor": floor,
            "batches": per_batch.iter().map(|(name, t, r)| serde_json::json!({
                "input": name, "threshold": t, "rejected_at_threshold": r
            })).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&v)
            .map_err(|e| trmask::Error::file("<stdout>", e.to_string()))?;
        say!("{text}");
        return Ok(());
    }
    say!(
        "{} threshold {pooled:.6e} rejects {:.2} % of the sequences of {} batch{} (target {:.2} %)",
        a.criterion,
        100.0 * pooled_rate(&all, pooled),
        all.len(),
        if all.len() == 1 { "" } else { "es" },
        100.0 * rate
    );
    if let Some((lo, mid, hi)) = spread {
        say!(
            "per-step median threshold {mid:.6e} (each batch's own; the pooled one is {:.3}x it)",
            in_stat(pooled) / in_stat(mid)
        );
        say!("spread across batches: min {lo:.6e}, median {mid:.6e}, max {hi:.6e}");
    }
    if !dominating.is_empty() {
        eprintln!(
            "warning: the pooled threshold differs from the per-step median by more than {}x: \
             {} hold{} most of the sequences it rejects; calibrate without {} or on more steps",
            DOMINANCE,
            dominating.join(", "),
            if dominating.len() == 1 { "s" } else { "" },
            if dominating.len() == 1 { "it" } else { "them" }
        );
    }
    match &floor {
        Some(f) => say!(
            "noise floor: {}/{} log-probs, log-ratio rounding {:.3e} -> {} {:.3e}; the threshold \
             is {:.3e} times it",
            f.rollout,
            f.train,
            f.log_ratio,
            a.criterion,
            if k1 { f.statistic.exp() } else { f.statistic },
            in_stat(pooled) / f.statistic.max(f64::MIN_POSITIVE)
        ),
        None => say!("noise floor: unknown (log-probs computed from logits)"),
    }
    for (name, t, r) in &per_batch {
        let t = t.map_or("-".to_string(), |t| format!("{t:.6e}"));
        say!(
            "  {name}: own threshold {t}, rejects {:.2} % at the pooled one",
            100.0 * r
        );
    }
    Ok(())
}

/// The pooled and the per-step median thresholds may differ by this factor before calibrate
/// names the steps that dominate the pooled one.
const DOMINANCE: f64 = 3.0;

/// The fewest batches that hold more than half of the sequences rejected at `t` (most first).
fn dominating_steps(sweeps: &[(String, trmask::sweep::Sweep)], t: f64) -> Vec<String> {
    let mut counts: Vec<(f64, &str)> = sweeps
        .iter()
        .map(|(name, s)| (s.rejected_at(t).0 * s.sequences() as f64, name.as_str()))
        .collect();
    counts.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = counts.iter().map(|c| c.0).sum();
    let mut held = 0.0;
    let mut out = Vec::new();
    for (n, name) in counts {
        if held > total / 2.0 || n <= 0.0 {
            break;
        }
        held += n;
        out.push(name.to_string());
    }
    out
}

/// The fraction of all the batches' sequences rejected at `t`.
fn pooled_rate(all: &[&trmask::sweep::Sweep], t: f64) -> f64 {
    let (mut rej, mut n) = (0.0, 0.0);
    for s in all {
        let k = s.sequences() as f64;
        rej += s.rejected_at(t).0 * k;
        n += k;
    }
    rej / n.max(1.0)
}
