// The vocabulary kernel's entry point for whole rows (params.slices = 1): ROWS rows per
// workgroup of WG threads each (`whole_row` in vocab_divergence.wgsl); ROWS > 1 only with one
// subgroup per row (reduce_slots_sg_rows.wgsl). The split kernel has its own entry point
// (vocab_split.wgsl), so neither pipeline compiles the other's code.

// Rows per workgroup (a pipeline constant).
override ROWS: u32 = 1u;

@compute @workgroup_size(WG * ROWS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    ids: SlotIds,
) {
    let at = red_init(ids);
    whole_row(flat_workgroup(wid, nwg) * ROWS + at.x, at.y);
}
