//! Metric families, finished on the host in f64 from exact sums and counts: verl's
//! `rollout_corr/*` (with verl's quirks, only for the quantities verl names) and trmask's own
//! `trmask/*`.

pub(crate) mod breakdown;
pub(crate) mod ctx;
pub(crate) mod diag;
pub(crate) mod diagnostics;
pub mod routing;
pub(crate) mod trmask;
pub(crate) mod verl;

pub use trmask::{divergence_metrics, DIVERGENCES};
