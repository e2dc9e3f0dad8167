//! Which kernel variant each op uses on a [`Context`] (workgroup size, reduction flavour),
//! the chunk limits its plans respect, and the uniform bytes of a list of passes.

use crate::error::{Error, Result};
use crate::gpu::device::capabilities::check_loops;
use crate::gpu::device::context::Context;
use crate::gpu::device::pipeline::{
    all_kernel_keys, Flavour, Kernel, KernelKey, Op, MAX_WORKGROUP, SERIAL_MEAN, SERIAL_OVERRIDE,
    SERIAL_WORKGROUP,
};
use crate::gpu::ops::chunking::{ChunkLimits, MAX_WORKGROUPS_PER_DIM};
use crate::gpu::ops::vocab_variant::{
    VocabVariant, FILL_WORKGROUPS, ROWS_MAX_VOCAB, SLICE_LENGTHS, VOCAB_KERNEL_ENV,
};
use crate::input::logits::DType;
use std::sync::Arc;

impl Context {
    /// The limits chunk plans must respect.
    pub fn chunk_limits(&self) -> ChunkLimits {
        ChunkLimits {
            max_binding_bytes: self.caps.max_binding_bytes,
            max_workgroups_per_dim: self
                .caps
                .max_workgroups_per_dim
                .clamp(1, MAX_WORKGROUPS_PER_DIM),
        }
    }

    /// The workgroup size used for `op` on this device.
    pub fn workgroup_size(&self, op: Op) -> u32 {
        let want = self.workgroup_size.unwrap_or(op.spec().default_workgroup);
        let cap = self
            .caps
            .max_workgroup_invocations
            .min(self.caps.max_workgroup_size_x)
            .clamp(1, crate::gpu::device::pipeline::MAX_WORKGROUP);
        want.clamp(1, cap)
    }

    /// The reduction flavour used for `op` on this device: [`Flavour::Subgroup`] when the op
    /// has that variant, the device has `SUBGROUP` with one fixed subgroup size (never assumed:
    /// 8 on lavapipe, 32 or 64 on GPUs) that divides the op's workgroup size, and the options
    /// do not force [`Flavour::Workgroup`]; the workgroup tree otherwise. The vocabulary
    /// kernel's flavour is part of its configuration ([`VocabVariant::subgroups`]), not this.
    pub fn flavour(&self, op: Op) -> Flavour {
        self.flavour_at(op, self.workgroup_size(op))
    }

    /// [`Self::flavour`] for a workgroup of `wg` threads.
    fn flavour_at(&self, op: Op, wg: u32) -> Flavour {
        let (lo, hi) = self.caps.subgroup_sizes;
        let usable = self.caps.subgroups
            && lo == hi
            && lo > 0
            && wg.is_multiple_of(lo)
            && op.spec().flavours.contains(&Flavour::Subgroup)
            && !matches!(op, Op::VocabDivergence(_));
        match self.flavour {
            Some(Flavour::Workgroup) => Flavour::Workgroup,
            _ if usable => Flavour::Subgroup,
            _ => Flavour::Workgroup,
        }
    }

    /// The kernel variant for `op` on `dtype` (this device's flavour and workgroup size).
    pub fn kernel(&self, op: Op, dtype: DType) -> Result<Arc<Kernel>> {
        self.kernel_for(self.kernel_key(op, dtype))
    }

    /// The key of [`Self::kernel`].
    pub fn kernel_key(&self, op: Op, dtype: DType) -> KernelKey {
        KernelKey {
            op,
            dtype,
            flavour: self.flavour(op),
            workgroup: self.workgroup_size(op),
            variant: false,
            split: false,
            rows: 1,
        }
    }

    /// The workgroup size for a segmented op (one workgroup per sequence or piece) over
    /// segments of `mean_len` slots on average: [`Self::workgroup_size`] unless the segments
    /// are shorter, then the smallest power of two ≥ `mean_len`, but at least the subgroup
    /// size (and 8). Idle threads cost: on llvmpipe a 256-thread workgroup of one-token
    /// sequences costs ~0.7 ms (30,000 sequences: 20.6 s at 256 threads, 0.78 s at 8). On CPU
    /// adapters that floor whatever the length (busy threads cost there too: 65,536 tokens as
    /// 1,000 sequences took 102.7 ms at 128 threads, 38.6 ms at 8, `gpu_bench --quick`);
    /// ops cut sequences longer than the loop budget into pieces or take the reference path.
    /// A size set in [`crate::gpu::ContextOptions`] is used as is.
    pub fn segment_workgroup_size(&self, op: Op, mean_len: f64) -> u32 {
        let full = self.workgroup_size(op);
        if self.workgroup_size.is_some() {
            return full;
        }
        let floor = self.floor_workgroup(full);
        if self.caps.is_cpu() {
            // one coroutine per SIMD group, all switched at every barrier (see
            // `row_workgroup_size`): the fewest threads whatever the length
            return floor;
        }
        let want = if mean_len.is_finite() && mean_len > 0.0 {
            (mean_len.ceil().min(f64::from(full)) as u32).next_power_of_two()
        } else {
            floor
        };
        want.clamp(floor, full)
    }

