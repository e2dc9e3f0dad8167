// The vocabulary kernel's split variant (params.slices > 1): its entry point, the `part`
// binding and the three phases over slices; composed with vocab_divergence.wgsl instead of
// vocab_row_main.wgsl.

// ---- split rows: one read where the algebra allows -------------------------------------
// Rows cut into params.slices slices of params.slice_len elements (a multiple of 8; the last
// slice may be shorter), one workgroup per (row, slice), in three dispatches of this pipeline
// (params.phase), each slice's partial results in `part` (PART words per row and slice):
//   1: pass 1 over the slice with its octets kept on-chip (slices of at most 8·WG·ONCHIP_OCTS
//      elements; a longer slice is read again), then pass 2 on that copy with the slice's OWN
//      constants (its maxima m_s, centres c_s, λ0_s, lean or general loop): the two pass-1
//      states and the flags (words 0 .. 12), the 13 pass-2 sums (13 .. 25, TV's three in the
//      slice's weight units), λ0_s, both centres, the loop, its p-weight within NEAR_WIDE of
//      TV's kink and whether it was read twice (26 .. 31).
//   2: every workgroup of the row merges the row's states and the slices' pass-2 sums (below)
//      by the same fixed trees as the combine step, so all derive the same bits: the exact λ
//      and TV's estimate. Its own slice's certificate (below) decides whether TV needs that
//      slice again: only then is the slice read a second time (pass 3 with the exact λ, words
//      32 .. 34); word 35 says which it did.
//   3: the combine step, one workgroup per row: the same merges, TV from each slice's linear
//      term or, where word 35 says so, its re-read sum; the row's results.
// Every tree over slices is the workgroup's tree (workgroup memory or subgroups) with slice s
// in thread s (slices <= WG, threads past the last slice contributing nothing), so results are
// deterministic for a given slice length, workgroup size and flavour; they differ in rounding
// from the whole-row kernel's.
//
// The merge (closed form, second order). One direction, slice s: weights w_s = e^{(x−m_s)it},
// centred log-ratios u_s = (d − c_s)·it, over its normal elements (u_s >= −T_EXT, or all on a
// lean slice) S_s = Σw_s, U_s = Σw_s·u_s (≈ 0: c_s is the slice's own mean) and
// W_s = Σw_s·w(u_s). At the row's constants w = α_s·w_s, α_s = e^{(m_s−m)it} <= 1, and
// u = u_s − δ_s, δ_s = (c − c_s)·it. Since
//   w(u_s − δ) = e^{δ}·w(u_s) + k3(δ) − expm1(δ)·u_s      (k3(δ) = expm1(δ) − δ >= 0),
//   Σw·u    = α_s·(U_s − δ_s·S_s),
//   Σw·w(u) = α_s·e^{δ_s}·W_s + α_s·k3(δ_s)·S_s − α_s·expm1(δ_s)·U_s:
// two non-negative second-order terms plus U_s (rounding-sized) times δ_s, so the merged W is
// a sum of non-negative second-order terms and nothing cancels (Chan's merge of centred
// moments, with w in place of the square). α_s·e^{δ_s} is one exponential, α_s·k3(δ_s) and
// α_s·expm1(δ_s) come from k3's series for |δ_s| <= ½. The extreme elements: Σw·u
// = α_s·(ue_s − δ_s·pe_s), Σw = α_s·pe_s, and the other side's weights relative to its
// common-support maximum t: e^{(t_s − t)it}·ee_s. Which elements a slice classed extreme does
// not matter: finish_dir's x = W − U − out − P_ext + Σ_ext p·e^{−u} holds for any partition.
//
// TV's certificate. A slice summed tv0_s = Σw_s·|e^{v_s} − 1| and g_s = Σ sign(v_s)·w_s·e^{v_s}
// at its own log-ratios v_s = −u_s − λ0_s. The row's are v = v_s − Δ_s with
// Δ_s = (λ − λ0_s) − δ_s (λ the row's exact one). For every element whose sign does not change,
// w_s·|e^{v_s − Δ} − 1| = sign(v_s)·(w_s·e^{v_s}·e^{−Δ} − w_s), so the slice's TV at the row's λ
// is tv0_s + expm1(−Δ_s)·g_s exactly; only elements with |v_s| <= |Δ_s| can change sign, each
// off by at most 2·w_s·expm1(|Δ_s|). The bound 2·expm1(|Δ_s|)·M_s, M_s the slice's p-weight
// within TAU_KINK or NEAR_WIDE of the kink (the smaller window holding |Δ_s|), else all of
// it, in the row's units, must stay within the slice's share of the budget
// (1e-4·TV + 1e-10)·(P_s + 1/slices)/2, P_s its common-support p-mass (the shares sum to the
// budget, a twentieth of TV's tolerance). Slices failing it, and every slice of a row whose
// common-support mass underflowed in pass 1, are read again.
@group(0) @binding(5) var<storage, read_write> part: array<f32>;

