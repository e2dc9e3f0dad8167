//! A safetensors step read in place for the fused pass ([`crate::analysis::analyze_fused`]):
//! the file memory-mapped, its tensors borrowed in their own dtype as a [`Step`], nothing
//! widened. Only padded steps of per-token values (both policies' log-probs, advantages), the
//! response mask and per-sequence group ids (plus tensors this analysis does not read: sampled
//! ids, the rollout top-K) are read so; anything else is `None`, for [`super::read_input`] and
//! the full path.

use super::names::Renames;
use super::{files, raw};
use crate::correction::step::Step;
use crate::error::{Error, Result};
use crate::input::batch::{Batch, Layout};
use crate::input::tensors::{self, Role, Shape};
use crate::input::values::{MaskValues, Values};
use safetensors::Dtype;
use std::path::Path;

type Range = std::ops::Range<usize>;

/// How the fused analysis takes a tensor of the table.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Use {
    /// Per-token values (both policies' log-probs, advantages), borrowed in their dtype.
    Values,
    Mask,
    /// One id per sequence (GRPO groups).
    Group,
    /// Read by no statistic of a log-prob step (sampled ids, the rollout top-K without
    /// trainer logits or a sampler's truncation, which the fused pass does not serve).
    Unread,
}

/// `None` for a tensor the fused analysis does not take (the full path reads the step).
fn usage(name: &str) -> Option<Use> {
    let t = tensors::spec(name)?;
    match (t.role, t.shape) {
        (Role::Values, Shape::Token | Shape::TokenOrSeq) => Some(Use::Values),
        (Role::Mask, _) => Some(Use::Mask),
        (Role::Ids, Shape::Seq) => Some(Use::Group),
        (Role::Ids, Shape::Token) | (_, Shape::TokenK) => Some(Use::Unread),
        _ => None,
    }
}

/// A memory-mapped step (see the module docs).
pub struct MappedStep {
    map: memmap2::Mmap,
    /// The per-token values: (trmask name, dtype, byte range in the map).
    values: Vec<(String, Dtype, Range)>,
    mask: (Dtype, Range),
    batch: usize,
    seq_len: usize,
    /// The per-sequence ids: (trmask name, values).
    group: Option<(String, Vec<i64>)>,
    renames: Renames,
    sources: Vec<(String, String, String)>,
    step: Option<f64>,
}

