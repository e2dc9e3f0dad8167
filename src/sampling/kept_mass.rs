//! The kept mass of a truncated sampler (top-p / top-k / min-p): `log S_t`, the log of the raw
//! probability mass of the ids the engine kept at step t. An engine that samples from the
//! truncated, renormalised distribution reports `log π_roll(y) = log p_raw(y) − log S_t`, so
//! every log-ratio against an untruncated trainer is shifted by `log S_t`;
//! `old_log_prob − log S_t` (the trainer renormalised over the kept set) removes the shift.
//!
//! Four sources, most exact first:
//! * the kept ids and the logits ([`log_kept_mass_of_ids`]): exact;
//! * the kept ids and the rollout's raw top-K ([`kept_mass_of_ids_topk`]): exact where the
//!   top-K covers the kept set, else flagged with a bound;
//! * a full row of raw log-probs and the sampler's settings ([`kept_mass_of_row`]): exact;
//! * the rollout's raw top-K log-probs and the settings ([`kept_mass_from_topk`]): exact where
//!   the kept set fits inside the top-K (and is not decided within float32 rounding of the
//!   threshold), else flagged: for top-p the kept mass then lies in `[top_p, top_p + p_K)`
//!   (the id that crosses the threshold is at most as probable as the K-th), so
//!   `log top_p` is returned with that bound as its error.
//!
//! The truncation follows vLLM V1's sampler: min-p on the raw probabilities (`p < min_p ·
//! p_max` dropped), then top-k, then top-p on the top-k-renormalised distribution (an id is kept
//! iff the mass of the more probable ids before it is `< top_p`; the most probable id always).
//! A batch's kept sets ([`crate::sampling::kept_set`], `rollout_sampling_mask_*`) take precedence over the
//! configured truncation: they say what was kept instead of re-deriving it.

use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::derive::sampled_log_probs;
use crate::math::{k3_from_log_ratio, log_sum_exp};
use crate::partial::{Acc, Empty, FracMode, Partial};
use crate::stats::SAFETY_BOUND;

/// A sampler's truncation settings (vLLM / SGLang names); the defaults switch each one off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Truncation {
    /// Keep the smallest prefix of most probable ids whose mass reaches `top_p` (1 = off).
    pub top_p: f64,
    /// Keep the `top_k` most probable ids (0 = off).
    pub top_k: usize,
    /// Drop ids with `p < min_p · p_max` (0 = off).
    pub min_p: f64,
}

impl Default for Truncation {
    fn default() -> Self {
        Truncation {
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
        }
    }
}

impl Truncation {
    /// Checks the ranges: `0 < top_p ≤ 1`, `0 ≤ min_p ≤ 1`; errors name the key.
    pub fn validate(&self) -> Result<()> {
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::config(
                "top_p",
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::config(
                "min_p",
                format!("must be in [0, 1], got {}", self.min_p),
            ));
        }
        Ok(())
    }

    /// True when nothing is truncated.
    pub fn is_off(&self) -> bool {
        self.top_p >= 1.0 && self.top_k == 0 && self.min_p <= 0.0
    }
}

/// The kept mass at one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeptMass {
    /// `log S_t` (≤ 0), or its estimate when `exact` is false.
    pub log_kept_mass: f64,
    /// True when the kept set was known (fits in the top-K, or a full row / the ids were given).
    pub exact: bool,
    /// The number of kept ids, when known.
    pub kept: Option<usize>,
    /// A bound on `|estimate − log S_t|` (0 when exact; `+∞` when nothing bounds it).
    pub max_error: f64,
}

/// Margin under which a top-p decision could have gone either way in the engine's float32
/// cumulative sum (`2e-6`, about 16 float32 ulps of 1): such steps are flagged, not guessed.
pub const TOP_P_MARGIN: f64 = 2e-6;

