//! The paper's error bounds: the closed forms, the per-batch sums they read, their inverses
//! (thresholds from a target bound), and the certificate a batch carries.

pub(crate) mod certificate;
pub mod inverse;
pub(crate) mod sums;

mod formulas;
pub use formulas::*;
