//! The GPU ops: each plans its chunks, packs its inputs and runs its WGSL kernels through the
//! device layer.

pub(crate) mod chunking;
pub(crate) mod kernels;
pub mod masks;
pub mod segment_reduce;
pub(crate) mod slots;
pub(crate) mod token_stats;
pub(crate) mod topk_divergence;
pub(crate) mod vocab_divergence;
pub(crate) mod vocab_tuner;
pub(crate) mod vocab_variant;
pub(crate) mod wgsl;
