// reduce_acc, workgroup flavour: a deterministic pairwise tree in workgroup memory over any
// workgroup size WG <= MAX_WG (power of two or not). Same names as reduce_sg.wgsl; the op body
// defines `struct Acc { f: vec4<f32>, u: vec2<u32> }` and `fn acc_merge(a: Acc, b: Acc) -> Acc`
// (b holds later items than a). Needs reduce_wg.wgsl (wg_f, wg_u, tree_half).

// The entry point's thread ids (an input struct, so the op's `main` is flavour-agnostic).
struct RedIds {
    @builtin(local_invocation_index) lid: u32,
}

// Merges every thread's `x` in thread order; every thread gets the total. Must be reached by
// all threads of the workgroup (it contains barriers).
fn reduce_acc(ids: RedIds, x: Acc) -> Acc {
    let lid = ids.lid;
    wg_f[lid] = x.f;
    wg_u[lid] = x.u;
    workgroupBarrier();
    var live_n = WG;
    loop {
        if live_n <= 1u {
            break;
        }
        let half = tree_half(live_n);
        if lid < live_n - half {
            let m = acc_merge(Acc(wg_f[lid], wg_u[lid]), Acc(wg_f[lid + half], wg_u[lid + half]));
            wg_f[lid] = m.f;
            wg_u[lid] = m.u;
        }
        workgroupBarrier();
        live_n = half;
    }
    let r = Acc(wg_f[0], wg_u[0]);
    workgroupBarrier();
    return r;
}
