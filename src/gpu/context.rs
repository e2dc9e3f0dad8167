//! The wgpu instance, adapter, device and queue; the adapter's capabilities; running a list of
//! kernel dispatches as one submission.

use super::buffers::{BufferKind, BufferPool, GpuBuffer};
use super::chunking::{ChunkLimits, MAX_WORKGROUPS_PER_DIM};
use super::pipeline::{
    all_kernel_keys, Flavour, Kernel, KernelKey, Meta, Op, PipelineCache, META_SIZE,
};
use crate::batch::DType;
use crate::error::{Error, Result};
use std::num::NonZeroU64;
use std::sync::{mpsc, Arc, Mutex};

/// How to open a device.
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Backends to consider; `None`: `WGPU_BACKEND` if set, else all.
    pub backends: Option<wgpu::Backends>,
    /// Pick the first adapter whose name contains this (case-insensitive); `None`:
    /// `WGPU_ADAPTER_NAME` if set, else wgpu's default choice (high performance).
    pub adapter_name: Option<String>,
    /// Force a smaller binding-size limit (bytes, at least 256) so that work splits into many
    /// chunks (tests); `None`: the device's limit.
    pub max_binding_size: Option<u64>,
    /// Threads per workgroup for every kernel (`None`: each op's default, capped by the device).
    pub workgroup_size: Option<u32>,
}

/// What the device offers and what trmask uses of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA H100`, …).
    pub adapter_name: String,
    /// Backend (`Vulkan`, `Metal`, `Dx12`, `Gl`).
    pub backend: String,
    /// Device type (`Cpu`, `DiscreteGpu`, …).
    pub device_type: String,
    /// Driver name and info.
    pub driver: String,
    /// `max_storage_buffer_binding_size` of the device.
    pub max_storage_binding: u64,
    /// `max_buffer_size` of the device.
    pub max_buffer_size: u64,
    /// The binding limit chunks are planned against (forced value or the smaller of the two).
    pub max_binding_bytes: u64,
    /// `max_compute_invocations_per_workgroup`.
    pub max_workgroup_invocations: u32,
    /// `max_compute_workgroup_size_x`.
    pub max_workgroup_size_x: u32,
    /// `max_compute_workgroups_per_dimension`.
    pub max_workgroups_per_dim: u32,
    /// `max_compute_workgroup_storage_size` (bytes).
    pub max_workgroup_storage: u32,
    /// `min_uniform_buffer_offset_alignment`.
    pub uniform_offset_alignment: u32,
    /// `min_storage_buffer_offset_alignment`.
    pub storage_offset_alignment: u32,
    /// `Features::SUBGROUP` enabled.
    pub subgroups: bool,
    /// Subgroup size range (meaningful when `subgroups`).
    pub subgroup_sizes: (u32, u32),
    /// `Features::SHADER_F16` enabled.
    pub shader_f16: bool,
    /// `Features::TIMESTAMP_QUERY` enabled.
    pub timestamp_query: bool,
}

impl Capabilities {
    fn from_device(
        info: &wgpu::AdapterInfo,
        limits: &wgpu::Limits,
        features: wgpu::Features,
        forced: Option<u64>,
    ) -> Self {
        // Kernels index 32-bit words with u32: keep every binding below 4 GiB.
        let natural = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            .min(u64::from(u32::MAX) & !255);
        Capabilities {
            adapter_name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_binding_bytes: forced.map_or(natural, |f| f.clamp(256, natural.max(256))),
            max_workgroup_invocations: limits.max_compute_invocations_per_workgroup,
            max_workgroup_size_x: limits.max_compute_workgroup_size_x,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            uniform_offset_alignment: limits.min_uniform_buffer_offset_alignment,
            storage_offset_alignment: limits.min_storage_buffer_offset_alignment,
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_sizes: (info.subgroup_min_size, info.subgroup_max_size),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        }
    }

    /// A multi-line human-readable summary (for `trmask devices`).
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let yn = |b: bool| if b { "yes" } else { "no" };
        format!(
            "{} ({}, {})\n  driver: {}\n  max storage binding: {:.0} MiB, max buffer: {:.0} MiB, chunk limit: {:.2} MiB\n  workgroups: {} threads max, {} per dimension, {} KiB shared memory\n  subgroups: {}{}\n  shader-f16: {}, timestamps: {}",
            self.adapter_name,
            self.backend,
            self.device_type,
            if self.driver.is_empty() { "?" } else { &self.driver },
            mib(self.max_storage_binding),
            mib(self.max_buffer_size),
            mib(self.max_binding_bytes),
            self.max_workgroup_invocations,
            self.max_workgroups_per_dim,
            self.max_workgroup_storage / 1024,
            yn(self.subgroups),
            if self.subgroups {
                format!(" (size {}..{})", self.subgroup_sizes.0, self.subgroup_sizes.1)
            } else {
                String::new()
            },
            yn(self.shader_f16),
            yn(self.timestamp_query),
        )
    }
}

