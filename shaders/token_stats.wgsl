// Per-token estimators of KL(pi_roll || pi_train) (docs/FORMAT.md, log-ratio), one thread per slot.
// Input: the log-ratio lr = train - roll (computed on the
// host in f64 and rounded once to f32) and the packed validity mask. Output (SoA, 7 x count):
// log_ratio, rho, k1, k2, k3, abs, ser; invalid slots hold 0 and their input is never read.

// The kernel's uniform; Rust twin `TokenStatsParams` in src/gpu/token_stats.rs.
struct TokenStatsParams {
    slots: u32, // slots in this chunk
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: TokenStatsParams;
@group(0) @binding(1) var<storage, read> lr_in: array<f32>;
@group(0) @binding(2) var<storage, read> mask_bits: array<u32>;
@group(0) @binding(3) var<storage, read_write> stats_out: array<f32>;

// estimators(): shaders/common/math.wgsl.

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = flat_workgroup(wid, nwg) * WG + lid;
    let n = params.slots;
    if i >= n {
        return;
    }
    // invalid slots write zeros and never read their input
    var e = array<f32, 7>();
    if mask_bit(mask_bits[i >> 5u], i) {
        e = estimators(lr_in[i]);
    }
    for (var k = 0u; k < 7u; k += 1u) {
        stats_out[k * n + i] = e[k];
    }
}
