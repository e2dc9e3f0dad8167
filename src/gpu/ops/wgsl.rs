//! The WGSL texts the kernels are composed of (`shaders/`, embedded with `include_str!`): the
//! prelude, the math library, the shared snippets, the per-dtype loaders and each op's body;
//! and the count of a composed text's workgroup memory. `pipeline.rs` picks the texts per
//! kernel variant.

use crate::engine::plan::{MaskAgg, MaskSource};
use crate::error::{Error, Result};
use crate::input::logits::DType;
use std::sync::LazyLock;

/// `shaders/common/prelude.wgsl`: `WG`, `MAX_WG`, indexing helpers.
pub const PRELUDE: &str = include_str!("../../../shaders/common/prelude.wgsl");
/// `shaders/common/math.wgsl`: sentinels, k3 / w(u) / expm1 / log1p, the estimators.
pub const MATH: &str = include_str!("../../../shaders/common/math.wgsl");
/// `shaders/common/two_sum.wgsl`: TwoSum with the op's opaque `params.one`.
pub const TWO_SUM: &str = include_str!("../../../shaders/common/two_sum.wgsl");
/// `shaders/common/reduce_wg.wgsl`: workgroup-memory tree reductions.
pub const REDUCE_WG: &str = include_str!("../../../shaders/common/reduce_wg.wgsl");
/// `shaders/common/reduce_acc_wg.wgsl`: `reduce_acc`, workgroup flavour.
pub const REDUCE_ACC_WG: &str = include_str!("../../../shaders/common/reduce_acc_wg.wgsl");
/// `shaders/common/reduce_sg.wgsl`: `reduce_acc`, subgroup flavour.
pub const REDUCE_SG: &str = include_str!("../../../shaders/common/reduce_sg.wgsl");
/// `shaders/common/reduce_slots_wg.wgsl`: trees over many values per thread.
pub const REDUCE_SLOTS_WG: &str = include_str!("../../../shaders/common/reduce_slots_wg.wgsl");
/// `shaders/common/reduce_slots_row.wgsl`: `row_sync` / `row_publish` for one row per workgroup.
pub const REDUCE_SLOTS_ROW: &str = include_str!("../../../shaders/common/reduce_slots_row.wgsl");
/// `shaders/common/reduce_slots_shuffle.wgsl`: those trees' subgroup flavour (shuffles).
pub const REDUCE_SLOTS_SHUFFLE: &str =
    include_str!("../../../shaders/common/reduce_slots_shuffle.wgsl");
/// `shaders/common/reduce_slots_sg.wgsl`: a row per workgroup, the subgroups' partials merged.
pub const REDUCE_SLOTS_SG: &str = include_str!("../../../shaders/common/reduce_slots_sg.wgsl");
/// `shaders/common/reduce_slots_sg_rows.wgsl`: one subgroup per row, several rows per workgroup.
pub const REDUCE_SLOTS_SG_ROWS: &str =
    include_str!("../../../shaders/common/reduce_slots_sg_rows.wgsl");
/// `shaders/common/segments.wgsl`: a segmented kernel's walk over a sequence or piece.
pub const SEGMENTS: &str = include_str!("../../../shaders/common/segments.wgsl");
/// `shaders/common/unpack.wgsl`: f32 / f16 / bf16 decoders of packed words.
pub const UNPACK: &str = include_str!("../../../shaders/common/unpack.wgsl");
pub(in crate::gpu) const TOKEN_STATS: &str = include_str!("../../../shaders/token_stats.wgsl");
pub(in crate::gpu) const MASKS: &str = include_str!("../../../shaders/masks.wgsl");
/// The masks kernel's `SRC_*` / `AGG_*` constants, generated from [`MaskSource::ALL`] and
/// [`MaskAgg::ALL`] (`K3Verl` → `const SRC_K3_VERL: u32 = 3u;`): `shaders/masks.wgsl` names
/// them, never their numbers.
pub(in crate::gpu) fn mask_codes() -> &'static str {
    static CODES: LazyLock<String> = LazyLock::new(|| {
        let srcs = MaskSource::ALL.map(|s| (format!("SRC_{}", wgsl_name(&s)), s.code()));
        let aggs = MaskAgg::ALL.map(|a| (format!("AGG_{}", wgsl_name(&a)), a.code()));
        let line = |(name, code): &(String, u32)| format!("const {name}: u32 = {code}u;\n");
        srcs.iter().chain(&aggs).map(line).collect()
    });
    &CODES
}

