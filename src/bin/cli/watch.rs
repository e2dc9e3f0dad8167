//! `trmask watch PATH --page OUT.html`: follows a run. PATH is a directory where step dumps
//! appear (`step*.safetensors`, prime-rl's `token_exports/step_<N>/`, NeMo-RL's
//! `train_data_step<N>.jsonl`) or a metrics JSON-lines file a trainer appends to (trmask's own
//! `--metrics-jsonl`, verl's `file` logger). Each new step is analysed once, when complete,
//! by the same path as `trmask analyze` (its metrics line appended with the same writer), one
//! line printed, and the trend page re-rendered atomically; a jump prints an `alert:` line and
//! runs `--on-alert`.

use crate::paths::{check_outputs, check_report_name};
use crate::{analyse_one, setup, Common, Ctx};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};
use trmask::trend::{Step, Trend};

#[derive(clap::Args)]
pub struct Args {
    /// A directory where step dumps appear (step*.safetensors, prime-rl token_exports/step_N/,
    /// NeMo-RL train_data_step*.jsonl), or a metrics JSONL a trainer appends to (trmask's
    /// --metrics-jsonl, verl's file logger).
    path: PathBuf,
    /// The trend page, re-rendered atomically after each new step (it reloads itself in a
    /// browser).
    #[arg(long, value_name = "OUT.html")]
    page: PathBuf,
    /// A verl preset or paper alias for the analysis of step dumps.
    #[arg(long, conflicts_with = "config")]
    preset: Option<String>,
    /// A correction config (JSON or YAML) for the analysis of step dumps.
    #[arg(long, value_name = "C.json")]
    config: Option<PathBuf>,
    /// Append each new step's metrics line (the `analyze --metrics-jsonl` format) here.
    #[arg(long, value_name = "OUT.jsonl")]
    metrics_jsonl: Option<PathBuf>,
    /// Process what is there, write the page and exit: 0, or 3 if an alert fired.
    #[arg(long)]
    once: bool,
    /// Seconds between looks at PATH.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    every: f64,
    /// A shell command run (sh -c) for each alert, with TRMASK_ALERT set to the alert line.
    #[arg(long, value_name = "CMD")]
    on_alert: Option<String>,
}

/// What stopped a live watch: the signal number (0: none yet).
static STOP: AtomicI32 = AtomicI32::new(0);