// The tree's total, slots 0 .. n − 1, into `part` from word `at` (any WG).
fn put_part(at: u32, t: u32, n: u32) {
    for (var k = t; k < n; k += WG) {
        part[at + k] = red_total(k);
    }
}

const PART: u32 = 40u;
const PART_P2: u32 = 13u;
const PART_K: u32 = 26u;
const PART_P3: u32 = 32u;
const PART_REREAD: u32 = 35u;

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

// Pass 1's masked loop from the start over a slice kept on-chip (GPUs: a slice holding a −inf,
// as a truncated rollout row's do, is then summed once, not by the plain loop and again by the
// masked one); its states and flags merged by the row's tree as `pass1` does.
// Only the split pipeline has this loop (whole rows kept on-chip take the plain loop first).
fn pass1_masked_kept(t: u32, c: ptr<function, Chip>, at: RowAt, it: f32) {
    let it2 = it * LOG2E;
    var sp = acc1_empty();
    var sq = acc1_empty();
    var fl = F_MASKED_FIRST;
    var k = 0u;
    for (var i = 8u * at.t; i < at.v; i += 8u * WG) {
        let xo = load8_a(at.abase + i, at.last_a);
        let yo = load8_b(at.bbase + i, at.last_b);
        (*c).x[k] = xo;
        (*c).y[k] = yo;
        k += 1u;
        fl |= p1_block(&sp, &sq, xo, yo, i, at.v, it2);
    }
    acc1_store(0u, t, sp);
    acc1_store(6u, t, sq);
    red_set(12u, t, f32(fl));
    red_merge_tree(t);
}

