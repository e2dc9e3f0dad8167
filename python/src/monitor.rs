//! What `trmask.Monitor` writes, by the command line's own code: the `--metrics-jsonl` line,
//! the trend page (`trmask report --jsonl`), one step's report page (`trmask report`), and the
//! bin edges of the histograms the correction fills.

use crate::{batch, config, engine, to_py};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;

/// The line `trmask analyze --metrics-jsonl` appends for `metrics` (newline included).
#[pyfunction]
pub fn metrics_line(input: &str, step: f64, metrics: BTreeMap<String, f64>) -> PyResult<String> {
    let line = trmask::io::metrics_line(input, step, &metrics).map_err(to_py)?;
    String::from_utf8(line).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The trend page of a run (`trmask report --jsonl RUN -o page.html`) from the JSONL's text;
/// `name` names the run in the page and in errors.
#[pyfunction]
pub fn trend_html(jsonl: &str, name: &str) -> PyResult<String> {
    let steps = trmask::trend::parse_jsonl(jsonl, name).map_err(to_py)?;
    Ok(trmask::report::render_trend_html(&steps, name))
}

/// The report page of one step (`trmask report INPUT -o page.html`) given as a batch dict,
/// with the data's warning lines.
#[pyfunction]
pub fn report_html<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyDict>,
    config_json: &str,
    backend: crate::PyBackend,
    name: &str,
) -> PyResult<(String, Vec<String>)> {
    crate::arrays::reset_borrows();
    let cfg = config(config_json)?;
    let (eng, _) = engine(py, backend)?;
    let (b, _) = batch::from_dict(tensors, false)?;
    let a = py
        .detach(|| trmask::analysis::analyze(eng.as_ref(), &b, &cfg))
        .map_err(to_py)?;
    let warnings = trmask::report::warnings(&trmask::report::WarningInputs {
        batch: &b,
        analysis: &a,
        config: &cfg,
        temperature_flag: false,
    });
    let mut sources = Vec::new();
    for (k, v) in tensors.iter() {
        if v.is_none() {
            continue;
        }
        let k: String = k.extract()?;
        let dtype = v
            .getattr("dtype")
            .map(|d| d.to_string())
            .unwrap_or_else(|_| "bfloat16".into());
        sources.push((k.clone(), k, dtype));
    }
    let engine_name = eng.name();
    let s = trmask::report::Subject {
        input: name,
        batch: &b,
        sources: &sources,
        config: &cfg,
        preset: None,
        analysis: &a,
        engine: &engine_name,
        warnings: &warnings,
        decode: None,
    };
    Ok((trmask::report::render_html(&s), warnings))
}

/// The bin edges (`BINS + 1`, value space) of every histogram the correction fills.
#[pyfunction]
pub fn hist_edges() -> Vec<f64> {
    trmask::partial::hist::Hist::edges()
}
