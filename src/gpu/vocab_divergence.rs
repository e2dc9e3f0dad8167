//! Exact vocabulary divergences on the GPU (`shaders/vocab_divergence.wgsl`).

use crate::batch::DType;

/// The WGSL source of the vocab-divergence kernel: `common/unpack.wgsl` + `common/lse.wgsl` +
/// `vocab_divergence.wgsl`. The dtype pair and the workgroup size are pipeline-overridable
/// constants (see [`vocab_constants`]), so one module serves every variant.
pub fn vocab_shader_source() -> String {
    [
        include_str!("../../shaders/common/unpack.wgsl"),
        include_str!("../../shaders/common/lse.wgsl"),
        include_str!("../../shaders/vocab_divergence.wgsl"),
    ]
    .concat()
}

/// The shader's dtype code (`0` f32, `1` f16, `2` bf16).
pub fn dtype_code(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    }
}

/// Pipeline constants of one variant: rollout dtype, trainer dtype, workgroup size.
pub fn vocab_constants(rollout: DType, train: DType, workgroup: u32) -> Vec<(&'static str, f64)> {
    vec![
        ("A_DTYPE", dtype_code(rollout) as f64),
        ("B_DTYPE", dtype_code(train) as f64),
        ("WG", workgroup as f64),
    ]
}

use crate::batch::Logits;
use crate::cpu::{check_vocab_inputs, first_bad_logit};
use crate::engine::VocabStats;
use crate::error::{Error, Result};
use std::num::NonZeroU64;
use std::ops::Range;

/// Uniform block of one chunk; WGSL twin: `Params` in `shaders/vocab_divergence.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct VocabParams {
    pub rows: u32,
    pub vocab: u32,
    pub a_first: u32,
    pub b_first: u32,
    pub info_first: u32,
    pub out_first: u32,
    pub has_responses: u32,
    pub inv_temp: f32,
}

/// `row_info` value of an invalid (masked) slot.
pub const ROW_MASKED: u32 = u32::MAX;
/// f32 results per row: kl, kl_rev, tv, h_p, h_q, logp, logq, flags.
pub const RESULTS_PER_ROW: usize = 8;

const F_KL_INF: u32 = 1;
const F_KLR_INF: u32 = 2;
const F_LP_NEGINF: u32 = 4;
const F_LQ_NEGINF: u32 = 8;
const F_A_BAD: u32 = 16;
const F_B_BAD: u32 = 32;
const F_A_EMPTY: u32 = 64;
const F_B_EMPTY: u32 = 128;

/// The bind-group layout entries of the kernel (explicit, with minimum binding sizes).
pub fn vocab_layout_entries() -> [wgpu::BindGroupLayoutEntry; 5] {
    let storage = |binding, read_only, min: u64| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: NonZeroU64::new(min),
        },
        count: None,
    };
    [
        wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: NonZeroU64::new(std::mem::size_of::<VocabParams>() as u64),
            },
            count: None,
        },
        storage(1, true, 4),
        storage(2, true, 4),
        storage(3, true, 4),
        storage(4, false, (RESULTS_PER_ROW * 4) as u64),
    ]
}

/// Where the two logits tensors come from.
pub enum VocabSource<'a> {
    /// Host bytes, uploaded chunk by chunk (double-buffered).
    Host {
        rollout: &'a Logits,
        train: &'a Logits,
    },
    /// Tensors already on the device (zero copy): row-major `[rows, vocab]` little-endian
    /// elements of the given dtypes starting at byte 0 of each buffer, which must be at least
    /// `rows·vocab·size` bytes rounded up to 4 and carry `BufferUsages::STORAGE`.
    Device {
        rollout: &'a wgpu::Buffer,
        rollout_dtype: DType,
        train: &'a wgpu::Buffer,
        train_dtype: DType,
    },
}

impl VocabSource<'_> {
    fn dtypes(&self) -> (DType, DType) {
        match self {
            VocabSource::Host { rollout, train } => (rollout.dtype(), train.dtype()),
            VocabSource::Device {
                rollout_dtype,
                train_dtype,
                ..
            } => (*rollout_dtype, *train_dtype),
        }
    }
}

/// Everything the host side needs from the device.
pub struct VocabRunner<'a> {
    pub device: &'a wgpu::Device,
    pub queue: &'a wgpu::Queue,
    pub pipeline: &'a wgpu::ComputePipeline,
    pub layout: &'a wgpu::BindGroupLayout,
    /// Largest storage binding, `min(max_storage_buffer_binding_size, max_buffer_size)` or a
    /// smaller forced value.
    pub max_binding: u64,
}

fn ceil4(x: u64) -> u64 {
    x.div_ceil(4) * 4
}