/// Maps `path` when it is a padded safetensors step the fused analysis reads in place (else
/// `None`: the caller reads it with [`super::read_input`], which words any problem).
pub(super) fn map(path: &Path) -> Result<Option<MappedStep>> {
    let is_st = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"));
    if !is_st || files::is_stream(path) {
        return Ok(None);
    }
    let p = path.display().to_string();
    let (file, _) = files::open_input(path)?;
    // SAFETY: read-only, as `raw::read_safetensors` maps inputs (a file truncated underneath
    // raises SIGBUS, which the CLI turns into a clean exit).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&p, &e))?;
    let Ok(st) = safetensors::SafeTensors::deserialize(&map) else {
        return Ok(None);
    };
    let step = raw::step_metadata(&map);
    let keys: Vec<String> = st.names().into_iter().map(String::from).collect();
    let Ok((mapping, renames)) = raw::map_names(&keys) else {
        return Ok(None);
    };
    let base = map.as_ptr() as usize;
    let mut found = Vec::new();
    let mut sources = Vec::new();
    for (name, source) in &mapping {
        let (Some(u), Ok(view)) = (usage(name), st.tensor(source)) else {
            return Ok(None);
        };
        let start = view.data().as_ptr() as usize - base;
        sources.push((
            name.clone(),
            source.clone(),
            format!("{:?}", view.dtype()).to_lowercase(),
        ));
        let range = start..start + view.data().len();
        found.push((name.clone(), u, view.dtype(), view.shape().to_vec(), range));
    }
    let Some([b, t]) = found
        .iter()
        .find(|f| f.1 == Use::Mask)
        .and_then(|f| <[usize; 2]>::try_from(f.3.as_slice()).ok())
    else {
        return Ok(None);
    };
    if b == 0 || t == 0 {
        // no slot: nothing bounds the declared rows by the file's size (the full path says so)
        return Ok(None);
    }
    let ids = |d: Dtype| matches!(d, Dtype::I32 | Dtype::I64);
    let topk: Vec<Vec<usize>> = found
        .iter()
        .filter(|f| tensors::spec(&f.0).is_some_and(|s| s.shape == Shape::TokenK))
        .map(|f| f.3.clone())
        .collect();
    let mut values = Vec::new();
    let mut mask = None;
    let mut group = None;
    for (name, u, dtype, shape, range) in found {
        let role = tensors::spec(&name).map(|s| s.role);
        let token = shape == [b, t];
        let fits = match u {
            Use::Values | Use::Mask => token,
            Use::Group => shape == [b] && ids(dtype),
            Use::Unread if shape.len() == 3 => {
                shape[..2] == [b, t]
                    && topk.len() == 2
                    && topk.iter().all(|s| *s == shape)
                    && ids(dtype) == (role == Some(Role::Ids))
            }
            Use::Unread => token && ids(dtype),
        };
        if !fits {
            return Ok(None);
        }
        match u {
            Use::Values => values.push((name, dtype, range)),
            Use::Mask => mask = Some((dtype, range)),
            Use::Group => {
                let bytes = &map[range];
                let v: Vec<i64> = if dtype == Dtype::I64 {
                    bytes
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect()
                } else {
                    bytes
                        .chunks_exact(4)
                        .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or_default())))
                        .collect()
                };
                group = Some((name, v));
            }
            Use::Unread => {}
        }
    }
    let Some(mask) = mask else {
        return Ok(None);
    };
    drop(st);
    Ok(Some(MappedStep {
        map,
        values,
        mask,
        batch: b,
        seq_len: t,
        group,
        renames,
        sources,
        step,
    }))
}

impl MappedStep {
    fn values(&self, dtype: Dtype, r: &Range) -> Option<Values<'_>> {
        let bytes = &self.map[r.clone()];
        Some(match dtype {
            Dtype::F32 => Values::F32(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::F64 => Values::F64(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::BF16 => Values::BF16(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::F16 => Values::F16(bytemuck::try_cast_slice(bytes).ok()?),
            _ => return None,
        })
    }

    fn mask(&self) -> Option<MaskValues<'_>> {
        let (dtype, r) = &self.mask;
        let bytes = &self.map[r.clone()];
        Some(match dtype {
            // a bool byte other than 0 / 1 is read as a bad mask value, not assumed away
            Dtype::BOOL | Dtype::U8 => MaskValues::U8(bytes),
            Dtype::I64 => MaskValues::I64(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::F32 => MaskValues::F32(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::F64 => MaskValues::F64(bytemuck::try_cast_slice(bytes).ok()?),
            _ => return None,
        })
    }

    /// The step's borrowed tensors and layout, `None` for a dtype or an alignment the
    /// borrowed views do not take.
    pub fn step(&self) -> Option<(Step<'_>, Layout)> {
        let mut s = Step::padded(self.batch, self.seq_len).response_mask(self.mask()?);
        for (name, dtype, r) in &self.values {
            s = s.values(name, self.values(*dtype, r)?).ok()?;
        }
        if let Some((name, ids)) = &self.group {
            s = s.ids(name, ids).ok()?;
        }
        let layout = Layout::Padded {
            batch: self.batch,
            seq_len: self.seq_len,
        };
        Some((s, layout))
    }

    /// The input as the summary and the warnings see it — the layout and the response mask, no
    /// tensor attached (`None` on a mask value other than 0 / 1) — with the renames, the
    /// `(name, name in the file, dtype)` of every tensor and the file's `step`.
    #[allow(clippy::type_complexity)]
    pub(super) fn into_parts(
        self,
    ) -> Option<(Batch, Renames, Vec<(String, String, String)>, Option<f64>)> {
        let batch = Batch::from_mask(self.batch, self.seq_len, self.mask()?.to_bools()?)?;
        Some((batch, self.renames, self.sources, self.step))
    }
}
