//! The suite's own WGSL kernels and the wgpu plumbing to run and time them on a trmask
//! [`Context`]'s device: an on-device logits generator, the shader read floor, the online-softmax
//! floor, an L2 re-read, exp2 and FMA rate kernels, an empty kernel (dispatch latency), device
//! buffers and readbacks. Benchmark code only (examples are outside the library's layers).

use std::time::Instant;
use trmask::gpu::Context;
use trmask::{wgpu, DType};

/// Rollout logits ~ scale·N(0,1) (scale 100 on rows ≡ 5 mod 64, else 3; −inf at columns
/// ≡ 7 mod 4099 of rows ≡ 3 mod 16), trainer = rollout + 0.05·N(0,1), from a hash of (row,
/// column): the same close pair on every device, generated where it is used. `DT`: 0 f32,
/// 1 f16, 2 bf16 (rounded to nearest even); V a multiple of 2 for the 16-bit types.
const GEN: &str = r#"
override DT: u32 = 2u;
struct G { words: u32, vocab: u32, row0: u32, which: u32, xdim: u32, seed: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> g: G;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
fn hash(x: u32) -> u32 {
    var h = x;
    h ^= h >> 16u; h *= 0x7feb352du; h ^= h >> 15u; h *= 0x846ca68bu; h ^= h >> 16u;
    return h;
}
fn unif(row: u32, col: u32, k: u32) -> f32 {
    let h = hash(hash(hash(row ^ g.seed) ^ col) + k * 0x9e3779b9u);
    return (f32(h >> 8u) + 0.5) / 16777216.0;
}
fn normal(row: u32, col: u32, k: u32) -> f32 {
    return sqrt(-2.0 * log(unif(row, col, 2u * k))) * cos(6.2831853 * unif(row, col, 2u * k + 1u));
}
fn value(e: u32) -> f32 {
    let row = g.row0 + e / g.vocab;
    let col = e % g.vocab;
    if (row % 16u == 3u && col % 4099u == 7u) { return bitcast<f32>(0xff800000u); }
    let x = select(3.0, 100.0, row % 64u == 5u) * normal(row, col, 0u);
    return select(x, x + 0.05 * normal(row, col, 1u), g.which == 1u);
}
fn bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let w = (wid.y * g.xdim + wid.x) * 256u + t;
    if (w >= g.words) { return; }
    if (DT == 0u) {
        out[w] = bitcast<u32>(value(w));
    } else if (DT == 1u) {
        out[w] = pack2x16float(vec2<f32>(value(2u * w), value(2u * w + 1u)));
    } else {
        out[w] = bf16(value(2u * w)) | (bf16(value(2u * w + 1u)) << 16u);
    }
}
"#;

