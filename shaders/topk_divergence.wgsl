// Top-K divergences (docs/FORMAT.md, DPPO): one workgroup per row, one streaming pass over the trainer
// logits row. Mirrors src/cpu/topk_divergence.rs; host side in src/gpu/topk_divergence.rs.
//
// Composed as: common/prelude.wgsl + common/math.wgsl + common/two_sum.wgsl +
// common/unpack.wgsl + common/load_a_<logits dtype>.wgsl (binding 1, `load_a`; the dtype is
// the kernel key's, no run-time branch) + the reduce_acc snippets of the flavour + this file.
// binding 1: the rows' logits as packed little-endian u32 words (16-bit types two per word);
// row `row` starts at element params.first + row_info[4·row + 3]·V of the binding.
// sup_ids / roll_lp: [rows, W] support ids and rollout log-probs (first `len` entries used). row_info: [rows, 4] = (len, index of y in S,
// bits of the rollout tail μ_tail (computed on the host in f64), the row's index in the
// logits binding).
// Output [rows, 8]: topk_kl, topk_tv, ddot_aggregated, ddot_uniform, rollout tail, trainer
// tail, π_y − μ_y, flags (bit 0: NaN / +inf logit or no finite logit; bit 1: π = 0 somewhere
// on S, KL = +inf).
//
// Numerics: topk_kl = Σ_S μ k3(log π − log μ) + [tail terms] as on the CPU, so the f32
// rounding of the log-normaliser and of the rollout log-probs enters only at second order.
// The row's normaliser Σ exp(x − m) is a compensated (hi, lo) sum whose shift m starts
// at the largest trainer logit on S. Unless a logit outside S is larger (then the running max
// rescales), thread 0's recomputation of the S terms is bitwise identical to the streamed
// terms, so the trainer tail Σ_{v∉S} π = (s − s_S) / s (= −expm1(logsumexp of log π on S))
// keeps tiny tails instead of an f32 rounding floor.

// The kernel's uniform; Rust twin `TopkDivergenceParams` in src/gpu/topk_divergence.rs.
struct TopkDivergenceParams {
    rows: u32, // rows in this dispatch
    vocab: u32, // V
    width: u32, // support width W (K + 1)
    first: u32, // index of the chunk's first logits element inside binding 1
    inv_temp: f32, // 1 / temperature
    one: f32, // always 1.0: two_sum's opaque one (common/two_sum.wgsl)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: TopkDivergenceParams;
@group(0) @binding(2) var<storage, read> sup_ids: array<i32>;
@group(0) @binding(3) var<storage, read> roll_lp: array<f32>;
@group(0) @binding(4) var<storage, read> row_info: array<u32>;
@group(0) @binding(5) var<storage, read_write> topk_out: array<f32>;

const TAIL_FLOOR: f32 = 1.0e-12;
const OUT_W: u32 = 8u;

// The scaled logit at element e of binding 1 (sentinels pass through unscaled).
fn tk_logit(e: u32) -> f32 {
    let x = load_a(e);
    if x <= NEG_SENTINEL || x >= BAD_SENTINEL {
        return x;
    }
    return x * params.inv_temp;
}

// log(hi + lo) for a compensated sum ≥ 1 - ish, via log1p near 1.
fn tk_log2sum(hi: f32, lo: f32) -> f32 {
    let d = (hi - 1.0) + lo;
    if abs(d) <= 0.0625 {
        return log1p_acc(d);
    }
    return log(hi + lo);
}

// Adds the state b = (m, hi, lo) into a (the sum Σ exp(x − m) = hi + lo); m = NEG_SENTINEL is empty.
fn tk_merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    if b.x <= NEG_SENTINEL {
        return a;
    }
    if a.x <= NEG_SENTINEL {
        return b;
    }
    if a.x == b.x {
        let s = two_sum(a.y, b.y);
        return vec3<f32>(a.x, s.x, s.y + a.z + b.z);
    }
    var big = a;
    var small = b;
    if b.x > a.x {
        big = b;
        small = a;
    }
    let f = exp(small.x - big.x);
    let s = two_sum(big.y, small.y * f);
    return vec3<f32>(big.x, s.x, s.y + big.z + small.z * f);
}

// The cross-thread state for reduce_acc (reduce_acc_wg.wgsl or reduce_sg.wgsl): f = (m, hi, lo,
// bad), u unused.
struct Acc {
    f: vec4<f32>,
    u: vec2<u32>,
}

