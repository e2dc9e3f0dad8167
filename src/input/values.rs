//! Borrowed trainer tensors in their own dtype, and caller-owned output buffers (layer 0).
//!
//! [`Values`] and [`MaskValues`] borrow the trainer's log-probs and response mask without a
//! copy; [`WeightsOut`] and [`MaskOut`] are the buffers
//! [`Corrector::correct_into`](crate::Corrector::correct_into) writes the IS weights and the
//! modified response mask into (allocated once by the caller, in verl's output dtypes).

use crate::error::{Error, Result};
use half::{bf16, f16};

/// Borrowed per-token values in the trainer's own dtype.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
}

/// Asks the CPU to start loading `v[start..end]` into its caches (a hint: no effect on
/// results; a no-op off x86-64 and for an empty or out-of-range span).
#[inline]
fn prefetch<T>(v: &[T], start: usize, end: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(span) = v.get(start..end.min(v.len())) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(span);
        let p = span.as_ptr().cast::<i8>();
        for off in (0..bytes).step_by(64) {
            // SAFETY: `p + off` lies inside `span`; a prefetch never faults or writes.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, start, end);
}

impl Values<'_> {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F64(v) => v.len(),
            Values::F32(v) => v.len(),
            Values::BF16(v) => v.len(),
            Values::F16(v) => v.len(),
        }
    }
    /// True when there is no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub(crate) fn to_f64(self) -> Vec<f64> {
        match self {
            Values::F64(v) => v.to_vec(),
            Values::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Values::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Values::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }
    /// Starts loading values `start..end` into the caches (see [`prefetch`]).
    #[inline]
    pub(crate) fn prefetch(&self, start: usize, end: usize) {
        match self {
            Values::F64(v) => prefetch(v, start, end),
            Values::F32(v) => prefetch(v, start, end),
            Values::BF16(v) => prefetch(v, start, end),
            Values::F16(v) => prefetch(v, start, end),
        }
    }
    /// Values `start..start + out.len()` widened (exactly) into `out`.
    #[inline(always)]
    pub(crate) fn load(&self, start: usize, out: &mut [f64]) {
        let end = start + out.len();
        match self {
            Values::F64(v) => out.copy_from_slice(&v[start..end]),
            Values::F32(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, &x)| *o = x as f64),
            Values::BF16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, x)| *o = x.to_f64()),
            Values::F16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, x)| *o = x.to_f64()),
        }
    }
}

