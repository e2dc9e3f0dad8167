// trmask kernel prelude: shared by every kernel, concatenated first.
//
// `Meta` holds every size a dispatch needs; its Rust twin is `trmask::gpu::pipeline::Meta`
// (#[repr(C)], 32 bytes; a test checks both layouts agree). Field meaning is per op.
struct Meta {
    count: u32,   // items in this dispatch (slots, pieces, rows)
    width: u32,   // inner size (statistics per slot, vocabulary size, ...)
    stride: u32,  // element stride between items
    flags: u32,   // op-specific bit flags
    scale: f32,   // op-specific scale (e.g. 1 / temperature)
    param: f32,   // op-specific parameter
    extra0: u32,
    extra1: u32,
}

@group(0) @binding(0) var<uniform> params: Meta;

// Threads per workgroup, set by a pipeline constant (never above MAX_WG).
override WG: u32 = 256u;
const MAX_WG: u32 = 256u;

// Finite sentinels (WGSL has no infinity literals).
const BIG: f32 = 3.0e38;
const SAFETY_BOUND: f32 = 20.0;

// Linear workgroup index of a (possibly 2-D) dispatch.
fn flat_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Bit `i` of a packed validity mask (32 slots per word).
fn mask_bit(word: u32, i: u32) -> bool {
    return ((word >> (i & 31u)) & 1u) != 0u;
}

// Error-free transformation: a + b = s + e exactly (Knuth's TwoSum; no multiplications, so
// no FMA contraction can break it).
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    let bp = s - a;
    let e = (a - (s - bp)) + (b - bp);
    return vec2<f32>(s, e);
}
