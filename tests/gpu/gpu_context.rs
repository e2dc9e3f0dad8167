//! The GPU context: adapter selection, capabilities, error handling (never a panic), device
//! sharing and workgroup sizes. Skips without an adapter unless `TRMASK_REQUIRE_GPU=1`.

use crate::common;

use common::{assert_close, gpu, seed, Rng};
use std::sync::Arc;
use trmask::cpu::CpuEngine;
use trmask::gpu::{list_adapters, pipeline, Context, ContextOptions, GpuEngine};
use trmask::{Engine, Error, Segments};

#[test]
fn capabilities_and_adapters_are_reported() {
    let Some(gpu) = gpu() else { return };
    let caps = gpu.capabilities();
    let text = caps.describe();
    assert!(text.contains(&caps.adapter_name), "{text}");
    assert!(caps.max_binding_bytes <= caps.max_storage_binding.min(caps.max_buffer_size));
    assert!(caps.max_binding_bytes > 0);
    assert!(!list_adapters().is_empty());
    assert_eq!(
        gpu.name(),
        format!("gpu: {} ({})", caps.adapter_name, caps.backend)
    );
    gpu.warm_up().unwrap();
}

/// `auto` takes the default adapter when it is hardware and the CPU reference, without a
/// device, when it is a software rasterizer; and the default adapter is a Vulkan / Metal / DX12
/// one whenever those offer one that is at least as good as GL's (GL only for hardware that
/// has no other backend).
#[test]
fn auto_uses_hardware_adapters_only_and_prefers_primary_backends() {
    let Some(gpu) = gpu() else { return };
    let caps = gpu.capabilities();
    let mut notes = Vec::new();
    let engine = trmask::backend::open_engine(trmask::backend::Backend::Auto, &mut notes).unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    if caps.is_cpu() {
        assert!(!engine.is_gpu(), "{}", engine.name());
        assert!(
            notes[0].contains(&caps.adapter_name) && notes[0].contains("software rasterizer"),
            "{notes:?}"
        );
    } else {
        assert!(engine.is_gpu());
        assert_eq!(engine.name(), gpu.name(), "{notes:?}");
    }
    // what the default choice picks among everything wgpu lists
    let listed = list_adapters();
    let primary_hw = listed
        .iter()
        .any(|a| !a.contains("(Gl,") && !a.contains(", Cpu)"));
    let primary_any = listed.iter().any(|a| !a.contains("(Gl,"));
    let gl_hw = listed
        .iter()
        .any(|a| a.contains("(Gl,") && !a.contains(", Cpu)"));
    if primary_hw || (primary_any && !gl_hw) {
        assert_ne!(caps.backend, "Gl", "{listed:?}");
    }
    if !primary_hw && gl_hw {
        assert_eq!(caps.backend, "Gl", "{listed:?}");
    }
}

#[test]
fn unknown_adapter_name_is_an_error() {
    if gpu().is_none() {
        return;
    }
    let r = GpuEngine::with_options(&ContextOptions {
        adapter_name: Some("no-such-adapter-xyz".into()),
        ..Default::default()
    });
    assert!(matches!(r, Err(Error::NoAdapter(_))), "{r:?}");
}

#[test]
fn bad_wgsl_is_a_shader_compile_error() {
    let Some(gpu) = gpu() else { return };
    let device = gpu.context().device();
    let r = pipeline::compile(device, "broken", "fn main( { let x = ; }");
    match r {
        Err(Error::ShaderCompile { kernel, message }) => {
            assert_eq!(kernel, "broken");
            assert!(!message.is_empty());
        }
        other => panic!("expected ShaderCompile, got {other:?}"),
    }
    // the device still works afterwards
    let s = gpu.token_stats(&[0.0], &[0.5], &[true]).unwrap();
    assert!((s.k3[0] - (0.5f64.exp_m1() - 0.5)).abs() < 1e-6);
}

#[test]
fn shares_a_callers_device() {
    if gpu().is_none() {
        return;
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    let instance = wgpu::Instance::new(desc);
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
            .expect("adapter");
    let (device, queue) =
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))
            .expect("device");
    let engine = GpuEngine::from_context(Arc::new(Context::from_wgpu(device, queue)));
    let roll = [-1.0, -2.0, f64::NAN];
    let train = [-1.5, -1.0, 0.0];
    let mask = [true, true, false];
    let got = engine.token_stats(&roll, &train, &mask).unwrap();
    let want = CpuEngine::new().token_stats(&roll, &train, &mask).unwrap();
    assert_close("k3", &got.k3, &want.k3, 2e-5, 2e-6, 0);
}

