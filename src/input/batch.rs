//! Batch layouts (padded `[B,T]` + `response_mask`, or packed `[N]` + `cu_seqlens`) and the
//! validation of every input tensor.
//!
//! Every per-token tensor is stored flat, in the input's layout: `B·T` slots for a padded batch,
//! `N` slots for a packed one. [`Batch::segments`] gives each sequence's slot range and
//! [`Batch::mask`] says which slots are valid; values at invalid slots are never read by any
//! computation (they may hold NaN or garbage).

use crate::error::{Error, Result};

use crate::input::logits::impossible_sample;
use crate::input::logits::Logits;
use crate::input::routing::{ExpertIds, Routing};
pub use crate::input::segments::Segments;
use crate::input::tensors;
use crate::sampling::kept_set::KeptSets;

/// How sequences are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[B, T]` tensors with a `response_mask`; row b is sequence b.
    Padded { batch: usize, seq_len: usize },
    /// `[N]` tensors; sequence s is slots `cu_seqlens[s]..cu_seqlens[s+1]`.
    Packed { cu_seqlens: Vec<usize> },
}

/// A batch of responses: the layout plus whichever input tensors (docs/FORMAT.md) were given,
/// validated once when built.
///
/// Start with [`Batch::padded`] or [`Batch::packed`] (a [`BatchBuilder`]), attach tensors with
/// the `with_*` methods (each checks its shape) and [`BatchBuilder::build`] it: the build checks
/// everything that can be checked without computing (finite log-probs at valid positions,
/// matching vocabularies, token ids in range, kept sets holding the sampled token), so every
/// `Batch` is valid and no computation checks it again. The tensors are read through accessors
/// named as in verl (`batch.old_log_prob()`, `batch.responses()`, …).
///
/// ```
/// use trmask::Batch;
/// let batch = Batch::padded(2, 3, &[1.0, 1.0, 0.0, 1.0, 0.0, 0.0])?
///     .with_log_probs("rollout_log_prob", vec![-1.0, -0.5, f64::NAN, -2.0, 9.9, 9.9])?
///     .with_log_probs("old_log_prob", vec![-1.1, -0.4, f64::NAN, -2.0, 0.0, 0.0])?
///     .build()?;
/// assert_eq!(batch.segments().lengths(), vec![2, 1]);
/// assert_eq!(batch.old_log_prob().map(|v| v[1]), Some(-0.4));
/// // a NaN at a valid position is refused when the batch is built
/// let bad = Batch::padded(1, 2, &[1.0, 1.0])?
///     .with_log_probs("old_log_prob", vec![-1.0, f64::NAN])?
///     .build();
/// assert!(bad.unwrap_err().to_string().contains("old_log_prob"));
/// # Ok::<(), trmask::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Batch {
    layout: Layout,
    segments: Segments,
    rollout_log_prob: Option<Vec<f64>>,
    old_log_prob: Option<Vec<f64>>,
    log_prob: Option<Vec<f64>>,
    advantages: Option<Vec<f64>>,
    responses: Option<Vec<i64>>,
    rollout_logits: Option<Logits>,
    old_logits: Option<Logits>,
    rollout_topk_ids: Option<Vec<i64>>,
    rollout_topk_log_prob: Option<Vec<f64>>,
    topk: usize,
    uid: Option<Vec<i64>>,
    kept_sets: Option<KeptSets>,
    routing: Option<Routing>,
}

/// A [`Batch`] being assembled: its layout and the tensors attached so far, each
/// shape-checked; [`BatchBuilder::build`] validates the whole and returns the `Batch`.
#[derive(Clone, Debug)]
pub struct BatchBuilder(Batch);

