//! `trmask._native`: the PyO3 extension behind the `trmask` Python package.
//!
//! Thin: every function borrows the caller's arrays ([`arrays`]), calls the library with the
//! GIL released, and returns plain dicts of f64 NumPy arrays that `trmask/__init__.py` turns
//! back into the caller's kind (NumPy or torch) and dtype. Library errors become `ValueError`
//! (bad input or config: the CLI's one-line message) or `RuntimeError` (anything else).

mod arrays;
mod batch;
mod exchange;
mod monitor;
mod outputs;

use arrays::{Arr, LAST_BORROWS};
use numpy::{PyArray1, PyArrayMethods, ToPyArray};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use trmask::backend::{open_engine, Backend};
use trmask::tensors::{self, Role, Shape};
use trmask::{CorrectionConfig, Corrector, Engine, Step};

/// A library error as a Python exception.
pub(crate) fn to_py(e: trmask::Error) -> PyErr {
    if e.is_user_error() {
        PyValueError::new_err(e.to_string())
    } else {
        PyRuntimeError::new_err(e.to_string())
    }
}

type Engines = Vec<(Backend, Arc<dyn Engine>, Vec<String>)>;

/// Engines opened so far (a GPU device is opened once per process).
static ENGINES: Mutex<Engines> = Mutex::new(Vec::new());

/// A `backend=` argument, parsed into [`Backend`] where it enters the extension: a name that is
/// not one is a `ValueError` naming `backend` before anything runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct PyBackend(Backend);

impl<'a, 'py> FromPyObject<'a, 'py> for PyBackend {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name: String = obj.extract()?;
        name.parse().map(PyBackend).map_err(to_py)
    }
}

fn engine(py: Python<'_>, backend: PyBackend) -> PyResult<(Arc<dyn Engine>, Vec<String>)> {
    let b = backend.0;
    let mut cache = ENGINES
        .lock()
        .map_err(|_| PyRuntimeError::new_err("engine cache poisoned"))?;
    if let Some((_, e, notes)) = cache.iter().find(|(k, _, _)| *k == b) {
        return Ok((e.clone(), notes.clone()));
    }
    let (e, notes) = py
        .detach(|| {
            let mut notes = Vec::new();
            open_engine(b, &mut notes).map(|e| (Arc::<dyn Engine>::from(e), notes))
        })
        .map_err(to_py)?;
    cache.push((b, e.clone(), notes.clone()));
    Ok((e, notes))
}

/// Correctors built so far, by `(config JSON, backend)`, most recently used last: a trainer
/// calls with one or two configs, so the config is parsed and resolved once, not per step.
static CORRECTORS: Mutex<Vec<CachedCorrector>> = Mutex::new(Vec::new());
/// `(config JSON, backend, (verl metrics only, histograms), corrector)`.
type CachedCorrector = (String, PyBackend, (bool, bool), Arc<Corrector>);
/// Correctors kept (least recently used dropped first).
const CORRECTOR_CACHE: usize = 8;

fn corrector(
    py: Python<'_>,
    config_json: &str,
    backend: PyBackend,
    (verl_only, histograms): (bool, bool),
) -> PyResult<Arc<Corrector>> {
    let poisoned = || PyRuntimeError::new_err("corrector cache poisoned");
    {
        let mut cache = CORRECTORS.lock().map_err(|_| poisoned())?;
        if let Some(i) = cache.iter().position(|(c, b, v, _)| {
            c == config_json && *b == backend && *v == (verl_only, histograms)
        }) {
            let hit = cache.remove(i);
            let c = hit.3.clone();
            cache.push(hit);
            return Ok(c);
        }
    }
    let cfg = config(config_json)?;
    let (eng, _) = engine(py, backend)?;
    let c = Arc::new(
        Corrector::new(eng, &cfg)
            .map_err(to_py)?
            .verl_metrics_only(verl_only)
            .histograms(histograms)
            .choose_executor_by_work(backend.0 == Backend::Auto),
    );
    let mut cache = CORRECTORS.lock().map_err(|_| poisoned())?;
    if cache.len() >= CORRECTOR_CACHE {
        cache.remove(0);
    }
    cache.push((
        config_json.to_string(),
        backend,
        (verl_only, histograms),
        c.clone(),
    ));
    Ok(c)
}