    /// The kernel variant for a segmented `op` over segments of `mean_len` valid slots on
    /// average: one thread per segment, [`SERIAL_WORKGROUP`] per workgroup, where the op has a
    /// `SERIAL` variant and segments hold at most [`SERIAL_MEAN`] slots on average; else a
    /// workgroup of [`Self::segment_workgroup_size`] threads per segment.
    pub fn segment_kernel_key(&self, op: Op, dtype: DType, mean_len: f64) -> KernelKey {
        let serial = op.spec().variant == Some(SERIAL_OVERRIDE) && mean_len <= SERIAL_MEAN;
        let workgroup = match serial {
            true => SERIAL_WORKGROUP.min(self.workgroup_size(op)),
            false => self.segment_workgroup_size(op, mean_len),
        };
        KernelKey {
            op,
            dtype,
            flavour: self.flavour_at(op, workgroup),
            workgroup,
            variant: serial,
            split: false,
            rows: 1,
        }
    }

    /// The workgroup size for a row op (one workgroup per row of `row_len` elements, read in
    /// at most `reads` strided passes, plus `extra` loop iterations whatever the size):
    /// [`Self::workgroup_size`] on GPUs; on CPU adapters
    /// (lavapipe) the smallest power of two, at least the subgroup size (and 8), whose loops
    /// over the row fit the driver's loop limit. There a workgroup runs as one coroutine per
    /// SIMD group, all switched at every barrier: 1024 × 65,536 bf16 logits took 1.38 s at 256
    /// threads and 1.10 s at 8, 16,384 × 4,096 took 5.41 s and 1.06 s (median wall times of
    /// `trmask analyze --backend gpu`, 2-core host). A size set in [`crate::gpu::ContextOptions`]
    /// is used as is.
    pub fn row_workgroup_size(&self, op: Op, row_len: u64, reads: u64, extra: u64) -> u32 {
        let full = self.workgroup_size(op);
        if self.workgroup_size.is_some() || !self.caps.is_cpu() {
            return full;
        }
        let mut wg = self.floor_workgroup(full);
        while wg < full
            && !crate::gpu::device::capabilities::loops_fit(
                &self.caps,
                row_iterations(row_len, reads, extra, wg),
            )
        {
            wg *= 2;
        }
        wg.min(full)
    }

    /// The kernel variant for a row `op` (see [`Self::row_workgroup_size`]), or
    /// [`crate::Error::Limit`] naming `what()` when even that size's loops do not fit the
    /// driver's budget.
    pub fn row_kernel(
        &self,
        op: Op,
        dtype: DType,
        shape: (u64, u64, u64),
        what: &dyn Fn() -> String,
    ) -> Result<Arc<Kernel>> {
        self.kernel_for(self.row_kernel_key(op, dtype, shape, what)?)
    }

    /// The key of [`Self::row_kernel`] (the same error when the loops do not fit).
    pub fn row_kernel_key(
        &self,
        op: Op,
        dtype: DType,
        (row_len, reads, extra): (u64, u64, u64),
        what: &dyn Fn() -> String,
    ) -> Result<KernelKey> {
        let workgroup = self.row_workgroup_size(op, row_len, reads, extra);
        check_loops(
            &self.caps,
            what,
            row_iterations(row_len, reads, extra, workgroup),
        )?;
        Ok(KernelKey {
            op,
            dtype,
            flavour: self.flavour_at(op, workgroup),
            workgroup,
            variant: false,
            split: false,
            rows: 1,
        })
    }

    /// Threads per workgroup of the vocabulary kernel (`train` the trainer logits' dtype) on
    /// rows of `vocab` elements: [`Self::row_workgroup_size`], raised on CPU adapters to the
    /// size that keeps the row on-chip (read once) when the op's full size allows it.
    pub fn vocab_workgroup_size(&self, train: DType, vocab: u64) -> u32 {
        let op = Op::VocabDivergence(train);
        let wg = self.row_workgroup_size(op, vocab, 3, 0);
        match u32::try_from(crate::gpu::ops::vocab_divergence::on_chip_workgroup(vocab)) {
            Ok(chip) if chip <= self.workgroup_size(op) => wg.max(chip),
            _ => wg,
        }
    }

