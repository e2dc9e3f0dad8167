//! GPU engine against the CPU reference on lavapipe or a real adapter: contexts, kernels, limits, threads, vocabulary accuracy, shaders.
//!
//! One test binary per suite (`cargo test --test gpu`), so CI builds and links a few
//! binaries instead of one per file; each file below is a module.

#[path = "../common/mod.rs"]
mod common;

mod gpu_context;
mod gpu_corrections;
mod gpu_device_logits;
mod gpu_limits;
mod gpu_threads;
mod gpu_vocab_accuracy;
mod gpu_vs_cpu;
mod shaders;
mod vocab_divergence;
mod vocab_variants;
