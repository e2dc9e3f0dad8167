//! Every kernel on a device created with `wgpu::Limits::default()` (WebGPU's minimum limits,
//! e.g. 16 KiB of workgroup memory): each variant's workgroup memory, counted as WebGPU does
//! (every workgroup variable the entry point uses, rounded up to 16 bytes), fits the device's
//! limit — wgpu 30 does not check this itself, drivers with exactly 16 KiB would fail — and
//! every op × dtype × flavour the adapter supports runs and matches the CPU reference.

use crate::common;

use common::{assert_close, gpu, Rng};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use std::sync::Arc;
use trmask::cpu::CpuEngine;
use trmask::gpu::pipeline::{
    all_kernel_keys, shader_source, Flavour, KernelKey, ENTRY_POINT, WORKGROUP_OVERRIDE,
};
use trmask::gpu::{Context, ContextOptions, GpuEngine};
use trmask::plan::{MaskAgg, MaskCriterion, MaskPlan, MaskSource};
use trmask::topk::{TopkSupport, TrainerTopk};
use trmask::{Batch, DType, Engine, Logits};

/// Workgroup memory of a kernel variant as WebGPU counts it.
fn workgroup_bytes(key: &KernelKey) -> u64 {
    let src = shader_source(key);
    let module = naga::front::wgsl::parse_str(&src).expect("parses");
    let info = Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .expect("validates");
    let mut constants = naga::back::PipelineConstants::default();
    constants.insert(WORKGROUP_OVERRIDE.to_string(), f64::from(key.workgroup));
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, ENTRY_POINT)),
        &constants,
    )
    .expect("overrides");
    let ep = module
        .entry_points
        .iter()
        .position(|e| e.name == ENTRY_POINT)
        .expect("entry point");
    let ep_info = info.get_entry_point(ep);
    module
        .global_variables
        .iter()
        .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !ep_info[*h].is_empty())
        .map(|(_, g)| u64::from(module.types[g.ty].inner.size(module.to_ctx())).div_ceil(16) * 16)
        .sum()
}

/// A device on the default adapter with WebGPU's default limits and the optional features
/// trmask uses, shared with trmask through `Context::from_wgpu_with`.
fn webgpu_minimum_engine(flavour: Option<Flavour>) -> GpuEngine {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .expect("adapter");
    let features = adapter.features()
        & (wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("webgpu minimum limits"),
        required_features: features,
        required_limits: wgpu::Limits::default(),
        ..Default::default()
    }))
    .expect("device with wgpu::Limits::default()");
    assert_eq!(
        device.limits().max_compute_workgroup_storage_size,
        wgpu::Limits::default().max_compute_workgroup_storage_size
    );
    GpuEngine::from_context(Arc::new(Context::from_wgpu_with(
        device,
        queue,
        &ContextOptions {
            flavour,
            ..Default::default()
        },
    )))
}

fn run_every_op(e: &GpuEngine, what: &str) {
    let cpu = CpuEngine::new();
    let mut rng = Rng::new(16384);
    let (b, t, v, k) = (3, 9, 257, 3);
    let n = b * t;
    let mask_f: Vec<f64> = (0..n)
        .map(|i| if i % t < t - i / t { 1.0 } else { 0.0 })
        .collect();
    let roll: Vec<f64> = (0..n).map(|_| rng.range(-4.0, -2.0)).collect();
    let train: Vec<f64> = roll.iter().map(|r| r + rng.range(-0.2, 0.2)).collect();
    let batch0 = Batch::padded(b, t, &mask_f).unwrap().build().unwrap();
    let seg = batch0.segments().clone();
    let m = seg.mask();
    let ts = e.token_stats(&roll, &train, m).unwrap();
    let want = cpu.token_stats(&roll, &train, m).unwrap();
    assert_close(&format!("{what} k3"), &ts.k3, &want.k3, 2e-5, 2e-6, 0);
    let sr = e.segment_reduce(&[&want.k3], &seg).unwrap();
    let srw = cpu.segment_reduce(&[&want.k3], &seg).unwrap();
    assert_close(
        &format!("{what} sum"),
        &sr[0].sum,
        &srw[0].sum,
        2e-5,
        2e-6,
        0,
    );
    let plan = MaskPlan {
        criteria: vec![MaskCriterion {
            source: MaskSource::K3,
            agg: MaskAgg::Max,
            lower: None,
            upper: 1.0,
        }],
        is: None,
        columns: vec![],
    };
    let cp = e.corrections_pass(&want.log_ratio, &seg, &plan).unwrap();
    let cpw = cpu.corrections_pass(&want.log_ratio, &seg, &plan).unwrap();
    assert_close(
        &format!("{what} seq max"),
        &cp.seq_stat[0],
        &cpw.seq_stat[0],
        2e-5,
        2e-6,
        0,
    );
    let a: Vec<f32> = (0..n * v).map(|_| rng.range(-4.0, 4.0) as f32).collect();
    let bb: Vec<f32> = a.iter().map(|x| x + rng.range(-0.3, 0.3) as f32).collect();
    let enc = |x: &[f32], d: DType| -> Logits {
        let bytes: Vec<u8> = match d {
            DType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => x
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
            DType::BF16 => x
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        };
        Logits::from_bytes(bytes, d, n, v).unwrap()
    };
    let responses: Vec<i64> = (0..n).map(|_| rng.below(v) as i64).collect();
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    for da in dtypes {
        for db in dtypes {
            let (la, lb) = (enc(&a, da), enc(&bb, db));
            let got = e
                .vocab_divergence(&la, &lb, Some(&responses), m, 1.0)
                .unwrap();
            let want = cpu
                .vocab_divergence(&la, &lb, Some(&responses), m, 1.0)
                .unwrap();
            let w = format!("{what} vocab {da:?}/{db:?} kl");
            assert_close(&w, &got.kl, &want.kl, 2e-3, 1e-7, 0);
        }
        let ids: Vec<i64> = (0..n * k).map(|i| ((i * 13) % v) as i64).collect();
        let lps: Vec<f64> = (0..n * k).map(|i| -2.5 - (i % k) as f64).collect();
        let batch = Batch::padded(b, t, &mask_f)
            .unwrap()
            .with_responses(responses.clone())
            .unwrap()
            .with_log_probs("rollout_log_prob", roll.clone())
            .unwrap()
            .with_topk(ids, lps, k)
            .unwrap()
            .with_logits("old_logits", enc(&bb, da))
            .unwrap()
            .build()
            .unwrap();
        let tr = TrainerTopk::from_batch(&batch, 1.0).unwrap();
        let got = Engine::topk_divergence(e, &batch, TopkSupport::Union, tr).unwrap();
        let want = Engine::topk_divergence(&cpu, &batch, TopkSupport::Union, tr).unwrap();
        let w = format!("{what} topk {da:?} kl");
        assert_close(&w, &got.topk_kl, &want.topk_kl, 2e-3, 2e-7, 0);
    }
}

