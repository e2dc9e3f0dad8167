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
