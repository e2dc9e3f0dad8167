// Fused corrections pass (Engine::corrections_pass): one workgroup per sequence (with SERIAL,
// one thread per sequence and WG sequences per workgroup: short sequences) computes the
// per-token estimators, the per-sequence reductions every criterion needs, the per-criterion
// keep decisions (inclusive), the modified-mask reject bits and the IS weights.
//
// plan: 6 words per criterion: source, source column, agg, agg column, lower (f32 bits; -BIG
// when one-sided), upper (f32 bits).
// tok_out (9 x stride words): lr, rho, k1, k2, k3, abs, ser, weight (f32 bits), reject bits.
// seq_out ((width + 3) words per sequence): statistic of each criterion (f32 bits), reject
// bits, sum(lr) as an f32 (hi, lo) pair.

// The kernel's uniform; Rust twin `MasksParams` in src/gpu/ops/masks.rs.
struct MasksParams {
    sequences: u32, // sequences in this chunk
    criteria: u32, // criteria in the plan (<= 32)
    slots: u32, // slots in this chunk
    columns: u32, // host columns
    is_flags: u32, // bit 0 IS on, bit 1 sequence-level IS, bit 2 IcePop (lower bound)
    is_upper: f32, // IS upper bound
    is_lower: f32, // IS lower bound (IcePop)
    one: f32, // always 1.0: two_sum's opaque one (common/two_sum.wgsl)
}

@group(0) @binding(0) var<uniform> params: MasksParams;
@group(0) @binding(1) var<storage, read> lr_in: array<f32>;
@group(0) @binding(2) var<storage, read> mask_bits: array<u32>;
@group(0) @binding(3) var<storage, read> ranges: array<u32>;
@group(0) @binding(4) var<storage, read> plan: array<u32>;
@group(0) @binding(5) var<storage, read> columns: array<f32>;
@group(0) @binding(6) var<storage, read_write> tok_out: array<u32>;
@group(0) @binding(7) var<storage, read_write> seq_out: array<u32>;

// The SRC_* (MaskSource) and AGG_* (MaskAgg) codes are generated from the Rust enums
// (src/gpu/ops/wgsl.rs, mask_codes).

var<workgroup> wg_count: atomic<u32>;
var<workgroup> wg_reject: atomic<u32>;

// true: thread `lid` of workgroup g handles sequence g·WG + lid alone, in slot order, with no
// workgroup reduction; false: the workgroup strides over sequence g.
override SERIAL: bool = false;

// The workgroup's sum of the (hi, lo) pairs, or the thread's own (SERIAL).
fn seq_sum2(lid: u32, x: vec2<f32>) -> vec2<f32> {
    if SERIAL {
        return x;
    }
    return wg_sum2(lid, x);
}

// The workgroup's maximum, or the thread's own (SERIAL).
fn seq_max(lid: u32, x: f32) -> f32 {
    if SERIAL {
        return x;
    }
    return wg_max(lid, x);
}

// The criterion's per-token statistic at slot i (valid) with clamped log-ratio c.
fn stat_of(ci: u32, i: u32, c: f32) -> f32 {
    let src = plan[6u * ci];
    let col = plan[6u * ci + 1u];
    switch src {
        case SRC_K1: { return -c; }
        case SRC_K2: { return 0.5 * c * c; }
        case SRC_K3, SRC_K3_VERL: { return k3_of(c); }
        case SRC_ABS: { return abs(c); }
        case SRC_SER: { return abs(expm1_acc(c)); }
        case SRC_COLUMN: { return columns[col * params.slots + i]; }
        case SRC_BINARY_KL: {
            let lp = columns[col * params.slots + i];
            return binary_kl_of(lp, columns[(col + 1u) * params.slots + i], lr_in[i]);
        }
        case SRC_SER_WEIGHTED, default: {
            return abs(expm1_acc(c)) * columns[col * params.slots + i];
        }
    }
}

