//! Truncated sampling: the rollout engine's kept sets (top-p / top-k / min-p) and the kept mass
//! replayed on the trainer's distribution.

pub mod kept_mass;
pub mod kept_set;
