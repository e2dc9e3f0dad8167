//! GPU path (wgpu compute shaders).

pub mod vocab_divergence;
