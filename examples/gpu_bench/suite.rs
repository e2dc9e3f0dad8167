//! `gpu_bench --suite`: every number one GPU run should give, from the same process — the
//! device's ceilings, the host path, PyTorch CUDA's equivalent (where torch and CUDA exist),
//! the kernel ladder (read floor → softmax floor → each vocabulary-kernel variant the registry
//! lists), a roofline row per variant, accuracy against the f64 reference and the tuner's
//! choices. Data is generated on the device. On CPU adapters (lavapipe), or with `--small`,
//! the ladder and the host path shrink (the output says so).

use crate::kernels::{self, median, Ceiling};
use crate::{time, tolerance_ratio};
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;
use trmask::gpu::pipeline::{all_kernel_keys, Flavour, KernelKey, Op};
use trmask::gpu::{Context, ContextOptions, GpuEngine, VocabVariant, SLICE_LENGTHS};
use trmask::{DType, Engine, Logits, VocabStats};

/// Scalar ops and exponentials per logit pair of the vocabulary kernel, counted in the
/// shader's per-element code on its common path (pass 1's plain loop, pass 2's lean loop,
/// WIDE loads), not measured; the roofline rows say so. Counted: every add, multiply, FMA,
/// compare, select, min / max / abs / sign and bit operation; an `exp` as one exponential plus
/// the multiply by log2(e) GPUs do, an `exp2` as one exponential; loop and address arithmetic
/// not counted. Pass 1: 2 × 5 per element and direction (difference, scale, logit difference,
/// FMA into Σe·d, e·lx) plus 15 per element of per-four work (two rescale tests, the minima,
/// the TwoSum-compensated sums); pass 2: 10 (support test, two scaled differences, d, u) plus
/// 43 in `lean_add` (one `w_pair` series of 12 for w(u) and w(−u), both directions' sums,
/// TV's three sums). Before the exp2 / shared-series rewrite the same count gave 100 (27 +
/// 73), with both series evaluated and each `exp` costing its multiply.
const MATH_OPS_PER_PAIR: f64 = 78.0;
/// exp2 per pair: two in pass 1, two in pass 2 (lean loop).
const EXPS_PER_PAIR: f64 = 4.0;

/// Ops per pair of decoding the two logits, once per read of the row (bf16 / f16: extract,
/// exponent mask, compare, branch, shift per element; f32: mask, compare, branch).
fn decode_ops_per_pair(d: DType) -> f64 {
    match d {
        DType::F32 => 6.0,
        _ => 10.0,
    }
}

/// What the suite runs.
pub struct Options {
    /// Smaller ladder and host path (`--small`, or a CPU adapter).
    pub small: bool,
    /// Why small (for the output), when it is.
    pub small_reason: Option<String>,
    /// Seconds the suite may spend; ladder cells past it are skipped (and listed).
    pub budget_s: f64,
    /// Largest pair of logits (both tensors, bytes) a ladder cell may allocate.
    pub max_bytes: u64,
}

struct Variant {
    asked: String,
    ran: String,
    secs: f64,
    clock: &'static str,
    reads: f64,
    ratio: f64,
}

