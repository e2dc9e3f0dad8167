//! The `trmask` command line: a thin layer over the library (parse, call, print).

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

#[path = "cli/os.rs"]
mod os;
#[path = "cli/paths.rs"]
mod paths;
use paths::{check_output_name, check_outputs, check_report_name};

/// `println!` that never panics: a closed stdout (`trmask analyze … | head`) ends output
/// quietly; any other failed write (`> /dev/full`) makes the exit code 1.
macro_rules! say {
    ($($t:tt)*) => {{
        crate::os::say(format_args!($($t)*));
    }};
}
#[path = "cli/bounds.rs"]
mod bounds;
#[path = "cli/calibrate.rs"]
mod calibrate;
#[path = "cli/check.rs"]
mod check;
#[path = "cli/compare.rs"]
mod compare;
#[path = "cli/devices.rs"]
mod devices;
#[path = "cli/watch.rs"]
mod watch;
use std::process::ExitCode;
use trmask::backend::{open_engine, Backend};
use trmask::Engine;

#[derive(Parser)]
#[command(
    name = "trmask",
    version,
    about = "Trust Region Masking: rollout/trainer mismatch statistics, masks and IS weights"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options shared by `analyze` and `report`.
#[derive(clap::Args)]
struct Common {
    /// auto (a hardware GPU when one exists, else the CPU reference), gpu (any adapter,
    /// software ones too), cpu (the f64 reference) or cpu-fast (the CPU with the vocabulary
    /// divergences in f32, at the GPU's tolerance).
    #[arg(long, default_value = "auto", value_parser = backend_parser())]
    backend: Backend,
    /// Correction config, a file or a pipe: JSON or YAML (.yaml/.yml) with verl's
    /// `rollout_correction` keys (flat, or nested as `algorithm: rollout_correction:`) and
    /// trmask's own (temperature, ln_trm, cppo, token_veto, dppo). With --preset, the
    /// config's keys override the preset's.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A verl preset or paper alias (listed below).
    #[arg(long)]
    preset: Option<String>,
    /// Softmax temperature applied to both logits tensors (overrides the config's).
    #[arg(allow_negative_numbers = true, long)]
    temperature: Option<f64>,
    /// Every slot is a valid token: a [B, T] input without response_mask has no padding, a
    /// 1-D input without cu_seqlens is one sequence.
    #[arg(long)]
    all_valid: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Analyse batches (safetensors or JSON; trmask, verl, TRL, prime-rl, SkyRL or slime
    /// tensor names): per-token estimators, exact divergences from logits, per-sequence
    /// reductions, masks, weights and metrics. Prints a one-screen summary per input.
    Analyze {
        /// The batch files (.safetensors or .json).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        #[command(flatten)]
        common: Common,
        /// Write per-token / per-sequence outputs (.safetensors or .json); one input only.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Write the metrics as a JSON object (`-`: stdout, the summary then goes to stderr);
        /// one input only.
        #[arg(long)]
        metrics: Option<PathBuf>,
        /// Append one JSON line per input: {"input", "step", every metric}. `step` is the
        /// file's metadata key `step`, else the input's position.
        #[arg(long)]
        metrics_jsonl: Option<PathBuf>,
        /// Print every metric after the summary.
        #[arg(long)]
        all_metrics: bool,
        /// `mpi`: one rank of a data-parallel job under `mpirun -np R` (needs a trmask built with
        /// `--features mpi`). Each rank reads INPUT and writes --output with `{rank}` replaced by
        /// its rank; the metrics are the whole batch's and rank 0 writes --metrics.
        #[arg(long, value_enum)]
        distributed: Option<Distributed>,
    },
    /// Render one batch's analysis as a self-contained HTML page (inline SVG, no network), or
    /// with --jsonl a run's trend page from `analyze --metrics-jsonl` output.
    Report {
        /// The batch file (.safetensors or .json).
        #[arg(required_unless_present = "jsonl", conflicts_with = "jsonl")]
        input: Option<PathBuf>,
        /// A `--metrics-jsonl` file of many steps: a trend page (mismatch, rejection rates,
        /// kept tokens, ESS, B* per step; steps whose mismatch jumps marked).
        #[arg(long)]
        jsonl: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
        /// The HTML file to write.
        #[arg(short, long)]
        output: PathBuf,
        /// A Hugging Face tokenizer.json: the worst-tokens table and the strips' tooltips show
        /// each token's text.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
    /// The TRM paper's surrogate-error bounds for a horizon and trust-region sizes, or the
    /// largest trust region for a target error (--target-error).
    Bounds(bounds::Args),
    /// The threshold of one criterion that rejects a target fraction of sequences over several
    /// batches, with its spread across them and the inputs' quantisation noise floor.
    Calibrate(calibrate::Args),
    /// Two batches compared (an A/B of a change): per statistic quantiles, the shift with a
    /// Mann-Whitney p-value, rejected-fraction deltas and a verdict.
    Compare(compare::Args),
    /// A CI gate: exit 3 (one `violation:` line each) when a batch exceeds a mismatch limit.
    Check(check::Args),
    /// Follow a run: analyse each new step dump as it appears (or read each new line of a
    /// metrics JSONL), print one line per step, keep the trend page up to date, and raise an
    /// `alert:` when the mismatch jumps.
    Watch(watch::Args),
    /// List GPU adapters and the capabilities trmask uses.
    Devices,
}

/// `--backend`: parsed into [`Backend`] by clap, so `--help` lists the choices and a bad one is a
/// usage error (exit 2).
pub(crate) fn backend_parser() -> impl clap::builder::TypedValueParser<Value = Backend> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(Backend::NAMES).try_map(|s| s.parse::<Backend>())
}

/// `analyze --distributed`: how the ranks of a data-parallel job exchange their partials.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Distributed {
    /// One rank of an `mpirun` job (a trmask built with `--features mpi`).
    Mpi,
}

