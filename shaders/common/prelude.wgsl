// trmask kernel prelude: shared by every kernel, concatenated first (then common/math.wgsl,
// the op's snippets and the op's own file). Each op declares its own uniform struct and
// `@group(0) @binding(0) var<uniform> params: <Op>Params;` in its own file; the struct's Rust
// twin (#[repr(C)]) sits in src/gpu/<op>.rs with a test that checks both layouts agree.

// Threads per workgroup, set by a pipeline constant (never above MAX_WG).
override WG: u32 = 256u;
const MAX_WG: u32 = 256u;

// Linear workgroup index of a (possibly 2-D) dispatch.
fn flat_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Bit `i` of a packed validity mask (32 slots per word).
fn mask_bit(word: u32, i: u32) -> bool {
    return ((word >> (i & 31u)) & 1u) != 0u;
}

// Number of live slots after one step of a workgroup tree over `live_n` slots: slot
// i < live_n - half merges slot i + half into itself (any size, power of two or not).
fn tree_half(live_n: u32) -> u32 {
    return (live_n + 1u) / 2u;
}
