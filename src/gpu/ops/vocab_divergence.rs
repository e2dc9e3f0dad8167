//! Exact vocabulary divergences on the GPU (`shaders/vocab_divergence.wgsl`); mirrors
//! `cpu/vocab_divergence.rs` (same decomposition, f32 on the device, see the shader's header).
//!
//! One workgroup per row, or rows cut into slices, one workgroup per slice, in three dispatches
//! (each slice's passes 1 and 2 on one read; TV's re-read of the slices whose certificate
//! fails; the combine step, which merges the slices' partial states in a fixed order)
//! ([`VocabVariant`], chosen by [`Context::vocab_variant`]). Logits travel as their raw bytes (u32 words, 16-bit types packed two
//! per word, odd byte counts padded), never widened on the host. Rows are split into chunks
//! whose bindings fit the device limit ([`plan_host`], `plan`); each binding is a window of its
//! buffer starting at a 256-byte aligned offset, and [`VocabDivergenceParams`] tells the kernel
//! where the chunk starts inside it. Host logits are uploaded in chunks of up to
//! [`Context::host_chunk_bytes`] (64 MiB) per tensor — one dispatch of hundreds of LLM rows —
//! into [`VOCAB_UPLOAD_SLOTS`] reused slots (`slots.rs`), each filled by the rayon pool's
//! threads ([`Context::stage`]: in place where slots are mapped, else into the slot's
//! persistent staging buffer, copied to the slot by the chunk's own submission), one
//! [`Context::submit_staged`] per chunk, so the host fills chunk i + 1 while the device copies
//! and computes chunk i; the last chunk goes through [`Context::run_each_staged`], which reads
//! the results back. The whole call runs in one error scope ([`Context::scoped`]).
//! Device-resident logits ([`crate::Logits::device`]) are bound in place — windows of the
//! caller's buffer, zero copy: only `row_info` goes up and the 8 results per row come back — all
//! chunks in one [`Context::run`].

use crate::cpu::{check_vocab_inputs, first_bad_logit};
use crate::error::{Error, Result};
use crate::gpu::device::buffers::GpuBuffer;
use crate::gpu::device::capabilities::check_loops;
use crate::gpu::device::context::{result_words, Context};
use crate::gpu::device::pass::{Bind, Pass};
use crate::gpu::device::pipeline::{Flavour, KernelKey, Op, VOCAB_RESULTS_PER_ROW};
use crate::gpu::ops::chunking::{dispatch_grid, plan_rows, window, ChunkLimits, OFFSET_ALIGN};
use crate::gpu::ops::slots::{SlotRing, VOCAB_UPLOAD_SLOTS};
use crate::gpu::ops::vocab_variant::VocabVariant;
use crate::input::logits::{DType, Logits};
use crate::input::tensors;
use crate::stats::{VocabPasses, VocabStats};

/// `row_info` value of an invalid (masked) slot.
pub const ROW_MASKED: u32 = u32::MAX;
/// f32 results per row: kl, kl_rev, tv, h_p, h_q, logp, logq, flags.
pub const RESULTS_PER_ROW: usize = VOCAB_RESULTS_PER_ROW as usize;

/// The kernel's uniform: twin of `VocabDivergenceParams` in `shaders/vocab_divergence.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct VocabDivergenceParams {
    /// Rows in this chunk.
    pub rows: u32,
    /// Vocabulary size V.
    pub vocab: u32,
    /// Index of the chunk's first rollout element inside binding 1.
    pub a_first: u32,
    /// Index of the chunk's first trainer element inside binding 2.
    pub b_first: u32,
    /// Index of the chunk's first row inside binding 3 (`row_info`); binding 4 holds the
    /// results from row `info_first % 8`.
    pub info_first: u32,
    /// 1 when `row_info` holds sampled ids (log-probs wanted).
    pub has_responses: u32,
    /// 1 / temperature.
    pub inv_temp: f32,
    /// Always 1.0: the opaque one of the compensated pass-1 sums (`two_sum`).
    pub one: f32,
    /// Slices per row: 1 (one workgroup per row) or more (split rows, see the shader).
    pub slices: u32,
    /// Elements per slice when `slices > 1` (a multiple of 8).
    pub slice_len: u32,
    /// Which of the split kernel's four dispatches this is (1 ..= 4; 0 for whole rows).
    pub phase: u32,
    /// 1: pass 1 runs its masked loop from the start.
    pub masked_first: u32,
}