struct Ctx {
    cfg: trmask::CorrectionConfig,
    preset: Option<String>,
    engine: Box<dyn Engine>,
    engine_name: String,
    /// The `warning:` lines of a run over several inputs, printed once per kind when the run
    /// ends (after the summaries), naming the inputs each holds for.
    deferred: std::cell::RefCell<Vec<(String, Vec<String>)>>,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        for line in trmask::report::aggregate_warnings(&self.deferred.take()) {
            eprintln!("{line}");
        }
    }
}

fn setup(c: &Common) -> Result<Ctx, trmask::Error> {
    let mut cfg = match (&c.config, &c.preset) {
        (Some(path), Some(name)) => trmask::CorrectionConfig::from_file_over(
            &trmask::CorrectionConfig::preset(name)?,
            path,
        )?,
        (Some(path), None) => trmask::CorrectionConfig::from_file(path)?,
        (None, Some(name)) => trmask::CorrectionConfig::preset(name)?,
        (None, None) => trmask::CorrectionConfig::default(),
    };
    if let Some(t) = c.temperature {
        cfg.set_temperature("--temperature", t)?;
    }
    for w in cfg.warnings() {
        eprintln!("{w}");
    }
    let mut notes = Vec::new();
    let engine = open_engine(c.backend, &mut notes)?;
    for n in &notes {
        eprintln!("{n}");
    }
    Ok(Ctx {
        cfg,
        preset: match (&c.preset, &c.config) {
            (Some(p), Some(cfg)) => Some(format!(
                "{p} overridden by {}",
                cfg.file_name().unwrap_or(cfg.as_os_str()).to_string_lossy()
            )),
            (p, _) => p.clone(),
        },
        engine_name: engine.name(),
        engine,
        deferred: Default::default(),
    })
}

/// A spinner on stderr that appears only after a second of work and only on a terminal.
fn spinner(what: String) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal as _;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
    pb.set_message(what);
    let shown = pb.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        if !shown.is_finished() {
            shown.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            shown.enable_steady_tick(std::time::Duration::from_millis(120));
        }
    });
    Some(pb)
}

