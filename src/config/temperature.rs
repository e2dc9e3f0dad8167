//! The sampling temperature's one rule: what a valid temperature is, and the error naming
//! where a bad one came from.

use crate::error::{Error, Result};

/// The smallest softmax temperature accepted (vLLM's sampling epsilon: below it sampling is
/// greedy, not a softmax). Smaller temperatures overflow `logits / T` in f32 on the GPU, so
/// both engines reject them.
pub const MIN_TEMPERATURE: f64 = 1e-5;

/// The one temperature rule: a softmax temperature is finite and at least [`MIN_TEMPERATURE`];
/// the error names `key` (`temperature`, `--temperature`) and says "out of range" with the
/// limit. The config (JSON, YAML, presets, [`CorrectionConfig::set_temperature`](super::CorrectionConfig::set_temperature),
/// [`CorrectionConfig::resolve`](super::CorrectionConfig::resolve)), the CLI, Python and every engine call check through it.
pub fn check_temperature(key: &str, t: f64) -> Result<()> {
    if t.is_finite() && t >= MIN_TEMPERATURE {
        Ok(())
    } else {
        Err(Error::config(
            key,
            format!("{t} is out of range (a finite temperature >= {MIN_TEMPERATURE})"),
        ))
    }
}
