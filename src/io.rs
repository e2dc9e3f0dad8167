//! Reading batches from safetensors (memory-mapped) or JSON files by SPEC §3 names, and
//! writing per-token / per-sequence outputs and metrics.
//!
//! Layout rules: with `cu_seqlens` the batch is packed (`[N]` tensors, `[N, V]` logits);
//! otherwise token tensors are `[B, T]` with `response_mask` (all ones when absent) or `[N]`
//! holding a single sequence. Tensors with other names are ignored.

use crate::batch::{Batch, Layout};
use crate::error::{Error, Result};
use crate::logits::{DType, Logits};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A tensor read from a file: shape plus values widened to f64 (ids are exact up to 2^53).
#[derive(Clone, Debug)]
struct Dense {
    shape: Vec<usize>,
    data: Vec<f64>,
}

/// What a file gave: dense tensors and logits.
#[derive(Default)]
struct Raw {
    dense: BTreeMap<String, Dense>,
    logits: BTreeMap<String, (Vec<usize>, LogitsSource)>,
}

enum LogitsSource {
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
        dtype: DType,
    },
    Values(Vec<f32>),
}

const DENSE_NAMES: [&str; 10] = [
    "rollout_log_prob",
    "old_log_prob",
    "log_prob",
    "advantages",
    "response_mask",
    "cu_seqlens",
    "responses",
    "rollout_topk_ids",
    "rollout_topk_log_prob",
    "uid",
];
const LOGITS_NAMES: [&str; 2] = ["rollout_logits", "old_logits"];

/// Reads a batch from `path` (`.json`, anything else is read as safetensors).
pub fn read_batch(path: &Path) -> Result<Batch> {
    let p = path.display().to_string();
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let raw = if is_json {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(&p, e.to_string()))?;
        read_json(&text).map_err(|e| relabel(e, &p))?
    } else {
        read_safetensors(path)?
    };
    build_batch(raw)
}

/// Reads a batch from JSON text (see the module docs for the accepted names).
pub fn batch_from_json(text: &str) -> Result<Batch> {
    build_batch(read_json(text)?)
}

fn relabel(e: Error, path: &str) -> Error {
    match e {
        Error::File { problem, .. } => Error::file(path, problem),
        other => other,
    }
}

fn read_safetensors(path: &Path) -> Result<Raw> {
    let p = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::file(&p, e.to_string()))?;
    // SAFETY: the map is read-only; a file truncated underneath us is the caller's problem,
    // as with every memory-mapped reader (safetensors' own loaders do the same).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::file(&p, e.to_string()))?;
    let map = Arc::new(map);
    let st = safetensors::SafeTensors::deserialize(&map)
        .map_err(|e| Error::file(&p, format!("not a valid safetensors file: {e}")))?;
    let mut raw = Raw::default();
    let base = map.as_ptr() as usize;
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let bytes = view.data();
        if LOGITS_NAMES.contains(&name.as_str()) {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::BF16 => DType::BF16,
                other => {
                    return Err(Error::input(
                        &name,
                        format!("dtype {other:?} is not supported for logits (F32, F16, BF16)"),
                    ))
                }
            };
            let offset = bytes.as_ptr() as usize - base;
            raw.logits.insert(
                name.clone(),
                (
                    shape,
                    LogitsSource::Mapped {
                        map: map.clone(),
                        offset,
                        len: bytes.len(),
                        dtype,
                    },
                ),
            );
        } else if DENSE_NAMES.contains(&name.as_str()) {
            let data = widen(&name, view.dtype(), bytes)?;
            raw.dense.insert(name.clone(), Dense { shape, data });
        }
    }
    Ok(raw)
}

fn widen(name: &str, dtype: safetensors::Dtype, b: &[u8]) -> Result<Vec<f64>> {
    use safetensors::Dtype as D;
    macro_rules! conv {
        ($n:expr, $f:expr) => {
            b.chunks_exact($n)
                .map(|c| $f(c.try_into().unwrap()))
                .collect()
        };
    }
    Ok(match dtype {
        D::F64 => conv!(8, |c: [u8; 8]| f64::from_le_bytes(c)),
        D::F32 => conv!(4, |c: [u8; 4]| f32::from_le_bytes(c) as f64),
        D::F16 => conv!(2, |c: [u8; 2]| half::f16::from_le_bytes(c).to_f64()),
        D::BF16 => conv!(2, |c: [u8; 2]| half::bf16::from_le_bytes(c).to_f64()),
        D::I64 => conv!(8, |c: [u8; 8]| i64::from_le_bytes(c) as f64),
        D::I32 => conv!(4, |c: [u8; 4]| i32::from_le_bytes(c) as f64),
        D::I16 => conv!(2, |c: [u8; 2]| i16::from_le_bytes(c) as f64),
        D::I8 => b.iter().map(|&x| x as i8 as f64).collect(),
        D::U8 | D::BOOL => b.iter().map(|&x| x as f64).collect(),
        D::U16 => conv!(2, |c: [u8; 2]| u16::from_le_bytes(c) as f64),
        D::U32 => conv!(4, |c: [u8; 4]| u32::from_le_bytes(c) as f64),
        D::U64 => conv!(8, |c: [u8; 8]| u64::from_le_bytes(c) as f64),
        other => {
            return Err(Error::input(
                name,
                format!("dtype {other:?} is not supported"),
            ))
        }
    })
}

