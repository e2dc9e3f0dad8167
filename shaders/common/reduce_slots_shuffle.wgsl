// The subgroup flavour of the slot trees (reduce_slots_wg.wgsl's twin; wgpu Features::SUBGROUP,
// naga Capabilities::SUBGROUP, builtins without `enable subgroups;` as in reduce_sg.wgsl): each
// thread's row of RED_SLOTS values lives in its private memory, a subgroup merges its lanes'
// rows by shuffles in a fixed pairwise tree (lane l takes lane l + off for off = 1, 2, 4, …
// when l is a multiple of 2·off), so no workgroup memory and no barrier inside a subgroup.
// Deterministic for a fixed subgroup size (the engine picks this flavour only where the device
// has one, of at least 8 lanes, dividing the row's threads): fixed trees, no atomics. Followed
// by reduce_slots_sg.wgsl (a row per workgroup: the subgroups' partials through workgroup
// memory) or reduce_slots_sg_rows.wgsl (one subgroup per row). Same names as
// reduce_slots_wg.wgsl; the op defines `const RED_SLOTS: u32` and `fn red_merge_row(a: RedRow,
// b: RedRow) -> RedRow` (b holds later items; it must merge as the op's `red_merge` does).

alias RedRow = array<f32, RED_SLOTS>;

struct SlotIds {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sgid: u32,
    @builtin(num_subgroups) nsg: u32,
}

var<private> red_ids: SlotIds;
// The thread's row; after a tree, the total (every thread of the row holds it).
var<private> red_row: RedRow;

// Slot k of the calling thread's row (`t` is the calling thread: rows are private).
fn red_set(k: u32, t: u32, x: f32) {
    red_row[k] = x;
}

// Slot k of the calling thread's row (the op's `red_merge`, the workgroup flavour's in-place
// merge, is never called here: rows are merged as values by `red_merge_row`).
fn red_get(k: u32, t: u32) -> f32 {
    return red_row[k];
}

// Slot k of the total, after a tree.
fn red_total(k: u32) -> f32 {
    return red_row[k];
}

// Row b (later items) into row a: the op's merge, or the sums of slots 0..k.
fn red_combine(a: RedRow, b: RedRow, k: u32, merge: bool) -> RedRow {
    if (merge) {
        return red_merge_row(a, b);
    }
    var r = a;
    for (var j = 0u; j < k; j++) {
        r[j] = a[j] + b[j];
    }
    return r;
}

// Slots 0..k of lane + off's row (called by every lane of the subgroup).
fn red_shuffle_down(x: RedRow, off: u32, k: u32) -> RedRow {
    var r: RedRow;
    for (var j = 0u; j < k; j++) {
        r[j] = subgroupShuffleDown(x[j], off);
    }
    return r;
}

// Slots 0..k of lane 0's row, in every lane.
fn red_broadcast(x: RedRow, k: u32) -> RedRow {
    var r = x;
    for (var j = 0u; j < k; j++) {
        r[j] = subgroupBroadcastFirst(x[j]);
    }
    return r;
}

// Lanes 0..n's rows merged into lane 0's (fixed pairwise tree). Called by every lane.
fn red_sg_tree(x: RedRow, n: u32, k: u32, merge: bool) -> RedRow {
    var acc = x;
    let lane = red_ids.lane;
    for (var off = 1u; off < red_ids.sg_size; off *= 2u) {
        let o = red_shuffle_down(acc, off, k);
        if ((lane & (2u * off - 1u)) == 0u && lane + off < n) {
            acc = red_combine(acc, o, k, merge);
        }
    }
    return acc;
}

// Active lanes of the subgroup.
fn red_lanes() -> u32 {
    let on = countOneBits(subgroupBallot(true));
    return on.x + on.y + on.z + on.w;
}