    /// `key` with at least `wg` threads per workgroup (a power of two up to the op's full
    /// size; never past [`Self::workgroup_size`], so a pinned size stays), its flavour
    /// chosen again for the new size.
    pub fn workgroup_at_least(&self, key: KernelKey, wg: u32) -> KernelKey {
        let full = self.workgroup_size(key.op);
        let workgroup = key.workgroup.max(wg.next_power_of_two().min(full));
        KernelKey {
            workgroup,
            flavour: self.flavour_at(key.op, workgroup),
            ..key
        }
    }

    /// The smallest workgroup worth a dispatch: the subgroup size (at least 8, at most 64),
    /// within `full`.
    fn floor_workgroup(&self, full: u32) -> u32 {
        self.caps.subgroup_sizes.0.clamp(8, 64).min(full)
    }

    /// The kernel for an explicit key (built on first use).
    pub fn kernel_for(&self, key: KernelKey) -> Result<Arc<Kernel>> {
        self.pipelines.get(&self.device, key)
    }

    /// Builds the kernels of `keys` that are not built yet, several at once (one thread per
    /// kernel, at most one per core): pipeline creation runs on the calling thread, so the
    /// builds of one analysis overlap instead of queueing (measured on lavapipe: 0.07–0.13 s for
    /// the vocabulary kernel, 0.03–0.04 s for the masks). The first error, after all ended.
    pub fn build_kernels(&self, keys: &[KernelKey]) -> Result<()> {
        let built = self.pipelines.built();
        let mut todo: Vec<KernelKey> = Vec::new();
        for k in keys {
            if !built.contains(k) && !todo.contains(k) {
                todo.push(*k);
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || -> Result<()> {
            let mut first = Ok(());
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&key) = todo.get(i) else {
                    return first;
                };
                if let Err(e) = self.kernel_for(key) {
                    first = first.and(Err(e));
                }
            }
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.clamp(1, todo.len().max(1));
        std::thread::scope(|s| {
            let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut first = work();
            for h in helpers {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::Gpu("a kernel build panicked".into())));
                first = first.and(r);
            }
            first
        })
    }

    /// The kernels built on this context so far (by [`Self::build_kernels`], a warm-up or
    /// first use), ordered by label.
    pub fn built_kernels(&self) -> Vec<KernelKey> {
        self.pipelines.built()
    }

    /// Builds every kernel variant this device will use now instead of on first use.
    pub fn warm_up(&self) -> Result<()> {
        let mut keys: Vec<KernelKey> = all_kernel_keys()
            .into_iter()
            .filter(|k| {
                k.flavour == self.flavour(k.op)
                    && k.workgroup == self.workgroup_size(k.op)
                    && !k.split
            })
            .collect();
        for &op in Op::ALL {
            for &dtype in op.spec().dtypes {
                keys.push(self.kernel_key(op, dtype));
            }
        }
        self.build_kernels(&keys)
    }
}

