//! Exact vocabulary divergences on the GPU (`shaders/vocab_divergence.wgsl`); mirrors
//! `cpu/vocab_divergence.rs` (same decomposition, f32 on the device, see the shader's header).
//!
//! One workgroup per row. Logits travel as their raw bytes (u32 words, 16-bit types packed two
//! per word, odd byte counts padded), never widened on the host. Rows are split into chunks
//! whose bindings fit the device limit ([`plan_rows`]); each binding is a window of its buffer
//! starting at a 256-byte aligned offset, and `Meta` tells the kernel where the chunk starts
//! inside it. Host logits are uploaded chunk by chunk into two alternating slots, one submit
//! per chunk, so the upload of chunk i+1 overlaps the compute of chunk i; logits already on the
//! device ([`vocab_divergence_device`]) are bound in place, all chunks in one submit.

use super::buffers::{BufferKind, GpuBuffer};
use super::chunking::{dispatch_grid, plan_rows, ChunkLimits, OFFSET_ALIGN};
use super::context::Context;
use super::pipeline::{BindingKind, Flavour, KernelKey, Meta, Op, OpSpec, META_SIZE};
use crate::batch::DType;
use crate::batch::Logits;
use crate::cpu::{check_vocab_inputs, first_bad_logit};
use crate::error::{Error, Result};
use crate::stats::VocabStats;
use std::num::NonZeroU64;

/// `row_info` value of an invalid (masked) slot.
pub const ROW_MASKED: u32 = u32::MAX;
/// f32 results per row: kl, kl_rev, tv, h_p, h_q, logp, logq, flags.
pub const RESULTS_PER_ROW: usize = 8;

/// The kernel's description for the pipeline cache: one variant per (rollout dtype =
/// `key.dtype`, trainer dtype = the op's) pair, composed from the per-role loaders.
pub static VOCAB_DIVERGENCE_SPEC: OpSpec = OpSpec {
    name: "vocab_divergence",
    body: include_str!("../../shaders/vocab_divergence.wgsl"),
    snippets: vocab_snippets,
    bindings: &[
        BindingKind::ReadOnly { min_bytes: 4 },
        BindingKind::ReadOnly { min_bytes: 4 },
        BindingKind::ReadOnly { min_bytes: 4 },
        BindingKind::ReadWrite {
            min_bytes: (RESULTS_PER_ROW * 4) as u64,
        },
    ],
    dtypes: &[DType::F32, DType::F16, DType::BF16],
    flavours: &[Flavour::Workgroup],
    default_workgroup: 256,
};

fn vocab_snippets(key: &KernelKey) -> Vec<&'static str> {
    let train = match key.op {
        Op::VocabDivergence(d) => d,
        _ => DType::F32,
    };
    let load_a = match key.dtype {
        DType::F32 => include_str!("../../shaders/common/load_a_f32.wgsl"),
        DType::F16 => include_str!("../../shaders/common/load_a_f16_packed.wgsl"),
        DType::BF16 => include_str!("../../shaders/common/load_a_bf16_packed.wgsl"),
    };
    let load_b = match train {
        DType::F32 => include_str!("../../shaders/common/load_b_f32.wgsl"),
        DType::F16 => include_str!("../../shaders/common/load_b_f16_packed.wgsl"),
        DType::BF16 => include_str!("../../shaders/common/load_b_bf16_packed.wgsl"),
    };
    vec![
        include_str!("../../shaders/common/unpack.wgsl"),
        include_str!("../../shaders/common/lse.wgsl"),
        load_a,
        load_b,
    ]
}

const F_KL_INF: u32 = 1;
const F_KLR_INF: u32 = 2;
const F_LP_NEGINF: u32 = 4;
const F_LQ_NEGINF: u32 = 8;
const F_A_BAD: u32 = 16;
const F_B_BAD: u32 = 32;
const F_A_EMPTY: u32 = 64;
const F_B_EMPTY: u32 = 128;

