//! # trmask — Trust Region Masking for LLM reinforcement learning
//!
//! Rollout engines (vLLM, SGLang) and training engines (FSDP, Megatron) disagree on the
//! probabilities of the same tokens. trmask measures that mismatch per token and per sequence —
//! sampled-token estimators (k1/k2/k3), exact vocabulary KL from full logits — and turns it
//! into what a trainer consumes: importance weights and a response mask that rejects whole
//! sequences leaving the trust region (Li et al., *Trust Region Masking*, arXiv 2512.23075).
//! Every computation runs on the GPU through wgpu compute shaders and on an f64 CPU reference.
//!
//! A trainer builds a [`Corrector`] once from a [`CorrectionConfig`] (verl's `rollout_corr`
//! keys verbatim, its 19 presets, plus trmask's LN-TRM, token veto and exact-KL criteria) and
//! calls [`Corrector::correct`] on a borrowed [`Step`] every training step; it gets
//! [`Corrections`]: IS weights, the modified response mask, per-sequence decisions and
//! statistics, and verl's `rollout_corr/*` metrics plus `trmask/*`. Read the
//! loss-normalisation notes in [`correction`] and `examples/train_step.rs`.
//!
//! ```
//! use trmask::{Batch, Engine, cpu::CpuEngine};
//! // Two sequences in a padded [2, 3] batch; the padding may hold anything.
//! let batch = Batch::padded(2, 3, &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0])?
//!     .with_log_probs("rollout_log_prob", vec![-1.0, -0.5, -0.2, -2.0, f64::NAN, 7.0])?
//!     .with_log_probs("old_log_prob", vec![-1.1, -0.4, -0.2, -2.5, 0.0, 0.0])?
//!     .build()?; // validated once, here
//! let engine = CpuEngine::new();
//! let m = batch.mask();
//! let stats = engine.token_stats(batch.rollout_log_prob().unwrap(),
//!                                batch.old_log_prob().unwrap(), m)?;
//! let per_seq = engine.segment_reduce(&[&stats.k3], batch.segments())?;
//! assert!(per_seq[0].max[1] > per_seq[0].max[0]); // sequence 1 drifts more
//! assert_eq!(per_seq[0].count, vec![3, 1]);
//! # Ok::<(), trmask::Error>(())
//! ```

// Foundations: no internal dependency but `error`.
mod error;
mod lenient_json;
mod math;
mod stats;
// Inputs and their validation; truncated sampling's kept sets.
pub mod input;
pub mod sampling;
// Configuration.
pub mod config;
// The engine trait, the plan and the backend choice; the engines.
pub mod cpu;
pub mod engine;
pub mod gpu;
// Corrections, metrics, mergeable partials, certificate and bounds.
pub mod bounds;
pub mod correction;
mod metrics;
pub mod partial;
// What the CLI and bindings call; what the CLI prints and renders.
pub mod analysis;
pub mod io;
pub mod report;

// Public paths kept from the flat layout.
pub use analysis::{calibrate, compare, sweep, trend};
pub use bounds::inverse as bounds_inverse;
#[doc(hidden)]
pub use engine::passes;
pub use engine::{backend, plan};
pub use input::routing;
pub use input::tensors;
#[cfg(feature = "mpi")]
pub use partial::distributed;
pub use sampling::{kept_mass, kept_set};

pub use bounds::certificate::{Certificate, CAVEAT as CERTIFICATE_CAVEAT};
pub use config::CorrectionConfig;
pub use correction::corrector::{
    Corrector, IntoEngine, MaskOut, MaskValues, Outputs, Step, Values, WeightsOut,
};
pub use engine::Engine;
pub use error::{Error, Result};
pub use gpu::GpuEngine;
pub use input::{Batch, BatchBuilder, DType, Layout, Logits, Segments};
pub use stats::{
    Corrections, CriterionResult, SegmentStats, StatTable, TokenStats, TopkStats, VocabStats,
    SAFETY_BOUND,
};

/// The f64 formulas shared by every path (k3, `w(u)`, `log1p(x) − x`, Neumaier, log-sum-exp).
#[doc(hidden)]
pub mod numerics {
    pub use crate::math::*;
}

/// Top-K divergences and the DPPO / Predictive Divergence token masks (docs/FORMAT.md, DPPO).
pub mod topk {
    pub use crate::config::DppoConfig;
    pub use crate::correction::dppo::dppo_mask;
    pub use crate::cpu::topk_divergence_batch as topk_divergence;
    pub use crate::input::support::{
        prepare_support, PreparedSupport, TrainerSupportLogProbs, TrainerTopk,
        SUPPORT_MASS_TOLERANCE, TAIL_FLOOR,
    };
    pub use crate::stats::{DppoDirection, TopkDivergence, TopkStats, TopkSupport};
}

/// The wgpu version trmask is built on, so callers name the same types
/// ([`gpu::Context::from_wgpu`], [`Logits::device`]).
pub use wgpu;

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/RUST.md's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/RUST.md")]
pub struct RustGuideDoctests;