fn config(json: &str) -> PyResult<CorrectionConfig> {
    CorrectionConfig::from_json_str(json).map_err(to_py)
}

fn f64_array<'py>(py: Python<'py>, v: &[f64]) -> Bound<'py, PyArray1<f64>> {
    v.to_pyarray(py)
}

fn get<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(key)?.filter(|v| !v.is_none()))
}

/// verl's `compute_rollout_correction_and_rejection_mask` through [`Corrector`]: `tensors`
/// holds `old_log_prob`, `rollout_log_prob`, `response_mask` (padded `[B, T]`) or
/// `cu_seqlens` (packed) and optionally `log_prob`, `advantages`, `responses`, `uid`,
/// `rollout_logits`, `old_logits`.
/// `verl_only`: only verl's `rollout_corr/*` metrics (trmask's diagnostics not computed).
#[pyfunction]
#[pyo3(signature = (tensors, config_json, backend, verl_only=false))]
fn correct<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: PyBackend,
    verl_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    correct_with(py, tensors, config_json, backend, None, verl_only, None)
}

/// Whether the config gives IS weights (so `correct_into` needs a weights buffer), after
/// building (and caching) its corrector; also its `warning:` lines.
#[pyfunction]
#[pyo3(signature = (config_json, backend, verl_only=false))]
fn config_info(
    py: Python<'_>,
    config_json: &str,
    backend: PyBackend,
    verl_only: bool,
) -> PyResult<(bool, Vec<String>)> {
    // the hot path's corrector (no details, so no histograms): its first call finds it here
    let c = corrector(py, config_json, backend, (verl_only, false))?;
    Ok((c.has_weights(), c.config().warnings()))
}

/// [`correct`] (or, with `rank`/`size`/`all_gather`, [`correct_shard`]) writing the weights
/// and the modified mask into `weights_out` / `mask_out` (NumPy arrays of the step's slots the
/// caller allocated in verl's output dtypes): the returned dict has no `weights` / `mask`.
#[pyfunction]
#[pyo3(signature = (tensors, config_json, backend, verl_only, weights_out, mask_out, shard=None, with_details=true))]
#[allow(clippy::too_many_arguments)]
fn correct_into<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: PyBackend,
    verl_only: bool,
    weights_out: Option<Bound<'py, PyAny>>,
    mask_out: Bound<'py, PyAny>,
    shard: Option<(usize, usize, Py<PyAny>)>,
    with_details: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let ex = match shard {
        Some((rank, size, ag)) => Some(exchange::PyExchange::new(rank, size, ag)?),
        None => None,
    };
    let outs = (weights_out, mask_out, with_details);
    correct_with(py, tensors, config_json, backend, ex, verl_only, Some(outs))
}

/// [`correct`] on this rank's shard of a data-parallel batch: per-token weights and mask of
/// the shard's rows, metrics of the whole batch. `all_gather(bytes) -> list[bytes]` is a
/// collective over the `size` ranks (every rank's buffer in rank order); it is called with
/// the GIL held, the compute runs without it.
#[pyfunction]
#[pyo3(signature = (tensors, config_json, backend, rank, size, all_gather, verl_only=false))]
#[allow(clippy::too_many_arguments)]
fn correct_shard<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: PyBackend,
    rank: usize,
    size: usize,
    all_gather: Py<PyAny>,
    verl_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let ex = exchange::PyExchange::new(rank, size, all_gather)?;
    correct_with(py, tensors, config_json, backend, Some(ex), verl_only, None)
}

