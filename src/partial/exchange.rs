//! The transport seam: an [`Exchange`] all-gathers byte buffers across the ranks of a
//! data-parallel job (MPI, `torch.distributed`, anything else); [`exchange`] merges them.

use super::set::Partial;
use crate::error::{Error, Result};

/// Carries partials between ranks. Every rank calls [`all_gather`](Self::all_gather) the same
/// number of times, in the same order (it is a collective).
pub trait Exchange {
    /// This rank's index, 0-based.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Every rank's buffer in rank order, this rank's `local` included.
    fn all_gather(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// One process holding the whole batch: no transport, nothing to merge.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Exchange for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![local.to_vec()])
    }
}

/// The whole batch's partial: `local` merged with every other rank's, in rank order, so every
/// rank finishes identical numbers. With one rank the partial is returned as is (not even
/// serialised).
pub fn exchange(ex: &mut dyn Exchange, local: Partial) -> Result<Partial> {
    if ex.size() <= 1 {
        return Ok(local);
    }
    let all = ex.all_gather(&local.to_bytes())?;
    if all.len() != ex.size() {
        return Err(Error::input(
            "partial",
            format!(
                "the exchange returned {} buffers for {} ranks",
                all.len(),
                ex.size()
            ),
        ));
    }
    let mut merged = Partial::new();
    for (r, b) in all.iter().enumerate() {
        let p = if r == ex.rank() {
            local.clone()
        } else {
            Partial::from_bytes(b)?
        };
        merged.merge(&p)?;
    }
    Ok(merged)
}