fn json_number(name: &str, v: &serde_json::Value) -> Result<f64> {
    match v {
        serde_json::Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| Error::input(name, "number out of range")),
        serde_json::Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => Err(Error::input(
                name,
                format!(
                    "string {other:?} is not a number (only \"NaN\", \"Infinity\", \"-Infinity\")"
                ),
            )),
        },
        serde_json::Value::Bool(b) => Ok(*b as u8 as f64),
        other => Err(Error::input(
            name,
            format!("expected a number, found {other}"),
        )),
    }
}

fn flatten(
    name: &str,
    v: &serde_json::Value,
    depth: usize,
    shape: &mut Vec<usize>,
    out: &mut Vec<f64>,
) -> Result<()> {
    match v {
        serde_json::Value::Array(items) => {
            if shape.len() == depth {
                shape.push(items.len());
            } else if shape.len() < depth || shape[depth] != items.len() {
                return Err(Error::input(
                    name,
                    format!(
                        "is ragged: an array at depth {depth} has {} items, expected {:?}",
                        items.len(),
                        shape.get(depth)
                    ),
                ));
            }
            for it in items {
                flatten(name, it, depth + 1, shape, out)?;
            }
            Ok(())
        }
        scalar => {
            if shape.len() != depth {
                return Err(Error::input(name, format!("is ragged: a number at depth {depth} where arrays of shape {shape:?} were expected")));
            }
            out.push(json_number(name, scalar)?);
            Ok(())
        }
    }
}

fn read_json(text: &str) -> Result<Raw> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::file("<json>", format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| Error::file("<json>", "the top level must be an object of tensors"))?;
    let mut raw = Raw::default();
    for (name, value) in obj {
        let known_dense = DENSE_NAMES.contains(&name.as_str());
        let known_logits = LOGITS_NAMES.contains(&name.as_str());
        if !(known_dense || known_logits) || value.is_null() {
            continue;
        }
        let mut shape = Vec::new();
        let mut data = Vec::new();
        flatten(name, value, 0, &mut shape, &mut data)?;
        if known_logits {
            raw.logits.insert(
                name.clone(),
                (
                    shape,
                    LogitsSource::Values(data.iter().map(|&x| x as f32).collect()),
                ),
            );
        } else {
            raw.dense.insert(name.clone(), Dense { shape, data });
        }
    }
    Ok(raw)
}

fn to_ids(name: &str, d: &[f64]) -> Result<Vec<i64>> {
    d.iter()
        .map(|&x| {
            if x.fract() == 0.0 && x.abs() < 9.0e15 {
                Ok(x as i64)
            } else {
                Err(Error::input(name, format!("value {x} is not an integer")))
            }
        })
        .collect()
}

