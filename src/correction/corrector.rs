//! The trainer-facing API: resolve a config once, then correct one borrowed batch per step.
//!
//! ```
//! use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector, Step};
//! // Built once: the config is parsed, checked and resolved here.
//! let corrector = Corrector::new(CpuEngine::new(), &CorrectionConfig::preset("decoupled_k3_rs")?)?;
//! // Each step: borrow the trainer's tensors (f32 log-probs and a bool mask here).
//! let rollout: Vec<f32> = vec![-1.0, -0.5, -0.2, -2.0, -1.0, 0.0];
//! let old: Vec<f32> = vec![-1.0, -0.5, -0.2, -1.0, -3.0, 0.0];
//! let mask = [true, true, true, true, true, false];
//! let step = Step::padded(2, 3)
//!     .response_mask(&mask[..])
//!     .rollout_log_prob(&rollout[..])
//!     .old_log_prob(&old[..]);
//! let out = corrector.correct(&step)?;
//! assert_eq!(out.seq_accept, vec![true, false]); // sequence 1 leaves the trust region
//! assert_eq!(out.mask_bool(), vec![true, true, true, false, false, false]);
//! let loss_mask: Vec<f32> = out.mask_f32(); // 0/1 for the loss
//! assert_eq!(loss_mask.iter().sum::<f32>(), 3.0);
//! # Ok::<(), trmask::Error>(())
//! ```
//!
//! What is copied: log-probs are widened to f64 once per step (the f64 reference and the
//! engines' host-side finishing need them); logits are never copied: pass a [`Logits`](crate::Logits) that
//! wraps the trainer's bytes (host) or, on the GPU engine, its device buffer.

use crate::config::CorrectionConfig;
use crate::correction::lean;
use crate::correction::plan::Plan;
use crate::correction::run;
pub use crate::correction::step::Step;
use crate::engine::Engine;
use crate::error::{Error, Result};
pub use crate::input::values::{MaskOut, MaskValues, Outputs, Values, WeightsOut};
use crate::partial::{exchange, Exchange, SingleProcess};
use crate::stats::Corrections;
use std::sync::Arc;

/// Resolves a [`CorrectionConfig`] once and corrects one [`Step`] per training step.
#[derive(Clone)]
pub struct Corrector {
    engine: Arc<dyn Engine>,
    /// The config compiled once: what every executor reads.
    plan: Plan,
    /// The fused lean pass serves the plan on this engine.
    lean: bool,
    /// The executor is chosen by the work (`backend auto`), not only by the engine.
    by_work: bool,
    /// Every step on the engine's full path (the fused pass's reference).
    full_only: bool,
}

impl std::fmt::Debug for Corrector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corrector")
            .field("engine", &self.engine.name())
            .field("config", &self.plan.config)
            .finish()
    }
}

impl Corrector {
    /// Checks and resolves `config` (an error names the bad key) for `engine` (a
    /// [`CpuEngine`](crate::cpu::CpuEngine), a [`GpuEngine`](crate::GpuEngine) — possibly on the
    /// trainer's own wgpu device — or an `Arc<dyn Engine>` shared with other work).
    pub fn new(engine: impl IntoEngine, config: &CorrectionConfig) -> Result<Self> {
        let mut c = Corrector {
            engine: engine.into_engine(),
            plan: Plan::compile(config)?,
            lean: false,
            by_work: false,
            full_only: false,
        };
        c.lean = c.serves_lean();
        Ok(c)
    }

    /// Computes only verl's `rollout_corr/*` metrics (`on`), not trmask's diagnostics
    /// (`trmask/*`): what a trainer that logs verl's metrics needs, at a fraction of the cost.
    ///
    /// ```
    /// use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector, Step};
    /// let cfg = CorrectionConfig::preset("decoupled_k3_rs")?;
    /// let c = Corrector::new(CpuEngine::new(), &cfg)?.verl_metrics_only(true);
    /// let (lp, mask) = ([-1.0f32, -0.5], [true, true]);
    /// let out = c.correct(&Step::padded(1, 2).response_mask(&mask[..])
    ///     .rollout_log_prob(&lp[..]).old_log_prob(&lp[..]))?;
    /// assert!(out.metrics.keys().all(|k| k.starts_with("rollout_corr/")));
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn verl_metrics_only(mut self, on: bool) -> Self {
        self.plan.verl_metrics_only(on);
        self
    }

