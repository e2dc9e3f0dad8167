// binding 1 (rollout logits of vocab_divergence, trainer logits of topk_divergence) as f32 words. Same function as load_a_f16_packed / load_a_bf16_packed.wgsl.
@group(0) @binding(1) var<storage, read> a_words: array<u32>;

fn load_a(e: u32) -> f32 {
    return decode_f32_bits(a_words[e]);
}

