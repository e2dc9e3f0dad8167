//! Each step's per-sequence outputs and decisions, built the same way by both executors:
//! every criterion's statistic and decision, the token veto's, the rejection bits and the
//! `Corrections` they go into.

use super::finish::{CritRec, SeqRec};
use crate::correction::plan::Plan;
use crate::engine::plan::MaskAgg;
use crate::stats::{Corrections, CriterionResult};

/// The per-sequence decisions of the whole shard (weights and mask are in the caller's
/// buffers; metrics are finished by the caller).
pub(crate) fn details(plan: &Plan, recs: &[SeqRec]) -> Corrections {
    let mut criteria: Vec<CriterionResult> = plan
        .criteria
        .iter()
        .zip(&plan.names)
        .enumerate()
        .map(|(ci, (c, name))| {
            criterion_result(name, c.agg == MaskAgg::Token, recs.len(), |s| {
                (recs[s].n, recs[s].crit[ci])
            })
        })
        .collect();
    if let Some(tau) = plan.veto {
        let min_rho = |s: usize| (recs[s].n > 0).then_some(recs[s].rho_min);
        criteria.push(veto_result(tau, recs.len(), min_rho));
    }
    let seq_len = recs.iter().map(|r| r.n as usize).collect();
    corrections(None, Vec::new(), seq_len, criteria)
}

/// A step's corrections from its weights, final mask, sequence lengths and criteria's
/// per-sequence results, with the decisions they give (metrics left empty). Every executor
/// builds its result here.
pub(crate) fn corrections(
    weights: Option<Vec<f64>>,
    mask: Vec<f64>,
    seq_len: Vec<usize>,
    criteria: Vec<CriterionResult>,
) -> Corrections {
    let (seq_reject_bits, seq_accept) = decisions(seq_len.len(), &criteria);
    Corrections {
        weights,
        mask,
        seq_accept,
        seq_len,
        seq_reject_bits,
        criteria,
        metrics: Default::default(),
        histograms: Default::default(),
    }
}

/// A criterion's per-sequence output from sequence `s`'s valid tokens and record `rec(s)`,
/// for `b` sequences: the sequence's statistic, or a token criterion's fraction of the
/// sequence's valid tokens it rejects; a sequence is rejected where any of its tokens is.
/// Both executors build their criteria's outputs here.
pub(crate) fn criterion_result(
    name: &str,
    token: bool,
    b: usize,
    rec: impl Fn(usize) -> (u64, CritRec),
) -> CriterionResult {
    let (seq_stat, seq_reject) = (0..b)
        .map(|s| {
            let (n, r) = rec(s);
            let stat = match (token, n) {
                (true, 0) => 0.0,
                (true, n) => r.rej as f64 / n as f64,
                (false, _) => r.value,
            };
            (stat, r.rej > 0)
        })
        .unzip();
    CriterionResult {
        name: name.into(),
        output_name: seq_output_name(name),
        seq_stat,
        seq_reject,
    }
}

/// Whether the token veto with threshold `tau` rejects a sequence whose valid tokens' smallest
/// ρ_t is `min_rho` (`None`: no valid token).
pub(crate) fn vetoes(tau: f64, min_rho: Option<f64>) -> bool {
    min_rho.is_some_and(|m| m < tau)
}

/// The token veto's per-sequence output (legacy verl semantics: any ρ_t < τ rejects the
/// sequence) from each of the `b` sequences' smallest valid ρ_t: that ρ_t (1 for a sequence
/// without a valid token) and the decision.
pub(crate) fn veto_result(
    tau: f64,
    b: usize,
    min_rho: impl Fn(usize) -> Option<f64>,
) -> CriterionResult {
    CriterionResult {
        name: "token_veto".into(),
        output_name: seq_output_name("token_veto"),
        seq_stat: (0..b).map(|s| min_rho(s).unwrap_or(1.0)).collect(),
        seq_reject: (0..b).map(|s| vetoes(tau, min_rho(s))).collect(),
    }
}

/// The name of a criterion's per-sequence output column: `seq_<name>`, or the name itself
/// when it already starts with `seq_`.
pub(crate) fn seq_output_name(name: &str) -> String {
    match name.starts_with("seq_") {
        true => name.into(),
        false => format!("seq_{name}"),
    }
}

/// Each of the `b` sequences' rejection bits (bit `i`: criterion `i` rejects it, for the
/// first 64) and whether every criterion accepts it.
fn decisions(b: usize, criteria: &[CriterionResult]) -> (Vec<u64>, Vec<bool>) {
    let mut bits = vec![0u64; b];
    let mut accept = vec![true; b];
    for (ci, c) in criteria.iter().enumerate() {
        for ((bb, a), &r) in bits.iter_mut().zip(&mut accept).zip(&c.seq_reject) {
            if r && ci < 64 {
                *bb |= 1 << ci;
            }
            *a &= !r;
        }
    }
    (bits, accept)
}