fn build_batch(mut raw: Raw) -> Result<Batch> {
    let token_shape = [
        "rollout_log_prob",
        "old_log_prob",
        "log_prob",
        "responses",
        "advantages",
        "response_mask",
    ]
    .iter()
    .find_map(|n| raw.dense.get(*n).map(|d| (n.to_string(), d.shape.clone())));
    let mut batch = if let Some(cu) = raw.dense.remove("cu_seqlens") {
        if cu.shape.len() != 1 {
            return Err(Error::input(
                "cu_seqlens",
                format!("must be 1-D, got shape {:?}", cu.shape),
            ));
        }
        if raw.dense.contains_key("response_mask") {
            return Err(Error::input(
                "response_mask",
                "cannot be combined with cu_seqlens (packed layout has no padding)",
            ));
        }
        Batch::packed(&to_ids("cu_seqlens", &cu.data)?)?
    } else {
        let shape = match (&token_shape, raw.logits.iter().next()) {
            (Some((_, s)), _) => s.clone(),
            (None, Some((_, (s, _)))) if s.len() >= 2 => s[..s.len() - 1].to_vec(),
            _ => {
                return Err(Error::input(
                    "rollout_log_prob",
                    "no per-token tensor found (need log-probs or logits, SPEC §3)",
                ))
            }
        };
        match shape.as_slice() {
            [b, t] => {
                let mask = match raw.dense.remove("response_mask") {
                    Some(m) if m.shape != shape => {
                        return Err(Error::input(
                            "response_mask",
                            format!("shape {:?} differs from the token shape {shape:?}", m.shape),
                        ))
                    }
                    Some(m) => m.data,
                    None => vec![1.0; b * t],
                };
                Batch::padded(*b, *t, &mask)?
            }
            [n] => Batch::packed(&[0, *n as i64])?,
            other => {
                return Err(Error::input(
                    token_shape.map(|t| t.0).unwrap_or_default(),
                    format!("shape {other:?} is neither [B, T] nor [N]"),
                ))
            }
        }
    };
    let tshape = batch.token_shape();
    let check = |name: &str, shape: &[usize], extra: usize| -> Result<()> {
        let ok = shape.len() == tshape.len() + extra && shape[..tshape.len()] == tshape[..];
        if ok {
            Ok(())
        } else {
            let want = if extra == 0 {
                format!("{tshape:?}")
            } else {
                format!("{tshape:?} + [..]")
            };
            Err(Error::input(
                name,
                format!("shape {shape:?} does not match the batch layout {want}"),
            ))
        }
    };
    for name in ["rollout_log_prob", "old_log_prob", "log_prob", "advantages"] {
        if let Some(d) = raw.dense.remove(name) {
            check(name, &d.shape, 0)?;
            batch = batch.with_log_probs(name, d.data)?;
        }
    }
    if let Some(d) = raw.dense.remove("uid") {
        if d.shape.len() != 1 {
            let msg = format!("must be 1-D ([B] or [S]), got shape {:?}", d.shape);
            return Err(Error::input("uid", msg));
        }
        batch = batch.with_uid(to_ids("uid", &d.data)?)?;
    }
    if let Some(d) = raw.dense.remove("responses") {
        check("responses", &d.shape, 0)?;
        batch = batch.with_responses(to_ids("responses", &d.data)?)?;
    }
    for name in LOGITS_NAMES {
        if let Some((shape, src)) = raw.logits.remove(name) {
            check(name, &shape, 1)?;
            let vocab = *shape.last().unwrap();
            let rows = batch.slots();
            let logits = match src {
                LogitsSource::Mapped {
                    map,
                    offset,
                    len,
                    dtype,
                } => Logits::mapped(map, offset, len, dtype, rows, vocab),
                LogitsSource::Values(v) => Logits::from_f32(&v, rows, vocab),
            }
            .map_err(|e| match e {
                Error::InvalidInput { problem, .. } => Error::input(name, problem),
                other => other,
            })?;
            batch = batch.with_logits(name, logits)?;
        }
    }
    match (
        raw.dense.remove("rollout_topk_ids"),
        raw.dense.remove("rollout_topk_log_prob"),
    ) {
        (Some(ids), Some(lp)) => {
            check("rollout_topk_ids", &ids.shape, 1)?;
            check("rollout_topk_log_prob", &lp.shape, 1)?;
            let k = *ids.shape.last().unwrap();
            batch = batch.with_topk(to_ids("rollout_topk_ids", &ids.data)?, lp.data, k)?;
        }
        (Some(_), None) => {
            return Err(Error::input(
                "rollout_topk_log_prob",
                "is required with rollout_topk_ids",
            ))
        }
        (None, Some(_)) => {
            return Err(Error::input(
                "rollout_topk_ids",
                "is required with rollout_topk_log_prob",
            ))
        }
        (None, None) => {}
    }
    batch.validate()?;
    Ok(batch)
}

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

/// Writes outputs as JSON (`.json`) or safetensors (F64 tensors, anything else).
pub fn write_outputs(path: &Path, outputs: &[Output]) -> Result<()> {
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
    std::fs::write(path, bytes).map_err(|e| Error::file(&p, e.to_string()))
}

/// Writes a flat metrics object as JSON (non-finite values as strings).
pub fn write_metrics(path: &Path, metrics: &BTreeMap<String, f64>) -> Result<()> {
    let p = path.display().to_string();
    let obj: serde_json::Map<String, serde_json::Value> = metrics
        .iter()
        .map(|(k, &v)| (k.clone(), json_value(v)))
        .collect();
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(obj))
        .map_err(|e| Error::file(&p, e.to_string()))?;
    std::fs::write(path, text).map_err(|e| Error::file(&p, e.to_string()))
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

impl Layout {
    /// Number of sequences of this layout (`B` or `S`).
    pub fn num_seqs(&self) -> usize {
        match self {
            Layout::Padded { batch, .. } => *batch,
            Layout::Packed { cu_seqlens } => cu_seqlens.len() - 1,
        }
    }
}
