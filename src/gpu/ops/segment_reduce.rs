//! Segmented per-sequence reductions on the GPU (`shaders/segment_reduce.wgsl`); mirrors
//! `cpu/segment_reduce.rs`.
//!
//! One workgroup per (statistic, sequence), a deterministic tree (no float atomics), or for
//! short sequences one thread per (statistic, sequence) in slot order (the `SERIAL` variant);
//! all statistics in one submission. Sums are compensated on the device (TwoSum, returned as an
//! f32 (hi, lo) pair added in f64 on the host), so the only error left is the rounding of the
//! inputs to f32. [`SegmentReduceParams::one`] is the opaque 1.0 that keeps the shader compiler
//! from folding TwoSum's error term away (tests/gpu/gpu_vs_cpu.rs `segment_sums_are_compensated`).
//! A sequence longer than one chunk is cut into pieces whose partial results are merged on the
//! host in order (ties keep the first maximum).

use crate::error::{Error, Result};
use crate::gpu::device::capabilities::LOOP_MARGIN;
use crate::gpu::device::context::{result_words, Context};
use crate::gpu::device::pass::Pass;
use crate::gpu::device::pipeline::{KernelKey, Op};
use crate::gpu::ops::chunking::{dispatch_grid, plan_segments};
use crate::gpu::ops::kernels::segment_layout;
use crate::gpu::ops::token_stats::pack_mask;
use crate::input::batch::Segments;
use crate::input::logits::DType;
use crate::stats::SegmentStats;

/// The kernel's uniform: twin of `SegmentReduceParams` in `shaders/segment_reduce.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SegmentReduceParams {
    /// Pieces in this chunk.
    pub pieces: u32,
    /// Statistics (rows of the values binding).
    pub stats: u32,
    /// Slots in this chunk (the row stride of the values binding).
    pub slots: u32,
    /// Always 1.0: TwoSum's opaque one (`shaders/common/two_sum.wgsl`).
    pub one: f32,
}

/// Output words per (statistic, piece).
const WORDS: usize = 6;

/// Valid tokens per sequence on average: what the segmented kernels size their workgroups by
/// (the same for a padded and a packed layout of one batch, so padding never changes a result).
pub fn mean_valid(segments: &Segments) -> f64 {
    let valid = segments.mask().iter().filter(|&&m| m).count();
    valid as f64 / segments.len().max(1) as f64
}

/// The segment-reduce kernel variant on `ctx` for segments of `mean` valid tokens on average
/// ([`mean_valid`]).
pub fn kernel_key(ctx: &Context, mean: f64) -> KernelKey {
    ctx.segment_kernel_key(Op::SegmentReduce, DType::F32, mean)
}