/// Rows per chunk so that every binding of a chunk fits `max_binding` after aligning its
/// offset down to `align` bytes.
pub fn rows_per_chunk(
    vocab: usize,
    sa: usize,
    sb: usize,
    max_binding: u64,
    align: u64,
) -> Result<usize> {
    let slack = align + 4;
    let per_row = [
        (vocab * sa) as u64,
        (vocab * sb) as u64,
        4,
        (RESULTS_PER_ROW * 4) as u64,
    ];
    let n = per_row
        .iter()
        .map(|&b| max_binding.saturating_sub(slack) / b)
        .min()
        .unwrap_or(0);
    if n == 0 {
        return Err(Error::Gpu(format!(
            "a row of {vocab} logits does not fit the storage binding limit of {max_binding} bytes"
        )));
    }
    Ok(n.min(u32::MAX as u64 / 2) as usize)
}

/// A binding window `[offset, offset + size)` of a buffer and the index of `first_byte`'s
/// element (of `elem` bytes) inside it.
fn window(first_byte: u64, end_byte: u64, elem: u64, align: u64) -> (u64, u64, u32) {
    let off = first_byte / align * align;
    let size = ceil4(end_byte) - off;
    (off, size, ((first_byte - off) / elem) as u32)
}

fn binding(buf: &wgpu::Buffer, off: u64, size: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: buf,
        offset: off,
        size: NonZeroU64::new(size),
    })
}

