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
//! and `π_y − μ_y` in f32. Host rows stream in chunks of at most [`HOST_CHUNK_BYTES`] through
//! [`UPLOAD_SLOTS`] reused buffers (at most that many chunks in flight: host memory stays bounded), one submission
//! per chunk and no wait but for a slot's previous chunk; every chunk's results come back in
//! one readback at the end.
//!
//! Accuracy: the row normaliser is a compensated (TwoSum) sum whose shift starts at the largest
//! trainer logit on S, so the terms on S recomputed by thread 0 are bitwise those of the stream
//! and the trainer tail `(s − s_S)/s` keeps tails far below f32's 1e-7 (1e-23 on real data).
//! The shader's TwoSum multiplies by an opaque uniform 1.0 ([`TopkDivergenceParams::one`]):
//! Mesa's NIR treats float ops as inexact and otherwise folds `(a + b) − a` to `b`, silently
//! turning the compensated sum into a plain one (seen on lavapipe: tails off by one ulp of 1).
//!
//! Device-resident trainer logits ([`crate::Logits::device`]) are bound in place (windows of the
//! caller's buffer covering each chunk's rows; nothing is uploaded or read back but the support,
//! the rollout log-probs and the results).
//!
//! Trainer log-probs given on S directly ([`TrainerTopk::LogProbs`]) leave nothing to stream:
//! that case runs the CPU reference.

use crate::error::{Error, Result};
use crate::gpu::device::buffers::GpuBuffer;
use crate::gpu::device::context::{result_words, Context};
use crate::gpu::device::pass::{Bind, Pass};
use crate::gpu::device::pipeline::Op;
use crate::gpu::ops::chunking::{dispatch_grid, plan_rows, window, HOST_CHUNK_BYTES, OFFSET_ALIGN};
use crate::gpu::ops::slots::{SlotRing, UPLOAD_SLOTS};
use crate::input::batch::Batch;
use crate::input::support::{prepare_support, TrainerTopk};
use crate::math::log_sum_exp;
use crate::stats::{TopkStats, TopkSupport};

/// f32 outputs per row.
const OUTPUTS: usize = 8;