struct Done {
    input: trmask::io::Input,
    analysis: trmask::analysis::Analysis,
    /// The `warning:` lines printed for this input (the report shows them too).
    warnings: Vec<String>,
}

/// How a batch is analysed: in this process, or as one rank of a data-parallel job.
type Analyse<'a> =
    dyn FnMut(&trmask::Batch) -> Result<trmask::analysis::Analysis, trmask::Error> + 'a;

/// Reads and analyses one input, printing its notes and `warning:` lines on stderr (when
/// `several` inputs share the run the warnings wait in `ctx.deferred`, one line per kind).
fn analyse_one(
    ctx: &Ctx,
    (path, several): (&Path, bool),
    c: &Common,
    analyse: &mut Analyse,
    fused: bool,
) -> Result<Done, trmask::Error> {
    let pb = spinner(format!("analysing {}", path.display()));
    let opts = trmask::io::ReadOptions {
        all_valid: c.all_valid,
    };
    let result = (|| {
        let note = |i: &trmask::io::Input| i.renames.note().map(|n| eprintln!("{n}"));
        let read = match fused {
            true => trmask::analysis::analyze_file_fused(path, &opts, &ctx.cfg)?,
            false => None,
        };
        let (input, analysis) = match read {
            Some((input, analysis)) => {
                note(&input);
                (input, analysis)
            }
            None => {
                let input = trmask::io::read_input(path, &opts)?;
                note(&input);
                let analysis = analyse(&input.batch)?;
                (input, analysis)
            }
        };
        let warnings = trmask::report::warnings(&trmask::report::WarningInputs {
            batch: &input.batch,
            analysis: &analysis,
            config: &ctx.cfg,
            temperature_flag: c.temperature.is_some(),
        });
        if several {
            ctx.deferred
                .borrow_mut()
                .push((path.display().to_string(), warnings.clone()));
        } else {
            for w in &warnings {
                eprintln!("{w}");
            }
        }
        Ok(Done {
            input,
            analysis,
            warnings,
        })
    })();
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    result
}

fn subject<'a>(
    ctx: &'a Ctx,
    path: &'a str,
    d: &'a Done,
    decode: Option<&'a dyn Fn(i64) -> Option<String>>,
) -> trmask::report::Subject<'a> {
    trmask::report::Subject {
        input: path,
        batch: &d.input.batch,
        sources: &d.input.sources,
        config: &ctx.cfg,
        preset: ctx.preset.as_deref(),
        analysis: &d.analysis,
        engine: &ctx.engine_name,
        warnings: &d.warnings,
        decode,
    }
}

