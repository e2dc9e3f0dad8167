//! A [`Batch`] from a dict of arrays, with the same layout rules as reading a file
//! (`trmask::io`): `cu_seqlens` → packed, `response_mask` → padded, neither → an error naming
//! both unless `all_valid` (a `[B, T]` batch without padding, or one `[N]` sequence).
//! Framework names (verl, TRL, …) are renamed as the CLI renames them.

use crate::arrays::{self, Arr};
use crate::to_py;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;
use trmask::io::Renames;
use trmask::routing::ExpertIds;
use trmask::tensors::{self, Role, Shape};
use trmask::{Batch, Error, MaskValues};

/// The tensor names a batch dict may hold (after renaming framework keys): the tensor
/// table's, plus the Python argument names (`trainer_logits`).
fn known() -> Vec<&'static str> {
    tensors::batch_names()
        .chain(tensors::PYTHON_NAMES.iter().map(|p| p.0))
        .collect()
}

fn mask_f64(m: MaskValues<'_>) -> Vec<f64> {
    match m {
        MaskValues::Bool(v) => v.iter().map(|&b| b as u8 as f64).collect(),
        MaskValues::U8(v) => v.iter().map(|&x| x as f64).collect(),
        MaskValues::I64(v) => v.iter().map(|&x| x as f64).collect(),
        MaskValues::F32(v) => v.iter().map(|&x| x as f64).collect(),
        MaskValues::F64(v) => v.to_vec(),
    }
}

/// Builds and validates a batch from `d` (values: NumPy arrays or `("bfloat16", bits)`).
/// An array's shape (bfloat16 comes as `("bfloat16", uint16 bits)`).
fn shape_of(v: &Bound<'_, PyAny>) -> Option<Vec<usize>> {
    let arr = match v.cast::<pyo3::types::PyTuple>() {
        Ok(t) => t.get_item(1).ok()?,
        Err(_) => v.clone(),
    };
    arr.getattr("shape").ok()?.extract::<Vec<usize>>().ok()
}

/// Whether the drop-in's tensors need the whole batch as `analyze` reads it (the rollout's
/// top-K, or per-sequence `[B]` advantages beside a `[B, T]` mask) rather than the borrowed
/// step.
pub fn needs_whole(d: &Bound<'_, PyDict>) -> PyResult<bool> {
    let given = |n: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(d.get_item(n)?.filter(|v| !v.is_none()))
    };
    for t in tensors::TENSORS.iter().filter(|t| t.shape == Shape::TokenK) {
        if given(t.name)?.is_some() {
            return Ok(true);
        }
    }
    // a framework's name for a tensor: renamed as a batch file's names are
    for (k, v) in d.iter() {
        let name = k.extract::<String>()?;
        if !v.is_none() && tensors::spec(&name).is_none() {
            return Ok(true);
        }
    }
    let adv = given("advantages")?.and_then(|a| shape_of(&a));
    let mask = given("response_mask")?.and_then(|m| shape_of(&m));
    Ok(matches!((adv.as_deref(), mask.as_deref()), (Some([b]), Some([b2, _])) if b == b2))
}