/// Where the two logits tensors come from.
enum Source<'a> {
    /// Host bytes, uploaded chunk by chunk (double-buffered).
    Host {
        rollout: &'a Logits,
        train: &'a Logits,
    },
    /// Tensors already on the device (zero copy).
    Device {
        rollout: &'a wgpu::Buffer,
        train: &'a wgpu::Buffer,
    },
}

fn ceil4(x: u64) -> u64 {
    x.div_ceil(4) * 4
}

/// A binding window `[offset, offset + size)` covering bytes `[first, end)` with a
/// `OFFSET_ALIGN`-aligned offset, and the index (in `elem`-byte units) of `first` inside it.
fn window(first: u64, end: u64, elem: u64) -> (u64, u64, u32) {
    let off = first / OFFSET_ALIGN * OFFSET_ALIGN;
    (off, ceil4(end) - off, ((first - off) / elem) as u32)
}

fn binding(buf: &wgpu::Buffer, off: u64, size: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: buf,
        offset: off,
        size: NonZeroU64::new(size),
    })
}

/// Largest upload of host logits per tensor per chunk (bytes, including the 4-byte pad). Host
/// logits stream through two alternating slots per tensor and at most two chunks are in flight,
/// so the GPU path holds about `4 · HOST_CHUNK_BYTES` of logits (slots) plus as much in wgpu's
/// upload staging, whatever the input size (one row is always allowed, even if larger).
pub const HOST_CHUNK_BYTES: u64 = 8 << 20;

/// Chunks of host rows: `plan` with every logits chunk at most [`HOST_CHUNK_BYTES`] per
/// tensor (or one row, if a row is larger). Per-row results do not depend on the chunking.
pub fn plan_host(
    rows: usize,
    vocab: usize,
    da: DType,
    db: DType,
    limits: &ChunkLimits,
) -> Result<Vec<std::ops::Range<usize>>> {
    let row = (vocab * da.size().max(db.size())) as u64;
    // a chunk of n rows uploads ceil4(n·row) + 4 bytes per tensor; the binding slack is
    // OFFSET_ALIGN + 4 (see `plan`)
    let cap = HOST_CHUNK_BYTES.saturating_sub(8).max(row) + OFFSET_ALIGN + 4;
    let host = ChunkLimits {
        max_binding_bytes: limits.max_binding_bytes.min(cap),
        ..*limits
    };
    plan(rows, vocab, da, db, &host)
}

/// Chunks of rows whose every binding (logits windows, row_info, results) fits the limit
/// after aligning its offset down.
fn plan(
    rows: usize,
    vocab: usize,
    da: DType,
    db: DType,
    limits: &ChunkLimits,
) -> Result<Vec<std::ops::Range<usize>>> {
    let row_bytes = [
        (vocab * da.size()) as u64,
        (vocab * db.size()) as u64,
        (RESULTS_PER_ROW * 4) as u64,
    ]
    .into_iter()
    .max()
    .unwrap_or(4);
    let slack = OFFSET_ALIGN + 4;
    let reduced = ChunkLimits {
        max_binding_bytes: limits.max_binding_bytes.saturating_sub(slack),
        ..*limits
    };
    plan_rows(rows, row_bytes, &reduced)
}

