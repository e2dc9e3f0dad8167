//! Caller-owned output buffers: NumPy arrays the Python layer allocates once (verl's output
//! dtypes) and the library writes the IS weights and the modified response mask into.

use numpy::PyReadwriteArrayDyn;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use trmask::{MaskOut, WeightsOut};

/// A writable borrow of one output array.
pub enum OutArr<'py> {
    F64(PyReadwriteArrayDyn<'py, f64>),
    F32(PyReadwriteArrayDyn<'py, f32>),
    Bool(PyReadwriteArrayDyn<'py, bool>),
    U8(PyReadwriteArrayDyn<'py, u8>),
    I64(PyReadwriteArrayDyn<'py, i64>),
}

fn bad(name: &str, problem: &str) -> PyErr {
    PyValueError::new_err(trmask::Error::input(name, problem).to_string())
}

fn contiguous(name: &str) -> PyErr {
    bad(name, "output buffer is not C-contiguous")
}

impl<'py> OutArr<'py> {
    /// Borrows `obj` (a writable, C-contiguous NumPy array) named `name`.
    pub fn borrow(name: &str, obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        macro_rules! try_as {
            ($($t:ty => $v:ident),+) => {
                $(if let Ok(a) = obj.extract::<PyReadwriteArrayDyn<'py, $t>>() {
                    return Ok(OutArr::$v(a));
                })+
            };
        }
        try_as!(f64 => F64, f32 => F32, bool => Bool, u8 => U8, i64 => I64);
        Err(bad(
            name,
            "output buffer must be a writable float64/float32/bool/uint8/int64 array",
        ))
    }

    /// The weights view (float64 or float32).
    pub fn weights(&mut self) -> PyResult<WeightsOut<'_>> {
        let name = "rollout_is_weights";
        Ok(match self {
            OutArr::F64(a) => WeightsOut::F64(a.as_slice_mut().map_err(|_| contiguous(name))?),
            OutArr::F32(a) => WeightsOut::F32(a.as_slice_mut().map_err(|_| contiguous(name))?),
            _ => return Err(bad(name, "output buffer must be float64 or float32")),
        })
    }

    /// The mask view.
    pub fn mask(&mut self) -> PyResult<MaskOut<'_>> {
        let name = "modified_response_mask";
        Ok(match self {
            OutArr::F64(a) => MaskOut::F64(a.as_slice_mut().map_err(|_| contiguous(name))?),
            OutArr::F32(a) => MaskOut::F32(a.as_slice_mut().map_err(|_| contiguous(name))?),
            OutArr::Bool(a) => MaskOut::Bool(a.as_slice_mut().map_err(|_| contiguous(name))?),
            OutArr::U8(a) => MaskOut::U8(a.as_slice_mut().map_err(|_| contiguous(name))?),
            OutArr::I64(a) => MaskOut::I64(a.as_slice_mut().map_err(|_| contiguous(name))?),
        })
    }
}
