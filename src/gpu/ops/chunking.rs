//! Chunk planning: splitting work whose buffers would exceed the device's binding limits into
//! dispatches that fit. Pure arithmetic, no wgpu types, unit-tested on the CPU.

use crate::error::{Error, Result};
use std::ops::Range;

/// Alignment of chunk byte offsets (the strictest `min_storage_buffer_offset_alignment`).
pub const OFFSET_ALIGN: u64 = 256;

/// Largest upload of host logits per tensor per chunk (bytes, including the 4-byte pad). Host
/// logits stream through `slots::UPLOAD_SLOTS` (3) reused slots per tensor with as many chunks in
/// flight (the vocabulary and top-K kernels alike), so a GPU call holds about `6 · HOST_CHUNK_BYTES`
/// of logits (slots) plus, without mapped uploads, as much in wgpu's upload staging, whatever
/// the input size (one row is always allowed, even if larger).
pub const HOST_CHUNK_BYTES: u64 = 8 << 20;

/// A binding window `[offset, offset + size)` covering bytes `[first, end)` with an
/// [`OFFSET_ALIGN`]-aligned offset, and the index (in `elem`-byte units) of `first` inside it.
pub fn window(first: u64, end: u64, elem: u64) -> (u64, u64, u32) {
    let off = first / OFFSET_ALIGN * OFFSET_ALIGN;
    (
        off,
        end.div_ceil(4) * 4 - off,
        ((first - off) / elem) as u32,
    )
}

/// WebGPU's limit on workgroups per dispatch dimension.
pub const MAX_WORKGROUPS_PER_DIM: u32 = 65_535;

/// The limits a plan must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLimits {
    /// Largest byte size of any one binding (`min(max_storage_buffer_binding_size,
    /// max_buffer_size)`, or a smaller forced value).
    pub max_binding_bytes: u64,
    /// Workgroups per dispatch dimension (≤ 65,535).
    pub max_workgroups_per_dim: u32,
}

