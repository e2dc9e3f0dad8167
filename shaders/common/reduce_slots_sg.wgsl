// The subgroup flavour, one row per workgroup (after reduce_slots_shuffle.wgsl): each subgroup's
// tree, then the subgroups' partials through workgroup memory — one barrier per tree instead of
// one per level — merged by every subgroup in the same fixed order (lane l: partials l, l + n,
// l + 2n, …, then the shuffle tree), so every thread ends with the same total. Partials
// alternate between two buffers, so a tree needs no closing barrier: the next tree's barrier
// separates its reads from the writes of the tree after it. Every tree must be reached by all
// threads of the workgroup; the op declares `var<workgroup> wg_active: u32`.

// Subgroups per workgroup at most (the engine picks this flavour for subgroups of >= 8 lanes).
const RED_SG_MAX: u32 = MAX_WG / 8u;

var<workgroup> red_part: array<f32, 2u * RED_SLOTS * RED_SG_MAX>;
var<private> red_parity: u32;

fn red_init(ids: SlotIds) -> vec2<u32> {
    red_ids = ids;
    red_parity = 0u;
    return vec2<u32>(0u, ids.lid);
}

fn red_tree(k: u32, merge: bool) {
    let n = red_lanes();
    let part = red_sg_tree(red_row, n, k, merge);
    let buf = red_parity * RED_SLOTS * RED_SG_MAX;
    red_parity = 1u - red_parity;
    if (red_ids.lane == 0u) {
        for (var j = 0u; j < k; j++) {
            red_part[buf + j * RED_SG_MAX + red_ids.sgid] = part[j];
        }
    }
    workgroupBarrier();
    var acc: RedRow;
    var have = false;
    for (var s = red_ids.lane; s < red_ids.nsg; s += n) {
        var p: RedRow;
        for (var j = 0u; j < k; j++) {
            p[j] = red_part[buf + j * RED_SG_MAX + s];
        }
        if (have) {
            acc = red_combine(acc, p, k, merge);
        } else {
            acc = p;
            have = true;
        }
    }
    let total = red_sg_tree(acc, min(n, red_ids.nsg), k, merge);
    red_row = red_broadcast(total, k);
}

// Sums slots 0..k of every thread's row; every thread gets the total.
fn red_sum_slots(t: u32, k: u32) {
    red_tree(k, false);
}

// Merges every thread's row with the op's red_merge_row; every thread gets the total.
fn red_merge_tree(t: u32) {
    red_tree(RED_SLOTS, true);
}
