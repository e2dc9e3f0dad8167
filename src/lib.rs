//! # trmask — Trust Region Masking for LLM reinforcement learning
//!
//! Rollout engines (vLLM, SGLang) and training engines (FSDP, Megatron) disagree on the
//! probabilities of the same tokens. trmask measures that mismatch per token and per sequence —
//! sampled-token estimators (k1/k2/k3), exact vocabulary KL from full logits — and turns it
//! into what a trainer consumes: importance weights and a response mask that rejects whole
//! sequences leaving the trust region (Li et al., *Trust Region Masking*, arXiv 2512.23075).
//! Every computation runs on the GPU through wgpu compute shaders and on an f64 CPU reference.
//!
//! Once per training step a trainer calls [`correction::correct`] with a [`CorrectionConfig`]
//! (verl's `rollout_corr` keys verbatim, its 19 presets, plus trmask's LN-TRM, token veto and
//! exact-KL criteria) and gets [`Corrections`]: IS weights, the modified response mask,
//! per-sequence decisions and statistics, and verl's `rollout_corr/*` metrics plus `trmask/*`.
//! Read the loss-normalisation notes in [`correction`] and `examples/policy_loss.rs`.
//!
//! ```
//! use trmask::{Batch, Engine, cpu::CpuEngine};
//! // Two sequences in a padded [2, 3] batch; the padding may hold anything.
//! let batch = Batch::padded(2, 3, &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0])?
//!     .with_log_probs("rollout_log_prob", vec![-1.0, -0.5, -0.2, -2.0, f64::NAN, 7.0])?
//!     .with_log_probs("old_log_prob", vec![-1.1, -0.4, -0.2, -2.5, 0.0, 0.0])?;
//! batch.validate()?;
//! let engine = CpuEngine::new();
//! let m = batch.mask();
//! let stats = engine.token_stats(batch.rollout_log_prob.as_ref().unwrap(),
//!                                batch.old_log_prob.as_ref().unwrap(), m)?;
//! let per_seq = engine.segment_reduce(&[&stats.k3], batch.segments())?;
//! assert!(per_seq[0].max[1] > per_seq[0].max[0]); // sequence 1 drifts more
//! assert_eq!(per_seq[0].count, vec![3, 1]);
//! # Ok::<(), trmask::Error>(())
//! ```

pub mod analysis;
pub mod backend;
pub mod batch;
pub mod bounds;
pub mod certificate;
pub mod config;
pub mod correction;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod io;
pub mod legacy;
pub mod logits;
pub mod topk;

pub use batch::{Batch, DType, Layout, Logits, Segments};
pub use config::CorrectionConfig;
pub use correction::Corrections;
pub use engine::{Engine, SegmentStats, TokenStats, VocabStats, SAFETY_BOUND};
pub use error::{Error, Result};
pub use gpu::GpuEngine;
/// The wgpu version trmask is built on, so callers name the same types
/// ([`gpu::Context::from_wgpu`], [`Logits::device`]).
pub use wgpu;

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
