//! DeepSeek-V3.2's off-policy sequence masking (OPSM, `rollout_rs: "opsm"`): a sequence is
//! rejected iff its advantage is negative and the mean of `log(π_roll/π_train) = −lr` over its
//! valid tokens exceeds δ. The decision runs in the engine's corrections pass as a weighted
//! mean: the value column holds `−lr` on the tokens of negative-advantage sequences (0
//! elsewhere) and the weight column 1 there (0 elsewhere), so a sequence with a non-negative
//! advantage aggregates to 0, which every δ > 0 keeps.

use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::math::LaneSum;
use crate::metrics::ctx::Ctx;

/// OPSM's two per-slot columns (value, weight), or empty ones when no criterion is `opsm`.
pub(crate) struct OpsmColumns {
    pub value: Vec<f64>,
    pub weight: Vec<f64>,
}

impl OpsmColumns {
    /// The columns for `batch` (`lr` is the table's unclamped log-ratio): a sequence's
    /// advantage is the sum of `advantages` over its valid tokens (its sign is the mean's),
    /// so a per-token advantage that changes sign within a sequence does not split it.
    pub(crate) fn new(ctx: &Ctx, batch: &Batch, lr: &[f64], needed: bool) -> Result<Self> {
        if !needed {
            return Ok(OpsmColumns {
                value: Vec::new(),
                weight: Vec::new(),
            });
        }
        let adv = batch.advantages().ok_or_else(|| {
            Error::input(
                "advantages",
                "is missing: rollout_rs 'opsm' rejects only sequences with a negative advantage",
            )
        })?;
        // in lanes by slot, as the fused pass adds them (the same sum, so the same sign)
        let seq_adv: Vec<f64> = (ctx.segs.ranges().iter())
            .map(|&(a, e)| {
                let mut s = LaneSum::default();
                (a..e)
                    .filter(|&i| ctx.mask[i])
                    .for_each(|i| s.add_at(i - a, adv[i]));
                s.value()
            })
            .collect();
        let neg = |i: usize| ctx.mask[i] && seq_adv[ctx.owner[i]] < 0.0;
        Ok(OpsmColumns {
            value: (0..ctx.mask.len())
                .map(|i| if neg(i) { -lr[i] } else { 0.0 })
                .collect(),
            weight: (0..ctx.mask.len())
                .map(|i| if neg(i) { 1.0 } else { 0.0 })
                .collect(),
        })
    }
}
