//! [`Step`]: one training step's tensors, borrowed from the trainer, and what they become —
//! the fused pass's inputs when they are host log-probs only, else a validated [`Batch`].

use crate::correction::lean::{LeanInputs, LeanLayout};
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::logits::Logits;
use crate::input::routing::ExpertIds;
use crate::input::tensors::{self, Role, Shape};
use crate::input::values::{MaskValues, Values};

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
    rollout_topk: Option<(&'a [i64], Values<'a>)>,
    whole: Option<&'a Batch>,
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
            rollout_topk: None,
            whole: None,
            routed: None,
        }
    }

    /// A step given as a whole [`Batch`] (what `analyze` reads: the rollout's top-K,
    /// per-sequence advantages, kept sets, logits); it takes the full path.
    pub fn batch(batch: &'a Batch) -> Self {
        let mut s = Self::with_layout(StepLayout::Padded {
            batch: 0,
            seq_len: 0,
        });
        s.whole = Some(batch);
        s
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
    /// The rollout engine's top-K (`rollout_topk_ids`, `rollout_topk_log_prob`: `[slots, K]`
    /// each, row-major): its kept mass under the config's `top_p` / `top_k` / `min_p`
    /// (`sampling_replay`) and, with `old_logits`, the top-K divergences.
    ///
    /// ```
    /// use trmask::{cpu::CpuEngine, CorrectionConfig, Corrector, Step};
    /// let cfg = CorrectionConfig::from_json_str(r#"{"top_p": 0.9, "sampling_replay": true}"#)?;
    /// let c = Corrector::new(CpuEngine::new(), &cfg)?;
    /// let (mask, roll, old) = ([true, true], [-0.1f32, -0.2], [-0.15f32, -0.3]);
    /// // K = 2 per slot: the sampled token first
    /// let (ids, lp) = ([5i64, 7, 3, 1], [-0.1f32, -2.4, -0.2, -1.8]);
    /// let out = c.correct(&Step::padded(1, 2).response_mask(&mask[..])
    ///     .rollout_log_prob(&roll[..]).old_log_prob(&old[..])
    ///     .responses(&[5, 3][..]).rollout_topk(&ids[..], &lp[..]))?;
    /// assert!(out.metrics.contains_key("trmask/log_kept_mass_mean"));
    /// # Ok::<(), trmask::Error>(())
    /// ```
    pub fn rollout_topk(mut self, ids: &'a [i64], log_probs: impl Into<Values<'a>>) -> Self {
        self.rollout_topk = Some((ids, log_probs.into()));
        self
    }

    pub(crate) fn lean_inputs(&self, bypass: bool) -> Option<LeanInputs<'a>> {
        if self.whole.is_some()
            || self.responses.is_some()
            || self.rollout_logits.is_some()
            || self.old_logits.is_some()
            || self.kept_ids.is_some()
            || self.kept_offsets.is_some()
            || self.rollout_topk.is_some()
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
            adv: self.advantages,
            uid: self.uid,
        })
    }

    /// The step as the summary and the warnings see it: its layout and response mask as a
    /// [`Batch`] without tensors. `None` for a packed step, one without a mask or given as a
    /// whole batch, or a mask value other than 0 / 1.
    pub fn shape(&self) -> Option<Batch> {
        let StepLayout::Padded { batch, seq_len } = self.layout else {
            return None;
        };
        Batch::from_mask(batch, seq_len, self.response_mask?.to_bools()?)
    }

    /// The training policy's tensor [`lean_inputs`](Self::lean_inputs) reads.
    pub(crate) fn lean_train_name(&self) -> &'static str {
        if self.old_log_prob.is_some() {
            "old_log_prob"
        } else {
            "log_prob"
        }
    }

    pub(crate) fn to_batch(&self) -> Result<Batch> {
        if let Some(b) = self.whole {
            return Ok(b.clone());
        }
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
        if let Some((ids, lp)) = self.rollout_topk {
            let slots = batch.slots();
            if slots == 0 || ids.len() % slots != 0 {
                return Err(Error::input(
                    "rollout_topk_ids",
                    format!(
                        "has {} values: not a multiple of the step's {slots} slots",
                        ids.len()
                    ),
                ));
            }
            batch = batch.with_topk(ids.to_vec(), lp.to_f64(), ids.len() / slots)?;
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
        batch.build()
    }
}
