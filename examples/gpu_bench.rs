//! One-shot device benchmark for `scripts/gpu-bench.sh`: everything a lent GPU should measure in
//! one process, printed as BENCHMARKS.md-ready Markdown tables.
//!
//! `cargo run --release --example gpu_bench -- [--quick] [--sequences] [--json]`
//! `cargo run --release --example gpu_bench -- --suite [--small] [--budget-s S] [--max-gib G]`
//! (`--suite`: every number of one GPU run — ceilings, host path, PyTorch CUDA, the kernel
//! ladder, roofline, accuracy, tuner — see `gpu_bench/suite.rs`; smaller on CPU adapters)
//! (`--json`: only one JSON object on stdout, the vocabulary kernel's reads per logit per data
//! set and its worst tolerance ratio against the f64 CPU reference, see [`json_report`])
//! (`GPU_BENCH_FILES=a.safetensors:b.safetensors`: reads per logit of the vocabulary kernel on
//! those batches too; `--sequences`: part 4 only)
//!
//! 1. the adapter's buffer-copy bandwidth (`copy_buffer_to_buffer`, bytes read + written);
//! 2. the vocabulary kernel on device-resident logits (timestamp queries: kernel time only),
//!    bytes of logits read per second and the fraction of the copy bandwidth, checked against
//!    the f64 CPU reference on the first rows at the accuracy tolerance of docs/FORMAT.md; beside it the shader read
//!    floor, a kernel that reads the same logits once in the same row shape and only sums them;
//! 3. the same call on host logits (upload included; mapped uploads and staging copies where
//!    the adapter has both) and on the CPU engine;
//! 4. `analysis::analyze` on 1M tokens of log-probs as 1, 1,000 and 300,000 sequences, both
//!    engines (the per-sequence cost).

#[path = "gpu_bench/kernels.rs"]
mod kernels;
#[path = "gpu_bench/suite.rs"]
mod suite;

use kernels::median;
use rayon::prelude::*;
use std::time::Instant;
use trmask::backend::{open_engine, Backend};
use trmask::gpu::{Context, GpuEngine};
use trmask::{wgpu, Batch, CorrectionConfig, DType, Engine, Logits};

/// xorshift64* normal deviates, seeded per row (reproducible, parallel).
fn normals(seed: u64, n: usize, out: &mut Vec<f64>) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    };
    out.clear();
    while out.len() < n {
        let (u, v) = (next().max(1e-300), next());
        let r = (-2.0 * u.ln()).sqrt();
        out.push(r * (std::f64::consts::TAU * v).cos());
        out.push(r * (std::f64::consts::TAU * v).sin());
    }
    out.truncate(n);
}

/// Rollout logits ~ scale·N(0,1) (a few rows at logit scale 100, a −inf column every 4099th
/// entry of every 16th row), trainer = rollout + 0.05·N(0,1): a close pair as in RL.
fn pair(rows: usize, vocab: usize) -> (Vec<u8>, Vec<u8>) {
    let mut a = vec![0u8; rows * vocab * 2];
    let mut b = vec![0u8; rows * vocab * 2];
    a.par_chunks_mut(vocab * 2)
        .zip(b.par_chunks_mut(vocab * 2))
        .enumerate()
        .for_each(|(r, (ra, rb))| {
            let (mut n1, mut n2) = (Vec::new(), Vec::new());
            normals(2 * r as u64 + 1, vocab, &mut n1);
            normals(2 * r as u64 + 2, vocab, &mut n2);
            let scale = if r % 64 == 5 { 100.0 } else { 3.0 };
            for i in 0..vocab {
                let mut x = scale * n1[i];
                let mut y = x + 0.05 * n2[i];
                if r % 16 == 3 && i % 4099 == 7 {
                    x = f64::NEG_INFINITY;
                    y = f64::NEG_INFINITY;
                }
                let (hx, hy) = (
                    half::bf16::from_f64(x).to_bits(),
                    half::bf16::from_f64(y).to_bits(),
                );
                ra[2 * i..2 * i + 2].copy_from_slice(&hx.to_le_bytes());
                rb[2 * i..2 * i + 2].copy_from_slice(&hy.to_le_bytes());
            }
        });
    (a, b)
}

