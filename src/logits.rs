//! Logits tensors: `[rows, vocab]` in their file dtype (f32, f16, bf16), memory-mapped or
//! owned, decoded row by row.

use crate::error::{Error, Result};
use std::sync::Arc;

/// Element type of a logits tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
    /// The safetensors name (`F32`, `F16`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
        }
    }
    /// Decodes element `i` of a little-endian byte slice.
    #[inline]
    pub fn decode(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            DType::F32 => {
                let o = 4 * i;
                f32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
            }
            DType::F16 => {
                let o = 2 * i;
                half::f16::from_bits(u16::from_le_bytes([bytes[o], bytes[o + 1]])).to_f32()
            }
            DType::BF16 => {
                let o = 2 * i;
                f32::from_bits((u16::from_le_bytes([bytes[o], bytes[o + 1]]) as u32) << 16)
            }
        }
    }
}

/// Where the bytes of a logits tensor live.
#[derive(Clone, Debug)]
enum Storage {
    Owned(Arc<Vec<u8>>),
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
}

/// A `[rows, vocab]` logits tensor (rows = `B·T` for padded batches, `N` for packed ones),
/// kept in its file dtype and never widened as a whole.
#[derive(Clone, Debug)]
pub struct Logits {
    storage: Storage,
    dtype: DType,
    rows: usize,
    vocab: usize,
}

impl Logits {
    /// Logits from f32 values, row-major `[rows, vocab]`.
    pub fn from_f32(values: &[f32], rows: usize, vocab: usize) -> Result<Self> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(bytes, DType::F32, rows, vocab)
    }

    /// Logits from little-endian bytes of the given dtype.
    pub fn from_bytes(bytes: Vec<u8>, dtype: DType, rows: usize, vocab: usize) -> Result<Self> {
        check_logits_size(bytes.len(), dtype, rows, vocab)?;
        Ok(Logits {
            storage: Storage::Owned(Arc::new(bytes)),
            dtype,
            rows,
            vocab,
        })
    }

    /// Logits viewing `len` bytes at `offset` of a memory map (zero copy).
    pub fn mapped(
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
        dtype: DType,
        rows: usize,
        vocab: usize,
    ) -> Result<Self> {
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(Error::input(
                "logits",
                "data range lies outside the file (truncated file?)",
            ));
        }
        check_logits_size(len, dtype, rows, vocab)?;
        Ok(Logits {
            storage: Storage::Mapped { map, offset, len },
            dtype,
            rows,
            vocab,
        })
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Owned(v) => v,
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
        }
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of rows (token slots).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// The bytes of row `r`.
    pub fn row_bytes(&self, r: usize) -> &[u8] {
        let w = self.vocab * self.dtype.size();
        &self.bytes()[r * w..(r + 1) * w]
    }
    /// Decodes row `r` into `out` (length V) as f64.
    pub fn row_f64(&self, r: usize, out: &mut [f64]) {
        let b = self.row_bytes(r);
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dtype.decode(b, i) as f64;
        }
    }
}

fn check_logits_size(len: usize, dtype: DType, rows: usize, vocab: usize) -> Result<()> {
    if vocab == 0 {
        return Err(Error::input("logits", "vocabulary size is 0"));
    }
    let want = rows
        .checked_mul(vocab)
        .and_then(|n| n.checked_mul(dtype.size()));
    if want != Some(len) {
        return Err(Error::input(
            "logits",
            format!(
                "{len} bytes do not hold [{rows}, {vocab}] {} values",
                dtype.name()
            ),
        ));
    }
    Ok(())
}

/// The first valid slot whose sampled id has a rollout logit of −∞ (probability 0 under the
/// policy that sampled it). Ids outside the vocabulary are skipped (checked elsewhere).
pub(crate) fn impossible_sample(rollout: &Logits, ids: &[i64], mask: &[bool]) -> Option<usize> {
    let v = rollout.vocab() as i64;
    (0..mask.len().min(ids.len()).min(rollout.rows())).find(|&r| {
        mask[r]
            && (0..v).contains(&ids[r])
            && rollout
                .dtype()
                .decode(rollout.row_bytes(r), ids[r] as usize)
                == f32::NEG_INFINITY
    })
}
