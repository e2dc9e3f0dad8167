//! `trmask compare A B`: two batches (an A/B of a change) compared statistic by statistic.

use crate::paths::{check_outputs, check_report_name};
use crate::{analyse_one, setup, Common};
use std::path::PathBuf;

/// The flags of `trmask compare`.
#[derive(clap::Args)]
pub struct Args {
    /// Batch A (the baseline).
    a: PathBuf,
    /// Batch B (the change).
    b: PathBuf,
    #[command(flatten)]
    pub common: Common,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also write an HTML page with both distributions on one plot per statistic.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<(), trmask::Error> {
    let inputs = [a.a.clone(), a.b.clone()];
    if let Some(o) = &a.output {
        check_report_name(o)?;
    }
    check_outputs(
        &inputs,
        a.common.config.as_deref(),
        &[("--output", a.output.as_deref())],
    )?;
    let ctx = setup(&a.common)?;
    let mut done = Vec::new();
    for path in &inputs {
        done.push(analyse_one(
            &ctx,
            (path, true),
            &a.common,
            &mut |b| trmask::analysis::analyze(ctx.engine.as_ref(), b, &ctx.cfg),
            false,
        )?);
    }
    let c = trmask::compare::compare(&done[0].analysis, &done[1].analysis);
    let (na, nb) = (a.a.display().to_string(), a.b.display().to_string());
    if let Some(o) = &a.output {
        let html = trmask::report::render_compare_html(&c, &na, &nb);
        let mut commit = trmask::io::Commit::new();
        commit.stage(o, html.into_bytes())?;
        commit.finish()?;
    }
    if a.json {
        let text = serde_json::to_string_pretty(&c)
            .map_err(|e| trmask::Error::file("<stdout>", e.to_string()))?;
        say!("{text}");
        return Ok(());
    }
    say!(
        "trmask compare  A = {na}  B = {nb}  (engine: {})",
        ctx.engine_name
    );
    say!(
        "{:<10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9}",
        "statistic",
        "A p10",
        "A p50",
        "A p90",
        "B p10",
        "B p50",
        "B p90",
        "shift",
        "p"
    );
    for s in &c.stats {
        say!(
            "{:<10} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>+11.3e} {:>9.2e}",
            s.statistic,
            s.a.p10,
            s.a.p50,
            s.a.p90,
            s.b.p10,
            s.b.p50,
            s.b.p90,
            s.shift,
            s.p_value
        );
    }
    say!("(per-sequence means; shift = median B - median A; p: two-sided Mann-Whitney)");
    for r in &c.rejected {
        say!(
            "rejected by {}: A {:.2} %, B {:.2} % ({:+.2} points)",
            r.criterion,
            100.0 * r.a,
            100.0 * r.b,
            100.0 * r.delta
        );
    }
    if let Some(r) = &c.routing {
        say!(
            "routing: flipped tokens A {:.3} %, B {:.3} % ({:+.3} points, p = {:.2e} on the \
             per-sequence flip fractions)",
            100.0 * r.a,
            100.0 * r.b,
            100.0 * r.delta,
            r.p_value
        );
    }
    say!("{}", c.verdict);
    if let Some(o) = &a.output {
        say!("wrote {}", o.display());
    }
    Ok(())
}