struct Cell {
    dtype: DType,
    vocab: usize,
    rows: usize,
    bytes: f64,
    floors: Vec<(f64, &'static str)>,
    variants: Vec<Variant>,
    skipped: Option<String>,
}

fn dname(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// Sampled ids that avoid the generator's −inf columns.
fn ids(rows: usize, vocab: usize) -> Vec<i64> {
    (0..rows)
        .map(|r| {
            let i = (r * 7919) % vocab;
            (if i % 4099 == 7 { (i + 1) % vocab } else { i }) as i64
        })
        .collect()
}

/// The vocabulary kernel's variants for `dtype` logits as the registry lists them
/// (`pipeline::all_kernel_keys`): new workgroup sizes, flavours or load paths appear here
/// without a change to the suite.
fn registry_variants(dtype: DType) -> Vec<KernelKey> {
    all_kernel_keys()
        .into_iter()
        .filter(|k| k.op == Op::VocabDivergence(dtype) && k.dtype == dtype)
        .collect()
}

/// Engines forcing a variant's workgroup size and flavour, sharing the suite's device (one per
/// pair, kept across cells so each kernel is built once); the vocabulary kernel's subgroup
/// trees, rows per workgroup and split are part of its configuration, pinned ([`pinned`]).
struct Engines {
    ctx: Arc<Context>,
    by: HashMap<(u32, Flavour, u32, bool), GpuEngine>,
}

/// The configuration a subgroup-flavour key of the vocabulary kernel asks for (`None` for the
/// workgroup flavour: the engine's own choice at the forced workgroup size).
fn pinned(ctx: &Context, key: &KernelKey) -> Option<VocabVariant> {
    (key.flavour == Flavour::Subgroup).then(|| VocabVariant {
        workgroup: key.workgroup,
        slice: if key.split { SLICE_LENGTHS[0] } else { 0 },
        masked_first: !ctx.capabilities().is_cpu(),
        subgroups: true,
        rows: key.rows,
    })
}

impl Engines {
    fn get(&mut self, key: &KernelKey) -> &GpuEngine {
        let ctx = &self.ctx;
        let sg = key.flavour == Flavour::Subgroup;
        let id = (key.workgroup, key.flavour, key.rows, sg && key.split);
        self.by.entry(id).or_insert_with(|| {
            let options = ContextOptions {
                workgroup_size: Some(key.workgroup),
                flavour: Some(key.flavour),
                vocab_kernel: pinned(ctx, key),
                ..Default::default()
            };
            GpuEngine::from_context(Arc::new(Context::from_wgpu_with(
                ctx.device().clone(),
                ctx.queue().clone(),
                &options,
            )))
        })
    }
}

/// One device-resident call timed: the median of up to five calls after a warm-up (fewer
/// past 1.5 s), by timestamp queries where the adapter has them.
fn timed_call(
    g: &GpuEngine,
    (a, b): (&Logits, &Logits),
    ids: &[i64],
    mask: &[bool],
) -> trmask::Result<(f64, &'static str, VocabStats)> {
    let mut stats = g.vocab_divergence(a, b, Some(ids), mask, 1.0)?;
    let (mut dev, mut wall) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while wall.len() < 5 && (wall.is_empty() || start.elapsed().as_secs_f64() < 1.5) {
        let t = Instant::now();
        stats = g.vocab_divergence(a, b, Some(ids), mask, 1.0)?;
        wall.push(t.elapsed().as_secs_f64());
        dev.extend(g.context().last_device_ns().map(|n| n as f64 * 1e-9));
    }
    Ok(if dev.len() == wall.len() {
        (median(dev), "timestamp queries", stats)
    } else {
        (median(wall), "wall", stats)
    })
}

fn cell(
    ctx: &Context,
    engines: &mut Engines,
    cpu: &dyn Engine,
    (dtype, vocab, rows): (DType, usize, usize),
    opts: &Options,
) -> Cell {
    let size = dtype.size() as u64;
    let per = rows as u64 * vocab as u64 * size;
    let mut c = Cell {
        dtype,
        vocab,
        rows,
        bytes: 2.0 * per as f64,
        floors: Vec::new(),
        variants: Vec::new(),
        skipped: None,
    };
    if 2 * per > opts.max_bytes {
        c.skipped = Some(format!(
            "skipped: {:.1} GB of logits, over the suite's memory budget ({:.1} GB, --max-gib)",
            c.bytes / 1e9,
            opts.max_bytes as f64 / 1e9
        ));
        return c;
    }
    let (a, b) = match (
        kernels::try_storage(ctx, per),
        kernels::try_storage(ctx, per),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            c.skipped = Some(format!("skipped: does not fit the adapter: {e}"));
            return c;
        }
    };
    kernels::generate(ctx, &a, (rows, vocab, dtype), 0);
    kernels::generate(ctx, &b, (rows, vocab, dtype), 1);
    let wg = ctx.workgroup_size(Op::VocabDivergence(dtype));
    let reps = if c.bytes < 64e6 { 10 } else { 3 };
    for softmax in [false, true] {
        c.floors.push(kernels::floor(
            ctx,
            (&a, &b),
            (rows, vocab, dtype),
            (wg, softmax),
            reps,
        ));
    }
    let ids = ids(rows, vocab);
    let mut data = Data {
        ctx,
        cpu,
        tensors: (&a, &b),
        shape: (dtype, rows, vocab),
        mask: vec![true; rows],
        check: rows.min(if opts.small { 16 } else { 32 }),
        ids,
        refs: HashMap::new(),
    };
    // what the engine picks by itself (a fresh context: its built kernels are this call's)
    let own = GpuEngine::from_context(Arc::new(Context::from_wgpu_with(
        ctx.device().clone(),
        ctx.queue().clone(),
        &ContextOptions::default(),
    )));
    c.variants.push(
        data.measure(&own, 0, "default (the engine's own choice)".into(), &|_| {
            true
        }),
    );
    let caps = ctx.capabilities();
    for key in registry_variants(dtype) {
        let asked = key.label();
        let unusable = if key.workgroup * key.rows
            > caps
                .max_workgroup_invocations
                .min(caps.max_workgroup_size_x)
        {
            Some("workgroup larger than the adapter allows".to_string())
        } else if let Some(Err(e)) = pinned(ctx, &key).map(|v| v.check_device(caps)) {
            Some(e.to_string())
        } else if key.variant && !vocab.is_multiple_of(8) {
            Some("wide loads need V a multiple of 8".to_string())
        } else {
            None
        };
        if let Some(why) = unusable {
            c.variants
                .push(Variant::failed(asked, format!("skipped: {why}")));
            continue;
        }
        // the narrow load path on rows that could take wide loads: the same buffers bound one
        // element in, so rows are not 16-byte aligned (a sliced tensor's layout)
        let offset = if key.variant { 0 } else { size };
        let g = engines.get(&key);
        let same = |k: &KernelKey| {
            (k.workgroup, k.variant, k.flavour, k.rows)
                == (key.workgroup, key.variant, key.flavour, key.rows)
        };
        c.variants.push(data.measure(g, offset, asked, &same));
    }
    c
}

/// A ladder cell's device logits, sampled ids and f64 references (per binding offset).
struct Data<'a> {
    ctx: &'a Context,
    cpu: &'a dyn Engine,
    tensors: (&'a trmask::wgpu::Buffer, &'a trmask::wgpu::Buffer),
    shape: (DType, usize, usize),
    ids: Vec<i64>,
    mask: Vec<bool>,
    check: usize,
    refs: HashMap<u64, Option<VocabStats>>,
}