/// Runs the kernel over all rows; returns the raw per-row results (8 f32 per row).
#[allow(clippy::too_many_arguments)]
fn run(
    ctx: &Context,
    src: &Source<'_>,
    (da, db): (DType, DType),
    rows: usize,
    vocab: usize,
    info: &[u32],
    has_responses: bool,
    inv_temp: f32,
) -> Result<Vec<f32>> {
    if rows == 0 {
        return Ok(Vec::new());
    }
    let kernel = ctx.kernel(Op::VocabDivergence(db), da)?;
    let limits = ctx.chunk_limits();
    let chunks = match src {
        Source::Host { .. } => plan_host(rows, vocab, da, db, &limits)?,
        Source::Device { .. } => plan(rows, vocab, da, db, &limits)?,
    };
    let (sa, sb) = (da.size() as u64, db.size() as u64);
    let v = vocab as u64;
    if let Source::Device { rollout, train } = src {
        for (name, b, s) in [("rollout_logits", rollout, sa), ("old_logits", train, sb)] {
            if b.size() < ceil4(rows as u64 * v * s) {
                return Err(Error::input(
                    name,
                    format!(
                        "device buffer of {} bytes is smaller than [{rows}, {vocab}] {} values",
                        b.size(),
                        if s == 4 { "4-byte" } else { "2-byte" }
                    ),
                ));
            }
        }
    }
    let dev = ctx.device();
    let queue = ctx.queue();
    let ualign = u64::from(ctx.capabilities().uniform_offset_alignment.max(4));
    let ustride = META_SIZE.div_ceil(ualign) * ualign;
    let out_bytes = (RESULTS_PER_ROW * 4 * rows) as u64;
    let pool = ctx.pool();
    ctx.scoped(|| {
        let info_buf = pool.get(dev, BufferKind::Storage, 4 * rows as u64)?;
        queue.write_buffer(info_buf.raw(), 0, bytemuck::cast_slice(info));
        let out_buf = pool.get(dev, BufferKind::Storage, out_bytes)?;
        let staging = pool.get(dev, BufferKind::Staging, out_bytes)?;
        let uniforms = pool.get(dev, BufferKind::Uniform, ustride * chunks.len() as u64)?;
        let max_rows = chunks.iter().map(|c| c.len()).max().unwrap_or(0) as u64;
        let slots: Vec<[GpuBuffer; 2]> = match src {
            Source::Host { .. } => (0..2)
                .map(|_| -> Result<[GpuBuffer; 2]> {
                    Ok([
                        pool.get(dev, BufferKind::Storage, ceil4(max_rows * v * sa) + 4)?,
                        pool.get(dev, BufferKind::Storage, ceil4(max_rows * v * sb) + 4)?,
                    ])
                })
                .collect::<Result<_>>()?,
            Source::Device { .. } => Vec::new(),
        };
        let mut metas = vec![0u8; (ustride as usize) * chunks.len()];
        let mut windows = Vec::with_capacity(chunks.len());
        for (ci, ch) in chunks.iter().enumerate() {
            let (r0, r1) = (ch.start as u64, ch.end as u64);
            let tensor = |s: u64| match src {
                Source::Device { .. } => window(r0 * v * s, r1 * v * s, s),
                Source::Host { .. } => {
                    let (first, end) = (r0 * v * s, r1 * v * s);
                    let start = first / 4 * 4;
                    (0, ceil4(end) - start, ((first - start) / s) as u32)
                }
            };
            let (a, b) = (tensor(sa), tensor(sb));
            let info_w = window(4 * r0, 4 * r1, 4);
            let unit = (RESULTS_PER_ROW * 4) as u64;
            let out_w = window(unit * r0, unit * r1, unit);
            debug_assert_eq!(out_w.2, info_w.2 % 8);
            let meta = Meta {
                count: ch.len() as u32,
                width: vocab as u32,
                stride: a.2,
                flags: has_responses as u32,
                scale: inv_temp,
                param: 0.0,
                extra0: b.2,
                extra1: info_w.2,
            };
            metas[ci * ustride as usize..][..META_SIZE as usize]
                .copy_from_slice(bytemuck::bytes_of(&meta));
            windows.push((a, b, info_w, out_w));
        }
        queue.write_buffer(uniforms.raw(), 0, &metas);
        let new_encoder = || {
            dev.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("trmask vocab_divergence"),
            })
        };
        let mut enc = new_encoder();
        let mut submitted: Vec<wgpu::SubmissionIndex> = Vec::new();
        for (ci, ch) in chunks.iter().enumerate() {
            let (a, b, info_w, out_w) = windows[ci];
            let (abuf, bbuf): (&wgpu::Buffer, &wgpu::Buffer) = match src {
                Source::Device { rollout, train } => (rollout, train),
                Source::Host { rollout, train } => {
                    // bounded memory: at most two chunks (and their upload staging) in flight
                    if ci >= 2 {
                        dev.poll(wgpu::PollType::Wait {
                            submission_index: Some(submitted[ci - 2].clone()),
                            timeout: None,
                        })
                        .map_err(|e| Error::Gpu(format!("waiting for the device: {e}")))?;
                    }
                    let slot = &slots[ci % 2];
                    for (l, buf) in [(rollout, &slot[0]), (train, &slot[1])] {
                        let s = l.dtype().size();
                        let bytes = l.bytes();
                        let (first, end) = (ch.start * vocab * s, ch.end * vocab * s);
                        let start = first / 4 * 4;
                        let full = (end - start) / 4 * 4;
                        queue.write_buffer(buf.raw(), 0, &bytes[start..start + full]);
                        if start + full < end {
                            let mut tail = [0u8; 4];
                            tail[..end - start - full].copy_from_slice(&bytes[start + full..end]);
                            queue.write_buffer(buf.raw(), full as u64, &tail);
                        }
                    }
                    (slot[0].raw(), slot[1].raw())
                }
            };
            let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("trmask vocab_divergence"),
                layout: &kernel.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: binding(uniforms.raw(), ci as u64 * ustride, META_SIZE),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: binding(abuf, a.0, a.1),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: binding(bbuf, b.0, b.1),
                    },
                    wgpu::BindGroupEntry {
                        binding: 3,
                        resource: binding(info_buf.raw(), info_w.0, info_w.1),
                    },
                    wgpu::BindGroupEntry {
                        binding: 4,
                        resource: binding(out_buf.raw(), out_w.0, out_w.1),
                    },
                ],
            });
            let grid = dispatch_grid(ch.len() as u64, limits.max_workgroups_per_dim)?;
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("trmask vocab_divergence"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&kernel.pipeline);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(grid.0, grid.1, 1);
            }
            if let Source::Host { .. } = src {
                // one submit per chunk: the next chunk's upload overlaps this compute
                submitted.push(queue.submit([std::mem::replace(&mut enc, new_encoder()).finish()]));
            }
        }
        enc.copy_buffer_to_buffer(out_buf.raw(), 0, staging.raw(), 0, ceil4(out_bytes));
        let index = queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        let slice = staging.raw().slice(0..ceil4(out_bytes));
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        // Another thread polling the same device may run our callback: wait for it, polling.
        let mut waited = dev
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::Gpu(format!("waiting for the device: {e}")));
        let mapped = loop {
            if let Err(e) = waited {
                break Err(e);
            }
            match rx.recv_timeout(std::time::Duration::from_millis(5)) {
                Ok(r) => break r.map_err(|e| Error::Gpu(format!("mapping results: {e}"))),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    waited = dev
                        .poll(wgpu::PollType::Poll)
                        .map(|_| ())
                        .map_err(|e| Error::Gpu(format!("waiting for the device: {e}")));
                }
                Err(e) => break Err(Error::Gpu(format!("mapping results: {e}"))),
            }
        };
        if let Err(e) = mapped {
            staging.discard(); // possibly still mapped: never back into the pool
            return Err(e);
        }
        let out = slice
            .get_mapped_range()
            .map(|view| bytemuck::pod_collect_to_vec::<u8, f32>(&view[..out_bytes as usize]));
        staging.raw().unmap();
        out.map_err(|e| Error::Gpu(format!("reading results: {e}")))
    })
}

