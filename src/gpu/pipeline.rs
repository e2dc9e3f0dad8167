//! Kernel variants, WGSL composition and the compute-pipeline cache.
//!
//! A kernel is identified by a [`KernelKey`] (op × input dtype × reduction flavour × workgroup
//! size). Its WGSL text is the concatenation of `shaders/common/*.wgsl` snippets and the op's
//! own `shaders/<op>.wgsl`, all embedded with `include_str!`; the workgroup size is the `WG`
//! pipeline-overridable constant, never baked into text. Adding an op: add an [`Op`] variant,
//! its [`OpSpec`] (snippets, bindings, variants) in [`Op::spec`], and the op's module.

use crate::batch::DType;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, RwLock};

/// `shaders/common/prelude.wgsl`: `Meta`, the `params` uniform, `WG`, sentinels, helpers.
pub const PRELUDE: &str = include_str!("../../shaders/common/prelude.wgsl");
/// `shaders/common/reduce_wg.wgsl`: workgroup-memory tree reductions.
pub const REDUCE_WG: &str = include_str!("../../shaders/common/reduce_wg.wgsl");
/// `shaders/common/reduce_acc_wg.wgsl`: `reduce_acc`, workgroup flavour.
pub const REDUCE_ACC_WG: &str = include_str!("../../shaders/common/reduce_acc_wg.wgsl");
/// `shaders/common/reduce_sg.wgsl`: `reduce_acc`, subgroup flavour.
pub const REDUCE_SG: &str = include_str!("../../shaders/common/reduce_sg.wgsl");
/// `shaders/common/estimators.wgsl`: k3 / expm1 helpers for small log-ratios.
pub const ESTIMATORS: &str = include_str!("../../shaders/common/estimators.wgsl");
const TOKEN_STATS: &str = include_str!("../../shaders/token_stats.wgsl");
const MASKS: &str = include_str!("../../shaders/masks.wgsl");
const SEGMENT_REDUCE: &str = include_str!("../../shaders/segment_reduce.wgsl");
const TOPK_DIVERGENCE: &str = include_str!("../../shaders/topk_divergence.wgsl");

/// Entry point of every kernel.
pub const ENTRY_POINT: &str = "main";

/// Name of the workgroup-size override constant in every kernel.
pub const WORKGROUP_OVERRIDE: &str = "WG";

/// Largest workgroup size any kernel accepts (`MAX_WG` in the prelude).
pub const MAX_WORKGROUP: u32 = 256;

/// The operations with GPU kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Per-token estimators (`shaders/token_stats.wgsl`).
    TokenStats,
    /// Segmented per-sequence reductions (`shaders/segment_reduce.wgsl`).
    SegmentReduce,
    /// Top-K divergences from trainer logits (`shaders/topk_divergence.wgsl`).
    TopkDivergence,
    /// Exact vocabulary divergences (`shaders/vocab_divergence.wgsl`); the trainer logits'
    /// dtype (the key's `dtype` is the rollout logits').
    VocabDivergence(DType),
    /// Fused weights and masks (`shaders/masks.wgsl`).
    Masks,
}

impl Op {
    /// Every op.
    pub const ALL: &'static [Op] = &[
        Op::TokenStats,
        Op::SegmentReduce,
        Op::TopkDivergence,
        Op::VocabDivergence(DType::F32),
        Op::VocabDivergence(DType::F16),
        Op::VocabDivergence(DType::BF16),
        Op::Masks,
    ];

    /// The op's description: shader composition, bindings, variants.
    pub fn spec(self) -> &'static OpSpec {
        match self {
            Op::TokenStats => &TOKEN_STATS_SPEC,
            Op::SegmentReduce => &SEGMENT_REDUCE_SPEC,
            Op::TopkDivergence => &TOPK_DIVERGENCE_SPEC,
            Op::VocabDivergence(_) => &super::vocab_divergence::VOCAB_DIVERGENCE_SPEC,
            Op::Masks => &MASKS_SPEC,
        }
    }
}

/// How a kernel reduces across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flavour {
    /// Workgroup-memory tree (works everywhere, any workgroup size).
    Workgroup,
    /// Subgroup shuffles, then workgroup memory across subgroups (`Features::SUBGROUP`, naga's
    /// `Capabilities::SUBGROUP`; chosen when the device's subgroup size is fixed and divides the
    /// workgroup size).
    Subgroup,
}

impl Flavour {
    /// The `reduce_acc` snippet of the flavour.
    pub fn reduce_acc(self) -> &'static [&'static str] {
        match self {
            Flavour::Workgroup => &[REDUCE_WG, REDUCE_ACC_WG],
            Flavour::Subgroup => &[REDUCE_SG],
        }
    }
}

