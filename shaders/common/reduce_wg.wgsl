// Workgroup-memory reductions (no subgroups): a deterministic pairwise tree that works for any
// workgroup size WG <= MAX_WG, power of two or not. Every call must be reached by all threads of
// the workgroup (uniform control flow): each contains barriers. wg_sum2 needs two_sum.wgsl.

var<workgroup> wg_f: array<vec4<f32>, MAX_WG>;
var<workgroup> wg_u: array<vec2<u32>, MAX_WG>;

// Compensated (hi, lo) sum over the workgroup; every thread gets the total pair.
fn wg_sum2(lid: u32, x: vec2<f32>) -> vec2<f32> {
    wg_f[lid] = vec4<f32>(x, 0.0, 0.0);
    workgroupBarrier();
    var live_n = WG;
    loop {
        if live_n <= 1u {
            break;
        }
        let half = tree_half(live_n);
        if lid < live_n - half {
            let a = wg_f[lid].xy;
            let b = wg_f[lid + half].xy;
            let s = two_sum(a.x, b.x);
            wg_f[lid] = vec4<f32>(s.x, s.y + a.y + b.y, 0.0, 0.0);
        }
        workgroupBarrier();
        live_n = half;
    }
    let r = wg_f[0].xy;
    workgroupBarrier();
    return r;
}

// Maximum over the workgroup; every thread gets it.
fn wg_max(lid: u32, x: f32) -> f32 {
    wg_f[lid].x = x;
    workgroupBarrier();
    var live_n = WG;
    loop {
        if live_n <= 1u {
            break;
        }
        let half = tree_half(live_n);
        if lid < live_n - half {
            wg_f[lid].x = max(wg_f[lid].x, wg_f[lid + half].x);
        }
        workgroupBarrier();
        live_n = half;
    }
    let r = wg_f[0].x;
    workgroupBarrier();
    return r;
}
