//! The kernel registry (every op's [`OpSpec`]), WGSL composition and the compute-pipeline cache.
//!
//! A kernel is identified by a [`KernelKey`] (op × input dtype × reduction flavour × workgroup
//! size). Its WGSL text is the concatenation of `shaders/common/prelude.wgsl`,
//! `shaders/common/math.wgsl` (the one math library), the snippets the variant needs
//! (`two_sum`, loaders for its dtypes, reductions for its flavour) and the op's own
//! `shaders/<op>.wgsl`, all embedded with `include_str!` (`wgsl.rs`); the workgroup size is the `WG`
//! pipeline-overridable constant, never baked into text. Binding 0 of every kernel is the op's
//! own uniform struct (declared in its shader, Rust twin in `src/gpu/<op>.rs`, size in
//! [`OpSpec::params_size`]). Adding an op: an [`Op`] variant, its [`OpSpec`] here, its shader
//! and its module.

use crate::error::{Error, Result};
use crate::input::logits::DType;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, RwLock};

use crate::gpu::ops::wgsl::{
    load_a, load_a_wide, load_b, load_b_wide, mask_codes, LOAD8_NARROW, MASKS, SEGMENT_REDUCE,
    TOKEN_STATS, TOPK_DIVERGENCE, VOCAB_DIVERGENCE, VOCAB_ROW_MAIN, VOCAB_SPLIT,
};
pub use crate::gpu::ops::wgsl::{
    MATH, PRELUDE, REDUCE_ACC_WG, REDUCE_SG, REDUCE_SLOTS_ROW, REDUCE_SLOTS_SG,
    REDUCE_SLOTS_SG_ROWS, REDUCE_SLOTS_SHUFFLE, REDUCE_SLOTS_WG, REDUCE_WG, SEGMENTS, TWO_SUM,
    UNPACK,
};

/// Entry point of every kernel.
pub const ENTRY_POINT: &str = "main";

/// Name of the workgroup-size override constant in every kernel.
pub const WORKGROUP_OVERRIDE: &str = "WG";

/// Name of the vocabulary kernel's rows-per-workgroup override (set when [`KernelKey::rows`] > 1).
pub const ROWS_OVERRIDE: &str = "ROWS";

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
            Op::VocabDivergence(_) => &VOCAB_DIVERGENCE_SPEC,
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
    /// The op's second variant, its boolean override [`OpSpec::variant`] set: `WIDE` for the
    /// vocabulary kernel (V a multiple of 8 and rows 16-byte aligned: eight elements per
    /// `vec4<u32>` load), `SERIAL` for segment reductions and masks (one thread per sequence);
    /// false for ops without one.
    pub variant: bool,
    /// The vocabulary kernel's split rows (`common/vocab_split.wgsl`); false elsewhere.
    pub split: bool,
    /// Rows per workgroup: the vocabulary kernel's whole rows with one subgroup per row
    /// (`ROWS`, `workgroup` threads per row; subgroup flavour) when above 1; 1 elsewhere.
    pub rows: u32,
}

impl KernelKey {
    /// A short label such as `token_stats/F32/Workgroup/wg256` (`…/wide`, `…/serial` for the
    /// second variant, `…/split` for the vocabulary kernel's split variant, `…/rows8` for
    /// several rows per workgroup).
    pub fn label(&self) -> String {
        format!(
            "{}/{}/{:?}/wg{}{}{}{}",
            self.op.spec().name,
            self.dtype.name(),
            self.flavour,
            self.workgroup,
            match (self.variant, self.op.spec().variant) {
                (true, Some(name)) => format!("/{}", name.to_lowercase()),
                _ => String::new(),
            },
            if self.split { "/split" } else { "" },
            match self.rows {
                1 => String::new(),
                r => format!("/rows{r}"),
            }
        )
    }
}

/// What a binding of an op's bind group is (binding 0 is always the op's uniform struct).
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
    /// Common snippets placed after the prelude and the math library, chosen per variant.
    pub snippets: fn(&KernelKey) -> Vec<&'static str>,
    /// Name of the op's uniform struct in its shader (binding 0, `params`).
    pub params_struct: &'static str,
    /// Size of that struct in bytes (its Rust twin's `size_of`; checked by each op's tests).
    pub params_size: u64,
    /// Storage bindings 1, 2, … (binding 0 is the uniform).
    pub bindings: &'static [BindingKind],
    /// Input dtypes the op has variants for.
    pub dtypes: &'static [DType],
    /// Flavours the op has variants for.
    pub flavours: &'static [Flavour],
    /// Default workgroup size.
    pub default_workgroup: u32,
    /// The name of the op's boolean override constant, if it has a second variant
    /// ([`KernelKey::variant`] sets it).
    pub variant: Option<&'static str>,
    /// The second variant's storage bindings where they differ from [`Self::bindings`] (the
    /// vocabulary kernel's `WIDE` loads need 16 bytes of each logits binding).
    pub variant_bindings: Option<&'static [BindingKind]>,
}