/// Runs the kernel over all rows; returns the raw per-row results (8 f32 per row).
pub fn run_vocab_kernel(
    r: &VocabRunner<'_>,
    src: &VocabSource<'_>,
    rows: usize,
    vocab: usize,
    row_info: &[u32],
    has_responses: bool,
    inv_temp: f32,
) -> Result<Vec<f32>> {
    if rows == 0 {
        return Ok(Vec::new());
    }
    let dev = r.device;
    let limits = dev.limits();
    let align = limits.min_storage_buffer_offset_alignment.max(4) as u64;
    let ualign = (limits.min_uniform_buffer_offset_alignment as u64).max(32);
    let (da, db) = src.dtypes();
    let (sa, sb) = (da.size(), db.size());
    let per = rows_per_chunk(vocab, sa, sb, r.max_binding, align)?;
    let chunks: Vec<Range<usize>> = (0..rows)
        .step_by(per)
        .map(|s| s..(s + per).min(rows))
        .collect();
    if let VocabSource::Device { rollout, train, .. } = src {
        for (name, b, s) in [("rollout_logits", rollout, sa), ("old_logits", train, sb)] {
            if b.size() < ceil4((rows * vocab * s) as u64) {
                return Err(Error::input(
                    name,
                    format!(
                        "device buffer of {} bytes is smaller than [{rows}, {vocab}] values",
                        b.size()
                    ),
                ));
            }
        }
    }
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let oom = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);

    let make = |label: &str, size: u64, usage: wgpu::BufferUsages| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4),
            usage,
            mapped_at_creation: false,
        })
    };
    let st = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let info_buf = make("trmask vocab row_info", 4 * rows as u64, st);
    r.queue
        .write_buffer(&info_buf, 0, bytemuck::cast_slice(row_info));
    let out_bytes = (RESULTS_PER_ROW * 4 * rows) as u64;
    let out_buf = make(
        "trmask vocab results",
        out_bytes,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    );
    let read_buf = make(
        "trmask vocab readback",
        out_bytes,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    );
    let params_buf = make(
        "trmask vocab params",
        ualign * chunks.len() as u64,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    );
    // Host path: two upload slots per tensor, so chunk i+1 is written while chunk i computes.
    let slot_bytes = |s: usize| ceil4((per.min(rows) * vocab * s) as u64) + 4;
    let slots: Vec<[wgpu::Buffer; 2]> = match src {
        VocabSource::Host { .. } => (0..2)
            .map(|k| {
                [
                    make(
                        &format!("trmask vocab rollout slot {k}"),
                        slot_bytes(sa),
                        st,
                    ),
                    make(&format!("trmask vocab train slot {k}"), slot_bytes(sb), st),
                ]
            })
            .collect(),
        VocabSource::Device { .. } => Vec::new(),
    };

    let mut params = vec![0u8; (ualign as usize) * chunks.len()];
    let mut pass_data = Vec::with_capacity(chunks.len());
    for (ci, ch) in chunks.iter().enumerate() {
        let (r0, r1) = (ch.start as u64, ch.end as u64);
        let v = vocab as u64;
        let (info_off, info_size, info_first) = window(4 * r0, 4 * r1, 4, align);
        let out_unit = (RESULTS_PER_ROW * 4) as u64;
        let (out_off, out_size, out_first) = window(out_unit * r0, out_unit * r1, out_unit, align);
        // (buffer index, offset, size, first element) per tensor
        let tensor = |s: usize| -> (u64, u64, u32) {
            let s = s as u64;
            let (first, end) = (r0 * v * s, r1 * v * s);
            match src {
                VocabSource::Device { .. } => window(first, end, s, align),
                VocabSource::Host { .. } => {
                    let start = first / 4 * 4;
                    (0, ceil4(end) - start, ((first - start) / s) as u32)
                }
            }
        };
        let a = tensor(sa);
        let b = tensor(sb);
        let p = VocabParams {
            rows: (r1 - r0) as u32,
            vocab: vocab as u32,
            a_first: a.2,
            b_first: b.2,
            info_first,
            out_first,
            has_responses: has_responses as u32,
            inv_temp,
        };
        params[ci * ualign as usize..][..std::mem::size_of::<VocabParams>()]
            .copy_from_slice(bytemuck::bytes_of(&p));
        pass_data.push((a, b, (info_off, info_size), (out_off, out_size)));
    }
    r.queue.write_buffer(&params_buf, 0, &params);

    let dispatch = |enc: &mut wgpu::CommandEncoder, bg: &wgpu::BindGroup, n: u32| {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("trmask vocab_divergence"),
            timestamp_writes: None,
        });
        pass.set_pipeline(r.pipeline);
        pass.set_bind_group(0, bg, &[]);
        let x = n.min(65535);
        pass.dispatch_workgroups(x, n.div_ceil(x), 1);
    };
    let mut enc = dev.create_command_encoder(&Default::default());
    for (ci, ch) in chunks.iter().enumerate() {
        let (a, b, info, out) = pass_data[ci];
        let (abuf, bbuf): (&wgpu::Buffer, &wgpu::Buffer) = match src {
            VocabSource::Device { rollout, train, .. } => (rollout, train),
            VocabSource::Host { rollout, train } => {
                let slot = &slots[ci % 2];
                for (l, buf) in [(rollout, &slot[0]), (train, &slot[1])] {
                    let s = l.dtype().size();
                    let bytes = l.bytes();
                    let first = ch.start * vocab * s;
                    let end = ch.end * vocab * s;
                    let start = first / 4 * 4;
                    let full = (end - start) / 4 * 4;
                    r.queue.write_buffer(buf, 0, &bytes[start..start + full]);
                    if start + full < end {
                        let mut tail = [0u8; 4];
                        tail[..end - start - full].copy_from_slice(&bytes[start + full..end]);
                        r.queue.write_buffer(buf, full as u64, &tail);
                    }
                }
                (&slot[0], &slot[1])
            }
        };
        let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("trmask vocab_divergence"),
            layout: r.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: binding(
                        &params_buf,
                        ci as u64 * ualign,
                        std::mem::size_of::<VocabParams>() as u64,
                    ),
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
                    resource: binding(&info_buf, info.0, info.1),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: binding(&out_buf, out.0, out.1),
                },
            ],
        });
        dispatch(&mut enc, &bg, ch.len() as u32);
        if let VocabSource::Host { .. } = src {
            // submit per chunk so that the next upload overlaps this compute
            let done = std::mem::replace(&mut enc, dev.create_command_encoder(&Default::default()));
            r.queue.submit([done.finish()]);
        }
    }
    enc.copy_buffer_to_buffer(&out_buf, 0, &read_buf, 0, out_bytes);
    r.queue.submit([enc.finish()]);
    let oom = pollster::block_on(oom.pop());
    let val = pollster::block_on(scope.pop());
    if let Some(e) = val.or(oom) {
        return Err(Error::Gpu(e.to_string()));
    }
    let slice = read_buf.slice(..out_bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |res| {
        let _ = tx.send(res);
    });
    dev.poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Gpu(e.to_string()))?;
    rx.recv()
        .map_err(|e| Error::Gpu(e.to_string()))?
        .map_err(|e| Error::Gpu(e.to_string()))?;
    let out = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::Gpu(e.to_string()))?;
        bytemuck::pod_collect_to_vec::<u8, f32>(&view)
    };
    read_buf.unmap();
    Ok(out)
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

/// Exact vocabulary divergences of host logits on the GPU (validation as on the CPU path).
pub fn vocab_divergence_host(
    r: &VocabRunner<'_>,
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    check_vocab_inputs(rollout, train, responses, mask, temperature)?;
    let info = row_info(responses, mask);
    let raw = run_vocab_kernel(
        r,
        &VocabSource::Host { rollout, train },
        mask.len(),
        rollout.vocab(),
        &info,
        responses.is_some(),
        (1.0 / temperature) as f32,
    )?;
    finish_vocab_stats(&raw, mask.len(), Some((rollout, train)))
}

/// Exact vocabulary divergences of logits already in device buffers (zero copy); see
/// [`VocabSource::Device`] for the buffer layout.
#[allow(clippy::too_many_arguments)]
pub fn vocab_divergence_device(
    r: &VocabRunner<'_>,
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
    let raw = run_vocab_kernel(
        r,
        &VocabSource::Device {
            rollout,
            rollout_dtype,
            train,
            train_dtype,
        },
        mask.len(),
        vocab,
        &info,
        responses.is_some(),
        (1.0 / temperature) as f32,
    )?;
    finish_vocab_stats(&raw, mask.len(), None)
}
