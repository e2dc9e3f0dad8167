//! The fused corrections pass on the GPU (`shaders/masks.wgsl`); mirrors `passes/corrections.rs`.
//!
//! One workgroup per sequence, all chunks in one [`Context::run`] submission: per-token
//! estimators → per-sequence reductions of every criterion's statistic (compensated sums,
//! max, LN-TRM's `W/Z`) → per-criterion keep decisions (inclusive, in f32) → reject bits per
//! token and per sequence, the modified mask and the IS weights (TIS / IcePop; batch
//! normalisation is finished on the host since it needs a batch mean). The host only unpacks
//! the results (and, for token criteria, counts the rejected fraction per sequence).
//!
//! Chunks hold whole sequences; a sequence too long for one binding falls back to the
//! reference composition (`cpu::masks::corrections_pass` on this engine's `token_stats` and
//! `segment_reduce`, which split long sequences). Every device buffer comes from the context's
//! pool, so steady-state calls allocate no device memory.

use crate::engine::passes::{check_plan, token_reject_fraction};
use crate::engine::plan::{CorrectionsRaw, MaskAgg, MaskPlan};
use crate::error::Result;
use crate::gpu::device::capabilities::loops_fit;
use crate::gpu::device::context::{result_words, Context};
use crate::gpu::device::pass::Pass;
use crate::gpu::device::pipeline::{KernelKey, Op};
use crate::gpu::ops::chunking::dispatch_grid;
use crate::gpu::ops::kernels::segment_layout;
use crate::gpu::ops::segment_reduce::mean_valid;
use crate::gpu::ops::token_stats::pack_mask;
use crate::input::batch::Segments;
use crate::input::logits::DType;
use crate::stats::{IsLevel, TokenStats};

/// Per-slot output words (7 estimators, weight, reject bits).
const TOKEN_WORDS: usize = 9;
/// Plan words per criterion.
const PLAN_WORDS: usize = 6;
/// Finite "no lower bound" sentinel (-BIG in `shaders/common/math.wgsl`).
const NO_LOWER: f32 = -3.0e38;

/// The kernel's uniform: twin of `MasksParams` in `shaders/masks.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MasksParams {
    /// Sequences in this chunk.
    pub sequences: u32,
    /// Criteria in the plan (≤ 32).
    pub criteria: u32,
    /// Slots in this chunk.
    pub slots: u32,
    /// Host columns.
    pub columns: u32,
    /// Bit 0 IS on, bit 1 sequence-level IS, bit 2 IcePop (lower bound).
    pub is_flags: u32,
    /// IS upper bound.
    pub is_upper: f32,
    /// IS lower bound (IcePop).
    pub is_lower: f32,
    /// Always 1.0: TwoSum's opaque one (`shaders/common/two_sum.wgsl`), never an IS bound.
    pub one: f32,
}

fn plan_words(plan: &MaskPlan) -> Vec<u32> {
    let mut w = Vec::with_capacity(PLAN_WORDS * plan.criteria.len().max(1));
    for c in &plan.criteria {
        let lower = c.lower.map_or(NO_LOWER, |l| l as f32);
        w.extend_from_slice(&[
            c.source.code(),
            c.source.columns().start as u32,
            c.agg.code(),
            c.agg.columns().start as u32,
            lower.to_bits(),
            (c.upper as f32).to_bits(),
        ]);
    }
    if w.is_empty() {
        w.push(0);
    }
    w
}

/// Groups whole sequences (in slot order) into chunks whose bindings fit the limit; `None`
/// when a sequence alone is too long or the sequences are not in slot order.
fn plan_chunks(
    segments: &Segments,
    slot_bytes: u64,
    max_bytes: u64,
    max_seqs: usize,
) -> Option<Vec<std::ops::Range<usize>>> {
    let fit = (max_bytes / slot_bytes.max(1)) as usize;
    let mut chunks = Vec::new();
    let mut first = 0;
    let mut prev_end = 0;
    for (s, &(a, b)) in segments.ranges().iter().enumerate() {
        if a < prev_end || b < a || b - a > fit {
            return None;
        }
        prev_end = b;
        let start = segments.ranges()[first].0;
        if s > first && (b - start > fit || s - first >= max_seqs) {
            chunks.push(first..s);
            first = s;
        }
    }
    if first < segments.len() {
        chunks.push(first..segments.len());
    }
    Some(chunks)
}

/// The masks kernel variant on `ctx` for sequences of `mean` valid tokens on average
/// ([`mean_valid`]; one thread per sequence for short ones, see
/// [`Context::segment_kernel_key`]).
pub fn kernel_key(ctx: &Context, mean: f64) -> KernelKey {
    ctx.segment_kernel_key(Op::Masks, DType::F32, mean)
}

