//! The open device and its queue, capabilities, pipeline cache and buffer pool (opened by
//! `adapter.rs`); the one submit / wait / read-back path every op goes through
//! ([`Context::run`], [`Context::submit`], [`Context::wait`]).

use crate::error::{Error, Result};
use crate::gpu::device::adapter::{
    capabilities_of, is_software, open_device, pick_adapter, Uncaptured,
};
pub use crate::gpu::device::adapter::{list_adapters, ContextOptions};
use crate::gpu::device::buffers::{
    fill, read_mapped, stage_copy, write_mapped, BufferKind, BufferPool,
};
use crate::gpu::device::buffers::{GpuBuffer, Staged};
use crate::gpu::device::capabilities::Capabilities;
use crate::gpu::device::pass::{Bind, Pass};
use crate::gpu::device::pipeline::{Flavour, PipelineCache};
use crate::stats::VocabPasses;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `last_device_ns` when no run has been timed.
const NOT_TIMED: u64 = u64::MAX;

/// Largest upload of host logits per tensor per chunk of the vocabulary kernel by default
/// (bytes; within the device's binding limit, one row at least): hundreds of LLM rows per
/// dispatch and submission.
pub const VOCAB_HOST_CHUNK_BYTES: u64 = 64 << 20;

/// The same on CPU adapters (lavapipe: device memory is the host's, each dispatch runs inside
/// the submit), where larger slots only cost resident memory and page faults (whole process,
/// 1024 × 65,536 bf16: 64 MiB chunks ~10 % slower than 8 MiB, 213 MB more peak RSS).
pub const CPU_HOST_CHUNK_BYTES: u64 = 8 << 20;