fn correct_with<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: PyBackend,
    ex: Option<exchange::PyExchange>,
    verl_only: bool,
    outs: Option<(Option<Bound<'py, PyAny>>, Bound<'py, PyAny>, bool)>,
) -> PyResult<Bound<'py, PyDict>> {
    arrays::reset_borrows();
    // the histograms are read only with the details (a shard's call always returns them)
    let histograms = outs.as_ref().is_none_or(|o| o.2);
    let corrector = corrector(py, config_json, backend, (verl_only, histograms))?;
    // the rollout's top-K or per-sequence advantages: the step as `analyze` reads it
    let whole = if batch::needs_whole(tensors)? {
        Some(batch::from_dict(tensors, false)?.0)
    } else {
        None
    };
    let (mut arrs, mut logit_objs, mut logits) = (BTreeMap::new(), Vec::new(), Vec::new());
    let step = match &whole {
        Some(b) => Step::batch(b),
        None => borrowed_step(tensors, &mut arrs, &mut logit_objs, &mut logits)?,
    };
    finish(py, corrector, step, ex, verl_only, outs)
}

/// The step of the caller's arrays, borrowed in place (`arrs`, `logit_objs`, `logits` hold
/// the borrows).
fn borrowed_step<'a, 'py>(
    tensors: &Bound<'py, PyDict>,
    arrs: &'a mut BTreeMap<&'static str, Arr<'py>>,
    logit_objs: &'a mut Vec<(&'static str, Bound<'py, PyAny>)>,
    logits: &'a mut Vec<(&'static str, trmask::Logits)>,
) -> PyResult<Step<'a>> {
    for t in tensors::TENSORS.iter().filter(|t| t.shape != Shape::TokenK) {
        if t.role == Role::Logits {
            continue;
        }
        if let Some(v) = get(tensors, t.name)? {
            arrs.insert(t.name, Arr::borrow(t.name, &v)?);
        }
    }
    for n in tensors::logits_names() {
        if let Some(v) = get(tensors, n)? {
            logits.push((n, arrays::logits(n, &v)?));
            logit_objs.push((n, v));
        }
    }
    let arrs: &'a BTreeMap<&'static str, Arr<'py>> = arrs;
    let logits: &'a Vec<(&'static str, trmask::Logits)> = logits;
    // the layout's token shape: every per-token tensor has it (logits one more axis), so equal
    // element counts in another shape are an error naming the tensor, never a reshape
    let tshape: Vec<usize> = match (arrs.get("cu_seqlens"), arrs.get("response_mask")) {
        (Some(cu), _) => {
            let n = cu.ids("cu_seqlens")?.last().copied().unwrap_or(0);
            vec![usize::try_from(n).unwrap_or(0)]
        }
        (None, Some(m)) => m.shape(),
        (None, None) => Vec::new(),
    };
    let objs: Vec<(&str, &Bound<'py, PyAny>)> = logit_objs.iter().map(|(n, v)| (*n, v)).collect();
    batch::check_shapes(arrs, &objs, &tshape, false)?;
    let mut step = match (arrs.get("cu_seqlens"), arrs.get("response_mask")) {
        (Some(cu), _) => {
            let s = Step::packed(cu.ids("cu_seqlens")?);
            match arrs.get("response_mask") {
                Some(m) => s.response_mask(m.mask("response_mask")?),
                None => s,
            }
        }
        (None, Some(m)) => {
            let shape = m.shape();
            let [b, t] = shape[..] else {
                return Err(to_py(trmask::Error::input(
                    "response_mask",
                    format!("must be 2-D [B, T], got shape {shape:?}"),
                )));
            };
            Step::padded(b, t).response_mask(m.mask("response_mask")?)
        }
        (None, None) => {
            return Err(to_py(trmask::Error::input(
                "response_mask",
                "is required (or cu_seqlens for a packed batch)",
            )))
        }
    };
    for (name, a) in arrs {
        step = match tensors::spec(name).map(|t| (t.role, t.shape)) {
            Some((Role::Values, _)) => step.values(name, a.values(name)?),
            Some((Role::Ids, Shape::Token | Shape::Seq | Shape::Flat | Shape::KeptOffsets)) => {
                step.ids(name, a.ids(name)?)
            }
            _ => Ok(step),
        }
        .map_err(to_py)?;
    }
    if let Some((r, o, l, k)) = batch::routed_experts(arrs)? {
        step = step.routed_experts(r, o, l, k);
    }
    match logits.as_slice() {
        [(_, r), (_, o)] => step = step.logits(r, o),
        [] => {}
        [(given, _)] => {
            let missing = tensors::logits_names()
                .into_iter()
                .find(|n| n != given)
                .unwrap_or_default();
            return Err(to_py(trmask::Error::input(
                missing,
                "is missing: logits come in pairs (rollout_logits and old_logits)",
            )));
        }
        _ => unreachable!("two logits tensors at most"),
    }
    Ok(step)
}