/// The exit code: 0, or a command's own (`check`: 3 on a violated limit).
fn run(cli: Cli) -> Result<u8, trmask::Error> {
    match cli.command {
        Command::Analyze {
            inputs,
            common,
            output,
            metrics,
            metrics_jsonl,
            all_metrics,
            distributed,
        } => {
            if let Some(p) = &output {
                check_output_name(p)?;
            }
            if let Some(kind) = distributed {
                if metrics_jsonl.is_some() {
                    return Err(trmask::Error::config(
                        "--metrics-jsonl",
                        "is not supported with --distributed (use --metrics on rank 0)",
                    ));
                }
                let paths = ranked::Paths {
                    input: &inputs,
                    output: output.as_deref(),
                    metrics: metrics.as_deref(),
                };
                return ranked::analyze(kind, &paths, &common, all_metrics).map(|()| 0);
            }
            if inputs.len() > 1 && (output.is_some() || metrics.is_some()) {
                return Err(trmask::Error::config(
                    "--output/--metrics",
                    "take one input; with several inputs use --metrics-jsonl",
                ));
            }
            check_outputs(
                &inputs,
                common.config.as_deref(),
                &[
                    ("--output", output.as_deref()),
                    ("--metrics", metrics.as_deref()),
                    ("--metrics-jsonl", metrics_jsonl.as_deref()),
                ],
            )?;
            let ctx = setup(&common)?;
            let to_stderr = metrics.as_deref() == Some(Path::new("-"));
            // Every output of the run is staged and made visible only once all are written.
            let mut commit = trmask::io::Commit::new();
            let mut texts = Vec::new();
            for (k, path) in inputs.iter().enumerate() {
                // without per-token outputs a CPU run takes the fused pass where it serves
                let fused = output.is_none() && !ctx.engine.is_gpu();
                let d = analyse_one(
                    &ctx,
                    (path, inputs.len() > 1),
                    &common,
                    &mut |b| trmask::analysis::analyze(ctx.engine.as_ref(), b, &ctx.cfg),
                    fused,
                )?;
                let mut written = Vec::new();
                if let Some(p) = &output {
                    commit.stage(p, trmask::io::outputs_bytes(p, &d.analysis.outputs)?)?;
                    written.push(p.display().to_string());
                }
                if let Some(p) = &metrics {
                    commit.stage(
                        p,
                        trmask::sweep::metrics_bytes(&d.analysis.metrics, &d.analysis.sweeps)?,
                    )?;
                    if !to_stderr {
                        written.push(p.display().to_string());
                    }
                }
                let name = path.display().to_string();
                if let Some(p) = &metrics_jsonl {
                    let step = d.input.step.unwrap_or(k as f64);
                    commit.append(
                        p,
                        trmask::io::metrics_line(&name, step, &d.analysis.metrics)?,
                    );
                    written.push(format!("{} (line {})", p.display(), k + 1));
                }
                let mut text = trmask::report::summary(&subject(&ctx, &name, &d, None), &written);
                if all_metrics {
                    for (key, v) in &d.analysis.metrics {
                        text.push_str(&format!("\n{key:<48} {v:.6e}"));
                    }
                    if let Some(cert) = &d.analysis.certificate {
                        text.push_str(&format!("\n{}", cert.summary()));
                    }
                }
                texts.push(text);
            }
            // The summary goes out with the files, before they are renamed into place: when
            // stdout fails (`> /dev/full`) no output is left committed.
            if to_stderr {
                commit.finish()?;
                for text in &texts {
                    eprintln!("{text}");
                }
            } else {
                commit.print(&texts.join("\n\n"));
                commit.finish()?;
            }
            Ok(0)
        }
        Command::Report {
            input,
            jsonl,
            common,
            output,
            tokenizer,
        } => {
            let input = match (input, jsonl) {
                (_, Some(run)) => {
                    if common.config.is_some()
                        || common.preset.is_some()
                        || common.temperature.is_some()
                        || tokenizer.is_some()
                    {
                        return Err(trmask::Error::config(
                            "--jsonl",
                            "draws the metrics as written; --config, --preset, --temperature and \
                             --tokenizer do not apply",
                        ));
                    }
                    return trend(&run, &output).map(|()| 0);
                }
                (Some(i), None) => i,
                (None, None) => {
                    return Err(trmask::Error::config("report", "needs INPUT or --jsonl"))
                }
            };
            let read: Vec<PathBuf> = std::iter::once(input.clone())
                .chain(tokenizer.clone())
                .collect();
            check_outputs(
                &read,
                common.config.as_deref(),
                &[("--output", Some(output.as_path()))],
            )?;
            check_report_name(&output)?;
            let tok = tokenizer.as_deref().map(tokens::load).transpose()?;
            let ctx = setup(&common)?;
            let d = analyse_one(
                &ctx,
                (&input, false),
                &common,
                &mut |b| trmask::analysis::analyze(ctx.engine.as_ref(), b, &ctx.cfg),
                false,
            )?;
            let name = input.display().to_string();
            let decode = tok.as_ref().map(|t| move |id: i64| tokens::text(t, id));
            let decode_ref = decode.as_ref().map(|f| f as &dyn Fn(i64) -> Option<String>);
            let html = trmask::report::render_html(&subject(&ctx, &name, &d, decode_ref));
            let mut commit = trmask::io::Commit::new();
            commit.stage(&output, html.into_bytes())?;
            commit.print(&format!("wrote {}", output.display()));
            commit.finish()?;
            Ok(0)
        }
        Command::Bounds(args) => bounds::run(args).map(|()| 0),
        Command::Devices => {
            devices::devices();
            Ok(0)
        }
        Command::Check(a) => check::run(a),
        Command::Compare(a) => compare::run(a).map(|()| 0),
        Command::Calibrate(a) => calibrate::run(a).map(|()| 0),
        Command::Watch(a) => watch::run(a),
    }
}

