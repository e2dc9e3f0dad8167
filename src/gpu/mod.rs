//! The GPU path: wgpu compute shaders (WGSL) on any adapter wgpu finds — Vulkan, Metal, DX12,
//! GL, or Mesa's lavapipe on machines without a GPU. f32 on the device, f64 on the host.
//!
//! Only `adapter.rs`, `context.rs`, `pipeline.rs` and `buffers.rs` touch wgpu types; each op file
//! (`token_stats.rs`, `segment_reduce.rs`, …) plans chunks, packs inputs and calls
//! [`Context::run`].
//!
//! ```no_run
//! use trmask::{Engine, GpuEngine};
//! let gpu = GpuEngine::new()?; // honours WGPU_BACKEND / WGPU_ADAPTER_NAME
//! println!("{}\n{}", gpu.name(), gpu.capabilities().describe());
//! let s = gpu.token_stats(&[-1.0, -2.0], &[-1.1, -1.9], &[true, true])?;
//! assert!(s.k3[0] > 0.0);
//! # Ok::<(), trmask::Error>(())
//! ```
//!
//! Accuracy: f32 on the device. Per-token estimators start from the log-ratio computed in f64
//! on the host and rounded once (see `token_stats.rs`); k3 and `ser` use series for small
//! |lr|. Segment sums are compensated (TwoSum) and finished in f64. Results match the CPU
//! reference within `2e-5·|ref| + 2e-6` (tests/gpu/gpu_vs_cpu.rs).
//!
//! Reductions across threads come in two flavours ([`device::pipeline::Flavour`]): subgroup shuffles
//! where the device has `SUBGROUP` with one fixed subgroup size dividing the workgroup size
//! (lavapipe: 8), else a workgroup-memory tree (any size); [`ContextOptions::flavour`] forces
//! one. Both are fixed trees without atomics: the same input gives the same bits every run.
//!
//! With `TIMESTAMP_QUERY`, [`Context::last_device_ns`] gives the device time of the last
//! [`Context::run`] (e.g. `gpu.context().last_device_ns()` after an op), for benches that report
//! device time apart from wall time.

pub(crate) mod device;
pub(crate) mod ops;

#[doc(hidden)]
pub use device::pipeline;
#[doc(hidden)]
pub use ops::{masks, segment_reduce};

pub use crate::stats::VocabPasses;
pub use device::capabilities::Capabilities;
#[doc(hidden)]
pub use device::context::Submission;
pub use device::context::{list_adapters, Context, ContextOptions};
#[doc(hidden)]
pub use device::pass::{Bind, Pass};
pub use ops::vocab_divergence::vocab_divergence_with;
pub use ops::vocab_tuner::{VocabTuning, TUNE_CACHE_ENV};
pub use ops::vocab_variant::{VocabVariant, SLICE_LENGTHS, VOCAB_KERNEL_ENV};

use crate::engine::plan::{CorrectionsRaw, MaskPlan};
use crate::engine::Engine;
use crate::error::Result;
use crate::input::batch::{Batch, Segments};
use crate::input::logits::Logits;
use crate::input::support::TrainerTopk;
use crate::stats::{SegmentStats, TokenStats, TopkStats, TopkSupport, VocabStats};
use std::sync::Arc;

/// The GPU engine: every [`Engine`] op as wgpu compute kernels on one device.
#[derive(Debug, Clone)]
pub struct GpuEngine {
    ctx: Arc<Context>,
}

impl GpuEngine {
    /// Opens the default adapter (honouring `WGPU_BACKEND` / `WGPU_ADAPTER_NAME`).
    pub fn new() -> Result<Self> {
        Self::with_options(&ContextOptions::default())
    }

    /// Opens an adapter with explicit options.
    pub fn with_options(options: &ContextOptions) -> Result<Self> {
        Ok(Self::from_context(Arc::new(Context::new(options)?)))
    }

    /// [`GpuEngine::new`] unless the default adapter is a software rasterizer: then
    /// `Ok(Err(adapter name))`, without opening a device (what `Backend::Auto` needs).
    pub(crate) fn new_unless_software() -> Result<std::result::Result<Self, String>> {
        Ok(Context::new_unless_software(&ContextOptions::default())?
            .map(|ctx| Self::from_context(Arc::new(ctx))))
    }

    /// An engine on an existing context (e.g. [`Context::from_wgpu`]).
    pub fn from_context(ctx: Arc<Context>) -> Self {
        GpuEngine { ctx }
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The device's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        self.ctx.capabilities()
    }

    /// Builds every kernel now rather than on first use.
    pub fn warm_up(&self) -> Result<()> {
        self.ctx.warm_up()
    }
}

impl Engine for GpuEngine {
    fn name(&self) -> String {
        let c = self.ctx.capabilities();
        format!("gpu: {} ({})", c.adapter_name, c.backend)
    }

    fn is_gpu(&self) -> bool {
        true
    }

    fn prepare(&self, batch: &Batch) {
        let ctx = &self.ctx;
        let mean = ops::segment_reduce::mean_valid(batch.segments());
        let mut keys = Vec::with_capacity(4);
        // the longest build first: the others share the remaining cores meanwhile
        if let (Some(r), Some(o)) = (batch.rollout_logits(), batch.old_logits()) {
            if let Ok(key) = ops::vocab_divergence::kernel_key(ctx, r, o) {
                keys.push(key);
            }
        }
        keys.push(ops::masks::kernel_key(ctx, mean));
        keys.push(ops::segment_reduce::kernel_key(ctx, mean));
        keys.push(ctx.kernel_key(
            device::pipeline::Op::TokenStats,
            crate::input::logits::DType::F32,
        ));
        // errors resurface where the kernel is used (see the trait)
        let _ = ctx.build_kernels(&keys);
    }

    fn token_stats(
        &self,
        rollout_log_prob: &[f64],
        train_log_prob: &[f64],
        mask: &[bool],
    ) -> Result<TokenStats> {
        ops::token_stats::token_stats(&self.ctx, rollout_log_prob, train_log_prob, mask)
    }

    fn segment_reduce(&self, values: &[&[f64]], segments: &Segments) -> Result<Vec<SegmentStats>> {
        ops::segment_reduce::segment_reduce(&self.ctx, values, segments)
    }

    fn corrections_pass(
        &self,
        lr: &[f64],
        segments: &Segments,
        plan: &MaskPlan,
    ) -> Result<CorrectionsRaw> {
        match ops::masks::corrections_pass(&self.ctx, lr, segments, plan)? {
            Some(r) => Ok(r),
            // a sequence longer than one binding: token_stats + one segment_reduce on the GPU,
            // decisions on the host
            None => crate::engine::passes::corrections_pass(self, lr, segments, plan),
        }
    }

    fn vocab_divergence(
        &self,
        rollout: &Logits,
        train: &Logits,
        responses: Option<&[i64]>,
        mask: &[bool],
        temperature: f64,
    ) -> Result<VocabStats> {
        ops::vocab_divergence::vocab_divergence(
            &self.ctx,
            rollout,
            train,
            responses,
            mask,
            temperature,
        )
    }

    fn topk_divergence(
        &self,
        batch: &Batch,
        support: TopkSupport,
        trainer: TrainerTopk<'_>,
    ) -> Result<TopkStats> {
        ops::topk_divergence::topk_divergence(&self.ctx, batch, support, trainer)
    }
}
