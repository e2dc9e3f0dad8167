// binding 2 (trainer logits of vocab_divergence's WIDE variant) as IEEE half, eight per vec4<u32> (little
// endian: element 2k in the low half of word k): V is a multiple of 8 and every row starts 16
// bytes into the binding. Same functions as load8_narrow.wgsl and load_b_f16_packed.wgsl.
@group(0) @binding(2) var<storage, read> b_quads: array<vec4<u32>>;

fn load_b(e: u32) -> f32 {
    return decode_f16_bits((b_quads[e >> 3u][(e >> 1u) & 3u] >> ((e & 1u) * 16u)) & 0xffffu);
}

// Elements e .. e + 7 for e a multiple of 8: one 16-byte load (`last` unused: rows hold
// whole octets).
fn load8_b(e: u32, last: u32) -> Oct {
    return oct_f16(b_quads[e >> 3u]);
}