/// One row per workgroup of `WG` threads, 16-byte loads of both tensors: `MODE` 0 reads and
/// sums every word (the shader read floor); 1 runs both rows' online softmax with one cross sum
/// (running maxima, rescaled Σe^{a−m}, Σe^{b−m}, Σe^{a−m}(a−b): a third of the vocabulary
/// kernel's sums, one read), decoding `DT` (0 f32, 1 f16, 2 bf16).
const FLOOR: &str = r#"
override WG: u32 = 256u;
override MODE: u32 = 0u;
override DT: u32 = 2u;
struct P { rows: u32, quads: u32, xdim: u32, row0: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
fn sum8(w: vec4<u32>) -> f32 {
    let lo = bitcast<vec4<f32>>(w << vec4<u32>(16u));
    let hi = bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u));
    return dot(lo + hi, vec4<f32>(1.0));
}
fn part(w: vec4<u32>, h: u32) -> vec4<f32> {
    if (DT == 0u) { return bitcast<vec4<f32>>(w); }
    if (DT == 1u) {
        let x = unpack2x16float(w.x); let y = unpack2x16float(w.y);
        let z = unpack2x16float(w.z); let v = unpack2x16float(w.w);
        return select(vec4<f32>(x.y, y.y, z.y, v.y), vec4<f32>(x.x, y.x, z.x, v.x), h == 0u);
    }
    return select(bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u)), bitcast<vec4<f32>>(w << vec4<u32>(16u)), h == 0u);
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
        let halves = select(2u, 1u, DT == 0u);
        var ma = -3.0e38;
        var mb = -3.0e38;
        var sa = 0.0;
        var sb = 0.0;
        var sd = 0.0;
        for (var i = t; i < p.quads; i += WG) {
            let wa = a[base + i];
            let wb = b[base + i];
            for (var h = 0u; h < halves; h++) {
                let xa = max(part(wa, h), vec4<f32>(-3.0e38));
                let xb = max(part(wb, h), vec4<f32>(-3.0e38));
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
    o[(p.row0 + row) * WG + t] = s;
}
"#;

/// Rate kernels, `K` iterations per thread: `exp_rate` 8 independent exp2 per iteration,
/// `fma_rate` 16 independent FMAs (32 flops); `empty` does nothing (dispatch latency).
const RATES: &str = r#"
override K: u32 = 256u;
@group(0) @binding(0) var<storage, read_write> o: array<f32>;
fn index(gid: vec3<u32>, n: vec3<u32>) -> u32 { return gid.x + gid.y * n.x * 256u; }
@compute @workgroup_size(256)
fn exp_rate(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = index(gid, n);
    var a = vec4<f32>(f32(i & 255u) * 1e-3, 0.1, 0.2, 0.3);
    var b = a + vec4<f32>(0.05);
    for (var k = 0u; k < K; k++) {
        a = exp2(-a);
        b = exp2(-b);
    }
    o[i] = dot(a + b, vec4<f32>(1.0));
}
@compute @workgroup_size(256)
fn fma_rate(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = index(gid, n);
    var a = vec4<f32>(f32(i & 255u) * 1e-3, 0.1, 0.2, 0.3);
    var b = a + vec4<f32>(0.01);
    var c = a + vec4<f32>(0.02);
    var d = a + vec4<f32>(0.03);
    let m = vec4<f32>(0.999);
    let q = vec4<f32>(0.001);
    for (var k = 0u; k < K; k++) {
        a = fma(a, m, q);
        b = fma(b, m, q);
        c = fma(c, m, q);
        d = fma(d, m, q);
    }
    o[i] = dot(a + b + c + d, vec4<f32>(1.0));
}
@compute @workgroup_size(64)
fn empty() {}
"#;

/// The `DT` override of a dtype.
pub fn dt_code(d: DType) -> f64 {
    match d {
        DType::F32 => 0.0,
        DType::F16 => 1.0,
        DType::BF16 => 2.0,
    }
}

/// Median of a non-empty list.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn pipeline(
    ctx: &Context,
    src: &str,
    entry: &str,
    constants: &[(&str, f64)],
) -> wgpu::ComputePipeline {
    let dev = ctx.device();
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(entry),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: None,
        module: &module,
        entry_point: Some(entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants,
            ..Default::default()
        },
        cache: None,
    })
}

fn uniform(ctx: &Context, words: &[u32]) -> wgpu::Buffer {
    let buf = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("suite params"),
        size: (words.len() * 4) as u64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.queue()
        .write_buffer(&buf, 0, bytemuck::cast_slice(words));
    buf
}

fn storage(ctx: &Context, size: u64) -> wgpu::Buffer {
    ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("suite storage"),
        size: size.max(16).div_ceil(4) * 4,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// A storage buffer of `size` bytes (plus 256 spare, for windows bound one element in), or the
/// device's error (out of memory, over its limits) as a message.
pub fn try_storage(ctx: &Context, size: u64) -> Result<wgpu::Buffer, String> {
    if size + 256 > ctx.device().limits().max_buffer_size {
        return Err(format!(
            "{size} bytes per tensor exceed the adapter's max_buffer_size ({})",
            ctx.device().limits().max_buffer_size
        ));
    }
    ctx.scoped(|| Ok(storage(ctx, size + 256)))
        .map_err(|e| e.to_string())
}

fn bind(
    ctx: &Context,
    p: &wgpu::ComputePipeline,
    entries: &[(&wgpu::Buffer, u64, Option<u64>)],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = entries
        .iter()
        .enumerate()
        .map(|(i, &(buffer, offset, size))| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset,
                size: size.and_then(wgpu::BufferSize::new),
            }),
        })
        .collect();
    ctx.device().create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("suite"),
        layout: &p.get_bind_group_layout(0),
        entries: &entries,
    })
}

/// A 2-D grid of `n` workgroups within 65,535 per dimension.
fn grid(n: u64) -> (u32, u32) {
    let x = n.clamp(1, 65_535);
    (x as u32, n.div_ceil(x).max(1) as u32)
}