/// Corrects `step` into the caller's buffers (`outs`) or into new arrays.
fn finish<'py>(
    py: Python<'py>,
    corrector: Arc<Corrector>,
    step: Step<'_>,
    ex: Option<exchange::PyExchange>,
    verl_only: bool,
    outs: Option<(Option<Bound<'py, PyAny>>, Bound<'py, PyAny>, bool)>,
) -> PyResult<Bound<'py, PyDict>> {
    if let Some((w, m, with_details)) = outs {
        let mut wa = w
            .map(|w| outputs::OutArr::borrow("rollout_is_weights", &w))
            .transpose()?;
        let mut ma = outputs::OutArr::borrow("modified_response_mask", &m)?;
        let out = trmask::Outputs {
            weights: wa.as_mut().map(|w| w.weights()).transpose()?,
            mask: ma.mask()?,
        };
        let c = match ex {
            None => py
                .detach(|| corrector.correct_into(&step, out))
                .map_err(to_py)?,
            Some(mut ex) => {
                let r = py.detach(|| corrector.correct_shard_into(&step, out, &mut ex));
                r.map_err(|e| ex.take_error().unwrap_or_else(|| to_py(e)))?
            }
        };
        // the metrics verl's alone unless trmask's were asked for; the details only if asked
        let out = if with_details {
            details(py, &c)?
        } else {
            PyDict::new(py)
        };
        let d = PyDict::new(py);
        for (k, v) in &c.metrics {
            if !verl_only || k.starts_with("rollout_corr/") {
                d.set_item(k, v)?;
            }
        }
        out.set_item("metrics", d)?;
        // none without the details: the corrector above counted none
        histograms(py, &c, &out)?;
        return Ok(out);
    }
    let c = match ex {
        None => py.detach(|| corrector.correct(&step)).map_err(to_py)?,
        Some(mut ex) => {
            let r = py.detach(|| corrector.correct_shard(&step, &mut ex));
            r.map_err(|e| ex.take_error().unwrap_or_else(|| to_py(e)))?
        }
    };
    let out = details(py, &c)?;
    out.set_item("weights", c.weights.as_deref().map(|w| f64_array(py, w)))?;
    out.set_item("mask", f64_array(py, &c.mask))?;
    Ok(out)
}

/// The correction's histograms (`{name: counts}`, bins of `hist_edges`), when it has any.
fn histograms<'py>(
    py: Python<'py>,
    c: &trmask::Corrections,
    out: &Bound<'py, PyDict>,
) -> PyResult<()> {
    if c.histograms.is_empty() {
        return Ok(());
    }
    let h = PyDict::new(py);
    for (k, v) in &c.histograms {
        h.set_item(k, v.counts.to_pyarray(py))?;
    }
    out.set_item("histograms", h)
}

/// The decisions and metrics of a correction as a dict.
fn details<'py>(py: Python<'py>, c: &trmask::Corrections) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("seq_accept", c.seq_accept.to_pyarray(py))?;
    let seq_len: Vec<i64> = c.seq_len.iter().map(|&n| n as i64).collect();
    out.set_item("seq_len", seq_len.to_pyarray(py))?;
    out.set_item("seq_reject_bits", c.seq_reject_bits.to_pyarray(py))?;
    let criteria = PyDict::new(py);
    for cr in &c.criteria {
        criteria.set_item(&cr.name, f64_array(py, &cr.seq_stat))?;
    }
    out.set_item("criteria", criteria)?;
    out.set_item("metrics", metrics(py, &c.metrics)?)?;
    Ok(out)
}