/// The kept set's size among descending raw log-probs `lp` (a prefix of the row, or the whole
/// row when `whole`): `Ok(Some(k))`, `Ok(None)` when it does not fit in `lp`, `Err(())` when a
/// top-p decision falls within [`TOP_P_MARGIN`] of the threshold.
fn kept_prefix(lp: &[f64], t: &Truncation, whole: bool) -> std::result::Result<Option<usize>, ()> {
    if lp.is_empty() {
        return Ok(None);
    }
    let p: Vec<f64> = lp.iter().map(|&x| x.exp()).collect();
    // min-p on the raw probabilities
    let mut n = p.len();
    let mut fits = whole;
    if t.min_p > 0.0 {
        let cut = t.min_p * p[0];
        if let Some(j) = p.iter().position(|&x| x < cut) {
            n = j;
            fits = true;
        }
    }
    // top-k
    if t.top_k > 0 {
        if t.top_k <= n {
            n = t.top_k;
            fits = true;
        } else if !fits {
            return Ok(None);
        }
    }
    if t.top_p >= 1.0 {
        return Ok(fits.then_some(n));
    }
    // top-p on the distribution renormalised over the ids kept so far: needs their mass
    let z = if t.top_k > 0 || t.min_p > 0.0 {
        if !fits {
            return Ok(None);
        }
        p[..n].iter().sum::<f64>()
    } else {
        1.0
    };
    let mut before = 0.0f64;
    for (j, &x) in p[..n].iter().enumerate() {
        if j > 0 {
            let m = before / z;
            if (m - t.top_p).abs() <= TOP_P_MARGIN {
                return Err(());
            }
            if m >= t.top_p {
                return Ok(Some(j));
            }
        }
        before += x;
    }
    // every id of the prefix is kept: the set fits only if the prefix ended the candidates
    if n < p.len() || whole {
        return Ok(Some(n));
    }
    let m = before / z;
    if (m - t.top_p).abs() <= TOP_P_MARGIN {
        return Err(());
    }
    Ok((m >= t.top_p).then_some(n))
}

/// `log S_t` from the rollout's raw top-K log-probs of one step (any order; non-finite
/// entries are an error naming `rollout_topk_log_prob`).
///
/// ```
/// use trmask::kept_mass::{kept_mass_from_topk, Truncation};
/// // p = 0.6, 0.3, 0.05, …: top-p 0.8 keeps the first two, S = 0.9
/// let lp = [0.6f64.ln(), 0.3f64.ln(), 0.05f64.ln()];
/// let t = Truncation { top_p: 0.8, ..Default::default() };
/// let k = kept_mass_from_topk(&lp, &t)?;
/// assert!(k.exact && k.kept == Some(2));
/// assert!((k.log_kept_mass - 0.9f64.ln()).abs() < 1e-15);
/// // top-p 0.99 needs ids beyond the top-3: flagged, log 0.99 with the bound log(1 + p_3/0.99)
/// let k = kept_mass_from_topk(&lp, &Truncation { top_p: 0.99, ..t })?;
/// assert!(!k.exact && (k.log_kept_mass - 0.99f64.ln()).abs() < 1e-15);
/// assert!((k.max_error - (0.05f64 / 0.99).ln_1p()).abs() < 1e-15);
/// # Ok::<(), trmask::Error>(())
/// ```
pub fn kept_mass_from_topk(topk_log_prob: &[f64], t: &Truncation) -> Result<KeptMass> {
    t.validate()?;
    if let Some(x) = topk_log_prob
        .iter()
        .find(|x| !x.is_finite() && **x != f64::NEG_INFINITY)
    {
        return Err(Error::input(
            "rollout_topk_log_prob",
            format!("holds {x} at a valid token"),
        ));
    }
    let mut lp = topk_log_prob.to_vec();
    lp.sort_by(|a, b| b.total_cmp(a));
    if t.is_off() {
        return Ok(KeptMass {
            log_kept_mass: 0.0,
            exact: true,
            kept: None,
            max_error: 0.0,
        });
    }
    match kept_prefix(&lp, t, false) {
        Ok(Some(k)) => Ok(KeptMass {
            log_kept_mass: log_sum_exp(&lp[..k]).min(0.0),
            exact: true,
            kept: Some(k),
            max_error: 0.0,
        }),
        _ => {
            // top-p alone: S ∈ [top_p, top_p + p_K); otherwise nothing bounds it from the top-K
            let only_top_p = t.top_k == 0 && t.min_p <= 0.0;
            let p_last = lp.last().map_or(1.0, |x| x.exp());
            let (est, err) = if only_top_p {
                (t.top_p.ln(), (p_last / t.top_p).ln_1p())
            } else {
                (t.top_p.ln(), f64::INFINITY)
            };
            Ok(KeptMass {
                log_kept_mass: est,
                exact: false,
                kept: None,
                max_error: err,
            })
        }
    }
}

