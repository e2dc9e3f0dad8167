//! Opening a device: which adapter (the backends' order, `WGPU_BACKEND` /
//! `WGPU_ADAPTER_NAME`), the device with its limits and features, and the [`Capabilities`]
//! trmask reads from them. [`crate::gpu::Context`] is built on what this returns.

use crate::error::{Error, Result};
use crate::gpu::device::buffers::mapped_wanted;
use crate::gpu::device::capabilities::{Capabilities, LLVMPIPE_LOOP_ITERATIONS};
use crate::gpu::device::pipeline::Flavour;
use std::sync::{Arc, Mutex};

/// Where a device's uncaptured errors and its loss are collected.
pub(in crate::gpu) type Uncaptured = Arc<Mutex<Vec<String>>>;

/// How to open a device.
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Backends to consider; `None`: `WGPU_BACKEND` if set, else Vulkan / Metal / DX12 first
    /// and GL only when they offer no hardware adapter (see [`crate::gpu::Context::new`]).
    pub backends: Option<wgpu::Backends>,
    /// Pick the first adapter whose name contains this (case-insensitive); `None`:
    /// `WGPU_ADAPTER_NAME` if set, else wgpu's default choice (high performance).
    pub adapter_name: Option<String>,
    /// Force a smaller binding-size limit (bytes, at least 256) so that work splits into many
    /// chunks (tests); `None`: the device's limit.
    pub max_binding_size: Option<u64>,
    /// Threads per workgroup for every kernel (`None`: each op's default, capped by the device).
    pub workgroup_size: Option<u32>,
    /// Reduction flavour: `None` picks [`Flavour::Subgroup`] where the op has it and the device
    /// has subgroups of one fixed size dividing the workgroup size, else
    /// [`Flavour::Workgroup`]; `Some(Workgroup)` forces the workgroup tree; `Some(Subgroup)`
    /// asks for subgroups under the same conditions (falling back to the workgroup tree).
    pub flavour: Option<Flavour>,
    /// Device limits to request (`Context::new` only); `None`: the adapter's own limits.
    /// `Some(wgpu::Limits::default())` gives WebGPU's minimums (16 KiB of workgroup memory,
    /// 128 MiB bindings, …), which every kernel stays within.
    pub limits: Option<wgpu::Limits>,
    /// Host logits into mapped storage buffers ([`Capabilities::mapped_uploads`]): `None` on
    /// CPU / integrated adapters, `Some(false)` never, `Some(true)` wherever offered.
    pub mapped_uploads: Option<bool>,
    /// Largest upload of host logits per tensor per chunk of the vocabulary kernel (bytes;
    /// one row at least, within the binding limit): `None` for 64 MiB; smaller values split
    /// work into many chunks (tests, benchmarks).
    pub host_chunk_bytes: Option<u64>,
    /// The vocabulary kernel's configuration, pinned (rounding differs between
    /// configurations); `None`: `TRMASK_VOCAB_KERNEL` if set, else the default
    /// ([`crate::gpu::Context::vocab_variant`]).
    pub vocab_kernel: Option<crate::gpu::ops::vocab_variant::VocabVariant>,
}

pub(in crate::gpu) fn capabilities_of(
    info: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
    features: wgpu::Features,
    forced: Option<u64>,
    mapped: Option<bool>,
) -> Capabilities {
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
        loop_iterations: (info.name.to_ascii_lowercase().contains("llvmpipe")
            || info.driver.to_ascii_lowercase().contains("llvmpipe"))
        .then_some(LLVMPIPE_LOOP_ITERATIONS),
        mapped_uploads: features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
            && mapped_wanted(mapped, info),
    }
}

fn instance_for(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// A software rasterizer on the host's cores (lavapipe / llvmpipe, WARP).
pub(in crate::gpu) fn is_software(adapter: &wgpu::Adapter) -> bool {
    adapter.get_info().device_type == wgpu::DeviceType::Cpu
}

/// The adapter [`crate::gpu::Context::new`] opens (see there).
pub(in crate::gpu) fn pick_adapter(options: &ContextOptions) -> Result<wgpu::Adapter> {
    let wanted_name = options
        .adapter_name
        .clone()
        .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok())
        .filter(|s| !s.is_empty());
    let chosen = options.backends.or_else(wgpu::Backends::from_env);
    if let Some(name) = &wanted_name {
        let backends = chosen.unwrap_or(wgpu::Backends::all());
        let adapters = pollster::block_on(instance_for(backends).enumerate_adapters(backends));
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let lname = name.to_lowercase();
        return adapters
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
            });
    }
    if let Some(a) = rank_adapter(chosen)? {
        return Ok(a);
    }
    if let Some(backends) = chosen {
        return request_adapter(&instance_for(backends));
    }
    // Vulkan / Metal / DX12 first; GL (EGL or WGL start-up costs tens of milliseconds) only
    // when they offer no hardware adapter, and then only if GL has one.
    let primary = request_adapter(&instance_for(wgpu::Backends::PRIMARY));
    if matches!(&primary, Ok(a) if !is_software(a)) {
        return primary;
    }
    match request_adapter(&instance_for(wgpu::Backends::GL)) {
        Ok(gl) if !is_software(&gl) || primary.is_err() => Ok(gl),
        _ => primary,
    }
}

/// What [`rank_choice`] reads of an adapter.
#[derive(Clone, Debug)]
pub struct AdapterFacts {
    /// wgpu's `device_pci_bus_id` (`"0000:3b:00.0"`; empty when the driver does not say).
    pub pci_bus_id: String,
    /// A discrete GPU.
    pub discrete: bool,
}