/// Peaked rows like an RL step's (bf16): a few tokens 15 to 19 nats over 2σ logits (the tail
/// holds a few % of the mass), the rollout truncated to its top-p = 0.9 set (−inf elsewhere),
/// the trainer full and 0.05 apart; the sampled ids inside the kept sets.
fn peaked_pair(rows: usize, vocab: usize) -> (Vec<u8>, Vec<u8>, Vec<i64>) {
    let (mut a, mut b, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    let (mut n1, mut n2) = (Vec::new(), Vec::new());
    for r in 0..rows {
        normals(1000 + 2 * r as u64, vocab, &mut n1);
        normals(1001 + 2 * r as u64, vocab, &mut n2);
        let z: Vec<f64> = (0..vocab)
            .map(|i| {
                let head = (i * 7919 + r) % 20_011 == 0;
                2.0 * n1[i] + if head { 15.0 + n2[i].abs() * 2.0 } else { 0.0 }
            })
            .collect();
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = z.iter().map(|x| (x - m).exp()).sum();
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&i, &j| z[j].total_cmp(&z[i]));
        let mut x = z.clone();
        let mut kept = 0.0;
        for &i in &order {
            if kept >= 0.9 * total {
                x[i] = f64::NEG_INFINITY;
            }
            kept += (z[i] - m).exp();
        }
        ids.push(order[r % 2] as i64);
        for i in 0..vocab {
            let y = z[i] + 0.05 * n2[(i + 1) % vocab];
            a.extend_from_slice(&half::bf16::from_f64(x[i]).to_bits().to_le_bytes());
            b.extend_from_slice(&half::bf16::from_f64(y).to_bits().to_le_bytes());
        }
    }
    (a, b, ids)
}

fn device_buffer(ctx: &Context, bytes: &[u8]) -> wgpu::Buffer {
    let buf = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench logits"),
        size: bytes.len().div_ceil(4) as u64 * 4,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    for (k, c) in bytes.chunks(64 << 20).enumerate() {
        let mut c = c.to_vec();
        c.resize(c.len().div_ceil(4) * 4, 0);
        ctx.queue().write_buffer(&buf, (k as u64) * (64 << 20), &c);
    }
    ctx.queue().submit([]);
    let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
    buf
}