/// The per-row `row_info` words: the sampled id of each valid slot, [`ROW_MASKED`] elsewhere.
pub fn row_info(responses: Option<&[i64]>, mask: &[bool]) -> Vec<u32> {
    mask.iter()
        .enumerate()
        .map(|(r, &m)| match (m, responses) {
            (false, _) => ROW_MASKED,
            (true, Some(ids)) => ids[r] as u32,
            (true, None) => 0,
        })
        .collect()
}

/// Turns raw kernel results into [`VocabStats`], or the error the CPU path would give.
/// `host` gives the logits for error messages naming the column of a bad value.
pub fn finish_vocab_stats(
    raw: &[f32],
    rows: usize,
    host: Option<(&Logits, &Logits)>,
) -> Result<VocabStats> {
    let mut s = VocabStats {
        kl: vec![0.0; rows],
        kl_rev: vec![0.0; rows],
        tv: vec![0.0; rows],
        rollout_entropy: vec![0.0; rows],
        training_entropy: vec![0.0; rows],
        rollout_logp: vec![0.0; rows],
        train_logp: vec![0.0; rows],
    };
    for r in 0..rows {
        let o = &raw[RESULTS_PER_ROW * r..][..RESULTS_PER_ROW];
        let flags = o[7] as u32;
        for (bit, name, k) in [(F_A_BAD, "rollout_logits", 0), (F_B_BAD, "old_logits", 1)] {
            if flags & bit != 0 {
                let what = match host {
                    Some(ls) => {
                        let l = if k == 0 { ls.0 } else { ls.1 };
                        match first_bad_logit(l, r) {
                            Some((i, e)) => format!("value {e} at row {r}, column {i}"),
                            None => format!("NaN or +inf at row {r}"),
                        }
                    }
                    None => format!("NaN or +inf at row {r}"),
                };
                return Err(Error::input(name, what));
            }
        }
        for (bit, name) in [(F_A_EMPTY, "rollout_logits"), (F_B_EMPTY, "old_logits")] {
            if flags & bit != 0 {
                return Err(Error::input(name, format!("row {r}: every entry is -inf")));
            }
        }
        if o[..7].iter().any(|x| !x.is_finite()) {
            // never a silent wrong answer (e.g. an absurd temperature overflowing f32)
            return Err(Error::Gpu(format!(
                "non-finite vocab_divergence result at row {r}: {:?}",
                &o[..7]
            )));
        }
        let inf = |bit: u32, v: f32, x: f64| if flags & bit != 0 { x } else { v as f64 };
        s.kl[r] = inf(F_KL_INF, o[0], f64::INFINITY);
        s.kl_rev[r] = inf(F_KLR_INF, o[1], f64::INFINITY);
        s.tv[r] = o[2] as f64;
        s.rollout_entropy[r] = o[3] as f64;
        s.training_entropy[r] = o[4] as f64;
        s.rollout_logp[r] = inf(F_LP_NEGINF, o[5], f64::NEG_INFINITY);
        s.train_logp[r] = inf(F_LQ_NEGINF, o[6], f64::NEG_INFINITY);
    }
    Ok(s)
}

