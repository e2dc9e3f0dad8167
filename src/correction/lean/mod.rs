//! The fused lean pass: verl's corrections for log-prob-only batches in one pass over each
//! sequence, reading the borrowed inputs in their own dtype and writing the weights and the
//! modified mask into caller-owned buffers (`Corrector::correct_into`; `Corrector::correct`
//! into buffers of its own), and for `trmask
//! analyze` (`analysis::analyze_fused`) also the statistics table's reductions (`stats`).
//!
//! It runs the config's one plan (`correction::plan::Plan`) where `Plan::serves_lean` says
//! so (sampled-token criteria k1 / k2 / k3 / abs / ser, token or sequence, OPSM, LN-TRM,
//! M2PO and CPPO; token or sequence IS, TIS or IcePop, batch-normalised or not; the token
//! veto); anything else (logits, top-K, kept sets, DPPO, legacy mode) takes the full path.
//! M2PO's batch-global drop is decided between a pre-pass over the active values (`m2po`) and
//! the tiles, CPPO's per-sequence drops before each sequence's tiles (`cppo`), both by the
//! full path's functions. The pass gives the full path's masks and decisions, and its weights and metrics to within rounding
//! (per-sequence sums in lanes by slot, as the CPU engine's segment sums; batch sums
//! compensated; `e^x` by `math::exp_bounded` on both paths); inputs it cannot vouch for (a
//! mask value other than 0/1, a non-finite valid log-prob, no valid token) make it step aside
//! so that the full path reports the error.

mod cppo;
mod finish;
mod inputs;
mod m2po;
mod outputs;
mod pass;
mod stats;
mod tasks;
mod tile;

pub(crate) use finish::{
    batch_norm_factor, correction_metrics, diag_partial, CritMetric, CritRec, SeqRec,
};
pub(crate) use inputs::{LeanInputs, LeanLayout};
pub(crate) use outputs::{corrections, criterion_result, seq_output_name, veto_result};
pub(crate) use pass::run;
pub(crate) use stats::sweep_columns;
