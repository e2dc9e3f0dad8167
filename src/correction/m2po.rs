//! M2PO's second-moment trust region (`rollout_rs: "m2po"`, Zheng et al. 2025, arXiv 2510.01161,
//! Algorithm 1): among the tokens in the active quadrants — `A > 0` and `lr > 0` (ρ > 1), or
//! `A < 0` and `lr < 0` (ρ < 1) — drop the one with the largest `lr²` while the mean of `lr²`
//! over the remaining active tokens exceeds τ. Tokens outside the active quadrants are never
//! dropped and never enter the mean.
//!
//! The selection is batch-global and exact: the number of dropped tokens `k` depends only on
//! the multiset of active `lr²` (sorted descending; the suffix sums accumulated from the
//! smallest value up, as AReaL's `flip().cumsum().flip()` does; the first `k` with
//! `suffix_k / (n − k) ≤ τ`, or `n` when none is). Ties at the cut are dropped in batch order
//! (a stable descending sort: the earliest slot first). Across data-parallel ranks every rank
//! all-gathers every rank's active values in rank order (one collective through the
//! [`Exchange`], 8 bytes per active token) and runs the same computation on the same vector, so
//! each rank's mask is its rows of the one-process mask bit for bit.

use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::math::{from_order_bits, order_bits};
use crate::metrics::ctx::Ctx;
use crate::partial::{Acc, Empty, Exchange, FracMode, Partial};
use crate::stats::StatTable;
use rayon::slice::ParallelSliceMut;
use std::borrow::Cow;

/// M2PO's per-slot columns: `lr²` on active tokens (0 elsewhere) and the drop indicator
/// (1 dropped, 0 kept), both empty when no criterion is `m2po`; plus the batch-global summary.
#[derive(Default)]
pub(crate) struct M2poColumns {
    pub value: Vec<f64>,
    pub drop: Vec<f64>,
    summary: Summary,
}

/// What M2PO's own metrics report of a step's selection.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Summary {
    /// Active tokens of this shard.
    local_active: usize,
    /// Mean `lr²` over the batch's active tokens before and after the drop (None: no active token).
    m2: Option<(f64, f64)>,
    /// The smallest dropped `lr²` (None: nothing dropped).
    cutoff: Option<f64>,
}

/// A selection as a rule on the active values in batch order: every value above `cut` is
/// dropped, and of the values equal to it the first `ties`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cut {
    cut: f64,
    ties: usize,
}

impl Cut {
    /// Whether the active value `v` is dropped; `tie` counts the values equal to the cut met so
    /// far in batch order (this one included after the call).
    #[inline(always)]
    pub(crate) fn take(&self, v: f64, tie: &mut usize) -> bool {
        let at = v == self.cut;
        let dropped = self.above(v) || (at && *tie < self.ties);
        *tie += usize::from(at);
        dropped
    }

    /// How many of `values` equal the cut (they advance the tie count).
    pub(crate) fn ties_in(&self, values: &[f64]) -> usize {
        values.iter().filter(|&&v| v == self.cut).count()
    }

    /// A value above the cut: dropped whatever the tie count ([`Cut::take`] of a value that
    /// does not equal the cut).
    #[inline(always)]
    fn above(&self, v: f64) -> bool {
        v > self.cut
    }
}

/// A step's M2PO decision, made alike by both executors.
pub(crate) struct Decision {
    pub(crate) cut: Cut,
    /// The values equal to the cut on the ranks before this one (this rank's first tie count).
    pub(crate) ties_before: usize,
    pub(crate) summary: Summary,
}

/// The decision from this shard's active values `local` (batch order) under `tau`: every
/// rank's values gathered in rank order (a collective through `ex` with several ranks), the
/// selection run on them, its rule and summary.
pub(crate) fn decide(local: &[f64], tau: f64, ex: &mut dyn Exchange) -> Result<Decision> {
    let (all, offset) = gather(ex, local)?;
    let sel = select(&all, tau);
    let cut = match sel.k {
        0 => Cut {
            cut: f64::INFINITY,
            ties: 0,
        },
        k => {
            let c = sel.at(k - 1);
            // the dropped values in descending order: those above the cut come first
            let above = sel.keys[..k].partition_point(|&key| value(key) > c);
            Cut {
                cut: c,
                ties: k - above,
            }
        }
    };
    Ok(Decision {
        ties_before: cut.ties_in(&all[..offset]),
        summary: Summary {
            local_active: local.len(),
            m2: (!all.is_empty()).then_some((sel.m2_before, sel.m2_after)),
            cutoff: (sel.k > 0).then_some(cut.cut),
        },
        cut,
    })
}

/// Whether a valid token is in M2PO's active quadrants (its advantage and log-ratio of one
/// sign), and its value `lr²` there.
#[inline(always)]
pub(crate) fn active(adv: f64, lr: f64) -> Option<f64> {
    active_sign(adv, lr).then_some(lr * lr)
}

/// The active quadrants' test of [`active`] (branch-free).
#[inline(always)]
pub(crate) fn active_sign(adv: f64, lr: f64) -> bool {
    ((adv > 0.0) & (lr > 0.0)) | ((adv < 0.0) & (lr < 0.0))
}

