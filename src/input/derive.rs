//! Inputs derived from other inputs: the sampled tokens' log-probs from full logits.

use crate::error::{Error, Result};
use crate::input::batch::Batch;
use crate::input::logits::Logits;
use crate::math::neumaier_sum;
use rayon::prelude::*;

/// `log softmax(logits / temperature)[y_t]` per valid slot (0 elsewhere), f64 on the host:
/// the max factored out and a compensated sum, so log-probs near 0 keep full precision.
pub(crate) fn sampled_log_probs(
    batch: &Batch,
    (name, logits): (&'static str, &Logits),
    responses: &[i64],
    temperature: f64,
) -> Result<Vec<f64>> {
    crate::config::check_temperature("temperature", temperature)?;
    // the batch was validated when built: rows and ids match it, ids are in the vocabulary
    let mask = batch.mask();
    let v = logits.vocab();
    let inv_t = 1.0 / temperature;
    (0..mask.len())
        .into_par_iter()
        .map_init(
            || vec![0f64; v],
            |buf, r| {
                if !mask[r] {
                    return Ok(0.0);
                }
                let y = responses[r];
                logits.row_f64(r, buf);
                let (mut m, mut arg) = (f64::NEG_INFINITY, usize::MAX);
                for (i, x) in buf.iter_mut().enumerate() {
                    if x.is_nan() || *x == f64::INFINITY {
                        return Err(Error::input(
                            name,
                            format!("value {x} at row {}, column {i}", batch.position(r)),
                        ));
                    }
                    *x *= inv_t;
                    if *x > m {
                        m = *x;
                        arg = i;
                    }
                }
                if arg == usize::MAX {
                    return Err(Error::input(
                        name,
                        format!("row {}: every entry is -inf", batch.position(r)),
                    ));
                }
                let rest = neumaier_sum(
                    buf.iter()
                        .enumerate()
                        .filter(|&(i, _)| i != arg)
                        .map(|(_, &x)| (x - m).exp()),
                );
                Ok((buf[y as usize] - m) - rest.ln_1p())
            },
        )
        .collect()
}