#[test]
fn odd_workgroup_sizes_reduce_correctly() {
    if gpu().is_none() {
        return;
    }
    let s = seed(66);
    let mut rng = Rng::new(s);
    let b = 30;
    let mut ranges = Vec::new();
    let mut mask = Vec::new();
    for q in 0..b {
        let len = [0, 1, 2, 7, 63, 64, 65, 191, 193, 600][q % 10];
        let a = mask.len();
        for _ in 0..len {
            mask.push(rng.bool(0.8));
        }
        ranges.push((a, mask.len()));
    }
    let seg = Segments::new(ranges, mask).unwrap();
    let v: Vec<f64> = (0..seg.slots()).map(|_| rng.range(-3.0, 3.0)).collect();
    let w: Vec<f64> = (0..seg.slots()).map(|_| rng.below(4) as f64).collect(); // many ties
    let want = CpuEngine::new().segment_reduce(&[&v, &w], &seg).unwrap();
    for wg in [1u32, 7, 64, 192, 256] {
        let e = GpuEngine::with_options(&ContextOptions {
            workgroup_size: Some(wg),
            ..Default::default()
        })
        .unwrap();
        let got = e.segment_reduce(&[&v, &w], &seg).unwrap();
        for (g, x) in got.iter().zip(&want) {
            assert_eq!(g.count, x.count, "wg {wg}");
            assert_eq!(g.argmax, x.argmax, "wg {wg}");
            assert_eq!(
                g.max,
                x.max.iter().map(|&m| m as f32 as f64).collect::<Vec<_>>()
            );
            assert_close(&format!("sum wg {wg}"), &g.sum, &x.sum, 2e-5, 2e-6, s);
            assert_close(&format!("mean wg {wg}"), &g.mean, &x.mean, 2e-5, 2e-6, s);
        }
    }
}

#[test]
fn limits_too_small_are_errors_not_panics() {
    if gpu().is_none() {
        return;
    }
    let e = GpuEngine::with_options(&ContextOptions {
        max_binding_size: Some(256),
        ..Default::default()
    })
    .unwrap();
    // 100 statistics need 400 bytes per slot: more than one binding holds
    let v = vec![1.0; 4];
    let values: Vec<&[f64]> = (0..100).map(|_| v.as_slice()).collect();
    let seg = Segments::new(vec![(0, 4)], vec![true; 4]).unwrap();
    assert!(e.segment_reduce(&values, &seg).is_err());
    // but a few statistics over many chunks work
    let r = e.segment_reduce(&values[..2], &seg).unwrap();
    assert_eq!(r[1].sum, vec![4.0]);
}

/// More than 65,535 workgroups: the 2-D grid path.
#[test]
fn two_dimensional_grids() {
    if gpu().is_none() {
        return;
    }
    let e = GpuEngine::with_options(&ContextOptions {
        workgroup_size: Some(1),
        ..Default::default()
    })
    .unwrap();
    let n = 70_001;
    let mut rng = Rng::new(seed(77));
    let roll: Vec<f64> = (0..n).map(|_| rng.range(-5.0, 0.0)).collect();
    let train: Vec<f64> = roll.iter().map(|r| r + rng.range(-1.0, 1.0)).collect();
    let mask: Vec<bool> = (0..n).map(|i| i % 3 != 0).collect();
    let cpu = CpuEngine::new();
    let want = cpu.token_stats(&roll, &train, &mask).unwrap();
    let got = e.token_stats(&roll, &train, &mask).unwrap();
    assert_close("k3", &got.k3, &want.k3, 2e-5, 2e-6, 77);
    assert_close("rho", &got.rho, &want.rho, 2e-5, 2e-6, 77);
    let seg = Segments::new((0..n).map(|i| (i, i + 1)).collect(), mask).unwrap();
    let w = cpu.segment_reduce(&[&want.k2], &seg).unwrap();
    let g = e.segment_reduce(&[&want.k2], &seg).unwrap();
    assert_eq!(g[0].count, w[0].count);
    assert_eq!(g[0].argmax, w[0].argmax);
    assert_close("sum", &g[0].sum, &w[0].sum, 2e-5, 2e-6, 77);
}