/// `(domain, bus, device)` of a PCI address `[DDDD:]BB:DD[.F]` (hex), the function ignored.
fn pci_address(s: &str) -> Option<(u32, u32, u32)> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.split('.').next()?;
    let parts: Vec<u32> = s
        .split(':')
        .map(|p| u32::from_str_radix(p, 16).ok())
        .collect::<Option<_>>()?;
    match parts[..] {
        [d, b, v] => Some((d, b, v)),
        [b, v] => Some((0, b, v)),
        _ => None,
    }
}

/// The adapter a data-parallel rank opens (an index into `adapters`): the one whose PCI bus id
/// is `pci` (the rank's CUDA device), else the `local_rank`-th discrete adapter (counting
/// round); `None` without a hint or a match (the usual choice then).
pub fn rank_choice(
    adapters: &[AdapterFacts],
    pci: Option<&str>,
    local_rank: Option<usize>,
) -> Option<usize> {
    if let Some(want) = pci.and_then(pci_address) {
        if let Some(i) = adapters
            .iter()
            .position(|a| pci_address(&a.pci_bus_id) == Some(want))
        {
            return Some(i);
        }
    }
    let discrete: Vec<usize> = (0..adapters.len())
        .filter(|&i| adapters[i].discrete)
        .collect();
    match (local_rank, discrete.len()) {
        (Some(r), n) if n > 0 => Some(discrete[r % n]),
        _ => None,
    }
}

/// Under a data-parallel launcher (`TRMASK_PCI_BUS_ID`, which the Python package sets from
/// torch's current CUDA device, or `LOCAL_RANK`): the adapter [`rank_choice`] picks.
fn rank_adapter(chosen: Option<wgpu::Backends>) -> Result<Option<wgpu::Adapter>> {
    let pci = std::env::var("TRMASK_PCI_BUS_ID")
        .ok()
        .filter(|s| !s.is_empty());
    let rank = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    if pci.is_none() && rank.is_none() {
        return Ok(None);
    }
    let backends = chosen.unwrap_or(wgpu::Backends::PRIMARY);
    let adapters = pollster::block_on(instance_for(backends).enumerate_adapters(backends));
    let facts: Vec<AdapterFacts> = adapters
        .iter()
        .map(|a| {
            let i = a.get_info();
            AdapterFacts {
                pci_bus_id: i.device_pci_bus_id,
                discrete: i.device_type == wgpu::DeviceType::DiscreteGpu,
            }
        })
        .collect();
    Ok(rank_choice(&facts, pci.as_deref(), rank).and_then(|i| adapters.into_iter().nth(i)))
}

fn request_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
    pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference:
            wgpu::PowerPreference::from_env().unwrap_or(wgpu::PowerPreference::HighPerformance),
        force_fallback_adapter: false,
        compatible_surface: None,
        apply_limit_buckets: false,
    }))
    .map_err(|e| Error::NoAdapter(e.to_string()))
}

/// Every adapter wgpu can see (honouring `WGPU_BACKEND`): `name (backend, device type)`.
pub fn list_adapters() -> Vec<String> {
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    pollster::block_on(instance_for(backends).enumerate_adapters(backends))
        .iter()
        .map(|a| {
            let i = a.get_info();
            format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
        })
        .collect()
}

/// Opens `adapter`'s device with its real limits (or `options.limits`) and the optional features
/// trmask can use, its uncaptured errors and device loss collected in the returned sink.
pub(in crate::gpu) fn open_device(
    adapter: wgpu::Adapter,
    options: &ContextOptions,
) -> Result<(wgpu::Device, wgpu::Queue, Uncaptured)> {
    let mut optional =
        wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY;
    if mapped_wanted(options.mapped_uploads, &adapter.get_info()) {
        optional |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
    }
    let features = adapter.features() & optional;
    let limits = match &options.limits {
        Some(l) => {
            if !l.check_limits(&adapter.limits()) {
                return Err(Error::Gpu(format!(
                    "the adapter does not offer the requested limits: {l:?}"
                )));
            }
            l.clone()
        }
        None => adapter.limits(),
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("trmask"),
        required_features: features,
        required_limits: limits,
        experimental_features: wgpu::ExperimentalFeatures::default(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| Error::Gpu(format!("cannot open device: {e}")))?;
    let uncaptured: Uncaptured = Arc::default();
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
    Ok((device, queue, uncaptured))
}

#[cfg(test)]
mod tests {
    use super::{rank_choice, AdapterFacts};

    fn a(pci: &str, discrete: bool) -> AdapterFacts {
        AdapterFacts {
            pci_bus_id: pci.into(),
            discrete,
        }
    }

    #[test]
    fn a_rank_opens_its_own_gpu() {
        let node = [
            a("", false), // llvmpipe
            a("0000:3b:00.0", true),
            a("0000:5e:00.0", true),
            a("0000:86:00.0", true),
        ];
        // the CUDA device's bus id, any spelling of the same address
        assert_eq!(rank_choice(&node, Some("0000:5E:00.0"), Some(0)), Some(2));
        assert_eq!(rank_choice(&node, Some("86:00.0"), None), Some(3));
        // no match: the LOCAL_RANK-th discrete adapter, counting round
        assert_eq!(rank_choice(&node, Some("0000:af:00.0"), Some(1)), Some(2));
        assert_eq!(rank_choice(&node, None, Some(0)), Some(1));
        assert_eq!(rank_choice(&node, None, Some(4)), Some(2));
        // no hint, or no discrete adapter: the usual choice
        assert_eq!(rank_choice(&node, None, None), None);
        assert_eq!(rank_choice(&[a("", false)], Some("garbage"), Some(3)), None);
    }
}