impl Data<'_> {
    /// One variant: `g` on the logits bound from byte `offset`, timed, its reads per logit,
    /// the kernels it built that `ran` accepts, the worst tolerance ratio on the first rows.
    fn measure(
        &mut self,
        g: &GpuEngine,
        offset: u64,
        asked: String,
        ran: &dyn Fn(&KernelKey) -> bool,
    ) -> Variant {
        let (dtype, rows, vocab) = self.shape;
        let (a, b) = self.tensors;
        let pair = (
            Logits::device(a.clone(), offset, dtype, rows, vocab),
            Logits::device(b.clone(), offset, dtype, rows, vocab),
        );
        let run = match pair {
            (Ok(la), Ok(lb)) => timed_call(g, (&la, &lb), &self.ids, &self.mask),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let (secs, clock, stats) = match run {
            Ok(r) => r,
            Err(e) => return Variant::failed(asked, format!("error: {e}")),
        };
        let reads = g
            .context()
            .last_vocab_passes()
            .map_or(f64::NAN, |p| p.reads_per_logit());
        let labels: Vec<String> = g
            .context()
            .built_kernels()
            .iter()
            .filter(|k| k.op == Op::VocabDivergence(dtype) && k.dtype == dtype && ran(k))
            .map(KernelKey::label)
            .collect();
        let (ctx, cpu, check) = (self.ctx, self.cpu, self.check);
        let (ids, mask) = (&self.ids[..check], &self.mask[..check]);
        let reference = self.refs.entry(offset).or_insert_with(|| {
            let len = check as u64 * vocab as u64 * dtype.size() as u64;
            let host = |buf| {
                Logits::from_bytes(
                    kernels::read_back(ctx, buf, offset, len),
                    dtype,
                    check,
                    vocab,
                )
            };
            let (ha, hb) = (host(a).ok()?, host(b).ok()?);
            cpu.vocab_divergence(&ha, &hb, Some(ids), mask, 1.0).ok()
        });
        let ratio = reference
            .as_ref()
            .map_or(f64::NAN, |r| tolerance_ratio(&stats, r, mask));
        Variant {
            ran: if labels.is_empty() {
                format!("(not {asked}: the engine chose another kernel)")
            } else {
                labels.join(", ")
            },
            asked,
            secs,
            clock,
            reads,
            ratio,
        }
    }
}