impl OpSpec {
    /// The storage bindings of `key`'s variant.
    pub fn bindings_of(&self, key: &KernelKey) -> &'static [BindingKind] {
        match (key.variant, self.variant_bindings) {
            (true, Some(b)) => b,
            _ => self.bindings,
        }
    }
}

const RO4: BindingKind = BindingKind::ReadOnly { min_bytes: 4 };
const RW4: BindingKind = BindingKind::ReadWrite { min_bytes: 4 };

static TOKEN_STATS_SPEC: OpSpec = OpSpec {
    name: "token_stats",
    body: TOKEN_STATS,
    snippets: |_| vec![],
    params_struct: "TokenStatsParams",
    params_size: 16,
    bindings: &[RO4, RO4, RW4],
    dtypes: &[DType::F32],
    flavours: &[Flavour::Workgroup],
    default_workgroup: 256,
    variant: None,
    variant_bindings: None,
};

static SEGMENT_REDUCE_SPEC: OpSpec = OpSpec {
    name: "segment_reduce",
    body: SEGMENT_REDUCE,
    snippets: |k| [&[TWO_SUM, SEGMENTS][..], k.flavour.reduce_acc()].concat(),
    params_struct: "SegmentReduceParams",
    params_size: 16,
    bindings: &[RO4, RO4, RO4, RW4],
    dtypes: &[DType::F32],
    flavours: &[Flavour::Workgroup, Flavour::Subgroup],
    default_workgroup: 256,
    variant: Some(SERIAL_OVERRIDE),
    variant_bindings: None,
};

static TOPK_DIVERGENCE_SPEC: OpSpec = OpSpec {
    name: "topk_divergence",
    body: TOPK_DIVERGENCE,
    snippets: |k| {
        [
            &[TWO_SUM, UNPACK, load_a(k.dtype)][..],
            k.flavour.reduce_acc(),
        ]
        .concat()
    },
    params_struct: "TopkDivergenceParams",
    params_size: 32,
    bindings: &[RO4, RO4, RO4, RO4, RW4],
    dtypes: &[DType::F32, DType::F16, DType::BF16],
    flavours: &[Flavour::Workgroup, Flavour::Subgroup],
    default_workgroup: 256,
    variant: None,
    variant_bindings: None,
};

/// f32 results per row of the vocabulary kernel.
pub const VOCAB_RESULTS_PER_ROW: u64 = 8;

const RO16: BindingKind = BindingKind::ReadOnly { min_bytes: 16 };
const VOCAB_RESULTS: BindingKind = BindingKind::ReadWrite {
    min_bytes: VOCAB_RESULTS_PER_ROW * 4,
};

/// One variant per (rollout dtype = `key.dtype`, trainer dtype = the op's) pair.
static VOCAB_DIVERGENCE_SPEC: OpSpec = OpSpec {
    name: "vocab_divergence",
    body: VOCAB_DIVERGENCE,
    snippets: |k| {
        let train = match k.op {
            Op::VocabDivergence(d) => d,
            _ => DType::F32,
        };
        let trees: &[&str] = match (k.flavour, k.rows > 1) {
            (Flavour::Workgroup, _) => &[REDUCE_SLOTS_WG, REDUCE_SLOTS_ROW],
            (Flavour::Subgroup, false) => {
                &[REDUCE_SLOTS_SHUFFLE, REDUCE_SLOTS_SG, REDUCE_SLOTS_ROW]
            }
            (Flavour::Subgroup, true) => &[REDUCE_SLOTS_SHUFFLE, REDUCE_SLOTS_SG_ROWS],
        };
        let loads = match k.variant {
            true => vec![load_a_wide(k.dtype), load_b_wide(train)],
            false => vec![load_a(k.dtype), load_b(train), LOAD8_NARROW],
        };
        let main = if k.split { VOCAB_SPLIT } else { VOCAB_ROW_MAIN };
        [&[TWO_SUM, UNPACK][..], trees, &loads, &[main]].concat()
    },
    params_struct: "VocabDivergenceParams",
    params_size: 48,
    bindings: &[RO4, RO4, RO4, VOCAB_RESULTS, RW4],
    dtypes: &[DType::F32, DType::F16, DType::BF16],
    flavours: &[Flavour::Workgroup, Flavour::Subgroup],
    default_workgroup: 256,
    variant: Some("WIDE"),
    variant_bindings: Some(&[RO16, RO16, RO4, VOCAB_RESULTS, RW4]),
};

