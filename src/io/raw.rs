//! Reading tensors out of safetensors (memory-mapped) and JSON files, before any layout rule:
//! framework names are mapped here ([`super::names`]), values widened to f64, JSON `null`s
//! remembered by position.

use super::names::{self, Renames};
use crate::error::{Error, Result};
use crate::lenient_json;
use crate::logits::DType;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A tensor read from a file: shape plus values widened to f64 (ids are exact up to 2^53).
#[derive(Clone, Debug)]
pub(super) struct Dense {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
    /// Flat indices that held JSON `null` (their value is NaN).
    pub nulls: Vec<usize>,
}

/// Where logits live.
pub(super) enum LogitsSource {
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
        dtype: DType,
    },
    Values(Vec<f32>),
}

/// What a file gave: dense tensors and logits under trmask names, plus what was renamed.
#[derive(Default)]
pub(super) struct Raw {
    pub dense: BTreeMap<String, Dense>,
    pub logits: BTreeMap<String, (Vec<usize>, LogitsSource)>,
    /// Every key of the file (for near-miss hints).
    pub keys: Vec<String>,
    /// `(trmask name, name in the file, dtype)` of every tensor read.
    pub sources: Vec<(String, String, String)>,
    pub renames: Renames,
    /// The file's `step` (safetensors metadata or a top-level JSON number).
    pub step: Option<f64>,
    /// Size of the input in bytes: the bound on every count the file declares.
    pub bytes: u64,
}

pub(super) const DENSE_NAMES: [&str; 10] = [
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
pub(super) const LOGITS_NAMES: [&str; 2] = ["rollout_logits", "old_logits"];

pub(super) fn known() -> Vec<&'static str> {
    DENSE_NAMES.iter().chain(&LOGITS_NAMES).copied().collect()
}

/// `trmask name → name in the file` for the keys of a file, after the framework map.
fn map_names(keys: &[String]) -> Result<(BTreeMap<String, String>, Renames)> {
    let mut m: BTreeMap<String, String> = keys.iter().map(|k| (k.clone(), k.clone())).collect();
    let renames = names::apply(&mut m, &known())?;
    let known = known();
    m.retain(|k, _| known.contains(&k.as_str()));
    Ok((m, renames))
}

pub(super) fn read_safetensors(path: &Path) -> Result<Raw> {
    let p = path.display().to_string();
    let (file, bytes) = super::files::open_input(path)?;
    if bytes == 0 {
        return Err(Error::file(&p, "is empty, not a safetensors file"));
    }
    // SAFETY: the map is read-only. A file truncated underneath us raises SIGBUS on access:
    // the CLI turns that signal into a clean exit before any output exists (SECURITY.md), and
    // library users who read files that another process rewrites should copy them first.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&p, &e))?;
    let map = Arc::new(map);
    let st = safetensors::SafeTensors::deserialize(&map)
        .map_err(|e| Error::file(&p, format!("not a valid safetensors file: {e}")))?;
    let step = safetensors::SafeTensors::read_metadata(&map)
        .ok()
        .and_then(|(_, m)| {
            m.metadata()
                .as_ref()?
                .get("step")?
                .trim()
                .parse::<f64>()
                .ok()
        });
    let keys: Vec<String> = st.names().into_iter().map(String::from).collect();
    let (mapping, renames) = map_names(&keys)?;
    let mut raw = Raw {
        keys,
        renames,
        step,
        bytes,
        ..Raw::default()
    };
    let mut shapes = BTreeMap::new();
    for (name, source) in &mapping {
        if let Ok(view) = st.tensor(source) {
            shapes.insert(name.as_str(), view.shape().to_vec());
        }
    }
    shapes_fit(&shapes)?;
    let base = map.as_ptr() as usize;
    for (name, source) in &mapping {
        let view = st
            .tensor(source)
            .map_err(|e| Error::file(&p, format!("tensor {source}: {e}")))?;
        let shape = view.shape().to_vec();
        let bytes = view.data();
        raw.sources.push((
            name.clone(),
            source.clone(),
            format!("{:?}", view.dtype()).to_lowercase(),
        ));
        if LOGITS_NAMES.contains(&name.as_str()) {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::BF16 => DType::BF16,
                other => {
                    return Err(Error::input(
                        name,
                        format!("dtype {other:?} is not supported for logits (F32, F16, BF16)"),
                    ))
                }
            };
            let offset = bytes.as_ptr() as usize - base;
            let src = LogitsSource::Mapped {
                map: map.clone(),
                offset,
                len: bytes.len(),
                dtype,
            };
            raw.logits.insert(name.clone(), (shape, src));
        } else {
            let data = widen(name, view.dtype(), bytes)?;
            let nulls = Vec::new();
            raw.dense.insert(name.clone(), Dense { shape, data, nulls });
        }
    }
    Ok(raw)
}