/// One kernel dispatch of a [`Context::run`] submission.
#[derive(Debug)]
pub struct Pass<'a> {
    /// The kernel.
    pub kernel: Arc<Kernel>,
    /// Its sizes (binding 0).
    pub meta: Meta,
    /// Storage buffers for bindings 1, 2, … (each bound whole: its requested length).
    pub buffers: Vec<&'a GpuBuffer>,
    /// Workgroups in x and y (see [`super::chunking::dispatch_grid`]).
    pub grid: (u32, u32),
}

fn instance_for(backends: Option<wgpu::Backends>) -> (wgpu::Instance, wgpu::Backends) {
    let backends = backends
        .or_else(wgpu::Backends::from_env)
        .unwrap_or(wgpu::Backends::all());
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    (wgpu::Instance::new(desc), backends)
}

/// Every adapter wgpu can see (honouring `WGPU_BACKEND`): `name (backend, device type)`.
pub fn list_adapters() -> Vec<String> {
    let (instance, backends) = instance_for(None);
    pollster::block_on(instance.enumerate_adapters(backends))
        .iter()
        .map(|a| {
            let i = a.get_info();
            format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
        })
        .collect()
}

/// An open device with its queue, capabilities, pipeline cache and buffer pool.
pub struct Context {
    device: wgpu::Device,
    queue: wgpu::Queue,
    caps: Capabilities,
    workgroup_size: Option<u32>,
    pipelines: PipelineCache,
    pool: BufferPool,
    uncaptured: Arc<Mutex<Vec<String>>>,
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
    pub fn new(options: &ContextOptions) -> Result<Self> {
        let (instance, backends) = instance_for(options.backends);
        let wanted_name = options
            .adapter_name
            .clone()
            .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok())
            .filter(|s| !s.is_empty());
        let adapter = match &wanted_name {
            Some(name) => {
                let lname = name.to_lowercase();
                let adapters = pollster::block_on(instance.enumerate_adapters(backends));
                let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&lname))
                    .ok_or_else(|| {
                        Error::NoAdapter(format!(
                            "no adapter named like `{name}` (found: {})",
                            if names.is_empty() {
                                "none".to_string()
                            } else {
                                names.join(", ")
                            }
                        ))
                    })?
            }
            None => pollster::block_on(
                instance.request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::from_env()
                        .unwrap_or(wgpu::PowerPreference::HighPerformance),
                    force_fallback_adapter: false,
                    compatible_surface: None,
                    apply_limit_buckets: false,
                }),
            )
            .map_err(|e| Error::NoAdapter(e.to_string()))?,
        };
        let optional =
            wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY;
        let features = adapter.features() & optional;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("trmask"),
            required_features: features,
            required_limits: limits,
            experimental_features: wgpu::ExperimentalFeatures::default(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Gpu(format!("cannot open device: {e}")))?;
        let uncaptured: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let sink = uncaptured.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut v) = sink.lock() {
                v.push(format!("device lost ({reason:?}): {msg}"));
            }
        });
        Ok(Self::assemble(device, queue, options, uncaptured))
    }

    /// Shares a caller's device and queue (no copy between trmask and a wgpu-based stack).
    /// trmask's own work runs inside error scopes; the caller's uncaptured-error handler is
    /// left in place.
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        Self::assemble(device, queue, &ContextOptions::default(), Arc::default())
    }

    /// Like [`Context::from_wgpu`] with options (only `max_binding_size` and `workgroup_size`
    /// apply).
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
        uncaptured: Arc<Mutex<Vec<String>>>,
    ) -> Self {
        let limits = device.limits();
        let caps = Capabilities::from_device(
            &device.adapter_info(),
            &limits,
            device.features(),
            options.max_binding_size,
        );
        Context {
            pool: BufferPool::new(limits.max_buffer_size),
            device,
            queue,
            caps,
            workgroup_size: options.workgroup_size,
            pipelines: PipelineCache::default(),
            uncaptured,
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
            .clamp(1, super::pipeline::MAX_WORKGROUP);
        want.clamp(1, cap)
    }

    /// The kernel variant for `op` on `dtype` (workgroup flavour, this device's workgroup size).
    pub fn kernel(&self, op: Op, dtype: DType) -> Result<Arc<Kernel>> {
        self.kernel_for(KernelKey {
            op,
            dtype,
            flavour: Flavour::Workgroup,
            workgroup: self.workgroup_size(op),
        })
    }

    /// The kernel for an explicit key (built on first use).
    pub fn kernel_for(&self, key: KernelKey) -> Result<Arc<Kernel>> {
        self.pipelines.get(&self.device, key)
    }

    /// Builds every kernel variant this device will use now instead of on first use.
    pub fn warm_up(&self) -> Result<()> {
        for key in all_kernel_keys() {
            if key.flavour == Flavour::Workgroup && key.workgroup == self.workgroup_size(key.op) {
                self.kernel_for(key)?;
            }
        }
        for &op in Op::ALL {
            for &dtype in op.spec().dtypes {
                self.kernel(op, dtype)?;
            }
        }
        Ok(())
    }

    /// Runs `f` inside out-of-memory and validation error scopes: a wgpu error raised by `f`
    /// comes back as [`Error::Gpu`] instead of reaching the uncaptured-error handler (whose
    /// default panics on a caller's device shared through [`Context::from_wgpu`]).
    pub fn scoped<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f();
        let verr = pollster::block_on(validation.pop());
        let oerr = pollster::block_on(oom.pop());
        match verr.or(oerr) {
            Some(e) => Err(Error::Gpu(e.to_string())),
            None => r,
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

    /// An uninitialised storage buffer of `bytes` bytes (for kernel outputs).
    pub fn output(&self, bytes: u64) -> Result<GpuBuffer> {
        self.scoped(|| {
            self.pool
                .get(&self.device, BufferKind::Storage, bytes.div_ceil(4) * 4)
        })
    }

    fn take_uncaptured(&self) -> Option<String> {
        let mut v = self.uncaptured.lock().ok()?;
        if v.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut *v).join("; "))
        }
    }

    /// Records every pass into one command buffer, copies each of `readbacks` to a staging
    /// buffer, submits once, checks for errors, waits, and returns the bytes of each readback.
    pub fn run(&self, passes: &[Pass<'_>], readbacks: &[&GpuBuffer]) -> Result<Vec<Vec<u8>>> {
        let device = &self.device;
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let recorded = self.record(passes, readbacks);
        let verr = pollster::block_on(validation.pop());
        let oerr = pollster::block_on(oom.pop());
        let (index, staging, _uniforms) = recorded?;
        if let Some(e) = verr.or(oerr) {
            staging.into_iter().for_each(GpuBuffer::discard);
            return Err(Error::Gpu(e.to_string()));
        }
        if let Some(e) = self.take_uncaptured() {
            staging.into_iter().for_each(GpuBuffer::discard);
            return Err(Error::Gpu(e));
        }
        let (tx, rx) = mpsc::channel();
        for (i, st) in staging.iter().enumerate() {
            let tx = tx.clone();
            st.raw()
                .slice(0..st.len())
                .map_async(wgpu::MapMode::Read, move |r| {
                    let _ = tx.send((i, r));
                });
        }
        drop(tx);
        let polled = device.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        });
        if let Err(e) = polled {
            staging.into_iter().for_each(GpuBuffer::discard);
            return Err(Error::Gpu(format!("waiting for the device: {e}")));
        }
        let mut ok = vec![false; staging.len()];
        let mut failure = None;
        for (i, r) in rx.try_iter() {
            match r {
                Ok(()) => ok[i] = true,
                Err(e) => failure = Some(e.to_string()),
            }
        }
        if failure.is_some() || ok.iter().any(|o| !o) {
            staging.into_iter().for_each(GpuBuffer::discard);
            return Err(Error::Gpu(format!(
                "mapping results failed: {}",
                failure.unwrap_or_else(|| "callback not called".into())
            )));
        }
        let mut out = Vec::with_capacity(staging.len());
        let mut read_error = None;
        for st in &staging {
            match st.raw().slice(0..st.len()).get_mapped_range() {
                Ok(view) => out.push(view.to_vec()),
                Err(e) => read_error = Some(Error::Gpu(format!("reading results: {e}"))),
            }
            st.raw().unmap();
        }
        match read_error {
            Some(e) => {
                staging.into_iter().for_each(GpuBuffer::discard);
                Err(e)
            }
            None => Ok(out),
        }
    }

    fn record(
        &self,
        passes: &[Pass<'_>],
        readbacks: &[&GpuBuffer],
    ) -> Result<(wgpu::SubmissionIndex, Vec<GpuBuffer>, GpuBuffer)> {
        let device = &self.device;
        let stride = META_SIZE.div_ceil(u64::from(self.caps.uniform_offset_alignment.max(4)))
            * u64::from(self.caps.uniform_offset_alignment.max(4));
        let uniforms = self.pool.get(
            device,
            BufferKind::Uniform,
            stride * passes.len().max(1) as u64,
        )?;
        let mut bytes = vec![0u8; (stride as usize) * passes.len()];
        for (i, p) in passes.iter().enumerate() {
            let o = i * stride as usize;
            bytes[o..o + META_SIZE as usize].copy_from_slice(bytemuck::bytes_of(&p.meta));
        }
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
                    size: NonZeroU64::new(META_SIZE),
                }),
            }];
            for (j, b) in p.buffers.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: j as u32 + 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: b.raw(),
                        offset: 0,
                        size: NonZeroU64::new(b.len().div_ceil(4) * 4),
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
        {
            let mut cpass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("trmask"),
                timestamp_writes: None,
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
        let mut staging = Vec::with_capacity(readbacks.len());
        for rb in readbacks {
            let len = rb.len().div_ceil(4) * 4;
            let st = self.pool.get(device, BufferKind::Staging, len)?;
            encoder.copy_buffer_to_buffer(rb.raw(), 0, st.raw(), 0, len);
            staging.push(st);
        }
        let index = self.queue.submit([encoder.finish()]);
        Ok((index, staging, uniforms))
    }
}