/// Bytes moved per second (read + written) by `reps` back-to-back buffer copies of `size`.
fn copy_bandwidth(ctx: &Context, size: u64, reps: usize) -> f64 {
    let dev = ctx.device();
    let mk = |usage| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("copy bench"),
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let src = mk(wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST);
    let dst = mk(wgpu::BufferUsages::COPY_DST);
    ctx.queue().write_buffer(&src, 0, &vec![7u8; size as usize]);
    let mut times = Vec::new();
    for round in 0..4 {
        let mut enc = dev.create_command_encoder(&Default::default());
        for _ in 0..reps {
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        let t = Instant::now();
        ctx.queue().submit([enc.finish()]);
        let _ = dev.poll(wgpu::PollType::wait_indefinitely());
        if round > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    2.0 * size as f64 * reps as f64 / median(times)
}

/// The shader floors: a kernel that reads every logit of the bf16 pair once (16-byte loads,
/// one row per workgroup of `wg` threads, the vocabulary kernel's row shape) and only sums it
/// (`softmax` false), or computes both rows' online softmax with one cross sum (`softmax`:
/// a third of the vocabulary kernel's sums). Seconds per pass over both tensors (median of
/// three timed rounds of `reps` back-to-back dispatches after a warm-up round); `None` where V
/// is not a multiple of 8.
fn read_floor(
    ctx: &Context,
    (a, b): (&wgpu::Buffer, &wgpu::Buffer),
    (rows, vocab): (usize, usize),
    (wg, softmax): (u32, bool),
    reps: usize,
) -> Option<f64> {
    const FLOOR: &str = r#"
override WG: u32 = 64u;
// 0: read and sum; 1: the online softmax of both rows (running maxima, rescaled Σe^{a−m},
// Σe^{b−m}, Σe^{a−m}(a−b)): a third of the vocabulary kernel's sums, one read
override MODE: u32 = 0u;
struct P { rows: u32, quads: u32, xdim: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
fn sum8(w: vec4<u32>) -> f32 {
    let lo = bitcast<vec4<f32>>(w << vec4<u32>(16u));
    let hi = bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u));
    return dot(lo + hi, vec4<f32>(1.0));
}
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wid.y * p.xdim + wid.x;
    if (row >= p.rows) { return; }
    let base = row * p.quads;
    var s = 0.0;
    if (MODE == 0u) {
        for (var i = t; i < p.quads; i += WG) {
            s += sum8(a[base + i]) - sum8(b[base + i]);
        }
    } else {
        var ma = -3.0e38;
        var mb = -3.0e38;
        var sa = 0.0;
        var sb = 0.0;
        var sd = 0.0;
        for (var i = t; i < p.quads; i += WG) {
            let wa = a[base + i];
            let wb = b[base + i];
            for (var h = 0u; h < 2u; h++) {
                let xa = select(bitcast<vec4<f32>>(wa & vec4<u32>(0xffff0000u)), bitcast<vec4<f32>>(wa << vec4<u32>(16u)), h == 0u);
                let xb = select(bitcast<vec4<f32>>(wb & vec4<u32>(0xffff0000u)), bitcast<vec4<f32>>(wb << vec4<u32>(16u)), h == 0u);
                let na = max(ma, max(max(xa.x, xa.y), max(xa.z, xa.w)));
                let nb = max(mb, max(max(xb.x, xb.y), max(xb.z, xb.w)));
                let ka = exp(ma - na);
                sa *= ka;
                sd *= ka;
                sb *= exp(mb - nb);
                ma = na;
                mb = nb;
                let ea = exp(xa - vec4<f32>(ma));
                sa += dot(ea, vec4<f32>(1.0));
                sb += dot(exp(xb - vec4<f32>(mb)), vec4<f32>(1.0));
                sd += dot(ea, xa - xb);
            }
        }
        s = sa + sb + sd + ma + mb;
    }
    o[row * WG + t] = s;
}
"#;
    if !vocab.is_multiple_of(8) {
        return None;
    }
    let dev = ctx.device();
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("read floor"),
        source: wgpu::ShaderSource::Wgsl(FLOOR.into()),
    });
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("read floor"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &[
                ("WG", f64::from(wg)),
                ("MODE", f64::from(u8::from(softmax))),
            ],
            ..Default::default()
        },
        cache: None,
    });
    let xdim = rows.min(65_535) as u32;
    let ydim = rows.div_ceil(xdim as usize) as u32;
    let params: [u32; 4] = [rows as u32, (vocab / 8) as u32, xdim, 0];
    let uniform = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read floor params"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.queue()
        .write_buffer(&uniform, 0, bytemuck::cast_slice(&params));
    let out = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read floor sums"),
        size: (rows * wg as usize * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("read floor"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: uniform.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: a.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: b.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: out.as_entire_binding(),
            },
        ],
    });
    let mut times = Vec::new();
    for round in 0..4 {
        let mut enc = dev.create_command_encoder(&Default::default());
        for _ in 0..reps {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(xdim, ydim, 1);
        }
        let t = Instant::now();
        ctx.queue().submit([enc.finish()]);
        let _ = dev.poll(wgpu::PollType::wait_indefinitely());
        if round > 0 {
            times.push(t.elapsed().as_secs_f64() / reps as f64);
        }
    }
    Some(median(times))
}

fn gbs(bytes: f64, secs: f64) -> String {
    format!("{:.2} GB/s", bytes / secs / 1e9)
}

/// Median of `reps` timed calls after a warm-up call (the warm-up alone when it took > 2 s).
fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    let t = Instant::now();
    std::hint::black_box(f());
    let first = t.elapsed().as_secs_f64();
    if first > 2.0 {
        return first;
    }
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// The vocabulary kernel's reads of the last call on `ctx`, one line.
fn print_passes(ctx: &Context, what: &str) {
    if let Some(p) = ctx.last_vocab_passes() {
        println!(
            "vocabulary kernel passes on {what}: {} rows, {} on the lean loop, {} with a masked pass 1, {} read a third time: {:.3} reads per logit",
            p.rows,
            p.lean_rows,
            p.masked_pass1_rows,
            p.third_pass_rows,
            p.reads_per_logit()
        );
    }
}