/// Seconds of one compute pass recorded by `f` (timestamp queries where the adapter has
/// them, else the wall time of submit + wait), and which clock gave them.
pub fn time_pass(ctx: &Context, f: &dyn Fn(&mut wgpu::ComputePass<'_>)) -> (f64, &'static str) {
    let dev = ctx.device();
    let timed = ctx.capabilities().timestamp_query;
    let set = timed.then(|| {
        dev.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("suite"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("suite"),
            timestamp_writes: set.as_ref().map(|s| wgpu::ComputePassTimestampWrites {
                query_set: s,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            }),
        });
        f(&mut pass);
    }
    let resolve = set.as_ref().map(|s| {
        let r = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("suite ts"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let st = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("suite ts read"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        enc.resolve_query_set(s, 0..2, &r, 0);
        enc.copy_buffer_to_buffer(&r, 0, &st, 0, 16);
        st
    });
    let t = Instant::now();
    ctx.queue().submit([enc.finish()]);
    let _ = dev.poll(wgpu::PollType::wait_indefinitely());
    let wall = t.elapsed().as_secs_f64();
    if let Some(st) = resolve {
        st.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        let _ = dev.poll(wgpu::PollType::wait_indefinitely());
        let ticks = match st.slice(..).get_mapped_range() {
            Ok(view) => {
                let at = |i: usize| {
                    u64::from_le_bytes(view[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]))
                };
                at(1).saturating_sub(at(0))
            }
            Err(_) => 0,
        };
        st.unmap();
        if ticks > 0 {
            return (
                ticks as f64 * f64::from(ctx.queue().get_timestamp_period()) * 1e-9,
                "timestamp queries",
            );
        }
    }
    (wall, "wall")
}

/// Fills `[rows, vocab]` logits of `dtype` (the rollout, `which` 0, or the trainer, 1) into
/// `buf` from byte 0, in windows within the binding limit (V·size a multiple of 256).
pub fn generate(
    ctx: &Context,
    buf: &wgpu::Buffer,
    (rows, vocab, dtype): (usize, usize, DType),
    which: u32,
) {
    let p = pipeline(ctx, GEN, "main", &[("DT", dt_code(dtype))]);
    let row_bytes = (vocab * dtype.size()) as u64;
    let limit = ctx.capabilities().max_binding_bytes.min(1 << 30);
    let per = (limit / row_bytes).max(1) as usize;
    let mut r0 = 0;
    while r0 < rows {
        let n = per.min(rows - r0);
        let words = (n as u64 * row_bytes).div_ceil(4);
        let (x, y) = grid(words.div_ceil(256));
        let u = uniform(
            ctx,
            &[
                words as u32,
                vocab as u32,
                r0 as u32,
                which,
                x,
                0x5eed,
                0,
                0,
            ],
        );
        let g = bind(
            ctx,
            &p,
            &[(&u, 0, None), (buf, r0 as u64 * row_bytes, Some(words * 4))],
        );
        let mut enc = ctx.device().create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&p);
            pass.set_bind_group(0, &g, &[]);
            pass.dispatch_workgroups(x, y, 1);
        }
        ctx.queue().submit([enc.finish()]);
        r0 += n;
    }
    let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
}

/// `len` bytes of `buf` from byte `offset`, copied to the host.
pub fn read_back(ctx: &Context, buf: &wgpu::Buffer, offset: u64, len: u64) -> Vec<u8> {
    let start = offset / 4 * 4;
    let end = (offset + len).div_ceil(4) * 4;
    let st = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("suite read back"),
        size: (end - start).max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx.device().create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buf, start, &st, 0, end - start);
    ctx.queue().submit([enc.finish()]);
    st.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
    // an empty result on a failed map: the caller's `Logits::from_bytes` then refuses it
    let out = match st.slice(..).get_mapped_range() {
        Ok(view) => view[(offset - start) as usize..(offset - start + len) as usize].to_vec(),
        Err(_) => Vec::new(),
    };
    st.unmap();
    out
}

