//! The MoE routing outputs of `trmask analyze`: the per-token `route_overlap`, `route_flip`,
//! `route_first_layer` (from the statistics table, computed once in `input::routing`) and the
//! per-sequence `seq_mean_route_flip` (the fraction of a sequence's recorded tokens that
//! flipped; 0 with none), reduced by the engine's segment reduction.

use crate::engine::Engine;
use crate::error::Result;
use crate::input::batch::Batch;
use crate::io::{seq_output, token_output, Output};
use crate::stats::StatTable;

/// The per-token outputs, in the order `trmask analyze` writes them.
pub const ROUTE_OUTPUTS: [&str; 3] = ["route_overlap", "route_flip", "route_first_layer"];

/// The routing outputs of `batch` (none without routed experts); `seq_mean_route_flip` is left
/// out when `criterion_outputs` holds it (the criterion writes its own, the same numbers).
pub(crate) fn routing_outputs(
    engine: &dyn Engine,
    batch: &Batch,
    table: &StatTable,
    criterion_outputs: &[&str],
) -> Result<Vec<Output>> {
    let Some(r) = &table.routing else {
        return Ok(Vec::new());
    };
    let mut out = vec![
        token_output(batch, ROUTE_OUTPUTS[0], r.overlap.clone()),
        token_output(batch, ROUTE_OUTPUTS[1], r.flip.clone()),
        token_output(batch, ROUTE_OUTPUTS[2], r.first_layer.clone()),
    ];
    let name = "seq_mean_route_flip";
    if !criterion_outputs.contains(&name) {
        let red = engine.segment_reduce(&[&r.flip, &r.recorded], batch.segments())?;
        let frac = red[0]
            .sum
            .iter()
            .zip(&red[1].sum)
            .map(|(&f, &n)| if n > 0.0 { f / n } else { 0.0 })
            .collect();
        out.push(seq_output(name, frac));
    }
    Ok(out)
}
