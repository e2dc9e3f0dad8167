//! A pool of device buffers reused across calls, by size class.
//!
//! Sizes are rounded up to a power of two (at least 256 bytes, capped at the device's maximum
//! buffer size); a [`GpuBuffer`] returns its buffer to the pool when dropped. Each buffer is
//! owned by one caller at a time (staging buffers included), so concurrent ops never share one.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};

/// What a pooled buffer is for (each kind has its own usages and free lists).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// Storage buffer (kernel input or output), copy source and destination.
    Storage,
    /// Host-readable staging buffer (map for reading, copy destination).
    Staging,
    /// Storage buffer the host maps for writing (`MAPPABLE_PRIMARY_BUFFERS`, unified memory).
    MappedStorage,
    /// Host-writable staging buffer (map for writing, copy source): the persistent staging of
    /// a [`BufferKind::Storage`] upload slot on adapters without mapped uploads.
    UploadStaging,
    /// Kernel output the host maps for reading in place, with no staging copy
    /// (`MAPPABLE_PRIMARY_BUFFERS`, unified memory).
    MappedOutput,
    /// Uniform buffer holding `Meta` structs.
    Uniform,
    /// Destination of resolved timestamp queries (copied to a staging buffer).
    QueryResolve,
}

impl BufferKind {
    /// The kind of a buffer streaming host data to kernels: mapped or written by the queue.
    pub fn upload(mapped: bool) -> Self {
        if mapped {
            BufferKind::MappedStorage
        } else {
            BufferKind::Storage
        }
    }

    /// The kind of a kernel output the host reads back: mapped and read in place, or copied
    /// to a staging buffer.
    pub fn output(mapped: bool) -> Self {
        if mapped {
            BufferKind::MappedOutput
        } else {
            BufferKind::Storage
        }
    }

    fn usages(self) -> wgpu::BufferUsages {
        match self {
            BufferKind::Storage => {
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST
            }
            BufferKind::Staging => wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            BufferKind::UploadStaging => {
                wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC
            }
            BufferKind::MappedStorage => {
                wgpu::BufferUsages::MAP_WRITE
                    | wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
            }
            BufferKind::MappedOutput => {
                wgpu::BufferUsages::MAP_READ
                    | wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST
            }
            BufferKind::Uniform => wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            BufferKind::QueryResolve => {
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC
            }
        }
    }
}

#[derive(Debug, Default)]
struct Free {
    lists: HashMap<(BufferKind, u64), Vec<wgpu::Buffer>>,
    bytes: u64,
}

/// The pool. Keeps at most `max_idle_bytes` of idle buffers.
#[derive(Debug)]
pub struct BufferPool {
    free: Arc<Mutex<Free>>,
    max_buffer_size: u64,
    max_idle_bytes: u64,
}

/// A buffer borrowed from the pool; returned on drop.
#[derive(Debug)]
pub struct GpuBuffer {
    buffer: Option<wgpu::Buffer>,
    kind: BufferKind,
    class: u64,
    /// Bytes the caller asked for (≤ the buffer's size).
    len: u64,
    free: Arc<Mutex<Free>>,
    max_idle_bytes: u64,
}

impl GpuBuffer {
    /// The wgpu buffer.
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("buffer present until drop")
    }
    /// Bytes requested (the binding size used by kernels).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True if zero bytes were requested.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Kind of the buffer.
    pub fn kind(&self) -> BufferKind {
        self.kind
    }
    /// Drops the buffer without returning it to the pool (after a failure it may still be
    /// mapped or in use).
    pub(crate) fn discard(mut self) {
        self.buffer = None;
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let (Some(b), Ok(mut free)) = (self.buffer.take(), self.free.lock()) {
            if free.bytes + self.class <= self.max_idle_bytes {
                free.bytes += self.class;
                free.lists
                    .entry((self.kind, self.class))
                    .or_default()
                    .push(b);
            }
        }
    }
}

/// Size class of a request: a power of two ≥ 256, or the 4-byte-rounded size itself when that
/// power of two would exceed `max_buffer_size`.
pub fn size_class(bytes: u64, max_buffer_size: u64) -> u64 {
    let want = bytes.max(256).div_ceil(4) * 4;
    let p = want.checked_next_power_of_two().unwrap_or(want);
    if p <= max_buffer_size {
        p
    } else {
        want
    }
}

impl BufferPool {
    /// A pool for a device whose buffers may be at most `max_buffer_size` bytes.
    pub fn new(max_buffer_size: u64) -> Self {
        BufferPool {
            free: Arc::default(),
            max_buffer_size,
            max_idle_bytes: 1 << 30,
        }
    }