// Phase 1: pass 1 and pass 2 of slice `s` at its own constants, into its record.
fn slice_phase1(row: u32, s: u32, t: u32, at: RowAt, it: f32, chip: ptr<function, Chip>) {
    let fits = at.v <= 8u * WG * ONCHIP_OCTS;
    if (fits && params.masked_first != 0u) {
        pass1_masked_kept(t, chip, at, it);
    } else {
        pass1(t, chip, at, it, fits, params.masked_first != 0u);
    }
    let b = part_base(row, s);
    put_part(b, t, 13u);
    let gp = acc1_total(0u);
    let gq = acc1_total(6u);
    // pass 2 where the slice holds common support and no bad value (the publish is a barrier:
    // every thread has read the totals before pass 2 writes its slots)
    let f = u32(red_total(12u));
    let go = row_publish(t, select(0u, 1u, (f & (F_A_BAD | F_B_BAD)) == 0u && gp.mc > EMPTY_MAX));
    let twice = select(1.0, 0.0, fits);
    if (go == 0u) {
        for (var k = PART_P2 + t; k < PART_P3; k += WG) {
            part[b + k] = select(0.0, twice, k == PART_K + 5u);
        }
        return;
    }
    let rc = row_consts(gp, gq, it);
    let nw = pass2(t, chip, at, rc, fits);
    // TV's sums in the slice's weight units (the general loop summed probabilities)
    let unit = select(rc.dp.s, 1.0, rc.lean);
    for (var k = t; k < 13u; k += WG) {
        part[b + PART_P2 + k] = red_total(k) * select(1.0, unit, k >= 10u);
    }
    row_sync();
    red_set(0u, t, nw);
    red_sum_slots(t, 1u);
    if (t == 0u) {
        part[b + PART_K] = rc.lam0;
        part[b + PART_K + 1u] = rc.dp.c;
        part[b + PART_K + 2u] = rc.dq.c;
        part[b + PART_K + 3u] = select(0.0, 1.0, rc.lean);
        part[b + PART_K + 4u] = red_total(0u) * unit;
        part[b + PART_K + 5u] = twice;
    }
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

// One direction's pass-2 sums of a slice (record words o .. o + 4: u, w, pe, ee, ue) moved to
// the row's constants `d`: `m_s`, `s_in`, `c_s` the slice's own maximum, common-support weight
// and centre, `t_s` / `t_row` the other side's common-support maximum in the slice / the row.
fn dir_to_row(o: u32, m_s: f32, s_in: f32, c_s: f32, t_s: f32, d: Dir, t_row: f32, it: f32) -> Dir2 {
    let u = part[o];
    let w = part[o + 1u];
    let pe = part[o + 2u];
    let ee = part[o + 3u];
    let ue = part[o + 4u];
    let s_norm = s_in - pe;
    let la = (m_s - d.m) * it;
    let dl = (d.c - c_s) * it;
    let a = exp(la);
    let ae = exp(la + dl); // α·e^{δ}
    var ak3 = (ae - a) - a * dl; // α·k3(δ)
    var aem = ae - a; // α·expm1(δ)
    if (abs(dl) <= 0.5) {
        let k = k3_series(dl);
        ak3 = a * k;
        aem = a * (dl + k);
    }
    var r: Dir2;
    r.u = a * u - (a * dl) * s_norm;
    r.w = (ae * w + ak3 * s_norm) - aem * u;
    r.ue = a * ue - (a * dl) * pe;
    r.pe = a * pe;
    r.ee = exp((t_s - t_row) * it) * ee;
    return r;
}

// Slice t's pass-2 sums at the row's constants into slots 0 .. 9 of thread t's row
// (`dirs_set`), zeros for a slice without common support or past the last slice; then the tree.
fn merge_p2(row: u32, t: u32, rc: RowC, it: f32) {
    var fp = Dir2(0.0, 0.0, 0.0, 0.0, 0.0);
    var fq = Dir2(0.0, 0.0, 0.0, 0.0, 0.0);
    if (t < params.slices) {
        let b = part_base(row, t);
        if (part[b + 4u] > EMPTY_MAX) {
            fp = dir_to_row(b + PART_P2, part[b], part[b + 1u], part[b + PART_K + 1u], part[b + 10u], rc.dp, rc.dq.mc, it);
            fq = dir_to_row(b + PART_P2 + 5u, part[b + 6u], part[b + 7u], part[b + PART_K + 2u], part[b + 4u], rc.dq, rc.dp.mc, it);
        }
    }
    row_sync();
    dirs_set(t, fp, fq);
    red_sum_slots(t, 10u);
}

// Slice t's TV at the row's exact λ `lam` by its linear term (row units), the bound on that
// term's error and its common-support p-mass (zeros for a slice without common support or
// past the last slice).
fn slice_tv(row: u32, t: u32, lam: f32, rc: RowC, it: f32) -> vec3<f32> {
    if (t >= params.slices) {
        return vec3<f32>(0.0);
    }
    let b = part_base(row, t);
    if (part[b + 4u] <= EMPTY_MAX) {
        return vec3<f32>(0.0);
    }
    let la = (part[b] - rc.dp.m) * it;
    let a = exp(la);
    let dl = (lam - part[b + PART_K]) - (rc.dp.c - part[b + PART_K + 1u]) * it;
    // α·expm1(−Δ) without overflow where α is tiny and Δ very negative
    var aem = exp(la - dl) - a;
    if (abs(dl) <= 0.5) {
        aem = a * expm1_acc(-dl);
    }
    let tv = (a * part[b + PART_P2 + 10u] + aem * part[b + PART_P2 + 11u]) * rc.dp.inv_s;
    let s_in = part[b + 1u];
    let ad = abs(dl);
    var mass = s_in;
    if (ad <= TAU_KINK) {
        mass = part[b + PART_P2 + 12u];
    } else if (ad <= NEAR_WIDE) {
        mass = part[b + PART_K + 4u];
    }
    // 2·α·expm1(|Δ|)·M in the row's units; α·e^{|Δ|} as one exponential (α may underflow
    // where e^{|Δ|} is huge: a slice far below the row's maximum whose element sits at its own
    // kink); an overflow fails the certificate
    var aex = exp(la + ad) - a;
    if (ad <= 0.5) {
        aex = a * expm1_acc(ad);
    }
    var bound = 0.0;
    if (mass > 0.0) {
        bound = 2.0 * aex * mass * rc.dp.inv_s;
    }
    return vec3<f32>(tv, bound, a * s_in * rc.dp.inv_s);
}

fn split_row(flat: u32, t: u32) {
    let phase = params.phase;
    var row = flat / params.slices;
    var s = flat % params.slices;
    if (phase == 3u) {
        row = flat;
        s = 0u;
    }
    if (row >= params.rows) {
        return;
    }
    let ob = 8u * (params.info_first % 8u + row);
    let info = row_info[params.info_first + row];
    if (!row_valid(t, ob, info, phase == 3u)) {
        return;
    }
    let it = params.inv_temp;
    let at = slice_at(t, row, s);
    var chip: Chip;
    if (phase == 1u) {
        slice_phase1(row, s, t, at, it, &chip);
        return;
    }
    gather_p1(row, t);
    let gp = acc1_total(0u);
    let gq = acc1_total(6u);
    var flags = publish_p1_flags(t, gp, gq);
    if ((flags & (F_A_BAD | F_B_BAD | F_A_EMPTY | F_B_EMPTY)) != 0u) {
        if (phase == 3u) {
            write_flags_only(ob, t, flags);
        }
        return;
    }
    let rc = row_consts(gp, gq, it);
    merge_p2(row, t, rc, it);
    var a = after_kl(rc.dp, rc.dq, it, rc.lam0);
    // TV's estimate from every slice's linear term, then thread t's certificate
    let tl = slice_tv(row, t, a.lam, rc, it);
    row_sync();
    red_set(0u, t, tl.x);
    red_sum_slots(t, 1u);
    let tv_est = red_total(0u) + rc.dp.out_frac + rc.dq.out_frac;
    let share = 0.5 * (tl.z + 1.0 / f32(params.slices));
    let passes = a.nq.ok && a.np.ok && tl.y <= (1.0e-4 * tv_est + 1.0e-10) * share;
    if (phase == 2u) {
        // slice s's verdict is thread s's (published through `wg_active`: split rows run one
        // row per workgroup in either flavour)
        workgroupBarrier();
        if (t == s) {
            wg_active = select(1u, 0u, passes);
        }
        let again = workgroupUniformLoad(&wg_active);
        let b = part_base(row, s);
        if (again != 0u) {
            pass3(t, &chip, at, rc, a, false);
            put_part(b + PART_P3, t, 3u);
        }
        if (t == 0u) {
            part[b + PART_REREAD] = f32(again);
        }
        return;
    }
    // the combine step: TV from the linear terms or the re-read sums, with the count of
    // re-read slices and (where pass 1's underflowed) the common-support masses
    var v = vec4<f32>(tl.x, 0.0, 0.0, 0.0);
    if (t < params.slices) {
        let b = part_base(row, t);
        if (part[b + PART_REREAD] != 0.0) {
            v = vec4<f32>(part[b + PART_P3], 1.0, part[b + PART_P3 + 1u], part[b + PART_P3 + 2u]);
        }
    }
    row_sync();
    red_set(0u, t, v.x);
    red_set(1u, t, v.y);
    red_set(2u, t, v.z);
    red_set(3u, t, v.w);
    red_sum_slots(t, 4u);
    a.tv = red_total(0u);
    let rereads = u32(red_total(1u));
    if (!a.nq.ok) {
        a.nq.v = rc.dq.log_s - ((rc.dq.mc - rc.dq.m) * it + log(red_total(2u)));
    }
    if (!a.np.ok) {
        a.np.v = rc.dp.log_s - ((rc.dp.mc - rc.dp.m) * it + log(red_total(3u)));
    }
    if (t != 0u) {
        return;
    }
    let fits = params.slice_len <= 8u * WG * ONCHIP_OCTS;
    flags |= F_SPLIT | select(0u, F_LEAN, rc.lean) | select(0u, F_THIRD_PASS, rereads > 0u)
        | select(F_SLICES_TWICE, F_ON_CHIP, fits) | (min(rereads, 511u) << REREAD_SHIFT);
    let v0 = params.vocab;
    let rbase = vec2<u32>(params.a_first + row * v0, params.b_first + row * v0);
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
