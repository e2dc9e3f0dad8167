// Element decoders for logits stored as packed little-endian u32 words (no SHADER_F16 needed, no
// SHADER_FLOAT16_IN_FLOAT32 either: every decoder is integer widening plus bitcast).
// Every decoder maps -inf to NEG_SENTINEL (p = 0) and NaN / +inf to BAD_SENTINEL, both finite
// (common/math.wgsl), so no infinity ever enters the arithmetic; classify with `is_neg_inf` /
// `is_bad` there.

fn decode_f32_bits(w: u32) -> f32 {
    if ((w & 0x7f800000u) == 0x7f800000u) {
        if (w == 0xff800000u) {
            return NEG_SENTINEL;
        }
        return BAD_SENTINEL;
    }
    return bitcast<f32>(w);
}

// h: the 16 bits of one IEEE binary16 value.
fn decode_f16_bits(h: u32) -> f32 {
    if ((h & 0x7c00u) == 0x7c00u) {
        if (h == 0xfc00u) {
            return NEG_SENTINEL;
        }
        return BAD_SENTINEL;
    }
    // Integer widening instead of unpack2x16float, which naga gates behind
    // SHADER_FLOAT16_IN_FLOAT32 (absent on some downlevel adapters).
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // zero / subnormal: m · 2^-24, exact in f32
        let mag = f32(m) * 5.9604645e-8;
        return select(mag, -mag, (h & 0x8000u) != 0u);
    }
    return bitcast<f32>(((h & 0x8000u) << 16u) | ((e + 112u) << 23u) | (m << 13u));
}

// h: the 16 bits of one bfloat16 value (the high half of an f32).
fn decode_bf16_bits(h: u32) -> f32 {
    if ((h & 0x7f80u) == 0x7f80u) {
        if (h == 0xff80u) {
            return NEG_SENTINEL;
        }
        return BAD_SENTINEL;
    }
    return bitcast<f32>(h << 16u);
}

// Eight consecutive elements of a row (the vocabulary kernel's unit of loading): e .. e + 3 in
// `lo`, e + 4 .. e + 7 in `hi`.
struct Oct {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The four words of a vec4<u32> as f32 values.
fn quad_f32(q: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(decode_f32_bits(q.x), decode_f32_bits(q.y), decode_f32_bits(q.z), decode_f32_bits(q.w));
}

// The eight bfloat16 / binary16 halves of a vec4<u32>, low half of each word first.
fn oct_bf16(q: vec4<u32>) -> Oct {
    return Oct(
        vec4<f32>(decode_bf16_bits(q.x & 0xffffu), decode_bf16_bits(q.x >> 16u), decode_bf16_bits(q.y & 0xffffu), decode_bf16_bits(q.y >> 16u)),
        vec4<f32>(decode_bf16_bits(q.z & 0xffffu), decode_bf16_bits(q.z >> 16u), decode_bf16_bits(q.w & 0xffffu), decode_bf16_bits(q.w >> 16u)),
    );
}

fn oct_f16(q: vec4<u32>) -> Oct {
    return Oct(
        vec4<f32>(decode_f16_bits(q.x & 0xffffu), decode_f16_bits(q.x >> 16u), decode_f16_bits(q.y & 0xffffu), decode_f16_bits(q.y >> 16u)),
        vec4<f32>(decode_f16_bits(q.z & 0xffffu), decode_f16_bits(q.z >> 16u), decode_f16_bits(q.w & 0xffffu), decode_f16_bits(q.w >> 16u)),
    );
}