// KPop: max(D_B(p||q), D_B(q||p)) from the log-probs lp (trainer), lq (rollout) and the
// unclamped lr = lp - lq (rounded once from f64, so it keeps its relative precision);
// the f32 twin of trmask::numerics::binary_kl. Each direction is p*k3(lq - lp) +
// (1-p)*k3(ln((1-q)/(1-p))) (terms >= 0, no cancellation), 1-p = -expm1(lp) and
// ln((1-q)/(1-p)) = log1p(q*expm1(lr)/(1-p)); a log-prob >= 0 counts as p = 1 - 1e-8.
fn binary_kl_of(lp_in: f32, lq_in: f32, lr: f32) -> f32 {
    var lp = lp_in;
    var lq = lq_in;
    var d = lr;
    if lp >= 0.0 || lq >= 0.0 {
        lp = select(lp, -1.0e-8, lp >= 0.0);
        lq = select(lq, -1.0e-8, lq >= 0.0);
        d = lp - lq;
    }
    let pq = vec2<f32>(exp(lp), exp(lq));
    let ab = vec2<f32>(-expm1_acc(lp), -expm1_acc(lq));
    let t = pq.y * expm1_acc(clamp(d, -SAFETY_BOUND, SAFETY_BOUND)) / ab.x;
    var v: f32;
    if abs(d) < SAFETY_BOUND && abs(t) < 1.0e-3 {
        v = t * (1.0 - t * (0.5 - t * (1.0 / 3.0 - 0.25 * t)));
    } else if abs(d) < SAFETY_BOUND && abs(t) < 0.5 {
        v = log(1.0 + t);
    } else {
        // ln(1 - e^x), Maechler's switch at -ln 2
        let l1q = select(log(1.0 - pq.y), log(ab.y), lq > -0.6931472);
        let l1p = select(log(1.0 - pq.x), log(ab.x), lp > -0.6931472);
        v = l1q - l1p;
    }
    let fwd = bkl_term(pq.x, pq.y, -d) + bkl_term(ab.x, ab.y, v);
    let rev = bkl_term(pq.y, pq.x, d) + bkl_term(ab.y, ab.x, -v);
    return max(fwd, rev);
}

// x*(e^u - 1 - u) given y = x*e^u, without cancellation.
fn bkl_term(x: f32, y: f32, u: f32) -> f32 {
    if u > 1.0 {
        return y - x * (1.0 + u);
    }
    return x * k3_of(u);
}