static MASKS_SPEC: OpSpec = OpSpec {
    name: "masks",
    body: MASKS,
    snippets: |_| vec![TWO_SUM, SEGMENTS, REDUCE_WG, mask_codes()],
    params_struct: "MasksParams",
    params_size: 32,
    bindings: &[RO4, RO4, RO4, RO4, RO4, RW4, RW4],
    dtypes: &[DType::F32],
    flavours: &[Flavour::Workgroup],
    default_workgroup: 256,
    variant: Some(SERIAL_OVERRIDE),
    variant_bindings: None,
};

/// The override of the segmented ops' one-thread-per-segment variant ([`OpSpec::variant`]).
pub const SERIAL_OVERRIDE: &str = "SERIAL";

/// Valid tokens per segment on average up to which an op with a [`SERIAL_OVERRIDE`] variant
/// (segment reductions, masks) runs one thread per segment, [`SERIAL_WORKGROUP`] segments per
/// workgroup, instead of a workgroup per segment: below it most of a segment's workgroup would
/// idle, and a workgroup costs about 0.7 µs on lavapipe whatever it does (65,536 tokens as
/// 30,000 sequences, 8 statistics: 240,000 workgroups, 156–191 ms).
pub const SERIAL_MEAN: f64 = 16.0;

/// Segments per workgroup of a `SERIAL` variant, within the op's workgroup size.
pub const SERIAL_WORKGROUP: u32 = 64;

/// Workgroup sizes the library builds (including a non-power-of-two one).
pub const WORKGROUP_SIZES: &[u32] = &[64, 192, 256];

/// Every kernel variant the cache can build (op × dtype × flavour × workgroup size × the
/// second variant where the op has one × the vocabulary kernel's whole or split rows), the
/// vocabulary kernel's subgroup flavour for equal dtype pairs only (its trees never meet the
/// loaders), with one subgroup per row of 8 and of 32 lanes besides.
pub fn all_kernel_keys() -> Vec<KernelKey> {
    let mut keys = Vec::new();
    for &op in Op::ALL {
        let spec = op.spec();
        let vocab = match op {
            Op::VocabDivergence(d) => Some(d),
            _ => None,
        };
        for &dtype in spec.dtypes {
            for &flavour in spec.flavours {
                if flavour == Flavour::Subgroup && vocab.is_some_and(|d| d != dtype) {
                    continue;
                }
                let mut shapes: Vec<(u32, u32)> = WORKGROUP_SIZES.iter().map(|&w| (w, 1)).collect();
                if flavour == Flavour::Subgroup && vocab.is_some() {
                    shapes.extend([(8, 32), (32, 8)]);
                }
                for (workgroup, rows) in shapes {
                    let splits = [false, vocab.is_some() && rows == 1];
                    let pairs = [false, spec.variant.is_some()].map(|v| splits.map(|s| (v, s)));
                    for (variant, split) in pairs.into_iter().flatten() {
                        let key = KernelKey {
                            op,
                            dtype,
                            flavour,
                            workgroup,
                            variant,
                            split,
                            rows,
                        };
                        if !keys.contains(&key) {
                            keys.push(key);
                        }
                    }
                }
            }
        }
    }
    keys
}

/// The full WGSL text of a kernel variant (prelude + math + snippets + body). The workgroup
/// size is not in the text: pass it as the `WG` pipeline constant.
pub fn shader_source(key: &KernelKey) -> String {
    let spec = key.op.spec();
    let mut src = String::from(PRELUDE);
    for s in std::iter::once(MATH).chain((spec.snippets)(key)) {
        src.push('\n');
        src.push_str(s);
    }
    src.push('\n');
    src.push_str(spec.body);
    src
}

/// Bytes of workgroup memory a kernel variant uses, counted as WebGPU does: every
/// `var<workgroup>` the entry point uses, each rounded up to 16 bytes (wgpu 30 does not check
/// this against `max_compute_workgroup_storage_size`; the cache does, before building).
pub fn workgroup_storage_bytes(key: &KernelKey) -> Result<u64> {
    crate::gpu::ops::wgsl::workgroup_storage_bytes(&key.label(), &shader_source(key), ENTRY_POINT)
}

