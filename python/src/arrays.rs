//! Borrowing NumPy arrays (and CPU torch tensors, which the Python layer hands over as NumPy
//! views through DLPack) as the library's borrowed value types, without copying them.
//!
//! The Python layer passes every tensor as a C-contiguous NumPy array, bfloat16 as the tuple
//! `("bfloat16", uint16 view)` (NumPy has no bfloat16). Each borrow is recorded (name, address,
//! bytes) so the tests can prove that the library read the caller's own memory.

use half::{bf16, f16};
use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::{Arc, Mutex};
use trmask::{DType, Logits, MaskValues, Values};

/// `(tensor name, address of element 0, bytes)` of every array the last call borrowed.
pub static LAST_BORROWS: Mutex<Vec<(String, usize, usize)>> = Mutex::new(Vec::new());

/// Forgets the borrows of the previous call.
pub fn reset_borrows() {
    if let Ok(mut b) = LAST_BORROWS.lock() {
        b.clear();
    }
}

fn record(name: &str, addr: usize, bytes: usize) {
    if let Ok(mut b) = LAST_BORROWS.lock() {
        b.push((name.to_string(), addr, bytes));
    }
}

/// A read-only borrow of one NumPy array of a supported element type.
pub enum Arr<'py> {
    F64(PyReadonlyArrayDyn<'py, f64>),
    F32(PyReadonlyArrayDyn<'py, f32>),
    F16(PyReadonlyArrayDyn<'py, f16>),
    /// bfloat16 bits (the Python layer's `("bfloat16", uint16 view)`).
    BF16(PyReadonlyArrayDyn<'py, u16>),
    Bool(PyReadonlyArrayDyn<'py, bool>),
    U8(PyReadonlyArrayDyn<'py, u8>),
    I64(PyReadonlyArrayDyn<'py, i64>),
    /// int32: MoE routed experts only (the Python layer widens every other id tensor).
    I32(PyReadonlyArrayDyn<'py, i32>),
}

fn bad(name: &str, problem: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(trmask::Error::input(name, problem.to_string()).to_string())
}

/// The slice of a contiguous borrow (the Python layer makes non-contiguous inputs contiguous).
fn slice<'a, T: numpy::Element>(name: &str, a: &'a PyReadonlyArrayDyn<'_, T>) -> PyResult<&'a [T]> {
    let s = a.as_slice().map_err(|_| bad(name, "is not C-contiguous"))?;
    record(name, s.as_ptr() as usize, std::mem::size_of_val(s));
    Ok(s)
}

impl<'py> Arr<'py> {
    /// Borrows `obj` (a NumPy array, or `("bfloat16", uint16 array)`) named `name`.
    pub fn borrow(name: &str, obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(t) = obj.cast::<PyTuple>() {
            if t.len() == 2 && t.get_item(0)?.extract::<String>()? == "bfloat16" {
                let a = t.get_item(1)?;
                return match a.extract::<PyReadonlyArrayDyn<'py, u16>>() {
                    Ok(a) => Ok(Arr::BF16(a)),
                    Err(_) => Err(bad(name, "bfloat16 bits must be a uint16 array")),
                };
            }
        }
        macro_rules! try_as {
            ($($t:ty => $v:ident),+) => {
                $(if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'py, $t>>() {
                    return Ok(Arr::$v(a));
                })+
            };
        }
        try_as!(f64 => F64, f32 => F32, f16 => F16, bool => Bool, u8 => U8, i64 => I64, i32 => I32);
        let dtype = obj
            .getattr("dtype")
            .map(|d| d.to_string())
            .unwrap_or_else(|_| obj.get_type().to_string());
        Err(bad(name, format!("has unsupported type {dtype}")))
    }

    /// The array's shape.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Arr::F64(a) => a.shape().to_vec(),
            Arr::F32(a) => a.shape().to_vec(),
            Arr::F16(a) => a.shape().to_vec(),
            Arr::BF16(a) => a.shape().to_vec(),
            Arr::Bool(a) => a.shape().to_vec(),
            Arr::U8(a) => a.shape().to_vec(),
            Arr::I64(a) => a.shape().to_vec(),
            Arr::I32(a) => a.shape().to_vec(),
        }
    }

    /// Floating-point values (log-probs, advantages).
    pub fn values(&self, name: &str) -> PyResult<Values<'_>> {
        Ok(match self {
            Arr::F64(a) => Values::F64(slice(name, a)?),
            Arr::F32(a) => Values::F32(slice(name, a)?),
            Arr::F16(a) => Values::F16(slice(name, a)?),
            Arr::BF16(a) => Values::BF16(bytemuck::cast_slice::<u16, bf16>(slice(name, a)?)),
            _ => return Err(bad(name, "must be float64, float32, float16 or bfloat16")),
        })
    }

    /// A response mask: bool or 0/1 numbers.
    pub fn mask(&self, name: &str) -> PyResult<MaskValues<'_>> {
        Ok(match self {
            Arr::Bool(a) => MaskValues::Bool(slice(name, a)?),
            Arr::U8(a) => MaskValues::U8(slice(name, a)?),
            Arr::I64(a) => MaskValues::I64(slice(name, a)?),
            Arr::F32(a) => MaskValues::F32(slice(name, a)?),
            Arr::F64(a) => MaskValues::F64(slice(name, a)?),
            _ => {
                return Err(bad(
                    name,
                    "must be bool, uint8, int64, float32 or float64 (0/1)",
                ))
            }
        })
    }

    /// Integer ids (`responses`, `uid`, `cu_seqlens`, top-K ids).
    pub fn ids(&self, name: &str) -> PyResult<&[i64]> {
        match self {
            Arr::I64(a) => slice(name, a),
            _ => Err(bad(name, "must be an int64 array")),
        }
    }

    /// MoE routed experts, int32 or int64, borrowed as they are.
    pub fn experts(&self, name: &str) -> PyResult<trmask::routing::ExpertIds<'_>> {
        match self {
            Arr::I64(a) => Ok(slice(name, a)?.into()),
            Arr::I32(a) => Ok(slice(name, a)?.into()),
            _ => Err(bad(name, "must be an int32 or int64 array")),
        }
    }

    /// Values widened to f64 (for the library calls that take owned f64 vectors).
    pub fn to_f64(&self, name: &str) -> PyResult<Vec<f64>> {
        Ok(match self.values(name)? {
            Values::F64(v) => v.to_vec(),
            Values::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Values::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Values::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        })
    }
}