thread_local! {
    /// Devices with a [`Context::scoped`] error scope open on this thread: work inside one is
    /// checked once, when it closes.
    static SCOPED: std::cell::RefCell<Vec<wgpu::Device>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The first `len` values of a readback (an error, not a panic, when it holds fewer).
pub(in crate::gpu) fn result_words<T: bytemuck::Pod>(bytes: &[u8], len: usize) -> Result<&[T]> {
    bytes
        .get(..len.saturating_mul(std::mem::size_of::<T>()))
        .and_then(|b| bytemuck::try_cast_slice(b).ok())
        .ok_or_else(|| Error::Gpu(format!("bad result buffer: {} bytes", bytes.len())))
}

/// A submission of [`Context::submit`], to [`Context::wait`] for.
#[derive(Debug, Clone)]
pub struct Submission(wgpu::SubmissionIndex);

/// An open device with its queue, capabilities, pipeline cache and buffer pool.
pub struct Context {
    pub(in crate::gpu) device: wgpu::Device,
    queue: wgpu::Queue,
    pub(in crate::gpu) caps: Capabilities,
    pub(in crate::gpu) workgroup_size: Option<u32>,
    pub(in crate::gpu) flavour: Option<Flavour>,
    pub(in crate::gpu) vocab_pin: Option<crate::gpu::ops::vocab_variant::VocabVariant>,
    pub(in crate::gpu) vocab_tuned:
        Mutex<std::collections::HashMap<String, crate::gpu::ops::vocab_variant::VocabVariant>>,
    pub(in crate::gpu) pipelines: PipelineCache,
    pool: BufferPool,
    uncaptured: Uncaptured,
    last_device_ns: AtomicU64,
    last_vocab: Mutex<Option<VocabPasses>>,
    submissions: AtomicU64,
    host_chunk_bytes: u64,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("caps", &self.caps)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens an adapter and a device with the adapter's real limits and the optional features
    /// trmask can use (SUBGROUP, SHADER_F16, TIMESTAMP_QUERY) when present.
    ///
    /// The adapter: the first named like `adapter_name` / `WGPU_ADAPTER_NAME`; else wgpu's
    /// high-performance choice among `backends` / `WGPU_BACKEND`; else among Vulkan, Metal and
    /// DX12, with GL (whose EGL / WGL start-up costs tens of milliseconds) started only when
    /// those offer no hardware adapter and taken only when it has one.
    pub fn new(options: &ContextOptions) -> Result<Self> {
        Self::open(pick_adapter(options)?, options)
    }

    /// Like [`Context::new`], but stops at the adapter when it is a software rasterizer
    /// (Mesa's lavapipe / llvmpipe, WARP): `Ok(Err(name))` without opening a device, for a
    /// caller that would not use one (`Backend::Auto`).
    pub(crate) fn new_unless_software(
        options: &ContextOptions,
    ) -> Result<std::result::Result<Self, String>> {
        let adapter = pick_adapter(options)?;
        if is_software(&adapter) {
            return Ok(Err(adapter.get_info().name));
        }
        Self::open(adapter, options).map(Ok)
    }

    fn open(adapter: wgpu::Adapter, options: &ContextOptions) -> Result<Self> {
        let (device, queue, uncaptured) = open_device(adapter, options)?;
        Ok(Self::assemble(device, queue, options, uncaptured))
    }

    /// Shares a caller's device and queue (no copy between trmask and a wgpu-based stack).
    /// trmask's own work runs inside error scopes; the caller's uncaptured-error handler is
    /// left in place.
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        Self::assemble(device, queue, &ContextOptions::default(), Arc::default())
    }

    /// Like [`Context::from_wgpu`] with options (only `max_binding_size`, `workgroup_size`,
    /// `flavour` and `mapped_uploads` apply; mapped uploads need the caller's device to have
    /// `MAPPABLE_PRIMARY_BUFFERS`).
    pub fn from_wgpu_with(
        device: wgpu::Device,
        queue: wgpu::Queue,
        options: &ContextOptions,
    ) -> Self {
        Self::assemble(device, queue, options, Arc::default())
    }

    fn assemble(
        device: wgpu::Device,
        queue: wgpu::Queue,
        options: &ContextOptions,
        uncaptured: Uncaptured,
    ) -> Self {
        let limits = device.limits();
        let caps = capabilities_of(
            &device.adapter_info(),
            &limits,
            device.features(),
            options.max_binding_size,
            options.mapped_uploads,
        );
        let host_chunk_bytes = match (options.host_chunk_bytes, caps.is_cpu()) {
            (Some(b), _) => b.max(4),
            (None, true) => CPU_HOST_CHUNK_BYTES,
            (None, false) => VOCAB_HOST_CHUNK_BYTES,
        };
        Context {
            pool: BufferPool::new(limits.max_buffer_size),
            device,
            queue,
            caps,
            workgroup_size: options.workgroup_size,
            flavour: options.flavour,
            vocab_pin: options.vocab_kernel,
            vocab_tuned: Mutex::default(),
            pipelines: PipelineCache::default(),
            uncaptured,
            last_device_ns: AtomicU64::new(NOT_TIMED),
            last_vocab: Mutex::new(None),
            submissions: AtomicU64::new(0),
            host_chunk_bytes,
        }
    }

    /// The device's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    /// The wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }
    /// The wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }
    /// The buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Runs `f` inside out-of-memory and validation error scopes: a wgpu error raised by `f`
    /// comes back as [`Error::Gpu`] instead of reaching the uncaptured-error handler (whose
    /// default panics on a caller's device shared through [`Context::from_wgpu`]). Nested
    /// calls on the same device and thread (and the submissions inside) open no scope of their
    /// own: one call of an op is one pair of scopes, checked once at its end.
    pub fn scoped<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.in_scope() {
            return f();
        }
        struct Open<'a>(&'a wgpu::Device);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                SCOPED.with(|s| {
                    let mut s = s.borrow_mut();
                    if let Some(i) = s.iter().rposition(|d| d == self.0) {
                        s.remove(i);
                    }
                });
            }
        }
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        SCOPED.with(|s| s.borrow_mut().push(self.device.clone()));
        let open = Open(&self.device);
        let r = f();
        drop(open);
        let verr = pollster::block_on(validation.pop());
        let oerr = pollster::block_on(oom.pop());
        match (verr, oerr) {
            (Some(e), _) => Err(Error::Gpu(e.to_string())),
            (None, Some(e)) => Err(Error::OutOfMemory(e.to_string())),
            (None, None) => r,
        }
    }

    /// A storage buffer holding `data` (length rounded up to 4 bytes).
    pub fn upload(&self, data: &[u8]) -> Result<GpuBuffer> {
        self.scoped(|| {
            let buf = self
                .pool
                .get(&self.device, BufferKind::Storage, data.len() as u64)?;
            if data.len().is_multiple_of(4) {
                self.queue.write_buffer(buf.raw(), 0, data);
            } else {
                let mut padded = data.to_vec();
                padded.resize(data.len().div_ceil(4) * 4, 0);
                self.queue.write_buffer(buf.raw(), 0, &padded);
            }
            Ok(buf)
        })
    }

    /// An uninitialised storage buffer of `bytes` bytes (for kernel outputs): on adapters with
    /// [`Capabilities::mapped_uploads`] one the host maps and reads in place ([`Context::run`]
    /// copies nothing to a staging buffer), else a device-local one.
    pub fn output(&self, bytes: u64) -> Result<GpuBuffer> {
        let kind = BufferKind::output(self.caps.mapped_uploads);
        self.scoped(|| self.pool.get(&self.device, kind, bytes.div_ceil(4) * 4))
    }

    fn in_scope(&self) -> bool {
        SCOPED.with(|s| s.borrow().contains(&self.device))
    }

    /// Bytes of host logits per tensor the vocabulary kernel uploads per chunk
    /// ([`ContextOptions::host_chunk_bytes`], else [`VOCAB_HOST_CHUNK_BYTES`], on CPU
    /// adapters [`CPU_HOST_CHUNK_BYTES`]).
    pub fn host_chunk_bytes(&self) -> u64 {
        self.host_chunk_bytes
    }

    fn take_uncaptured(&self) -> Option<String> {
        let mut v = self.uncaptured.lock().ok()?;
        if v.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut *v).join("; "))
        }
    }

    /// Device time of the last completed [`Context::run`] (its compute pass, from
    /// `TIMESTAMP_QUERY` timestamps at the pass's start and end), in nanoseconds; `None` without
    /// the feature or before any run. With several threads sharing the context, the run that
    /// finished last.
    pub fn last_device_ns(&self) -> Option<u64> {
        match self.last_device_ns.load(Ordering::Relaxed) {
            NOT_TIMED => None,
            ns => Some(ns),
        }
    }

    /// Command buffers this context has submitted so far (each op makes one per call, or one
    /// per host chunk of logits: never one per sequence).
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// How the vocabulary kernel read the rows of the last exact-divergence call on this context
    /// (`None` before any); with several threads sharing the context, the call that finished
    /// last.
    pub fn last_vocab_passes(&self) -> Option<VocabPasses> {
        *self.last_vocab.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(in crate::gpu) fn record_vocab_passes(&self, passes: VocabPasses) {
        *self.last_vocab.lock().unwrap_or_else(|e| e.into_inner()) = Some(passes);
    }

    /// A write of `data` into `buf` at byte `offset`, ordered before the next submission
    /// (data length and offset multiples of 4).
    pub fn write(&self, buf: &GpuBuffer, offset: u64, data: &[u8]) -> Result<()> {
        self.scoped(|| {
            self.queue.write_buffer(buf.raw(), offset, data);
            Ok(())
        })
    }

    /// Writes `parts` (any lengths, total a multiple of 4) back to back from byte 0 of an
    /// [`Context::upload_slot`] before the next submission: in place once the GPU is done with
    /// a mapped slot (the only copy of the bytes), else straight into one staging allocation of
    /// the queue (`write_buffer_with`: one copy of the bytes, none gathered on the host).
    pub fn write_slot(&self, buf: &GpuBuffer, parts: &[&[u8]]) -> Result<()> {
        if buf.kind() == BufferKind::MappedStorage {
            return write_mapped(&self.device, buf, parts);
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let Some(size) = wgpu::BufferSize::new(total as u64) else {
            return Ok(());
        };
        if !total.is_multiple_of(4) || total as u64 > buf.raw().size() {
            return Err(Error::Gpu(format!(
                "upload of {total} bytes into a {}-byte slot (whole words that fit expected)",
                buf.raw().size()
            )));
        }
        self.scoped(|| {
            let mut view = self
                .queue
                .write_buffer_with(buf.raw(), 0, size)
                .ok_or_else(|| Error::Gpu("cannot stage an upload".into()))?;
            fill(view.slice(..), parts);
            Ok(())
        })
    }

    /// Writes `parts` (total a multiple of 4) for `slot` with the current rayon pool's threads:
    /// in place into a mapped slot, else into `staging` (its [`Context::upload_staging`]), whose
    /// bytes the submission handed the returned [`Staged`] copies into the slot first (without a
    /// staging buffer, through the queue as [`Context::write_slot`]). Call it once the slot's
    /// and the staging buffer's last submission has finished (a [`crate::gpu::ops::slots::SlotRing`]).
    pub fn stage(
        &self,
        slot: &GpuBuffer,
        staging: Option<&GpuBuffer>,
        parts: &[&[u8]],
    ) -> Result<Staged> {
        match staging {
            Some(st) if slot.kind() == BufferKind::Storage => {
                stage_copy(&self.device, slot, st, parts)
            }
            _ => self.write_slot(slot, parts).map(|()| Staged { copy: None }),
        }
    }

    /// Records `passes` into one command buffer and submits it without waiting (e.g. to
    /// overlap the upload of the next chunk with this compute); errors are checked before
    /// this returns (inside a [`Context::scoped`] call: when that call ends). See
    /// [`Context::wait`].
    pub fn submit(&self, passes: &[Pass<'_>]) -> Result<Submission> {
        self.submit_staged(&[], passes)
    }

    /// [`Context::submit`] copying each of `staged` into its slot before the passes.
    pub fn submit_staged(&self, staged: &[Staged], passes: &[Pass<'_>]) -> Result<Submission> {
        let (index, _staging) = self.submit_with(staged, passes, &[], false)?;
        Ok(Submission(index))
    }

    /// Waits until the GPU has finished `submission` (and everything submitted before it).
    pub fn wait(&self, submission: &Submission) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission.0.clone()),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::Gpu(format!("waiting for the device: {e}")))
    }

    /// Records every pass into one command buffer, copies each of `readbacks` to a staging
    /// buffer (not a mapped output of [`Context::output`]: that is read in place), submits
    /// once, checks for errors, waits, and returns the bytes of each readback.
    /// With `TIMESTAMP_QUERY`, the compute pass is timed: see [`Context::last_device_ns`].
    /// Safe with other threads submitting to and polling the same device (see `read_back`).
    pub fn run(&self, passes: &[Pass<'_>], readbacks: &[&GpuBuffer]) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::with_capacity(readbacks.len());
        self.run_each(passes, readbacks, &mut |_, bytes| {
            out.push(bytes.to_vec());
            Ok(())
        })?;
        Ok(out)
    }

    /// [`Context::run`] handing readback `i`'s bytes to `f(i, bytes)` in order while they are
    /// still mapped, with no copy (large per-token results); `f`'s first error ends the read.
    pub fn run_each(
        &self,
        passes: &[Pass<'_>],
        readbacks: &[&GpuBuffer],
        f: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.run_each_staged(&[], passes, readbacks, f)
    }

    /// [`Context::run_each`] copying each of `staged` into its slot before the passes.
    pub fn run_each_staged(
        &self,
        staged: &[Staged],
        passes: &[Pass<'_>],
        readbacks: &[&GpuBuffer],
        f: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let timed = self.caps.timestamp_query;
        let (index, staging) = self.submit_with(staged, passes, readbacks, timed)?;
        // a readback without a staging buffer is read in place (a mapped output)
        let bufs: Vec<&GpuBuffer> = staging
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().or(readbacks.get(i).copied()))
            .collect();
        let mut ticks = None;
        let read = read_mapped(&self.device, index, &bufs, &mut |i, bytes| {
            if i < readbacks.len() {
                return f(i, bytes);
            }
            // the timestamps, after the readbacks
            ticks = bytes.get(..16).and_then(|b| {
                let t: &[u64] = bytemuck::try_cast_slice(b).ok()?;
                t[1].checked_sub(t[0])
            });
            Ok(())
        });
        drop(bufs);
        if let Err(e) = read {
            // possibly still in use: never back into the pool
            staging.into_iter().flatten().for_each(GpuBuffer::discard);
            return Err(e);
        }
        if let Some(t) = ticks {
            let ns = (t as f64 * f64::from(self.queue.get_timestamp_period())).round() as u64;
            self.last_device_ns
                .store(ns.min(NOT_TIMED - 1), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Records and submits inside error scopes (or the enclosing [`Context::scoped`] call's);
    /// checks validation / out-of-memory / uncaptured errors before returning the submission
    /// and its staging buffers (one per readback, then the timestamps when `timed`).
    fn submit_with(
        &self,
        staged: &[Staged],
        passes: &[Pass<'_>],
        readbacks: &[&GpuBuffer],
        timed: bool,
    ) -> Result<(wgpu::SubmissionIndex, Vec<Option<GpuBuffer>>)> {
        let device = &self.device;
        let (verr, oerr, recorded) = if self.in_scope() {
            (None, None, self.record(staged, passes, readbacks, timed))
        } else {
            let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let recorded = self.record(staged, passes, readbacks, timed);
            let verr = pollster::block_on(validation.pop());
            (verr, pollster::block_on(oom.pop()), recorded)
        };
        let (index, staging, _uniforms) = recorded?;
        let err = match (verr, oerr) {
            (Some(e), _) => Some(Error::Gpu(e.to_string())),
            (None, Some(e)) => Some(Error::OutOfMemory(e.to_string())),
            (None, None) => self.take_uncaptured().map(Error::Gpu),
        };
        if let Some(e) = err {
            staging.into_iter().flatten().for_each(GpuBuffer::discard);
            return Err(e);
        }
        Ok((index, staging))
    }

    fn record(
        &self,
        staged: &[Staged],
        passes: &[Pass<'_>],
        readbacks: &[&GpuBuffer],
        timed: bool,
    ) -> Result<(wgpu::SubmissionIndex, Vec<Option<GpuBuffer>>, GpuBuffer)> {
        let device = &self.device;
        let align = u64::from(self.caps.uniform_offset_alignment.max(4));
        let (stride, bytes) = crate::gpu::device::pass::uniform_bytes(passes, align)?;
        let uniforms = self.pool.get(
            device,
            BufferKind::Uniform,
            stride * passes.len().max(1) as u64,
        )?;
        if !bytes.is_empty() {
            self.queue.write_buffer(uniforms.raw(), 0, &bytes);
        }
        let mut groups = Vec::with_capacity(passes.len());
        for (i, p) in passes.iter().enumerate() {
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: uniforms.raw(),
                    offset: i as u64 * stride,
                    size: NonZeroU64::new(p.params.len() as u64),
                }),
            }];
            for (j, b) in p.bindings.iter().enumerate() {
                let (buffer, offset, size) = match *b {
                    Bind::Whole(g) => (g.raw(), 0, g.len().div_ceil(4) * 4),
                    Bind::Window {
                        buffer,
                        offset,
                        size,
                    } => (buffer.raw(), offset, size),
                    Bind::Device {
                        logits,
                        offset,
                        size,
                    } => (logits.buffer(), offset, size),
                };
                entries.push(wgpu::BindGroupEntry {
                    binding: j as u32 + 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer,
                        offset,
                        size: NonZeroU64::new(size),
                    }),
                });
            }
            groups.push(device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("trmask"),
                layout: &p.kernel.layout,
                entries: &entries,
            }));
        }
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("trmask"),
        });
        for (src, dst, bytes) in staged.iter().filter_map(|s| s.copy.as_ref()) {
            encoder.copy_buffer_to_buffer(src, 0, dst, 0, *bytes);
        }
        let timer = if timed {
            let set = device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("trmask timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            Some((set, self.pool.get(device, BufferKind::QueryResolve, 16)?))
        } else {
            None
        };
        {
            let mut cpass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("trmask"),
                timestamp_writes: timer
                    .as_ref()
                    .map(|(set, _)| wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
            });
            for (p, g) in passes.iter().zip(&groups) {
                if p.grid.0 == 0 || p.grid.1 == 0 {
                    continue;
                }
                cpass.set_pipeline(&p.kernel.pipeline);
                cpass.set_bind_group(0, g, &[]);
                cpass.dispatch_workgroups(p.grid.0, p.grid.1, 1);
            }
        }
        let mut staging = Vec::with_capacity(readbacks.len() + 1);
        for rb in readbacks {
            if rb.kind() == BufferKind::MappedOutput {
                staging.push(None); // read in place
                continue;
            }
            let len = rb.len().div_ceil(4) * 4;
            let st = self.pool.get(device, BufferKind::Staging, len)?;
            encoder.copy_buffer_to_buffer(rb.raw(), 0, st.raw(), 0, len);
            staging.push(Some(st));
        }
        if let Some((set, resolve)) = &timer {
            encoder.resolve_query_set(set, 0..2, resolve.raw(), 0);
            let st = self.pool.get(device, BufferKind::Staging, 16)?;
            encoder.copy_buffer_to_buffer(resolve.raw(), 0, st.raw(), 0, 16);
            staging.push(Some(st));
        }
        let index = self.queue.submit([encoder.finish()]);
        self.submissions.fetch_add(1, Ordering::Relaxed);
        Ok((index, staging, uniforms))
    }
}