#[test]
fn every_kernel_runs_within_webgpu_default_limits() {
    if gpu().is_none() {
        return;
    }
    let limit = u64::from(wgpu::Limits::default().max_compute_workgroup_storage_size);
    let mut over = Vec::new();
    for key in all_kernel_keys() {
        let bytes = workgroup_bytes(&key);
        if bytes > limit {
            over.push(format!("{} uses {bytes} bytes", key.label()));
        }
    }
    assert!(
        over.is_empty(),
        "workgroup memory over {limit} bytes: {over:?}"
    );

    for flavour in [Some(Flavour::Workgroup), None] {
        let e = webgpu_minimum_engine(flavour);
        let ctx = e.context();
        // every variant the device supports builds (the subgroup ones where it has subgroups)
        for key in all_kernel_keys() {
            if key.flavour == Flavour::Subgroup && !ctx.capabilities().subgroups {
                continue;
            }
            ctx.kernel_for(key)
                .unwrap_or_else(|err| panic!("{}: {err}", key.label()));
        }
        run_every_op(&e, &format!("{flavour:?}"));
    }
}

/// Mesa's llvmpipe (lavapipe) ends every loop of a kernel invocation after 65,535 iterations
/// in all (one counter shared by all loops), silently: before this check a row of 2^23 logits
/// came back with KL 3e-5 instead of 5e-3 and TV 8e-11 instead of 0.04. On such a device a
/// row past the budget is refused with `Error::Limit` naming the cause; a row inside it, and
/// every row on other devices, matches the CPU reference.
#[test]
fn rows_past_the_loop_budget_are_refused_never_truncated() {
    let Some(e) = gpu() else { return };
    let cpu = CpuEngine::new();
    let mut rng = Rng::new(23);
    for v in [1usize << 21, 1 << 23] {
        let a: Vec<f32> = (0..v).map(|_| rng.range(-9.0, 9.0) as f32).collect();
        let b: Vec<f32> = a.iter().map(|&x| x + rng.range(-0.3, 0.3) as f32).collect();
        let la = Logits::from_f32(&a, 1, v).unwrap();
        let lb = Logits::from_f32(&b, 1, v).unwrap();
        let want = cpu.vocab_divergence(&la, &lb, None, &[true], 1.0).unwrap();
        let got = e.vocab_divergence(&la, &lb, None, &[true], 1.0);
        let budget = e.capabilities().loop_iterations;
        match got {
            Err(err) => {
                let msg = err.to_string();
                assert!(
                    budget.is_some() && v > 1 << 21,
                    "V={v}: unexpected error {msg}"
                );
                assert!(err.is_user_error(), "{msg}");
                for needle in [
                    "rollout_logits",
                    "loop iterations",
                    "--backend cpu",
                    "65535",
                ] {
                    assert!(msg.contains(needle), "{needle:?} not in {msg}");
                }
            }
            Ok(got) => {
                assert!(
                    budget.is_none() || v <= 1 << 21,
                    "V={v}: ran past the loop budget"
                );
                for (what, g, w) in [
                    ("kl", &got.kl, &want.kl),
                    ("kl_rev", &got.kl_rev, &want.kl_rev),
                    ("tv", &got.tv, &want.tv),
                    (
                        "rollout_entropy",
                        &got.rollout_entropy,
                        &want.rollout_entropy,
                    ),
                ] {
                    assert_close(what, g, w, 2e-3, 1e-7, 23);
                }
            }
        }
    }
}