/// Exact vocabulary divergences of host logits on the GPU (validated as on the CPU path).
pub fn vocab_divergence(
    ctx: &Context,
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    check_vocab_inputs(rollout, train, responses, mask, temperature)?;
    let info = row_info(responses, mask);
    let raw = run(
        ctx,
        &Source::Host { rollout, train },
        (rollout.dtype(), train.dtype()),
        mask.len(),
        rollout.vocab(),
        &info,
        responses.is_some(),
        (1.0 / temperature) as f32,
    )?;
    finish_vocab_stats(&raw, mask.len(), Some((rollout, train)))
}

/// Exact vocabulary divergences of logits already in device buffers of `ctx`'s device (zero
/// copy; e.g. a context from [`Context::from_wgpu`]). Each buffer holds row-major
/// `[mask.len(), vocab]` little-endian values of its dtype from byte 0 (16-bit types packed two
/// per u32 word), is at least that many bytes rounded up to 4, and has
/// `BufferUsages::STORAGE`. Rows where `mask` is false are never read.
#[allow(clippy::too_many_arguments)]
pub fn vocab_divergence_device(
    ctx: &Context,
    rollout: &wgpu::Buffer,
    rollout_dtype: DType,
    train: &wgpu::Buffer,
    train_dtype: DType,
    vocab: usize,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::config(
            "temperature",
            format!("{temperature} must be finite and > 0"),
        ));
    }
    if vocab == 0 {
        return Err(Error::input("logits", "vocabulary size is 0"));
    }
    if let Some(ids) = responses {
        if ids.len() != mask.len() {
            return Err(Error::input(
                "responses",
                format!("{} ids for {} slots", ids.len(), mask.len()),
            ));
        }
        if let Some(i) = (0..mask.len()).find(|&i| mask[i] && !(0..vocab as i64).contains(&ids[i]))
        {
            return Err(Error::input(
                "responses",
                format!(
                    "id {} at slot {i} is outside the vocabulary [0, {vocab})",
                    ids[i]
                ),
            ));
        }
    }
    let info = row_info(responses, mask);
    let raw = run(
        ctx,
        &Source::Device { rollout, train },
        (rollout_dtype, train_dtype),
        mask.len(),
        vocab,
        &info,
        responses.is_some(),
        (1.0 / temperature) as f32,
    )?;
    finish_vocab_stats(&raw, mask.len(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_aligned_and_cover_the_rows() {
        // bf16 rows of odd length: row 3 starts mid-word
        let (off, size, first) = window(3 * 7 * 2, 5 * 7 * 2, 2);
        assert_eq!((off, first), (0, 21));
        assert_eq!(size, 72);
        let (off, size, first) = window(1000, 1010, 2);
        assert_eq!((off, size, first), (768, 244, 116));
        assert_eq!(off % OFFSET_ALIGN, 0);
    }

    #[test]
    fn plans_fit_the_limit_after_alignment_slack() {
        let limits = ChunkLimits::new(8192);
        let chunks = plan(100, 1900, DType::F32, DType::BF16, &limits).unwrap();
        assert!(chunks.iter().all(|c| c.len() == 1));
        let chunks = plan(1000, 7, DType::F16, DType::F16, &limits).unwrap();
        assert_eq!(chunks.first().map(|c| c.start), Some(0));
        assert_eq!(chunks.last().map(|c| c.end), Some(1000));
        for c in &chunks {
            let n = c.len() as u64;
            assert!(n * 32 + OFFSET_ALIGN + 4 <= 8192);
        }
        assert!(plan(1, 3000, DType::F32, DType::F32, &limits).is_err());
    }

    #[test]
    fn host_chunks_bound_the_bytes_in_flight() {
        // a 1 GiB-class input (1766 × 151936 bf16 per tensor) and a device binding 128 MiB
        let limits = ChunkLimits::new(128 << 20);
        for (rows, vocab, da, db) in [
            (1766usize, 151_936usize, DType::BF16, DType::BF16),
            (5000, 151_936, DType::F32, DType::BF16),
            (100_000, 32_000, DType::F16, DType::F32),
            (3, 7, DType::F32, DType::F32),
        ] {
            let chunks = plan_host(rows, vocab, da, db, &limits).unwrap();
            assert_eq!(chunks.first().map(|c| c.start), Some(0));
            assert_eq!(chunks.last().map(|c| c.end), Some(rows));
            assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
            let mut slot = 0u64;
            for c in &chunks {
                for s in [da.size(), db.size()] {
                    let bytes = ceil4((c.len() * vocab * s) as u64) + 4;
                    assert!(bytes <= HOST_CHUNK_BYTES, "{bytes} bytes in one chunk");
                    slot = slot.max(bytes);
                }
            }
            // two slots per tensor, two chunks in flight (each with its upload staging)
            let in_flight = 2 * 2 * slot + 2 * 2 * slot;
            assert!(in_flight <= 128 << 20, "{in_flight} bytes in flight");
        }
        // a row larger than the cap still gets one row per chunk
        let chunks = plan_host(3, 5_000_000, DType::F32, DType::F32, &limits).unwrap();
        assert_eq!(chunks, vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn row_info_marks_masked_slots() {
        assert_eq!(
            row_info(Some(&[5, -1, 7]), &[true, false, true]),
            vec![5, ROW_MASKED, 7]
        );
        assert_eq!(row_info(None, &[true, false]), vec![0, ROW_MASKED]);
    }
}