    /// Counts the histograms ([`Corrections::histograms`]: log ρ over every valid token, each
    /// criterion's per-sequence statistic) with trmask's diagnostics (`on`, the default). A
    /// caller that logs the metrics but never reads the histograms turns them off: the metrics
    /// are the same, and the per-token count is skipped (on 64 × 1024 log-probs with
    /// advantages, the fused pass's tiles took a quarter less time without it).
    ///
    /// ```
    /// use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector, Step};
    /// let cfg = CorrectionConfig::preset("decoupled_k3_rs")?;
    /// let (lp, mask) = ([-1.0f32, -0.5], [true, true]);
    /// let step = Step::padded(1, 2).response_mask(&mask[..])
    ///     .rollout_log_prob(&lp[..]).old_log_prob(&lp[..]);
    /// let with = Corrector::new(CpuEngine::new(), &cfg)?.correct(&step)?;
    /// let without = Corrector::new(CpuEngine::new(), &cfg)?.histograms(false).correct(&step)?;
    /// assert!(with.histograms.contains_key("log_ratio") && without.histograms.is_empty());
    /// assert_eq!(with.metrics, without.metrics);
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn histograms(mut self, on: bool) -> Self {
        self.plan.histograms(on);
        self
    }

    /// Chooses the executor by the work, as `backend auto` does (docs/BACKENDS.md): a step of
    /// host-resident log-probs runs the fused CPU pass even on a GPU engine (uploading two
    /// log-probs per token, dispatching and reading back costs more than reading them once on
    /// the host); logits and device-resident inputs still go to the engine. Off by default: a
    /// corrector on an explicitly chosen GPU engine runs everything there.
    ///
    /// ```
    /// use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector};
    /// let cfg = CorrectionConfig::preset("decoupled_k3_rs")?;
    /// let c = Corrector::new(CpuEngine::new(), &cfg)?.choose_executor_by_work(true);
    /// assert!(c.has_lean_pass());
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn choose_executor_by_work(mut self, on: bool) -> Self {
        self.by_work = on;
        self.lean = self.serves_lean();
        self
    }

    /// Runs every step on the engine's full path (`on`), also where the fused CPU pass serves
    /// it: the reference the fused pass is tested against — the same weights, mask and
    /// decisions, the metrics to rounding, more time and memory.
    ///
    /// ```
    /// use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector};
    /// let cfg = CorrectionConfig::preset("decoupled_k3_rs")?;
    /// let c = Corrector::new(CpuEngine::new(), &cfg)?;
    /// assert!(c.has_lean_pass());
    /// assert!(!c.full_path_only(true).has_lean_pass());
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn full_path_only(mut self, on: bool) -> Self {
        self.full_only = on;
        self.lean = self.serves_lean();
        self
    }

    /// The lean pass runs on the CPU engines (the f64 reference's formulas), and on a GPU
    /// engine when the executor is chosen by the work.
    fn serves_lean(&self) -> bool {
        // a GPU engine chosen explicitly, and a truncated sampler's kept mass (read from the
        // raw top-K), take the full path
        !self.full_only
            && (!self.engine.is_gpu() || self.by_work)
            && self.plan.config.sampling.is_off()
            && !self.plan.config.sampling_replay
            && self.plan.serves_lean()
    }

    /// True when [`correct`](Self::correct) and [`correct_into`](Self::correct_into) run the
    /// fused lean pass for steps holding only log-probs and a mask (else the engine's full
    /// path).
    pub fn has_lean_pass(&self) -> bool {
        self.lean
    }

    /// True when the config produces IS weights (`correct_into` then needs a weights buffer).
    pub fn has_weights(&self) -> bool {
        self.plan.is.is_some()
    }