impl Batch {
    /// A padded `[batch, seq_len]` batch; `response_mask` (row-major) must hold only 0 and 1.
    pub fn padded(batch: usize, seq_len: usize, response_mask: &[f64]) -> Result<BatchBuilder> {
        let slots = batch
            .checked_mul(seq_len)
            .ok_or_else(|| Error::input("response_mask", "shape overflows"))?;
        if response_mask.len() != slots {
            return Err(Error::input(
                "response_mask",
                format!(
                    "has {} values, expected [{batch}, {seq_len}] = {slots}",
                    response_mask.len()
                ),
            ));
        }
        let mut mask = Vec::with_capacity(slots);
        for (i, &m) in response_mask.iter().enumerate() {
            if m == 1.0 {
                mask.push(true);
            } else if m == 0.0 {
                mask.push(false);
            } else {
                return Err(Error::input(
                    "response_mask",
                    format!(
                        "value {m} at [{}, {}] is not 0 or 1",
                        i / seq_len.max(1),
                        i % seq_len.max(1)
                    ),
                ));
            }
        }
        let mut ranges = Vec::new();
        ranges
            .try_reserve_exact(batch)
            .map_err(|_| Error::OutOfMemory(format!("the ranges of {batch} sequences")))?;
        ranges.extend((0..batch).map(|b| (b * seq_len, (b + 1) * seq_len)));
        Ok(Self::with_layout(
            Layout::Padded { batch, seq_len },
            Segments { ranges, mask },
        ))
    }

    /// A packed batch of `cu_seqlens.len() − 1` sequences over `N = cu_seqlens[S]` slots.
    pub fn packed(cu_seqlens: &[i64]) -> Result<BatchBuilder> {
        if cu_seqlens.is_empty() {
            return Err(Error::input(
                "cu_seqlens",
                "is empty; it needs at least the leading 0",
            ));
        }
        if cu_seqlens[0] != 0 {
            return Err(Error::input(
                "cu_seqlens",
                format!("starts at {}, not 0", cu_seqlens[0]),
            ));
        }
        let mut cu = Vec::with_capacity(cu_seqlens.len());
        for (i, &c) in cu_seqlens.iter().enumerate() {
            if i > 0 && c < cu_seqlens[i - 1] {
                return Err(Error::input(
                    "cu_seqlens",
                    format!(
                        "decreases at index {i} ({} then {c}); offsets must be non-decreasing",
                        cu_seqlens[i - 1]
                    ),
                ));
            }
            cu.push(c as usize);
        }
        let n = *cu.last().unwrap();
        let mut mask = Vec::new();
        mask.try_reserve_exact(n)
            .map_err(|_| Error::OutOfMemory(format!("a mask of {n} slots (cu_seqlens)")))?;
        mask.resize(n, true);
        let ranges = cu.windows(2).map(|w| (w[0], w[1])).collect();
        Ok(Self::with_layout(
            Layout::Packed { cu_seqlens: cu },
            Segments { ranges, mask },
        ))
    }

    /// A padded `[batch, seq_len]` batch of slot validity `mask` (row-major), no tensor
    /// attached; `None` when the sizes disagree.
    pub(crate) fn from_mask(batch: usize, seq_len: usize, mask: Vec<bool>) -> Option<Self> {
        if batch.checked_mul(seq_len)? != mask.len() {
            return None;
        }
        let ranges = (0..batch)
            .map(|b| (b * seq_len, (b + 1) * seq_len))
            .collect();
        Some(Self::with_layout(Layout::Padded { batch, seq_len }, Segments { ranges, mask }).0)
    }