#[cfg(unix)]
extern "C" fn on_stop(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the watch between steps: the final page is written first.
fn install_stop() {
    #[cfg(unix)]
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_stop as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// One step dump found in the watched directory.
#[derive(Clone, Debug)]
struct Found {
    path: PathBuf,
    /// The step its name says (`step12.safetensors`, `step_12/`, `train_data_step12.jsonl`).
    step: Option<f64>,
    /// A prime-rl step directory (complete when it holds `STABLE`).
    prime: bool,
}

/// The digits in a file name (`step-12.safetensors` → 12).
fn digits(name: &str) -> Option<f64> {
    let d: String = name
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    d.parse().ok()
}

/// The step dumps under `root`, whatever their state.
fn scan(root: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && name == "token_exports" {
            out.extend(scan(&path).into_iter().filter(|f| f.prime));
        } else if is_dir {
            if let Some(n) = name
                .strip_prefix("step_")
                .and_then(|n| n.parse::<f64>().ok())
            {
                out.push(Found {
                    path,
                    step: Some(n),
                    prime: true,
                });
            }
        } else if let Some(n) = trmask::io::dumps::nemo_step(&name) {
            out.push(Found {
                path,
                step: Some(n as f64),
                prime: false,
            });
        } else if name.starts_with("step") && name.ends_with(".safetensors") {
            out.push(Found {
                path,
                step: digits(&name),
                prime: false,
            });
        }
    }
    out
}

/// `(size, modified)` of a file, or of a directory's `STABLE` marker.
fn stamp(p: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// The time of day, UTC.
fn clock(t: SystemTime) -> String {
    let s = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

fn pct(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{:.1}%", 100.0 * v))
}

fn sci(x: Option<f64>) -> String {
    match x {
        None => "n/a".into(),
        Some(v) if v != 0.0 && v.is_finite() && !(1e-3..1e4).contains(&v.abs()) => {
            format!("{v:.3e}")
        }
        Some(v) => format!("{v:.4}"),
    }
}

/// The line printed for each new step.
fn step_line(s: &Step, metrics: &std::collections::BTreeMap<String, f64>) -> String {
    let first = |keys: &[&str]| keys.iter().find_map(|k| metrics.get(*k).copied());
    let n = if s.step.fract() == 0.0 && s.step.abs() < 1e15 {
        format!("{}", s.step as i64)
    } else {
        format!("{}", s.step)
    };
    format!(
        "step {n}: k3 mean {}, rejected {} of sequences ({} of tokens), IS max {}",
        sci(first(&["trmask/k3_mean", "rollout_corr/k3_kl"])),
        pct(first(&[
            "trmask/reject_rate",
            "rollout_corr/rollout_rs_seq_masked_fraction"
        ])),
        pct(first(&[
            "trmask/token_reject_rate",
            "rollout_corr/rollout_rs_masked_fraction"
        ])),
        sci(first(&["rollout_corr/rollout_is_max"])),
    )
}

/// The watch's state between looks.
struct Watch<'a> {
    args: &'a Args,
    name: String,
    ctx: Option<Ctx>,
    common: Common,
    trend: Trend,
    /// Directory mode: dumps analysed (or given up on until they change), and the stamp each
    /// pending dump had at the last look.
    done: HashSet<PathBuf>,
    failed: HashMap<PathBuf, Option<(u64, SystemTime)>>,
    pending: HashMap<PathBuf, (u64, SystemTime)>,
    /// File mode: where the next line starts, and its number.
    offset: u64,
    line: u64,
    said_format: bool,
    /// Alerts already raised, by (step, metric).
    alerted: HashSet<(u64, &'static str)>,
    fired: usize,
    /// The latest `warning:` lines, for the page (at most 20).
    warnings: Vec<String>,
    last_change: SystemTime,
}

impl Watch<'_> {
    fn warn(&mut self, w: String) {
        eprintln!("{w}");
        self.warnings.push(w);
        if self.warnings.len() > 20 {
            self.warnings.remove(0);
        }
    }

    /// Adds an analysed or read step: one line printed, the step kept for the trend (the
    /// page's metrics only). Returns its --metrics-jsonl line (empty without the flag).
    fn add(
        &mut self,
        input: &str,
        step: f64,
        mut metrics: std::collections::BTreeMap<String, f64>,
        fresh: &mut HashSet<u64>,
    ) -> Result<Vec<u8>, trmask::Error> {
        let line = match &self.args.metrics_jsonl {
            Some(_) => trmask::io::metrics_line(input, step, &metrics)?,
            None => Vec::new(),
        };
        let s = Step {
            input: input.to_string(),
            step,
            metrics: Default::default(),
        };
        say!("{}", step_line(&s, &metrics));
        metrics.retain(|k, _| trmask::report::trend_key(k));
        self.trend.push(Step { metrics, ..s });
        fresh.insert(step.to_bits());
        self.last_change = SystemTime::now();
        Ok(line)
    }

    /// One look at a directory of step dumps.
    fn look_dir(&mut self, fresh: &mut HashSet<u64>) -> Result<(), trmask::Error> {
        let settle = Duration::from_secs_f64(self.args.every.max(2.0));
        let mut ready = Vec::new();
        for f in scan(&self.args.path) {
            if self.done.contains(&f.path) {
                continue;
            }
            let probe = if f.prime {
                f.path.join("STABLE")
            } else {
                f.path.clone()
            };
            let Some(now) = stamp(&probe) else {
                continue; // a prime-rl step without its STABLE marker yet
            };
            if let Some(old) = self.failed.get(&f.path) {
                if *old == Some(now) {
                    continue; // failed, unchanged since
                }
            }
            // complete: a STABLE marker; a file whose size and time held since the last
            // look, or untouched for a while; anything, under --once
            let settled = f.prime
                || self.args.once
                || self.pending.get(&f.path) == Some(&now)
                || now.1.elapsed().is_ok_and(|e| e >= settle);
            if settled && now.0 > 0 || f.prime {
                ready.push(f);
            } else {
                self.pending.insert(f.path.clone(), now);
            }
        }
        ready.sort_by(|a, b| {
            a.step
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.step.unwrap_or(f64::INFINITY))
                .then(a.path.cmp(&b.path))
        });
        for f in ready {
            self.pending.remove(&f.path);
            let ctx = match &self.ctx {
                Some(c) => c,
                None => self.ctx.insert(setup(&self.common)?),
            };
            let name = f.path.display().to_string();
            let engine = ctx.engine.as_ref();
            let cfg = &ctx.cfg;
            let r = analyse_one(
                ctx,
                (&f.path, true),
                &self.common,
                &mut |b| trmask::analysis::analyze(engine, b, cfg),
                false,
            );
            match r {
                Ok(d) => {
                    self.done.insert(f.path.clone());
                    self.failed.remove(&f.path);
                    let step = d
                        .input
                        .step
                        .or(f.step)
                        .unwrap_or(self.trend.steps().len() as f64);
                    let line = self.add(&name, step, d.analysis.metrics, fresh)?;
                    self.append(line)?;
                }
                Err(e) if e.is_user_error() => {
                    let probe = if f.prime {
                        f.path.join("STABLE")
                    } else {
                        f.path.clone()
                    };
                    self.failed.insert(f.path.clone(), stamp(&probe));
                    self.warn(format!(
                        "warning: {name}: {e}; skipped{}",
                        if self.args.once {
                            ""
                        } else {
                            " (read again when it changes)"
                        }
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One look at a metrics JSON-lines file: the lines appended since the last look.
    fn look_file(&mut self, fresh: &mut HashSet<u64>) -> Result<(), trmask::Error> {
        let path = self.args.path.clone();
        let len = std::fs::metadata(&path)
            .map_err(|e| trmask::Error::io(self.name.clone(), &e))?
            .len();
        if len < self.offset {
            self.warn(format!(
                "warning: {}: shrank from {} to {len} bytes (rewritten by a restarted \
                 writer?); read again from the start",
                self.name, self.offset
            ));
            (self.offset, self.line) = (0, 1);
        }
        // a chunk of lines at a time: one chunk's metrics in memory, whatever the file's size
        loop {
            let mut lines = Vec::new();
            let name = self.name.clone();
            let mut bad = Vec::new();
            let at = self.offset;
            self.offset = trmask::io::read_lines(
                &path,
                (self.offset, self.line),
                self.args.once,
                256,
                &mut |n, l| {
                    let at = format!("{name}: line {n}");
                    match trmask::trend::parse_line(l, &at, &|_| true) {
                        Ok(v) => lines.extend(v),
                        Err(e) => bad.push(format!("warning: {e}; skipped")),
                    }
                    self.line = n + 1;
                    Ok(())
                },
            )?;
            for w in bad {
                self.warn(w);
            }
            let mut appended = Vec::new();
            for (s, format) in lines {
                if !self.said_format {
                    self.said_format = true;
                    eprintln!(
                        "input: {}: {}{}",
                        self.name,
                        format.name(),
                        if format == trmask::trend::LineFormat::VerlFileLogger {
                            " (each line's `data` object read as its metrics)"
                        } else {
                            ""
                        }
                    );
                }
                let input = if s.input.is_empty() {
                    self.name.clone()
                } else {
                    s.input.clone()
                };
                appended.extend(self.add(&input, s.step, s.metrics, fresh)?);
            }
            self.append(appended)?;
            if self.offset == at {
                return Ok(());
            }
        }
    }

    /// Appends metrics lines to --metrics-jsonl (one write and sync for many lines).
    fn append(&self, bytes: Vec<u8>) -> Result<(), trmask::Error> {
        if let (Some(p), false) = (&self.args.metrics_jsonl, bytes.is_empty()) {
            let mut c = trmask::io::Commit::new();
            c.append(p, bytes);
            c.finish()?;
        }
        Ok(())
    }

    /// The alerts of the steps that arrived in this look, printed and handed to --on-alert.
    fn alerts(&mut self, fresh: &HashSet<u64>) {
        for a in self.trend.alerts() {
            if !fresh.contains(&a.step.to_bits())
                || !self.alerted.insert((a.step.to_bits(), a.metric))
            {
                continue;
            }
            let line = a.line();
            say!("{line}");
            self.fired += 1;
            if let Some(cmd) = &self.args.on_alert {
                let st = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(cmd)
                    .env("TRMASK_ALERT", &line)
                    .status();
                match st {
                    Ok(s) if s.success() => {}
                    Ok(s) => self.warn(format!("warning: --on-alert: `{cmd}` exited with {s}")),
                    Err(e) => self.warn(format!("warning: --on-alert: `{cmd}` did not run: {e}")),
                }
            }
        }
    }

    /// Writes the page atomically (a temporary file renamed over it).
    fn page(&mut self, live: bool) -> Result<(), trmask::Error> {
        let mut warnings = self.warnings.clone();
        warnings.extend(self.trend.duplicate_warning(&self.name));
        let status = format!(
            "{} {} {}; {} step{}; last change {}; {}",
            if live { "watching" } else { "watched" },
            self.name,
            if self.args.once {
                "once".to_string()
            } else {
                format!("every {} s", self.args.every)
            },
            self.trend.steps().len(),
            if self.trend.steps().len() == 1 {
                ""
            } else {
                "s"
            },
            clock(self.last_change),
            if live {
                format!("page written {}", clock(SystemTime::now()))
            } else {
                format!("watch ended {}", clock(SystemTime::now()))
            }
        );
        let html = trmask::report::render_trend_page(
            self.trend.steps(),
            &trmask::report::TrendPage {
                name: &self.name,
                warnings: &warnings,
                refresh: live.then(|| self.args.every.clamp(2.0, 60.0).ceil() as u32),
                status: Some(&status),
            },
        );
        let mut c = trmask::io::Commit::new();
        c.stage(&self.args.page, html.into_bytes())?;
        c.finish()
    }
}

pub fn run(args: Args) -> Result<u8, trmask::Error> {
    if !(args.every.is_finite() && args.every > 0.0) {
        return Err(trmask::Error::config(
            "--every",
            format!("{} is not a positive number of seconds", args.every),
        ));
    }
    check_report_name(&args.page)?;
    let mut ins = vec![args.path.clone()];
    if args.path.is_dir() {
        ins.clear();
    }
    check_outputs(
        &ins,
        args.config.as_deref(),
        &[
            ("--page", Some(args.page.as_path())),
            ("--metrics-jsonl", args.metrics_jsonl.as_deref()),
        ],
    )?;
    let name = args.path.display().to_string();
    let meta = std::fs::metadata(&args.path).map_err(|e| trmask::Error::io(name.clone(), &e))?;
    let dir = meta.is_dir();
    if !dir && !meta.is_file() {
        return Err(trmask::Error::file(
            &name,
            "is neither a directory of step dumps nor a metrics JSON-lines file",
        ));
    }
    if !dir && (args.config.is_some() || args.preset.is_some()) {
        return Err(trmask::Error::config(
            if args.config.is_some() {
                "--config"
            } else {
                "--preset"
            },
            "applies to step dumps; a metrics JSON-lines file is drawn as written",
        ));
    }
    let common = Common {
        backend: trmask::backend::Backend::Auto,
        config: args.config.clone(),
        preset: args.preset.clone(),
        temperature: None,
        all_valid: false,
    };
    // the config is checked before the first look, the engine opened at the first step
    if dir {
        match (&args.config, &args.preset) {
            (Some(p), _) => drop(trmask::CorrectionConfig::from_file(p)?),
            (None, Some(n)) => drop(trmask::CorrectionConfig::preset(n)?),
            _ => {}
        }
    }
    let mut w = Watch {
        args: &args,
        name,
        ctx: None,
        common,
        trend: Trend::new(),
        done: HashSet::new(),
        failed: HashMap::new(),
        pending: HashMap::new(),
        offset: 0,
        line: 1,
        said_format: false,
        alerted: HashSet::new(),
        fired: 0,
        warnings: Vec::new(),
        last_change: SystemTime::now(),
    };
    if !args.once {
        install_stop();
    }
    let mut said_dups = 0;
    loop {
        let started = Instant::now();
        let mut fresh = HashSet::new();
        if dir {
            w.look_dir(&mut fresh)?;
        } else {
            w.look_file(&mut fresh)?;
        }
        let dups = w.trend.duplicates().len();
        if dups > said_dups {
            said_dups = dups;
            if let Some(d) = w.trend.duplicate_warning(&w.name) {
                eprintln!("{d}");
            }
        }
        w.alerts(&fresh);
        if args.once {
            w.page(false)?;
            say!(
                "wrote {} ({} steps)",
                args.page.display(),
                w.trend.steps().len()
            );
            return Ok(if w.fired > 0 { 3 } else { 0 });
        }
        // every look rewrites the page (its status line says when it last looked)
        w.page(true)?;
        // sleep in short slices: Ctrl-C ends the watch within a tenth of a second
        let until = started + Duration::from_secs_f64(args.every);
        while Instant::now() < until && STOP.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
        }
        let sig = STOP.load(Ordering::SeqCst);
        if sig != 0 {
            w.page(false)?;
            eprintln!(
                "trmask watch: stopped; {} holds the final page ({} steps)",
                args.page.display(),
                w.trend.steps().len()
            );
            return Ok(128u8.saturating_add(sig as u8));
        }
    }
}