fn metrics<'py>(py: Python<'py>, m: &BTreeMap<String, f64>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in m {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// Every output `trmask analyze` writes, for a batch given as arrays (`tensors`, trmask's or a
/// framework's names) or as a file (`path`).
#[pyfunction]
#[pyo3(signature = (tensors, config_json, backend, all_valid=false, path=None))]
fn analyze<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: PyBackend,
    all_valid: bool,
    path: Option<std::path::PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    arrays::reset_borrows();
    let cfg = config(config_json)?;
    let (eng, mut notes) = engine(py, backend)?;
    notes.extend(cfg.warnings());
    let batch = match path {
        Some(p) => {
            let opts = trmask::io::ReadOptions { all_valid };
            let input = py
                .detach(|| trmask::io::read_input(&p, &opts))
                .map_err(to_py)?;
            notes.extend(input.renames.note());
            input.batch
        }
        None => {
            let (b, renames) = batch::from_dict(tensors, all_valid)?;
            notes.extend(renames.note());
            b
        }
    };
    let a = py
        .detach(|| trmask::analysis::analyze(eng.as_ref(), &batch, &cfg))
        .map_err(to_py)?;
    let outputs = PyDict::new(py);
    for o in &a.outputs {
        let arr = f64_array(py, &o.data).reshape(o.shape.clone())?;
        outputs.set_item(&o.name, arr)?;
    }
    let out = PyDict::new(py);
    out.set_item("outputs", outputs)?;
    out.set_item("metrics", metrics(py, &a.metrics)?)?;
    out.set_item("notes", notes)?;
    Ok(out)
}

/// Exact vocabulary divergences per row of `[rows, V]` logits.
#[pyfunction]
#[pyo3(signature = (rollout_logits, trainer_logits, responses, mask, temperature, backend))]
fn vocab_divergence<'py>(
    py: Python<'py>,
    rollout_logits: &Bound<'py, PyAny>,
    trainer_logits: &Bound<'py, PyAny>,
    responses: Option<&Bound<'py, PyAny>>,
    mask: Option<&Bound<'py, PyAny>>,
    temperature: f64,
    backend: PyBackend,
) -> PyResult<Bound<'py, PyDict>> {
    arrays::reset_borrows();
    let r = arrays::logits("rollout_logits", rollout_logits)?;
    let t = arrays::logits("trainer_logits", trainer_logits)?;
    let ids = responses.map(|v| Arr::borrow("responses", v)).transpose()?;
    let ids = ids.as_ref().map(|a| a.ids("responses")).transpose()?;
    let mask: Vec<bool> = match mask {
        Some(m) => {
            let m = Arr::borrow("mask", m)?;
            match m.mask("mask")? {
                trmask::MaskValues::Bool(b) => b.to_vec(),
                _ => return Err(PyValueError::new_err("invalid input `mask`: must be bool")),
            }
        }
        None => vec![true; r.rows()],
    };
    let (eng, _) = engine(py, backend)?;
    let v = py
        .detach(|| eng.vocab_divergence(&r, &t, ids, &mask, temperature))
        .map_err(to_py)?;
    let out = PyDict::new(py);
    for (k, x) in [
        ("kl", &v.kl),
        ("kl_rev", &v.kl_rev),
        ("tv", &v.tv),
        ("rollout_entropy", &v.rollout_entropy),
        ("training_entropy", &v.training_entropy),
    ] {
        out.set_item(k, f64_array(py, x))?;
    }
    if ids.is_some() {
        out.set_item("rollout_log_prob", f64_array(py, &v.rollout_logp))?;
        out.set_item("training_log_prob", f64_array(py, &v.train_logp))?;
    }
    Ok(out)
}

