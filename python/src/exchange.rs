//! [`PyExchange`]: trmask's [`Exchange`] over a Python callable, so that `torch.distributed`
//! (or any other transport the caller has) carries the partials between ranks.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use trmask::partial::Exchange;

/// All-gathers through `all_gather(bytes) -> list[bytes]`. The compute runs with the GIL
/// released; [`all_gather`](Exchange::all_gather) takes it only for the call. A Python
/// exception raised by the callable is kept and re-raised as is ([`take_error`](Self::take_error)).
pub(crate) struct PyExchange {
    rank: usize,
    size: usize,
    all_gather: Py<PyAny>,
    error: Option<PyErr>,
}

impl PyExchange {
    pub(crate) fn new(rank: usize, size: usize, all_gather: Py<PyAny>) -> PyResult<Self> {
        if size == 0 || rank >= size {
            return Err(PyValueError::new_err(format!(
                "invalid input `rank`: {rank} is not below the world size {size}"
            )));
        }
        Ok(PyExchange {
            rank,
            size,
            all_gather,
            error: None,
        })
    }

    /// The Python exception the callable raised (or its bad return value), if any.
    pub(crate) fn take_error(&mut self) -> Option<PyErr> {
        self.error.take()
    }

    fn call(&self, py: Python<'_>, local: &[u8]) -> PyResult<Vec<Vec<u8>>> {
        let out = self.all_gather.call1(py, (PyBytes::new(py, local),))?;
        let out = out.bind(py);
        let n = out.len()?;
        if n != self.size {
            return Err(PyValueError::new_err(format!(
                "invalid input `all_gather`: returned {n} buffers for {} ranks",
                self.size
            )));
        }
        let mut all = Vec::with_capacity(self.size);
        for item in out.try_iter()? {
            let item = item?;
            if let Ok(b) = item.cast::<PyBytes>() {
                all.push(b.as_bytes().to_vec());
            } else if let Ok(b) = item.cast::<PyByteArray>() {
                all.push(b.to_vec());
            } else {
                return Err(PyValueError::new_err(format!(
                    "invalid input `all_gather`: returned a {} where bytes were expected",
                    item.get_type().name()?
                )));
            }
        }
        if all.len() != self.size {
            return Err(PyValueError::new_err(format!(
                "invalid input `all_gather`: returned {} buffers for {} ranks",
                all.len(),
                self.size
            )));
        }
        Ok(all)
    }
}

impl Exchange for PyExchange {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&mut self, local: &[u8]) -> trmask::Result<Vec<Vec<u8>>> {
        Python::attach(|py| self.call(py, local)).map_err(|e| {
            let msg = e.to_string();
            self.error = Some(e);
            trmask::Error::input("all_gather", msg)
        })
    }
}