    /// A buffer of at least `bytes` bytes (≥ 4), reused when one of its class is idle.
    pub(crate) fn get(
        &self,
        device: &wgpu::Device,
        kind: BufferKind,
        bytes: u64,
    ) -> crate::Result<GpuBuffer> {
        let class = size_class(bytes, self.max_buffer_size);
        if class > self.max_buffer_size {
            return Err(crate::Error::Gpu(format!(
                "buffer of {bytes} bytes exceeds the device maximum of {} bytes",
                self.max_buffer_size
            )));
        }
        let reused = self.free.lock().ok().and_then(|mut f| {
            let b = f.lists.get_mut(&(kind, class)).and_then(|l| l.pop());
            if b.is_some() {
                f.bytes -= class;
            }
            b
        });
        let buffer = match reused {
            Some(b) => b,
            None => device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("trmask pool"),
                size: class,
                usage: kind.usages(),
                mapped_at_creation: false,
            }),
        };
        Ok(GpuBuffer {
            buffer: Some(buffer),
            kind,
            class,
            len: bytes.max(4),
            free: self.free.clone(),
            max_idle_bytes: self.max_idle_bytes,
        })
    }

    /// Bytes held by idle buffers.
    pub fn idle_bytes(&self) -> u64 {
        self.free.lock().map(|f| f.bytes).unwrap_or(0)
    }
}

/// Whether host uploads should be mapped: the caller's choice, else on CPU and integrated
/// adapters, which share the host's memory (a mapped storage buffer is the memory the kernel
/// reads; on a discrete GPU it would be slow host-visible memory).
pub(crate) fn mapped_wanted(choice: Option<bool>, info: &wgpu::AdapterInfo) -> bool {
    choice.unwrap_or(matches!(
        info.device_type,
        wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu
    ))
}

/// Maps `buf` (a [`BufferKind::MappedStorage`] slot or a [`BufferKind::UploadStaging`]
/// buffer) for writing once the GPU has finished every submission that used it (callers wait
/// for the slot's last one first, so this does not block on later work), writes `parts` back
/// to back from byte 0 (their total a multiple of 4, at most the buffer's size) in place with
/// [`fill`] and unmaps it.
pub(crate) fn write_mapped(
    device: &wgpu::Device,
    buf: &GpuBuffer,
    parts: &[&[u8]],
) -> crate::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total == 0 {
        return Ok(());
    }
    if !total.is_multiple_of(4) || total as u64 > buf.raw().size() {
        return Err(crate::Error::Gpu(format!(
            "upload of {total} bytes into a {}-byte buffer (whole words that fit expected)",
            buf.raw().size()
        )));
    }
    let slice = buf.raw().slice(0..total as u64);
    let (tx, rx) = mpsc::channel();
    slice.map_async(wgpu::MapMode::Write, move |r| {
        let _ = tx.send(r);
    });
    if let Err(e) = await_callbacks(device, &rx, 1, None) {
        buf.raw().unmap(); // cancels a map still pending
        return Err(e);
    }
    match slice.get_mapped_range_mut() {
        Ok(mut view) => fill(view.slice(..), parts),
        Err(e) => {
            buf.raw().unmap();
            return Err(crate::Error::Gpu(format!("writing a mapped upload: {e}")));
        }
    }
    buf.raw().unmap();
    Ok(())
}

/// Bytes below which [`fill`] copies on the calling thread alone.
const FILL_SERIAL_BYTES: usize = 4 << 20;

/// Bytes each task of a parallel [`fill`] copies.
const FILL_PIECE: usize = 1 << 20;

/// Writes `parts` back to back from the start of `dst` (mapped memory, at least their total
/// long): one `memcpy` on the calling thread for small parts, else pieces of [`FILL_PIECE`]
/// bytes copied by the current rayon pool's threads — the pool's, never a thread spawned per
/// call; `ThreadPool::install` picks how many. Which thread copies which bytes changes nothing
/// in them.
pub(crate) fn fill(dst: wgpu::WriteOnly<'_, [u8]>, parts: &[&[u8]]) {
    use rayon::prelude::*;
    let parallel = rayon::current_num_threads() > 1;
    let mut rest = dst;
    for p in parts {
        let (mut head, tail) = rest.split_at(p.len());
        rest = tail;
        if !parallel || p.len() < FILL_SERIAL_BYTES {
            head.copy_from_slice(p);
            continue;
        }
        // whole pieces in parallel (a sized `WriteOnly<[u8; N]>` per task), the rest here
        let (pieces, mut last) = head.into_chunks::<FILL_PIECE>();
        let whole = p.len() / FILL_PIECE * FILL_PIECE;
        last.copy_from_slice(&p[whole..]);
        let pieces: Vec<wgpu::WriteOnly<'_, [u8; FILL_PIECE]>> = pieces.into_iter().collect();
        pieces
            .into_par_iter()
            .zip(p[..whole].par_chunks(FILL_PIECE))
            .for_each(|(d, src)| wgpu::WriteOnly::<[u8]>::from(d).copy_from_slice(src));
    }
}

/// Host bytes bound for an upload slot (`Context::stage`): written in place (a mapped slot)
/// or into the slot's staging buffer, then copied into the slot at the start of the submission
/// it is handed to (`Context::submit_staged`, `Context::run_each_staged`).
#[derive(Debug)]
pub struct Staged {
    /// Staging buffer, slot, bytes.
    pub(crate) copy: Option<(wgpu::Buffer, wgpu::Buffer, u64)>,
}