impl Variant {
    fn failed(asked: String, why: String) -> Self {
        Variant {
            asked,
            ran: why,
            secs: f64::NAN,
            clock: "",
            reads: f64::NAN,
            ratio: f64::NAN,
        }
    }
}

fn ms(s: f64) -> String {
    if s.is_nan() {
        "—".into()
    } else {
        format!("{:.3} ms", s * 1e3)
    }
}

/// A variant's name in the tables: the kernel that ran, `default:` for the engine's own choice.
fn shown(v: &Variant) -> String {
    if v.asked.starts_with("default") {
        format!("default: {}", v.ran)
    } else {
        v.ran.clone()
    }
}

fn print_cell(c: &Cell) {
    let name = format!(
        "{} V={} × {} rows ({:.3} GB)",
        dname(c.dtype),
        c.vocab,
        c.rows,
        c.bytes / 1e9
    );
    if let Some(why) = &c.skipped {
        println!("| {name} | {why} | | | | | |");
        return;
    }
    let read = c.floors.first().map_or(f64::NAN, |f| f.0);
    for (i, (t, clock)) in c.floors.iter().enumerate() {
        println!(
            "| {} | {} floor ({clock}) | {} | {:.1} GB/s | {:.1} % | 1.000 | |",
            if i == 0 { name.as_str() } else { "" },
            if i == 0 { "read" } else { "softmax" },
            ms(*t),
            c.bytes / t / 1e9,
            100.0 * read / t
        );
    }
    for v in &c.variants {
        if v.secs.is_nan() {
            println!("| | {} | {} | | | | |", v.asked, v.ran);
            continue;
        }
        println!(
            "| | {} ({}) | {} | {:.1} GB/s | {:.1} % | {:.3} | {:.3} |",
            shown(v),
            v.clock,
            ms(v.secs),
            c.bytes / v.secs / 1e9,
            100.0 * read / v.secs,
            v.reads,
            v.ratio
        );
    }
}

/// The host path: host logits of `sizes` MiB (both tensors, bf16, V = 151,936) through the
/// default engine with the rayon pool at each of `threads`; (MiB, threads, seconds).
fn host_path(gpu: &GpuEngine, sizes: &[u64], threads: &[usize]) -> Vec<(u64, usize, f64)> {
    let ctx = gpu.context();
    let vocab = 151_936usize;
    let mapped = ctx.capabilities().mapped_uploads;
    let chunk_rows = (ctx.host_chunk_bytes() / (vocab as u64 * 2)).max(1);
    println!(
        "\nHost logits ({}; chunks of up to {} MiB per tensor = {chunk_rows} rows of V = {vocab} bf16, filled by the rayon pool's threads), upload included, wall time, median of 3 after a warm-up:\n",
        if mapped {
            "mapped slots written in place: unified memory"
        } else {
            "persistent staging buffers, copied to device slots by the chunk's submission"
        },
        ctx.host_chunk_bytes() >> 20
    );
    println!("| pair of host logits | threads | time / call | logits GB/s |");
    println!("|---|---|---|---|");
    let mut out = Vec::new();
    for &mib in sizes {
        let rows = ((mib << 20) / (2 * vocab as u64 * 2)).max(1) as usize;
        let per = rows as u64 * vocab as u64 * 2;
        let (Ok(da), Ok(db)) = (
            kernels::try_storage(ctx, per),
            kernels::try_storage(ctx, per),
        ) else {
            println!("| {mib} MiB | | does not fit the adapter | |");
            continue;
        };
        kernels::generate(ctx, &da, (rows, vocab, DType::BF16), 0);
        kernels::generate(ctx, &db, (rows, vocab, DType::BF16), 1);
        let ha = Logits::from_bytes(
            kernels::read_back(ctx, &da, 0, per),
            DType::BF16,
            rows,
            vocab,
        );
        let hb = Logits::from_bytes(
            kernels::read_back(ctx, &db, 0, per),
            DType::BF16,
            rows,
            vocab,
        );
        let (Ok(ha), Ok(hb)) = (ha, hb) else { continue };
        let ids = ids(rows, vocab);
        let mask = vec![true; rows];
        // warm-up: kernel build and the slots' first allocation are not the host path
        if let Err(e) = gpu.vocab_divergence(&ha, &hb, Some(&ids), &mask, 1.0) {
            println!("| {mib} MiB ({rows} rows) | | error: {e} | |");
            continue;
        }
        for &t in threads {
            let pool = match rayon::ThreadPoolBuilder::new().num_threads(t).build() {
                Ok(p) => p,
                Err(e) => {
                    println!("| {mib} MiB | {t} | no pool: {e} | |");
                    continue;
                }
            };
            let mut failed = None;
            let secs = pool.install(|| {
                time(3, || {
                    if let Err(e) = gpu.vocab_divergence(&ha, &hb, Some(&ids), &mask, 1.0) {
                        failed = Some(e.to_string());
                    }
                })
            });
            if let Some(e) = failed {
                println!("| {mib} MiB ({rows} rows) | {t} | error: {e} | |");
                continue;
            }
            println!(
                "| {mib} MiB ({rows} rows) | {t} | {} | {:.2} GB/s |",
                ms(secs),
                2.0 * per as f64 / secs / 1e9
            );
            out.push((mib, t, secs));
        }
    }
    out
}