/// Selection over the whole batch's active values (batch order): their sort keys in the order
/// of a stable descending sort (`keys[..k]` are dropped), how many the largest-first drop
/// removes under τ, the mean before and after.
pub(crate) struct Selection {
    keys: Vec<u128>,
    pub k: usize,
    pub m2_before: f64,
    pub m2_after: f64,
}

/// A value's sort key: descending (`total_cmp`'s order, reversed), equal values in batch order
/// (a stable sort's order: the earliest of a tie is dropped first), its index `i` in the low
/// bits; distinct keys, so any sort gives the one order.
#[inline(always)]
fn key(x: f64, i: u64) -> u128 {
    (u128::from(!order_bits(x)) << 64) | u128::from(i)
}

/// The value of a [`key`].
#[inline(always)]
fn value(k: u128) -> f64 {
    from_order_bits(!((k >> 64) as u64))
}

impl Selection {
    /// The `j`-th value in selection order.
    fn at(&self, j: usize) -> f64 {
        value(self.keys[j])
    }

    /// The dropped values' indices in batch order, in the order they are dropped.
    #[cfg(test)]
    fn dropped(&self) -> Vec<usize> {
        self.keys[..self.k]
            .iter()
            .map(|&k| k as u64 as usize)
            .collect()
    }
}

/// The rule as the fused pass applies it to a task's slots (`correction::lean`): M2PO's
/// criterion index, its τ (the metrics' bound), the step's rule, and the tie count at the
/// task's next slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct M2poTask {
    pub(crate) ci: usize,
    pub(crate) tau: f64,
    pub(crate) cut: Cut,
    pub(crate) tie: usize,
}

impl M2poTask {
    /// The tile's values (`x`: `lr²` on the active tokens, 0 elsewhere; `v` all ones at a
    /// valid slot, `a` the advantages, `lr` the log-ratios) and drops (`d`: 1 dropped), by the
    /// step's rule in batch order.
    #[inline(always)]
    pub(crate) fn tile(&mut self, v: &[u64], a: &[f64], lr: &[f64], x: &mut [f64], d: &mut [f64]) {
        let cut = self.cut;
        let mut ties = 0;
        for j in 0..x.len() {
            let act = (v[j] != 0) & active_sign(a[j], lr[j]);
            let val = if act { lr[j] * lr[j] } else { 0.0 };
            x[j] = val;
            d[j] = f64::from(u8::from(act & cut.above(val)));
            ties += usize::from(act & (val == cut.cut));
        }
        // a value equal to the cut: the rule in batch order, with the tie count
        if ties > 0 {
            for j in 0..x.len() {
                let act = (v[j] != 0) & active_sign(a[j], lr[j]);
                d[j] = f64::from(u8::from(act && cut.take(x[j], &mut self.tie)));
            }
        }
    }
}

/// M2PO Algorithm 1 on the batch's active values (`v[i] = lr²`, batch order).
pub(crate) fn select(v: &[f64], tau: f64) -> Selection {
    let n = v.len();
    let mut keys: Vec<u128> = (v.iter().zip(0u64..)).map(|(&x, i)| key(x, i)).collect();
    keys.par_sort_unstable();
    let mut suffix = vec![0.0f64; n + 1];
    let mut s = 0.0f64;
    for j in (0..n).rev() {
        s += value(keys[j]);
        suffix[j] = s;
    }
    let mean = |j: usize| suffix[j] / (n - j) as f64;
    let k = (0..n).find(|&j| mean(j) <= tau).unwrap_or(n);
    Selection {
        m2_before: if n > 0 { mean(0) } else { 0.0 },
        m2_after: if k < n { mean(k) } else { 0.0 },
        keys,
        k,
    }
}

impl M2poColumns {
    /// The columns for this shard; `ex` carries the active values between ranks (a
    /// collective: every rank calls it with the same config). `lr` is recomputed in f64 from
    /// the table's two log-probs, so that both engines select the same tokens (the GPU's own
    /// log-ratio is f32).
    pub(crate) fn new(
        ctx: &Ctx,
        batch: &Batch,
        table: &StatTable,
        tau: Option<f64>,
        ex: &mut dyn Exchange,
    ) -> Result<Self> {
        let Some(tau) = tau else {
            return Ok(M2poColumns::default());
        };
        let (t, r) = (table.get("train_log_prob")?, table.get("rollout_log_prob")?);
        let lr: Vec<f64> = t.iter().zip(r).map(|(a, b)| a - b).collect();
        let adv = batch.advantages().ok_or_else(|| {
            Error::input(
                "advantages",
                "is missing: rollout_rs 'm2po' drops tokens only where the advantage and the \
                 log-ratio have the same sign",
            )
        })?;
        let n_slots = ctx.mask.len();
        let mut value = vec![0.0f64; n_slots];
        let mut slots = Vec::new();
        for i in (0..n_slots).filter(|&i| ctx.mask[i]) {
            if let Some(v) = active(adv[i], lr[i]) {
                value[i] = v;
                slots.push(i);
            }
        }
        let local: Vec<f64> = slots.iter().map(|&i| value[i]).collect();
        let d = decide(&local, tau, ex)?;
        let mut drop = vec![0.0f64; n_slots];
        let mut tie = d.ties_before;
        for (&i, &v) in slots.iter().zip(&local) {
            if d.cut.take(v, &mut tie) {
                drop[i] = 1.0;
            }
        }
        Ok(M2poColumns {
            value,
            drop,
            summary: d.summary,
        })
    }

