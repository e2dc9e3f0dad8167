//! Reused upload slots for host logits streaming through a GPU op (vocabulary and top-K paths
//! alike): chunk `i` writes slot `i % n` once the submission that last read that slot has
//! finished, so at most `n` chunks (and their upload staging) are in flight and host memory
//! stays bounded, with no wait per chunk but for a slot's previous use. (Mesa's lavapipe runs a
//! dispatch inside `vkQueueSubmit`, so there the upload of chunk k + 1 follows chunk k's compute
//! instead of overlapping it; submitting from a helper thread measured no faster on two cores,
//! see BENCHMARKS.md.)

use crate::error::Result;
use crate::gpu::device::buffers::{BufferKind, GpuBuffer};
use crate::gpu::device::context::{Context, Submission};

/// The pool's buffers for streaming host data and kernel intermediates.
impl Context {
    /// A reusable storage buffer of `bytes` bytes for streaming host data to kernels with
    /// [`Context::write_slot`]: mapped for writing where the adapter shares the host's memory
    /// ([`crate::gpu::Capabilities::mapped_uploads`]), a plain storage buffer elsewhere.
    pub fn upload_slot(&self, bytes: u64) -> Result<GpuBuffer> {
        let kind = BufferKind::upload(self.caps.mapped_uploads);
        self.scoped(|| self.pool().get(self.device(), kind, bytes.div_ceil(4) * 4))
    }

    /// The persistent staging buffer of an [`Context::upload_slot`] of `bytes` bytes for
    /// [`Context::stage`] (mapped for writing, copied into the slot by the submission): `None`
    /// where slots are mapped themselves ([`crate::gpu::Capabilities::mapped_uploads`]).
    pub fn upload_staging(&self, bytes: u64) -> Result<Option<GpuBuffer>> {
        if self.caps.mapped_uploads {
            return Ok(None);
        }
        self.scoped(|| {
            let kind = BufferKind::UploadStaging;
            self.pool().get(self.device(), kind, bytes.div_ceil(4) * 4)
        })
        .map(Some)
    }

    /// A device-local storage buffer of `bytes` bytes for a kernel's intermediate results
    /// (never read back; its contents are undefined until a kernel writes them).
    pub fn scratch(&self, bytes: u64) -> Result<GpuBuffer> {
        let n = bytes.max(4).div_ceil(4) * 4;
        self.scoped(|| self.pool().get(self.device(), BufferKind::Storage, n))
    }
}

/// Upload slots per tensor: three, so that while the device computes chunk k the host can
/// already have chunk k + 1 queued and be writing chunk k + 2 (with two, writing k + 2 waits
/// for k to finish). A GPU call then holds about `3 · HOST_CHUNK_BYTES` of logits per tensor
/// in slots, plus as much in wgpu's staging where uploads are not mapped.
pub const UPLOAD_SLOTS: usize = 3;

/// Upload slots per tensor of the vocabulary kernel, whose chunks are [`Context::host_chunk_bytes`]
/// (64 MiB) each: two, so that the host fills chunk k + 1 while the device copies and computes
/// chunk k; a call then holds at most `2 · 2 · 64 MiB` of logits in slots (and as much in their
/// staging buffers where slots are not mapped).
pub const VOCAB_UPLOAD_SLOTS: usize = 2;

/// The last submission to read each of `n` slots.
#[derive(Debug, Default)]
pub struct SlotRing {
    last: Vec<Option<Submission>>,
}

impl SlotRing {
    /// A ring over `n` slots (at least one).
    pub fn new(n: usize) -> Self {
        SlotRing {
            last: vec![None; n.max(1)],
        }
    }

    /// The slot chunk `i` uses, after waiting for the submission that read it last.
    pub fn acquire(&mut self, ctx: &Context, i: usize) -> Result<usize> {
        let k = i % self.last.len();
        if let Some(sub) = self.last[k].take() {
            ctx.wait(&sub)?;
        }
        Ok(k)
    }

    /// Records that `sub` reads the slot of chunk `i`.
    pub fn release(&mut self, i: usize, sub: Submission) {
        let k = i % self.last.len();
        self.last[k] = Some(sub);
    }
}