/// `log S_t` from one full row of raw log-probs (any order, `−∞` allowed): always exact
/// except when a top-p decision falls within [`TOP_P_MARGIN`] of the threshold (flagged, with
/// the mass of the undecided id as the error bound).
pub fn kept_mass_of_row(log_probs: &[f64], t: &Truncation) -> Result<KeptMass> {
    t.validate()?;
    let mut lp: Vec<f64> = log_probs
        .iter()
        .copied()
        .filter(|x| *x > f64::NEG_INFINITY)
        .collect();
    if lp.iter().any(|x| !x.is_finite()) || lp.is_empty() {
        return Err(Error::input(
            "rollout_logits",
            "a row must hold finite values (−inf allowed) and at least one finite one",
        ));
    }
    lp.sort_by(|a, b| b.total_cmp(a));
    match kept_prefix(&lp, t, true) {
        Ok(Some(k)) => Ok(KeptMass {
            log_kept_mass: log_sum_exp(&lp[..k]).min(0.0),
            exact: true,
            kept: Some(k),
            max_error: 0.0,
        }),
        _ => Ok(KeptMass {
            log_kept_mass: t.top_p.ln(),
            exact: false,
            kept: None,
            max_error: f64::INFINITY,
        }),
    }
}

/// `log S_t = logsumexp(logits[ids]) − logsumexp(logits)` from the kept ids of one step
/// (vLLM's `SamplingMask` row) and that step's logits (already divided by the temperature).
/// Ids out of range or repeated are an error naming `rollout_sampling_mask_ids`.
///
/// ```
/// use trmask::kept_mass::log_kept_mass_of_ids;
/// let logits = [2.0f64, 1.0, 0.0, -1.0];
/// let s = log_kept_mass_of_ids(&logits, &[0, 1])?;
/// let z: f64 = logits.iter().map(|x| x.exp()).sum();
/// assert!((s - ((2.0f64.exp() + 1.0f64.exp()) / z).ln()).abs() < 1e-15);
/// # Ok::<(), trmask::Error>(())
/// ```
pub fn log_kept_mass_of_ids(logits: &[f64], ids: &[i64]) -> Result<f64> {
    crate::sampling::kept_set::check_row(ids, Some(logits.len()), &mut Vec::new())
        .map_err(|p| Error::input(crate::sampling::kept_set::IDS, p))?;
    let kept: Vec<f64> = ids.iter().map(|&id| logits[id as usize]).collect();
    Ok((log_sum_exp(&kept) - log_sum_exp(logits)).min(0.0))
}