/// Sum, mean, max, min, argmax and count of each of `values` over the valid slots of every
/// sequence; see [`SegmentStats`].
pub fn segment_reduce(
    ctx: &Context,
    values: &[&[f64]],
    segments: &Segments,
) -> Result<Vec<SegmentStats>> {
    let slots = segments.slots();
    for (k, v) in values.iter().enumerate() {
        if v.len() != slots {
            return Err(Error::input(
                format!("values[{k}]"),
                format!("has {} values but the batch has {slots} slots", v.len()),
            ));
        }
    }
    for (s, &(a, b)) in segments.ranges().iter().enumerate() {
        if a > slots || b > slots {
            return Err(Error::input(
                "segments",
                format!("sequence {s} spans slots {a}..{b} beyond the {slots} slots"),
            ));
        }
    }
    let nseq = segments.len();
    let mut out: Vec<SegmentStats> = values
        .iter()
        .map(|_| SegmentStats {
            sum: vec![0.0; nseq],
            mean: vec![0.0; nseq],
            max: vec![0.0; nseq],
            min: vec![0.0; nseq],
            argmax: vec![-1; nseq],
            count: vec![0; nseq],
        })
        .collect();
    let k = values.len();
    if k == 0 || nseq == 0 {
        return Ok(out);
    }
    let kernel = ctx.kernel_for(kernel_key(ctx, mean_valid(segments)))?;
    let mut limits = ctx.chunk_limits();
    let (per_group, stride) = segment_layout(&kernel.key);
    if let Some(max) = ctx.capabilities().loop_iterations {
        // one loop over a piece, strided or serial: cut longer sequences into pieces that fit
        // the loop budget (merged on the host like pieces cut for the binding size)
        let slots = max.saturating_sub(LOOP_MARGIN) * stride;
        limits.max_binding_bytes = limits.max_binding_bytes.min(slots * (4 * k) as u64);
    }
    let plan = plan_segments(
        segments.ranges(),
        (4 * k) as u64,
        (4 * WORDS * k) as u64,
        &limits,
    )?;
    let mut bufs = Vec::with_capacity(plan.len());
    for chunk in &plan {
        let m = chunk.slots;
        let mut vals = vec![0f32; k * m];
        let mut mask = Vec::with_capacity(m);
        let mut ranges = Vec::with_capacity(2 * chunk.pieces.len());
        for p in &chunk.pieces {
            let at = mask.len();
            for i in p.slots.clone() {
                let valid = segments.mask()[i];
                let j = mask.len();
                mask.push(valid);
                if valid {
                    for (s, v) in values.iter().enumerate() {
                        vals[s * m + j] = v[i] as f32;
                    }
                }
            }
            ranges.push(at as u32);
            ranges.push(mask.len() as u32);
        }
        let bits = pack_mask(&mask);
        bufs.push((
            ctx.upload(bytemuck::cast_slice(&vals))?,
            ctx.upload(bytemuck::cast_slice(&bits))?,
            ctx.upload(bytemuck::cast_slice(&ranges))?,
            ctx.output((4 * WORDS * k * chunk.pieces.len()) as u64)?,
        ));
    }
    let mut passes = Vec::with_capacity(plan.len());
    for (chunk, (v, m, r, o)) in plan.iter().zip(&bufs) {
        let params = SegmentReduceParams {
            pieces: chunk.pieces.len() as u32,
            stats: k as u32,
            slots: chunk.slots as u32,
            one: 1.0,
        };
        passes.push(Pass::new(
            kernel.clone(),
            &params,
            vec![v.into(), m.into(), r.into(), o.into()],
            dispatch_grid(
                (chunk.pieces.len().div_ceil(per_group) * k) as u64,
                limits.max_workgroups_per_dim,
            )?,
        ));
    }
    let readbacks: Vec<_> = bufs.iter().map(|b| &b.3).collect();
    ctx.run_each(&passes, &readbacks, &mut |i, bytes| {
        let chunk = &plan[i];
        let np = chunk.pieces.len();
        let words: &[u32] = result_words(bytes, WORDS * k * np)?;
        for (s, st) in out.iter_mut().enumerate() {
            for (pi, p) in chunk.pieces.iter().enumerate() {
                let w = &words[(s * np + pi) * WORDS..][..WORDS];
                let cnt = w[5];
                if cnt == 0 {
                    continue;
                }
                let q = p.seq;
                let f = |x: u32| f64::from(f32::from_bits(x));
                let (mx, mn) = (f(w[2]), f(w[3]));
                let arg = (p.slots.start - segments.ranges()[q].0) as i64 + i64::from(w[4]);
                if st.count[q] == 0 || mx > st.max[q] {
                    st.max[q] = mx;
                    st.argmax[q] = arg;
                }
                if st.count[q] == 0 || mn < st.min[q] {
                    st.min[q] = mn;
                }
                // an infinite value makes the compensation term NaN (∞ − ∞ in two_sum) while
                // the sum itself is ±∞: the CPU reference's sum (and mean) is then that ∞
                let (hi, lo) = (f(w[0]), f(w[1]));
                st.sum[q] += if hi.is_finite() { hi + lo } else { hi };
                st.count[q] += cnt;
            }
        }
        Ok(())
    })?;
    for st in &mut out {
        for q in 0..nseq {
            if st.count[q] > 0 {
                st.mean[q] = st.sum[q] / f64::from(st.count[q]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn params_match_the_shader() {
        crate::gpu::device::pipeline::assert_params_layout(
            Op::SegmentReduce,
            std::mem::size_of::<SegmentReduceParams>(),
            &[
                ("pieces", offset_of!(SegmentReduceParams, pieces)),
                ("stats", offset_of!(SegmentReduceParams, stats)),
                ("slots", offset_of!(SegmentReduceParams, slots)),
                ("one", offset_of!(SegmentReduceParams, one)),
            ],
        );
    }
}
