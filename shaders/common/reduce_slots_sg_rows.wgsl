// The subgroup flavour with one subgroup per row (after reduce_slots_shuffle.wgsl): a
// workgroup holds ROWS rows, row r in subgroup r, and every tree is the subgroup's shuffle tree
// alone, its total broadcast to the lanes: no workgroup memory, no barrier, so the rows of a
// workgroup run independently (the row's threads, WG, are one subgroup: the engine checks it).

fn red_init(ids: SlotIds) -> vec2<u32> {
    red_ids = ids;
    return vec2<u32>(ids.sgid, ids.lane);
}

// Nothing to wait for: a row's threads share no memory.
fn row_sync() {}

// Every lane computed the same `x` from the same broadcast totals; lane 0's is returned.
fn row_publish(t: u32, x: u32) -> u32 {
    return subgroupBroadcastFirst(x);
}

fn red_tree(k: u32, merge: bool) {
    let total = red_sg_tree(red_row, red_lanes(), k, merge);
    red_row = red_broadcast(total, k);
}

fn red_sum_slots(t: u32, k: u32) {
    red_tree(k, false);
}

fn red_merge_tree(t: u32) {
    red_tree(RED_SLOTS, true);
}