fn scheme(mapped: bool) -> &'static str {
    if mapped {
        "mapped uploads"
    } else {
        "staging copies"
    }
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let gpu = GpuEngine::new()?;
    let ctx = gpu.context().clone();
    let cpu = open_engine(Backend::Cpu, &mut Vec::new())?;
    if std::env::args().any(|a| a == "--sequences") {
        return per_sequence(&gpu, cpu.as_ref(), quick);
    }
    if std::env::args().any(|a| a == "--json") {
        return json_report(&gpu, cpu.as_ref(), quick);
    }
    if std::env::args().any(|a| a == "--suite") {
        return suite::run(&gpu, cpu.as_ref(), &suite_options(&gpu)?);
    }
    println!("adapter: {}", gpu.name());
    println!(
        "cpu engine: {}, {} threads",
        cpu.name(),
        rayon::current_num_threads()
    );

    // ---- 1. copy bandwidth ----
    let max_buf = ctx.device().limits().max_buffer_size;
    let csize = (if quick { 64u64 << 20 } else { 1 << 30 }).min(max_buf / 4 * 4);
    let copy = copy_bandwidth(&ctx, csize, if quick { 2 } else { 10 });
    println!(
        "\n| buffer copy ({} MiB, read + written) | {} |",
        csize >> 20,
        gbs(copy, 1.0)
    );
    println!("|---|---|");

    // ---- 2/3. vocabulary divergence ----
    let vocab = if quick { 32_000 } else { 151_936 };
    let mut rows = if quick { 64 } else { 2048 };
    while (rows * vocab * 2) as u64 > max_buf {
        rows /= 2;
    }
    let t = Instant::now();
    let (a, b) = pair(rows, vocab);
    eprintln!(
        "generated {rows} x {vocab} bf16 pair in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let bytes = (a.len() + b.len()) as f64;
    let responses: Vec<i64> = (0..rows).map(|r| ((r * 7919) % vocab) as i64).collect();
    let responses: Vec<i64> = responses
        .iter()
        .map(|&i| if i % 4099 == 7 { i + 1 } else { i })
        .collect();
    let mask = vec![true; rows];
    let (da, db) = (device_buffer(&ctx, &a), device_buffer(&ctx, &b));
    let la = Logits::device(da.clone(), 0, DType::BF16, rows, vocab)?;
    let lb = Logits::device(db.clone(), 0, DType::BF16, rows, vocab)?;
    let mut dev_ns = Vec::new();
    let mut walls = Vec::new();
    let mut dev_stats = None;
    for k in 0..6 {
        let t = Instant::now();
        let s = gpu.vocab_divergence(&la, &lb, Some(&responses), &mask, 1.0)?;
        if k > 0 {
            walls.push(t.elapsed().as_secs_f64());
            if let Some(ns) = ctx.last_device_ns() {
                dev_ns.push(ns as f64 * 1e-9);
            }
        }
        dev_stats = Some(s);
    }
    let dev_stats = dev_stats.expect("ran");
    println!();
    print_passes(&ctx, "random data");
    // reads per logit on the embedded real samples too (run from the repository root), and on
    // the files listed in GPU_BENCH_FILES (colon-separated)
    let extra = std::env::var("GPU_BENCH_FILES").unwrap_or_default();
    let files = [
        "data/causal-sample/logits.safetensors",
        "data/sample/real-small.safetensors",
    ]
    .into_iter()
    .chain(extra.split(':').filter(|p| !p.is_empty()));
    for path in files {
        let batch = match trmask::io::read_batch(std::path::Path::new(path)) {
            Ok(b) => b,
            Err(e) => {
                println!("(no reads-per-logit row for {path}: {e})");
                continue;
            }
        };
        let (Some(r), Some(o)) = (batch.rollout_logits(), batch.old_logits()) else {
            println!("(no reads-per-logit row for {path}: it has no logits)");
            continue;
        };
        let m = batch.segments().mask();
        gpu.vocab_divergence(r, o, batch.responses(), m, 1.0)?;
        print_passes(&ctx, path);
    }
    // accuracy on the first rows against the f64 reference (same rounded inputs)
    let check = rows.min(if quick { 64 } else { 128 });
    let ha = Logits::from_bytes(a[..check * vocab * 2].to_vec(), DType::BF16, check, vocab)?;
    let hb = Logits::from_bytes(b[..check * vocab * 2].to_vec(), DType::BF16, check, vocab)?;
    let reference =
        cpu.vocab_divergence(&ha, &hb, Some(&responses[..check]), &mask[..check], 1.0)?;
    let mut worst = 0.0f64;
    for r in 0..check {
        for (g, c) in [
            (dev_stats.kl[r], reference.kl[r]),
            (dev_stats.kl_rev[r], reference.kl_rev[r]),
            (dev_stats.tv[r], reference.tv[r]),
            (dev_stats.rollout_entropy[r], reference.rollout_entropy[r]),
            (dev_stats.training_entropy[r], reference.training_entropy[r]),
        ] {
            worst = worst.max((g - c).abs() / (2e-3 * c.abs() + 1e-7));
        }
    }
    println!(
        "\nGPU vs f64 CPU on the first {check} rows: worst |gpu − ref| / (2e-3·|ref| + 1e-7) = {worst:.3} ({})",
        if worst <= 1.0 { "within the tolerance" } else { "OUTSIDE the tolerance" }
    );
    println!(
        "\n| {rows} × {vocab} BF16 pair ({:.2} GB) | time / call | logits read | of copy bandwidth |",
        bytes / 1e9
    );
    println!("|---|---|---|---|");
    let kernel_t = (!dev_ns.is_empty()).then(|| median(dev_ns));
    if let Some(t) = kernel_t {
        println!(
            "| GPU kernel, device-resident (timestamp queries) | {:.3} ms | {} | {:.1} % |",
            t * 1e3,
            gbs(bytes, t),
            100.0 * bytes / t / copy
        );
    }
    let tw = median(walls);
    println!(
        "| GPU call, device-resident (wall) | {:.3} ms | {} | {:.1} % |",
        tw * 1e3,
        gbs(bytes, tw),
        100.0 * bytes / tw / copy
    );
    // The same device-resident call with the row workgroup forced (contexts sharing this
    // device and its buffers): fewer threads per row means more rows in flight per SM where
    // registers or workgroup memory cap the resident workgroups.
    // the size the default context picked, read from the kernel it built for the runs above
    let default_wg = ctx
        .built_kernels()
        .iter()
        .find(|k| k.op == trmask::gpu::pipeline::Op::VocabDivergence(DType::BF16))
        .map_or(0, |k| k.workgroup);
    let floor_reps = if quick { 4 } else { 10 };
    let mut floor_line = None;
    let kernel = kernel_t.unwrap_or(tw);
    let mut floors = Vec::new();
    for (softmax, what) in [
        (
            false,
            "read-and-sum kernel, device-resident (the shader read floor)",
        ),
        (
            true,
            "online-softmax kernel, device-resident (a third of the sums, one read)",
        ),
    ] {
        let dims = (rows, vocab);
        match read_floor(
            &ctx,
            (&da, &db),
            dims,
            (default_wg.max(1), softmax),
            floor_reps,
        ) {
            Some(t) => {
                println!(
                    "| {what} | {:.3} ms | {} | {:.1} % |",
                    t * 1e3,
                    gbs(bytes, t),
                    100.0 * bytes / t / copy
                );
                floors.push(format!(
                    "{:.2}× the {} floor's ({:.3} ms)",
                    kernel / t,
                    if softmax { "softmax" } else { "read" },
                    t * 1e3
                ));
            }
            None => println!("| {what} | (V = {vocab} is not a multiple of 8) | | |"),
        }
    }
    if !floors.is_empty() {
        floor_line = Some(format!(
            "the vocabulary kernel's time ({}: {:.3} ms, {} threads per row) is {}",
            if kernel_t.is_some() {
                "timestamp queries"
            } else {
                "wall"
            },
            kernel * 1e3,
            default_wg.max(1),
            floors.join(" and ")
        ));
    }
    for wg in [32u32, 64, 128, 256] {
        if wg == default_wg || wg > ctx.capabilities().max_workgroup_invocations {
            continue;
        }
        let options = trmask::gpu::ContextOptions {
            workgroup_size: Some(wg),
            ..Default::default()
        };
        let forced = GpuEngine::from_context(std::sync::Arc::new(Context::from_wgpu_with(
            ctx.device().clone(),
            ctx.queue().clone(),
            &options,
        )));
        let mut ns = Vec::new();
        for k in 0..4 {
            match forced.vocab_divergence(&la, &lb, Some(&responses), &mask, 1.0) {
                Ok(_) if k > 0 => ns.extend(forced.context().last_device_ns()),
                Ok(_) => {}
                Err(e) => {
                    println!("| GPU kernel, device-resident, {wg} threads per row | {e} | | |");
                    break;
                }
            }
        }
        if !ns.is_empty() {
            let t = median(ns.iter().map(|&n| n as f64 * 1e-9).collect());
            println!(
                "| GPU kernel, device-resident, {wg} threads per row (default {default_wg}) | {:.3} ms | {} | {:.1} % |",
                t * 1e3,
                gbs(bytes, t),
                100.0 * bytes / t / copy
            );
        }
    }
    let (ha, hb) = (
        Logits::from_bytes(a, DType::BF16, rows, vocab)?,
        Logits::from_bytes(b, DType::BF16, rows, vocab)?,
    );
    let th = time(3, || {
        gpu.vocab_divergence(&ha, &hb, Some(&responses), &mask, 1.0)
            .unwrap()
    });
    let mapped = ctx.capabilities().mapped_uploads;
    println!(
        "| GPU call, host logits (upload included; {}) | {:.1} ms | {} | |",
        scheme(mapped),
        th * 1e3,
        gbs(bytes, th)
    );
    // the other upload scheme on the same adapter, where it exists (mapped uploads need
    // MAPPABLE_PRIMARY_BUFFERS): which one a discrete GPU should use is measured, not assumed
    let other = trmask::gpu::ContextOptions {
        mapped_uploads: Some(!mapped),
        ..Default::default()
    };
    match GpuEngine::with_options(&other) {
        Ok(g2) if g2.capabilities().mapped_uploads != mapped => {
            let t2 = time(3, || {
                g2.vocab_divergence(&ha, &hb, Some(&responses), &mask, 1.0)
                    .unwrap()
            });
            println!(
                "| GPU call, host logits (upload included; {}) | {:.1} ms | {} | |",
                scheme(!mapped),
                t2 * 1e3,
                gbs(bytes, t2)
            );
        }
        Ok(_) => println!("(the adapter offers no mapped uploads: one upload row)"),
        Err(e) => println!("(no second engine for the other upload scheme: {e})"),
    }
    let tc = time(3, || {
        cpu.vocab_divergence(&ha, &hb, Some(&responses), &mask, 1.0)
            .unwrap()
    });
    println!(
        "| CPU f64, {} threads | {:.1} ms | {} | |",
        rayon::current_num_threads(),
        tc * 1e3,
        gbs(bytes, tc)
    );
    if let Some(line) = floor_line {
        println!("\n{line}");
    }

    per_sequence(&gpu, cpu.as_ref(), quick)
}

