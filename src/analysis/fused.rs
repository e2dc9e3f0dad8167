//! `trmask analyze` of a step of host log-probs in the fused CPU pass (`correction::lean` with
//! its table reductions): the inputs read once, in their own dtype, no per-token table; the
//! metrics, sweeps, certificate and [`Findings`] of the full path ([`super::analyze`]) for the
//! configs the pass serves, without per-token outputs.

use super::Analysis;
use crate::bounds::certificate::certificate_finish;
use crate::config::CorrectionConfig;
use crate::correction::plan::Plan;
use crate::correction::step::Step;
use crate::correction::{check_valid_tokens, lean};
use crate::error::Result;
use crate::input::batch::Layout;
use crate::input::values::{MaskOut, Outputs};
use crate::io::{Input, ReadOptions};
use crate::partial::{exchange, SingleProcess};

/// The analysis of `step` (laid out as `layout`) in the fused pass, `None` where the full path
/// must run instead: a config the pass does not serve, a truncated sampler, inputs beyond both
/// policies' log-probs, the mask, advantages and `uid`, or inputs the pass does not vouch for
/// (the full path then words the error). A token criterion's sweep keeps one f64 per valid
/// token (the full path's sweep reads the same values from its table).
pub fn analyze_fused(
    step: &Step<'_>,
    layout: &Layout,
    config: &CorrectionConfig,
) -> Result<Option<Analysis>> {
    fused(step, layout, config, true)
}

/// [`analyze_fused`] without the threshold sweeps (`sweeps` is empty): what the warnings
/// ([`crate::report::warnings`]) read, the metrics and the findings, without the copy of every
/// token's value a token criterion's sweep needs.
///
/// ```
/// use trmask::{analysis::analyze_fused_unswept, CorrectionConfig, Layout, Step};
/// let cfg = CorrectionConfig::from_json_str(r#"{"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}"#)?;
/// let rollout = [-1.0f32, -0.5, -0.2, -2.0];
/// let old = [-1.0f32, -0.5, -0.1, -1.0];
/// let mask = [1.0f32, 1.0, 1.0, 1.0];
/// let step = Step::padded(2, 2).response_mask(&mask[..])
///     .rollout_log_prob(&rollout[..]).old_log_prob(&old[..]);
/// let a = analyze_fused_unswept(&step, &Layout::Padded { batch: 2, seq_len: 2 }, &cfg)?
///     .expect("the fused pass serves it");
/// assert!(a.sweeps.is_empty() && a.findings.valid == 4);
/// assert!(a.metrics.contains_key("trmask/k3_mean"));
/// # Ok::<(), trmask::Error>(())
/// ```
pub fn analyze_fused_unswept(
    step: &Step<'_>,
    layout: &Layout,
    config: &CorrectionConfig,
) -> Result<Option<Analysis>> {
    fused(step, layout, config, false)
}

fn fused(
    step: &Step<'_>,
    layout: &Layout,
    config: &CorrectionConfig,
    swept: bool,
) -> Result<Option<Analysis>> {
    let mut plan = Plan::compile(config)?;
    if !config.sampling.is_off() || config.sampling_replay {
        return Ok(None);
    }
    if swept {
        let Some(columns) = lean::sweep_columns(&plan.cfg) else {
            return Ok(None);
        };
        plan.token_sweeps = columns;
    }
    if !plan.serves_lean() {
        return Ok(None);
    }
    plan.diag = true;
    plan.analyze = true;
    let Some(inp) = step.lean_inputs(config.bypass_mode) else {
        return Ok(None);
    };
    let slots = match layout {
        Layout::Padded { batch, seq_len } => batch * seq_len,
        Layout::Packed { cu_seqlens } => cu_seqlens.last().copied().unwrap_or(0),
    };
    // the pass writes the modified mask (read by nothing here: `analyze` without --output
    // keeps it no longer than the pass) and, given no buffer, no weights
    let mut mask = vec![false; slots];
    let mut out = Outputs {
        weights: None,
        mask: MaskOut::Bool(&mut mask),
    };
    let mut ex = SingleProcess;
    let Some((mut corrections, partial, Some(mut table))) =
        lean::run(&plan, &inp, &mut out, &mut ex)?
    else {
        return Ok(None);
    };
    if table.bad {
        return Ok(None);
    }
    drop(mask);
    let corr_keys = partial.clone();
    let mut partial = partial;
    table.put(&mut partial);
    let merged = exchange(&mut ex, partial)?;
    check_valid_tokens(&merged, layout)?;
    let certificate = certificate_finish(&merged)?;
    let mut metrics = merged.finish()?;
    corrections.metrics = merged.restricted_to(&corr_keys).finish()?;
    if let Some(c) = &certificate {
        metrics.extend(c.metrics());
    }
    let sweeps = match swept {
        true => super::sweep::sweeps(Some(table.token_values()), &plan.cfg, &corrections)?,
        false => Vec::new(),
    };
    let findings = table.findings(["rollout_log_prob", step.lean_train_name()]);
    Ok(Some(Analysis {
        outputs: Vec::new(),
        metrics,
        corrections,
        certificate,
        sweeps,
        findings,
    }))
}

/// [`analyze_fused`] of the file at `path`, read in place ([`crate::io::map_step`]): the input
/// as the summary sees it and its analysis, `None` where the full path must read and analyse it.
pub fn analyze_file_fused(
    path: &std::path::Path,
    opts: &ReadOptions,
    config: &CorrectionConfig,
) -> Result<Option<(Input, Analysis)>> {
    let Some(m) = crate::io::map_step(path, opts)? else {
        return Ok(None);
    };
    let Some((step, layout)) = m.step() else {
        return Ok(None);
    };
    let Some(a) = analyze_fused(&step, &layout, config)? else {
        return Ok(None);
    };
    Ok(crate::io::mapped_input(m).map(|i| (i, a)))
}
