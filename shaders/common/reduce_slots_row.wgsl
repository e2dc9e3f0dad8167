// Row synchronisation for the slot trees with one row per workgroup (reduce_slots_wg.wgsl and
// reduce_slots_sg.wgsl; reduce_slots_sg_rows.wgsl has its own, per subgroup). The op declares
// `var<workgroup> wg_active: u32`.

// A barrier between the row's threads.
fn row_sync() {
    workgroupBarrier();
}

// Thread 0's `x`, returned to every thread of the row (uniform for the workgroup). Must be
// reached by all threads; `wg_active` may be written again only after a barrier.
fn row_publish(t: u32, x: u32) -> u32 {
    if (t == 0u) {
        wg_active = x;
    }
    return workgroupUniformLoad(&wg_active);
}