    /// The engine this corrector runs on.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// The config in effect.
    pub fn config(&self) -> &CorrectionConfig {
        &self.plan.config
    }

    /// IS weights, the modified response mask, per-sequence decisions and verl's / trmask's
    /// metrics for one step. A step of both policies' log-probs and a mask (and any advantages
    /// and `uid`) runs the fused CPU pass where it serves the config (see
    /// [`has_lean_pass`](Self::has_lean_pass)), into buffers of its own; anything else runs the
    /// engine's full path.
    pub fn correct(&self, step: &Step<'_>) -> Result<Corrections> {
        // one process is the data-parallel path with nothing to exchange
        self.correct_shard(step, &mut SingleProcess)
    }

    /// [`correct`](Self::correct) for one data-parallel rank holding `step`, a shard of the
    /// whole batch (whole sequences), with `ex` carrying the partials between ranks (every rank
    /// calls it collectively): this shard's weights and mask (IS weights normalised over the
    /// whole batch) and the whole batch's metrics, identical on every rank.
    pub fn correct_shard(&self, step: &Step<'_>, ex: &mut dyn Exchange) -> Result<Corrections> {
        if let Some(inp) = self.lean_inputs(step) {
            // the buffers sized by the given log-probs (a layout that disagrees steps aside)
            let n = inp.roll.len();
            let mut mask = vec![0.0f64; n];
            let mut weights = self.has_weights().then(|| vec![0.0f64; n]);
            let out = Outputs {
                weights: weights.as_deref_mut().map(WeightsOut::F64),
                mask: MaskOut::F64(&mut mask),
            };
            if let Some(mut c) = self.lean_shard(&inp, out, ex)? {
                (c.mask, c.weights) = (mask, weights);
                return Ok(c);
            }
        }
        self.full_shard(step, ex)
    }

    /// The step on the engine's full path.
    fn full_shard(&self, step: &Step<'_>, ex: &mut dyn Exchange) -> Result<Corrections> {
        let batch = step.to_batch()?;
        run::correct_shard(self.engine.as_ref(), &self.plan, &batch, ex)
    }

    /// The step's borrowed inputs where the fused pass serves this corrector and the step.
    fn lean_inputs<'a>(&self, step: &Step<'a>) -> Option<lean::LeanInputs<'a>> {
        step.lean_inputs(self.plan.config.bypass_mode)
            .filter(|_| self.lean)
    }

    /// The fused pass into `out`, its partials exchanged and its metrics finished; `None`
    /// where it steps aside (the caller runs the full path, which words any error).
    fn lean_shard(
        &self,
        inp: &lean::LeanInputs<'_>,
        mut out: Outputs<'_>,
        ex: &mut dyn Exchange,
    ) -> Result<Option<Corrections>> {
        let Some((mut c, p, _)) = lean::run(&self.plan, inp, &mut out, ex)? else {
            return Ok(None);
        };
        let merged = exchange(ex, p)?;
        if merged.count("#valid_tokens") == 0 {
            // no valid token on any rank: the full path words the error for the layout
            return Ok(None);
        }
        c.metrics = merged.finish()?;
        c.histograms = merged.histograms();
        Ok(Some(c))
    }
}