    /// [`Summary::metrics`] of this shard.
    pub(crate) fn metrics(&self, ctx: &Ctx, pre: &str, m: &mut Partial) {
        self.summary.metrics(ctx.n, pre, m);
    }
}

impl Summary {
    /// M2PO's own metrics under `pre` (`rollout_corr/rollout_rs_m2po`): the share of the
    /// shard's `n_valid` tokens in the active quadrants, the mean `lr²` over the active tokens
    /// before and after the drop, and the smallest dropped `lr²` (only when something was
    /// dropped).
    pub(crate) fn metrics(&self, n_valid: usize, pre: &str, m: &mut Partial) {
        m.put(
            format!("{pre}_active_fraction"),
            Acc::frac(self.local_active, n_valid, FracMode::F64, Empty::Compute),
        );
        if let Some((before, after)) = self.m2 {
            m.put(format!("{pre}_m2"), Acc::Const(before));
            m.put(format!("{pre}_m2_after"), Acc::Const(after));
        }
        if let Some(c) = self.cutoff {
            m.put(format!("{pre}_cutoff"), Acc::Const(c));
        }
    }
}

/// Every rank's `local` values concatenated in rank order, and this rank's offset in them.
fn gather<'a>(ex: &mut dyn Exchange, local: &'a [f64]) -> Result<(Cow<'a, [f64]>, usize)> {
    if ex.size() <= 1 {
        return Ok((Cow::Borrowed(local), 0));
    }
    let bytes: Vec<u8> = local.iter().flat_map(|x| x.to_le_bytes()).collect();
    let parts = ex.all_gather(&bytes)?;
    if parts.len() != ex.size() {
        return Err(Error::input(
            "partial",
            format!(
                "the exchange returned {} buffers for {} ranks",
                parts.len(),
                ex.size()
            ),
        ));
    }
    let mut all = Vec::new();
    let mut offset = 0;
    for (r, p) in parts.iter().enumerate() {
        if p.len() % 8 != 0 {
            return Err(Error::input(
                "partial",
                format!("rank {r}'s M2PO values are {} bytes, not f64s", p.len()),
            ));
        }
        if r == ex.rank() {
            offset = all.len();
            all.extend_from_slice(local);
        } else {
            all.extend(
                p.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))),
            );
        }
    }
    Ok((Cow::Owned(all), offset))
}

#[cfg(test)]
mod tests {
    use super::{decide, select};
    use crate::partial::SingleProcess;

    #[test]
    fn the_cut_drops_what_the_sorted_selection_drops() {
        // values from a few levels (many ties), every τ that cuts somewhere
        let mut x = 12345u64;
        for n in [0, 1, 2, 7, 40, 300] {
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % 6) as f64 * 0.5
                })
                .collect();
            for tau in [0.0, 0.1, 0.3, 0.6, 0.9, 1.2, 3.0] {
                let sel = select(&v, tau);
                let mut want = vec![false; n];
                sel.dropped().into_iter().for_each(|i| want[i] = true);
                let d = decide(&v, tau, &mut SingleProcess).unwrap();
                let mut tie = d.ties_before;
                let got: Vec<bool> = v.iter().map(|&x| d.cut.take(x, &mut tie)).collect();
                assert_eq!(got, want, "n {n}, tau {tau}");
            }
        }
    }

    #[test]
    fn drops_the_largest_until_the_mean_of_the_rest_is_at_most_tau() {
        // means of the suffixes: [9,4,1] 14/3, [4,1] 2.5, [1] 1
        let s = select(&[1.0, 9.0, 4.0], 2.5);
        assert_eq!((s.k, s.dropped()), (1, vec![1]));
        assert_eq!((s.m2_before, s.m2_after), (14.0 / 3.0, 2.5));
        assert_eq!(select(&[1.0, 9.0, 4.0], 2.4).k, 2);
        assert_eq!(select(&[1.0, 9.0, 4.0], 5.0).k, 0);
        // every active token above tau: all dropped (Algorithm 1's loop runs T empty)
        assert_eq!(select(&[1.0, 9.0, 4.0], 0.5).k, 3);
        assert_eq!(select(&[], 0.5).k, 0);
    }

    #[test]
    fn ties_are_dropped_in_batch_order() {
        // [4,4,4,0]: dropping one leaves 8/3 > 2, two leave 4/2 = 2
        let s = select(&[4.0, 0.0, 4.0, 4.0], 2.0);
        assert_eq!(s.k, 2);
        assert_eq!(s.dropped(), vec![0, 2]);
    }
}
