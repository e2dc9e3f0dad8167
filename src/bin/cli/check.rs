//! `trmask check`: a CI gate on a batch's mismatch. Exit 3 (one `violation:` line each) when a
//! limit is exceeded, 0 when none is; 2 and 1 keep their meanings (bad input, internal error).

use crate::{analyse_one, setup, Common};
use std::path::PathBuf;

/// The exit code of a violated limit.
pub const VIOLATION: u8 = 3;
/// The exit code of bad usage (as for every other command's usage errors).
const USAGE: u8 = 2;

/// The flags of `trmask check`.
#[derive(clap::Args)]
pub struct Args {
    /// The batch files (.safetensors or .json); every one is checked.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    #[command(flatten)]
    pub common: Common,
    /// Largest allowed |log ρ| = |log π_train − log π_roll| over valid tokens; 0 checks that
    /// the two stacks give bitwise-identical log-probs.
    #[arg(long = "max-abs-log-ratio", allow_negative_numbers = true)]
    max_abs_log_ratio: Option<f64>,
    /// Largest allowed mean k3 over valid tokens (`trmask/k3_mean`).
    #[arg(long = "max-mean-k3", allow_negative_numbers = true)]
    max_mean_k3: Option<f64>,
    /// Largest allowed fraction of sequences the configured mask rejects (needs a config or a
    /// preset with a rejection criterion: without one, exit 2).
    #[arg(long = "max-reject-rate", allow_negative_numbers = true)]
    max_reject_rate: Option<f64>,
}

fn limit(flag: &str, v: Option<f64>) -> Result<Option<f64>, trmask::Error> {
    match v {
        Some(x) if !(x.is_finite() && x >= 0.0) => Err(trmask::Error::config(
            flag,
            format!("must be finite and >= 0, got {x}"),
        )),
        _ => Ok(v),
    }
}

pub fn run(a: Args) -> Result<u8, trmask::Error> {
    let max_lr = limit("--max-abs-log-ratio", a.max_abs_log_ratio)?;
    let max_k3 = limit("--max-mean-k3", a.max_mean_k3)?;
    let max_rej = limit("--max-reject-rate", a.max_reject_rate)?;
    if let Some(r) = max_rej {
        if r > 1.0 {
            return Err(trmask::Error::config(
                "--max-reject-rate",
                format!("is a fraction in [0, 1], got {r}"),
            ));
        }
    }
    if max_lr.is_none() && max_k3.is_none() && max_rej.is_none() {
        eprintln!(
            "trmask: check needs at least one limit: --max-abs-log-ratio X, --max-mean-k3 Y or \
             --max-reject-rate Z (see trmask check --help)"
        );
        return Ok(USAGE);
    }
    let ctx = setup(&a.common)?;
    if max_rej.is_some() && ctx.cfg.resolve()?.criteria.is_empty() {
        // a gate that can never fail is a usage error, not a pass
        eprintln!(
            "trmask: --max-reject-rate can never be exceeded: the config has no rejection \
             criterion (give --preset NAME or --config CFG with rollout_rs)"
        );
        return Ok(USAGE);
    }
    let several = a.inputs.len() > 1;
    let mut violations = 0usize;
    for path in &a.inputs {
        let d = analyse_one(
            &ctx,
            (path, several),
            &a.common,
            &mut |b| trmask::analysis::analyze(ctx.engine.as_ref(), b, &ctx.cfg),
            false,
        )?;
        let name = path.display().to_string();
        let batch = &d.input.batch;
        let mut lines = Vec::new();
        let mut passed = Vec::new();
        if let Some(x) = max_lr {
            let lr = output(&d.analysis, "log_ratio")?;
            let mask = batch.mask();
            let worst = (0..lr.len())
                .filter(|&i| mask[i])
                .max_by(|&p, &q| lr[p].abs().total_cmp(&lr[q].abs()).then(q.cmp(&p)));
            let (v, at) = match worst {
                Some(i) => (lr[i].abs(), batch.position(i)),
                None => (0.0, "-".into()),
            };
            if over(v, x) {
                let n = (0..lr.len())
                    .filter(|&i| mask[i] && over(lr[i].abs(), x))
                    .count();
                lines.push(format!(
                    "max |log ratio| {v:.6e} at {at} > {x:.6e} (--max-abs-log-ratio); {n} tokens \
                     over the limit"
                ));
            } else {
                passed.push(format!("max |log ratio| {v:.6e} <= {x:.6e}"));
            }
        }
        if let Some(x) = max_k3 {
            let v = d
                .analysis
                .metrics
                .get("trmask/k3_mean")
                .copied()
                .ok_or_else(|| {
                    trmask::Error::config("--max-mean-k3", "the batch has no k3 statistic")
                })?;
            if over(v, x) {
                lines.push(format!("mean k3 {v:.6e} > {x:.6e} (--max-mean-k3)"));
            } else {
                passed.push(format!("mean k3 {v:.6e} <= {x:.6e}"));
            }
        }
        if let Some(x) = max_rej {
            let c = &d.analysis.corrections;
            let live: Vec<usize> = (0..c.seq_len.len()).filter(|&i| c.seq_len[i] > 0).collect();
            let rejected = live.iter().filter(|&&i| !c.seq_accept[i]).count();
            let v = rejected as f64 / live.len().max(1) as f64;
            if v > x {
                lines.push(format!(
                    "reject rate {v:.6} ({rejected} of {} sequences) > {x} (--max-reject-rate)",
                    live.len()
                ));
            } else {
                passed.push(format!(
                    "reject rate {v:.6} ({rejected} of {}) <= {x}",
                    live.len()
                ));
            }
        }
        for l in &lines {
            say!("violation: {name}: {l}");
        }
        if lines.is_empty() {
            say!("ok: {name}: {}", passed.join("; "));
        }
        violations += lines.len();
    }
    Ok(if violations > 0 { VIOLATION } else { 0 })
}

fn output<'a>(a: &'a trmask::analysis::Analysis, name: &str) -> Result<&'a [f64], trmask::Error> {
    a.outputs
        .iter()
        .find(|o| o.name == name)
        .map(|o| o.data.as_slice())
        .ok_or_else(|| trmask::Error::input(name, "missing from the analysis"))
}

/// `v` exceeds the limit `x`; a NaN always does.
fn over(v: f64, x: f64) -> bool {
    v.is_nan() || v > x
}