/// One kernel variant: the key of the pipeline cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey {
    /// The operation.
    pub op: Op,
    /// Element type of the op's main input (`F32` for ops on host-converted values).
    pub dtype: DType,
    /// Reduction flavour.
    pub flavour: Flavour,
    /// Threads per workgroup (the `WG` override), 1..=[`MAX_WORKGROUP`].
    pub workgroup: u32,
}

impl KernelKey {
    /// A short label such as `token_stats/F32/Workgroup/wg256`.
    pub fn label(&self) -> String {
        format!(
            "{}/{}/{:?}/wg{}",
            self.op.spec().name,
            self.dtype.name(),
            self.flavour,
            self.workgroup
        )
    }
}

/// What a binding of an op's bind group is (binding 0 is always the [`Meta`] uniform).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    /// `var<storage, read>`, at least `min_bytes` bytes.
    ReadOnly {
        /// Minimum binding size.
        min_bytes: u64,
    },
    /// `var<storage, read_write>`, at least `min_bytes` bytes.
    ReadWrite {
        /// Minimum binding size.
        min_bytes: u64,
    },
}

/// Static description of an op's kernels.
#[derive(Debug)]
pub struct OpSpec {
    /// Stem of the op's files (`token_stats` → `shaders/token_stats.wgsl`, `src/gpu/token_stats.rs`).
    pub name: &'static str,
    /// The op's own WGSL (entry point `main`).
    pub body: &'static str,
    /// Common snippets placed after the prelude, chosen per variant.
    pub snippets: fn(&KernelKey) -> Vec<&'static str>,
    /// Storage bindings 1, 2, … (binding 0 is the `Meta` uniform).
    pub bindings: &'static [BindingKind],
    /// Input dtypes the op has variants for.
    pub dtypes: &'static [DType],
    /// Flavours the op has variants for.
    pub flavours: &'static [Flavour],
    /// Default workgroup size.
    pub default_workgroup: u32,
}

const RO4: BindingKind = BindingKind::ReadOnly { min_bytes: 4 };
const RW4: BindingKind = BindingKind::ReadWrite { min_bytes: 4 };

static TOKEN_STATS_SPEC: OpSpec = OpSpec {
    name: "token_stats",
    body: TOKEN_STATS,
    snippets: |_| vec![ESTIMATORS],
    bindings: &[RO4, RO4, RW4],
    dtypes: &[DType::F32],
    flavours: &[Flavour::Workgroup],
    default_workgroup: 256,
};

static SEGMENT_REDUCE_SPEC: OpSpec = OpSpec {
    name: "segment_reduce",
    body: SEGMENT_REDUCE,
    snippets: |k| k.flavour.reduce_acc().to_vec(),
    bindings: &[RO4, RO4, RO4, RW4],
    dtypes: &[DType::F32],
    flavours: &[Flavour::Workgroup, Flavour::Subgroup],
    default_workgroup: 256,
};

static TOPK_DIVERGENCE_SPEC: OpSpec = OpSpec {
    name: "topk_divergence",
    body: TOPK_DIVERGENCE,
    snippets: |k| k.flavour.reduce_acc().to_vec(),
    bindings: &[RO4, RO4, RO4, RO4, RW4],
    dtypes: &[DType::F32, DType::F16, DType::BF16],
    flavours: &[Flavour::Workgroup, Flavour::Subgroup],
    default_workgroup: 256,
};

static MASKS_SPEC: OpSpec = OpSpec {
    name: "masks",
    body: MASKS,
    snippets: |_| vec![REDUCE_WG, ESTIMATORS],
    bindings: &[RO4, RO4, RO4, RO4, RO4, RW4, RW4],
    dtypes: &[DType::F32],
    flavours: &[Flavour::Workgroup],
    default_workgroup: 256,
};

/// Workgroup sizes the library builds (including a non-power-of-two one).
pub const WORKGROUP_SIZES: &[u32] = &[64, 192, 256];

/// Every kernel variant the cache can build (op × dtype × flavour × workgroup size).
pub fn all_kernel_keys() -> Vec<KernelKey> {
    let mut keys = Vec::new();
    for &op in Op::ALL {
        let spec = op.spec();
        for &dtype in spec.dtypes {
            for &flavour in spec.flavours {
                for &workgroup in WORKGROUP_SIZES {
                    keys.push(KernelKey {
                        op,
                        dtype,
                        flavour,
                        workgroup,
                    });
                }
            }
        }
    }
    keys
}

/// The full WGSL text of a kernel variant (prelude + snippets + body). The workgroup size is
/// not in the text: pass it as the `WG` pipeline constant.
pub fn shader_source(key: &KernelKey) -> String {
    let spec = key.op.spec();
    let mut src = String::from(PRELUDE);
    for s in (spec.snippets)(key) {
        src.push('\n');
        src.push_str(s);
    }
    src.push('\n');
    src.push_str(spec.body);
    src
}

