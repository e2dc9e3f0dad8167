// The vocabulary kernel's entry point for whole rows (params.slices = 1): one workgroup per
// row (`whole_row` in vocab_divergence.wgsl). The split kernel has its own entry point
// (vocab_split.wgsl), so neither pipeline compiles the other's code.

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    whole_row(flat_workgroup(wid, nwg), t);
}