#[path = "cli/ranked.rs"]
mod ranked;
#[path = "cli/tokens.rs"]
mod tokens;

/// `trmask report --jsonl RUN.jsonl -o run.html`: the file read a line at a time (only the
/// metrics the page draws are kept), steps sorted, a repeated step keeping its last line.
fn trend(run: &Path, output: &Path) -> Result<(), trmask::Error> {
    check_outputs(&[run.to_path_buf()], None, &[("--output", Some(output))])?;
    check_report_name(output)?;
    let name = run.display().to_string();
    let mut t = trmask::trend::Trend::new();
    trmask::io::read_lines(run, (0, 1), true, u64::MAX, &mut |n, line| {
        let at = format!("{name}: line {n}");
        for (s, _) in trmask::trend::parse_line(line, &at, &trmask::report::trend_key)? {
            t.push(s);
        }
        Ok(())
    })?;
    if t.steps().is_empty() {
        return Err(trmask::Error::file(&name, "has no metrics line"));
    }
    let warnings: Vec<String> = t.duplicate_warning(&name).into_iter().collect();
    for w in &warnings {
        eprintln!("{w}");
    }
    let html = trmask::report::render_trend_page(
        t.steps(),
        &trmask::report::TrendPage {
            name: &name,
            warnings: &warnings,
            ..Default::default()
        },
    );
    let mut commit = trmask::io::Commit::new();
    commit.stage(output, html.into_bytes())?;
    commit.print(&format!(
        "wrote {} ({} steps)",
        output.display(),
        t.steps().len()
    ));
    commit.finish()?;
    Ok(())
}

fn main() -> ExitCode {
    os::install_signal_handlers();
    let presets = format!(
        "Presets (--preset): {}",
        trmask::CorrectionConfig::preset_names().join(", ")
    );
    let command = <Cli as clap::CommandFactory>::command()
        .mut_subcommand("analyze", |c| c.after_help(presets.clone()))
        .mut_subcommand("report", |c| c.after_help(presets.clone()))
        .mut_subcommand("check", |c| c.after_help(presets.clone()))
        .mut_subcommand("compare", |c| c.after_help(presets.clone()))
        .mut_subcommand("watch", |c| c.after_help(presets.clone()));
    let parsed = command
        .try_get_matches_from(os::glue_negative_numbers(std::env::args_os().collect()))
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print(); // --help, --version
                return ExitCode::SUCCESS;
            }
            // One line, like every other bad-usage message.
            let text = e.to_string();
            let msg: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(|l| l.trim().trim_start_matches("error: "))
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("trmask: {} (see trmask --help)", msg.join(" "));
            return ExitCode::from(2);
        }
    };
    let gpu = match &cli.command {
        Command::Analyze { common, .. } | Command::Report { common, .. } => {
            common.backend.may_use_gpu()
        }
        Command::Check(a) => a.common.backend.may_use_gpu(),
        Command::Compare(a) => a.common.backend.may_use_gpu(),
        Command::Calibrate(a) => a.backend.may_use_gpu(),
        Command::Devices | Command::Watch(_) => true,
        Command::Bounds(_) => false,
    };
    let _runtime = os::runtime_dir(gpu);
    std::panic::set_hook(Box::new(|info| eprintln!("trmask: internal error: {info}")));
    let code = match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(code)) => ExitCode::from(code),
        Ok(Err(e)) => {
            eprintln!("trmask: {e}");
            ExitCode::from(if e.is_user_error() { 2 } else { 1 })
        }
        Err(_) => ExitCode::from(1),
    };
    if let Some(e) = os::stdout_error() {
        eprintln!("trmask: <stdout>: {e}");
        return ExitCode::from(1);
    }
    code
}
