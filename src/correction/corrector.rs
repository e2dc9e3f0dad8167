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
//! engines' host-side finishing need them); logits are never copied: pass a [`Logits`] that
//! wraps the trainer's bytes (host) or, on the GPU engine, its device buffer.

use crate::config::{CorrectionConfig, Resolved, Stat};
use crate::correction::lean::{self, LeanInputs, LeanLayout, LeanPlan};
use crate::correction::{check_valid_tokens, compute_shard};
use crate::engine::passes::correction_table;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::logits::Logits;
use crate::input::routing::ExpertIds;
use crate::input::tensors::{self, Role, Shape};
pub use crate::input::values::{MaskOut, MaskValues, Outputs, Values, WeightsOut};
use crate::partial::{exchange, Exchange, SingleProcess};
use crate::stats::Corrections;
use std::sync::Arc;

#[derive(Clone, Debug)]
enum StepLayout<'a> {
    Padded { batch: usize, seq_len: usize },
    Packed { cu_seqlens: &'a [i64] },
}

/// One training step's tensors, borrowed from the trainer, set by typed setters named after
/// verl's keys. Shapes are checked when the step is corrected; the first bad tensor is named.
#[derive(Clone, Debug)]
pub struct Step<'a> {
    layout: StepLayout<'a>,
    response_mask: Option<MaskValues<'a>>,
    rollout_log_prob: Option<Values<'a>>,
    old_log_prob: Option<Values<'a>>,
    log_prob: Option<Values<'a>>,
    advantages: Option<Values<'a>>,
    responses: Option<&'a [i64]>,
    uid: Option<&'a [i64]>,
    rollout_logits: Option<&'a Logits>,
    old_logits: Option<&'a Logits>,
    kept_ids: Option<&'a [i64]>,
    kept_offsets: Option<&'a [i64]>,
    /// Both sides' routed experts `[slots, L, K]` with `(L, K)`.
    routed: Option<RoutedExperts<'a>>,
}

/// `(rollout, old, layers, top_k)` of [`Step::routed_experts`].
type RoutedExperts<'a> = (ExpertIds<'a>, ExpertIds<'a>, usize, usize);