/// A borrowed response mask: `bool`, or 0/1 numbers (anything else is an error).
#[derive(Clone, Copy, Debug)]
pub enum MaskValues<'a> {
    Bool(&'a [bool]),
    U8(&'a [u8]),
    I64(&'a [i64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
}

/// What [`MaskValues::load`] writes for a value that is neither 0 nor 1.
pub(crate) const MASK_BAD: u8 = 2;

impl MaskValues<'_> {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            MaskValues::Bool(m) => m.len(),
            MaskValues::U8(m) => m.len(),
            MaskValues::I64(m) => m.len(),
            MaskValues::F32(m) => m.len(),
            MaskValues::F64(m) => m.len(),
        }
    }
    /// True when there is no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub(crate) fn to_f64(self) -> Result<Vec<f64>> {
        let bad = |i: usize, v: String| {
            Error::input(
                "response_mask",
                format!("must hold 0 or 1, found {v} at index {i}"),
            )
        };
        let num = |v: &mut dyn Iterator<Item = f64>| -> Result<Vec<f64>> {
            v.enumerate()
                .map(|(i, x)| {
                    if x == 0.0 || x == 1.0 {
                        Ok(x)
                    } else {
                        Err(bad(i, x.to_string()))
                    }
                })
                .collect()
        };
        match self {
            MaskValues::Bool(m) => Ok(m.iter().map(|&b| b as u8 as f64).collect()),
            MaskValues::U8(m) => num(&mut m.iter().map(|&x| x as f64)),
            MaskValues::I64(m) => num(&mut m.iter().map(|&x| x as f64)),
            MaskValues::F32(m) => num(&mut m.iter().map(|&x| x as f64)),
            MaskValues::F64(m) => num(&mut m.iter().copied()),
        }
    }
    /// Starts loading values `start..end` into the caches (see [`prefetch`]).
    #[inline]
    pub(crate) fn prefetch(&self, start: usize, end: usize) {
        match self {
            MaskValues::Bool(m) => prefetch(m, start, end),
            MaskValues::U8(m) => prefetch(m, start, end),
            MaskValues::I64(m) => prefetch(m, start, end),
            MaskValues::F32(m) => prefetch(m, start, end),
            MaskValues::F64(m) => prefetch(m, start, end),
        }
    }
    /// Every value as valid (1) or not (0), read a tile at a time; `None` on any other value.
    pub(crate) fn to_bools(self) -> Option<Vec<bool>> {
        let n = self.len();
        let mut mask = Vec::with_capacity(n);
        let mut tile = [0u8; 4096];
        let mut k = 0;
        while k < n {
            let len = tile.len().min(n - k);
            self.load(k, &mut tile[..len]);
            if tile[..len].iter().any(|&x| x > 1) {
                return None;
            }
            mask.extend(tile[..len].iter().map(|&x| x == 1));
            k += len;
        }
        Some(mask)
    }

    /// Values `start..start + out.len()` as 1 (valid), 0 (padding) or [`MASK_BAD`].
    #[inline(always)]
    pub(crate) fn load(&self, start: usize, out: &mut [u8]) {
        let end = start + out.len();
        fn num<T: Copy + PartialEq>(o: &mut [u8], v: &[T], zero: T, one: T) {
            o.iter_mut().zip(v).for_each(|(o, &x)| {
                *o = if x == one {
                    1
                } else if x == zero {
                    0
                } else {
                    MASK_BAD
                }
            })
        }
        match self {
            MaskValues::Bool(m) => out
                .iter_mut()
                .zip(&m[start..end])
                .for_each(|(o, &b)| *o = b as u8),
            MaskValues::U8(m) => num(out, &m[start..end], 0, 1),
            MaskValues::I64(m) => num(out, &m[start..end], 0, 1),
            MaskValues::F32(m) => num(out, &m[start..end], 0.0, 1.0),
            MaskValues::F64(m) => num(out, &m[start..end], 0.0, 1.0),
        }
    }
}

/// `From<&[T]>` for a borrowed-values enum, one variant per element type.
macro_rules! from_slices {
    ($enum:ident: $($t:ty => $variant:ident),+) => {
        $(impl<'a> From<&'a [$t]> for $enum<'a> {
            fn from(v: &'a [$t]) -> Self {
                $enum::$variant(v)
            }
        })+
    };
}

from_slices!(Values: f64 => F64, f32 => F32, bf16 => BF16, f16 => F16);
from_slices!(MaskValues: bool => Bool, u8 => U8, i64 => I64, f32 => F32, f64 => F64);

