//! What the CLI and the bindings compute over whole batches and runs: one batch's analysis,
//! threshold sweeps and calibration, two-batch comparison, and the trend over a run.

pub mod calibrate;
pub mod compare;
pub mod routing;
pub mod sweep;
pub mod trend;

mod analyze;
mod findings;
mod fused;
pub use analyze::*;
pub use fused::{analyze_file_fused, analyze_fused, analyze_fused_unswept};