/// Keeps a NumPy array alive while the library reads its bytes.
struct PyOwned {
    _owner: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are only read; `_owner` keeps the array (and so the memory) alive, and
// `Py<PyAny>` itself is Send + Sync.
unsafe impl Send for PyOwned {}
unsafe impl Sync for PyOwned {}

impl AsRef<[u8]> for PyOwned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr/len describe the contiguous data of the array `_owner` keeps alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// `[..., V]` logits (float32, float16 or bfloat16) as [`Logits`] viewing the array's memory.
pub fn logits(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Logits> {
    let arr = Arr::borrow(name, obj)?;
    let shape = arr.shape();
    let (ptr, len, dtype, owner) = match &arr {
        Arr::F32(a) => {
            let s = slice(name, a)?;
            (
                s.as_ptr() as *const u8,
                std::mem::size_of_val(s),
                DType::F32,
                a.as_any(),
            )
        }
        Arr::F16(a) => {
            let s = slice(name, a)?;
            (
                s.as_ptr() as *const u8,
                std::mem::size_of_val(s),
                DType::F16,
                a.as_any(),
            )
        }
        Arr::BF16(a) => {
            let s = slice(name, a)?;
            (
                s.as_ptr() as *const u8,
                std::mem::size_of_val(s),
                DType::BF16,
                a.as_any(),
            )
        }
        _ => return Err(bad(name, "must be float32, float16 or bfloat16 logits")),
    };
    let Some((&vocab, lead)) = shape.split_last() else {
        return Err(bad(
            name,
            "must have at least one dimension (the vocabulary)",
        ));
    };
    let rows = lead.iter().product();
    let owned = PyOwned {
        _owner: owner.clone().unbind(),
        ptr,
        len,
    };
    Logits::from_shared(Arc::new(owned), dtype, rows, vocab).map_err(|e| {
        // the library names the tensor `logits`; name the caller's argument instead
        crate::to_py(match e {
            trmask::Error::InvalidInput { tensor, problem } if tensor == "logits" => {
                trmask::Error::input(name, problem)
            }
            other => other,
        })
    })
}
