// trainer logits as bfloat16, two per u32 word (little endian: element 2k in the low half).
@group(0) @binding(2) var<storage, read> b_words: array<u32>;

fn load_b(e: u32) -> f32 {
    return decode_bf16_bits((b_words[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
}