impl ChunkLimits {
    /// Limits with the given binding size and WebGPU's dispatch limit.
    pub fn new(max_binding_bytes: u64) -> Self {
        ChunkLimits {
            max_binding_bytes,
            max_workgroups_per_dim: MAX_WORKGROUPS_PER_DIM,
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Splits `rows` equal rows of `row_bytes` bytes each into consecutive chunks of whole rows,
/// each at most `limits.max_binding_bytes` bytes. When a chunk can hold at least
/// `256 / gcd(row_bytes, 256)` rows, every chunk starts at a byte offset that is a multiple of
/// [`OFFSET_ALIGN`] (so chunks can be bound as sub-ranges of one buffer); otherwise chunks
/// hold as many rows as fit. Zero rows give no chunk.
///
/// Errors when a single row is larger than the limit.
pub fn plan_rows(rows: usize, row_bytes: u64, limits: &ChunkLimits) -> Result<Vec<Range<usize>>> {
    if rows == 0 {
        return Ok(Vec::new());
    }
    let row_bytes = row_bytes.max(1);
    let fit = limits.max_binding_bytes / row_bytes;
    if fit == 0 {
        return Err(Error::limit(
            format!("one row needs {row_bytes} bytes in one binding (bytes per binding)"),
            limits.max_binding_bytes,
        ));
    }
    let granule = OFFSET_ALIGN / gcd(row_bytes, OFFSET_ALIGN);
    let per = if fit >= granule {
        fit - fit % granule
    } else {
        fit
    };
    let per = usize::try_from(per).unwrap_or(usize::MAX).max(1);
    Ok((0..rows)
        .step_by(per)
        .map(|a| a..(a.saturating_add(per)).min(rows))
        .collect())
}

/// A contiguous part of one sequence placed in a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index of the sequence.
    pub seq: usize,
    /// Slot range of the part, in the caller's slot numbering (within the sequence's range).
    pub slots: Range<usize>,
}

/// A chunk of sequences (or parts of one long sequence) reduced in one dispatch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegChunk {
    /// The pieces, in order; they are packed one after another into the chunk's buffers.
    pub pieces: Vec<Piece>,
    /// Total slots of the pieces.
    pub slots: usize,
}

/// Groups sequences (`ranges`, half-open slot ranges, any order) into chunks whose per-slot
/// data (`slot_bytes` per slot) and per-piece data (`piece_bytes` per piece) each stay within
/// `limits.max_binding_bytes`. Sequences are kept whole unless one alone exceeds the limit, in
/// which case it is cut into consecutive pieces (the caller merges their partial results in
/// order). Empty sequences still get a (zero-length) piece.
pub fn plan_segments(
    ranges: &[(usize, usize)],
    slot_bytes: u64,
    piece_bytes: u64,
    limits: &ChunkLimits,
) -> Result<Vec<SegChunk>> {
    let max = limits.max_binding_bytes;
    let max_slots = max / slot_bytes.max(1);
    let max_pieces = max / piece_bytes.max(1);
    if max_slots == 0 || max_pieces == 0 {
        return Err(Error::limit(
            "one slot or sequence does not fit one binding (bytes per binding)",
            max,
        ));
    }
    let max_slots = usize::try_from(max_slots).unwrap_or(usize::MAX);
    // Keep every dispatch ≤ 65,535² workgroups and the piece count addressable in u32.
    let max_pieces = usize::try_from(max_pieces)
        .unwrap_or(usize::MAX)
        .min(u32::MAX as usize / 8);
    let mut out = Vec::new();
    let mut cur = SegChunk::default();
    for (seq, &(a, b)) in ranges.iter().enumerate() {
        let b = b.max(a);
        let mut start = a;
        loop {
            let room = max_slots - cur.slots;
            if cur.pieces.len() == max_pieces || (room == 0 && b > start) {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            let len = b - start;
            if len > room && len <= max_slots && !cur.pieces.is_empty() {
                // keep the sequence whole: start a new chunk
                out.push(std::mem::take(&mut cur));
                continue;
            }
            let take = len.min(room);
            cur.pieces.push(Piece {
                seq,
                slots: start..start + take,
            });
            cur.slots += take;
            start += take;
            if start >= b {
                break;
            }
        }
    }
    if !cur.pieces.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

/// A 2-D grid of at least `workgroups` workgroups, each dimension ≤ `max_per_dim`
/// (kernels linearise it as `x + y·nx` and skip the excess).
pub fn dispatch_grid(workgroups: u64, max_per_dim: u32) -> Result<(u32, u32)> {
    if workgroups == 0 {
        return Ok((0, 0));
    }
    let m = u64::from(max_per_dim.max(1));
    let x = workgroups.min(m);
    let y = workgroups.div_ceil(x);
    if y > m {
        return Err(Error::limit(
            format!("{workgroups} workgroups in one dispatch (workgroups per dimension, squared)"),
            u64::from(max_per_dim) * u64::from(max_per_dim),
        ));
    }
    Ok((x as u32, y as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_whole_aligned_and_cover() {
        let lim = ChunkLimits::new(4096);
        for &(rows, rb) in &[
            (0usize, 4u64),
            (1, 4),
            (1000, 4),
            (1000, 28),
            (77, 600),
            (5, 4096),
        ] {
            let plan = plan_rows(rows, rb, &lim).unwrap();
            let mut next = 0;
            for c in &plan {
                assert_eq!(c.start, next);
                assert!(c.end > c.start);
                assert!((c.end - c.start) as u64 * rb <= 4096);
                next = c.end;
            }
            assert_eq!(next, rows);
            let granule = OFFSET_ALIGN / gcd(rb, OFFSET_ALIGN);
            if 4096 / rb >= granule {
                for c in &plan {
                    assert_eq!(c.start as u64 * rb % OFFSET_ALIGN, 0, "rows {rows} rb {rb}");
                }
            }
        }
        assert!(plan_rows(3, 5000, &lim).is_err());
        assert_eq!(
            plan_rows(10, 4, &ChunkLimits::new(1 << 30)).unwrap(),
            vec![0..10]
        );
    }

    #[test]
    fn segments_stay_whole_unless_too_long() {
        let lim = ChunkLimits::new(40); // 10 slots of 4 bytes, 5 pieces of 8 bytes
        let ranges = [(0, 3), (3, 3), (3, 9), (9, 30), (30, 31), (40, 35)];
        let plan = plan_segments(&ranges, 4, 8, &lim).unwrap();
        let mut seen: Vec<(usize, Range<usize>)> = Vec::new();
        for c in &plan {
            assert!(c.slots <= 10 && c.pieces.len() <= 5 && !c.pieces.is_empty());
            assert_eq!(
                c.slots,
                c.pieces.iter().map(|p| p.slots.len()).sum::<usize>()
            );
            seen.extend(c.pieces.iter().map(|p| (p.seq, p.slots.clone())));
        }
        // every sequence covered in order, exactly once
        for (s, &(a, b)) in ranges.iter().enumerate() {
            let parts: Vec<_> = seen.iter().filter(|p| p.0 == s).collect();
            assert!(!parts.is_empty());
            let mut next = a;
            for p in &parts {
                assert_eq!(p.1.start, next);
                next = p.1.end;
            }
            assert_eq!(next, b.max(a));
            if b.saturating_sub(a) <= 10 {
                assert_eq!(parts.len(), 1, "seq {s} split");
            }
        }
        assert!(plan_segments(&ranges, 64, 8, &lim).is_err());
        assert!(plan_segments(&[], 4, 8, &lim).unwrap().is_empty());
    }

    #[test]
    fn grids_fit() {
        assert_eq!(dispatch_grid(0, 65_535).unwrap(), (0, 0));
        assert_eq!(dispatch_grid(7, 65_535).unwrap(), (7, 1));
        let (x, y) = dispatch_grid(200_000, 65_535).unwrap();
        assert!(x <= 65_535 && y <= 65_535 && x as u64 * y as u64 >= 200_000);
        assert!(dispatch_grid(u64::MAX, 65_535).is_err());
    }
}
