// trainer logits as f32 words. Same function as load_b_f16_packed / load_b_bf16_packed.wgsl.
@group(0) @binding(2) var<storage, read> b_words: array<u32>;

fn load_b(e: u32) -> f32 {
    return decode_f32_bits(b_words[e]);
}

