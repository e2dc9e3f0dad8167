//! Writing per-token / per-sequence outputs and metrics (JSON or safetensors).

use super::files::Commit;
use crate::error::{Error, Result};
use crate::input::batch::Batch;
use std::collections::BTreeMap;
use std::path::Path;

/// A named output tensor: per-token (in the batch's layout) or per-sequence.
#[derive(Clone, Debug)]
pub struct Output {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

fn json_value(x: f64) -> serde_json::Value {
    if x.is_nan() {
        "NaN".into()
    } else if x == f64::INFINITY {
        "Infinity".into()
    } else if x == f64::NEG_INFINITY {
        "-Infinity".into()
    } else {
        serde_json::Number::from_f64(x)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null)
    }
}

fn nest(shape: &[usize], data: &[f64]) -> serde_json::Value {
    match shape {
        [] => json_value(data[0]),
        [_] => serde_json::Value::Array(data.iter().map(|&x| json_value(x)).collect()),
        [n, rest @ ..] => {
            let w: usize = rest.iter().product();
            serde_json::Value::Array(
                (0..*n)
                    .map(|i| nest(rest, &data[i * w..(i + 1) * w]))
                    .collect(),
            )
        }
    }
}

/// Writes outputs as JSON (`.json`) or safetensors (F64 tensors, anything else), through a
/// temporary file renamed into place ([`Commit`]).
pub fn write_outputs(path: &Path, outputs: &[Output]) -> Result<()> {
    let mut c = Commit::new();
    c.stage(path, outputs_bytes(path, outputs)?)?;
    c.finish()
}

/// The bytes [`write_outputs`] writes to `path` (JSON for `.json`, else safetensors).
pub fn outputs_bytes(path: &Path, outputs: &[Output]) -> Result<Vec<u8>> {
    let p = path.display().to_string();
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let bytes = if is_json {
        let mut obj = serde_json::Map::new();
        for o in outputs {
            obj.insert(o.name.clone(), nest(&o.shape, &o.data));
        }
        serde_json::to_vec(&serde_json::Value::Object(obj))
            .map_err(|e| Error::file(&p, e.to_string()))?
    } else {
        let raw: Vec<(String, Vec<u8>, Vec<usize>)> = outputs
            .iter()
            .map(|o| {
                (
                    o.name.clone(),
                    o.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    o.shape.clone(),
                )
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = raw
            .iter()
            .map(|(n, b, s)| {
                Ok((
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F64, s.clone(), b)
                        .map_err(|e| Error::file(&p, e.to_string()))?,
                ))
            })
            .collect::<Result<_>>()?;
        safetensors::serialize(views, None).map_err(|e| Error::file(&p, e.to_string()))?
    };
    Ok(bytes)
}

/// Writes a flat metrics object as JSON (non-finite values as strings); `-` is stdout.
pub fn write_metrics(path: &Path, metrics: &BTreeMap<String, f64>) -> Result<()> {
    let mut c = Commit::new();
    c.stage(path, metrics_bytes(metrics)?)?;
    c.finish()
}

/// The bytes [`write_metrics`] writes: pretty JSON and a newline.
pub fn metrics_bytes(metrics: &BTreeMap<String, f64>) -> Result<Vec<u8>> {
    let mut text = serde_json::to_string_pretty(&serde_json::Value::Object(metrics_json(metrics)))
        .map_err(|e| Error::file("<metrics>", e.to_string()))?;
    text.push('\n');
    Ok(text.into_bytes())
}

/// The per-token shape of outputs for a batch's layout.
pub fn token_output(batch: &Batch, name: &str, data: Vec<f64>) -> Output {
    Output {
        name: name.to_string(),
        shape: batch.token_shape(),
        data,
    }
}

/// A per-sequence output.
pub fn seq_output(name: &str, data: Vec<f64>) -> Output {
    Output {
        name: name.to_string(),
        shape: vec![data.len()],
        data,
    }
}

impl crate::input::batch::Layout {
    /// Number of sequences of this layout (`B` or `S`).
    pub fn num_seqs(&self) -> usize {
        match self {
            crate::input::batch::Layout::Padded { batch, .. } => *batch,
            crate::input::batch::Layout::Packed { cu_seqlens } => cu_seqlens.len() - 1,
        }
    }
}

/// A flat metrics object as JSON (non-finite values as the strings `"NaN"`, `"Infinity"`, …).
pub fn metrics_json(metrics: &BTreeMap<String, f64>) -> serde_json::Map<String, serde_json::Value> {
    metrics
        .iter()
        .map(|(k, &v)| (k.clone(), json_value(v)))
        .collect()
}

/// Appends one line `{"input": …, "step": …, <every metric>}` to a JSON-lines file.
pub fn append_metrics_line(
    path: &Path,
    input: &str,
    step: f64,
    metrics: &BTreeMap<String, f64>,
) -> Result<()> {
    let mut c = Commit::new();
    c.append(path, metrics_line(input, step, metrics)?);
    c.finish()
}

/// One JSON line `{"input": …, "step": …, <every metric>}` and its newline.
pub fn metrics_line(input: &str, step: f64, metrics: &BTreeMap<String, f64>) -> Result<Vec<u8>> {
    let mut obj = serde_json::Map::new();
    obj.insert("input".into(), input.into());
    // an integral step is written as an integer (W&B / TensorBoard steps are integers)
    let step_value = if step.fract() == 0.0 && step.abs() <= 9_007_199_254_740_992.0 {
        serde_json::Value::from(step as i64)
    } else {
        json_value(step)
    };
    obj.insert("step".into(), step_value);
    obj.extend(metrics_json(metrics));
    let mut line = serde_json::to_string(&serde_json::Value::Object(obj))
        .map_err(|e| Error::file("<metrics-jsonl>", e.to_string()))?;
    line.push('\n');
    Ok(line.into_bytes())
}