/// Whether a chunk's rows can be read eight elements at a time as `vec4<u32>` words (the
/// kernel's `WIDE` variant): V a multiple of 8 and both bindings' first rows starting at a
/// multiple of 16 bytes (`firsts`: first element and element size), so that every row starts
/// and ends on a 16-byte boundary and each binding's length is a whole number of `vec4`s.
fn wide(vocab: usize, firsts: [(u32, u64); 2]) -> bool {
    vocab.is_multiple_of(8)
        && firsts
            .iter()
            .all(|&(f, s)| (u64::from(f) * s).is_multiple_of(16))
}

/// The first element of the binding window of a tensor starting at byte `first` of its data:
/// host rows are written into a slot from the word holding `first`; device rows are bound from
/// the aligned window `window` picks.
fn first_element(l: &Logits, first: u64, size: u64) -> u32 {
    match l.on_device() {
        Some(d) => window(d.offset() + first, d.offset() + first, size).2,
        None => (first % 4 / size) as u32,
    }
}

const F_KL_INF: u32 = 1;
const F_KLR_INF: u32 = 2;
const F_LP_NEGINF: u32 = 4;
const F_LQ_NEGINF: u32 = 8;
const F_A_BAD: u32 = 16;
const F_B_BAD: u32 = 32;
const F_A_EMPTY: u32 = 64;
const F_B_EMPTY: u32 = 128;
const F_LEAN: u32 = 256;
const F_THIRD_PASS: u32 = 512;
const F_PASS1_FULL: u32 = 1024;
const F_ON_CHIP: u32 = 2048;
const F_SPLIT: u32 = 4096;
const F_MASKED_FIRST: u32 = 8192;
const F_SLICES_TWICE: u32 = 16384;
/// The count of a split row's slices read again for TV starts at this bit of its flags.
const REREAD_SHIFT: u32 = 15;

/// f32 words of `part` per row and slice of the split kernel (`PART` in the shader).
pub const PART_WORDS: u64 = 40;

/// Octets (eight elements of each row) a thread of the kernel keeps on-chip
/// (`ONCHIP_OCTS` in the shader): rows of at most `8 · workgroup · ONCHIP_OCTS` elements are
/// read from memory once, every later loop runs on the copy.
pub const ONCHIP_OCTS: u64 = 16;

/// Threads per workgroup with which a row of `vocab` elements fits on-chip (a power of two;
/// more than the largest workgroup when it cannot).
pub fn on_chip_workgroup(vocab: u64) -> u64 {
    vocab.div_ceil(8 * ONCHIP_OCTS).max(1).next_power_of_two()
}

fn ceil4(x: u64) -> u64 {
    x.div_ceil(4) * 4
}

/// Chunks of host rows: `plan` with every logits chunk at most `chunk_bytes` per tensor
/// ([`Context::host_chunk_bytes`]; one row, if a row is larger), for rows cut into `slices`
/// slices (the split kernel's `part` binding holds [`PART_WORDS`] words per row and slice).
/// Per-row results do not depend on the chunking.
pub fn plan_host(
    rows: usize,
    vocab: usize,
    (da, db): (DType, DType),
    slices: u32,
    limits: &ChunkLimits,
    chunk_bytes: u64,
) -> Result<Vec<std::ops::Range<usize>>> {
    let row = (vocab * da.size().max(db.size())) as u64;
    // a chunk of n rows uploads ceil4(n·row) + 4 bytes per tensor; the binding slack is
    // OFFSET_ALIGN + 4 (see `plan`)
    let cap = chunk_bytes.saturating_sub(8).max(row) + OFFSET_ALIGN + 4;
    let host = ChunkLimits {
        max_binding_bytes: limits.max_binding_bytes.min(cap),
        ..*limits
    };
    plan(rows, vocab, (da, db), slices, &host)
}

