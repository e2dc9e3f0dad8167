// binding 1 (rollout logits of vocab_divergence's WIDE variant) as f32, four per vec4<u32>: V is a
// multiple of 8 and every row starts 16 bytes into the binding. Same functions as
// load8_narrow.wgsl and load_a_f32.wgsl.
@group(0) @binding(1) var<storage, read> a_quads: array<vec4<u32>>;

fn load_a(e: u32) -> f32 {
    return decode_f32_bits(a_quads[e >> 2u][e & 3u]);
}

// Elements e .. e + 7 for e a multiple of 8: two 16-byte loads (`last` unused: rows hold
// whole octets).
fn load8_a(e: u32, last: u32) -> Oct {
    return Oct(quad_f32(a_quads[e >> 2u]), quad_f32(a_quads[(e >> 2u) + 1u]));
}