/// The read floor (`softmax` false) or the online-softmax floor over `[rows, vocab]` logits
/// of `dtype` in `a` and `b` (from byte 0), one row per workgroup of `wg` threads: seconds per
/// pass over both tensors (median of three timed passes of `reps` sweeps after a warm-up),
/// and the clock.
pub fn floor(
    ctx: &Context,
    (a, b): (&wgpu::Buffer, &wgpu::Buffer),
    (rows, vocab, dtype): (usize, usize, DType),
    (wg, softmax): (u32, bool),
    reps: usize,
) -> (f64, &'static str) {
    let p = pipeline(
        ctx,
        FLOOR,
        "main",
        &[
            ("WG", f64::from(wg)),
            ("MODE", f64::from(u8::from(softmax))),
            ("DT", dt_code(dtype)),
        ],
    );
    let row_bytes = (vocab * dtype.size()) as u64;
    let limit = ctx.capabilities().max_binding_bytes;
    let per = (limit / row_bytes).max(1) as usize;
    let out = storage(ctx, rows as u64 * u64::from(wg) * 4);
    let mut groups = Vec::new();
    let mut r0 = 0;
    while r0 < rows {
        let n = per.min(rows - r0);
        let (x, y) = grid(n as u64);
        let u = uniform(ctx, &[n as u32, (row_bytes / 16) as u32, x, r0 as u32]);
        let off = r0 as u64 * row_bytes;
        let size = Some(n as u64 * row_bytes);
        let g = bind(
            ctx,
            &p,
            &[
                (&u, 0, None),
                (a, off, size),
                (b, off, size),
                (&out, 0, None),
            ],
        );
        groups.push((g, x, y));
        r0 += n;
    }
    let sweep: &dyn Fn(&mut wgpu::ComputePass<'_>) = &|pass| {
        for _ in 0..reps {
            for (g, x, y) in &groups {
                pass.set_pipeline(&p);
                pass.set_bind_group(0, g, &[]);
                pass.dispatch_workgroups(*x, *y, 1);
            }
        }
    };
    time_pass(ctx, sweep);
    let mut times = Vec::new();
    let mut clock = "wall";
    for _ in 0..3 {
        let (t, c) = time_pass(ctx, sweep);
        times.push(t / reps as f64);
        clock = c;
    }
    (median(times), clock)
}

/// One ceiling: what, the rate and its unit, the clock.
pub struct Ceiling {
    pub what: String,
    pub rate: f64,
    pub unit: &'static str,
    pub clock: &'static str,
}

