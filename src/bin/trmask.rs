//! The `trmask` command line: a thin layer over the library (parse, call, print).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
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

#[derive(Subcommand)]
enum Command {
    /// Analyse a batch (safetensors or JSON, SPEC §3 names): per-token estimators, exact
    /// divergences from logits, per-sequence reductions, masks, weights and metrics.
    Analyze {
        /// The batch file (.safetensors or .json).
        input: PathBuf,
        /// auto (GPU when an adapter exists), gpu or cpu.
        #[arg(long, default_value = "auto")]
        backend: String,
        /// Correction config (JSON with verl's keys plus trmask's; see `trmask::config`).
        #[arg(long, conflicts_with = "preset")]
        config: Option<PathBuf>,
        /// A verl preset (`decoupled_k3_rs`, …) or paper alias (`trm_max`, `trm_avg`,
        /// `geo_mask`, `seq_mis`).
        #[arg(long)]
        preset: Option<String>,
        /// Softmax temperature applied to both logits tensors (overrides the config's).
        #[arg(long)]
        temperature: Option<f64>,
        /// Write per-token / per-sequence outputs (.safetensors or .json).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Write the metrics as a JSON object.
        #[arg(long)]
        metrics: Option<PathBuf>,
    },
    /// List GPU adapters and the capabilities trmask uses.
    Devices,
}

fn run(cli: Cli) -> Result<(), trmask::Error> {
    match cli.command {
        Command::Analyze {
            input,
            backend,
            config,
            preset,
            temperature,
            output,
            metrics,
        } => {
            let backend: Backend = backend.parse()?;
            let mut cfg = match (&config, &preset) {
                (Some(path), _) => trmask::CorrectionConfig::from_file(path)?,
                (None, Some(name)) => trmask::CorrectionConfig::preset(name)?,
                (None, None) => trmask::CorrectionConfig::default(),
            };
            if let Some(t) = temperature {
                if !(t > 0.0 && t.is_finite()) {
                    return Err(trmask::Error::config(
                        "temperature",
                        format!("must be > 0, got {t}"),
                    ));
                }
                cfg.temperature = t;
            }
            let batch = trmask::io::read_batch(&input)?;
            let mut notes = Vec::new();
            let engine = open_engine(backend, &mut notes)?;
            for n in &notes {
                eprintln!("{n}");
            }
            let analysis = trmask::analysis::analyze(engine.as_ref(), &batch, &cfg)?;
            if let Some(path) = &output {
                trmask::io::write_outputs(path, &analysis.outputs)?;
            }
            if let Some(path) = &metrics {
                trmask::io::write_metrics(path, &analysis.metrics)?;
            }
            println!("engine: {}", engine.name());
            println!(
                "sequences: {}  token slots: {}",
                batch.num_seqs(),
                batch.slots()
            );
            for (k, v) in &analysis.metrics {
                println!("{k:<40} {v:.6e}");
            }
            Ok(())
        }
        Command::Devices => {
            println!("cpu: {}", trmask::cpu::CpuEngine::new().name());
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    std::panic::set_hook(Box::new(|info| eprintln!("trmask: internal error: {info}")));
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("trmask: {e}");
            ExitCode::from(if e.is_user_error() { 2 } else { 1 })
        }
        Err(_) => ExitCode::from(1),
    }
}