/// The fused pass; `None` when the batch does not fit the whole-sequence chunking (the caller
/// then runs the reference composition on the GPU ops).
pub fn corrections_pass(
    ctx: &Context,
    lr: &[f64],
    segments: &Segments,
    plan: &MaskPlan,
) -> Result<Option<CorrectionsRaw>> {
    check_plan(lr, segments, plan)?;
    let n = segments.slots();
    let nseq = segments.len();
    let nc = plan.criteria.len();
    let ncol = plan.columns.len();
    let seq_words = nc + 3;
    let limits = ctx.chunk_limits();
    let slot_bytes = (4 * TOKEN_WORDS.max(ncol)) as u64;
    let max_seqs = (limits.max_binding_bytes / (4 * seq_words) as u64).max(1) as usize;
    let Some(chunks) = plan_chunks(segments, slot_bytes, limits.max_binding_bytes, max_seqs) else {
        return Ok(None);
    };
    if chunks.is_empty() {
        // no sequence: nothing to dispatch
        return crate::engine::passes::corrections_pass(
            &crate::cpu::CpuEngine::new(),
            lr,
            segments,
            plan,
        )
        .map(Some);
    }
    let mask = segments.mask();
    let kernel = ctx.kernel_for(kernel_key(ctx, mean_valid(segments)))?;
    // per sequence: two strided loops, one per sequence criterion, and one whose every
    // element runs a loop over the token criteria and one over the 7 estimators
    let longest = segments
        .ranges()
        .iter()
        .map(|&(a, b)| b - a)
        .max()
        .unwrap_or(0) as u64;
    let (per_group, stride) = segment_layout(&kernel.key);
    let per = longest.div_ceil(stride);
    if !loops_fit(
        ctx.capabilities(),
        per * (2 + nc as u64) + per * (nc as u64 + 8),
    ) {
        return Ok(None); // the reference composition (segment reductions cut into pieces)
    }
    let plan_buf = ctx.upload(bytemuck::cast_slice(&plan_words(plan)))?;
    let (flags, is_upper, is_lower) = match plan.is {
        None => (0u32, 0.0f32, 0.0f32),
        Some(is) => (
            1 | (u32::from(is.level == IsLevel::Sequence) << 1)
                | (u32::from(is.lower.is_some()) << 2),
            is.upper as f32,
            is.lower.unwrap_or(0.0) as f32,
        ),
    };
    let mut bufs = Vec::with_capacity(chunks.len());
    let mut slot_ranges = Vec::with_capacity(chunks.len());
    for ch in &chunks {
        let s0 = segments.ranges()[ch.start].0;
        let s1 = segments.ranges()[ch.end - 1].1.max(s0);
        let m = s1 - s0;
        let lr32: Vec<f32> = (s0..s1)
            .map(|i| if mask[i] { lr[i] as f32 } else { 0.0 })
            .collect();
        let bits = pack_mask(&mask[s0..s1]);
        let ranges: Vec<u32> = segments.ranges()[ch.clone()]
            .iter()
            .flat_map(|&(a, b)| [(a - s0) as u32, (b - s0) as u32])
            .collect();
        let mut cols = vec![0f32; (ncol * m).max(1)];
        for (j, c) in plan.columns.iter().enumerate() {
            for (k, i) in (s0..s1).enumerate() {
                if mask[i] {
                    cols[j * m + k] = c[i] as f32;
                }
            }
        }
        bufs.push((
            ctx.upload(bytemuck::cast_slice(&lr32))?,
            ctx.upload(bytemuck::cast_slice(&bits))?,
            ctx.upload(bytemuck::cast_slice(&ranges))?,
            ctx.upload(bytemuck::cast_slice(&cols))?,
            ctx.output((4 * TOKEN_WORDS * m.max(1)) as u64)?,
            ctx.output((4 * seq_words * ch.len()) as u64)?,
        ));
        slot_ranges.push(s0..s1);
    }
    let mut passes = Vec::with_capacity(chunks.len());
    for ((ch, sr), (l, mb, r, c, t, s)) in chunks.iter().zip(&slot_ranges).zip(&bufs) {
        let params = MasksParams {
            sequences: ch.len() as u32,
            criteria: nc as u32,
            slots: sr.len() as u32,
            columns: ncol as u32,
            is_flags: flags,
            is_upper,
            is_lower,
            one: 1.0,
        };
        let bindings = vec![
            l.into(),
            mb.into(),
            r.into(),
            (&plan_buf).into(),
            c.into(),
            t.into(),
            s.into(),
        ];
        let grid = dispatch_grid(
            ch.len().div_ceil(per_group) as u64,
            limits.max_workgroups_per_dim,
        )?;
        passes.push(Pass::new(kernel.clone(), &params, bindings, grid));
    }
    let readbacks: Vec<_> = bufs.iter().flat_map(|b| [&b.4, &b.5]).collect();
    let mut out = CorrectionsRaw {
        tokens: TokenStats {
            log_ratio: vec![0.0; n],
            rho: vec![0.0; n],
            k1: vec![0.0; n],
            k2: vec![0.0; n],
            k3: vec![0.0; n],
            abs: vec![0.0; n],
            ser: vec![0.0; n],
        },
        weights: plan.is.map(|_| vec![0.0; n]),
        mask: vec![false; n],
        token_reject: vec![0; n],
        seq_stat: vec![vec![0.0; nseq]; nc],
        seq_reject: vec![0; nseq],
        seq_log_ratio_sum: vec![0.0; nseq],
    };
    let f = |x: u32| f64::from(f32::from_bits(x));
    // per chunk: the token words, then the sequence words, read in place
    ctx.run_each(&passes, &readbacks, &mut |i, bytes| {
        let (ch, sr) = (&chunks[i / 2], &slot_ranges[i / 2]);
        let m = sr.len();
        if i % 2 == 1 {
            let sw: &[u32] = result_words(bytes, seq_words * ch.len())?;
            for (q, s) in ch.clone().enumerate() {
                let w = &sw[q * seq_words..][..seq_words];
                for (ci, st) in out.seq_stat.iter_mut().enumerate() {
                    st[s] = f(w[ci]);
                }
                out.seq_reject[s] = w[nc];
                out.seq_log_ratio_sum[s] = f(w[nc + 1]) + f(w[nc + 2]);
            }
            return Ok(());
        }
        let tw: &[u32] = result_words(bytes, TOKEN_WORDS * m)?;
        for &(a, b) in &segments.ranges()[ch.clone()] {
            for i in a..b {
                let j = i - sr.start;
                let t = &mut out.tokens;
                let dst = [
                    &mut t.log_ratio,
                    &mut t.rho,
                    &mut t.k1,
                    &mut t.k2,
                    &mut t.k3,
                    &mut t.abs,
                    &mut t.ser,
                ];
                for (c, d) in dst.into_iter().enumerate() {
                    d[i] = f(tw[c * m + j]);
                }
                if let Some(w) = &mut out.weights {
                    w[i] = f(tw[7 * m + j]);
                }
                let bits = tw[8 * m + j];
                out.token_reject[i] = bits;
                out.mask[i] = mask[i] && bits == 0;
            }
        }
        Ok(())
    })?;
    for (ci, c) in plan.criteria.iter().enumerate() {
        if c.agg == MaskAgg::Token {
            out.seq_stat[ci] = token_reject_fraction(&out.token_reject, 1 << ci, segments);
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::{MaskCriterion, MaskSource};
    use crate::gpu::ops::wgsl::{mask_codes, MASKS};
    use std::collections::BTreeSet;
    use std::mem::offset_of;

    /// Every plan variant has its generated constant at its code; the shader uses each one
    /// and selects cases by them alone; the plan words carry the same codes.
    #[test]
    fn the_shader_reads_the_codes_generated_from_the_plan_enums() {
        let codes = mask_codes();
        assert_eq!(
            codes.lines().count(),
            MaskSource::ALL.len() + MaskAgg::ALL.len()
        );
        assert!(codes.contains("const SRC_K3_VERL: u32 = 3u;\nconst SRC_ABS: u32 = 4u;"));
        assert!(codes.ends_with("const AGG_WEIGHTED_MEAN: u32 = 5u;\n"));
        let names: Vec<&str> = codes.lines().map(|l| &l[6..l.find(':').unwrap()]).collect();
        let words: BTreeSet<&str> = MASKS
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .collect();
        for name in &names {
            assert!(
                words.contains(name) && !MASKS.contains(&format!("const {name}")),
                "{name}"
            );
        }
        for (at, _) in MASKS.match_indices("case ") {
            for sel in MASKS[at + 5..].split(':').next().unwrap().split(',') {
                let sel = sel.trim();
                assert!(sel == "default" || names.contains(&sel), "case `{sel}`");
            }
        }
        let criteria = MaskSource::ALL.iter().zip(MaskAgg::ALL.iter().cycle());
        let plan = MaskPlan {
            criteria: criteria
                .map(|(&source, &agg)| MaskCriterion {
                    source,
                    agg,
                    lower: None,
                    upper: 1.0,
                })
                .collect(),
            ..MaskPlan::default()
        };
        let w = plan_words(&plan);
        for (ci, c) in plan.criteria.iter().enumerate() {
            assert_eq!(c.source, MaskSource::ALL[c.source.code() as usize]);
            assert_eq!(c.agg, MaskAgg::ALL[c.agg.code() as usize]);
            assert_eq!(
                (w[PLAN_WORDS * ci], w[PLAN_WORDS * ci + 2]),
                (c.source.code(), c.agg.code())
            );
        }
    }

    #[test]
    fn params_match_the_shader() {
        crate::gpu::device::pipeline::assert_params_layout(
            Op::Masks,
            std::mem::size_of::<MasksParams>(),
            &[
                ("sequences", offset_of!(MasksParams, sequences)),
                ("criteria", offset_of!(MasksParams, criteria)),
                ("slots", offset_of!(MasksParams, slots)),
                ("columns", offset_of!(MasksParams, columns)),
                ("is_flags", offset_of!(MasksParams, is_flags)),
                ("is_upper", offset_of!(MasksParams, is_upper)),
                ("is_lower", offset_of!(MasksParams, is_lower)),
                ("one", offset_of!(MasksParams, one)),
            ],
        );
    }
}