/// With TIMESTAMP_QUERY (lavapipe has it) every run reports its device time; without it, None.
#[test]
fn device_time_of_a_run() {
    let Some(gpu) = gpu_fresh() else { return };
    let ctx = gpu.context();
    assert_eq!(ctx.last_device_ns(), None, "no run yet");
    let n = 1 << 18;
    let v: Vec<f64> = (0..n).map(|i| (i % 97) as f64 * 0.25).collect();
    let seg = Segments::new(vec![(0, n / 3), (n / 3, n)], vec![true; n]).unwrap();
    let r = gpu.segment_reduce(&[&v, &v], &seg).unwrap();
    assert_eq!(r[0].count, vec![(n / 3) as u32, (n - n / 3) as u32]);
    let ns = ctx.last_device_ns();
    eprintln!(
        "timestamps: {}, device time {ns:?} ns",
        gpu.capabilities().timestamp_query
    );
    if gpu.capabilities().timestamp_query {
        assert!(ns.is_some_and(|t| t > 0), "{ns:?}");
    } else {
        assert_eq!(ns, None);
    }
}

fn gpu_fresh() -> Option<Arc<GpuEngine>> {
    gpu()?;
    Some(Arc::new(GpuEngine::new().unwrap()))
}

/// `ContextOptions::limits` opens a device with WebGPU's default (minimum) limits, and it
/// reports them.
#[test]
fn context_opens_with_webgpu_default_limits() {
    if gpu().is_none() {
        return;
    }
    let e = GpuEngine::with_options(&ContextOptions {
        limits: Some(wgpu::Limits::default()),
        ..Default::default()
    })
    .unwrap();
    let caps = e.capabilities();
    assert_eq!(
        caps.max_workgroup_storage,
        wgpu::Limits::default().max_compute_workgroup_storage_size
    );
    e.warm_up().unwrap();
    let s = e.token_stats(&[-1.0], &[-1.5], &[true]).unwrap();
    assert!(s.k3[0] > 0.0);
}

/// The number of submissions of a whole analysis does not depend on how the tokens are split
/// into sequences (issue 13: no per-sequence round trips), with and without a correction.
#[test]
fn submissions_do_not_grow_with_the_sequence_count() {
    if gpu().is_none() {
        return;
    }
    // an engine of its own: the counter is per context, and other tests share `gpu()`'s
    let engine = GpuEngine::new().expect("adapter");
    let n = 8192usize;
    let mut rng = Rng::new(seed(0x5eed_0031));
    let roll: Vec<f64> = (0..n).map(|_| -0.1 - 3.0 * rng.f64()).collect();
    let old: Vec<f64> = roll.iter().map(|r| r + 0.1 * (rng.f64() - 0.5)).collect();
    for config in [
        trmask::CorrectionConfig::default(),
        trmask::CorrectionConfig::preset("decoupled_k3_rs").unwrap(),
    ] {
        let mut counts = Vec::new();
        for seqs in [1usize, 100, 4000] {
            let cu: Vec<i64> = (0..=seqs).map(|s| (s * n / seqs) as i64).collect();
            let batch = trmask::Batch::packed(&cu)
                .unwrap()
                .with_log_probs("rollout_log_prob", roll.clone())
                .unwrap()
                .with_log_probs("old_log_prob", old.clone())
                .unwrap()
                .build()
                .unwrap();
            let before = engine.context().submissions();
            trmask::analysis::analyze(&engine, &batch, &config).unwrap();
            counts.push(engine.context().submissions() - before);
        }
        assert!(counts[0] > 0, "{counts:?}");
        assert!(
            counts.iter().all(|&c| c == counts[0]),
            "submissions for 1 / 100 / 4000 sequences: {counts:?}"
        );
        println!("submissions per analysis: {counts:?}");
    }
}

