// Knuth's TwoSum with an opaque 1.0, for the kernels whose sums are compensated
// (segment_reduce, masks, topk_divergence, and reduce_wg.wgsl's wg_sum2). The op's uniform
// struct `params` has a field `one: f32` that the host always sets to 1.0 and that means
// nothing else (tests check each op's Rust twin and every fused-pass IS mode).

// An opaque 1.0: the compiler cannot know its value, so it cannot fold it away.
fn opaque_one() -> f32 {
    return params.one;
}

// Error-free transformation: a + b = s + e exactly. The sum is multiplied by opaque_one():
// shader compilers treat float ops as inexact unless decorated (Mesa's NIR, LLVM fast-math)
// and rewrite `(a + b) - a` into `b`, silently zeroing e; they cannot see through
// `(a + b) * one`. Multiplying by exactly 1.0 changes nothing, and an FMA contraction of
// `s - a` then computes the same exact difference.
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = (a + b) * opaque_one();
    let bp = s - a;
    let e = (a - (s - bp)) + (b - bp);
    return vec2<f32>(s, e);
}
