// Segmented reductions: one workgroup per (statistic, piece), or with SERIAL one thread per
// (statistic, piece) and WG pieces per workgroup (short pieces: no idle threads, no tree). A
// piece is a sequence (or, for a sequence longer than one chunk, part of it) laid out
// contiguously in this chunk's slots.
// values: SoA, width x stride; ranges: (start, end) slot pair per piece.
// Output, 6 words per (stat, piece) at (stat * count + piece) * 6:
// sum_hi, sum_lo (f32 bits; sum = hi + lo), max, min (f32 bits), argmax (offset from the piece
// start, 0xffffffff if empty), count. Deterministic tree, ties resolved to the first index.
// The cross-thread merge is reduce_acc: reduce_acc_wg.wgsl (workgroup tree) or reduce_sg.wgsl
// (subgroups), chosen per variant.

// The kernel's uniform; Rust twin `SegmentReduceParams` in src/gpu/segment_reduce.rs.
struct SegmentReduceParams {
    pieces: u32, // pieces in this chunk
    stats: u32, // statistics (rows of `values`)
    slots: u32, // slots in this chunk (the row stride of `values`)
    one: f32, // always 1.0: two_sum's opaque one (common/two_sum.wgsl)
}

@group(0) @binding(0) var<uniform> params: SegmentReduceParams;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read> mask_bits: array<u32>;
@group(0) @binding(3) var<storage, read> ranges: array<u32>;
@group(0) @binding(4) var<storage, read_write> seg_out: array<u32>;

const NO_ARG: u32 = 0xffffffffu;

// true: thread `lid` of workgroup g reduces piece (g % groups)·WG + lid of statistic
// g / groups alone, groups = ⌈pieces / WG⌉, in slot order; false: the workgroup strides over
// one piece and merges with reduce_acc.
override SERIAL: bool = false;

// One thread's (or tree node's) partial result: f = (sum_hi, sum_lo, max, min),
// u = (argmax offset, count). An empty partial (count 0) is the identity.
struct Acc {
    f: vec4<f32>,
    u: vec2<u32>,
}

// Merges b (later slots) into a: compensated sum, first maximum, minimum, count.
fn acc_merge(a: Acc, b: Acc) -> Acc {
    if b.u.y == 0u {
        return a;
    }
    if a.u.y == 0u {
        return b;
    }
    let s = two_sum(a.f.x, b.f.x);
    var m = a.f.z;
    var am = a.u.x;
    if b.f.z > a.f.z || (b.f.z == a.f.z && b.u.x < a.u.x) {
        m = b.f.z;
        am = b.u.x;
    }
    return Acc(
        vec4<f32>(s.x, s.y + (a.f.y + b.f.y), m, min(a.f.w, b.f.w)),
        vec2<u32>(am, a.u.y + b.u.y),
    );
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    ids: RedIds,
) {
    let lid = ids.lid;
    let pieces = params.pieces;
    let g = flat_workgroup(wid, nwg);
    let groups = select(pieces, (pieces + WG - 1u) / WG, SERIAL);
    let piece = select(g % groups, (g % groups) * WG + lid, SERIAL);
    let stat = g / groups;
    let live = stat < params.stats && piece < pieces;
    let w = walk(piece, live, lid, SERIAL);
    let start = w.start;
    let end = w.end;
    let base = min(stat, params.stats) * params.slots;

    // Per-thread pass: compensated sum, first max.
    var hi = 0.0;
    var lo = 0.0;
    var mx = -BIG;
    var mn = BIG;
    var arg = NO_ARG;
    var cnt = 0u;
    for (var i = start + w.first; i < end; i += w.step) {
        if mask_bit(mask_bits[i >> 5u], i) {
            let v = values[base + i];
            let s = two_sum(hi, v);
            hi = s.x;
            lo += s.y;
            if cnt == 0u || v > mx {
                mx = v;
                arg = i - start;
            }
            if cnt == 0u || v < mn {
                mn = v;
            }
            cnt += 1u;
        }
    }

    var r = Acc(vec4<f32>(hi, lo, mx, mn), vec2<u32>(arg, cnt));
    if !SERIAL {
        r = reduce_acc(ids, r);
    }

    if live && (SERIAL || lid == 0u) {
        let o = (stat * pieces + piece) * 6u;
        seg_out[o] = bitcast<u32>(r.f.x);
        seg_out[o + 1u] = bitcast<u32>(r.f.y);
        seg_out[o + 2u] = bitcast<u32>(r.f.z);
        seg_out[o + 3u] = bitcast<u32>(r.f.w);
        seg_out[o + 4u] = r.u.x;
        seg_out[o + 5u] = r.u.y;
    }
}