/// The ceilings measured on this device: shader read floor (`read_bytes` of bf16 pairs, one
/// read), L2 re-read (a buffer of `l2_bytes` read `l2_reps` times), exp2 and FMA rates, the
/// DMA copy (`copy_buffer_to_buffer`, `copy_bytes`), a host upload (`queue.write_buffer`),
/// empty-dispatch and submit latency.
pub fn ceilings(ctx: &Context, small: bool) -> Vec<Ceiling> {
    let mut out = Vec::new();
    let max = ctx.device().limits().max_buffer_size;
    let read_bytes: u64 = (if small { 64u64 << 20 } else { 2 << 30 }).min(max / 4 * 4);
    // the read floor over two buffers of read_bytes / 2, rows of 151,936 bf16
    let vocab = 151_936usize;
    let rows = (read_bytes / 2 / (vocab as u64 * 2)).max(1) as usize;
    let half = rows as u64 * vocab as u64 * 2;
    let (a, b) = (storage(ctx, half), storage(ctx, half));
    generate(ctx, &a, (rows, vocab, DType::BF16), 0);
    generate(ctx, &b, (rows, vocab, DType::BF16), 1);
    for (softmax, what) in [(false, "shader read floor"), (true, "online-softmax floor")] {
        let (t, clock) = floor(ctx, (&a, &b), (rows, vocab, DType::BF16), (256, softmax), 3);
        out.push(Ceiling {
            what: format!(
                "{what} ({rows} x {vocab} bf16 pair, {:.2} GB, one read, 256 threads per row)",
                2.0 * half as f64 / 1e9
            ),
            rate: 2.0 * half as f64 / t / 1e9,
            unit: "GB/s",
            clock,
        });
    }
    // L2 re-read: 8 MiB (1 MiB on CPU adapters) read again and again, as short rows (2,048
    // bf16, one 16-byte load per thread) so that enough workgroups fill the device
    let l2: u64 = if small { 1 << 20 } else { 8 << 20 };
    let l2_vocab = 2048usize;
    let l2_rows = (l2 / 2 / (l2_vocab as u64 * 2)).max(1) as usize;
    let l2_half = l2_rows as u64 * l2_vocab as u64 * 2;
    let l2_reps = if small { 20 } else { 400 };
    let (t, clock) = floor(
        ctx,
        (&a, &b),
        (l2_rows, l2_vocab, DType::BF16),
        (256, false),
        l2_reps,
    );
    out.push(Ceiling {
        what: format!(
            "L2 re-read ({:.1} MiB as {l2_rows} rows of {l2_vocab} bf16 pairs, re-read {l2_reps}x, read-and-sum kernel)",
            2.0 * l2_half as f64 / 1048576.0
        ),
        rate: 2.0 * l2_half as f64 / t / 1e9,
        unit: "GB/s",
        clock,
    });
    drop((a, b));
    // exp2 and FMA rates
    let (threads, k) = if small {
        (256u64 * 64, 256u32)
    } else {
        (256 * 65_535, 1024)
    };
    let o = storage(ctx, threads * 4);
    for (entry, per, unit) in [
        ("exp_rate", 8.0, "G exp2/s"),
        ("fma_rate", 32.0, "GFLOP/s (FMA)"),
    ] {
        let p = pipeline(ctx, RATES, entry, &[("K", f64::from(k))]);
        let g = bind(ctx, &p, &[(&o, 0, None)]);
        let (x, y) = grid(threads / 256);
        let run: &dyn Fn(&mut wgpu::ComputePass<'_>) = &|pass| {
            pass.set_pipeline(&p);
            pass.set_bind_group(0, &g, &[]);
            pass.dispatch_workgroups(x, y, 1);
        };
        time_pass(ctx, run);
        let (t, clock) = (0..3)
            .map(|_| time_pass(ctx, run))
            .fold((f64::MAX, "wall"), |m, r| if r.0 < m.0 { r } else { m });
        out.push(Ceiling {
            what: format!("{entry} ({threads} threads x {k} iterations, vec4 chains)"),
            rate: threads as f64 * f64::from(k) * per / t / 1e9,
            unit,
            clock,
        });
    }
    // DMA copy
    let size: u64 = (if small { 64u64 << 20 } else { 1 << 30 }).min(max / 4 * 4);
    let (src, dst) = (storage(ctx, size), storage(ctx, size));
    let reps = if small { 2 } else { 10 };
    let mut times = Vec::new();
    for round in 0..4 {
        let mut enc = ctx.device().create_command_encoder(&Default::default());
        for _ in 0..reps {
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        let t = Instant::now();
        ctx.queue().submit([enc.finish()]);
        let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
        if round > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    out.push(Ceiling {
        what: format!("DMA copy (copy_buffer_to_buffer, {} MiB x {reps}, bytes read + written; a copy engine, not what a shader can read)", size >> 20),
        rate: 2.0 * size as f64 * reps as f64 / median(times) / 1e9,
        unit: "GB/s",
        clock: "wall",
    });
    // host upload through the queue (one thread's memcpy into wgpu's staging, then DMA)
    let up = vec![7u8; size.min(256 << 20) as usize];
    let mut times = Vec::new();
    for round in 0..3 {
        let t = Instant::now();
        ctx.queue().write_buffer(&src, 0, &up);
        ctx.queue().submit([]);
        let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
        if round > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    out.push(Ceiling {
        what: format!(
            "host upload (queue.write_buffer of {} MiB + submit + wait)",
            up.len() >> 20
        ),
        rate: up.len() as f64 / median(times) / 1e9,
        unit: "GB/s",
        clock: "wall",
    });
    drop((src, dst));
    // empty dispatch and submit latency
    let p = pipeline(ctx, RATES, "empty", &[]);
    let n = if small { 200 } else { 2000 };
    let run: &dyn Fn(&mut wgpu::ComputePass<'_>) = &|pass| {
        pass.set_pipeline(&p);
        for _ in 0..n {
            pass.dispatch_workgroups(1, 1, 1);
        }
    };
    time_pass(ctx, run);
    let (t, clock) = time_pass(ctx, run);
    out.push(Ceiling {
        what: format!("empty dispatch ({n} one-workgroup dispatches in one pass)"),
        rate: t / f64::from(n) * 1e6,
        unit: "µs per dispatch",
        clock,
    });
    let mut times = Vec::new();
    for _ in 0..50 {
        let enc = ctx.device().create_command_encoder(&Default::default());
        let t = Instant::now();
        ctx.queue().submit([enc.finish()]);
        let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
        times.push(t.elapsed().as_secs_f64());
    }
    out.push(Ceiling {
        what: "submit latency (empty command buffer, submit + wait, median of 50)".into(),
        rate: median(times) * 1e6,
        unit: "µs",
        clock: "wall",
    });
    drop(o);
    out
}