/// The sizes of one dispatch: the WGSL `Meta` struct's `#[repr(C)]` twin (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Meta {
    /// Items in this dispatch (slots, pieces, rows).
    pub count: u32,
    /// Inner size (statistics per slot, vocabulary size, …).
    pub width: u32,
    /// Element stride between items.
    pub stride: u32,
    /// Op-specific bit flags.
    pub flags: u32,
    /// Op-specific scale (e.g. 1 / temperature).
    pub scale: f32,
    /// Op-specific parameter.
    pub param: f32,
    /// Spare.
    pub extra0: u32,
    /// Spare.
    pub extra1: u32,
}

/// Size of [`Meta`] in bytes.
pub const META_SIZE: u64 = std::mem::size_of::<Meta>() as u64;

/// A built kernel: pipeline plus its explicit bind-group layout.
#[derive(Debug)]
pub struct Kernel {
    /// The variant.
    pub key: KernelKey,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// Lazily built pipelines keyed by [`KernelKey`], with shader modules cached beneath.
#[derive(Debug, Default)]
pub struct PipelineCache {
    kernels: RwLock<HashMap<KernelKey, Arc<Kernel>>>,
    modules: RwLock<HashMap<(Op, DType, Flavour), wgpu::ShaderModule>>,
}

fn scope_error(device: &wgpu::Device, scope: wgpu::ErrorScopeGuard) -> Option<String> {
    let _ = device;
    pollster::block_on(scope.pop()).map(|e| e.to_string())
}

/// Compiles WGSL into a shader module; errors (inside a validation scope) become
/// [`Error::ShaderCompile`] naming `label`.
pub fn compile(device: &wgpu::Device, label: &str, source: &str) -> Result<wgpu::ShaderModule> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    if let Some(message) = scope_error(device, scope) {
        return Err(Error::ShaderCompile {
            kernel: label.to_string(),
            message,
        });
    }
    Ok(module)
}

impl PipelineCache {
    /// The kernel for `key`, built on first use (outside any lock; a concurrent duplicate build
    /// is discarded). Compile errors come back as [`Error::ShaderCompile`].
    pub fn get(&self, device: &wgpu::Device, key: KernelKey) -> Result<Arc<Kernel>> {
        if let Some(k) = self.kernels.read().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(k);
        }
        let built = Arc::new(self.build(device, key)?);
        let mut map = self
            .kernels
            .write()
            .map_err(|_| Error::Gpu("pipeline cache lock poisoned".into()))?;
        Ok(map.entry(key).or_insert(built).clone())
    }

    fn module(&self, device: &wgpu::Device, key: &KernelKey) -> Result<wgpu::ShaderModule> {
        let mkey = (key.op, key.dtype, key.flavour);
        if let Some(m) = self.modules.read().ok().and_then(|m| m.get(&mkey).cloned()) {
            return Ok(m);
        }
        let module = compile(device, &key.label(), &shader_source(key))?;
        if let Ok(mut m) = self.modules.write() {
            m.entry(mkey).or_insert_with(|| module.clone());
        }
        Ok(module)
    }

    fn build(&self, device: &wgpu::Device, key: KernelKey) -> Result<Kernel> {
        if key.workgroup == 0 || key.workgroup > MAX_WORKGROUP {
            return Err(Error::Gpu(format!(
                "workgroup size {} outside 1..={MAX_WORKGROUP}",
                key.workgroup
            )));
        }
        let module = self.module(device, &key)?;
        let spec = key.op.spec();
        let label = key.label();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: NonZeroU64::new(META_SIZE),
            },
            count: None,
        }];
        for (i, b) in spec.bindings.iter().enumerate() {
            let (read_only, min) = match *b {
                BindingKind::ReadOnly { min_bytes } => (true, min_bytes),
                BindingKind::ReadWrite { min_bytes } => (false, min_bytes),
            };
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset: false,
                    min_binding_size: NonZeroU64::new(min.max(4)),
                },
                count: None,
            });
        }
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let constants = [(WORKGROUP_OVERRIDE, f64::from(key.workgroup))];
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(ENTRY_POINT),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        if let Some(message) = scope_error(device, scope) {
            return Err(Error::ShaderCompile {
                kernel: label,
                message,
            });
        }
        Ok(Kernel {
            key,
            pipeline,
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Meta>(), 32);
        assert_eq!(std::mem::align_of::<Meta>(), 4);
    }

    #[test]
    fn keys_are_unique_and_sources_compose() {
        let keys = all_kernel_keys();
        let set: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(set.len(), keys.len());
        for k in &keys {
            let s = shader_source(k);
            assert!(s.starts_with(PRELUDE));
            assert!(s.contains("fn main("));
        }
    }
}