/// Top-K divergences (docs/FORMAT.md, DPPO) of the rollout's top-K against the trainer's logits.
#[pyfunction]
fn topk_divergence<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    support: &str,
    temperature: f64,
    backend: PyBackend,
) -> PyResult<Bound<'py, PyDict>> {
    arrays::reset_borrows();
    let support = match support {
        "union" => trmask::topk::TopkSupport::Union,
        "replace_kth" => trmask::topk::TopkSupport::ReplaceKth,
        other => {
            return Err(PyValueError::new_err(format!(
                "invalid config `top_k_support`: {other:?} is not one of union, replace_kth"
            )))
        }
    };
    let (batch, _) = batch::from_dict(tensors, true)?;
    let logits = batch
        .old_logits()
        .cloned()
        .ok_or_else(|| PyValueError::new_err("invalid input `trainer_logits`: is missing"))?;
    let (eng, _) = engine(py, backend)?;
    let s = py
        .detach(|| {
            eng.topk_divergence(
                &batch,
                support,
                trmask::topk::TrainerTopk::Logits {
                    logits: &logits,
                    temperature,
                },
            )
        })
        .map_err(to_py)?;
    let out = PyDict::new(py);
    for (k, x) in [
        ("topk_kl", &s.topk_kl),
        ("topk_tv", &s.topk_tv),
        ("ddot_aggregated", &s.ddot_aggregated),
        ("ddot_uniform", &s.ddot_uniform),
        ("prob_diff", &s.prob_diff),
        ("rollout_tail", &s.rollout_tail),
        ("train_tail", &s.train_tail),
    ] {
        out.set_item(k, f64_array(py, x))?;
    }
    Ok(out)
}

/// The bounds inverted (`trmask bounds --target-error E --json`) as a JSON string.
#[pyfunction]
#[pyo3(signature = (horizon, target_error, eps=None))]
fn bounds_inverse(horizon: usize, target_error: f64, eps: Option<f64>) -> PyResult<String> {
    let inv = trmask::bounds_inverse::invert(target_error, horizon, eps).map_err(to_py)?;
    serde_json::to_string(&inv).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The TRM paper's bounds (`trmask bounds --json`) as a JSON string.
#[pyfunction]
#[pyo3(signature = (horizon, delta, eps=None, kl_seq=None, tv_seq=None, dbar=None))]
fn bounds(
    horizon: usize,
    delta: f64,
    eps: Option<f64>,
    kl_seq: Option<f64>,
    tv_seq: Option<f64>,
    dbar: Option<Vec<f64>>,
) -> PyResult<String> {
    let b = trmask::bounds::compute(&trmask::bounds::BoundInputs {
        horizon,
        delta,
        eps,
        kl_seq,
        tv_seq,
        dbar,
    })
    .map_err(to_py)?;
    serde_json::to_string(&b).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// A preset's config (verl's keys plus trmask's) as a JSON string.
#[pyfunction]
fn preset(name: &str) -> PyResult<String> {
    Ok(CorrectionConfig::preset(name)
        .map_err(to_py)?
        .to_json_value()
        .to_string())
}

/// The config's `warning:` lines ([`CorrectionConfig::warnings`]); the package raises them as
/// `UserWarning`s.
#[pyfunction]
fn config_warnings(config_json: &str) -> PyResult<Vec<String>> {
    Ok(config(config_json)?.warnings())
}

/// The data warnings (`(kind, line)`, the CLI's `warning:` lines about the data,
/// [`trmask::report::warnings`]) of one step given as the drop-in's tensors: the step is
/// analysed as `trmask analyze` analyses it.
#[pyfunction]
fn data_warnings<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: PyBackend,
) -> PyResult<Vec<(&'static str, String)>> {
    arrays::reset_borrows();
    let cfg = config(config_json)?;
    let (eng, _) = engine(py, backend)?;
    // on the CPU the fused pass where it serves (the warnings read no sweep), on the arrays
    // borrowed in place and the step's shape (layout and mask), as `trmask analyze` without
    // --output; else the engine's full path on the batch copied
    let (mut arrs, mut logit_objs, mut logits) = (BTreeMap::new(), Vec::new(), Vec::new());
    let step = match eng.is_gpu() || batch::needs_whole(tensors)? {
        true => None,
        false => Some(borrowed_step(
            tensors,
            &mut arrs,
            &mut logit_objs,
            &mut logits,
        )?),
    };
    let shape = step.as_ref().and_then(|s| s.shape());
    let fused = match (&step, shape) {
        (Some(s), Some(shape)) => py
            .detach(|| trmask::analysis::analyze_fused_unswept(s, shape.layout(), &cfg))
            .map_err(to_py)?
            .map(|a| (shape, a)),
        _ => None,
    };
    let (batch, a) = match fused {
        Some(done) => done,
        None => {
            let (batch, _) = batch::from_dict(tensors, false)?;
            let a = py
                .detach(|| trmask::analysis::analyze(eng.as_ref(), &batch, &cfg))
                .map_err(to_py)?;
            (batch, a)
        }
    };
    let lines = trmask::report::warnings(&trmask::report::WarningInputs {
        batch: &batch,
        analysis: &a,
        config: &cfg,
        temperature_flag: false,
    });
    Ok(lines
        .into_iter()
        .map(|l| (trmask::report::warning_kind(&l), l))
        .collect())
}

/// The group ids of string labels (verl's `uid`): [`trmask::io::label_id`] of each, the ids
/// the command line gives the same labels in JSON.
#[pyfunction]
fn label_ids(labels: Vec<String>) -> Vec<i64> {
    labels
        .iter()
        .map(|s| trmask::io::label_id(s) as i64)
        .collect()
}

/// Every preset name and alias.
#[pyfunction]
fn preset_names() -> Vec<&'static str> {
    CorrectionConfig::preset_names()
}

