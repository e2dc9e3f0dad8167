// binding 1 (rollout logits of vocab_divergence, trainer logits of topk_divergence) as IEEE half, two per u32 word (little endian: element 2k in the low half).
@group(0) @binding(1) var<storage, read> a_words: array<u32>;

fn load_a(e: u32) -> f32 {
    return decode_f16_bits((a_words[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);
}