#[test]
fn row_kernels_on_cpu_adapters_take_the_smallest_workgroup_whose_loops_fit() {
    let Some(gpu) = gpu() else { return };
    let ctx = gpu.context();
    let caps = gpu.capabilities();
    let op = pipeline::Op::VocabDivergence(trmask::DType::F32);
    let full = ctx.workgroup_size(op);
    let wg = |len: u64, extra: u64| ctx.row_workgroup_size(op, len, 3, extra);
    if caps.device_type != "Cpu" {
        assert_eq!(wg(151_936, 0), full, "GPUs keep the op's workgroup");
        return;
    }
    let floor = caps.subgroup_sizes.0.clamp(8, 64).min(full);
    assert_eq!(wg(64, 0), floor);
    assert_eq!(
        wg(151_936, 0),
        floor,
        "a 152k vocabulary fits the loop limit at {floor}"
    );
    // llvmpipe stops a kernel's loops after 65,535 iterations: 3 · 2^20 / 8 do not fit
    let max = caps.loop_iterations.expect("llvmpipe has a loop limit");
    for len in [1u64 << 20, 1 << 22] {
        let w = wg(len, 0);
        assert!(w.is_power_of_two() && w <= full, "{len}: {w}");
        if w < full {
            assert!(
                3 * len.div_ceil(u64::from(w)) + 1024 <= max,
                "{len}: {w} does not fit"
            );
            assert!(
                3 * len.div_ceil(u64::from(w / 2)) + 1024 > max,
                "{len}: {w} is not the smallest"
            );
        }
    }
    assert!(wg(64, 65_000) > floor, "fixed loop iterations count too");
    // a size set in the options is used as is
    let forced = GpuEngine::with_options(&ContextOptions {
        workgroup_size: Some(64),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(forced.context().row_workgroup_size(op, 64, 3, 0), 64);
}

#[test]
fn segment_kernels_on_cpu_adapters_take_the_floor_workgroup() {
    let Some(gpu) = gpu() else { return };
    let ctx = gpu.context();
    let caps = gpu.capabilities();
    let op = pipeline::Op::SegmentReduce;
    let full = ctx.workgroup_size(op);
    let floor = caps.subgroup_sizes.0.clamp(8, 64).min(full);
    let sizes: Vec<u32> = [1.0, 65.0, 4096.0, f64::NAN]
        .iter()
        .map(|&m| ctx.segment_workgroup_size(op, m))
        .collect();
    if caps.device_type == "Cpu" {
        assert_eq!(sizes, vec![floor; 4]);
    } else {
        assert_eq!(sizes, vec![floor, 128.min(full).max(floor), full, floor]);
    }
}

#[test]
fn staged_slot_writes_take_parts_of_any_length_and_refuse_partial_words() {
    use trmask::gpu::GpuEngine;
    if gpu().is_none() {
        return;
    }
    let staged = GpuEngine::with_options(&ContextOptions {
        mapped_uploads: Some(false),
        ..Default::default()
    })
    .unwrap();
    let ctx = staged.context();
    let slot = ctx.upload_slot(16).unwrap();
    let bytes: Vec<u8> = (1..=12).collect();
    // 3 + 5 + 4 bytes: gathered into one staged write, read back in order
    ctx.write_slot(&slot, &[&bytes[..3], &bytes[3..8], &bytes[8..]])
        .unwrap();
    let back = ctx.run(&[], &[&slot]).unwrap();
    assert_eq!(&back[0][..12], &bytes[..]);
    // a total that is not whole words, or larger than the slot: an error, not a panic
    assert!(ctx.write_slot(&slot, &[&bytes[..3]]).is_err());
    assert!(ctx.write_slot(&slot, &[&vec![0u8; 1 << 20][..]]).is_err());
}

/// On unified-memory adapters kernel outputs are mapped and read in place (no staging copy);
/// with mapped buffers off they go through staging buffers. A whole analysis (vocabulary
/// divergences, token estimators, the fused masks, segment reductions) gives the same bits
/// both ways, with and without a correction.
#[test]
fn mapped_and_staged_readbacks_give_the_same_analysis() {
    let Some(gpu) = gpu() else { return };
    let staged = GpuEngine::with_options(&ContextOptions {
        mapped_uploads: Some(false),
        ..Default::default()
    })
    .unwrap();
    assert!(!staged.capabilities().mapped_uploads);
    if gpu.capabilities().is_cpu() {
        // lavapipe (CI): the default engine reads its outputs in place
        assert!(gpu.capabilities().mapped_uploads);
    }
    let input = trmask::io::read_input(
        std::path::Path::new("data/causal-sample/logits.safetensors"),
        &Default::default(),
    )
    .unwrap();
    let full = input.batch;
    let n = full.segments().slots();
    // 3 tokens per sequence: the one-thread-per-sequence kernels too
    let cu: Vec<i64> = (0..n.div_ceil(3))
        .map(|s| (3 * s) as i64)
        .chain([n as i64])
        .collect();
    let take = |l: Option<&trmask::Logits>| l.cloned().expect("logits in the sample");
    let batch = trmask::Batch::packed(&cu)
        .unwrap()
        .with_logits("rollout_logits", take(full.rollout_logits()))
        .unwrap()
        .with_logits("old_logits", take(full.old_logits()))
        .unwrap()
        .with_responses(full.responses().unwrap().to_vec())
        .unwrap()
        .build()
        .unwrap();
    for config in [
        trmask::CorrectionConfig::default(),
        trmask::CorrectionConfig::preset("decoupled_k3_rs").unwrap(),
    ] {
        let a = trmask::analysis::analyze(gpu.as_ref(), &batch, &config).unwrap();
        let b = trmask::analysis::analyze(&staged, &batch, &config).unwrap();
        assert!(!a.metrics.is_empty());
        for ((ka, va), (kb, vb)) in a.metrics.iter().zip(&b.metrics) {
            assert_eq!(ka, kb);
            assert_eq!(
                va.to_bits(),
                vb.to_bits(),
                "{ka}: mapped {va} vs staged {vb}"
            );
        }
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (ca, cb) = (&a.corrections, &b.corrections);
        assert_eq!(bits(&ca.mask), bits(&cb.mask));
        assert_eq!(
            ca.weights.as_deref().map(bits),
            cb.weights.as_deref().map(bits)
        );
        assert_eq!(ca.seq_reject_bits, cb.seq_reject_bits);
        assert!(ca.seq_len.len() > 100, "{} sequences", ca.seq_len.len());
    }
}

/// `Engine::prepare` builds exactly the kernels an analysis of the batch uses: after it, the
/// analysis (vocabulary divergences, token estimators, masks, segment reductions) builds none.
#[test]
fn prepare_builds_every_kernel_an_analysis_uses() {
    let Some(gpu) = gpu_fresh() else { return };
    let input = trmask::io::read_input(
        std::path::Path::new("data/causal-sample/logits.safetensors"),
        &Default::default(),
    )
    .unwrap();
    let batch = &input.batch;
    assert!(gpu.context().built_kernels().is_empty());
    gpu.prepare(batch);
    let prepared = gpu.context().built_kernels();
    let ops: Vec<_> = prepared.iter().map(|k| k.op).collect();
    for op in [
        pipeline::Op::VocabDivergence(trmask::DType::F32),
        pipeline::Op::Masks,
        pipeline::Op::SegmentReduce,
        pipeline::Op::TokenStats,
    ] {
        assert!(ops.contains(&op), "{op:?} not prepared: {prepared:?}");
    }
    for preset in ["decoupled_k3_rs", "trm_max", "disabled"] {
        let config = trmask::CorrectionConfig::preset(preset).unwrap();
        trmask::analysis::analyze(&*gpu, batch, &config).unwrap();
        assert_eq!(gpu.context().built_kernels(), prepared, "{preset}");
    }
}

/// `Context::build_kernels` builds several kernels at once, each once, and reports a failed
/// build after building the others.
#[test]
fn build_kernels_builds_each_once_and_reports_a_failure() {
    let Some(gpu) = gpu_fresh() else { return };
    let ctx = gpu.context();
    let good = [
        ctx.kernel_key(pipeline::Op::TokenStats, trmask::DType::F32),
        ctx.kernel_key(pipeline::Op::Masks, trmask::DType::F32),
    ];
    let bad = pipeline::KernelKey {
        workgroup: 0,
        ..good[0]
    };
    let e = ctx
        .build_kernels(&[good[0], bad, good[1], good[0]])
        .unwrap_err();
    assert!(e.to_string().contains("workgroup size 0"), "{e}");
    let mut want = good.to_vec();
    want.sort_by_key(pipeline::KernelKey::label);
    assert_eq!(ctx.built_kernels(), want);
    ctx.build_kernels(&good).unwrap();
    assert_eq!(ctx.built_kernels(), want);
}