/// PyTorch CUDA on the same shape, by `scripts/torch_suite.py` (`TORCH_SUITE` names another
/// path; `PYTHON` the interpreter): eager and `torch.compile` milliseconds, or why not.
fn torch(rows: usize, vocab: usize, dtype: DType) -> Result<serde_json::Value, String> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("torch_suite.py")));
    let script = std::env::var_os("TORCH_SUITE")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([std::path::PathBuf::from("scripts/torch_suite.py")])
        .chain(exe_dir)
        .find(|p| p.is_file())
        .ok_or("scripts/torch_suite.py not found (run from the repository root)")?;
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = std::process::Command::new(&py)
        .arg(&script)
        .args([
            rows.to_string(),
            vocab.to_string(),
            dname(dtype).to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{py}: {e}"))?;
    // read both pipes on threads (a chatty compiler must not fill a pipe and stall the child)
    let reader = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as _));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as _));
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed().as_secs() > 180 => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("timed out after 180 s".into());
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(100)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| {
            format!(
                "no result ({})",
                stderr.lines().last().unwrap_or("no output").trim()
            )
        })?;
    serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))
}

/// Runs the suite on `gpu` (its device; `cpu` the f64 reference).
pub fn run(gpu: &GpuEngine, cpu: &dyn Engine, opts: &Options) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let ctx = gpu.context().clone();
    let caps = ctx.capabilities().clone();
    println!("# gpu_bench --suite\n");
    println!(
        "adapter: {} ({}, {}, driver {}); subgroups {} {:?}; timestamp queries {}",
        caps.adapter_name,
        caps.backend,
        caps.device_type,
        caps.driver,
        caps.subgroups,
        caps.subgroup_sizes,
        caps.timestamp_query
    );
    println!(
        "cpu: {} rayon threads; time budget {:.0} s; memory budget per ladder cell {:.1} GB",
        rayon::current_num_threads(),
        opts.budget_s,
        opts.max_bytes as f64 / 1e9
    );
    let (vocabs, rows_list, sizes, threads): (&[usize], &[usize], &[u64], &[usize]) = if opts.small
    {
        (&[8192, 32_768], &[16, 64], &[8, 32], &[1, 4])
    } else {
        (
            &[8192, 32_768, 65_536, 151_936, 262_144],
            &[64, 256, 2048, 16_384],
            &[8, 32, 128],
            &[1, 4, 16],
        )
    };
    if let Some(why) = &opts.small_reason {
        println!(
            "scale: SMALL ({why}): ladder V ∈ {vocabs:?} × rows ∈ {rows_list:?}, host path {sizes:?} MiB × {threads:?} threads, smaller ceilings; not the full suite (V ∈ 8k…262k × rows 64…16k)"
        );
    }

    // ---- ceilings ----
    let ceilings: Vec<Ceiling> = kernels::ceilings(&ctx, opts.small);
    println!("\n## Ceilings (this device, this run)\n");
    println!("| ceiling | rate | clock |");
    println!("|---|---|---|");
    for c in &ceilings {
        println!("| {} | {:.2} {} | {} |", c.what, c.rate, c.unit, c.clock);
    }
    let rate = |what: &str| {
        ceilings
            .iter()
            .find(|c| c.what.starts_with(what))
            .map_or(f64::NAN, |c| c.rate)
    };

    println!("\n(ceilings: {:.1} s)", t0.elapsed().as_secs_f64());

    // ---- host path ----
    println!("\n## Host path");
    let host = host_path(gpu, sizes, threads);
    println!("\n(host path done at {:.1} s)", t0.elapsed().as_secs_f64());

    // ---- PyTorch ----
    let (hd, hv, hr) = if opts.small {
        (DType::BF16, 32_768, 64)
    } else {
        (DType::BF16, 151_936, 2048)
    };
    println!("\n## PyTorch CUDA, {hr} × {hv} {} (same run)\n", dname(hd));
    let torch = torch(hr, hv, hd);
    match &torch {
        Ok(v) => println!("{v}"),
        Err(e) => println!("PyTorch CUDA: not available ({e}); no peer row"),
    }
    println!("\n(PyTorch done at {:.1} s)", t0.elapsed().as_secs_f64());

    // ---- ladder ----
    println!("\n## Kernel ladder (device-resident logits generated on the device; `asked` = the registry's variant, the row names the kernel that ran)\n");
    println!("Narrow load-path variants run on the same buffers bound one element in (rows not 16-byte aligned). Accuracy: worst |gpu − f64| / tolerance over the first rows (≤ 1 passes).\n");
    println!(
        "| cell | kernel | time | logits GB/s | of read floor | reads / logit | worst tol. ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut engines = Engines {
        ctx: ctx.clone(),
        by: HashMap::new(),
    };
    let mut cells = Vec::new();
    let reserve = 10.0;
    for &dtype in &[DType::BF16, DType::F16, DType::F32] {
        for &vocab in vocabs {
            for &rows in rows_list {
                let c = if t0.elapsed().as_secs_f64() > opts.budget_s - reserve {
                    Cell {
                        dtype,
                        vocab,
                        rows,
                        bytes: 2.0 * (rows * vocab * dtype.size()) as f64,
                        floors: Vec::new(),
                        variants: Vec::new(),
                        skipped: Some(format!(
                            "skipped: past the time budget ({:.0} s)",
                            opts.budget_s
                        )),
                    }
                } else {
                    cell(&ctx, &mut engines, cpu, (dtype, vocab, rows), opts)
                };
                print_cell(&c);
                cells.push(c);
            }
        }
    }

    // ---- roofline ----
    let head = cells
        .iter()
        .filter(|c| c.skipped.is_none() && c.dtype == hd)
        .max_by_key(|c| (c.vocab == hv && c.rows == hr, c.rows * c.vocab));
    let mut best = None;
    if let Some(c) = head {
        let read = c.floors.first().map_or(f64::NAN, |f| f.0);
        let pairs = (c.rows * c.vocab) as f64;
        println!(
            "\n## Roofline, {} V={} × {} rows (ops and exps per pair are ESTIMATES from a count of the shader's per-element code, not measured)\n",
            dname(c.dtype),
            c.vocab,
            c.rows
        );
        println!("| variant | time | logits GB/s | of read floor ({}) | reads / logit | bytes read | read GB/s | exps / pair (est.) | ops / pair (est.) | exp2-bound time | FMA-rate-bound time |", ms(read));
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        let exp_t = pairs * EXPS_PER_PAIR / (rate("exp_rate") * 1e9);
        for v in c.variants.iter().filter(|v| !v.secs.is_nan()) {
            let bytes_read = c.bytes * v.reads;
            let ops = MATH_OPS_PER_PAIR + v.reads.max(1.0) * decode_ops_per_pair(c.dtype);
            let ops_t = pairs * ops / (rate("fma_rate") * 1e9 / 2.0);
            println!(
                "| {} | {} | {:.1} GB/s | {:.1} % | {:.3} | {:.3} GB | {:.1} GB/s | {EXPS_PER_PAIR} | {ops:.0} | {} | {} |",
                shown(v),
                ms(v.secs),
                c.bytes / v.secs / 1e9,
                100.0 * read / v.secs,
                v.reads,
                bytes_read / 1e9,
                bytes_read / v.secs / 1e9,
                ms(exp_t),
                ms(ops_t)
            );
            if best
                .as_ref()
                .is_none_or(|(t, _): &(f64, String)| v.secs < *t)
            {
                best = Some((v.secs, shown(v)));
            }
        }
        best = best.map(|(t, n)| {
            (
                t,
                format!("{n} on {} V={} × {}", dname(c.dtype), c.vocab, c.rows),
            )
        });
        if c.vocab != hv || c.rows != hr {
            println!("\n(the headline cell {hr} × {hv} did not run; this is the largest {} cell that did)", dname(hd));
        }
        // goals (issue 29) on the headline cell
        println!("\n## Against the goals (headline cell)\n");
        if let Some((t, name)) = &best {
            println!(
                "- fastest variant {name}: {} = {:.1} % of the shader read floor (goal ≥ 50 %)",
                ms(*t),
                100.0 * read / t
            );
            match torch.as_ref().ok().and_then(|v| v["eager_ms"].as_f64()) {
                Some(e) if c.vocab == hv && c.rows == hr => println!(
                    "- PyTorch CUDA eager {e:.3} ms: {:.2}× (goal ≥ 5×)",
                    e * 1e-3 / t
                ),
                _ => println!("- PyTorch CUDA eager: not measured in this run"),
            }
        }
    } else {
        println!("\n(no ladder cell ran: no roofline)");
    }
    match host
        .iter()
        .filter(|h| h.0 == *sizes.last().unwrap_or(&0))
        .min_by(|a, b| a.2.total_cmp(&b.2))
    {
        Some(&(mib, t, secs)) => {
            let rows = ((mib << 20) / (2 * 151_936 * 2)).max(1) as f64;
            println!(
                "- host logits, {mib} MiB pair: best {:.2} GB/s with {t} threads (goal ≥ 30 GB/s on an H200)",
                2.0 * rows * 151_936.0 * 2.0 / secs / 1e9
            );
        }
        None => println!("- host logits: not measured"),
    }

    // ---- accuracy, tuner ----
    let worst = cells
        .iter()
        .flat_map(|c| c.variants.iter().map(move |v| (v.ratio, c, v)))
        .filter(|(r, _, _)| !r.is_nan())
        .max_by(|a, b| a.0.total_cmp(&b.0));
    println!("\n## Accuracy against the f64 reference\n");
    match worst {
        Some((r, c, v)) => println!(
            "worst tolerance ratio {r:.4} ({}: {} V={} × {}) — {}",
            v.ran,
            dname(c.dtype),
            c.vocab,
            c.rows,
            if r <= 1.0 {
                "within the tolerance"
            } else {
                "OUTSIDE the tolerance"
            }
        ),
        None => println!("no variant ran"),
    }
    println!(
        "\n## Tuner\n\nPer ladder cell: every configuration `Context::vocab_variants` lists \
         (threads per row, slice length, pass 1's order, `/sg` subgroup trees, `/rowsN` rows \
         per workgroup), timed by `Context::tune_vocab` on up to 256 device-resident rows of the \
         cell's shape (more for short rows), the tuner's pick, and the engine's own kernel (the \
         `default` rows above):\n"
    );
    for c in cells.iter().filter(|c| c.skipped.is_none()) {
        let default = c
            .variants
            .first()
            .map_or("-".to_string(), |v| v.ran.clone());
        let name = format!("{} V={} × {}", dname(c.dtype), c.vocab, c.rows);
        match ctx.tune_vocab((c.dtype, c.dtype), c.rows as u64, c.vocab as u64) {
            Ok(t) => {
                let each: Vec<String> = t
                    .timings
                    .iter()
                    .map(|(v, s)| format!("{} {:.3} ms", v.label(), s * 1e3))
                    .collect();
                let clock = if t.device_timed {
                    "device time"
                } else {
                    "wall clock"
                };
                println!(
                    "- {name}: picks {} ({clock}: {}); engine default {default}",
                    t.choice.label(),
                    each.join(", ")
                );
            }
            Err(e) => println!("- {name}: tuner failed: {e}"),
        }
    }
    let skipped = cells.iter().filter(|c| c.skipped.is_some()).count();
    println!(
        "\n== suite done in {:.1} s: {} ladder cells run, {skipped} skipped (listed above)",
        t0.elapsed().as_secs_f64(),
        cells.len() - skipped
    );
    Ok(())
}