    fn with_layout(layout: Layout, segments: Segments) -> BatchBuilder {
        BatchBuilder(Batch {
            layout,
            segments,
            rollout_log_prob: None,
            old_log_prob: None,
            log_prob: None,
            advantages: None,
            responses: None,
            rollout_logits: None,
            old_logits: None,
            rollout_topk_ids: None,
            rollout_topk_log_prob: None,
            topk: 0,
            uid: None,
            kept_sets: None,
            routing: None,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Sequence ranges and slot validity.
    pub fn segments(&self) -> &Segments {
        &self.segments
    }
    /// Slot validity (`response_mask` for padded batches, all true for packed ones).
    pub fn mask(&self) -> &[bool] {
        &self.segments.mask
    }
    /// Number of slots (`B·T` or `N`).
    pub fn slots(&self) -> usize {
        self.segments.slots()
    }
    /// Number of sequences.
    pub fn num_seqs(&self) -> usize {
        self.segments.len()
    }
    /// The per-token shape of this layout (`[B, T]` or `[N]`).
    pub fn token_shape(&self) -> Vec<usize> {
        match &self.layout {
            Layout::Padded { batch, seq_len } => vec![*batch, *seq_len],
            Layout::Packed { .. } => vec![self.slots()],
        }
    }

    /// log π_roll(y_t), per slot.
    pub fn rollout_log_prob(&self) -> Option<&[f64]> {
        self.rollout_log_prob.as_deref()
    }
    /// log π_train(y_t) (verl's `old_log_prob`), per slot.
    pub fn old_log_prob(&self) -> Option<&[f64]> {
        self.old_log_prob.as_deref()
    }
    /// log π_θ(y_t) (the current policy), per slot.
    pub fn log_prob(&self) -> Option<&[f64]> {
        self.log_prob.as_deref()
    }
    /// Per-token advantages, per slot.
    pub fn advantages(&self) -> Option<&[f64]> {
        self.advantages.as_deref()
    }
    /// Sampled token ids y_t, per slot.
    pub fn responses(&self) -> Option<&[i64]> {
        self.responses.as_deref()
    }
    /// Rollout logits `[slots, V]`.
    pub fn rollout_logits(&self) -> Option<&Logits> {
        self.rollout_logits.as_ref()
    }
    /// Trainer logits `[slots, V]`.
    pub fn old_logits(&self) -> Option<&Logits> {
        self.old_logits.as_ref()
    }
    /// Rollout top-K ids `[slots, K]`, row-major.
    pub fn rollout_topk_ids(&self) -> Option<&[i64]> {
        self.rollout_topk_ids.as_deref()
    }
    /// Rollout top-K log-probs `[slots, K]`, row-major.
    pub fn rollout_topk_log_prob(&self) -> Option<&[f64]> {
        self.rollout_topk_log_prob.as_deref()
    }
    /// K of the top-K tensors (0 when absent).
    pub fn topk(&self) -> usize {
        self.topk
    }
    /// Per-sequence GRPO group id (verl's `uid`, TRL's prompt index), one per sequence.
    pub fn uid(&self) -> Option<&[i64]> {
        self.uid.as_deref()
    }
    /// The ids a truncated sampler kept at each valid token (`rollout_sampling_mask_*`).
    pub fn kept_sets(&self) -> Option<&KeptSets> {
        self.kept_sets.as_ref()
    }
    /// Both sides' MoE routed experts (`rollout_routed_experts`, `old_routed_experts`).
    pub fn routing(&self) -> Option<&Routing> {
        self.routing.as_ref()
    }

    /// This batch with the per-token f64 tensor `name` replaced by `values` derived from its
    /// own validated inputs (the rollout log-probs from its logits, the trainer's renormalised
    /// over the kept set): only the new values are checked.
    pub(crate) fn with_derived(&self, name: &str, values: Vec<f64>) -> Result<Batch> {
        self.check_token_shape(name, values.len())?;
        self.check_finite(name, &values)?;
        let mut b = self.clone();
        match b.values_slot(name) {
            Some(slot) => *slot = Some(values),
            None => return Err(Error::input(name, "is not a per-token f64 tensor")),
        }
        Ok(b)
    }

    fn check_token_shape(&self, name: &str, len: usize) -> Result<()> {
        if len != self.slots() {
            return Err(Error::input(
                name,
                format!(
                    "has {len} values but the batch has {:?} = {} token slots",
                    self.token_shape(),
                    self.slots()
                ),
            ));
        }
        Ok(())
    }

    /// The per-token f64 tensor `name` (one of [`tensors::per_token_values`]), if given.
    pub fn values(&self, name: &str) -> Option<&[f64]> {
        let i = tensors::per_token_values()
            .iter()
            .position(|n| *n == name)?;
        [
            &self.rollout_log_prob,
            &self.old_log_prob,
            &self.log_prob,
            &self.advantages,
        ][i]
            .as_deref()
    }

    fn values_slot(&mut self, name: &str) -> Option<&mut Option<Vec<f64>>> {
        let i = tensors::per_token_values()
            .iter()
            .position(|n| *n == name)?;
        [
            &mut self.rollout_log_prob,
            &mut self.old_log_prob,
            &mut self.log_prob,
            &mut self.advantages,
        ]
        .into_iter()
        .nth(i)
    }

    /// Vocabulary size, when logits are present.
    pub fn vocab(&self) -> Option<usize> {
        self.old_logits
            .as_ref()
            .or(self.rollout_logits.as_ref())
            .map(|l| l.vocab())
    }

    /// Human-readable position of a slot (`[b, t]` or `[n]`).
    pub fn position(&self, slot: usize) -> String {
        match &self.layout {
            Layout::Padded { seq_len, .. } => {
                let t = (*seq_len).max(1); // a [B, 0] batch has no slot to name
                format!("[{}, {}]", slot / t, slot % t)
            }
            Layout::Packed { .. } => format!("[{slot}]"),
        }
    }

    /// A per-token f64 tensor is finite at every valid position.
    fn check_finite(&self, name: &str, v: &[f64]) -> Result<()> {
        let mask = self.mask();
        if let Some(i) = (0..v.len()).find(|&i| mask[i] && !v[i].is_finite()) {
            return Err(Error::input(
                name,
                format!(
                    "value {} at valid position {} is not finite",
                    v[i],
                    self.position(i)
                ),
            ));
        }
        Ok(())
    }

    /// Checks everything that can be checked without computing: finite log-probs at valid
    /// positions, matching vocabularies, token ids in range (the shapes were checked as the
    /// tensors were attached). Run once, by [`BatchBuilder::build`].
    fn validate(&self) -> Result<()> {
        let mask = self.mask();
        for name in tensors::per_token_values() {
            if let Some(v) = self.values(name) {
                self.check_finite(name, v)?;
            }
        }
        if let (Some(a), Some(b)) = (&self.rollout_logits, &self.old_logits) {
            if a.vocab() != b.vocab() {
                return Err(Error::input(
                    "old_logits",
                    format!(
                        "vocabulary {} differs from rollout_logits' {}",
                        b.vocab(),
                        a.vocab()
                    ),
                ));
            }
        }
        if let (Some(ids), Some(v)) = (&self.responses, self.vocab()) {
            if let Some(i) =
                (0..ids.len()).find(|&i| mask[i] && (ids[i] < 0 || ids[i] as usize >= v))
            {
                return Err(Error::input(
                    "responses",
                    format!(
                        "token id {} at valid position {} is outside [0, {v})",
                        ids[i],
                        self.position(i)
                    ),
                ));
            }
        }
        if let (Some(l), Some(ids)) = (&self.rollout_logits, &self.responses) {
            if let Some(i) = impossible_sample(l, ids, mask) {
                return Err(Error::input(
                    "responses",
                    format!(
                        "token id {} at valid position {} has rollout logit -inf: zero \
                         probability under the policy that sampled it (wrong ids, or a sampler \
                         mask that the dump does not reflect)",
                        ids[i],
                        self.position(i)
                    ),
                ));
            }
        }
        if let Some(k) = &self.kept_sets {
            let responses = self.responses.as_deref();
            k.check(self.vocab(), responses, mask, &|i| self.position(i))?;
        }
        if (self.rollout_logits.is_some() || self.old_logits.is_some()) && self.responses.is_none()
        {
            let need = self.rollout_log_prob.is_none() || self.old_log_prob.is_none();
            if need {
                return Err(Error::input(
                    "responses",
                    "is required with logits when log-probs are not given",
                ));
            }
        }
        Ok(())
    }
}

impl BatchBuilder {
    /// Attaches a per-token f64 tensor by its docs/FORMAT.md name
    /// (`rollout_log_prob`, `old_log_prob`, `log_prob`, `advantages`).
    pub fn with_log_probs(mut self, name: &str, values: Vec<f64>) -> Result<Self> {
        self.0.check_token_shape(name, values.len())?;
        match self.0.values_slot(name) {
            Some(slot) => *slot = Some(values),
            None => {
                return Err(Error::input(
                    name,
                    "is not a per-token f64 tensor (see docs/FORMAT.md)",
                ))
            }
        }
        Ok(self)
    }

    /// Attaches the per-sequence group ids (`uid`, `[B]` padded or `[S]` packed).
    pub fn with_uid(mut self, uid: Vec<i64>) -> Result<Self> {
        let n = self.0.num_seqs();
        if uid.len() != n {
            let msg = format!("has {} values but the batch has {n} sequences", uid.len());
            return Err(Error::input("uid", msg));
        }
        self.0.uid = Some(uid);
        Ok(self)
    }

    /// Attaches the sampled token ids.
    pub fn with_responses(mut self, ids: Vec<i64>) -> Result<Self> {
        self.0.check_token_shape("responses", ids.len())?;
        self.0.responses = Some(ids);
        Ok(self)
    }

    /// Attaches `rollout_logits` or `old_logits` (`[slots, V]`).
    pub fn with_logits(mut self, name: &str, logits: Logits) -> Result<Self> {
        if logits.rows() != self.0.slots() {
            return Err(Error::input(
                name,
                format!(
                    "has {} rows but the batch has {} token slots",
                    logits.rows(),
                    self.0.slots()
                ),
            ));
        }
        match name {
            "rollout_logits" => self.0.rollout_logits = Some(logits),
            "old_logits" => self.0.old_logits = Some(logits),
            other => {
                return Err(Error::input(
                    other,
                    "is not a logits tensor (see docs/FORMAT.md)",
                ))
            }
        }
        Ok(self)
    }

    /// Attaches the rollout top-K ids and log-probs (`[slots, K]` each, row-major).
    pub fn with_topk(mut self, ids: Vec<i64>, log_probs: Vec<f64>, k: usize) -> Result<Self> {
        if k == 0 {
            return Err(Error::input("rollout_topk_ids", "K must be at least 1"));
        }
        if ids.len() != self.0.slots() * k {
            return Err(Error::input(
                "rollout_topk_ids",
                format!(
                    "has {} values, expected {} x {k}",
                    ids.len(),
                    self.0.slots()
                ),
            ));
        }
        if log_probs.len() != ids.len() {
            return Err(Error::input(
                "rollout_topk_log_prob",
                format!(
                    "has {} values, expected {} (same shape as rollout_topk_ids)",
                    log_probs.len(),
                    ids.len()
                ),
            ));
        }
        self.0.rollout_topk_ids = Some(ids);
        self.0.rollout_topk_log_prob = Some(log_probs);
        self.0.topk = k;
        Ok(self)
    }

    /// Attaches the kept sets of a truncated sampler: `rollout_sampling_mask_ids` sliced by
    /// `rollout_sampling_mask_offsets` (one span per valid token, or one per slot); the
    /// structure is checked here, the ids against the vocabulary and `responses` by
    /// [`BatchBuilder::build`].
    pub fn with_kept_sets(mut self, ids: Vec<i64>, offsets: &[i64]) -> Result<Self> {
        let b = &self.0;
        let k = KeptSets::new(ids, offsets, b.mask(), &|i| b.position(i))?;
        self.0.kept_sets = Some(k);
        Ok(self)
    }

    /// Attaches both sides' MoE routed experts, `[slots, layers, top_k]` each, row-major, i32
    /// or i64 (`rollout_routed_experts`: the rollout engine's; `old_routed_experts`: the
    /// trainer's own choice). Ids at padding are never read; see [`Routing::new`] for the
    /// checks.
    pub fn with_routed_experts<'a>(
        mut self,
        rollout: impl Into<ExpertIds<'a>>,
        old: impl Into<ExpertIds<'a>>,
        layers: usize,
        top_k: usize,
    ) -> Result<Self> {
        let b = &self.0;
        let pos = |i: usize| b.position(i);
        let (r, o) = (rollout.into(), old.into());
        let r = Routing::from_ids(r, o, layers, top_k, b.mask(), &pos)?;
        self.0.routing = Some(r);
        Ok(self)
    }

    /// Whether the rollout policy's sampled-token log-probs are given or derivable: its
    /// log-probs, its logits or its top-K log-probs.
    pub fn has_rollout_policy(&self) -> bool {
        let b = &self.0;
        b.rollout_log_prob.is_some()
            || b.rollout_logits.is_some()
            || b.rollout_topk_log_prob.is_some()
    }
    /// Whether the training policy's log-probs are given or derivable: `old_log_prob`,
    /// `log_prob` or the trainer's logits.
    pub fn has_training_policy(&self) -> bool {
        let b = &self.0;
        b.old_log_prob.is_some() || b.log_prob.is_some() || b.old_logits.is_some()
    }

    /// Number of slots (`B·T` or `N`).
    pub fn slots(&self) -> usize {
        self.0.slots()
    }
    /// Slot validity, as [`Batch::mask`].
    pub fn mask(&self) -> &[bool] {
        self.0.mask()
    }
    /// The per-token shape, as [`Batch::token_shape`].
    pub fn token_shape(&self) -> Vec<usize> {
        self.0.token_shape()
    }
    /// Human-readable position of a slot, as [`Batch::position`].
    pub fn position(&self, slot: usize) -> String {
        self.0.position(slot)
    }

    /// Validates the batch as a whole (finite log-probs at valid positions, matching
    /// vocabularies, token ids in range, kept sets holding the sampled token, `responses` with
    /// logits when log-probs are not given) and returns it.
    pub fn build(self) -> Result<Batch> {
        self.0.validate()?;
        Ok(self.0)
    }
}
