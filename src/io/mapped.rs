//! A safetensors step read in place for the fused pass ([`crate::analysis::analyze_fused`]):
//! the file memory-mapped, its tensors borrowed in their own dtype as a [`Step`], nothing
//! widened. Only padded steps of both policies' log-probs, the response mask, advantages and
//! `uid` (plus tensors this analysis does not read: sampled ids, the rollout top-K) are read
//! so; anything else is `None`, for [`super::read_input`] and the full path.

use super::{files, raw, Input, ReadOptions};
use crate::correction::step::Step;
use crate::error::{Error, Result};
use crate::input::batch::{Batch, Layout};
use crate::input::values::{MaskValues, Values};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

/// The tensors the fused analysis reads, and those it may leave unread.
const READ: [&str; 6] = [
    "response_mask",
    "rollout_log_prob",
    "old_log_prob",
    "log_prob",
    "advantages",
    "uid",
];
const UNREAD: [&str; 3] = ["responses", "rollout_topk_ids", "rollout_topk_log_prob"];

/// A memory-mapped step (see the module docs).
pub struct MappedStep {
    map: memmap2::Mmap,
    /// trmask name → (dtype, byte range in the map).
    tensors: BTreeMap<String, (Dtype, std::ops::Range<usize>)>,
    batch: usize,
    seq_len: usize,
    uid: Option<Vec<i64>>,
    renames: super::Renames,
    sources: Vec<(String, String, String)>,
    step: Option<f64>,
}

/// Maps `path` when it is a padded safetensors step the fused analysis reads in place (else
/// `None`: the caller reads it with [`super::read_input`], which words any problem).
pub fn map_step(path: &Path, opts: &ReadOptions) -> Result<Option<MappedStep>> {
    let is_st = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"));
    if opts.all_valid || !is_st || files::is_stream(path) {
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
    let Ok((mapping, renames)) = raw::map_names(&keys) else {
        return Ok(None);
    };
    let base = map.as_ptr() as usize;
    let mut tensors = BTreeMap::new();
    let mut shapes = BTreeMap::new();
    let mut sources = Vec::new();
    for (name, source) in &mapping {
        if !READ.contains(&name.as_str()) && !UNREAD.contains(&name.as_str()) {
            return Ok(None);
        }
        let Ok(view) = st.tensor(source) else {
            return Ok(None);
        };
        let start = view.data().as_ptr() as usize - base;
        sources.push((
            name.clone(),
            source.clone(),
            format!("{:?}", view.dtype()).to_lowercase(),
        ));
        shapes.insert(name.clone(), view.shape().to_vec());
        tensors.insert(
            name.clone(),
            (view.dtype(), start..start + view.data().len()),
        );
    }
    let Some([b, t]) = shapes
        .get("response_mask")
        .and_then(|s| <[usize; 2]>::try_from(s.as_slice()).ok())
    else {
        return Ok(None);
    };
    for (name, shape) in &shapes {
        let ids = matches!(tensors[name].0, Dtype::I32 | Dtype::I64);
        let fits = match name.as_str() {
            "uid" => *shape == [b],
            "responses" => ids && *shape == [b, t],
            "rollout_topk_ids" | "rollout_topk_log_prob" => {
                (ids == (name == "rollout_topk_ids"))
                    && shape.len() == 3
                    && shape[..2] == [b, t]
                    && shapes.get(other_topk(name)).is_some_and(|o| o == shape)
            }
            _ => *shape == [b, t],
        };
        if !fits {
            return Ok(None);
        }
    }
    let uid = match tensors.get("uid") {
        None => None,
        Some((Dtype::I64, r)) => Some(
            map[r.clone()]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        ),
        Some((Dtype::I32, r)) => Some(
            map[r.clone()]
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or_default())))
                .collect(),
        ),
        Some(_) => return Ok(None),
    };
    drop(st);
    Ok(Some(MappedStep {
        map,
        tensors,
        batch: b,
        seq_len: t,
        uid,
        renames,
        sources,
        step,
    }))
}

fn other_topk(name: &str) -> &'static str {
    if name == "rollout_topk_ids" {
        "rollout_topk_log_prob"
    } else {
        "rollout_topk_ids"
    }
}

impl MappedStep {
    fn values(&self, name: &str) -> Option<Option<Values<'_>>> {
        let Some((dtype, r)) = self.tensors.get(name) else {
            return Some(None);
        };
        let bytes = &self.map[r.clone()];
        Some(Some(match dtype {
            Dtype::F32 => Values::F32(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::F64 => Values::F64(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::BF16 => Values::BF16(bytemuck::try_cast_slice(bytes).ok()?),
            Dtype::F16 => Values::F16(bytemuck::try_cast_slice(bytes).ok()?),
            _ => return None,
        }))
    }

    fn mask(&self) -> Option<MaskValues<'_>> {
        let (dtype, r) = self.tensors.get("response_mask")?;
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
        for name in ["rollout_log_prob", "old_log_prob", "log_prob", "advantages"] {
            if let Some(v) = self.values(name)? {
                s = s.values(name, v).ok()?;
            }
        }
        if let Some(u) = &self.uid {
            s = s.uid(u);
        }
        let layout = Layout::Padded {
            batch: self.batch,
            seq_len: self.seq_len,
        };
        Some((s, layout))
    }

    /// The input as the summary and the warnings see it: the layout and the response mask,
    /// no tensor attached (`None` on a mask value other than 0 / 1).
    pub fn into_input(self) -> Option<Input> {
        let m = self.mask()?;
        let n = self.batch * self.seq_len;
        let mut mask = Vec::with_capacity(n);
        let mut tile = [0u8; 4096];
        let mut k = 0;
        while k < n {
            let len = tile.len().min(n - k);
            m.load(k, &mut tile[..len]);
            if tile[..len].iter().any(|&x| x > 1) {
                return None;
            }
            mask.extend(tile[..len].iter().map(|&x| x == 1));
            k += len;
        }
        let batch = Batch::from_mask(self.batch, self.seq_len, mask)?;
        Some(Input {
            batch,
            renames: self.renames,
            sources: self.sources,
            step: self.step,
        })
    }
}
