//! Logits tensors `[rows, vocab]` kept in their own dtype (f32, f16, bf16), never widened as a
//! whole: host bytes (owned or a memory map) or a buffer on a wgpu device.
//!
//! Device-resident logits ([`Logits::device`]) are what a wgpu-based stack already holds: the
//! GPU engine ([`crate::GpuEngine`]) binds that buffer directly — no copy, no read-back — when
//! the engine's context shares the buffer's device ([`crate::gpu::Context::from_wgpu`]). The
//! CPU engine has no access to device memory: it returns [`Error::InvalidInput`] naming the
//! tensor (read the logits back yourself and use [`Logits::from_bytes`] if you need the CPU
//! reference). Host-only accessors ([`Logits::bytes`], [`Logits::row_bytes`]) see no bytes for
//! device logits; [`Logits::host_bytes`] says so as an error.
//!
//! Layer L0: depends only on `error.rs` (and wgpu for the device variant).

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
    Device(DeviceLogits),
    Shared(SharedBytes),
}

/// Host bytes owned by someone else (see [`Logits::from_shared`]).
#[derive(Clone)]
struct SharedBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", (*self.0).as_ref().len())
    }
}

/// Where device-resident logits live: a wgpu buffer and the byte offset of element 0.
#[derive(Clone, Debug)]
pub struct DeviceLogits {
    buffer: wgpu::Buffer,
    offset: u64,
}

impl DeviceLogits {
    /// The buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
    /// Byte offset of element 0 in the buffer.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// True if the buffer can be bound as a storage buffer (needed by the GPU engine).
    pub fn is_storage(&self) -> bool {
        self.buffer.usage().contains(wgpu::BufferUsages::STORAGE)
    }
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

    /// Logits viewing host bytes that `owner` keeps alive (zero copy): little-endian `dtype`
    /// values, row-major `[rows, vocab]`. The Python bindings wrap a NumPy array or a CPU
    /// torch tensor this way; the bytes must not change while the logits are in use.
    pub fn from_shared(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        dtype: DType,
        rows: usize,
        vocab: usize,
    ) -> Result<Self> {
        check_logits_size((*owner).as_ref().len(), dtype, rows, vocab)?;
        Ok(Logits {
            storage: Storage::Shared(SharedBytes(owner)),
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

    /// Logits in a wgpu buffer: row-major `[rows, vocab]` little-endian values of `dtype`
    /// (16-bit types two per 32-bit word) starting `offset` bytes into `buffer` (a multiple of
    /// the element size). The buffer needs `BufferUsages::STORAGE` for the GPU engine, which
    /// binds it in place (windows of it when it exceeds one binding); see the module docs.
    pub fn device(
        buffer: wgpu::Buffer,
        offset: u64,
        dtype: DType,
        rows: usize,
        vocab: usize,
    ) -> Result<Self> {
        if vocab == 0 {
            return Err(Error::input("logits", "vocabulary size is 0"));
        }
        let len = (rows as u64)
            .checked_mul(vocab as u64)
            .and_then(|n| n.checked_mul(dtype.size() as u64));
        let end = len.and_then(|l| l.checked_add(offset));
        if !offset.is_multiple_of(dtype.size() as u64) {
            return Err(Error::input(
                "logits",
                format!(
                    "device offset {offset} is not a multiple of the {} element size",
                    dtype.name()
                ),
            ));
        }
        match end {
            Some(end) if end <= buffer.size() => Ok(Logits {
                storage: Storage::Device(DeviceLogits { buffer, offset }),
                dtype,
                rows,
                vocab,
            }),
            _ => Err(Error::input(
                "logits",
                format!(
                    "device buffer of {} bytes does not hold [{rows}, {vocab}] {} values from byte {offset}",
                    buffer.size(),
                    dtype.name()
                ),
            )),
        }
    }

    /// The device buffer of device-resident logits (`None` for host logits).
    pub fn on_device(&self) -> Option<&DeviceLogits> {
        match &self.storage {
            Storage::Device(d) => Some(d),
            _ => None,
        }
    }

    /// The raw little-endian bytes of host logits, or an error naming `tensor` for logits on
    /// a device (which have no host bytes).
    pub fn host_bytes(&self, tensor: &str) -> Result<&[u8]> {
        match &self.storage {
            Storage::Owned(v) => Ok(v),
            Storage::Mapped { map, offset, len } => Ok(&map[*offset..*offset + *len]),
            Storage::Shared(s) => Ok((*s.0).as_ref()),
            Storage::Device(_) => Err(Error::input(
                tensor,
                "is device-resident (Logits::device): only the GPU engine reads it; read it back \
                 into host logits for the CPU path",
            )),
        }
    }

    /// The raw little-endian bytes (empty for device-resident logits, see
    /// [`Logits::host_bytes`]).
    pub fn bytes(&self) -> &[u8] {
        self.host_bytes("logits").unwrap_or(&[])
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
    /// The bytes of row `r` (empty for device-resident logits).
    pub fn row_bytes(&self, r: usize) -> &[u8] {
        let w = self.vocab * self.dtype.size();
        self.bytes().get(r * w..(r + 1) * w).unwrap_or(&[])
    }
    /// Decodes row `r` into `out` (length V) as f64; NaN for device-resident logits (which
    /// every consumer rejects as a bad value rather than computing with).
    pub fn row_f64(&self, r: usize, out: &mut [f64]) {
        let b = self.row_bytes(r);
        if b.len() < out.len() * self.dtype.size() {
            out.fill(f64::NAN);
            return;
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dtype.decode(b, i) as f64;
        }
    }
}

pub(crate) fn check_logits_size(len: usize, dtype: DType, rows: usize, vocab: usize) -> Result<()> {
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
/// policy that sampled it). Ids outside the vocabulary are skipped (checked elsewhere), and so
/// are device-resident logits (the kernel reports the sampled log-prob instead).
pub(crate) fn impossible_sample(rollout: &Logits, ids: &[i64], mask: &[bool]) -> Option<usize> {
    if rollout.on_device().is_some() {
        return None;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_logits_have_bytes_and_rows() {
        let l = Logits::from_f32(&[1.0, 2.0, 3.0, 4.0], 2, 2).unwrap();
        assert!(l.on_device().is_none());
        assert_eq!(l.host_bytes("x").unwrap().len(), 16);
        let mut row = [0.0; 2];
        l.row_f64(1, &mut row);
        assert_eq!(row, [3.0, 4.0]);
        assert!(Logits::from_f32(&[1.0; 3], 2, 2).is_err());
    }
}