fn acc_merge(a: Acc, b: Acc) -> Acc {
    return Acc(vec4<f32>(tk_merge(a.f.xyz, b.f.xyz), max(a.f.w, b.f.w)), a.u);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    ids: RedIds,
) {
    let lid = ids.lid;
    let row = flat_workgroup(wid, nwg);
    let live = row < params.rows;
    let v = params.vocab;
    let w = params.width;
    var len = 0u;
    if live {
        len = row_info[row * 4u];
    }
    var base = params.first;
    if live {
        base += row_info[row * 4u + 3u] * v;
    }
    let sbase = row * w;

    // The initial shift: the largest finite trainer logit on S (every thread reads it).
    var c = NEG_SENTINEL;
    for (var j = 0u; j < len; j += 1u) {
        let x = tk_logit(base + u32(sup_ids[sbase + j]));
        if x < BAD_SENTINEL {
            c = max(c, x);
        }
    }

    // Streaming pass: compensated Σ exp(x − m), m = c unless a larger logit shows up.
    var st = vec3<f32>(c, 0.0, 0.0);
    var bad = 0.0;
    if len > 0u {
        for (var i = lid; i < v; i += WG) {
            let x = tk_logit(base + i);
            if x >= BAD_SENTINEL {
                bad = 1.0;
            } else if x > NEG_SENTINEL {
                if x > st.x {
                    st = tk_merge(vec3<f32>(x, 1.0, 0.0), st);
                } else {
                    let s = two_sum(st.y, exp(x - st.x));
                    st = vec3<f32>(st.x, s.x, st.z + s.y);
                }
            }
        }
    }

    // Deterministic tree over the workgroup (every thread gets the total).
    let tot = reduce_acc(ids, Acc(vec4<f32>(st, bad), vec2<u32>(0u))).f;

    if live && lid == 0u && len > 0u {
        let m = tot.x;
        var flags = 0u;
        if tot.w > 0.0 || m <= NEG_SENTINEL {
            flags = 1u;
        }
        let s_hi = tot.y;
        let s_lo = tot.z;
        let ls = tk_log2sum(s_hi, s_lo);
        let info_y = row_info[row * 4u + 1u];
        let mu_tail = bitcast<f32>(row_info[row * 4u + 2u]);
        var kl = 0.0;
        var tv = 0.0;
        var cross = 0.0;
        var pd = 0.0;
        var in_hi = 0.0;
        var in_lo = 0.0;
        for (var j = 0u; j < len; j += 1u) {
            let x = tk_logit(base + u32(sup_ids[sbase + j]));
            let lm = roll_lp[sbase + j];
            let mu = exp(lm);
            var em = -1.0; // (π − μ)/μ
            if x > NEG_SENTINEL && x < BAD_SENTINEL {
                let t = exp(x - m);
                let s = two_sum(in_hi, t);
                in_hi = s.x;
                in_lo += s.y;
                let lp = (x - m) - ls;
                em = expm1_acc(lp - lm);
                kl += mu * k3_of(lp - lm);
                cross -= exp(lp) * mu * em;
            } else {
                flags |= 2u;
            }
            tv += mu * abs(em);
            if j == info_y {
                pd = mu * em;
            }
        }
        let s_tot = s_hi + s_lo;
        let pi_tail = max(((s_hi - in_hi) + (s_lo - in_lo)) / s_tot, 0.0);
        let mh = max(mu_tail, TAIL_FLOOR);
        let ph = max(pi_tail, TAIL_FLOOR);
        // Σ_S μ (log μ − log π) = Σ_S μ k3(d) − (μ_tail − π_tail) with the accurate tails: no
        // first-order error from the shared log-normaliser or the f32 rollout log-probs.
        if mh == mu_tail && ph == pi_tail {
            kl += mu_tail * k3_of(log(pi_tail) - log(mu_tail));
        } else {
            kl += mh * (log(mh) - log(ph)) - mu_tail + pi_tail;
        }
        let tail = ph * (mh - ph);
        var uni = 0.0;
        if v > len {
            uni = tail / f32(v - len);
        }
        let o = row * OUT_W;
        topk_out[o] = kl;
        topk_out[o + 1u] = 0.5 * (tv + abs(mh - ph));
        topk_out[o + 2u] = pd + cross + tail;
        topk_out[o + 3u] = pd + cross + uni;
        topk_out[o + 4u] = mu_tail;
        topk_out[o + 5u] = pi_tail;
        topk_out[o + 6u] = pd;
        topk_out[o + 7u] = f32(flags);
    }
}
