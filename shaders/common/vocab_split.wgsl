// The vocabulary kernel's split variant (params.slices > 1): its entry point, the `part`
// binding and the four phases over slices; composed with vocab_divergence.wgsl instead of
// vocab_row_main.wgsl.

// ---- split rows ----------------------------------------------------------------------
// Rows cut into params.slices slices of params.slice_len elements (a multiple of 8; the last
// slice may be shorter), one workgroup per (row, slice), in four dispatches of this pipeline
// (params.phase), each slice's partial results in `part` (PART words per row and slice):
//   1: pass 1 over the slice → its two states and its flags (words 0 .. 12);
//   2: every workgroup of the row merges the row's states by the same fixed tree (so all derive
//      the same bits of the row's constants), then pass 2 over its slice → 13 sums (13 .. 25);
//   3: the same, then the row's pass-2 sums by a fixed tree → the exact λ and whether TV needs
//      pass 3; where it does, pass 3 over the slice → 3 sums (26 .. 28);
//   4: the combine step, one workgroup per row: the same trees (and pass 3's sums), then the
//      row's results, exactly as a whole row's.
// Every tree over slices is the workgroup's tree (workgroup memory or subgroups) with slice s in
// thread s (slices <= WG, threads past the last slice holding empty states), so results are
// deterministic for a given slice length, workgroup size and flavour; they differ in rounding
// from the whole-row kernel's.
@group(0) @binding(5) var<storage, read_write> part: array<f32>;

// The tree's total, slots 0 .. n − 1, into `part` from word `at` (any WG).
fn put_part(at: u32, t: u32, n: u32) {
    for (var k = t; k < n; k += WG) {
        part[at + k] = red_total(k);
    }
}

const PART: u32 = 32u;
const PART_P2: u32 = 13u;
const PART_P3: u32 = 26u;

fn part_base(row: u32, s: u32) -> u32 {
    return (row * params.slices + s) * PART;
}

// Slice `s` of `row` as the loops see a row.
fn slice_at(t: u32, row: u32, s: u32) -> RowAt {
    let v = params.vocab;
    let lo = s * params.slice_len;
    let n = min(params.slice_len, v - lo);
    let abase = params.a_first + row * v + lo;
    let bbase = params.b_first + row * v + lo;
    return RowAt(t, n, abase, bbase, abase + n - 1u, bbase + n - 1u);
}

// The row's pass-1 states merged by the workgroup's tree (`red_total`).
fn gather_p1(row: u32, t: u32) {
    row_sync();
    if (t < params.slices) {
        let b = part_base(row, t);
        for (var k = 0u; k < 13u; k++) {
            red_set(k, t, part[b + k]);
        }
    } else {
        acc1_store(0u, t, acc1_empty());
        acc1_store(6u, t, acc1_empty());
        red_set(12u, t, 0.0);
    }
    red_merge_tree(t);
}

// The row's `k` sums at word `off` of every slice's record, summed by the workgroup tree.
fn gather_sums(row: u32, t: u32, off: u32, k: u32) {
    row_sync();
    for (var j = 0u; j < k; j++) {
        var x = 0.0;
        if (t < params.slices) {
            x = part[part_base(row, t) + off + j];
        }
        red_set(j, t, x);
    }
    red_sum_slots(t, k);
}

fn split_row(flat: u32, t: u32) {
    let phase = params.phase;
    var row = flat / params.slices;
    var s = flat % params.slices;
    if (phase == 4u) {
        row = flat;
        s = 0u;
    }
    if (row >= params.rows) {
        return;
    }
    let ob = 8u * (params.info_first % 8u + row);
    let info = row_info[params.info_first + row];
    if (!row_valid(t, ob, info, phase == 4u)) {
        return;
    }
    let it = params.inv_temp;
    let at = slice_at(t, row, s);
    var chip: Chip;
    if (phase == 1u) {
        pass1(t, &chip, at, it, false, params.masked_first != 0u);
        put_part(part_base(row, s), t, 13u);
        return;
    }
    gather_p1(row, t);
    let gp = acc1_total(0u);
    let gq = acc1_total(6u);
    var flags = publish_p1_flags(t, gp, gq);
    if ((flags & (F_A_BAD | F_B_BAD | F_A_EMPTY | F_B_EMPTY)) != 0u) {
        if (phase == 4u) {
            write_flags_only(ob, t, flags);
        }
        return;
    }
    let rc = row_consts(gp, gq, it);
    if (phase == 2u) {
        pass2(t, &chip, at, rc, false);
        put_part(part_base(row, s) + PART_P2, t, 13u);
        return;
    }
    gather_sums(row, t, PART_P2, 13u);
    var a = after_p2(rc.dp, rc.dq, it, rc.lam0, rc.lean);
    let again = row_publish(t, select(0u, 1u, a.again));
    if (phase == 3u) {
        if (again != 0u) {
            pass3(t, &chip, at, rc, a, false);
            put_part(part_base(row, s) + PART_P3, t, 3u);
        }
        return;
    }
    if (again != 0u) {
        gather_sums(row, t, PART_P3, 3u);
        after_p3(&a, rc.dp, rc.dq, it);
    }
    if (t != 0u) {
        return;
    }
    flags |= F_SPLIT | select(0u, F_LEAN, rc.lean) | select(0u, F_THIRD_PASS, again != 0u);
    let v = params.vocab;
    let rbase = vec2<u32>(params.a_first + row * v, params.b_first + row * v);
    write_results(ob, info, rbase, flags, rc.dp, rc.dq, it, a);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    ids: SlotIds,
) {
    split_row(flat_workgroup(wid, nwg), red_init(ids).y);
}