impl<'a> Step<'a> {
    fn with_layout(layout: StepLayout<'a>) -> Self {
        Step {
            layout,
            response_mask: None,
            rollout_log_prob: None,
            old_log_prob: None,
            log_prob: None,
            advantages: None,
            responses: None,
            uid: None,
            rollout_logits: None,
            old_logits: None,
            kept_ids: None,
            kept_offsets: None,
            routed: None,
        }
    }
    /// A padded `[batch, seq_len]` step; set its [`response_mask`](Self::response_mask).
    pub fn padded(batch: usize, seq_len: usize) -> Self {
        Self::with_layout(StepLayout::Padded { batch, seq_len })
    }
    /// A packed step: sequence s is slots `cu_seqlens[s]..cu_seqlens[s+1]`, every slot valid
    /// (a packed layout has no padding, so it takes no `response_mask`).
    pub fn packed(cu_seqlens: &'a [i64]) -> Self {
        Self::with_layout(StepLayout::Packed { cu_seqlens })
    }
    /// verl's `response_mask` (bool or 0/1), one value per slot.
    pub fn response_mask(mut self, mask: impl Into<MaskValues<'a>>) -> Self {
        self.response_mask = Some(mask.into());
        self
    }
    /// The rollout engine's log-probs of the sampled tokens (verl's `rollout_log_probs`).
    pub fn rollout_log_prob(mut self, v: impl Into<Values<'a>>) -> Self {
        self.rollout_log_prob = Some(v.into());
        self
    }
    /// The trainer's recomputed log-probs before the update (verl's `old_log_probs`).
    pub fn old_log_prob(mut self, v: impl Into<Values<'a>>) -> Self {
        self.old_log_prob = Some(v.into());
        self
    }
    /// The current policy's log-probs (bypass mode).
    pub fn log_prob(mut self, v: impl Into<Values<'a>>) -> Self {
        self.log_prob = Some(v.into());
        self
    }
    /// Per-token advantages (the DPPO / PDM direction test).
    pub fn advantages(mut self, v: impl Into<Values<'a>>) -> Self {
        self.advantages = Some(v.into());
        self
    }
    /// Sampled token ids (verl's `responses`), needed with logits.
    pub fn responses(mut self, ids: &'a [i64]) -> Self {
        self.responses = Some(ids);
        self
    }
    /// Per-sequence GRPO group ids (verl's `uid`, TRL's prompt index): adds the
    /// `trmask/group_*` metrics.
    pub fn uid(mut self, ids: &'a [i64]) -> Self {
        self.uid = Some(ids);
        self
    }
    /// Sets the per-token values tensor `name` (a `Values`-role token tensor of the tensor
    /// table: `rollout_log_prob`, `old_log_prob`, `log_prob`, `advantages`).
    pub fn values(mut self, name: &str, v: impl Into<Values<'a>>) -> Result<Self> {
        let v = Some(v.into());
        match tensors::per_token_values().iter().position(|n| *n == name) {
            Some(0) => self.rollout_log_prob = v,
            Some(1) => self.old_log_prob = v,
            Some(2) => self.log_prob = v,
            Some(3) => self.advantages = v,
            _ => return Err(Error::input(name, "is not a per-token values tensor")),
        }
        Ok(self)
    }
    /// The kept sets of a truncated sampler (vLLM's `SamplingMask`, slime's top-p replay):
    /// the kept ids of every valid token concatenated (`rollout_sampling_mask_ids`) and their
    /// CSR offsets (`rollout_sampling_mask_offsets`: valid tokens + 1 values, or slots + 1).
    /// They give the exact kept mass with the rollout logits, or from the raw top-K where it
    /// covers them; `sampling_replay` then renormalises the trainer over them.
    pub fn sampling_mask(mut self, ids: &'a [i64], offsets: &'a [i64]) -> Self {
        self.kept_ids = Some(ids);
        self.kept_offsets = Some(offsets);
        self
    }
    /// Sets the integer tensor `name` (`responses` per token, `uid` per sequence, the kept
    /// sets' `rollout_sampling_mask_ids` / `_offsets`).
    pub fn ids(mut self, name: &str, ids: &'a [i64]) -> Result<Self> {
        match tensors::spec(name).map(|t| (t.role, t.shape)) {
            Some((Role::Ids, Shape::Token)) => self.responses = Some(ids),
            Some((Role::Ids, Shape::Seq)) => self.uid = Some(ids),
            Some((Role::Ids, Shape::Flat)) => self.kept_ids = Some(ids),
            Some((Role::Ids, Shape::KeptOffsets)) => self.kept_offsets = Some(ids),
            _ => {
                return Err(Error::input(
                    name,
                    "is not a per-token or per-sequence id tensor",
                ))
            }
        }
        Ok(self)
    }
    /// Both sides' MoE routed experts, `[slots, layers, top_k]` each, row-major, i32 or i64:
    /// `rollout_routed_experts` (the rollout engine's) and `old_routed_experts` (the
    /// trainer's own choice, without replay); `-1` marks an unrecorded (token, layer). They
    /// give the `route_flip` criteria and the `trmask/routing/*` metrics.
    pub fn routed_experts(
        mut self,
        rollout: impl Into<ExpertIds<'a>>,
        old: impl Into<ExpertIds<'a>>,
        layers: usize,
        top_k: usize,
    ) -> Self {
        self.routed = Some((rollout.into(), old.into(), layers, top_k));
        self
    }
    /// Full rollout and trainer logits `[slots, V]` for exact divergences.
    pub fn logits(mut self, rollout: &'a Logits, old: &'a Logits) -> Self {
        self.rollout_logits = Some(rollout);
        self.old_logits = Some(old);
        self
    }

