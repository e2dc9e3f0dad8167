// Workgroup-memory trees over per-thread rows of RED_SLOTS f32 values (for kernels that reduce
// many quantities at once). The op defines `const RED_SLOTS: u32` and, to use red_merge_tree,
// `fn red_merge(t: u32, o: u32)` that merges thread o's row (later items) into thread t's. Slot
// k of thread t is red_sh[k * MAX_WG + t]. Deterministic pairwise trees over WG <= MAX_WG
// threads (power of two or not), no atomics. Every call must be reached by all threads of the
// workgroup (it contains barriers); each starts with a barrier (so rows written just before
// are seen) and ends with one, after which every thread may read thread 0's row, the total.

var<workgroup> red_sh: array<f32, RED_SLOTS * MAX_WG>;

fn red_set(k: u32, t: u32, x: f32) {
    red_sh[k * MAX_WG + t] = x;
}

fn red_get(k: u32, t: u32) -> f32 {
    return red_sh[k * MAX_WG + t];
}

// Sums slots 0..k of every row into thread 0's row.
fn red_sum_slots(t: u32, k: u32) {
    workgroupBarrier();
    var live_n = WG;
    while live_n > 1u {
        let half = tree_half(live_n);
        if t < live_n - half {
            for (var j = 0u; j < k; j++) {
                red_sh[j * MAX_WG + t] = red_sh[j * MAX_WG + t] + red_sh[j * MAX_WG + t + half];
            }
        }
        live_n = half;
        workgroupBarrier();
    }
}

// Merges every row into thread 0's row with the op's red_merge.
fn red_merge_tree(t: u32) {
    workgroupBarrier();
    var live_n = WG;
    while live_n > 1u {
        let half = tree_half(live_n);
        if t < live_n - half {
            red_merge(t, t + half);
        }
        live_n = half;
        workgroupBarrier();
    }
}