/// The engine a backend name opens (`cpu (2 threads)`, `gpu: …`) and what `auto` said.
#[pyfunction]
fn engine_name(py: Python<'_>, backend: PyBackend) -> PyResult<(String, Vec<String>)> {
    let (e, notes) = engine(py, backend)?;
    Ok((e.name(), notes))
}

/// `(name, role)` of every tensor name a batch dict may use: the tensor table's names, their
/// framework aliases and the Python argument names, so the package derives its roles from
/// the one table.
#[pyfunction]
fn tensor_roles() -> Vec<(&'static str, &'static str)> {
    // MoE routed experts are ids the Python layer keeps in int32 (engines record int32)
    let py_role = |t: &tensors::TensorSpec| match t.shape {
        Shape::TokenLK => "experts",
        _ => t.role.name(),
    };
    let role = |n: &str| tensors::spec(n).map_or("values", py_role);
    tensors::TENSORS
        .iter()
        .map(|t| (t.name, py_role(t)))
        .chain(tensors::aliases().map(|(a, target)| (a.source, role(target))))
        .chain(
            tensors::PYTHON_NAMES
                .iter()
                .map(|(a, target)| (*a, role(target))),
        )
        .collect()
}

/// The per-token tensors that fix the token shape, in the order they are consulted.
#[pyfunction]
fn token_shape_sources() -> Vec<&'static str> {
    tensors::token_shape_sources()
}

/// `(tensor, address, bytes)` of every array the last call borrowed (no-copy tests).
#[pyfunction]
fn last_borrows() -> Vec<(String, usize, usize)> {
    LAST_BORROWS.lock().map(|b| b.clone()).unwrap_or_default()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(correct, m)?)?;
    m.add_function(wrap_pyfunction!(correct_shard, m)?)?;
    m.add_function(wrap_pyfunction!(correct_into, m)?)?;
    m.add_function(wrap_pyfunction!(config_info, m)?)?;
    m.add_function(wrap_pyfunction!(analyze, m)?)?;
    m.add_function(wrap_pyfunction!(vocab_divergence, m)?)?;
    m.add_function(wrap_pyfunction!(topk_divergence, m)?)?;
    m.add_function(wrap_pyfunction!(bounds, m)?)?;
    m.add_function(wrap_pyfunction!(bounds_inverse, m)?)?;
    m.add_function(wrap_pyfunction!(preset, m)?)?;
    m.add_function(wrap_pyfunction!(preset_names, m)?)?;
    m.add_function(wrap_pyfunction!(config_warnings, m)?)?;
    m.add_function(wrap_pyfunction!(label_ids, m)?)?;
    m.add_function(wrap_pyfunction!(data_warnings, m)?)?;
    m.add_function(wrap_pyfunction!(monitor::metrics_line, m)?)?;
    m.add_function(wrap_pyfunction!(monitor::trend_html, m)?)?;
    m.add_function(wrap_pyfunction!(monitor::report_html, m)?)?;
    m.add_function(wrap_pyfunction!(monitor::hist_edges, m)?)?;
    m.add_function(wrap_pyfunction!(engine_name, m)?)?;
    m.add_function(wrap_pyfunction!(last_borrows, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_roles, m)?)?;
    m.add_function(wrap_pyfunction!(token_shape_sources, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
