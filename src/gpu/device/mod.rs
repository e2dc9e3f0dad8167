//! The device layer: adapters, the context (device, queue, pipeline cache), buffers and the pass
//! an op hands to it. The only place that names wgpu types.

pub(crate) mod adapter;
pub(crate) mod buffers;
pub(crate) mod capabilities;
pub(crate) mod context;
pub(crate) mod pass;
pub mod pipeline;
