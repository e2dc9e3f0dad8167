//! The `trmask` command line: a thin layer over the library (parse, call, print).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// `println!` that never panics: a closed stdout (`trmask analyze … | head`) ends output quietly.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}
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
        #[arg(allow_negative_numbers = true, long)]
        temperature: Option<f64>,
        /// Write per-token / per-sequence outputs (.safetensors or .json).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Write the metrics as a JSON object.
        #[arg(long)]
        metrics: Option<PathBuf>,
    },
    /// The TRM paper's surrogate-error bounds for a horizon and trust-region sizes (SPEC §8).
    Bounds {
        /// T, the response length (horizon).
        #[arg(long)]
        horizon: usize,
        /// δ, the per-token KL bound.
        #[arg(allow_negative_numbers = true, long)]
        delta: f64,
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
            say!("engine: {}", engine.name());
            say!(
                "sequences: {}  token slots: {}",
                batch.num_seqs(),
                batch.slots()
            );
            let c = &analysis.corrections;
            let accepted = c.seq_accept.iter().filter(|&&a| a).count();
            say!("accepted sequences: {accepted} of {}", c.seq_accept.len());
            for (k, v) in &analysis.metrics {
                say!("{k:<48} {v:.6e}");
            }
            if let Some(cert) = &analysis.certificate {
                say!("{}", cert.summary());
            }
            Ok(())
        }
        Command::Bounds {
            horizon,
            delta,
            eps,
            kl_seq,
            tv_seq,
            json,
        } => {
            let inputs = trmask::bounds::BoundInputs {
                horizon,
                delta,
                eps,
                kl_seq,
                tv_seq,
                dbar: None,
            };
            let b = trmask::bounds::compute(&inputs)?;
            if json {
                let text = serde_json::to_string_pretty(&b)
                    .map_err(|e| trmask::Error::file("<stdout>", e.to_string()))?;
                say!("{text}");
            } else {
                say!("{}", b.table().trim_end());
            }
            Ok(())
        }
        Command::Devices => {
            let adapters = trmask::gpu::list_adapters();
            if adapters.is_empty() {
                say!("no GPU adapter found (WGPU_BACKEND / WGPU_ADAPTER_NAME select one)");
            }
            for a in &adapters {
                say!("adapter: {a}");
            }
            match trmask::GpuEngine::new() {
                Ok(gpu) => say!(
                    "selected: {}\n{}",
                    gpu.name(),
                    gpu.capabilities().describe()
                ),
                Err(e) => say!("selected: none ({e})"),
            }
            say!("cpu: {}", trmask::cpu::CpuEngine::new().name());
            Ok(())
        }
    }
}

/// Vulkan loaders print two error lines per instance when `XDG_RUNTIME_DIR` is unset (headless
/// boxes, CI); give them a private directory before any thread exists.
fn ensure_runtime_dir() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join("trmask-xdg-runtime");
    if std::fs::create_dir_all(&dir).is_ok() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        // SAFETY: single-threaded at this point (first statement of main).
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

fn main() -> ExitCode {
    ensure_runtime_dir();
    let cli = match Cli::try_parse() {
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