/// Checks the shapes of a file's tensors against each other before any of them is widened to
/// f64 (8 bytes per element, up to 8× the file): a tensor that cannot belong to the batch is
/// refused from its header alone. The full layout rules run later, on the widened tensors.
fn shapes_fit(shapes: &BTreeMap<&str, Vec<usize>>) -> Result<()> {
    let token = [
        "rollout_log_prob",
        "old_log_prob",
        "log_prob",
        "responses",
        "response_mask",
    ]
    .iter()
    .find_map(|n| shapes.get(n).map(|s| (*n, s.clone())))
    .or_else(|| {
        LOGITS_NAMES.iter().find_map(|n| {
            let s = shapes.get(n)?;
            (s.len() >= 2).then(|| (*n, s[..s.len() - 1].to_vec()))
        })
    });
    let Some((source, token)) = token else {
        return Ok(());
    };
    let slots: usize = token.iter().product();
    for (name, shape) in shapes {
        let fits = match *name {
            "rollout_log_prob" | "old_log_prob" | "log_prob" | "responses" | "response_mask" => {
                *shape == token
            }
            "advantages" => *shape == token || shape.first() == token.first() && shape.len() == 1,
            "rollout_topk_ids" | "rollout_topk_log_prob" | "rollout_logits" | "old_logits" => {
                shape.len() == token.len() + 1 && shape[..token.len()] == token[..]
            }
            // One offset or group id per sequence: never more than one per slot, plus one.
            "cu_seqlens" | "uid" => {
                shape.len() == 1 && shape[0] <= slots.max(token.first().copied().unwrap_or(0)) + 1
            }
            _ => true,
        };
        if !fits {
            return Err(Error::input(
                *name,
                format!("shape {shape:?} does not fit the batch of {source} {token:?}"),
            ));
        }
    }
    Ok(())
}

fn widen(name: &str, dtype: safetensors::Dtype, b: &[u8]) -> Result<Vec<f64>> {
    use safetensors::Dtype as D;
    // One f64 per element, reserved fallibly: a tensor too large to widen is an error
    // (exit code 1), never an abort.
    let mut out: Vec<f64> = Vec::new();
    let n = (b.len() * 8) / dtype.bitsize().max(1);
    out.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(format!("{n} values of {name} widened to f64")))?;
    macro_rules! conv {
        ($n:expr, $f:expr) => {{
            out.extend(b.chunks_exact($n).map(|c| $f(c.try_into().unwrap())));
            out
        }};
    }
    Ok(match dtype {
        D::F64 => conv!(8, |c: [u8; 8]| f64::from_le_bytes(c)),
        D::F32 => conv!(4, |c: [u8; 4]| f32::from_le_bytes(c) as f64),
        D::F16 => conv!(2, |c: [u8; 2]| half::f16::from_le_bytes(c).to_f64()),
        D::BF16 => conv!(2, |c: [u8; 2]| half::bf16::from_le_bytes(c).to_f64()),
        D::I64 => conv!(8, |c: [u8; 8]| i64::from_le_bytes(c) as f64),
        D::I32 => conv!(4, |c: [u8; 4]| i32::from_le_bytes(c) as f64),
        D::I16 => conv!(2, |c: [u8; 2]| i16::from_le_bytes(c) as f64),
        D::I8 => {
            out.extend(b.iter().map(|&x| x as i8 as f64));
            out
        }
        D::U8 | D::BOOL => {
            out.extend(b.iter().map(|&x| x as f64));
            out
        }
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
        serde_json::Value::String(s) => lenient_json::non_finite(s).ok_or_else(|| {
            Error::input(
                name,
                format!("string {s:?} is not a number (only \"NaN\", \"Infinity\", \"-Infinity\")"),
            )
        }),
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
    out: &mut Dense,
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
            if scalar.is_null() {
                out.nulls.push(out.data.len());
                out.data.push(f64::NAN);
            } else {
                out.data.push(json_number(name, scalar)?);
            }
            Ok(())
        }
    }
}

pub(super) fn read_json(text: &str) -> Result<Raw> {
    let v = lenient_json::parse(text)
        .map_err(|e| Error::file("<json>", format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| Error::file("<json>", "the top level must be an object of tensors"))?;
    let keys: Vec<String> = obj
        .iter()
        .filter(|(_, v)| v.is_array())
        .map(|(k, _)| k.clone())
        .collect();
    let (mapping, renames) = map_names(&keys)?;
    let step = obj.get("step").and_then(|s| s.as_f64());
    let mut raw = Raw {
        keys,
        renames,
        step,
        bytes: text.len() as u64,
        ..Raw::default()
    };
    for (name, source) in &mapping {
        let value = &obj[source.as_str()];
        let mut shape = Vec::new();
        let mut d = Dense {
            shape: Vec::new(),
            data: Vec::new(),
            nulls: Vec::new(),
        };
        flatten(name, value, 0, &mut shape, &mut d)?;
        d.shape = shape;
        raw.sources
            .push((name.clone(), source.clone(), "json".to_string()));
        if LOGITS_NAMES.contains(&name.as_str()) {
            if let Some(&i) = d.nulls.first() {
                return Err(Error::input(
                    name,
                    format!(
                        "null at flat index {i} (logits must be numbers; -Infinity masks a token)"
                    ),
                ));
            }
            let values = d.data.iter().map(|&x| x as f32).collect();
            raw.logits
                .insert(name.clone(), (d.shape, LogitsSource::Values(values)));
        } else {
            raw.dense.insert(name.clone(), d);
        }
    }
    Ok(raw)
}