    /// The lean pass's inputs: exactly the rollout's and the training policy's log-probs
    /// (`log_prob` in bypass mode, else `old_log_prob` or `log_prob`) and the layout, nothing
    /// else (`None` sends the step down the full path).
    fn lean_inputs(&self, bypass: bool) -> Option<LeanInputs<'a>> {
        if self.advantages.is_some()
            || self.responses.is_some()
            || self.uid.is_some()
            || self.rollout_logits.is_some()
            || self.old_logits.is_some()
            || self.kept_ids.is_some()
            || self.kept_offsets.is_some()
            || self.routed.is_some()
        {
            return None;
        }
        let train = match (self.old_log_prob, self.log_prob) {
            (None, Some(lp)) => lp,
            (Some(old), None) if !bypass => old,
            _ => return None,
        };
        let layout = match &self.layout {
            StepLayout::Padded { batch, seq_len } => LeanLayout::Padded {
                batch: *batch,
                seq_len: *seq_len,
            },
            StepLayout::Packed { cu_seqlens } => LeanLayout::Packed(cu_seqlens),
        };
        Some(LeanInputs {
            layout,
            mask: self.response_mask,
            roll: self.rollout_log_prob?,
            train,
        })
    }

    fn to_batch(&self) -> Result<Batch> {
        let mask = self.response_mask.map(MaskValues::to_f64).transpose()?;
        let mut batch = match &self.layout {
            StepLayout::Padded { batch, seq_len } => {
                let mask = mask.ok_or_else(|| {
                    Error::input(
                        "response_mask",
                        "is required for a padded step (Step::response_mask)",
                    )
                })?;
                Batch::padded(*batch, *seq_len, &mask)?
            }
            StepLayout::Packed { cu_seqlens } => {
                if mask.is_some() {
                    return Err(Error::input(
                        "response_mask",
                        "cannot be combined with cu_seqlens (packed layout has no padding)",
                    ));
                }
                Batch::packed(cu_seqlens)?
            }
        };
        let given = [
            self.rollout_log_prob,
            self.old_log_prob,
            self.log_prob,
            self.advantages,
        ];
        for (name, v) in tensors::per_token_values().into_iter().zip(given) {
            if let Some(v) = v {
                if v.len() != batch.slots() {
                    return Err(Error::input(
                        name,
                        format!(
                            "has {} values but the step has {} slots",
                            v.len(),
                            batch.slots()
                        ),
                    ));
                }
                batch = batch.with_log_probs(name, v.to_f64())?;
            }
        }
        if let Some(ids) = self.responses {
            batch = batch.with_responses(ids.to_vec())?;
        }
        if let Some(ids) = self.uid {
            batch = batch.with_uid(ids.to_vec())?;
        }
        if let Some(l) = self.rollout_logits {
            batch = batch.with_logits("rollout_logits", l.clone())?;
        }
        if let Some(l) = self.old_logits {
            batch = batch.with_logits("old_logits", l.clone())?;
        }
        match (self.kept_ids, self.kept_offsets) {
            (Some(ids), Some(off)) => batch = batch.with_kept_sets(ids.to_vec(), off)?,
            (None, None) => {}
            (ids, _) => {
                let (missing, given) = if ids.is_none() {
                    (
                        crate::sampling::kept_set::IDS,
                        crate::sampling::kept_set::OFFSETS,
                    )
                } else {
                    (
                        crate::sampling::kept_set::OFFSETS,
                        crate::sampling::kept_set::IDS,
                    )
                };
                return Err(Error::input(
                    missing,
                    format!("is missing: it is required with {given}"),
                ));
            }
        }
        if let Some((r, o, l, k)) = self.routed {
            batch = batch.with_routed_experts(r, o, l, k)?;
        }
        batch.validate()?;
        Ok(batch)
    }
}

/// Resolves a [`CorrectionConfig`] once and corrects one [`Step`] per training step.
pub struct Corrector {
    engine: Arc<dyn Engine>,
    config: CorrectionConfig,
    resolved: Resolved,
    /// The fused lean pass's plan, where it serves this config on this engine.
    lean: Option<LeanPlan>,
}

impl std::fmt::Debug for Corrector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corrector")
            .field("engine", &self.engine.name())
            .field("config", &self.config)
            .finish()
    }
}

impl Corrector {
    /// Checks and resolves `config` (an error names the bad key) for `engine` (a
    /// [`CpuEngine`](crate::cpu::CpuEngine), a [`GpuEngine`](crate::GpuEngine) — possibly on the
    /// trainer's own wgpu device — or an `Arc<dyn Engine>` shared with other work).
    pub fn new(engine: impl IntoEngine, config: &CorrectionConfig) -> Result<Self> {
        let resolved = config.resolve()?;
        let mut c = Corrector {
            engine: engine.into_engine(),
            config: config.clone(),
            resolved,
            lean: None,
        };
        c.lean = c.lean_plan();
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
        self.resolved.verl_metrics_only = on;
        self.lean = self.lean_plan();
        self
    }