/// `--suite`'s options from the command line: `--small` (automatic on CPU adapters),
/// `--budget-s S` (default 260), `--max-gib G` (largest pair of logits per ladder cell, default
/// 40 GiB, 1 GiB when small).
fn suite_options(gpu: &GpuEngine) -> anyhow::Result<suite::Options> {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| -> anyhow::Result<Option<f64>> {
        match args.iter().position(|a| a == name) {
            None => Ok(None),
            Some(i) => {
                let v = args.get(i + 1).and_then(|v| v.parse::<f64>().ok());
                match v {
                    Some(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
                    _ => anyhow::bail!("{name} takes a positive number"),
                }
            }
        }
    };
    let small_reason = if args.iter().any(|a| a == "--small") {
        Some("--small".to_string())
    } else if gpu.capabilities().is_cpu() {
        Some(format!(
            "scaled automatically: {} is a CPU adapter",
            gpu.capabilities().adapter_name
        ))
    } else {
        None
    };
    let small = small_reason.is_some();
    let gib = value("--max-gib")?.unwrap_or(if small { 1.0 } else { 40.0 });
    Ok(suite::Options {
        small,
        small_reason,
        budget_s: value("--budget-s")?.unwrap_or(260.0),
        max_bytes: (gib * (1u64 << 30) as f64) as u64,
    })
}

/// Part 4: `analysis::analyze` on 1M tokens of log-probs as 1, 1,000 and 300,000 sequences
/// (65,536 tokens and 30,000 with `--quick`), both engines.
fn per_sequence(gpu: &GpuEngine, cpu: &dyn Engine, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 1 << 16 } else { 1 << 20 };
    let config = CorrectionConfig::default();
    println!("\n| analyze, {n} tokens of log-probs | sequences | GPU | CPU |");
    println!("|---|---|---|---|");
    let mut z = Vec::new();
    normals(99, n, &mut z);
    let roll: Vec<f64> = z.iter().map(|x| -1.0 - x.abs()).collect();
    normals(98, n, &mut z);
    let old: Vec<f64> = roll.iter().zip(&z).map(|(r, e)| r + 0.05 * e).collect();
    for seqs in [1usize, 1000, if quick { 30_000 } else { 300_000 }] {
        let cu: Vec<i64> = (0..=seqs).map(|s| (s * n / seqs) as i64).collect();
        let batch = Batch::packed(&cu)?
            .with_log_probs("rollout_log_prob", roll.clone())?
            .with_log_probs("old_log_prob", old.clone())?
            .build()?;
        let tg = time(3, || {
            trmask::analysis::analyze(gpu, &batch, &config).unwrap()
        });
        let tc = time(3, || {
            trmask::analysis::analyze(cpu, &batch, &config).unwrap()
        });
        println!("| | {seqs} | {:.1} ms | {:.1} ms |", tg * 1e3, tc * 1e3);
    }
    Ok(())
}

