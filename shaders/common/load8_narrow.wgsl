// The vocabulary kernel's eight-element loads where rows are not 16-byte aligned (or V is not a
// multiple of 8): `load8_a` / `load8_b` read elements e .. e + 7 one by one with `load_a` /
// `load_b`, an index past `last` (the row's last element) reading `last` again — a value of
// the row, so maxima and minima stay those of the row; the callers drop such elements. The
// WIDE variant's loaders (load_<a|b>_<dtype>_wide.wgsl) define the same two functions.

fn load8_a(e: u32, last: u32) -> Oct {
    let i = min(vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let j = min(vec4<u32>(e) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last));
    return Oct(vec4<f32>(load_a(i.x), load_a(i.y), load_a(i.z), load_a(i.w)),
        vec4<f32>(load_a(j.x), load_a(j.y), load_a(j.z), load_a(j.w)));
}

fn load8_b(e: u32, last: u32) -> Oct {
    let i = min(vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let j = min(vec4<u32>(e) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last));
    return Oct(vec4<f32>(load_b(i.x), load_b(i.y), load_b(i.z), load_b(i.w)),
        vec4<f32>(load_b(j.x), load_b(j.y), load_b(j.z), load_b(j.w)));
}
