//! What the device offers and what trmask uses of it (filled in by `context.rs`).

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
    /// Loop iterations one shader invocation may run in all, where the driver stops loops
    /// silently: Mesa's llvmpipe (lavapipe) keeps one counter for every loop of a shader,
    /// never reset, and ends all loops after 65,535 iterations. Work that would need more is
    /// refused ([`crate::Error::Limit`]) or split; `None` on other drivers.
    pub loop_iterations: Option<u64>,
    /// Host logits are written straight into mapped storage buffers (one copy, no staging) and
    /// kernel outputs are mapped and read in place (no staging copy):
    /// `Features::MAPPABLE_PRIMARY_BUFFERS` on a unified-memory adapter (CPU or integrated
    /// GPU: lavapipe, Apple silicon); elsewhere both go through staging copies.
    pub mapped_uploads: bool,
}

/// llvmpipe's `LP_MAX_TGSI_LOOP_ITERATIONS`.
pub const LLVMPIPE_LOOP_ITERATIONS: u64 = 65_535;

/// Loop iterations the kernels spend outside their strided loops over a row or a sequence
/// (workgroup trees, per-element loops over at most 7 statistics, short loops over a top-K
/// support are counted separately), with room to spare.
pub const LOOP_MARGIN: u64 = 1024;

/// Whether a kernel needing `iterations` loop iterations per invocation runs to the end on a
/// device with `caps`.
pub fn loops_fit(caps: &Capabilities, iterations: u64) -> bool {
    caps.loop_iterations
        .is_none_or(|max| iterations.saturating_add(LOOP_MARGIN) <= max)
}

/// [`crate::Error::Limit`] unless a kernel needing `iterations` loop iterations per invocation
/// (`what()` names it, e.g. "a row of 8388608 logits", formatted only for the error) runs to
/// the end on this device.
pub fn check_loops(
    caps: &Capabilities,
    what: &dyn Fn() -> String,
    iterations: u64,
) -> crate::error::Result<()> {
    match caps.loop_iterations {
        Some(max) if !loops_fit(caps, iterations) => Err(crate::error::Error::limit(
            format!(
                "{} needs {} loop iterations in one kernel invocation on {} (it stops a \
                 kernel's loops after {max} in all; --backend cpu has no such limit)",
                what(),
                iterations.saturating_add(LOOP_MARGIN),
                caps.adapter_name
            ),
            max,
        )),
        _ => Ok(()),
    }
}

impl Capabilities {
    /// A software rasterizer on the host's cores (lavapipe, WARP): `device_type` `Cpu`.
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
    }

    /// A multi-line human-readable summary (for `trmask devices`).
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let yn = |b: bool| if b { "yes" } else { "no" };
        format!(
            "{} ({}, {})\n  driver: {}{}\n  max storage binding: {:.0} MiB, max buffer: {:.0} MiB, chunk limit: {:.2} MiB\n  workgroups: {} threads max, {} per dimension, {} KiB shared memory\n  subgroups: {}{}\n  shader-f16: {}, timestamps: {}, mapped uploads: {}",
            self.adapter_name,
            self.backend,
            self.device_type,
            if self.driver.is_empty() { "?" } else { &self.driver },
            match self.loop_iterations {
                Some(n) => format!(" (stops a kernel's loops after {n} iterations in all)"),
                None => String::new(),
            },
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
            yn(self.mapped_uploads),
        )
    }
}