/// `(rtol, atol)` of each vocabulary result field against the f64 reference: KL / KL_rev / TV
/// at SPEC's `2e-3·|ref| + 1e-7`, entropies `1e-4·|ref| + 1e-6`, sampled-token log-probs
/// `1e-4·|ref| + 2e-6`.
const FIELD_TOL: [(f64, f64); 7] = [
    (2e-3, 1e-7),
    (2e-3, 1e-7),
    (2e-3, 1e-7),
    (1e-4, 1e-6),
    (1e-4, 1e-6),
    (1e-4, 2e-6),
    (1e-4, 2e-6),
];

/// The worst `|gpu − ref| / (rtol·|ref| + atol)` over every valid row and field (±inf must
/// match exactly, else the ratio is infinite).
fn tolerance_ratio(g: &trmask::VocabStats, r: &trmask::VocabStats, mask: &[bool]) -> f64 {
    let f = |s: &trmask::VocabStats| {
        [
            s.kl.clone(),
            s.kl_rev.clone(),
            s.tv.clone(),
            s.rollout_entropy.clone(),
            s.training_entropy.clone(),
            s.rollout_logp.clone(),
            s.train_logp.clone(),
        ]
    };
    let (gs, rs) = (f(g), f(r));
    let mut worst = 0.0f64;
    for ((gv, rv), (rtol, atol)) in gs.iter().zip(&rs).zip(FIELD_TOL) {
        for ((&a, &b), _) in gv.iter().zip(rv).zip(mask).filter(|(_, &m)| m) {
            let ratio = if a.is_infinite() || b.is_infinite() {
                if a == b {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (a - b).abs() / (rtol * b.abs() + atol)
            };
            worst = worst.max(if ratio.is_nan() { f64::INFINITY } else { ratio });
        }
    }
    worst
}

/// The configuration `--json` pins for its split-row data sets.
const JSON_SPLIT: trmask::gpu::VocabVariant = trmask::gpu::VocabVariant {
    workgroup: 256,
    slice: 4096,
    masked_first: true,
    subgroups: false,
    rows: 1,
};

/// `--json`: the vocabulary kernel on host logits of the random pair (64 × 32,000 with
/// `--quick`, else 256 × 151,936), `data/sample/real-small.safetensors`,
/// `data/causal-sample/logits.safetensors` (run from the repository root), and rows of
/// V = 151,936 split into slices ([`JSON_SPLIT`]): `split-random` (the random pair) and
/// `split-peaked` ([`peaked_pair`]), 8 rows each with `--quick`, else 32: reads per logit of
/// each (`Context::last_vocab_passes`) and the worst tolerance ratio against the f64 CPU
/// engine on the same inputs, as one JSON object on stdout.
fn json_report(gpu: &GpuEngine, cpu: &dyn Engine, quick: bool) -> anyhow::Result<()> {
    let (rows, vocab) = if quick { (64, 32_000) } else { (256, 151_936) };
    let (a, b) = pair(rows, vocab);
    let ids: Vec<i64> = (0..rows).map(|r| ((r * 7919) % vocab) as i64).collect();
    let mut sets = vec![(
        "random".to_string(),
        Logits::from_bytes(a, DType::BF16, rows, vocab)?,
        Logits::from_bytes(b, DType::BF16, rows, vocab)?,
        Some(ids),
        vec![true; rows],
        None,
    )];
    for (name, path) in [
        ("data/sample", "data/sample/real-small.safetensors"),
        (
            "data/causal-sample",
            "data/causal-sample/logits.safetensors",
        ),
    ] {
        let batch = trmask::io::read_batch(std::path::Path::new(path))
            .map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
        let mask = batch.segments().mask().to_vec();
        let (Some(r), Some(o)) = (batch.rollout_logits(), batch.old_logits()) else {
            anyhow::bail!("{path}: no logits");
        };
        let ids = batch.responses().map(<[_]>::to_vec);
        sets.push((name.to_string(), r.clone(), o.clone(), ids, mask, None));
    }
    let (rows, vocab) = (if quick { 8 } else { 32 }, 151_936);
    let (a, b) = pair(rows, vocab);
    let (pa, pb, pids) = peaked_pair(rows, vocab);
    let ids: Vec<i64> = (0..rows).map(|r| ((r * 7919) % vocab) as i64).collect();
    for (name, a, b, ids) in [("split-random", a, b, ids), ("split-peaked", pa, pb, pids)] {
        sets.push((
            name.to_string(),
            Logits::from_bytes(a, DType::BF16, rows, vocab)?,
            Logits::from_bytes(b, DType::BF16, rows, vocab)?,
            Some(ids),
            vec![true; rows],
            Some(JSON_SPLIT),
        ));
    }
    let (mut reads, mut ratios) = (Vec::new(), Vec::new());
    let ctx = gpu.context();
    for (name, r, o, ids, mask, pin) in &sets {
        let g = trmask::gpu::vocab_divergence_with(ctx, r, o, ids.as_deref(), mask, 1.0, *pin)?;
        let p = ctx
            .last_vocab_passes()
            .ok_or_else(|| anyhow::anyhow!("{name}: no pass counts"))?;
        let c = cpu.vocab_divergence(r, o, ids.as_deref(), mask, 1.0)?;
        reads.push(format!("\"{name}\": {:.4}", p.reads_per_logit()));
        ratios.push((name.clone(), tolerance_ratio(&g, &c, mask)));
    }
    let worst = ratios.iter().map(|(_, r)| *r).fold(0.0f64, f64::max);
    let per: Vec<String> = ratios
        .iter()
        .map(|(n, r)| format!("\"{n}\": {r:.4}"))
        .collect();
    println!(
        "{{\"adapter\": \"{}\", \"split_variant\": \"{}\", \"reads_per_logit\": {{{}}}, \"tolerance_ratio\": {{{}}}, \"worst_tolerance_ratio\": {worst:.4}}}",
        gpu.name().replace('"', "'"),
        JSON_SPLIT.label(),
        reads.join(", "),
        per.join(", ")
    );
    Ok(())
}
