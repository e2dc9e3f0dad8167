//! What an op hands to [`Context::run`](crate::gpu::Context::run) / [`Context::submit`]
//! (crate::gpu::Context::submit): kernel dispatches with their typed uniforms and their bindings.
//! No wgpu types here: [`Bind`] names pooled buffers or device-resident logits, and the
//! context turns them into bind groups.

use crate::error::{Error, Result};
use crate::gpu::device::buffers::GpuBuffer;
use crate::gpu::device::pipeline::Kernel;
use crate::input::logits::DeviceLogits;
use std::sync::Arc;

/// One storage binding of a dispatch (bindings 1, 2, … in order).
#[derive(Clone, Copy, Debug)]
pub enum Bind<'a> {
    /// A pooled buffer, bound whole (its requested length rounded up to 4 bytes).
    Whole(&'a GpuBuffer),
    /// `size` bytes of a pooled buffer from byte `offset` (a multiple of 256).
    Window {
        /// The buffer.
        buffer: &'a GpuBuffer,
        /// Start (bytes, 256-aligned).
        offset: u64,
        /// Length (bytes, a multiple of 4).
        size: u64,
    },
    /// `size` bytes of the caller's device buffer from byte `offset` of the buffer (a multiple
    /// of 256), bound in place (zero copy).
    Device {
        /// The device-resident logits.
        logits: &'a DeviceLogits,
        /// Start in the buffer (bytes, 256-aligned).
        offset: u64,
        /// Length (bytes, a multiple of 4).
        size: u64,
    },
}

impl<'a> From<&'a GpuBuffer> for Bind<'a> {
    fn from(b: &'a GpuBuffer) -> Self {
        Bind::Whole(b)
    }
}

/// One kernel dispatch.
#[derive(Debug)]
pub struct Pass<'a> {
    /// The kernel.
    pub kernel: Arc<Kernel>,
    /// The bytes of its uniform struct (binding 0): the op's `#[repr(C)]` params twin.
    pub params: Vec<u8>,
    /// Storage bindings 1, 2, ….
    pub bindings: Vec<Bind<'a>>,
    /// Workgroups in x and y (see `chunking::dispatch_grid`).
    pub grid: (u32, u32),
}

impl<'a> Pass<'a> {
    /// A dispatch of `kernel` with its uniform `params` (the op's params struct).
    pub fn new<P: bytemuck::Pod>(
        kernel: Arc<Kernel>,
        params: &P,
        bindings: Vec<Bind<'a>>,
        grid: (u32, u32),
    ) -> Self {
        Pass {
            kernel,
            params: bytemuck::bytes_of(params).to_vec(),
            bindings,
            grid,
        }
    }
}

/// The uniform bytes of every pass at `stride`, after checking each against its kernel.
pub(in crate::gpu) fn uniform_bytes(passes: &[Pass<'_>], align: u64) -> Result<(u64, Vec<u8>)> {
    let largest = passes.iter().map(|p| p.params.len() as u64).max();
    let stride = largest.unwrap_or(4).div_ceil(align) * align;
    let mut bytes = vec![0u8; (stride as usize) * passes.len()];
    for (i, p) in passes.iter().enumerate() {
        let spec = p.kernel.key.op.spec();
        if p.params.len() as u64 != spec.params_size || p.bindings.len() != spec.bindings.len() {
            return Err(Error::Gpu(format!(
                "{}: {} uniform bytes and {} bindings given, the kernel takes {} and {}",
                p.kernel.key.label(),
                p.params.len(),
                p.bindings.len(),
                spec.params_size,
                spec.bindings.len()
            )));
        }
        let o = i * stride as usize;
        bytes[o..o + p.params.len()].copy_from_slice(&p.params);
    }
    Ok((stride, bytes))
}