/// A caller-owned buffer for `rollout_is_weights`, one value per slot (verl returns them in
/// the log-probs' dtype: float64 or float32).
#[derive(Debug)]
pub enum WeightsOut<'a> {
    F64(&'a mut [f64]),
    F32(&'a mut [f32]),
}

/// A caller-owned buffer for `modified_response_mask`, one value per slot (verl returns it in
/// the response mask's dtype).
#[derive(Debug)]
pub enum MaskOut<'a> {
    Bool(&'a mut [bool]),
    U8(&'a mut [u8]),
    I64(&'a mut [i64]),
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
}

/// The output buffers of [`Corrector::correct_into`](crate::Corrector::correct_into): the
/// weights buffer is required exactly when the config has IS weights.
#[derive(Debug)]
pub struct Outputs<'a> {
    pub weights: Option<WeightsOut<'a>>,
    pub mask: MaskOut<'a>,
}

macro_rules! out_methods {
    ($enum:ident { $($variant:ident),+ }) => {
        impl<'a> $enum<'a> {
            /// The number of slots.
            pub fn len(&self) -> usize {
                match self {
                    $($enum::$variant(v) => v.len(),)+
                }
            }
            /// True when there is no slot.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
            /// A shorter-lived view of the same buffer.
            pub(crate) fn reborrow(&mut self) -> $enum<'_> {
                match self {
                    $($enum::$variant(v) => $enum::$variant(&mut **v),)+
                }
            }
            /// The buffer split at slot `mid` (disjoint halves for parallel writers).
            pub(crate) fn split_at(self, mid: usize) -> (Self, Self) {
                match self {
                    $($enum::$variant(v) => {
                        let (a, b) = v.split_at_mut(mid);
                        ($enum::$variant(a), $enum::$variant(b))
                    })+
                }
            }
        }
    };
}

out_methods!(WeightsOut { F64, F32 });
out_methods!(MaskOut {
    Bool,
    U8,
    I64,
    F32,
    F64
});

impl WeightsOut<'_> {
    /// Writes `src` at slots `start..start + src.len()` (rounded to the buffer's dtype).
    #[inline(always)]
    pub(crate) fn store(&mut self, start: usize, src: &[f64]) {
        let end = start + src.len();
        match self {
            WeightsOut::F64(o) => o[start..end].copy_from_slice(src),
            WeightsOut::F32(o) => o[start..end]
                .iter_mut()
                .zip(src)
                .for_each(|(o, &x)| *o = x as f32),
        }
    }
    /// Starts loading slots `start..end` into the caches before they are written.
    #[inline]
    pub(crate) fn prefetch(&self, start: usize, end: usize) {
        match self {
            WeightsOut::F64(o) => prefetch(o, start, end),
            WeightsOut::F32(o) => prefetch(o, start, end),
        }
    }
    /// Writes `x` at slots `start..start + n`.
    #[inline(always)]
    pub(crate) fn fill(&mut self, start: usize, n: usize, x: f64) {
        match self {
            WeightsOut::F64(o) => o[start..start + n].fill(x),
            WeightsOut::F32(o) => o[start..start + n].fill(x as f32),
        }
    }
}

impl MaskOut<'_> {
    /// Starts loading slots `start..end` into the caches before they are written.
    #[inline]
    pub(crate) fn prefetch(&self, start: usize, end: usize) {
        match self {
            MaskOut::Bool(o) => prefetch(o, start, end),
            MaskOut::U8(o) => prefetch(o, start, end),
            MaskOut::I64(o) => prefetch(o, start, end),
            MaskOut::F32(o) => prefetch(o, start, end),
            MaskOut::F64(o) => prefetch(o, start, end),
        }
    }
    /// Writes `src` (keep = true) at slots `start..start + src.len()`.
    #[inline(always)]
    pub(crate) fn store(&mut self, start: usize, src: &[bool]) {
        let end = start + src.len();
        fn put<T: Copy>(o: &mut [T], src: &[bool], one: T, zero: T) {
            o.iter_mut()
                .zip(src)
                .for_each(|(o, &k)| *o = if k { one } else { zero });
        }
        match self {
            MaskOut::Bool(o) => o[start..end].copy_from_slice(src),
            MaskOut::U8(o) => put(&mut o[start..end], src, 1, 0),
            MaskOut::I64(o) => put(&mut o[start..end], src, 1, 0),
            MaskOut::F32(o) => put(&mut o[start..end], src, 1.0, 0.0),
            MaskOut::F64(o) => put(&mut o[start..end], src, 1.0, 0.0),
        }
    }
    /// Writes "rejected" (0) at slots `start..start + n`.
    #[inline(always)]
    pub(crate) fn clear(&mut self, start: usize, n: usize) {
        let r = start..start + n;
        match self {
            MaskOut::Bool(o) => o[r].fill(false),
            MaskOut::U8(o) => o[r].fill(0),
            MaskOut::I64(o) => o[r].fill(0),
            MaskOut::F32(o) => o[r].fill(0.0),
            MaskOut::F64(o) => o[r].fill(0.0),
        }
    }
}