impl Context {
    /// The configuration of the vocabulary kernel for `rows` rows of `vocab` elements of dtypes
    /// `dtypes` (rollout, trainer): the pinned one ([`crate::gpu::ContextOptions::vocab_kernel`],
    /// else [`VOCAB_KERNEL_ENV`]; an error naming it when it does not parse), else on GPUs the
    /// tuner's choice (`vocab_tuner.rs`: timed once per adapter, driver, dtypes and size
    /// buckets, cached on disk), else [`Self::vocab_default`].
    pub fn vocab_variant(
        &self,
        dtypes: (DType, DType),
        rows: u64,
        vocab: u64,
    ) -> Result<VocabVariant> {
        if let Some(v) = self.vocab_pin {
            v.check()?;
            return Ok(v);
        }
        // set and not blank (an empty value is the same as none)
        if let Some(text) = std::env::var(VOCAB_KERNEL_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
        {
            return VocabVariant::parse(&text, VOCAB_KERNEL_ENV);
        }
        if let Some(v) = self.tuned_vocab(dtypes, rows, vocab) {
            return Ok(v);
        }
        Ok(self.vocab_default(dtypes.1, rows, vocab))
    }

    /// The default configuration: [`Self::vocab_workgroup_size`] threads per workgroup; on CPU
    /// adapters (lavapipe) whole rows and the plain pass 1 first (masks cost llvmpipe a
    /// fifth); on GPUs the masked pass 1 from the start, and rows cut into slices when fewer
    /// than [`FILL_WORKGROUPS`] rows would leave the GPU idle (at most one slice per thread,
    /// none shorter than the smallest of [`SLICE_LENGTHS`]).
    pub fn vocab_default(&self, train: DType, rows: u64, vocab: u64) -> VocabVariant {
        let workgroup = self.vocab_workgroup_size(train, vocab);
        let cpu = self.caps.is_cpu();
        let mut slice = 0;
        if !cpu && rows < FILL_WORKGROUPS {
            let want = FILL_WORKGROUPS.div_ceil(rows.max(1));
            let most = (vocab / u64::from(SLICE_LENGTHS[0])).min(u64::from(workgroup));
            let s = want.min(most);
            if s >= 2 {
                slice = (vocab.div_ceil(s).div_ceil(8) * 8) as u32;
            }
        }
        VocabVariant {
            workgroup,
            slice,
            masked_first: !cpu,
            subgroups: false,
            rows: 1,
        }
    }

    /// The subgroup size the vocabulary kernel's subgroup trees use here (`None`: none fixed of
    /// at least 8 lanes, or the options force [`Flavour::Workgroup`]).
    pub fn vocab_subgroup_lanes(&self) -> Option<u32> {
        match self.flavour {
            Some(Flavour::Workgroup) => None,
            _ => crate::gpu::ops::vocab_variant::subgroup_lanes(&self.caps),
        }
    }

    /// Every configuration a tuner may pick on `rows` rows of `vocab` elements (`train` the
    /// trainer logits' dtype), the default first: workgroups of 64, 128 and 256 threads (only
    /// the size set in [`crate::gpu::ContextOptions::workgroup_size`] when one is, and within the
    /// device's limits), each with whole rows and with each of [`SLICE_LENGTHS`] that cuts the
    /// row into 2 ..= workgroup slices, each with workgroup-memory trees and, where
    /// [`Self::vocab_subgroup_lanes`] divides the workgroup, subgroup trees; on rows of at most
    /// [`ROWS_MAX_VOCAB`] elements one subgroup per row, as many rows per workgroup as 256
    /// threads hold (on GPUs at most `rows / FILL_WORKGROUPS`, so the batch still launches
    /// [`FILL_WORKGROUPS`] workgroups); pass 1 masked first on GPUs, plain first on CPU
    /// adapters. The gpu_bench suite times each with [`crate::gpu::vocab_divergence_with`].
    pub fn vocab_variants(&self, train: DType, rows: u64, vocab: u64) -> Vec<VocabVariant> {
        let first = self.vocab_default(train, rows, vocab);
        let cap = self.workgroup_size(Op::VocabDivergence(train));
        let sizes: Vec<u32> = match self.workgroup_size {
            Some(_) => vec![cap],
            None => [64, 128, 256].into_iter().filter(|&w| w <= cap).collect(),
        };
        let lanes = self.vocab_subgroup_lanes();
        let mut out = vec![first];
        for workgroup in sizes {
            let whole = VocabVariant {
                workgroup,
                slice: 0,
                ..first
            };
            let cuts = SLICE_LENGTHS
                .iter()
                .map(|&slice| VocabVariant { slice, ..whole });
            for v in std::iter::once(whole).chain(cuts) {
                let n = v.slices(vocab);
                let fits = v.slice == 0 || (n >= 2 && v.slice_len(vocab) == v.slice);
                let sg = lanes.is_some_and(|l| workgroup.is_multiple_of(l));
                let sg = sg.then_some(VocabVariant {
                    subgroups: true,
                    ..v
                });
                for v in std::iter::once(v).chain(sg) {
                    if fits && !out.contains(&v) {
                        out.push(v);
                    }
                }
            }
        }
        if let Some(lanes) = lanes.filter(|_| vocab <= ROWS_MAX_VOCAB) {
            let mut most = u64::from(MAX_WORKGROUP / lanes);
            if !self.caps.is_cpu() {
                most = most.min(rows / FILL_WORKGROUPS);
            }
            if most >= 2 {
                out.push(VocabVariant {
                    workgroup: lanes,
                    slice: 0,
                    masked_first: first.masked_first,
                    subgroups: true,
                    rows: 1 << most.ilog2(),
                });
            }
        }
        out
    }
}

/// Loop iterations of one invocation of a row kernel with `wg` threads: `reads` strided passes
/// over `row_len` elements plus `extra` whatever the size.
fn row_iterations(row_len: u64, reads: u64, extra: u64, wg: u32) -> u64 {
    reads
        .saturating_mul(row_len.div_ceil(u64::from(wg)))
        .saturating_add(extra)
}

/// How a segmented kernel spreads its segments: (segments per workgroup, the stride of a
/// thread's loop over its segment) — one and the workgroup size, or for a `SERIAL` variant the
/// workgroup size and one.
pub(in crate::gpu) fn segment_layout(key: &KernelKey) -> (usize, u64) {
    match key.variant {
        true => (key.workgroup as usize, 1),
        false => (1, u64::from(key.workgroup)),
    }
}
