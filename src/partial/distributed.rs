//! Data-parallel ranks over MPI (cargo feature `mpi`: rsmpi on the system's MPI, e.g. Open MPI).
//!
//! Each rank holds a shard of the batch (whole sequences). [`analyze`] and [`correct`] run
//! [`analyze_shard`](crate::analysis::analyze_shard) / [`correct_shard`](crate::correction::correct_shard)
//! with an [`MpiExchange`] on the caller's communicator: the ranks all-gather their partials
//! (`MPI_Allgather` of the sizes, `MPI_Allgatherv` of the bytes; a few KiB each), every rank
//! merges them in rank order and finishes the same metrics; weights and masks stay on their
//! rank. Every rank must call with the same config; a rank that fails should abort the job
//! (`Communicator::abort`) rather than leave the others waiting in a collective.
//!
//! ```no_run
//! use mpi::traits::*;
//! # fn main() -> Result<(), trmask::Error> {
//! let universe = mpi::initialize().expect("MPI initialised once");
//! let world = universe.world();
//! let path = format!("shard-{}.safetensors", world.rank());
//! let input = trmask::io::read_input(path.as_ref(), &Default::default())?;
//! let engine = trmask::cpu::CpuEngine::new();
//! let cfg = trmask::CorrectionConfig::preset("decoupled_k3_rs")?;
//! let a = trmask::distributed::analyze(&engine, &input.batch, &cfg, &world)?;
//! if world.rank() == 0 {
//!     println!("{}", a.metrics["rollout_corr/rollout_rs_masked_fraction"]);
//! }
//! # Ok(()) }
//! ```

use crate::analysis::{analyze_shard, Analysis};
use crate::config::CorrectionConfig;
use crate::correction::correct_shard;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::partial::Exchange;
use crate::stats::Corrections;
use mpi::datatype::PartitionMut;
use mpi::traits::{Communicator, CommunicatorCollectives};
use mpi::Count;

/// The largest all-gathered total, in bytes (partials are KiB; this guards the receive
/// buffer against a peer that reports a nonsense size).
pub const MAX_GATHER_BYTES: usize = 1 << 30;

/// An [`Exchange`] over an MPI communicator.
pub struct MpiExchange<'a, C: Communicator> {
    comm: &'a C,
}

impl<'a, C: Communicator> MpiExchange<'a, C> {
    /// Exchanges over `comm` (every rank of it takes part).
    pub fn new(comm: &'a C) -> Self {
        MpiExchange { comm }
    }
}

impl<C: Communicator> Exchange for MpiExchange<'_, C> {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
    fn size(&self) -> usize {
        self.comm.size() as usize
    }
    fn all_gather(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        let too_big = || Error::limit("partial bytes gathered over MPI", MAX_GATHER_BYTES as u64);
        let n = self.size();
        let len = Count::try_from(local.len()).map_err(|_| too_big())?;
        let mut counts: Vec<Count> = vec![0; n];
        self.comm.all_gather_into(&len, &mut counts[..]);
        let mut displs: Vec<Count> = Vec::with_capacity(n);
        let mut total = 0usize;
        for &c in &counts {
            displs.push(Count::try_from(total).map_err(|_| too_big())?);
            total += usize::try_from(c).map_err(|_| too_big())?;
            if total > MAX_GATHER_BYTES {
                return Err(too_big());
            }
        }
        let mut buf = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            self.comm.all_gather_varcount_into(local, &mut part);
        }
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| buf[d as usize..(d + c) as usize].to_vec())
            .collect())
    }
}

/// [`crate::analysis::analyze`] for this rank's shard `batch`, collectively over `comm`: the
/// outputs are this shard's, the metrics and certificate the whole batch's (on every rank).
pub fn analyze<C: Communicator>(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
    comm: &C,
) -> Result<Analysis> {
    analyze_shard(engine, batch, config, &mut MpiExchange::new(comm))
}

/// [`crate::correction::correct`] for this rank's shard `batch`, collectively over `comm`.
pub fn correct<C: Communicator>(
    engine: &dyn Engine,
    batch: &Batch,
    config: &CorrectionConfig,
    comm: &C,
) -> Result<Corrections> {
    correct_shard(engine, batch, config, &mut MpiExchange::new(comm))
}
