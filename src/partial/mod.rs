//! Mergeable partial statistics for data-parallel ranks (issue 12).
//!
//! Every batch-level quantity trmask reports is `finish(merge(partial(shard)…))`: each rank
//! reduces its own shard to a [`Partial`] (counts, compensated sums, Chan et al. moments,
//! maxima and minima, the few per-sequence vectors a quantile needs, GRPO group tallies, the
//! certificate's per-position maxima), the ranks exchange partials through any transport that
//! carries bytes ([`Partial::to_bytes`], [`Exchange`]), every rank merges them in rank order and
//! finishes the same metrics. A single process finishes its own partial: there is one code
//! path. Batch-normalised IS weights take two phases (the normaliser's partial is exchanged
//! first, then each rank finishes its own weights).

mod acc;
#[cfg(feature = "mpi")]
pub mod distributed;
mod exchange;
pub mod hist;
mod set;
mod wire;

pub use acc::{Acc, CertAcc, Empty, FracMode, Sum};
pub use exchange::{exchange, Exchange, SingleProcess};
pub use set::Partial;
