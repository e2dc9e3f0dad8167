//! Per-token estimators on the GPU (`shaders/token_stats.wgsl`); mirrors `cpu/token_stats.rs`.
//!
//! Precision choice: the host computes `lr = train − roll` in f64 and rounds it once to f32
//! for upload, instead of uploading both log-probs in f32 and subtracting on the device. Log-probs
//! near −10 carry only ~1e-6 absolute precision in f32, which would swamp k3 ≈ lr²/2 for
//! |lr| ≲ 1e-3; the rounded difference keeps a relative error of 6e-8 at every |lr|. Invalid
//! slots are neither read nor uploaded (they go up as 0 with a cleared mask bit), so NaN or
//! garbage there cannot leak. Everything else (clamp, exp, k1…ser) runs in f32 on the device;
//! results are widened back to f64.

use crate::error::{Error, Result};
use crate::gpu::device::context::{result_words, Context};
use crate::gpu::device::pass::Pass;
use crate::gpu::device::pipeline::Op;
use crate::gpu::ops::chunking::{dispatch_grid, plan_rows};
use crate::input::logits::DType;
use crate::stats::TokenStats;

/// The kernel's uniform: twin of `TokenStatsParams` in `shaders/token_stats.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TokenStatsParams {
    /// Slots in this chunk.
    pub slots: u32,
    /// Padding (the struct is 16 bytes).
    pub pad0: u32,
    /// Padding.
    pub pad1: u32,
    /// Padding.
    pub pad2: u32,
}

/// Number of per-slot outputs (log_ratio, rho, k1, k2, k3, abs, ser).
const OUTPUTS: usize = 7;

/// Packs `mask[range]` into u32 words, 32 slots per word (bit i%32 of word i/32).
pub(crate) fn pack_mask(mask: &[bool]) -> Vec<u32> {
    let mut words = vec![0u32; mask.len().div_ceil(32).max(1)];
    for (i, &m) in mask.iter().enumerate() {
        if m {
            words[i / 32] |= 1 << (i % 32);
        }
    }
    words
}

/// Per-token estimators of KL(π_roll‖π_train); see [`TokenStats`].
pub fn token_stats(
    ctx: &Context,
    rollout: &[f64],
    train: &[f64],
    mask: &[bool],
) -> Result<TokenStats> {
    let n = mask.len();
    for (name, v) in [("rollout_log_prob", rollout), ("train_log_prob", train)] {
        if v.len() != n {
            return Err(Error::input(
                name,
                format!("has {} values but the mask has {n} slots", v.len()),
            ));
        }
    }
    let mut out = TokenStats {
        log_ratio: vec![0.0; n],
        rho: vec![0.0; n],
        k1: vec![0.0; n],
        k2: vec![0.0; n],
        k3: vec![0.0; n],
        abs: vec![0.0; n],
        ser: vec![0.0; n],
    };
    if n == 0 {
        return Ok(out);
    }
    let kernel = ctx.kernel(Op::TokenStats, DType::F32)?;
    let wg = u64::from(kernel.key.workgroup);
    let limits = ctx.chunk_limits();
    // The output binding (7 f32 per slot) is the largest.
    let chunks = plan_rows(n, (OUTPUTS * 4) as u64, &limits)?;
    let mut inputs = Vec::with_capacity(chunks.len());
    let mut outputs = Vec::with_capacity(chunks.len());
    for c in &chunks {
        let lr: Vec<f32> = c
            .clone()
            .map(|i| {
                if mask[i] {
                    (train[i] - rollout[i]) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let bits = pack_mask(&mask[c.clone()]);
        inputs.push((
            ctx.upload(bytemuck::cast_slice(&lr))?,
            ctx.upload(bytemuck::cast_slice(&bits))?,
        ));
        outputs.push(ctx.output((c.len() * OUTPUTS * 4) as u64)?);
    }
    let mut passes = Vec::with_capacity(chunks.len());
    for ((c, (lr, bits)), o) in chunks.iter().zip(&inputs).zip(&outputs) {
        let len = c.len() as u64;
        let params = TokenStatsParams {
            slots: len as u32,
            ..Default::default()
        };
        passes.push(Pass::new(
            kernel.clone(),
            &params,
            vec![lr.into(), bits.into(), o.into()],
            dispatch_grid(len.div_ceil(wg), limits.max_workgroups_per_dim)?,
        ));
    }
    let readbacks: Vec<_> = outputs.iter().collect();
    ctx.run_each(&passes, &readbacks, &mut |i, bytes| {
        let c = &chunks[i];
        let vals: &[f32] = result_words(bytes, c.len() * OUTPUTS)?;
        let m = c.len();
        let dst = [
            &mut out.log_ratio,
            &mut out.rho,
            &mut out.k1,
            &mut out.k2,
            &mut out.k3,
            &mut out.abs,
            &mut out.ser,
        ];
        for (k, d) in dst.into_iter().enumerate() {
            for (x, &v) in d[c.clone()].iter_mut().zip(&vals[k * m..(k + 1) * m]) {
                *x = f64::from(v);
            }
        }
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn params_match_the_shader() {
        crate::gpu::device::pipeline::assert_params_layout(
            Op::TokenStats,
            std::mem::size_of::<TokenStatsParams>(),
            &[
                ("slots", offset_of!(TokenStatsParams, slots)),
                ("pad0", offset_of!(TokenStatsParams, pad0)),
                ("pad1", offset_of!(TokenStatsParams, pad1)),
                ("pad2", offset_of!(TokenStatsParams, pad2)),
            ],
        );
    }
}