/// Chunks of rows whose every binding (logits windows, row_info, results) fits the limit
/// after aligning its offset down.
fn plan(
    rows: usize,
    vocab: usize,
    (da, db): (DType, DType),
    slices: u32,
    limits: &ChunkLimits,
) -> Result<Vec<std::ops::Range<usize>>> {
    let row_bytes = [
        (vocab * da.size()) as u64,
        (vocab * db.size()) as u64,
        (RESULTS_PER_ROW * 4) as u64,
        u64::from(slices) * PART_WORDS * 4,
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

/// The kernel of configuration `vv` for `rollout` / `train` on `ctx` with or without wide
/// loads (the loop-budget error when a row, or a slice, is too long for the driver).
fn variant(
    ctx: &Context,
    rollout: &Logits,
    train: &Logits,
    wide: bool,
    vv: VocabVariant,
) -> Result<KernelKey> {
    let vocab = rollout.vocab() as u64;
    let op = Op::VocabDivergence(train.dtype());
    vv.check_device(ctx.capabilities())?;
    let workgroup = vv.workgroup.max(1);
    let len = match vv.slice_len(vocab) {
        0 => vocab,
        l => u64::from(l),
    };
    // three strided passes over the row or slice at most (the third only for flagged rows)
    check_loops(
        ctx.capabilities(),
        &|| format!("rollout_logits: a row of {vocab} logits"),
        3 * len.div_ceil(u64::from(workgroup)),
    )?;
    let split = vv.slices(vocab) > 1;
    Ok(KernelKey {
        op,
        dtype: rollout.dtype(),
        flavour: match vv.subgroups {
            true => Flavour::Subgroup,
            false => Flavour::Workgroup,
        },
        workgroup,
        variant: wide,
        split,
        rows: if split { 1 } else { vv.rows },
    })
}

/// The kernel variant of the first chunk of rows of `rollout` / `train` on `ctx` (what
/// `Engine::prepare` builds; later chunks of device logits may start at other offsets).
pub(in crate::gpu) fn kernel_key(
    ctx: &Context,
    rollout: &Logits,
    train: &Logits,
) -> Result<KernelKey> {
    let (sa, sb) = (rollout.dtype().size() as u64, train.dtype().size() as u64);
    let firsts = [
        (first_element(rollout, 0, sa), sa),
        (first_element(train, 0, sb), sb),
    ];
    let dtypes = (rollout.dtype(), train.dtype());
    let vv = ctx.vocab_variant(dtypes, rollout.rows() as u64, rollout.vocab() as u64)?;
    variant(ctx, rollout, train, wide(rollout.vocab(), firsts), vv)
}

/// Runs the kernel over all rows of `rollout` / `train` (host or device logits of the same
/// shape) in one error scope; returns the raw per-row results (8 f32 per row).
fn run(
    ctx: &Context,
    (rollout, train): (&Logits, &Logits),
    info: &[u32],
    has_responses: bool,
    inv_temp: f32,
    vv: VocabVariant,
) -> Result<Vec<f32>> {
    if info.is_empty() {
        return Ok(Vec::new());
    }
    let on_device = match (rollout.on_device(), train.on_device()) {
        (None, None) => false,
        (Some(_), Some(_)) => true,
        _ => {
            return Err(Error::input(
                "old_logits",
                "rollout_logits and old_logits must both be on the host or both on the device",
            ))
        }
    };
    for (name, l) in tensors::logits_names().into_iter().zip([rollout, train]) {
        if l.on_device().is_some_and(|d| !d.is_storage()) {
            return Err(Error::input(
                name,
                "device buffer lacks BufferUsages::STORAGE: the GPU engine binds it in place",
            ));
        }
    }
    ctx.scoped(|| {
        run_chunks(
            ctx,
            (rollout, train),
            info,
            has_responses,
            inv_temp,
            on_device,
            vv,
        )
    })
}

/// The body of [`run`]: plan, upload (host logits) and dispatch every chunk.
fn run_chunks(
    ctx: &Context,
    (rollout, train): (&Logits, &Logits),
    info: &[u32],
    has_responses: bool,
    inv_temp: f32,
    on_device: bool,
    vv: VocabVariant,
) -> Result<Vec<f32>> {
    let rows = info.len();
    let (da, db) = (rollout.dtype(), train.dtype());
    let vocab = rollout.vocab();
    let narrow = variant(ctx, rollout, train, false, vv)?;
    let (slices, slice_len) = (vv.slices(vocab as u64), vv.slice_len(vocab as u64));
    let limits = ctx.chunk_limits();
    let chunks = if on_device {
        plan(rows, vocab, (da, db), slices, &limits)?
    } else {
        plan_host(
            rows,
            vocab,
            (da, db),
            slices,
            &limits,
            ctx.host_chunk_bytes(),
        )?
    };
    let (sa, sb) = (da.size() as u64, db.size() as u64);
    let v = vocab as u64;
    let out_bytes = (RESULTS_PER_ROW * 4 * rows) as u64;
    let info_buf = ctx.upload(bytemuck::cast_slice(info))?;
    let out_buf = ctx.output(out_bytes)?;
    let max_rows = chunks.iter().map(|c| c.len()).max().unwrap_or(0) as u64;
    // the split kernel's per-slice partial results (unused by whole rows)
    let part_buf = ctx.scratch(match slices {
        1 => 16,
        s => max_rows * u64::from(s) * PART_WORDS * 4,
    })?;
    // per slot: the two tensors' storage slots and their persistent staging buffers (none
    // where slots are mapped); sizes bounded by the chunk plan, never by the input alone
    type Slot = ([GpuBuffer; 2], [Option<GpuBuffer>; 2]);
    let slots: Vec<Slot> = if on_device {
        Vec::new()
    } else {
        (0..VOCAB_UPLOAD_SLOTS.min(chunks.len()))
            .map(|_| -> Result<Slot> {
                let (ba, bb) = (ceil4(max_rows * v * sa) + 4, ceil4(max_rows * v * sb) + 4);
                Ok((
                    [ctx.upload_slot(ba)?, ctx.upload_slot(bb)?],
                    [ctx.upload_staging(ba)?, ctx.upload_staging(bb)?],
                ))
            })
            .collect::<Result<_>>()?
    };
    let mut ring = SlotRing::new(slots.len());
    let mut passes = Vec::with_capacity(chunks.len());
    let mut staged = Vec::with_capacity(2);
    for (ci, ch) in chunks.iter().enumerate() {
        let (r0, r1) = (ch.start as u64, ch.end as u64);
        let unit = (RESULTS_PER_ROW * 4) as u64;
        let info_w = window(4 * r0, 4 * r1, 4);
        let out_w = window(unit * r0, unit * r1, unit);
        debug_assert_eq!(out_w.2, info_w.2 % 8);
        let mut tensors = [Bind::Whole(&info_buf); 2];
        let mut firsts = [0u32; 2];
        // bounded memory: at most VOCAB_UPLOAD_SLOTS chunks in flight
        let slot = if on_device { 0 } else { ring.acquire(ctx, ci)? };
        for (k, (l, s)) in [(rollout, sa), (train, sb)].into_iter().enumerate() {
            let (first, end) = (r0 * v * s, r1 * v * s);
            firsts[k] = first_element(l, first, s);
            if let Some(d) = l.on_device() {
                let (offset, size, _) = window(d.offset() + first, d.offset() + end, s);
                tensors[k] = Bind::Device {
                    logits: d,
                    offset,
                    size,
                };
            } else {
                let (buf, staging) = (&slots[slot].0[k], slots[slot].1[k].as_ref());
                let bytes = l.host_bytes("logits")?;
                let start = (first / 4 * 4) as usize;
                let (end, full) = (end as usize, ((end - first / 4 * 4) / 4 * 4) as usize);
                let mut tail = [0u8; 4];
                let rest = end - start - full; // 0–3 bytes past the last whole word
                tail[..rest].copy_from_slice(&bytes[start + full..end]);
                let tail = &tail[..if rest > 0 { 4 } else { 0 }];
                staged.push(ctx.stage(buf, staging, &[&bytes[start..start + full], tail])?);
                tensors[k] = Bind::Whole(buf);
            }
        }
        let params = VocabDivergenceParams {
            rows: ch.len() as u32,
            vocab: vocab as u32,
            a_first: firsts[0],
            b_first: firsts[1],
            info_first: info_w.2,
            has_responses: has_responses as u32,
            inv_temp,
            one: 1.0,
            slices,
            slice_len,
            phase: 0,
            masked_first: vv.masked_first as u32,
        };
        let kernel = ctx.kernel_for(KernelKey {
            variant: wide(vocab, [(firsts[0], sa), (firsts[1], sb)]),
            ..narrow
        })?;
        let bindings = vec![
            tensors[0],
            tensors[1],
            Bind::Window {
                buffer: &info_buf,
                offset: info_w.0,
                size: info_w.1,
            },
            Bind::Window {
                buffer: &out_buf,
                offset: out_w.0,
                size: out_w.1,
            },
            Bind::Whole(&part_buf),
        ];
        let n = ch.len() as u64;
        if slices == 1 {
            // ROWS rows per workgroup (one subgroup each) when the key has several
            let grid = dispatch_grid(
                n.div_ceil(u64::from(kernel.key.rows)),
                limits.max_workgroups_per_dim,
            )?;
            passes.push(Pass::new(kernel.clone(), &params, bindings, grid));
        } else {
            // three dispatches: passes 1 and 2 per slice (one read), TV's re-read of the slices
            // failing their certificate, then the combine step per row
            for phase in 1..=3u32 {
                let wgs = if phase == 3 { n } else { n * u64::from(slices) };
                let grid = dispatch_grid(wgs, limits.max_workgroups_per_dim)?;
                let p = VocabDivergenceParams { phase, ..params };
                passes.push(Pass::new(kernel.clone(), &p, bindings.clone(), grid));
            }
        }
        if !on_device && ci + 1 < chunks.len() {
            // one submit per host chunk: the next chunk's fill overlaps this copy and compute
            ring.release(ci, ctx.submit_staged(&staged, &passes)?);
            passes.clear();
            staged.clear();
        }
    }
    let mut vals = Vec::new();
    ctx.run_each_staged(&staged, &passes, &[&out_buf], &mut |_, bytes| {
        vals = result_words::<f32>(bytes, out_bytes as usize / 4)?.to_vec();
        Ok(())
    })?;
    Ok(vals)
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
        for (k, (bit, name)) in [F_A_BAD, F_B_BAD]
            .into_iter()
            .zip(tensors::logits_names())
            .enumerate()
        {
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
        for (bit, name) in [F_A_EMPTY, F_B_EMPTY]
            .into_iter()
            .zip(tensors::logits_names())
        {
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

/// Exact vocabulary divergences of host or device-resident logits on the GPU (validated as
/// on the CPU path; device logits must both be on this context's device, see
/// [`crate::Logits::device`]).
pub fn vocab_divergence(
    ctx: &Context,
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
) -> Result<VocabStats> {
    vocab_divergence_with(ctx, rollout, train, responses, mask, temperature, None)
}

/// [`vocab_divergence`] with the kernel's configuration given (`None`: the one
/// [`Context::vocab_variant`] picks). [`Context::vocab_variants`] lists the configurations a
/// tuner may pick; each is deterministic, and they differ in rounding. Afterwards
/// [`Context::last_vocab_passes`] counts how the rows were read.
pub fn vocab_divergence_with(
    ctx: &Context,
    rollout: &Logits,
    train: &Logits,
    responses: Option<&[i64]>,
    mask: &[bool],
    temperature: f64,
    variant: Option<VocabVariant>,
) -> Result<VocabStats> {
    check_vocab_inputs(rollout, train, responses, mask, temperature)?;
    let vv = match variant {
        Some(v) => {
            v.check()?;
            v
        }
        None => ctx.vocab_variant(
            (rollout.dtype(), train.dtype()),
            mask.len() as u64,
            rollout.vocab() as u64,
        )?,
    };
    let info = row_info(responses, mask);
    let raw = run(
        ctx,
        (rollout, train),
        &info,
        responses.is_some(),
        (1.0 / temperature) as f32,
        vv,
    )?;
    let host =
        (rollout.on_device().is_none() && train.on_device().is_none()).then_some((rollout, train));
    let share = f64::from(vv.slice_len(rollout.vocab() as u64)) / rollout.vocab() as f64;
    ctx.record_vocab_passes(vocab_passes(&raw, mask, share));
    finish_vocab_stats(&raw, mask.len(), host)
}

/// How the kernel read the valid rows of one call (from the flags of its raw results);
/// `slice_share`: a split row's slice length over its vocabulary (a slice read again for TV
/// counts as that share of a read; the last, shorter slice as a whole one).
fn vocab_passes(raw: &[f32], mask: &[bool], slice_share: f64) -> VocabPasses {
    let mut p = VocabPasses::default();
    for (o, _) in raw
        .chunks_exact(RESULTS_PER_ROW)
        .zip(mask)
        .filter(|(_, &m)| m)
    {
        let flags = o[7] as u32;
        let (masked, third) = (flags & F_PASS1_FULL != 0, flags & F_THIRD_PASS != 0);
        p.rows += 1;
        p.lean_rows += u64::from(flags & F_LEAN != 0);
        p.masked_pass1_rows += u64::from(masked);
        p.third_pass_rows += u64::from(third);
        p.on_chip_rows += u64::from(flags & F_ON_CHIP != 0);
        p.split_rows += u64::from(flags & F_SPLIT != 0);
        p.masked_first_rows += u64::from(flags & F_MASKED_FIRST != 0);
        let (m, t) = (f64::from(u8::from(masked)), f64::from(u8::from(third)));
        // split: one read (slices on-chip) or 2 + masked, plus the slices TV read again
        let rereads = (f64::from(flags >> REREAD_SHIFT) * slice_share).min(1.0);
        p.row_reads += match (flags & F_SPLIT != 0, flags & F_ON_CHIP != 0) {
            (true, _) if flags & F_SLICES_TWICE != 0 => 2.0 + m + rereads,
            (true, _) => 1.0 + rereads,
            (false, true) => 1.0,
            (false, false) => 2.0 + m + t,
        };
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_match_the_shader() {
        use std::mem::offset_of;
        type P = VocabDivergenceParams;
        crate::gpu::device::pipeline::assert_params_layout(
            Op::VocabDivergence(DType::F32),
            std::mem::size_of::<P>(),
            &[
                ("rows", offset_of!(P, rows)),
                ("vocab", offset_of!(P, vocab)),
                ("a_first", offset_of!(P, a_first)),
                ("b_first", offset_of!(P, b_first)),
                ("info_first", offset_of!(P, info_first)),
                ("has_responses", offset_of!(P, has_responses)),
                ("inv_temp", offset_of!(P, inv_temp)),
                ("one", offset_of!(P, one)),
                ("slices", offset_of!(P, slices)),
                ("slice_len", offset_of!(P, slice_len)),
                ("phase", offset_of!(P, phase)),
                ("masked_first", offset_of!(P, masked_first)),
            ],
        );
    }

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
        let chunks = plan(100, 1900, (DType::F32, DType::BF16), 1, &limits).unwrap();
        assert!(chunks.iter().all(|c| c.len() == 1));
        let chunks = plan(1000, 7, (DType::F16, DType::F16), 1, &limits).unwrap();
        assert_eq!(chunks.first().map(|c| c.start), Some(0));
        assert_eq!(chunks.last().map(|c| c.end), Some(1000));
        for c in &chunks {
            let n = c.len() as u64;
            assert!(n * 32 + OFFSET_ALIGN + 4 <= 8192);
        }
        assert!(plan(1, 3000, (DType::F32, DType::F32), 1, &limits).is_err());
    }

    #[test]
    fn host_chunks_bound_the_bytes_in_flight() {
        // a 1 GiB-class input (1766 × 151936 bf16 per tensor) and a device binding 128 MiB
        let limits = ChunkLimits::new(128 << 20);
        let cap = crate::gpu::device::context::VOCAB_HOST_CHUNK_BYTES;
        for (rows, vocab, da, db) in [
            (1766usize, 151_936usize, DType::BF16, DType::BF16),
            (5000, 151_936, DType::F32, DType::BF16),
            (100_000, 32_000, DType::F16, DType::F32),
            (3, 7, DType::F32, DType::F32),
        ] {
            let chunks = plan_host(rows, vocab, (da, db), 1, &limits, cap).unwrap();
            assert_eq!(chunks.first().map(|c| c.start), Some(0));
            assert_eq!(chunks.last().map(|c| c.end), Some(rows));
            assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
            let mut slot = 0u64;
            for c in &chunks {
                for s in [da.size(), db.size()] {
                    let bytes = ceil4((c.len() * vocab * s) as u64) + 4;
                    assert!(bytes <= cap, "{bytes} bytes in one chunk");
                    slot = slot.max(bytes);
                }
            }
            // VOCAB_UPLOAD_SLOTS slots per tensor, each with its staging buffer
            let in_flight = 2 * 2 * VOCAB_UPLOAD_SLOTS as u64 * slot;
            assert!(in_flight <= 512 << 20, "{in_flight} bytes in flight");
            // hundreds of LLM rows per chunk, not dozens
            if vocab == 151_936 && rows >= 1766 {
                assert!(chunks[0].len() >= 100, "{:?}", chunks[0]);
            }
        }
        // a row larger than the cap still gets one row per chunk
        let chunks = plan_host(3, 20_000_000, (DType::F32, DType::F32), 1, &limits, cap).unwrap();
        assert_eq!(chunks, vec![0..1, 1..2, 2..3]);
        // a small cap (tests): many chunks of whole rows, each within the cap
        let chunks = plan_host(100, 7, (DType::BF16, DType::F32), 1, &limits, 256).unwrap();
        assert!(chunks.len() > 1 && chunks.iter().all(|c| c.len() * 28 <= 256));
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