/// A batch's kept mass (per slot, 0 at invalid slots) and, with `sampling_replay`, the batch
/// whose trainer log-prob is renormalised over the kept set.
pub(crate) struct BatchKeptMass {
    pub log_kept_mass: Vec<f64>,
    pub known: Vec<bool>,
    /// The trainer tensor replayed (`old_log_prob`, or `log_prob` in bypass mode) and the
    /// batch holding `trainer − log S_t` there.
    pub replayed: Option<(&'static str, Batch)>,
    /// k3 of the log-ratio of every valid token before and after removing `log S_t`.
    pub k3_before: Vec<f64>,
    pub k3_after: Vec<f64>,
}

/// `log S_t` from one step's kept ids and the rollout's raw top-K (`topk_ids`,
/// `topk_log_prob`): exact when every kept id is among the top-K; else flagged, with the
/// estimate halfway (in log space) between the mass of the covered ids and that plus `p_K`
/// for each uncovered one (an id outside the top-K is at most as probable as the K-th), and
/// half that width as the error bound.
///
/// ```
/// use trmask::kept_mass::kept_mass_of_ids_topk;
/// let (ids, lp) = ([7i64, 3, 5], [0.5f64.ln(), 0.3f64.ln(), 0.1f64.ln()]);
/// let k = kept_mass_of_ids_topk(&ids, &lp, &[3, 7])?;
/// assert!(k.exact && (k.log_kept_mass - 0.8f64.ln()).abs() < 1e-15);
/// let k = kept_mass_of_ids_topk(&ids, &lp, &[3, 7, 11])?; // 11 is outside the top-3
/// assert!(!k.exact && (k.log_kept_mass - 0.8f64.ln()).abs() <= k.max_error);
/// assert!((k.log_kept_mass - 0.9f64.ln()).abs() <= k.max_error + 1e-15);
/// # Ok::<(), trmask::Error>(())
/// ```
pub fn kept_mass_of_ids_topk(
    topk_ids: &[i64],
    topk_log_prob: &[f64],
    kept: &[i64],
) -> Result<KeptMass> {
    if let Some(x) = topk_log_prob
        .iter()
        .find(|x| !x.is_finite() && **x != f64::NEG_INFINITY)
    {
        return Err(Error::input(
            "rollout_topk_log_prob",
            format!("holds {x} at a valid token"),
        ));
    }
    let mut covered = Vec::with_capacity(kept.len().min(topk_ids.len()));
    let mut missing = 0usize;
    for id in kept {
        match topk_ids.iter().position(|t| t == id) {
            Some(j) => covered.push(topk_log_prob[j]),
            None => missing += 1,
        }
    }
    let low = if covered.is_empty() {
        f64::NEG_INFINITY
    } else {
        log_sum_exp(&covered).min(0.0)
    };
    if missing == 0 {
        return Ok(KeptMass {
            log_kept_mass: low,
            exact: true,
            kept: Some(kept.len()),
            max_error: 0.0,
        });
    }
    let p_k = topk_log_prob
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .exp();
    let high = (low.exp() + missing as f64 * p_k).min(1.0).ln();
    let (est, err) = if low.is_finite() {
        (0.5 * (low + high), 0.5 * (high - low))
    } else {
        (high, f64::INFINITY)
    };
    Ok(KeptMass {
        log_kept_mass: est,
        exact: false,
        kept: Some(kept.len()),
        max_error: err,
    })
}

/// The per-slot kept mass from the batch's kept sets (`rollout_sampling_mask_*`): exact from
/// the rollout logits (divided by `temperature`, read on the host in f64), else from the raw
/// top-K where it covers the set (flagged elsewhere); `None` without either.
fn kept_mass_of_sets(batch: &Batch, temperature: f64) -> Result<Option<(Vec<f64>, Vec<bool>)>> {
    let Some(sets) = batch.kept_sets() else {
        return Ok(None);
    };
    let mask = batch.mask();
    let mut lkm = vec![0.0; mask.len()];
    let mut known = vec![false; mask.len()];
    if let Some(l) = batch.rollout_logits() {
        l.host_bytes("rollout_logits")?;
        let mut row = vec![0.0; l.vocab()];
        for i in (0..mask.len()).filter(|&i| mask[i]) {
            l.row_f64(i, &mut row);
            row.iter_mut().for_each(|x| *x /= temperature);
            if row.iter().any(|x| x.is_nan() || *x == f64::INFINITY) {
                let msg = format!("row {} holds NaN or +inf", batch.position(i));
                return Err(Error::input("rollout_logits", msg));
            }
            lkm[i] = log_kept_mass_of_ids(&row, sets.row(i))?;
            known[i] = true;
        }
    } else if let (Some(ids), Some(lp)) = (batch.rollout_topk_ids(), batch.rollout_topk_log_prob())
    {
        let k = batch.topk();
        for i in (0..mask.len()).filter(|&i| mask[i]) {
            let r = i * k..(i + 1) * k;
            let m = kept_mass_of_ids_topk(&ids[r.clone()], &lp[r], sets.row(i))?;
            lkm[i] = m.log_kept_mass;
            known[i] = m.exact;
        }
    } else {
        return Ok(None);
    }
    Ok(Some((lkm, known)))
}

/// The kept mass of every valid token of `batch`: from its kept sets
/// (`rollout_sampling_mask_*`) when given, else from its raw rollout top-K and `t`; `None`
/// when neither applies and `replay` is off. With `replay` and no source: an error naming
/// what is missing.
pub(crate) fn batch_kept_mass(
    batch: &Batch,
    t: &Truncation,
    replay: bool,
    bypass: bool,
    temperature: f64,
) -> Result<Option<BatchKeptMass>> {
    t.validate()?;
    let (log_kept_mass, known) = if let Some(x) = kept_mass_of_sets(batch, temperature)? {
        x
    } else if batch.kept_sets().is_some() {
        if replay {
            return Err(Error::input(
                "rollout_logits",
                "is missing: sampling_replay with kept sets (rollout_sampling_mask_ids) needs the rollout's logits or its raw top-K log-probs (rollout_topk_log_prob)",
            ));
        }
        return Ok(None);
    } else {
        if t.is_off() {
            if replay {
                return Err(Error::config(
                    "sampling_replay",
                    "needs the engine's truncation: top_p, top_k or min_p, or its kept sets \
                     (rollout_sampling_mask_ids / rollout_sampling_mask_offsets)",
                ));
            }
            return Ok(None);
        }
        let Some(topk) = batch.rollout_topk_log_prob() else {
            if replay {
                return Err(Error::input(
                    "rollout_topk_log_prob",
                    "is missing: sampling_replay needs the rollout's raw top-K log-probs",
                ));
            }
            return Ok(None);
        };
        let k = batch.topk();
        let mask = batch.mask();
        let mut log_kept_mass = vec![0.0; mask.len()];
        let mut known = vec![false; mask.len()];
        for i in 0..mask.len() {
            if mask[i] {
                let m = kept_mass_from_topk(&topk[i * k..(i + 1) * k], t)?;
                log_kept_mass[i] = m.log_kept_mass;
                known[i] = m.exact;
            }
        }
        (log_kept_mass, known)
    };
    let mask = batch.mask();
    // without log-probs, the sampled tokens' log-probs come from the logits and `responses`,
    // as everywhere else (docs/FORMAT.md, Input tensors)
    let from_logits =
        |name: &'static str, logits: Option<&crate::Logits>| match (logits, batch.responses()) {
            (Some(l), Some(y)) => sampled_log_probs(batch, (name, l), y, temperature).map(Some),
            _ => Ok(None),
        };
    let derived_train;
    let (name, train) = match (batch.old_log_prob(), batch.log_prob()) {
        (Some(o), _) if !bypass => ("old_log_prob", o),
        (_, Some(l)) => ("log_prob", l),
        (Some(o), None) => ("old_log_prob", o),
        (None, None) => {
            derived_train = from_logits("old_logits", batch.old_logits())?.ok_or_else(|| {
                Error::input(
                    "old_log_prob",
                    "is missing: the kept mass is compared with the trainer's log-prob (give \
                     it, or old_logits with responses)",
                )
            })?;
            ("old_log_prob", derived_train.as_slice())
        }
    };
    let derived_roll;
    let roll = match batch.rollout_log_prob() {
        Some(r) => r,
        None => {
            derived_roll =
                from_logits("rollout_logits", batch.rollout_logits())?.ok_or_else(|| {
                    Error::input(
                        "rollout_log_prob",
                        "is missing: the kept mass needs it (or rollout_logits with responses)",
                    )
                })?;
            &derived_roll
        }
    };
    let kept_train: Vec<f64> = (0..mask.len())
        .map(|i| {
            if mask[i] {
                train[i] - log_kept_mass[i]
            } else {
                train[i]
            }
        })
        .collect();
    let k3s = |tr: &[f64]| -> Vec<f64> {
        (0..mask.len())
            .filter(|&i| mask[i])
            .map(|i| k3_from_log_ratio((tr[i] - roll[i]).clamp(-SAFETY_BOUND, SAFETY_BOUND)))
            .collect()
    };
    let (k3_before, k3_after) = (k3s(train), k3s(&kept_train));
    let replayed = if replay {
        Some((name, batch.with_derived(name, kept_train)?))
    } else {
        None
    };
    Ok(Some(BatchKeptMass {
        log_kept_mass,
        known,
        replayed,
        k3_before,
        k3_after,
    }))
}