fn keeps(ci: u32, x: f32) -> bool {
    let lower = bitcast<f32>(plan[6u * ci + 4u]);
    let upper = bitcast<f32>(plan[6u * ci + 5u]);
    return x >= lower && x <= upper;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = flat_workgroup(wid, nwg);
    if !SERIAL && g >= params.sequences {
        return;
    }
    let seq = select(g, g * WG + lid, SERIAL);
    let live = seq < params.sequences;
    let w = walk(seq, live, lid, SERIAL);
    let start = w.start;
    let end = w.end;
    let nc = params.criteria;
    let n = params.slots;
    if !SERIAL {
        if lid == 0u {
            atomicStore(&wg_count, 0u);
            atomicStore(&wg_reject, 0u);
        }
        workgroupBarrier();
    }
    // the thread that writes the sequence's words
    let writer = live && (SERIAL || lid == 0u);

    // Valid tokens and the compensated sum of the (unclamped) log-ratio.
    var cnt = 0u;
    var s_hi = 0.0;
    var s_lo = 0.0;
    for (var i = start + w.first; i < end; i += w.step) {
        if mask_bit(mask_bits[i >> 5u], i) {
            let s = two_sum(s_hi, lr_in[i]);
            s_hi = s.x;
            s_lo += s.y;
            cnt += 1u;
        }
    }
    var len = cnt;
    if !SERIAL {
        atomicAdd(&wg_count, cnt);
    }
    let lr_sum = seq_sum2(lid, vec2<f32>(s_hi, s_lo));
    if !SERIAL {
        len = atomicLoad(&wg_count);
    }
    let so = seq * (nc + 3u);

    // Sequence statistics and decisions (every thread holds the same totals).
    var seq_reject = 0u;
    for (var ci = 0u; ci < nc; ci += 1u) {
        let agg = plan[6u * ci + 2u];
        if agg == AGG_TOKEN {
            continue;
        }
        let zcol = plan[6u * ci + 3u];
        var hi = 0.0;
        var lo = 0.0;
        var zhi = 0.0;
        var zlo = 0.0;
        var mx = -BIG;
        for (var i = start + w.first; i < end; i += w.step) {
            if mask_bit(mask_bits[i >> 5u], i) {
                let c = clamp(lr_in[i], -SAFETY_BOUND, SAFETY_BOUND);
                let v = stat_of(ci, i, c);
                let s = two_sum(hi, v);
                hi = s.x;
                lo += s.y;
                mx = max(mx, v);
                if agg == AGG_WEIGHTED_MEAN {
                    let z = two_sum(zhi, columns[zcol * n + i]);
                    zhi = z.x;
                    zlo += z.y;
                }
            }
        }
        let tot = seq_sum2(lid, vec2<f32>(hi, lo));
        let m = seq_max(lid, mx);
        let z = seq_sum2(lid, vec2<f32>(zhi, zlo));
        let sum = tot.x + tot.y;
        var stat = 0.0;
        if len > 0u {
            switch agg {
                case AGG_SUM: { stat = sum; }
                case AGG_MEAN_VERL: { stat = sum / (f32(len) + 1e-8); }
                case AGG_MEAN: { stat = sum / f32(len); }
                case AGG_MAX: { stat = m; }
                case AGG_WEIGHTED_MEAN, default: {
                    let zz = z.x + z.y;
                    if zz > 0.0 {
                        stat = sum / zz;
                    }
                }
            }
        }
        if !keeps(ci, stat) {
            seq_reject |= 1u << ci;
        }
        if writer {
            seq_out[so + ci] = bitcast<u32>(stat);
        }
    }

    // Per token: estimators, token-level decisions, reject bits, IS weights.
    let is_on = (params.is_flags & 1u) != 0u;
    let is_seq = (params.is_flags & 2u) != 0u;
    let icepop = (params.is_flags & 4u) != 0u;
    let seq_w = exp(clamp(lr_sum.x + lr_sum.y, -SAFETY_BOUND, SAFETY_BOUND));
    var bits_or = 0u;
    for (var i = start + w.first; i < end; i += w.step) {
        var e = array<f32, 7>();
        var w = 0.0;
        var bits = 0u;
        if mask_bit(mask_bits[i >> 5u], i) {
            e = estimators(lr_in[i]);
            let c = -e[2]; // the clamped log-ratio
            let rho = e[1];
            bits = seq_reject;
            for (var ci = 0u; ci < nc; ci += 1u) {
                if plan[6u * ci + 2u] == AGG_TOKEN && !keeps(ci, stat_of(ci, i, c)) {
                    bits |= 1u << ci;
                }
            }
            if is_on {
                var raw = rho;
                if is_seq {
                    raw = seq_w;
                }
                if icepop {
                    if raw >= params.is_lower && raw <= params.is_upper {
                        w = raw;
                    }
                } else {
                    w = min(raw, params.is_upper);
                }
            }
        }
        bits_or |= bits;
        for (var k = 0u; k < 7u; k += 1u) {
            tok_out[k * n + i] = bitcast<u32>(e[k]);
        }
        tok_out[7u * n + i] = bitcast<u32>(w);
        tok_out[8u * n + i] = bits;
    }
    var reject = bits_or;
    if !SERIAL {
        atomicOr(&wg_reject, bits_or);
        workgroupBarrier();
        reject = atomicLoad(&wg_reject);
    }
    if writer {
        seq_out[so + nc] = reject;
        seq_out[so + nc + 1u] = bitcast<u32>(lr_sum.x);
        seq_out[so + nc + 2u] = bitcast<u32>(lr_sum.y);
    }
}