/// Writes `parts` into `staging` (a mapped [`BufferKind::UploadStaging`] buffer, see
/// [`write_mapped`]) and returns the copy of those bytes into `slot`.
pub(crate) fn stage_copy(
    device: &wgpu::Device,
    slot: &GpuBuffer,
    staging: &GpuBuffer,
    parts: &[&[u8]],
) -> crate::Result<Staged> {
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    if total > slot.raw().size() {
        return Err(crate::Error::Gpu(format!(
            "upload of {total} bytes into a {}-byte slot",
            slot.raw().size()
        )));
    }
    write_mapped(device, staging, parts)?;
    Ok(Staged {
        copy: (total > 0).then(|| (staging.raw().clone(), slot.raw().clone(), total)),
    })
}

/// Maps every buffer of `bufs` (staging buffers, or [`BufferKind::MappedOutput`] outputs read
/// in place) once submission `index` has finished and hands buffer `i`'s bytes to `f(i, bytes)`
/// in order (polling until every map callback has run: see [`await_callbacks`]). Every buffer
/// is unmapped again, also on failure (the caller then keeps its staging buffers out of the
/// pool); the first error, the driver's or `f`'s, is returned.
pub(crate) fn read_mapped(
    device: &wgpu::Device,
    index: wgpu::SubmissionIndex,
    bufs: &[&GpuBuffer],
    f: &mut dyn FnMut(usize, &[u8]) -> crate::Result<()>,
) -> crate::Result<()> {
    let (tx, rx) = mpsc::channel();
    for b in bufs {
        let tx = tx.clone();
        b.raw()
            .slice(0..b.len())
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
    }
    drop(tx);
    if let Err(e) = await_callbacks(device, &rx, bufs.len(), Some(index)) {
        bufs.iter().for_each(|b| b.raw().unmap()); // cancels maps still pending
        return Err(e);
    }
    let mut result = Ok(());
    for (i, b) in bufs.iter().enumerate() {
        if result.is_ok() {
            result = match b.raw().slice(0..b.len()).get_mapped_range() {
                Ok(view) => f(i, &view),
                Err(e) => Err(crate::Error::Gpu(format!("reading results: {e}"))),
            };
        }
        b.raw().unmap();
    }
    result
}

/// Polls `device` until `pending` map callbacks have reported on `rx` (the first poll waits for
/// `index`; without one it does not block, so a slot whose last use has finished maps without
/// waiting for later submissions — the next chunk's kernel keeps running while the host writes
/// this one). Another thread polling the same device (a shared
/// `Context` or the caller's own device) may run the callbacks on its thread after our own
/// `poll` has returned, so the callbacks — not the poll — say when we are done.
pub(crate) fn await_callbacks(
    device: &wgpu::Device,
    rx: &mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    mut pending: usize,
    index: Option<wgpu::SubmissionIndex>,
) -> crate::Result<()> {
    let poll = |p: wgpu::PollType| {
        device
            .poll(p)
            .map(|_| ())
            .map_err(|e| crate::Error::Gpu(format!("waiting for the device: {e}")))
    };
    let mut polled = poll(match index {
        Some(i) => wgpu::PollType::Wait {
            submission_index: Some(i),
            timeout: None,
        },
        None => wgpu::PollType::Poll,
    });
    while pending > 0 {
        std::mem::replace(&mut polled, Ok(()))?;
        match rx.recv_timeout(std::time::Duration::from_millis(1)) {
            Ok(Ok(())) => pending -= 1,
            Ok(Err(e)) => return Err(crate::Error::Gpu(format!("mapping a buffer failed: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) => polled = poll(wgpu::PollType::Poll),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(crate::Error::Gpu(
                    "mapping a buffer: callback dropped".into(),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_writes_parts_back_to_back_on_any_pool() {
        // parts below and above the parallel threshold, not multiples of a piece, a word tail
        let lens = [
            3usize,
            FILL_SERIAL_BYTES + FILL_PIECE / 2 + 5,
            0,
            4,
            2 * FILL_SERIAL_BYTES + 1,
        ];
        let parts: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let want = parts.concat();
        for threads in [1, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut dst = vec![0xAAu8; want.len() + 9];
            pool.install(|| fill(wgpu::WriteOnly::from_mut(&mut dst[..]), &refs));
            assert_eq!(&dst[..want.len()], &want[..], "{threads} threads");
            assert!(
                dst[want.len()..].iter().all(|&b| b == 0xAA),
                "past the parts"
            );
        }
    }

    #[test]
    fn size_classes() {
        assert_eq!(size_class(0, 1 << 30), 256);
        assert_eq!(size_class(257, 1 << 30), 512);
        assert_eq!(size_class(1 << 20, 1 << 30), 1 << 20);
        assert_eq!(size_class((1 << 29) + 4, 1 << 29 | 1 << 28), (1 << 29) + 4);
    }
}
