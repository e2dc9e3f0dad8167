// A segmented kernel's walk over its item (a sequence or a piece) `item` of `ranges`, the
// (start, end) slot pairs of binding 3: strided across the workgroup, or all of it by one thread
// (`serial`: the ops' SERIAL variants). An item that is not `live` has no slots.
struct Walk {
    start: u32,
    end: u32,
    first: u32, // offset of the thread's first slot from `start`
    step: u32,
}

fn walk(item: u32, live: bool, lid: u32, serial: bool) -> Walk {
    var w = Walk(0u, 0u, select(lid, 0u, serial), select(WG, 1u, serial));
    if live {
        w.start = ranges[2u * item];
        w.end = ranges[2u * item + 1u];
    }
    return w;
}
