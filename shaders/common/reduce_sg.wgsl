// reduce_acc, subgroup flavour (wgpu Features::SUBGROUP, naga Capabilities::SUBGROUP; naga 30
// rejects the standard `enable subgroups;` as "not yet supported" and offers the subgroup
// builtins without it, so there is none): a shuffle-down tree inside each subgroup, the
// subgroups' partials through workgroup memory, and a second shuffle tree over them. Any subgroup size (the builtin, never an assumed 32; 8 on
// lavapipe); the engine picks this flavour only for a fixed subgroup size that divides WG, and
// partial subgroups are still handled (active lanes are counted). Deterministic: fixed trees,
// no atomics. Same names as reduce_acc_wg.wgsl: the op body defines `struct Acc { f: vec4<f32>,
// u: vec2<u32> }` and `fn acc_merge(a: Acc, b: Acc) -> Acc`.

struct RedIds {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sgid: u32,
    @builtin(num_subgroups) nsg: u32,
}

var<workgroup> sg_f: array<vec4<f32>, MAX_WG>;
var<workgroup> sg_u: array<vec2<u32>, MAX_WG>;

// Lanes 0..n of the subgroup merged into lane 0 (lane l takes lane l + off for off = 1, 2, 4,
// … when l is a multiple of 2·off). Called by every lane (shuffles read other lanes).
fn sg_tree(lane: u32, sg_size: u32, n: u32, x: Acc) -> Acc {
    var acc = x;
    for (var off = 1u; off < sg_size; off *= 2u) {
        let bf = subgroupShuffleDown(acc.f, off);
        let bu = subgroupShuffleDown(acc.u, off);
        if (lane & (2u * off - 1u)) == 0u && lane + off < n {
            acc = acc_merge(acc, Acc(bf, bu));
        }
    }
    return acc;
}

// Merges every thread's `x`; every thread gets the total. Must be reached by all threads of
// the workgroup (it contains barriers).
fn reduce_acc(ids: RedIds, x: Acc) -> Acc {
    let on = countOneBits(subgroupBallot(true));
    let n = on.x + on.y + on.z + on.w;
    let part = sg_tree(ids.lane, ids.sg_size, n, x);
    if ids.lane == 0u {
        sg_f[ids.sgid] = part.f;
        sg_u[ids.sgid] = part.u;
    }
    workgroupBarrier();
    // Every subgroup merges the partials (lane l: l, l + n, l + 2n, … in order), so every thread
    // ends with the total without another barrier.
    var acc = Acc(vec4<f32>(0.0), vec2<u32>(0u));
    var have = false;
    for (var j = ids.lane; j < ids.nsg; j += n) {
        let p = Acc(sg_f[j], sg_u[j]);
        if have {
            acc = acc_merge(acc, p);
        } else {
            acc = p;
            have = true;
        }
    }
    let m = min(n, ids.nsg);
    let total = sg_tree(ids.lane, ids.sg_size, m, acc);
    let r = Acc(subgroupBroadcastFirst(total.f), subgroupBroadcastFirst(total.u));
    workgroupBarrier();
    return r;
}