impl Corrector {
    /// [`correct`](Self::correct) writing the IS weights and the modified response mask into
    /// the caller's buffers (`out`, one value per slot, verl's dtypes): the trainer's hot path.
    /// For steps holding only both policies' log-probs and a mask, and the configs it serves
    /// (sampled-token criteria, OPSM, LN-TRM, M2PO, CPPO, token or sequence IS, the token
    /// veto), this is one fused pass over each sequence that reads the inputs in their own
    /// dtype and writes `out` in place; anything else runs the engine's full path and copies.
    /// The returned [`Corrections`] holds the decisions and metrics; its `weights` and `mask`
    /// are left empty.
    ///
    /// ```
    /// use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector, MaskOut, Outputs, Step, WeightsOut};
    /// let cfg = CorrectionConfig::preset("decoupled_k3_rs_token_tis")?;
    /// let c = Corrector::new(CpuEngine::new(), &cfg)?.verl_metrics_only(true);
    /// let rollout: Vec<f32> = vec![-1.0, -0.5, -0.2, -2.0, -1.0, 0.0];
    /// let old: Vec<f32> = vec![-1.0, -0.5, -0.2, -1.0, -3.0, 0.0];
    /// let mask = [1.0f32, 1.0, 1.0, 1.0, 1.0, 0.0];
    /// let step = Step::padded(2, 3).response_mask(&mask[..])
    ///     .rollout_log_prob(&rollout[..]).old_log_prob(&old[..]);
    /// let (mut w, mut m) = (vec![0f32; 6], vec![0f32; 6]);
    /// let out = c.correct_into(&step, Outputs {
    ///     weights: Some(WeightsOut::F32(&mut w)),
    ///     mask: MaskOut::F32(&mut m),
    /// })?;
    /// assert_eq!(m, vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]); // seq_mean_k3 rejects sequence 1
    /// assert_eq!(out.seq_accept, vec![true, false]);
    /// assert!(c.has_lean_pass() && out.metrics.contains_key("rollout_corr/rollout_is_mean"));
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn correct_into(&self, step: &Step<'_>, out: Outputs<'_>) -> Result<Corrections> {
        self.correct_into_with(step, out, &mut SingleProcess)
    }

    /// [`correct_into`](Self::correct_into) for one data-parallel rank (see
    /// [`correct_shard`](Self::correct_shard)).
    pub fn correct_shard_into(
        &self,
        step: &Step<'_>,
        out: Outputs<'_>,
        ex: &mut dyn Exchange,
    ) -> Result<Corrections> {
        self.correct_into_with(step, out, ex)
    }

    fn correct_into_with(
        &self,
        step: &Step<'_>,
        mut out: Outputs<'_>,
        ex: &mut dyn Exchange,
    ) -> Result<Corrections> {
        match (&out.weights, self.has_weights()) {
            (None, true) => {
                return Err(Error::input(
                    "rollout_is_weights",
                    "needs an output buffer: the config has IS weights",
                ))
            }
            (Some(_), false) => {
                return Err(Error::input(
                    "rollout_is_weights",
                    "was given a buffer but the config has no IS weights",
                ))
            }
            _ => {}
        }
        if let Some(inp) = self.lean_inputs(step) {
            let out = Outputs {
                weights: out.weights.as_mut().map(|w| w.reborrow()),
                mask: out.mask.reborrow(),
            };
            if let Some(c) = self.lean_shard(&inp, out, ex)? {
                return Ok(c);
            }
        }
        let mut c = self.full_shard(step, ex)?;
        let slots = c.mask.len();
        if out.mask.len() != slots {
            return Err(Error::input(
                "modified_response_mask",
                format!("buffer has {} slots, the step {slots}", out.mask.len()),
            ));
        }
        let keep: Vec<bool> = c.mask.iter().map(|&m| m != 0.0).collect();
        out.mask.store(0, &keep);
        if let (Some(wo), Some(w)) = (out.weights.as_mut(), &c.weights) {
            if wo.len() != slots {
                return Err(Error::input(
                    "rollout_is_weights",
                    format!("buffer has {} slots, the step {slots}", wo.len()),
                ));
            }
            wo.store(0, w);
        }
        c.weights = None;
        c.mask = Vec::new();
        Ok(c)
    }
}

/// Anything [`Corrector::new`] can run on.
pub trait IntoEngine {
    /// The engine behind a shared pointer.
    fn into_engine(self) -> Arc<dyn Engine>;
}

impl<E: Engine + 'static> IntoEngine for E {
    fn into_engine(self) -> Arc<dyn Engine> {
        Arc::new(self)
    }
}

impl IntoEngine for Box<dyn Engine> {
    fn into_engine(self) -> Arc<dyn Engine> {
        Arc::from(self)
    }
}

impl IntoEngine for Arc<dyn Engine> {
    fn into_engine(self) -> Arc<dyn Engine> {
        self
    }
}