/// Every tensor in the batch's token shape `tshape` (`[B, T]` or `[N]`; top-K and logits with
/// one more axis; with `per_row_advantages`, TRL's `[B]` advantages): equal element counts in
/// another shape are an error naming the tensor, never a silent reshape. `logits` are the
/// (name, object) of the logits given.
pub fn check_shapes(
    arrs: &BTreeMap<&str, Arr<'_>>,
    logits: &[(&str, &Bound<'_, PyAny>)],
    tshape: &[usize],
    per_row_advantages: bool,
) -> PyResult<()> {
    let mut shapes: Vec<(&str, Vec<usize>, Option<&str>)> = Vec::new();
    for t in &tensors::TENSORS {
        let Some(a) = arrs.get(t.name) else { continue };
        match t.shape {
            Shape::Token | Shape::TokenOrSeq => shapes.push((t.name, a.shape(), None)),
            Shape::TokenK => shapes.push((t.name, a.shape(), Some("K"))),
            Shape::TokenLK => shapes.push((t.name, a.shape(), Some("L, K"))),
            _ => {}
        }
    }
    for (name, v) in logits {
        if let Some(s) = shape_of(v) {
            shapes.push((name, s, Some("V")));
        }
    }
    for (name, shape, extra) in shapes {
        let fits = match extra {
            Some(axes) => {
                let more = axes.split(',').count();
                shape.len() == tshape.len() + more && shape[..tshape.len()] == *tshape
            }
            None => {
                shape == tshape
                    || (per_row_advantages
                        && tensors::spec(name).is_some_and(|t| t.shape == Shape::TokenOrSeq)
                        && tshape.len() == 2
                        && shape == tshape[..1])
            }
        };
        if !fits {
            let want = match extra {
                Some(axis) => format!("{tshape:?} + [{axis}]"),
                None => format!("{tshape:?}"),
            };
            return Err(to_py(Error::input(
                name,
                format!("shape {shape:?} does not match the batch layout {want}"),
            )));
        }
    }
    Ok(())
}

/// Both sides' routed experts (`[.., L, K]`, shapes checked by [`check_shapes`]) with
/// `(L, K)`, when given; one side alone, or `[L, K]` that differ, is an error naming the tensor.
pub fn routed_experts<'a>(
    arrs: &'a BTreeMap<&str, Arr<'_>>,
) -> PyResult<Option<(ExpertIds<'a>, ExpertIds<'a>, usize, usize)>> {
    use trmask::routing::{OLD, ROLLOUT};
    match (arrs.get(ROLLOUT), arrs.get(OLD)) {
        (Some(r), Some(o)) => {
            let (rs, os) = (r.shape(), o.shape());
            let lk = |s: &[usize]| s[s.len().saturating_sub(2)..].to_vec();
            if rs.len() < 2 || lk(&rs) != lk(&os) {
                return Err(to_py(Error::input(
                    OLD,
                    format!("shape {os:?} disagrees with {ROLLOUT}'s {rs:?} (the same [L, K])"),
                )));
            }
            let (l, k) = (rs[rs.len() - 2], rs[rs.len() - 1]);
            Ok(Some((r.experts(ROLLOUT)?, o.experts(OLD)?, l, k)))
        }
        (None, None) => Ok(None),
        (r, _) => {
            let (missing, given) = if r.is_none() {
                (ROLLOUT, OLD)
            } else {
                (OLD, ROLLOUT)
            };
            Err(to_py(Error::input(
                missing,
                format!("is missing: it is required with {given}"),
            )))
        }
    }
}

pub fn from_dict(d: &Bound<'_, PyDict>, all_valid: bool) -> PyResult<(Batch, Renames)> {
    let mut objs: BTreeMap<String, Bound<'_, PyAny>> = BTreeMap::new();
    for (k, v) in d.iter() {
        if !v.is_none() {
            objs.insert(k.extract::<String>()?, v);
        }
    }
    // the Python API's argument names (`trainer_logits` for `old_logits`)
    for (arg, target) in tensors::PYTHON_NAMES {
        if let Some(t) = objs.remove(arg) {
            if objs.contains_key(target) {
                return Err(to_py(Error::input(
                    target,
                    format!("is ambiguous: `{target}` and `{arg}` both hold it; keep one"),
                )));
            }
            objs.insert(target.into(), t);
        }
    }
    let known = known();
    let renames = trmask::io::names::apply(&mut objs, &known).map_err(to_py)?;
    let mut arrs: BTreeMap<&str, Arr<'_>> = BTreeMap::new();
    for name in tensors::names_where(|t| t.role != Role::Logits) {
        if let Some(v) = objs.get(name) {
            arrs.insert(name, Arr::borrow(name, v)?);
        }
    }
    let token_shape = tensors::token_shape_sources()
        .iter()
        .find_map(|n| arrs.get(n).map(Arr::shape))
        .or_else(|| {
            tensors::logits_names()
                .into_iter()
                .find_map(|n| objs.get(n))
                .and_then(|l| l.getattr("shape").ok()?.extract::<Vec<usize>>().ok())
                .filter(|s| s.len() >= 2)
                .map(|s| s[..s.len() - 1].to_vec())
        });
    let mut batch = if let Some(cu) = arrs.get("cu_seqlens") {
        if arrs.contains_key("response_mask") {
            return Err(to_py(Error::input(
                "response_mask",
                "cannot be combined with cu_seqlens (packed layout has no padding)",
            )));
        }
        Batch::packed(cu.ids("cu_seqlens")?)
    } else {
        let shape = token_shape.clone().ok_or_else(|| {
            to_py(Error::input(
                "rollout_log_prob",
                "is missing: no per-token tensor found (need log-probs or logits)",
            ))
        })?;
        // the mask, when given, fixes [B, T]; every other tensor is checked against it below
        let mask_shape = arrs.get("response_mask").map(Arr::shape);
        match (
            arrs.get("response_mask"),
            mask_shape.as_deref().unwrap_or(&shape),
        ) {
            (Some(m), [b, t]) => Batch::padded(*b, *t, &mask_f64(m.mask("response_mask")?)),
            (Some(m), _) => Err(Error::input(
                "response_mask",
                format!("must be 2-D [B, T], got shape {:?}", m.shape()),
            )),
            (None, _) if !all_valid => Err(Error::input(
                "response_mask",
                format!(
                    "and cu_seqlens are both missing: the layout of the {shape:?} batch must be \
                     given (response_mask for a padded batch, cu_seqlens for a packed one), or \
                     pass all_valid=True if every slot is a valid token"
                ),
            )),
            (None, [b, t]) => Batch::padded(*b, *t, &vec![1.0; b * t]),
            (None, [n]) => Batch::packed(&[0, *n as i64]),
            (None, other) => Err(Error::input(
                "rollout_log_prob",
                format!("shape {other:?} is neither [B, T] nor [N]"),
            )),
        }
    }
    .map_err(to_py)?;
    let tshape = batch.token_shape();
    let logits: Vec<(&str, &Bound<'_, PyAny>)> = tensors::logits_names()
        .into_iter()
        .filter_map(|n| objs.get(n).map(|v| (n, v)))
        .collect();
    check_shapes(&arrs, &logits, &tshape, true)?;
    for name in tensors::per_token_values() {
        if let Some(a) = arrs.get(name) {
            let mut v = a.to_f64(name)?;
            // TRL's advantages are per sequence, [B]: one value for every token of the row.
            if let ("advantages", [b, t]) = (name, tshape.as_slice()) {
                if a.shape() == [*b] {
                    v = v.iter().flat_map(|&x| std::iter::repeat_n(x, *t)).collect();
                }
            }
            batch = batch.with_log_probs(name, v).map_err(to_py)?;
        }
    }
    if let Some(a) = arrs.get("responses") {
        batch = batch
            .with_responses(a.ids("responses")?.to_vec())
            .map_err(to_py)?;
    }
    if let Some(a) = arrs.get("uid") {
        batch = batch.with_uid(a.ids("uid")?.to_vec()).map_err(to_py)?;
    }
    for name in tensors::logits_names() {
        if let Some(v) = objs.get(name) {
            let l = arrays::logits(name, v)?;
            batch = batch.with_logits(name, l).map_err(to_py)?;
        }
    }
    match (
        arrs.get("rollout_topk_ids"),
        arrs.get("rollout_topk_log_prob"),
    ) {
        (Some(ids), Some(lp)) => {
            let k = ids.shape().last().copied().unwrap_or(0);
            let ids = ids.ids("rollout_topk_ids")?.to_vec();
            let lp = lp.to_f64("rollout_topk_log_prob")?;
            batch = batch.with_topk(ids, lp, k).map_err(to_py)?;
        }
        (None, None) => {}
        (ids, _) => {
            let missing = if ids.is_none() {
                "rollout_topk_ids"
            } else {
                "rollout_topk_log_prob"
            };
            return Err(to_py(Error::input(
                missing,
                "is missing: the rollout top-K needs both ids and log-probs",
            )));
        }
    }
    if let Some((r, o, l, k)) = routed_experts(&arrs)? {
        batch = batch.with_routed_experts(r, o, l, k).map_err(to_py)?;
    }
    let (ids_name, off_name) = (trmask::kept_set::IDS, trmask::kept_set::OFFSETS);
    match (arrs.get(ids_name), arrs.get(off_name)) {
        (Some(ids), Some(off)) => {
            let ids = ids.ids(ids_name)?.to_vec();
            batch = batch
                .with_kept_sets(ids, off.ids(off_name)?)
                .map_err(to_py)?;
        }
        (None, None) => {}
        (ids, _) => {
            let (missing, given) = if ids.is_none() {
                (ids_name, off_name)
            } else {
                (off_name, ids_name)
            };
            return Err(to_py(Error::input(
                missing,
                format!("is missing: it is required with {given}"),
            )));
        }
    }
    Ok((batch.build().map_err(to_py)?, renames))
}
