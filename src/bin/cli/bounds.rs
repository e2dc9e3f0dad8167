//! `trmask bounds`: the TRM paper's bounds for given trust-region sizes, or inverted (the
//! largest δ for a target error).

/// The flags of `trmask bounds`.
#[derive(clap::Args)]
pub struct Args {
    /// T, the response length (horizon), at most 2^53.
    #[arg(long, value_parser = parse_horizon)]
    horizon: usize,
    /// δ, the per-token KL bound.
    #[arg(
        allow_negative_numbers = true,
        long,
        required_unless_present = "target_error"
    )]
    delta: Option<f64>,
    /// Invert the bounds: print the largest δ (and ε = √(δ/2) unless --eps is given) whose
    /// unified bound B* is at most this error, with the bound that attains it.
    #[arg(allow_negative_numbers = true, long = "target-error", conflicts_with_all = ["delta", "kl_seq", "tv_seq"])]
    target_error: Option<f64>,
    /// ε, the per-token TV bound (default √(δ/2), Pinsker).
    #[arg(allow_negative_numbers = true, long)]
    eps: Option<f64>,
    /// D_KL^seq, the sequence-level KL (default T·δ).
    #[arg(allow_negative_numbers = true, long = "kl-seq")]
    kl_seq: Option<f64>,
    /// D_TV^seq, the sequence-level TV (default √(D_KL^seq/2)).
    #[arg(allow_negative_numbers = true, long = "tv-seq")]
    tv_seq: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn json_text<T: serde::Serialize>(v: &T) -> Result<String, trmask::Error> {
    serde_json::to_string_pretty(v).map_err(|e| trmask::Error::file("<stdout>", e.to_string()))
}

pub fn run(a: Args) -> Result<(), trmask::Error> {
    if let Some(e) = a.target_error {
        let inv = trmask::bounds_inverse::invert(e, a.horizon, a.eps)?;
        if a.json {
            say!("{}", json_text(&inv)?);
        } else {
            say!("{}", inv.table().trim_end());
        }
        return Ok(());
    }
    let inputs = trmask::bounds::BoundInputs {
        horizon: a.horizon,
        delta: a.delta.unwrap_or_default(),
        eps: a.eps,
        kl_seq: a.kl_seq,
        tv_seq: a.tv_seq,
        dbar: None,
    };
    let b = trmask::bounds::compute(&inputs)?;
    if a.json {
        say!("{}", json_text(&b)?);
    } else {
        say!("{}", b.table().trim_end());
        say!("{}", reading(&b));
    }
    Ok(())
}

/// The table's last line: what B* means for a policy-gradient step (the surrogate's error as a
/// fraction of the reward range, so B* >= 1 says nothing).
fn reading(b: &trmask::bounds::Bounds) -> String {
    let vacuous = !b.unified.is_finite() || b.unified >= 1.0;
    format!(
        "reading: B* = {} (attained by {}) over T = {} tokens is {}{}",
        if (1e-3..1e5).contains(&b.unified.abs()) {
            format!("{:.4}", b.unified)
        } else {
            format!("{:.3e}", b.unified)
        },
        b.argmin,
        b.inputs.horizon,
        trmask::report::bound_reading(b.unified),
        if vacuous {
            " (a smaller delta, see --target-error, or a shorter horizon)"
        } else {
            ""
        }
    )
}

/// `--horizon`: an integer (also written `1e9`) in `[1, 2^53]`; larger is "out of range".
fn parse_horizon(s: &str) -> Result<usize, String> {
    let max = trmask::bounds::MAX_HORIZON;
    let out_of_range = || format!("{s} is out of range (at most 2^53 = {max})");
    if let Ok(v) = s.parse::<u128>() {
        return if v > max as u128 {
            Err(out_of_range())
        } else {
            Ok(v as usize)
        };
    }
    match s.parse::<f64>() {
        Ok(v) if v.fract() == 0.0 && v >= 0.0 && v <= max as f64 => Ok(v as usize),
        Ok(v) if v.fract() == 0.0 && v > max as f64 => Err(out_of_range()),
        _ => Err(format!("{s} is not a non-negative integer")),
    }
}