    /// The lean pass runs on the CPU engines (the f64 reference's formulas).
    fn lean_plan(&self) -> Option<LeanPlan> {
        // the GPU engine, and a truncated sampler's kept mass (read from the raw top-K), take
        // the full path
        if self.engine.is_gpu() || !self.config.sampling.is_off() || self.config.sampling_replay {
            return None;
        }
        lean::plan(&self.resolved)
    }

    /// True when [`correct_into`](Self::correct_into) runs the fused lean pass for steps
    /// holding only log-probs and a mask (else it runs [`correct`](Self::correct) and copies).
    pub fn has_lean_pass(&self) -> bool {
        self.lean.is_some()
    }

    /// True when the config produces IS weights (`correct_into` then needs a weights buffer).
    pub fn has_weights(&self) -> bool {
        self.resolved.is.is_some()
    }

    /// The engine this corrector runs on.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// The config in effect.
    pub fn config(&self) -> &CorrectionConfig {
        &self.config
    }

    /// The statistics table this corrector's criteria read.
    fn table(&self, batch: &Batch) -> Result<crate::stats::StatTable> {
        let bkl = self
            .resolved
            .criteria
            .iter()
            .any(|c| c.stat == Stat::BinaryKl);
        correction_table(self.engine.as_ref(), batch, &self.config, bkl)
    }

    /// IS weights, the modified response mask, per-sequence decisions and verl's / trmask's
    /// metrics for one step.
    pub fn correct(&self, step: &Step<'_>) -> Result<Corrections> {
        // one process is the data-parallel path with nothing to exchange
        self.correct_shard(step, &mut SingleProcess)
    }

    /// [`correct`](Self::correct) for one data-parallel rank holding `step`, a shard of the
    /// whole batch (whole sequences), with `ex` carrying the partials between ranks (every rank
    /// calls it collectively): this shard's weights and mask (IS weights normalised over the
    /// whole batch) and the whole batch's metrics, identical on every rank.
    pub fn correct_shard(&self, step: &Step<'_>, ex: &mut dyn Exchange) -> Result<Corrections> {
        let mut batch = step.to_batch()?;
        let c = &self.config;
        let kept = crate::sampling::kept_mass::batch_kept_mass(
            &batch,
            &c.sampling,
            c.sampling_replay,
            c.bypass_mode,
            c.temperature,
        )?;
        let mut kept_metrics = None;
        if let Some(mut k) = kept {
            kept_metrics = Some(k.metrics(&batch));
            if let Some((_, b)) = k.replayed.take() {
                batch = b;
            }
        }
        let table = self.table(&batch)?;
        let (mut c, mut p) =
            compute_shard(self.engine.as_ref(), &batch, &table, &self.resolved, ex)?;
        if !self.resolved.verl_metrics_only {
            p.extend(kept_metrics.unwrap_or_default());
            p.extend(crate::metrics::breakdown::breakdown_partial(
                &batch, &table, &c,
            ));
        }
        let merged = exchange(ex, p)?;
        check_valid_tokens(&merged, batch.layout())?;
        c.metrics = merged.finish()?;
        Ok(c)
    }
}

impl Corrector {
    /// [`correct`](Self::correct) writing the IS weights and the modified response mask into
    /// the caller's buffers (`out`, one value per slot, verl's dtypes): the trainer's hot path.
    /// For steps holding only both policies' log-probs and a mask, and the configs it serves
    /// (verl's metrics only, sampled-token criteria, token or sequence IS), this is one fused
    /// pass over each sequence that reads the inputs in their own dtype; anything else runs
    /// [`correct`](Self::correct) and copies. The returned [`Corrections`] holds the decisions
    /// and metrics; its `weights` and `mask` are left empty.
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
        let lean = self
            .lean
            .as_ref()
            .zip(step.lean_inputs(self.config.bypass_mode));
        if let Some((plan, inp)) = lean {
            if let Some((mut c, p)) = lean::run(plan, &inp, &mut out, ex)? {
                let merged = exchange(ex, p)?;
                if merged.count("#valid_tokens") == 0 {
                    // the full path words the error for the layout
                    return self.correct_shard(step, ex);
                }
                c.metrics = merged.finish()?;
                return Ok(c);
            }
        }
        let mut c = if ex.size() <= 1 {
            self.correct(step)?
        } else {
            self.correct_shard(step, ex)?
        };
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