/// The kernel's uniform: twin of `TopkDivergenceParams` in `shaders/topk_divergence.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TopkDivergenceParams {
    /// Rows in this dispatch.
    pub rows: u32,
    /// Vocabulary size V.
    pub vocab: u32,
    /// Support width W (K + 1).
    pub width: u32,
    /// Index of the chunk's first logits element inside binding 1.
    pub first: u32,
    /// 1 / temperature.
    pub inv_temp: f32,
    /// Always 1.0: TwoSum's opaque one (`shaders/common/two_sum.wgsl`).
    pub one: f32,
    /// Padding (the struct is 32 bytes).
    pub pad0: u32,
    /// Padding.
    pub pad1: u32,
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
    let device = logits.on_device();
    if device.is_some_and(|d| !d.is_storage()) {
        return Err(Error::input(
            "old_logits",
            "device buffer lacks BufferUsages::STORAGE: the GPU engine binds it in place",
        ));
    }
    // one strided pass over the row, two loops over the support
    let kernel = ctx.row_kernel(
        Op::TopkDivergence,
        logits.dtype(),
        (v as u64, 1, 2 * w as u64),
        &|| format!("old_logits: a row of {v} logits with a support of {w}"),
    )?;
    let limits = ctx.chunk_limits();
    let row_logits = (v * esize) as u64;
    // The largest binding per row: the logits row, the support, or the outputs.
    let row_bytes = row_logits.max((w * 4) as u64).max((OUTPUTS * 4) as u64);
    // Element indices inside a chunk must fit in u32.
    let max_rows = (u32::MAX as usize / v.max(1)).max(1);
    // Host logits: chunks of valid rows, packed, each at most `HOST_CHUNK_BYTES` of logits (one
    // row at least), streamed through UPLOAD_SLOTS reused slots with as many chunks in flight, so
    // host memory stays bounded whatever the batch (the vocabulary path's scheme). Device
    // logits: chunks of consecutive slots (a window of the caller's buffer, with room for its
    // aligned start), valid rows picked. Every chunk is submitted without a wait; the results
    // of all chunks come back in one readback at the end.
    let (total, limit) = match device {
        None => (
            rows.len(),
            limits
                .max_binding_bytes
                .min(HOST_CHUNK_BYTES.max(row_bytes))
                .saturating_sub(4),
        ),
        Some(_) => (n, limits.max_binding_bytes.saturating_sub(OFFSET_ALIGN + 4)),
    };
    let reduced = crate::gpu::ops::chunking::ChunkLimits {
        max_binding_bytes: limit,
        ..limits
    };
    let mut chunks = plan_rows(total, row_bytes, &reduced)?;
    if chunks.iter().any(|c| c.len() > max_rows) {
        chunks = (0..total)
            .step_by(max_rows)
            .map(|a| a..(a + max_rows).min(total))
            .collect();
    }
    let most = chunks.iter().map(|c| c.len()).max().unwrap_or(0) as u64;
    let slots: Vec<GpuBuffer> = match device {
        None => (0..UPLOAD_SLOTS.min(chunks.len()))
            .map(|_| ctx.upload_slot((most * row_logits).div_ceil(4) * 4))
            .collect::<Result<_>>()?,
        Some(_) => Vec::new(),
    };
    let mut ring = SlotRing::new(slots.len());
    let mut done: Vec<(Vec<usize>, GpuBuffer)> = Vec::with_capacity(chunks.len());
    for (ci, c) in chunks.iter().enumerate() {
        let (chunk_rows, r0): (Vec<usize>, usize) = match device {
            None => (rows[c.clone()].to_vec(), 0),
            Some(_) => (c.clone().filter(|&r| mask[r]).collect(), c.start),
        };
        let m = chunk_rows.len();
        if m == 0 {
            continue;
        }
        let mut ids = vec![-1i32; m * w];
        let mut roll = vec![0f32; m * w];
        let mut info = vec![0u32; m * 4];
        for (k, &r) in chunk_rows.iter().enumerate() {
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
            info[k * 4 + 3] = match device {
                None => k as u32,
                Some(_) => (r - r0) as u32,
            };
        }
        let (logits_bind, first) = match device {
            None => {
                // bounded memory: the slot's previous chunk has finished
                let slot = ring.acquire(ctx, ci)?;
                let mut parts: Vec<&[u8]> =
                    chunk_rows.iter().map(|&r| logits.row_bytes(r)).collect();
                let len: usize = parts.iter().map(|p| p.len()).sum();
                parts.push(&[0u8; 3][..len.div_ceil(4) * 4 - len]);
                ctx.write_slot(&slots[slot], &parts)?;
                (Bind::Whole(&slots[slot]), 0)
            }
            Some(d) => {
                let start = d.offset() + r0 as u64 * row_logits;
                let (offset, size, first) =
                    window(start, start + c.len() as u64 * row_logits, esize as u64);
                (
                    Bind::Device {
                        logits: d,
                        offset,
                        size,
                    },
                    first,
                )
            }
        };
        let b_ids = ctx.upload(bytemuck::cast_slice(&ids))?;
        let b_roll = ctx.upload(bytemuck::cast_slice(&roll))?;
        let b_info = ctx.upload(bytemuck::cast_slice(&info))?;
        let b_out = ctx.output((m * OUTPUTS * 4) as u64)?;
        let params = TopkDivergenceParams {
            rows: m as u32,
            vocab: v32,
            width: w32,
            first,
            inv_temp: (1.0 / temperature) as f32,
            one: 1.0,
            ..Default::default()
        };
        let bindings = vec![
            logits_bind,
            (&b_ids).into(),
            (&b_roll).into(),
            (&b_info).into(),
            (&b_out).into(),
        ];
        let grid = dispatch_grid(m as u64, limits.max_workgroups_per_dim)?;
        let sub = ctx.submit(&[Pass::new(kernel.clone(), &params, bindings, grid)])?;
        if device.is_none() {
            ring.release(ci, sub);
        }
        done.push((chunk_rows, b_out));
    }
    let outputs: Vec<&GpuBuffer> = done.iter().map(|(_, b)| b).collect();
    let results = ctx.run(&[], &outputs)?;
    for ((chunk_rows, _), bytes) in done.iter().zip(&results) {
        let m = chunk_rows.len();
        let vals: &[f32] = result_words(bytes, m * OUTPUTS)?;
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
