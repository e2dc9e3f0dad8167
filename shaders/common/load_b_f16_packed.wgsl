// trainer logits as IEEE half, two per u32 word (little endian: element 2k in the low half).
@group(0) @binding(2) var<storage, read> b_words: array<u32>;

fn load_b(e: u32) -> f32 {
    return decode_f16_bits((b_words[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
}

// Elements e and e + 1 for an even e: one word, one load (llvmpipe runs every load as a loop
// over its SIMD lanes, so loads are dear there).
fn load_pair_b(e: u32) -> vec2<f32> {
    let w = b_words[e >> 1u];
    return vec2<f32>(decode_f16_bits(w & 0xffffu), decode_f16_bits(w >> 16u));
}
