//! Top-K divergences on the GPU (`shaders/topk_divergence.wgsl`); mirrors
//! `cpu/topk_divergence.rs`.
//!
//! The host validates the inputs and builds the support S of every valid row exactly as the CPU
//! path does ([`prepare_support`]), computes the rollout tail `μ_tail` in f64 (it
//! depends on host data only) and uploads, per valid row, the trainer logits row in its own
//! dtype (f32, f16 or bf16, read as packed u32 words), the support ids, the rollout log-probs on
//! S (f32) and `(|S|, index of y, μ_tail)`. Invalid rows are neither uploaded nor computed, so
//! NaN or garbage there cannot leak. The kernel runs one workgroup per row: one streaming pass
//! over V computes the trainer's log-sum-exp (online max, compensated sum, deterministic tree),
//! then thread 0 gathers the trainer logits on S and forms `topk_kl`, `topk_tv`, both `ddot`s
//! and `π_y − μ_y` in f32. Rows are processed in chunks under the device's binding limit, one
//! submission per chunk.
//!
//! Accuracy: the row normaliser is a compensated (TwoSum) sum whose shift starts at the largest
//! trainer logit on S, so the terms on S recomputed by thread 0 are bitwise those of the stream
//! and the trainer tail `(s − s_S)/s` keeps tails far below f32's 1e-7 (1e-23 on real data).
//! The shader's TwoSum (the prelude's `two_sum`) multiplies by an opaque uniform 1.0
//! (`Meta::param`): Mesa's NIR treats float ops as inexact and otherwise folds `(a + b) − a` to `b`, silently turning the
//! compensated sum into a plain one (seen on lavapipe: tails off by one ulp of 1, 1.2e-7).
//!
//! Trainer log-probs given on S directly ([`TrainerTopk::LogProbs`]) leave nothing to stream:
//! that case runs the CPU reference.

use super::chunking::{dispatch_grid, plan_rows};
use super::context::{Context, Pass};
use super::pipeline::{Meta, Op};
use super::GpuEngine;
use crate::batch::{Batch, DType};
use crate::error::{Error, Result};
use crate::math::log_sum_exp;
use crate::stats::{TopkStats, TopkSupport};
use crate::support::{prepare_support, TrainerTopk};

/// f32 outputs per row.
const OUTPUTS: usize = 8;

fn dtype_code(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    }
}

impl GpuEngine {
    /// Per-slot top-K divergences (see [`crate::topk`]) with the trainer side on the GPU.
    /// Same inputs, validation and errors as [`crate::topk::topk_divergence`]; results within
    /// f32 accuracy of it.
    pub fn topk_divergence(
        &self,
        batch: &Batch,
        support: TopkSupport,
        trainer: TrainerTopk<'_>,
    ) -> Result<TopkStats> {
        topk_divergence(self.context(), batch, support, trainer)
    }
}