/// A built kernel: pipeline plus its explicit bind-group layout.
#[derive(Debug)]
pub struct Kernel {
    /// The variant.
    pub key: KernelKey,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// Lazily built pipelines keyed by [`KernelKey`], with shader modules cached beneath (keyed by
/// their WGSL text: variants that differ only in override constants share one module).
#[derive(Debug, Default)]
pub struct PipelineCache {
    kernels: RwLock<HashMap<KernelKey, Arc<Kernel>>>,
    modules: RwLock<HashMap<String, wgpu::ShaderModule>>,
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

    /// The keys of the kernels built so far, ordered by label.
    pub fn built(&self) -> Vec<KernelKey> {
        let mut keys: Vec<KernelKey> = self
            .kernels
            .read()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        keys.sort_by_key(KernelKey::label);
        keys
    }

    fn module(&self, device: &wgpu::Device, key: &KernelKey) -> Result<wgpu::ShaderModule> {
        let source = shader_source(key);
        if let Some(m) = self
            .modules
            .read()
            .ok()
            .and_then(|m| m.get(&source).cloned())
        {
            return Ok(m);
        }
        let limit = u64::from(device.limits().max_compute_workgroup_storage_size);
        let need = workgroup_storage_bytes(key)?;
        if need > limit {
            return Err(Error::limit(
                format!(
                    "kernel {} needs {need} bytes of workgroup memory",
                    key.label()
                ),
                limit,
            ));
        }
        let module = compile(device, &key.label(), &source)?;
        if let Ok(mut m) = self.modules.write() {
            m.entry(source).or_insert_with(|| module.clone());
        }
        Ok(module)
    }

    fn build(&self, device: &wgpu::Device, key: KernelKey) -> Result<Kernel> {
        let threads = key.workgroup.saturating_mul(key.rows);
        if key.workgroup == 0 || key.rows == 0 || threads > MAX_WORKGROUP {
            return Err(Error::Gpu(format!(
                "workgroup size {} outside 1..={MAX_WORKGROUP}",
                threads
            )));
        }
        if key.variant && key.op.spec().variant.is_none() {
            return Err(Error::Gpu(format!(
                "{}: the op has no second variant",
                key.label()
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
                min_binding_size: NonZeroU64::new(spec.params_size),
            },
            count: None,
        }];
        for (i, b) in spec.bindings_of(&key).iter().enumerate() {
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
        let mut constants = vec![(WORKGROUP_OVERRIDE, f64::from(key.workgroup))];
        if key.rows > 1 {
            constants.push((ROWS_OVERRIDE, f64::from(key.rows)));
        }
        if let Some(name) = spec.variant {
            constants.push((name, f64::from(u8::from(key.variant))));
        }
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

/// Checks an op's Rust uniform twin against the WGSL struct `spec.params_struct`: same size
/// (and [`OpSpec::params_size`]) and, for each `(field, offset)`, the same member offset.
#[cfg(test)]
pub(crate) fn assert_params_layout(op: Op, rust_size: usize, fields: &[(&str, usize)]) {
    let spec = op.spec();
    assert_eq!(rust_size as u64, spec.params_size, "{}", spec.params_struct);
    let key = KernelKey {
        op,
        dtype: spec.dtypes[0],
        flavour: Flavour::Workgroup,
        workgroup: 64,
        variant: false,
        split: false,
        rows: 1,
    };
    let module = naga::front::wgsl::parse_str(&shader_source(&key)).unwrap();
    let (members, span) = module
        .types
        .iter()
        .find_map(|(_, t)| match &t.inner {
            naga::TypeInner::Struct { members, span }
                if t.name.as_deref() == Some(spec.params_struct) =>
            {
                Some((members.clone(), *span))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no struct {}", spec.params_struct));
    assert_eq!(u64::from(span), spec.params_size, "{}", spec.params_struct);
    let wgsl: Vec<(String, usize)> = members
        .iter()
        .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
        .collect();
    let rust: Vec<(String, usize)> = fields.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(wgsl, rust, "{} fields and offsets", spec.params_struct);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_fits_webgpu_workgroup_memory() {
        let limit = 16_384;
        for key in all_kernel_keys() {
            let bytes = workgroup_storage_bytes(&key).unwrap();
            assert!(bytes <= limit, "{}: {bytes} bytes", key.label());
        }
    }

    #[test]
    fn keys_are_unique_and_sources_compose() {
        let keys = all_kernel_keys();
        let set: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(set.len(), keys.len());
        for k in &keys {
            let s = shader_source(k);
            assert!(s.starts_with(PRELUDE));
            assert!(s.contains(MATH));
            assert!(s.contains("fn main("));
        }
    }
}