impl BatchKeptMass {
    /// `trmask/log_kept_mass_{mean,min}`, `trmask/kept_set_known_fraction` and the mean k3
    /// before / after removing the kept mass (`trmask/k3_mean_{raw_trainer,kept_trainer}`),
    /// mergeable over ranks.
    pub(crate) fn metrics(&self, batch: &Batch) -> Partial {
        let mask = batch.mask();
        let vals: Vec<f64> = (0..mask.len())
            .filter(|&i| mask[i])
            .map(|i| self.log_kept_mass[i])
            .collect();
        let n = vals.len();
        let known = (0..mask.len())
            .filter(|&i| mask[i] && self.known[i])
            .count();
        let mut p = Partial::new();
        p.put("trmask/log_kept_mass_mean", Acc::mean(&vals, Empty::Absent));
        p.put(
            "trmask/log_kept_mass_min",
            Acc::min(vals.iter().copied(), Empty::Absent),
        );
        p.put(
            "trmask/kept_set_known_fraction",
            Acc::frac(known, n, FracMode::F64, Empty::Absent),
        );
        p.put(
            "trmask/k3_mean_raw_trainer",
            Acc::mean(&self.k3_before, Empty::Absent),
        );
        p.put(
            "trmask/k3_mean_kept_trainer",
            Acc::mean(&self.k3_after, Empty::Absent),
        );
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lps(p: &[f64]) -> Vec<f64> {
        p.iter().map(|x| x.ln()).collect()
    }

    #[test]
    fn top_p_matches_the_full_row() {
        let p = [0.5, 0.2, 0.15, 0.1, 0.05];
        for top_p in [0.3, 0.55, 0.69, 0.71, 0.86, 0.9, 0.99] {
            let t = Truncation {
                top_p,
                ..Default::default()
            };
            let full = kept_mass_of_row(&lps(&p), &t).unwrap();
            assert!(full.exact);
            // the brute force: id j kept iff the mass before it is < top_p
            let mut before = 0.0;
            let mut s = 0.0;
            for (j, &x) in p.iter().enumerate() {
                if j == 0 || before < top_p {
                    s += x;
                }
                before += x;
            }
            assert!((full.log_kept_mass - f64::ln(s)).abs() < 1e-14, "{top_p}");
            for k in 1..=p.len() {
                let tk = kept_mass_from_topk(&lps(&p[..k]), &t).unwrap();
                if tk.exact {
                    assert_eq!(tk.kept, full.kept, "{top_p} {k}");
                    assert!((tk.log_kept_mass - full.log_kept_mass).abs() < 1e-14);
                } else {
                    assert!(k < full.kept.unwrap(), "{top_p} {k}: fits but flagged");
                    assert!((tk.log_kept_mass - full.log_kept_mass).abs() <= tk.max_error);
                }
            }
        }
    }

    #[test]
    fn top_k_min_p_and_margins() {
        let p = lps(&[0.4, 0.3, 0.2, 0.1]);
        let t = Truncation {
            top_k: 2,
            ..Default::default()
        };
        let k = kept_mass_from_topk(&p[..3], &t).unwrap();
        assert!(k.exact && (k.log_kept_mass - 0.7f64.ln()).abs() < 1e-15);
        // top-k larger than the top-K: unknown
        let t3 = Truncation {
            top_k: 5,
            ..Default::default()
        };
        assert!(!kept_mass_from_topk(&p[..3], &t3).unwrap().exact);
        // min-p 0.6: 0.2 < 0.24 dropped
        let m = Truncation {
            min_p: 0.6,
            ..Default::default()
        };
        let k = kept_mass_from_topk(&p[..3], &m).unwrap();
        assert!(k.exact && (k.log_kept_mass - 0.7f64.ln()).abs() < 1e-15);
        // top-k then top-p renormalised: top-2 (0.4, 0.3) → (4/7, 3/7); top-p 0.5 keeps 1
        let both = Truncation {
            top_k: 2,
            top_p: 0.5,
            min_p: 0.0,
        };
        let k = kept_mass_from_topk(&p, &both).unwrap();
        assert!(k.exact && k.kept == Some(1));
        // a decision within the margin is flagged
        let edge = Truncation {
            top_p: 0.7 + 1e-7,
            ..Default::default()
        };
        assert!(!kept_mass_from_topk(&p, &edge).unwrap().exact);
        assert!(kept_mass_from_topk(&p, &Truncation { top_p: 0.0, ..edge }).is_err());
        assert!(kept_mass_from_topk(&[f64::NAN], &edge).is_err());
    }

    #[test]
    fn ids_errors() {
        let l = [0.0, 1.0];
        assert!(log_kept_mass_of_ids(&l, &[2]).is_err());
        assert!(log_kept_mass_of_ids(&l, &[1, 1]).is_err());
        assert!(log_kept_mass_of_ids(&l, &[]).is_err());
        assert_eq!(log_kept_mass_of_ids(&l, &[0, 1]).unwrap(), 0.0);
    }
}