/// Per-slot top-K divergences on `ctx` (see [`GpuEngine::topk_divergence`]).
pub fn topk_divergence(
    ctx: &Context,
    batch: &Batch,
    support: TopkSupport,
    trainer: TrainerTopk<'_>,
) -> Result<TopkStats> {
    let prepared = prepare_support(batch, support, &trainer)?;
    let mask = batch.mask();
    let (logits, temperature) = match trainer {
        TrainerTopk::Logits {
            logits,
            temperature,
        } => (logits, temperature),
        TrainerTopk::LogProbs(_) => {
            return crate::cpu::topk_divergence(&prepared, &trainer, mask, |r| batch.position(r))
        }
    };
    let n = mask.len();
    let mut out = TopkStats::zeros(n);
    let rows: Vec<usize> = (0..n).filter(|&r| mask[r]).collect();
    if rows.is_empty() {
        return Ok(out);
    }
    let v = logits.vocab();
    let w = prepared.width;
    let esize = logits.dtype().size();
    let (Ok(v32), Ok(w32)) = (u32::try_from(v), u32::try_from(w)) else {
        return Err(Error::input(
            "old_logits",
            format!("vocabulary {v} / support width {w} too large for the GPU path"),
        ));
    };
    let kernel = ctx.kernel(Op::TopkDivergence, logits.dtype())?;
    let limits = ctx.chunk_limits();
    // The largest binding per row: the logits row, the support, or the outputs.
    let row_bytes = ((v * esize) as u64)
        .max((w * 4) as u64)
        .max((OUTPUTS * 4) as u64);
    // Element indices inside a chunk must fit in u32.
    let max_rows = (u32::MAX as usize / v.max(1)).max(1);
    let mut chunks = plan_rows(rows.len(), row_bytes, &limits)?;
    if chunks.iter().any(|c| c.len() > max_rows) {
        chunks = (0..rows.len())
            .step_by(max_rows)
            .map(|a| a..(a + max_rows).min(rows.len()))
            .collect();
    }
    for c in chunks {
        let chunk_rows = &rows[c];
        let m = chunk_rows.len();
        let mut bytes = Vec::with_capacity(m * v * esize + 4);
        let mut ids = vec![-1i32; m * w];
        let mut roll = vec![0f32; m * w];
        let mut info = vec![0u32; m * 4];
        for (k, &r) in chunk_rows.iter().enumerate() {
            bytes.extend_from_slice(logits.row_bytes(r));
            let len = prepared.len[r] as usize;
            let o = r * w;
            for j in 0..len {
                ids[k * w + j] = prepared.ids[o + j] as i32;
                roll[k * w + j] = prepared.rollout_lp[o + j] as f32;
            }
            let mu_tail = -log_sum_exp(&prepared.rollout_lp[o..o + len]).exp_m1();
            out.rollout_tail[r] = mu_tail.max(0.0);
            info[k * 4] = len as u32;
            info[k * 4 + 1] = prepared.y_index[r];
            info[k * 4 + 2] = (mu_tail as f32).to_bits();
        }
        let b_logits = ctx.upload(&bytes)?;
        let b_ids = ctx.upload(bytemuck::cast_slice(&ids))?;
        let b_roll = ctx.upload(bytemuck::cast_slice(&roll))?;
        let b_info = ctx.upload(bytemuck::cast_slice(&info))?;
        let b_out = ctx.output((m * OUTPUTS * 4) as u64)?;
        let pass = Pass {
            kernel: kernel.clone(),
            meta: Meta {
                count: m as u32,
                width: v32,
                stride: w32,
                flags: dtype_code(logits.dtype()),
                scale: (1.0 / temperature) as f32,
                // An opaque 1.0 that keeps the shader's TwoSum from being optimised away.
                param: 1.0,
                ..Meta::default()
            },
            buffers: vec![&b_logits, &b_ids, &b_roll, &b_info, &b_out],
            grid: dispatch_grid(m as u64, limits.max_workgroups_per_dim)?,
        };
        let results = ctx.run(&[pass], &[&b_out])?;
        let vals: &[f32] = bytemuck::try_cast_slice(&results[0][..m * OUTPUTS * 4])
            .map_err(|e| Error::Gpu(format!("bad result buffer: {e}")))?;
        for (k, &r) in chunk_rows.iter().enumerate() {
            let o = &vals[k * OUTPUTS..(k + 1) * OUTPUTS];
            let flags = o[7] as u32;
            if flags & 1 != 0 {
                return Err(Error::input(
                    "old_logits",
                    format!(
                        "row {}: holds NaN or +inf, or every entry is -inf",
                        batch.position(r)
                    ),
                ));
            }
            out.topk_kl[r] = if flags & 2 != 0 {
                f64::INFINITY
            } else {
                f64::from(o[0])
            };
            out.topk_tv[r] = f64::from(o[1]);
            out.ddot_aggregated[r] = f64::from(o[2]);
            out.ddot_uniform[r] = f64::from(o[3]);
            out.train_tail[r] = f64::from(o[5]);
            out.prob_diff[r] = f64::from(o[6]);
            out.support_size[r] = prepared.len[r];
        }
    }
    Ok(out)
}
