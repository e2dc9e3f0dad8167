//! Reading tensors out of safetensors (memory-mapped) and JSON files, before any layout rule:
//! framework names are mapped here ([`super::names`]), values widened to f64, JSON `null`s
//! remembered by position.

use super::names::{self, Renames};
use crate::error::{Error, Result};
use crate::input::logits::DType;
use crate::input::tensors::{self, Role, Shape};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub(super) use super::json_stream::Dense;

/// Where logits live.
pub(super) enum LogitsSource {
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
        dtype: DType,
    },
    /// Values from JSON, and the flat indices that held `null` (legal only at padding).
    Values(Vec<f32>, Vec<usize>),
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

/// Every tensor name a file may hold (after the framework renames), from the tensor table.
pub(super) fn known() -> Vec<&'static str> {
    crate::input::tensors::batch_names().collect()
}

/// The tensors read as logits (mapped in place, never widened).
pub(super) fn is_logits(name: &str) -> bool {
    crate::input::tensors::spec(name).is_some_and(|t| t.role == Role::Logits)
}

/// `trmask name → name in the file` for the keys of a file, after the framework map.
pub(super) fn map_names(keys: &[String]) -> Result<(BTreeMap<String, String>, Renames)> {
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
    let st =
        safetensors::SafeTensors::deserialize(&map).map_err(|e| match bad_tensor_entry(&map) {
            Some((tensor, problem)) => Error::file(&p, format!("tensor `{tensor}`: {problem}")),
            None => Error::file(&p, format!("not a valid safetensors file: {e}")),
        })?;
    let step = step_metadata(&map);
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
        if is_logits(name) {
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
            // docs/FORMAT.md (Layout): offsets are int32 / int64 (a float or byte-wide tensor is a mix-up)
            if name == "cu_seqlens"
                && !matches!(
                    view.dtype(),
                    safetensors::Dtype::I32 | safetensors::Dtype::I64
                )
            {
                return Err(Error::input(
                    name,
                    format!("dtype {:?} is not supported (I32 or I64)", view.dtype()),
                ));
            }
            let data = widen(name, view.dtype(), bytes)?;
            let nulls = Vec::new();
            raw.dense.insert(name.clone(), Dense { shape, data, nulls });
        }
    }
    Ok(raw)
}

/// Which header entry makes a safetensors file invalid, when one does: a shape whose size
/// overflows or disagrees with its `data_offsets` (the crate's error names no tensor).
fn bad_tensor_entry(bytes: &[u8]) -> Option<(String, String)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header = bytes.get(8..8usize.checked_add(usize::try_from(n).ok()?)?)?;
    let entries: BTreeMap<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    for (name, entry) in entries.into_iter().filter(|(k, _)| k != "__metadata__") {
        // the crate's own header entry, so its dtype table sizes the data
        let Ok(t) = serde_json::from_value::<safetensors::tensor::TensorInfo>(entry) else {
            continue;
        };
        let (start, end) = t.data_offsets;
        let size = t
            .shape
            .iter()
            .try_fold(t.dtype.bitsize() as u64, |acc, &d| {
                acc.checked_mul(d as u64)
            })
            .map(|bits| bits.div_ceil(8))
            .filter(|&b| usize::try_from(b).is_ok());
        let problem = match size {
            None => format!("shape {:?} is too large to address", t.shape),
            Some(b) if end.checked_sub(start).map(|h| h as u64) != Some(b) => format!(
                "shape {:?} needs {b} bytes, its data_offsets [{start}, {end}] hold {}",
                t.shape,
                end.saturating_sub(start)
            ),
            _ => continue,
        };
        return Some((name, problem));
    }
    None
}

/// Checks the shapes of a file's tensors against each other before any of them is widened to
/// f64 (8 bytes per element, up to 8× the file): a tensor that cannot belong to the batch is
/// refused from its header alone. The full layout rules run later, on the widened tensors.
fn shapes_fit(shapes: &BTreeMap<&str, Vec<usize>>) -> Result<()> {
    let token = tensors::token_shape_sources()
        .into_iter()
        .find_map(|n| shapes.get(n).map(|s| (n, s.clone())))
        .or_else(|| {
            tensors::logits_names().into_iter().find_map(|n| {
                let s = shapes.get(n)?;
                (s.len() >= 2).then(|| (n, s[..s.len() - 1].to_vec()))
            })
        });
    let Some((source, token)) = token else {
        return Ok(());
    };
    for (name, shape) in shapes {
        let fits = match tensors::spec(name).map(|t| t.shape) {
            Some(Shape::Token) => *shape == token,
            Some(Shape::TokenOrSeq) => {
                *shape == token || shape.first() == token.first() && shape.len() == 1
            }
            Some(Shape::TokenK | Shape::TokenV) => {
                shape.len() == token.len() + 1 && shape[..token.len()] == token[..]
            }
            Some(Shape::TokenLK) => {
                shape.len() == token.len() + 2 && shape[..token.len()] == token[..]
            }
            // One offset or group id per sequence: 1-D, any length (empty sequences are legal,
            // so a packed batch may hold more sequences than tokens; the values are in the
            // file, so the length is bounded by its size)
            Some(Shape::Offsets | Shape::Seq | Shape::Flat | Shape::KeptOffsets) => {
                shape.len() == 1
            }
            None => true,
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

pub(super) fn read_json(text: &str) -> Result<Raw> {
    let prepared = super::json_stream::prepare(text);
    let (keys, step) = super::json_stream::scan(&prepared)?;
    let (mapping, renames) = map_names(&keys)?;
    let mut raw = Raw {
        keys,
        renames,
        step,
        bytes: text.len() as u64,
        ..Raw::default()
    };
    let wanted: BTreeMap<String, String> = mapping
        .iter()
        .map(|(name, source)| (source.clone(), name.clone()))
        .collect();
    let mut tensors = super::json_stream::flatten(&prepared, &wanted)?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, d) in tensors {
        let source = mapping[&name].clone();
        raw.sources
            .push((name.clone(), source.clone(), "json".to_string()));
        if is_logits(&name) {
            let values = d.data.iter().map(|&x| x as f32).collect();
            raw.logits.insert(
                name.clone(),
                (d.shape, LogitsSource::Values(values, d.nulls)),
            );
        } else {
            raw.dense.insert(name.clone(), d);
        }
    }
    Ok(raw)
}

/// The `step` a safetensors file's metadata names, if any.
pub(super) fn step_metadata(bytes: &[u8]) -> Option<f64> {
    safetensors::SafeTensors::read_metadata(bytes)
        .ok()
        .and_then(|(_, m)| {
            m.metadata()
                .as_ref()?
                .get("step")?
                .trim()
                .parse::<f64>()
                .ok()
        })
}
