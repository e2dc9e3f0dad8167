// Segmented reductions: one workgroup per (statistic, piece). A piece is a sequence (or, for a
// sequence longer than one chunk, part of it) laid out contiguously in this chunk's slots.
// params.count = pieces, params.width = statistics, params.stride = slots in this chunk.
// values: SoA, width x stride; ranges: (start, end) slot pair per piece.
// Output, 6 words per (stat, piece) at (stat * count + piece) * 6:
// sum_hi, sum_lo (f32 bits; sum = hi + lo), max, min (f32 bits), argmax (offset from the piece
// start, 0xffffffff if empty), count. Deterministic tree, ties resolved to the first index.

@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read> mask_bits: array<u32>;
@group(0) @binding(3) var<storage, read> ranges: array<u32>;
@group(0) @binding(4) var<storage, read_write> seg_out: array<u32>;

const NO_ARG: u32 = 0xffffffffu;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let pieces = params.count;
    let g = flat_workgroup(wid, nwg);
    let piece = g % pieces;
    let stat = g / pieces;
    let live = stat < params.width;
    var start = 0u;
    var end = 0u;
    if live {
        start = ranges[2u * piece];
        end = ranges[2u * piece + 1u];
    }
    let base = min(stat, params.width) * params.stride;

    // Per-thread pass: strided over the piece, compensated sum, first max.
    var hi = 0.0;
    var lo = 0.0;
    var mx = -BIG;
    var mn = BIG;
    var arg = NO_ARG;
    var cnt = 0u;
    for (var i = start + lid; i < end; i += WG) {
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

    // Tree over the workgroup, merging slot i + half into slot i.
    wg_f[lid] = vec4<f32>(hi, lo, mx, mn);
    wg_u[lid] = vec2<u32>(arg, cnt);
    workgroupBarrier();
    var live_n = WG;
    loop {
        if live_n <= 1u {
            break;
        }
        let half = tree_half(live_n);
        if lid < live_n - half {
            let a = wg_f[lid];
            let b = wg_f[lid + half];
            let au = wg_u[lid];
            let bu = wg_u[lid + half];
            if bu.y > 0u {
                if au.y == 0u {
                    wg_f[lid] = b;
                    wg_u[lid] = bu;
                } else {
                    let s = two_sum(a.x, b.x);
                    var m = a.z;
                    var am = au.x;
                    if b.z > a.z || (b.z == a.z && bu.x < au.x) {
                        m = b.z;
                        am = bu.x;
                    }
                    wg_f[lid] = vec4<f32>(s.x, s.y + a.y + b.y, m, min(a.w, b.w));
                    wg_u[lid] = vec2<u32>(am, au.y + bu.y);
                }
            }
        }
        workgroupBarrier();
        live_n = half;
    }

    if live && lid == 0u {
        let r = wg_f[0];
        let ru = wg_u[0];
        let o = (stat * pieces + piece) * 6u;
        seg_out[o] = bitcast<u32>(r.x);
        seg_out[o + 1u] = bitcast<u32>(r.y);
        seg_out[o + 2u] = bitcast<u32>(r.z);
        seg_out[o + 3u] = bitcast<u32>(r.w);
        seg_out[o + 4u] = ru.x;
        seg_out[o + 5u] = ru.y;
    }
}