/// A variant's name in WGSL's constant case: `SerWeighted(0)` → `SER_WEIGHTED`.
fn wgsl_name(v: &impl std::fmt::Debug) -> String {
    let name = format!("{v:?}");
    let mut out = String::new();
    for ch in name.chars().take_while(|&c| c != '(') {
        if ch.is_ascii_uppercase() && !out.is_empty() {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

pub(in crate::gpu) const SEGMENT_REDUCE: &str =
    include_str!("../../../shaders/segment_reduce.wgsl");
pub(in crate::gpu) const TOPK_DIVERGENCE: &str =
    include_str!("../../../shaders/topk_divergence.wgsl");
pub(in crate::gpu) const VOCAB_DIVERGENCE: &str =
    include_str!("../../../shaders/vocab_divergence.wgsl");

/// `load_a(e)` over binding 1 in `dtype`.
pub(in crate::gpu) fn load_a(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => include_str!("../../../shaders/common/load_a_f32.wgsl"),
        DType::F16 => include_str!("../../../shaders/common/load_a_f16_packed.wgsl"),
        DType::BF16 => include_str!("../../../shaders/common/load_a_bf16_packed.wgsl"),
    }
}

/// `load_b(e)` over binding 2 in `dtype`.
pub(in crate::gpu) fn load_b(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => include_str!("../../../shaders/common/load_b_f32.wgsl"),
        DType::F16 => include_str!("../../../shaders/common/load_b_f16_packed.wgsl"),
        DType::BF16 => include_str!("../../../shaders/common/load_b_bf16_packed.wgsl"),
    }
}

/// The vocabulary kernel's entry point for whole rows.
pub(in crate::gpu) const VOCAB_ROW_MAIN: &str =
    include_str!("../../../shaders/common/vocab_row_main.wgsl");
/// The vocabulary kernel's split variant: its entry point and phases over slices.
pub(in crate::gpu) const VOCAB_SPLIT: &str =
    include_str!("../../../shaders/common/vocab_split.wgsl");

/// `load8_a` / `load8_b` (eight elements) from `load_a` / `load_b`, for rows of any alignment.
pub(in crate::gpu) const LOAD8_NARROW: &str =
    include_str!("../../../shaders/common/load8_narrow.wgsl");

/// `load_a(e)` and `load8_a(e, last)` over binding 1 in `dtype`, read as `vec4<u32>` (the
/// vocabulary kernel's `WIDE` variant).
pub(in crate::gpu) fn load_a_wide(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => include_str!("../../../shaders/common/load_a_f32_wide.wgsl"),
        DType::F16 => include_str!("../../../shaders/common/load_a_f16_wide.wgsl"),
        DType::BF16 => include_str!("../../../shaders/common/load_a_bf16_wide.wgsl"),
    }
}

/// `load_b(e)` and `load8_b(e, last)` over binding 2 in `dtype`, read as `vec4<u32>`.
pub(in crate::gpu) fn load_b_wide(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => include_str!("../../../shaders/common/load_b_f32_wide.wgsl"),
        DType::F16 => include_str!("../../../shaders/common/load_b_f16_wide.wgsl"),
        DType::BF16 => include_str!("../../../shaders/common/load_b_bf16_wide.wgsl"),
    }
}

/// Bytes of workgroup memory the composed kernel `src` (named `label`) uses from its entry
/// point: every `var<workgroup>` it reaches, each rounded up to 16 bytes as WebGPU counts.
pub fn workgroup_storage_bytes(label: &str, src: &str, entry_point: &str) -> Result<u64> {
    let err = |message: String| Error::ShaderCompile {
        kernel: label.to_string(),
        message,
    };
    let module = naga::front::wgsl::parse_str(src).map_err(|e| err(e.emit_to_string(src)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| err(e.emit_to_string(src)))?;
    let ep = module
        .entry_points
        .iter()
        .position(|e| e.name == entry_point)
        .ok_or_else(|| err(format!("no entry point `{entry_point}`")))?;
    let used = info.get_entry_point(ep);
    Ok(module
        .global_variables
        .iter()
        .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !used[*h].is_empty())
        .map(|(_, g)| u64::from(module.types[g.ty].inner.size(module.to_ctx())).div_ceil(16) * 16)
        .sum())
}
