// Exact vocabulary divergences, one workgroup per row (token slot), or, with params.slices > 1,
// rows split across workgroups: each slice runs pass 1 and pass 2 (at its own constants) on
// one read, the slices' sums merged in closed form by fixed trees, TV's slices read again only
// where their certificate fails, and a combine step per row (common/vocab_split.wgsl).
// Composed as: common/prelude.wgsl (WG, MAX_WG, tree_half) + common/math.wgsl (sentinels,
// w_of, expm1_acc, log1p_acc, log1p_minus_x) + common/unpack.wgsl (decoders, `Oct`) +
// the row's trees (common/reduce_slots_wg.wgsl: workgroup memory; or the subgroup flavour,
// common/reduce_slots_shuffle.wgsl + common/reduce_slots_sg.wgsl, or with one subgroup per
// row and ROWS rows per workgroup + common/reduce_slots_sg_rows.wgsl) + the loaders of bindings 1 and 2
// (`load_a` / `load_b`: one element; `load8_a` / `load8_b`: eight): in the WIDE variant
// common/load_a_<rollout dtype>_wide.wgsl + common/load_b_<trainer dtype>_wide.wgsl (vec4<u32>
// words), else common/load_a_<rollout dtype>.wgsl + common/load_b_<trainer dtype>.wgsl +
// common/load8_narrow.wgsl; then the entry point: common/vocab_row_main.wgsl (whole rows) or
// common/vocab_split.wgsl (split rows, with their `part` binding); then this file.
//
// Per row, with x = rollout logits, y = trainer logits, it = 1/temperature,
// a = x·it, b = y·it, p = softmax(a), q = softmax(b), d = a − b:
//
// Pass 1 (online, merged by a fixed tree; no exp can overflow): per direction the log-partition
//   (max m, Σe^{a−m} over the common support and outside q's support), Σe^{a−m}(a−m) for the
//   entropy, the maximum over the common support and Σe^{a−m}·d over it. This gives the shift
//   c = E_p[d] (only a centre: its rounding moves no result) and a first estimate λ0 of
//   lse_b − lse_a + c.
// Pass 2 (fixed shift): u = d − c, U = E_p[u] ≈ 0 and W = E_p[w(u)], w(u) = expm1(−u) + u ≥ 0
//   (series for small |u|), elements with u < −T kept apart so nothing overflows. Then
//   E_p[e^{−u}] = 1 + x, x = W − U − P_out (+ extreme terms) and
//   KL(p‖q) = W + (log1p(x) − x) − log1p(−Q_out): every term is second order, nothing cancels.
//   The same for KL(q‖p) with the roles swapped. TV = ½Σ|p−q| with p_i|expm1(−u_i − λ0)| is
//   accumulated in the same pass together with its derivative in λ, and corrected to first
//   order to the exact λ = log(1 + x) − log1p(−Q_out) found by pass 2. Rows with small λ0
//   and moderate cross factors take a lean loop with the same sums (see `lean` in
//   `row_consts`). Every exponential of the loops is exp2 of a difference scaled by
//   it·log2(e) (one multiply, which GPUs' exp would add).
// Pass 3 (only rows where the first-order correction is not provably negligible, i.e. much
//   p-mass sits within |λ − λ0| of TV's kink): TV again with the exact λ.
// Pass 1's order: on CPU adapters the plain loop (no per-element masks) and, for rows holding a
//   −inf, NaN or +inf, the masked loop again; on GPUs (params.masked_first) the masked loop
//   from the start, so such rows are read no more often than others.
// Rows of at most 8·WG·ONCHIP_OCTS elements are read from memory once: each thread keeps its
//   octets of both rows on-chip during pass 1 and the later passes run on that copy, in the
//   same order (the same bits as reading the row again).
// Raw logit differences are formed before scaling by `it`, so temperature costs no accuracy.

// Slots per thread of the trees (pass 1: two 6-float states and the flags; pass 2: 13 sums):
// in the workgroup flavour 13 × 256 f32 plus `wg_active` is 13,316 bytes of workgroup memory,
// within WebGPU's 16,384.
const RED_SLOTS: u32 = 13u;
const T_EXT: f32 = 30.0; // u < −T_EXT: e^{−u} handled in log space
const TAU_KINK: f32 = 1.0e-5; // |log(q/p)| window around TV's kink (see pass 3)
// a wider window, whose p-mass split rows' slices also count (their TV certificate, see
// common/vocab_split.wgsl)
const NEAR_WIDE: f32 = 0.03125;
const LEAN_LAMBDA: f32 = 0.25; // pass 2's lean loop: |λ0| at most this
const LEAN_K: f32 = 40.0; // ... the cross factor |k| at most this (w_y·e^{k} ≤ e^{40}), and |δ| ≤ LEAN_LAMBDA

// flags written to out[8·row + 7] (as an exact small float)
const F_KL_INF: u32 = 1u;
const F_KLR_INF: u32 = 2u;
const F_LP_NEGINF: u32 = 4u;
const F_LQ_NEGINF: u32 = 8u;
const F_A_BAD: u32 = 16u;
const F_B_BAD: u32 = 32u;
const F_A_EMPTY: u32 = 64u;
const F_B_EMPTY: u32 = 128u;
const F_LEAN: u32 = 256u; // pass 2 took the lean loop
const F_THIRD_PASS: u32 = 512u; // the row was read a third time (pass 3)
const F_PASS1_FULL: u32 = 1024u; // pass 1 ran again with masks (see pass 1 in main)
const F_ON_CHIP: u32 = 2048u; // the row was read once: every later loop ran on the copy kept on-chip
const F_SPLIT: u32 = 4096u; // the row was cut into slices (common/vocab_split.wgsl)
const F_MASKED_FIRST: u32 = 8192u; // pass 1 ran the masked loop from the start (GPUs)
const F_SLICES_TWICE: u32 = 16384u; // split row: slices too long to keep on-chip, read twice
const REREAD_SHIFT: u32 = 15u; // split row: how many slices TV read again, from this bit

// Octets (eight elements of each row) a thread keeps on-chip: rows of V <= 8·WG·ONCHIP_OCTS
// elements are read from memory once, by the plain pass 1, and every later loop (the masked
// pass 1, pass 2, pass 3) runs on the thread's private copy (`Chip`) instead of reading the
// row again. The host (src/gpu/vocab_divergence.rs, `ONCHIP_OCTS`) picks workgroups large
// enough for that where it can.
const ONCHIP_OCTS: u32 = 16u;

// The kernel's uniform; Rust twin `VocabDivergenceParams` in src/gpu/vocab_divergence.rs.
struct VocabDivergenceParams {
    rows: u32, // rows in this chunk
    vocab: u32, // vocabulary size V
    a_first: u32, // index of the chunk's first rollout element inside binding 1
    b_first: u32, // index of the chunk's first trainer element inside binding 2
    info_first: u32, // index of the chunk's first row inside binding 3 (binding 4 holds 8
                     // results per row from row info_first % 8; both windows start at a
                     // multiple of 256 bytes)
    has_responses: u32, // 1: row_info holds sampled ids (log-probs wanted)
    inv_temp: f32, // 1 / temperature
    one: f32, // always 1.0: two_sum's opaque one (common/two_sum.wgsl)
    slices: u32, // slices per row: 1 one workgroup per row, else see common/vocab_split.wgsl
    slice_len: u32, // elements per slice (a multiple of 8) when slices > 1
    phase: u32, // which of the split kernel's four dispatches this is (1 .. 4)
    masked_first: u32, // 1: pass 1 runs the masked loop from the start (see `pass1`)
}

// true (the WIDE variant, whose loaders read vec4<u32> words): V is a multiple of 8 and every
// row starts on a 16-byte boundary, so each thread's eight elements i .. i + 7 (i a multiple of
// 8) are one or two 16-byte loads and always inside the row. Every loop reads eight elements
// per thread and step (`load8_a` / `load8_b`) in both variants, in the same order, so the two
// give the same bits; a pipeline constant, so the WIDE pipeline compiles no range checks.
override WIDE: bool = false;

@group(0) @binding(0) var<uniform> params: VocabDivergenceParams;
// per row: the sampled token id, or ROW_MASKED for an invalid slot
@group(0) @binding(3) var<storage, read> row_info: array<u32>;
@group(0) @binding(4) var<storage, read_write> results: array<f32>;

const ROW_MASKED: u32 = 0xffffffffu;

var<workgroup> wg_active: u32;

// A thread's on-chip copy of its octets of both rows (octet k holds elements 8·(t + k·WG) ..).
struct Chip {
    x: array<Oct, ONCHIP_OCTS>,
    y: array<Oct, ONCHIP_OCTS>,
}

// Where a thread's octets of the row lie: thread t's k-th octet starts at element
// 8·(t + k·WG) of the row (`abase` / `bbase` the rows' first elements, `last_*` their last).
struct RowAt {
    t: u32,
    v: u32,
    abase: u32,
    bbase: u32,
    last_a: u32,
    last_b: u32,
}

// Octet k of the thread's rows (element i = its first): from the on-chip copy when `chip`,
// else read from memory. `chip` is a constant at every call site, so each loop compiles only
// its own source (software rasterizers would otherwise run both sides inside the loop).
fn oct_x(c: ptr<function, Chip>, k: u32, i: u32, at: RowAt, chip: bool) -> Oct {
    if (chip) {
        return (*c).x[k];
    }
    return load8_a(at.abase + i, at.last_a);
}

fn oct_y(c: ptr<function, Chip>, k: u32, i: u32, at: RowAt, chip: bool) -> Oct {
    if (chip) {
        return (*c).y[k];
    }
    return load8_b(at.bbase + i, at.last_b);
}

// ---- pass 1 state (raw logit units; `it2` = it·log2(e) applied to differences) -----------
// Every exponential of pass 1 is exp2((x − m)·it2) = e^{(x−m)it}: log2(e) is folded into the
// scaling, and h is kept in log2 units (make_dir multiplies by ln 2 once per row).
struct Acc1 {
    m: f32, // running max of x (raw)
    s_in: f32, // Σ e^{(x−m)it} where the other side is finite
    s_out: f32, // Σ e^{(x−m)it} where the other side is −inf
    h: f32, // Σ e^{(x−m)it}·(x−m)it2  (log2 units)
    mc: f32, // max of x over the common support
    su: f32, // Σ_common e^{(x−m)it}·(x−y)   (raw units)
    // the rounding errors of s_in and h (TwoSum per four elements): a thread adds hundreds of
    // tiny terms to a sum near 1 on peaked rows, and uncompensated those roundings moved
    // entropies and log-probs by ~1e-5; folded into s_in and h before the workgroup tree
    cs: f32,
    ch: f32,
}

fn acc1_empty() -> Acc1 {
    return Acc1(EMPTY_MAX, 0.0, 0.0, 0.0, EMPTY_MAX, 0.0, 0.0, 0.0);
}

// The state with its compensations folded into s_in and h (before a rescale and the tree).
fn acc1_folded(st: Acc1) -> Acc1 {
    var r = st;
    r.s_in = st.s_in + st.cs;
    r.h = st.h + st.ch;
    r.cs = 0.0;
    r.ch = 0.0;
    return r;
}

// Adds the local sums `ds` (to s_in) and `dh` (to h) of four elements with TwoSum.
fn acc1_comp(st: ptr<function, Acc1>, ds: f32, dh: f32) {
    let a = two_sum((*st).s_in, ds);
    (*st).s_in = a.x;
    (*st).cs = (*st).cs + a.y;
    let b = two_sum((*st).h, dh);
    (*st).h = b.x;
    (*st).ch = (*st).ch + b.y;
}

// Rescales a state to the running maximum `mx` when that is larger (no-op otherwise);
// `it2` = it·log2(e).
fn acc1_rescale(st: ptr<function, Acc1>, mx: f32, it2: f32) {
    if (mx > (*st).m) {
        *st = acc1_folded(*st);
        let l2 = ((*st).m - mx) * it2;
        let k = exp2(l2);
        let s = (*st).s_in + (*st).s_out;
        (*st).h = k * ((*st).h + l2 * s);
        (*st).s_in = k * (*st).s_in;
        (*st).s_out = k * (*st).s_out;
        (*st).su = k * (*st).su;
        (*st).m = mx;
    }
}

// Adds an element x <= the state's maximum when `on` (`y_fin`: the other side is finite
// there) to the state's plain sums and returns its terms of s_in and h (x: Σe, y: Σe·lx),
// which the caller adds compensated per four elements. Branch-free: software rasterizers run
// both sides of an `if` anyway, and selects cost less than their masks; the values a select
// drops may be ±inf, never used.
fn acc1_add(st: ptr<function, Acc1>, on: bool, x: f32, y: f32, y_fin: bool, it2: f32) -> vec2<f32> {
    let lx = (x - (*st).m) * it2;
    let e = exp2(lx);
    let both = on && y_fin;
    (*st).mc = select((*st).mc, max((*st).mc, x), both);
    (*st).su = select((*st).su, (*st).su + e * (x - y), both);
    (*st).s_out = select((*st).s_out, (*st).s_out + e, on && !y_fin);
    return vec2<f32>(select(0.0, e, both), select(0.0, e * lx, on));
}

// Pass 1's flags of one element.
fn p1_flags(x: f32, y: f32) -> u32 {
    let xn = is_neg_inf(x);
    let yn = is_neg_inf(y);
    return select(0u, F_A_BAD, is_bad(x)) | select(0u, F_B_BAD, is_bad(y))
        | select(0u, F_KL_INF, !xn && yn) // p > 0 where q = 0
        | select(0u, F_KLR_INF, xn && !yn);
}

// A value that enters a state: finite (not −inf, not NaN / +inf).
fn usable(x: f32) -> bool {
    return !is_neg_inf(x) && !is_bad(x);
}

// One element of pass 1 into both states (each already rescaled to a maximum at least x, y).
// Returns both states' terms (xy: p's s_in and h, zw: q's).
fn p1_elem(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, x: f32, y: f32, ux: bool, uy: bool, it2: f32) -> vec4<f32> {
    let a = acc1_add(sp, ux, x, y, uy, it2);
    let b = acc1_add(sq, uy, y, x, ux, it2);
    return vec4<f32>(a, b);
}

// Four elements of pass 1: both states rescaled once to their maxima, then the elements added
// in index order.
fn p1_step(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, xs: vec4<f32>, ys: vec4<f32>, it2: f32) {
    let ux = vec4<bool>(usable(xs.x), usable(xs.y), usable(xs.z), usable(xs.w));
    let uy = vec4<bool>(usable(ys.x), usable(ys.y), usable(ys.z), usable(ys.w));
    let mxs = select(vec4<f32>(EMPTY_MAX), xs, ux);
    let mys = select(vec4<f32>(EMPTY_MAX), ys, uy);
    acc1_rescale(sp, max(max(mxs.x, mxs.y), max(mxs.z, mxs.w)), it2);
    acc1_rescale(sq, max(max(mys.x, mys.y), max(mys.z, mys.w)), it2);
    let t0 = p1_elem(sp, sq, xs.x, ys.x, ux.x, uy.x, it2);
    let t1 = p1_elem(sp, sq, xs.y, ys.y, ux.y, uy.y, it2);
    let t2 = p1_elem(sp, sq, xs.z, ys.z, ux.z, uy.z, it2);
    let t3 = p1_elem(sp, sq, xs.w, ys.w, ux.w, uy.w, it2);
    let t = (t0 + t1) + (t2 + t3);
    acc1_comp(sp, t.x, t.y);
    acc1_comp(sq, t.z, t.w);
}

// Which of the elements i .. i + 7 lie in the row (all of them in the WIDE variant).
struct InRow {
    lo: vec4<bool>,
    hi: vec4<bool>,
}

fn in_row(i: u32, v: u32) -> InRow {
    let lo = vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(v);
    let hi = vec4<u32>(i) + vec4<u32>(4u, 5u, 6u, 7u) < vec4<u32>(v);
    return InRow(lo | vec4<bool>(WIDE), hi | vec4<bool>(WIDE));
}

// Elements i .. i + 7 of both rows as loaded, those past the row replaced by −inf.
fn masked_oct(o: Oct, r: InRow) -> Oct {
    return Oct(select(vec4<f32>(NEG_SENTINEL), o.lo, r.lo), select(vec4<f32>(NEG_SENTINEL), o.hi, r.hi));
}

// The masked pass 1's step over elements i .. i + 7 (those past `v` count as −inf on both
// sides: no flag, no sum): both states updated four elements at a time, the flags back.
fn p1_block(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, xl: Oct, yl: Oct, i: u32, v: u32, it2: f32) -> u32 {
    let r = in_row(i, v);
    let x = masked_oct(xl, r);
    let y = masked_oct(yl, r);
    p1_step(sp, sq, x.lo, y.lo, it2);
    p1_step(sp, sq, x.hi, y.hi, it2);
    return p1_flags(x.lo.x, y.lo.x) | p1_flags(x.lo.y, y.lo.y) | p1_flags(x.lo.z, y.lo.z) | p1_flags(x.lo.w, y.lo.w)
        | p1_flags(x.hi.x, y.hi.x) | p1_flags(x.hi.y, y.hi.y) | p1_flags(x.hi.z, y.hi.z) | p1_flags(x.hi.w, y.hi.w);
}

// The plain pass 1's element (rows whose every logit is finite, see pass 1 in main): no masks
// but `on` (the element lies in the row), the common support is the whole row. Returns its
// terms of s_in and h (added compensated per four elements).
fn acc1_add_plain(st: ptr<function, Acc1>, on: bool, x: f32, y: f32, it2: f32) -> vec2<f32> {
    let lx = (x - (*st).m) * it2;
    let e = select(0.0, exp2(lx), on);
    (*st).su = (*st).su + e * (x - y);
    return vec2<f32>(e, e * lx);
}

// The plain pass 1's four elements (`on`: in the row): both states rescaled once to their
// maxima (elements past the row repeat elements of the row, see load8_narrow.wgsl, so they
// move neither maximum nor minimum, and add nothing), the running minima `lo` of both sides
// updated: with the maxima they tell whether the row held a −inf, NaN or +inf (then the
// masked pass 1 runs instead).
fn p1_quad_plain(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, lo: ptr<function, vec2<f32>>, xs: vec4<f32>, ys: vec4<f32>, on: vec4<bool>, it2: f32) {
    acc1_rescale(sp, max(max(xs.x, xs.y), max(xs.z, xs.w)), it2);
    acc1_rescale(sq, max(max(ys.x, ys.y), max(ys.z, ys.w)), it2);
    *lo = min(*lo, vec2<f32>(min(min(xs.x, xs.y), min(xs.z, xs.w)), min(min(ys.x, ys.y), min(ys.z, ys.w))));
    let p = (acc1_add_plain(sp, on.x, xs.x, ys.x, it2) + acc1_add_plain(sp, on.y, xs.y, ys.y, it2))
        + (acc1_add_plain(sp, on.z, xs.z, ys.z, it2) + acc1_add_plain(sp, on.w, xs.w, ys.w, it2));
    let q = (acc1_add_plain(sq, on.x, ys.x, xs.x, it2) + acc1_add_plain(sq, on.y, ys.y, xs.y, it2))
        + (acc1_add_plain(sq, on.z, ys.z, xs.z, it2) + acc1_add_plain(sq, on.w, ys.w, xs.w, it2));
    acc1_comp(sp, p.x, p.y);
    acc1_comp(sq, q.x, q.y);
}

// The plain pass 1's step over elements i .. i + 7.
fn p1_block_plain(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, lo: ptr<function, vec2<f32>>, x: Oct, y: Oct, i: u32, v: u32, it2: f32) {
    let r = in_row(i, v);
    p1_quad_plain(sp, sq, lo, x.lo, y.lo, r.lo, it2);
    p1_quad_plain(sp, sq, lo, x.hi, y.hi, r.hi, it2);
}

// Merges two pass-1 states (`it2` = it·log2(e)).
fn acc1_merge(p: Acc1, q: Acc1, it2: f32) -> Acc1 {
    var hi = p;
    var lo = q;
    if (q.m > p.m) {
        hi = q;
        lo = p;
    }
    let l2 = (lo.m - hi.m) * it2;
    let k = exp2(l2);
    let s_lo = lo.s_in + lo.s_out;
    var r: Acc1;
    r.m = hi.m;
    r.s_in = hi.s_in + k * lo.s_in;
    r.s_out = hi.s_out + k * lo.s_out;
    r.h = hi.h + k * (lo.h + l2 * s_lo);
    r.mc = max(hi.mc, lo.mc);
    r.su = hi.su + k * lo.su;
    r.cs = 0.0;
    r.ch = 0.0;
    return r;
}

// A state into slots base .. base + 5 of thread t's row of the tree (its compensations folded).
fn acc1_store(base: u32, t: u32, st_raw: Acc1) {
    let st = acc1_folded(st_raw);
    red_set(base + 0u, t, st.m);
    red_set(base + 1u, t, st.s_in);
    red_set(base + 2u, t, st.s_out);
    red_set(base + 3u, t, st.h);
    red_set(base + 4u, t, st.mc);
    red_set(base + 5u, t, st.su);
}

// The merged state in slots base .. base + 5 of the tree's total.
fn acc1_total(base: u32) -> Acc1 {
    return Acc1(red_total(base), red_total(base + 1u), red_total(base + 2u), red_total(base + 3u),
        red_total(base + 4u), red_total(base + 5u), 0.0, 0.0);
}

// Thread t's state in slots base .. base + 5 (workgroup flavour: any thread's row).
fn acc1_at(base: u32, t: u32) -> Acc1 {
    return Acc1(red_get(base, t), red_get(base + 1u, t), red_get(base + 2u, t), red_get(base + 3u, t),
        red_get(base + 4u, t), red_get(base + 5u, t), 0.0, 0.0);
}

// The pass-1 tree's merge in workgroup memory (reduce_slots_wg.wgsl): both directions' states
// and the flags of thread o's row (later items) into thread t's.
fn red_merge(t: u32, o: u32) {
    let it2 = params.inv_temp * LOG2E;
    acc1_store(0u, t, acc1_merge(acc1_at(0u, t), acc1_at(0u, o), it2));
    acc1_store(6u, t, acc1_merge(acc1_at(6u, t), acc1_at(6u, o), it2));
    red_set(12u, t, f32(u32(red_get(12u, t)) | u32(red_get(12u, o))));
}

fn acc1_of(r: RedRow, base: u32) -> Acc1 {
    return Acc1(r[base], r[base + 1u], r[base + 2u], r[base + 3u], r[base + 4u], r[base + 5u], 0.0, 0.0);
}

fn acc1_put(r: ptr<function, RedRow>, base: u32, st_raw: Acc1) {
    let st = acc1_folded(st_raw);
    (*r)[base + 0u] = st.m;
    (*r)[base + 1u] = st.s_in;
    (*r)[base + 2u] = st.s_out;
    (*r)[base + 3u] = st.h;
    (*r)[base + 4u] = st.mc;
    (*r)[base + 5u] = st.su;
}

// The same merge on rows held as values (the subgroup flavours' `red_merge_tree`).
fn red_merge_row(a: RedRow, b: RedRow) -> RedRow {
    let it2 = params.inv_temp * LOG2E;
    var r: RedRow;
    acc1_put(&r, 0u, acc1_merge(acc1_of(a, 0u), acc1_of(b, 0u), it2));
    acc1_put(&r, 6u, acc1_merge(acc1_of(a, 6u), acc1_of(b, 6u), it2));
    r[12] = f32(u32(a[12]) | u32(b[12]));
    return r;
}

// ---- pass 2 state --------------------------------------------------------------------
struct Dir2 {
    u: f32, // Σ e^{..}·u where u >= −T_EXT
    w: f32, // Σ e^{..}·w(u) where u >= −T_EXT
    ue: f32, // Σ e^{..}·u where u < −T_EXT
    pe: f32, // Σ e^{..} where u < −T_EXT
    // Σ e^{(y−t_y)it} where u < −T_EXT: the other side's weights, relative to t_y, the other
    // side's maximum over the common support (relative to its overall maximum they all
    // underflow once the common support lies ~90 nats below it)
    ee: f32,
}

// Both directions' pass-2 sums into slots 0 .. 9 of thread t's row: p's u, w, pe, ee, ue, then
// q's (the order the trees and the split rows' records keep).
fn dirs_set(t: u32, fp: Dir2, fq: Dir2) {
    red_set(0u, t, fp.u);
    red_set(1u, t, fp.w);
    red_set(2u, t, fp.pe);
    red_set(3u, t, fp.ee);
    red_set(4u, t, fp.ue);
    red_set(5u, t, fq.u);
    red_set(6u, t, fq.w);
    red_set(7u, t, fq.pe);
    red_set(8u, t, fq.ee);
    red_set(9u, t, fq.ue);
}

// Direction `k` (0: p, 1: q) of the tree's total, as `dirs_set` stored it.
fn dir_total(k: u32) -> Dir2 {
    let o = 5u * k;
    return Dir2(red_total(o), red_total(o + 1u), red_total(o + 4u), red_total(o + 2u), red_total(o + 3u));
}

// `yr`: the other side's raw logit minus its common-support maximum (≤ 0); `it2` = it·log2(e).
fn dir2_push(st: ptr<function, Dir2>, u: f32, wx: f32, yr: f32, it2: f32) {
    if (u >= -T_EXT) {
        (*st).u = (*st).u + wx * u;
        (*st).w = (*st).w + wx * w_of(u);
    } else {
        (*st).ue = (*st).ue + wx * u;
        (*st).pe = (*st).pe + wx;
        (*st).ee = (*st).ee + exp2(yr * it2);
    }
}

// Per-direction constants derived from pass 1.
struct Dir {
    m: f32,
    s: f32, // s_in + s_out
    inv_s: f32,
    log_s: f32,
    out_frac: f32, // own mass where the other side is −inf
    s_in: f32, // Σ e^{(x−m)it} over the common support
    c: f32, // the centre E_own[d] over the common support (raw; d = own − other)
    mc: f32, // own maximum over the common support
    entropy: f32,
}

fn make_dir(st: Acc1) -> Dir {
    var r: Dir;
    r.m = st.m;
    r.s = st.s_in + st.s_out;
    r.inv_s = 1.0 / r.s;
    r.log_s = log(r.s);
    r.out_frac = st.s_out * r.inv_s;
    r.s_in = st.s_in;
    r.c = 0.0;
    if (st.s_in > 0.0) {
        r.c = st.su / st.s_in;
    }
    r.mc = st.mc;
    r.entropy = max(r.log_s - LN2 * (st.h * r.inv_s), 0.0);
    return r;
}

struct Kl {
    kl: f32,
    lam: f32, // log E_x[e^{−u}]   (valid when ok)
    ok: bool,
}

// Final KL of one direction. `dx`: own constants, `dy`: the other side's, `other_out`: the
// other side's mass outside our support, `st`: pass-2 sums.
fn finish_dir(st: Dir2, dx: Dir, dy: Dir, it: f32) -> Kl {
    let uu = st.u * dx.inv_s;
    let ww = st.w * dx.inv_s;
    let ue = st.ue * dx.inv_s;
    let pe = st.pe * dx.inv_s;
    // E_x[e^{−u}] = 1 + x, x = W − U_mod − out − P_ext + Σ_ext p e^{−u}
    let base = ww - uu - dx.out_frac - pe; // x without the extreme e^{−u} terms
    var x = base;
    var lam = 0.0;
    var ok = true;
    var big = false;
    var ext = 0.0; // Σ_ext p·e^{−u}
    if (st.ee > 0.0) {
        // Σ_ext p e^{−u} = ee · e^{K},  K = ((t_y − m_x) + c)·it − log s_x, with t_y = dy.mc
        // the other side's common-support maximum that ee is relative to
        let kk = ((dy.mc - dx.m) + dx.c) * it - dx.log_s;
        let lk = kk + log(st.ee);
        if (lk < 60.0) {
            ext = exp(lk);
            x = base + ext;
        } else {
            big = true;
            // log(1 + base + ee·e^{K}) = lk + log1p((1 + base)·e^{−lk})
            lam = lk + log(1.0 + max(1.0 + base, 0.0) * exp(-lk));
        }
    }
    if (!big) {
        if (x > -1.0) {
            lam = log1p_acc(x);
        } else {
            ok = false;
        }
    }
    var kl = 0.0;
    if (big || abs(x) > 0.5) {
        kl = (uu + ue) + lam;
    } else {
        // KL = U + log1p(x) = (U + x) + (log1p(x) − x), and U + x = W − out + Σ_ext p·w(u)
        // symbolically, so the first-order U never meets the rounding of x.
        kl = (ww - dx.out_frac + (ext - pe + ue)) + log1p_minus_x(x);
    }
    var r: Kl;
    r.kl = kl;
    r.lam = lam;
    r.ok = ok;
    return r;
}

// −log(own mass on the common support): log1p while the outside mass is ≤ ½, else from the
// sums (`ok` false when the common-support sum underflowed: pass 3 recomputes it).
struct NegLogIn {
    v: f32,
    ok: bool,
}

fn neg_log_in(d: Dir) -> NegLogIn {
    if (d.out_frac <= 0.5) {
        return NegLogIn(-log1p_acc(-d.out_frac), true);
    }
    if (d.s_in > 1.0e-30) {
        return NegLogIn(d.log_s - log(d.s_in), true);
    }
    return NegLogIn(d.log_s - log(1.0e-30), false);
}

// One element of pass 2: the weights and both directions' centred log-ratios (`finite`:
// both sides finite; the loops skip the element otherwise).
struct P2Element {
    finite: bool,
    x: f32,
    y: f32,
    wx: f32, // e^{(x − m_p)·it}
    wy: f32, // e^{(y − m_q)·it}
    u: f32, // ((x − y) − c_p)·it
    ur: f32, // ((y − x) − c_q)·it
}

// `it2` = it·log2(e): the weights are exp2 of the pre-scaled differences.
fn p2_element(x: f32, y: f32, dp: Dir, dq: Dir, it: f32, it2: f32) -> P2Element {
    var e: P2Element;
    e.x = x;
    e.y = y;
    e.finite = !is_neg_inf(e.x) && !is_neg_inf(e.y);
    e.wx = exp2((e.x - dp.m) * it2);
    e.wy = exp2((e.y - dq.m) * it2);
    let d = e.x - e.y;
    e.u = (d - dp.c) * it;
    e.ur = (-d - dq.c) * it;
    return e;
}

// Pass 2's per-thread sums.
struct P2Sums {
    fp: Dir2,
    fq: Dir2,
    tv0: f32,
    g: f32,
    near: f32, // p-mass with |v| <= TAU_KINK (whose |·| may flip sign between λ0 and λ)
    near_w: f32, // p-mass with |v| <= NEAR_WIDE (split rows only; dead code elsewhere)
    // (the lean loop sums tv0, g and near in units of p's weights, see `tv_unit`)
}

// Pass 2's row constants.
struct P2Row {
    dp: Dir,
    dq: Dir,
    it: f32,
    it2: f32, // it·log2(e)
    lam0: f32,
    tv_fast: bool, // e^{−λ0} and e^{−u} near the kink both stay finite
    ek0: f32, // e^{−λ0} (clamped)
    em0: f32, // expm1(−λ0)
    ekx: f32, // e^{kx}, e^{ky}: the lean loop's cross factors
    eky: f32,
}

// Pass 2's step over elements i .. i + 7 of both rows (past the row: −inf, skipped), through
// the lean or the general element.
fn p2_block(st: ptr<function, P2Sums>, xl: Oct, yl: Oct, i: u32, v: u32, r: P2Row, lean: bool) {
    let m = in_row(i, v);
    let x = masked_oct(xl, m);
    let y = masked_oct(yl, m);
    let it = r.it;
    p2_add(st, p2_element(x.lo.x, y.lo.x, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.lo.y, y.lo.y, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.lo.z, y.lo.z, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.lo.w, y.lo.w, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.hi.x, y.hi.x, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.hi.y, y.hi.y, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.hi.z, y.hi.z, r.dp, r.dq, it, r.it2), r, lean);
    p2_add(st, p2_element(x.hi.w, y.hi.w, r.dp, r.dq, it, r.it2), r, lean);
}

// One element of pass 2 through the lean or the general loop's element (`lean` is a constant
// at each call site, so each loop compiles only its own).
fn p2_add(st: ptr<function, P2Sums>, e: P2Element, r: P2Row, lean: bool) {
    if (lean) {
        lean_add(st, e, r);
    } else {
        general_add(st, e, r);
    }
}

// The lean loop's element (see `lean` in `row_consts`): q's centred log-ratio is −u there.
fn lean_add(st: ptr<function, P2Sums>, e: P2Element, r: P2Row) {
    if (!e.finite) {
        return;
    }
    let wx = e.wx;
    let wy = e.wy;
    let u = e.u;
    let ws = w_pair(u); // (w(u), w(−u)) for |u| <= ½
    let big = abs(u) > 0.5;
    let wu = wx * u;
    // w_x·expm1(−u): the series, or w_y·e^{k} − w_x (|expm1| ≥ 0.39 there: no cancellation)
    let ex = select(wx * ws.x - wu, wy * r.ekx - wx, big);
    (*st).fp.u += wu;
    (*st).fp.w += select(wx * ws.x, ex + wu, big);
    // q's side: w_y·w(−u), or w_y·expm1(u) − w_y·u with w_y·expm1(u) = w_x·e^{−k} − w_y
    (*st).fq.u -= wy * u;
    (*st).fq.w += select(wy * ws.y, (wx * r.eky - wy) - wy * u, big);
    let vv = -u - r.lam0; // log(q_i / p_i) at λ0
    // TV's sums in units of p's weights (the row's 1/s_p scales them after the reduction):
    // w_x·expm1(−u − λ0) = e^{−λ0}·w_x·expm1(−u) + w_x·expm1(−λ0) for every element; with
    // |λ0| ≤ ¼ it is at least 0.22·w_x in magnitude wherever |u| > ½, so the closed form is
    // exact enough there, and where |u| ≤ ½ the series gave expm1(−u)
    let pm = r.ek0 * ex + r.em0 * wx;
    (*st).tv0 += abs(pm);
    (*st).g += sign(vv) * (wx + pm);
    (*st).near += select(0.0, wx, abs(vv) <= TAU_KINK);
    (*st).near_w += select(0.0, wx, abs(vv) <= NEAR_WIDE);
}

// The general loop's element.
fn general_add(st: ptr<function, P2Sums>, e: P2Element, r: P2Row) {
    if (!e.finite) {
        return;
    }
    let it = r.it;
    let wx = e.wx;
    let wy = e.wy;
    let u = e.u;
    let ur = e.ur;
    // w(u) once, shared by KL(p‖q) and TV: expm1(−u) = w(u) − u
    var wu = 0.0;
    if (u >= -T_EXT) {
        wu = w_of(u);
        (*st).fp.u = (*st).fp.u + wx * u;
        (*st).fp.w = (*st).fp.w + wx * wu;
    } else {
        (*st).fp.ue = (*st).fp.ue + wx * u;
        (*st).fp.pe = (*st).fp.pe + wx;
        (*st).fp.ee = (*st).fp.ee + exp2((e.y - r.dq.mc) * r.it2);
    }
    var fq = (*st).fq;
    dir2_push(&fq, ur, wy, e.x - r.dp.mc, r.it2);
    (*st).fq = fq;
    let p_i = wx * r.dp.inv_s;
    let vv = -u - r.lam0; // log(q_i / p_i) at λ0
    if (abs(vv) <= 1.0) {
        // expm1(−u − λ0) = e^{−λ0}·expm1(−u) + expm1(−λ0): no series per element; the
        // rounding is ~eps·|u|·p_i per element, negligible beside TV's tolerance
        var em = r.ek0 * (wu - u) + r.em0;
        if (u < -T_EXT || !r.tv_fast) {
            em = expm1_acc(vv);
        }
        (*st).tv0 += p_i * abs(em);
        (*st).g += sign(vv) * (p_i + p_i * em);
        if (abs(vv) <= TAU_KINK) {
            (*st).near += p_i;
        }
        if (abs(vv) <= NEAR_WIDE) {
            (*st).near_w += p_i;
        }
    } else {
        let q_i = wy * r.dq.inv_s;
        (*st).tv0 += abs(p_i - q_i);
        (*st).g += sign(q_i - p_i) * q_i;
    }
}

// The plain pass 1 over the thread's octets (read from memory), kept on-chip when `keep`.
fn p1_plain_loop(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, lo: ptr<function, vec2<f32>>, c: ptr<function, Chip>, at: RowAt, it2: f32, keep: bool) {
    var k = 0u;
    for (var i = 8u * at.t; i < at.v; i += 8u * WG) {
        let xo = load8_a(at.abase + i, at.last_a);
        let yo = load8_b(at.bbase + i, at.last_b);
        if (keep) {
            (*c).x[k] = xo;
            (*c).y[k] = yo;
        }
        k += 1u;
        p1_block_plain(sp, sq, lo, xo, yo, i, at.v, it2);
    }
}

// The masked pass 1 over the thread's octets; their flags back.
fn p1_masked_loop(sp: ptr<function, Acc1>, sq: ptr<function, Acc1>, c: ptr<function, Chip>, at: RowAt, it2: f32, chip: bool) -> u32 {
    var fl = 0u;
    var k = 0u;
    for (var i = 8u * at.t; i < at.v; i += 8u * WG) {
        fl |= p1_block(sp, sq, oct_x(c, k, i, at, chip), oct_y(c, k, i, at, chip), i, at.v, it2);
        k += 1u;
    }
    return fl;
}

// Pass 2 over the thread's octets through the lean or the general element.
fn p2_loop(st: ptr<function, P2Sums>, c: ptr<function, Chip>, at: RowAt, r: P2Row, lean: bool, chip: bool) {
    var k = 0u;
    for (var i = 8u * at.t; i < at.v; i += 8u * WG) {
        p2_block(st, oct_x(c, k, i, at, chip), oct_y(c, k, i, at, chip), i, at.v, r, lean);
        k += 1u;
    }
}

// Pass 3's row constants: both directions, the exact λ and which common-support masses
// underflowed in pass 1 (recomputed here).
struct P3Row {
    dp: Dir,
    dq: Dir,
    it: f32,
    it2: f32, // it·log2(e)
    lam: f32,
    need_q: bool,
    need_p: bool,
}

// Pass 3's element (skipped where either side is −inf, including past the row): st.x TV's
// Σ|p − q|, st.y Σ_common e^{(y − mc_q)it}, st.z Σ_common e^{(x − mc_p)it}.
fn p3_add(st: ptr<function, vec3<f32>>, x: f32, y: f32, r: P3Row) {
    if (is_neg_inf(x) || is_neg_inf(y)) {
        return;
    }
    let it = r.it;
    let it2 = r.it2;
    let p_i = exp2((x - r.dp.m) * it2) * r.dp.inv_s;
    let vv = -(((x - y) - r.dp.c) * it) - r.lam;
    if (abs(vv) <= 1.0) {
        (*st).x += p_i * abs(expm1_acc(vv));
    } else {
        (*st).x += abs(p_i - exp2((y - r.dq.m) * it2) * r.dq.inv_s);
    }
    if (r.need_q) {
        (*st).y += exp2((y - r.dq.mc) * it2);
    }
    if (r.need_p) {
        (*st).z += exp2((x - r.dp.mc) * it2);
    }
}

// Element j (0 .. 7) of an octet.
fn oct_elem(o: Oct, j: u32) -> f32 {
    if (j < 4u) {
        return o.lo[j];
    }
    return o.hi[j - 4u];
}

// Pass 3, one element per step (one copy of the element's code: pass 3 is rare, and each copy
// costs software rasterizers' shader compiles): over the thread's octets kept on-chip when
// `chip`, else over the row read again with the workgroup's stride.
fn p3_loop(st: ptr<function, vec3<f32>>, c: ptr<function, Chip>, at: RowAt, r: P3Row, chip: bool) {
    if (chip) {
        let n = 8u * ((at.v + 8u * WG - 1u - 8u * at.t) / (8u * WG));
        for (var e = 0u; e < n; e++) {
            let k = e / 8u;
            let i = 8u * (at.t + k * WG) + e % 8u;
            if (i < at.v) {
                p3_add(st, oct_elem((*c).x[k], e % 8u), oct_elem((*c).y[k], e % 8u), r);
            }
        }
    } else {
        for (var i = at.t; i < at.v; i += WG) {
            p3_add(st, load_a(at.abase + i), load_b(at.bbase + i), r);
        }
    }
}

// What pass 2's reduced sums (`red_total` after `red_sum_slots(t, 13u)`) give:
// both directions' KL parts, TV corrected to first order to the exact λ, and whether pass 3
// must recompute TV (or the common-support masses). The same value in every thread.
struct After2 {
    rp: Kl,
    rq: Kl,
    tv: f32,
    nq: NegLogIn,
    np: NegLogIn,
    lam: f32, // the exact λ (λ0 when pass 2 could not find it)
    again: bool,
}

// Both directions' KL parts and the exact λ from their merged pass-2 sums (the tree's total, as
// `dirs_set` stored them); TV left for the caller. The same value in every thread.
fn after_kl(dp: Dir, dq: Dir, it: f32, lam0: f32) -> After2 {
    var r: After2;
    r.rp = finish_dir(dir_total(0u), dp, dq, it);
    r.rq = finish_dir(dir_total(1u), dq, dp, it);
    r.nq = neg_log_in(dq);
    r.np = neg_log_in(dp);
    r.lam = lam0;
    if (r.rp.ok) {
        r.lam = r.rp.lam + r.nq.v;
    }
    r.tv = 0.0;
    r.again = false;
    return r;
}

fn after_p2(dp: Dir, dq: Dir, it: f32, lam0: f32, lean: bool) -> After2 {
    var r = after_kl(dp, dq, it, lam0);
    // the lean loop summed TV's terms in units of p's weights
    let tv_unit = select(1.0, dp.inv_s, lean);
    let gg = red_total(11u) * tv_unit;
    let near_mass = red_total(12u) * tv_unit;
    // TV(λ) ≈ TV(λ0) − (λ − λ0)·Σ sign(q−p)·q, exact but for elements whose log-ratio lies
    // within |λ − λ0| of 0 (error ≤ 2|λ − λ0|·their mass). When that bound is not negligible
    // (near-identical or near-one-hot rows), pass 3 recomputes TV with the exact λ; it also
    // recomputes the common-support masses when they underflowed in pass 1.
    let dl = r.lam - lam0;
    r.tv = red_total(10u) * tv_unit - dl * gg;
    let bound = 2.0 * abs(dl) * near_mass;
    r.again = (r.rp.ok && (abs(dl) > TAU_KINK || bound > 1.0e-4 * abs(r.tv) + 1.0e-10))
        || !r.nq.ok || !r.np.ok;
    return r;
}

// Pass 3's reduced sums (`red_total` after `red_sum_slots(t, 3u)`) into `a`.
fn after_p3(a: ptr<function, After2>, dp: Dir, dq: Dir, it: f32) {
    (*a).tv = red_total(0u);
    if (!(*a).nq.ok) {
        (*a).nq.v = dq.log_s - ((dq.mc - dq.m) * it + log(red_total(1u)));
    }
    if (!(*a).np.ok) {
        (*a).np.v = dp.log_s - ((dp.mc - dp.m) * it + log(red_total(2u)));
    }
}

// The row's eight results (thread 0): `rbase` the rows' first elements (rollout, trainer) for
// the sampled-token log-probs, `flags_in` pass 1's flags plus how the row was read.
fn write_results(ob: u32, info: u32, rbase: vec2<u32>, flags_in: u32, dp: Dir, dq: Dir, it: f32, a: After2) {
    var flags = flags_in;
    var kl = 0.0;
    if ((flags & F_KL_INF) == 0u) {
        kl = max(a.rp.kl + a.nq.v, 0.0);
    }
    var klr = 0.0;
    if ((flags & F_KLR_INF) == 0u) {
        klr = max(a.rq.kl + a.np.v, 0.0);
    }
    let tv = clamp(0.5 * (a.tv + dp.out_frac + dq.out_frac), 0.0, 1.0);
    var lp = 0.0;
    var lq = 0.0;
    if (params.has_responses != 0u) {
        let xa = load_a(rbase.x + info);
        let xb = load_b(rbase.y + info);
        if (is_neg_inf(xa)) {
            flags |= F_LP_NEGINF;
        } else {
            lp = (xa - dp.m) * it - dp.log_s;
        }
        if (is_neg_inf(xb)) {
            flags |= F_LQ_NEGINF;
        } else {
            lq = (xb - dq.m) * it - dq.log_s;
        }
    }
    results[ob + 0u] = kl;
    results[ob + 1u] = klr;
    results[ob + 2u] = tv;
    results[ob + 3u] = dp.entropy;
    results[ob + 4u] = dq.entropy;
    results[ob + 5u] = lp;
    results[ob + 6u] = lq;
    results[ob + 7u] = f32(flags);
}

// A row whose pass 1 found a bad value or an empty side: zeros and the flags (any WG).
fn write_flags_only(ob: u32, t: u32, flags: u32) {
    for (var k = t; k < 8u; k += WG) {
        results[ob + k] = select(0.0, f32(flags), k == 7u);
    }
}

// The pass-1 flags after the tree (slot 12 of the total) with the empty-side flags of the
// merged states `gp` / `gq` added, published to the row's threads (after a barrier: every
// thread has read `wg_active` before thread 0 writes it again).
fn publish_p1_flags(t: u32, gp: Acc1, gq: Acc1) -> u32 {
    row_sync();
    var f = u32(red_total(12u));
    if (gp.m <= EMPTY_MAX) {
        f |= F_A_EMPTY;
    }
    if (gq.m <= EMPTY_MAX) {
        f |= F_B_EMPTY;
    }
    return row_publish(t, f);
}

// Pass 1 over the thread's octets of `at` (a whole row or a slice), both states reduced by the
// row's tree into its total (slots 0 .. 11: p's state, q's; slot 12 the
// flags). `masked_first` (GPUs): the masked loop from the start, so rows holding a −inf are
// read once (flag F_MASKED_FIRST); else the plain loop first, which needs no per-element masks
// (they cost llvmpipe a fifth of the kernel), and when the row's minima or maxima show a −inf,
// NaN or +inf the masked loop again (flag F_PASS1_FULL: from the on-chip copy when `keep`, else
// a second read). `keep`: the octets stay on-chip in `chip` (whole rows that fit); such rows
// are read once either way, so they always take the plain loop first (no third copy of the
// loop for the shader compiler).
fn pass1(t: u32, c: ptr<function, Chip>, at: RowAt, it: f32, keep: bool, masked_first_in: bool) {
    let it2 = it * LOG2E;
    let masked_first = masked_first_in && !keep;
    var sp = acc1_empty();
    var sq = acc1_empty();
    var flags = F_MASKED_FIRST;
    if (!masked_first) {
        var lo = vec2<f32>(BIG);
        if (keep) {
            p1_plain_loop(&sp, &sq, &lo, c, at, it2, true);
        } else {
            p1_plain_loop(&sp, &sq, &lo, c, at, it2, false);
        }
        sp.mc = sp.m;
        sq.mc = sq.m;
        let plain_ok = !is_neg_inf(min(lo.x, lo.y)) && !is_bad(max(sp.m, sq.m));
        acc1_store(0u, t, sp);
        acc1_store(6u, t, sq);
        red_set(12u, t, select(f32(F_PASS1_FULL), 0.0, plain_ok));
        red_merge_tree(t);
        flags = row_publish(t, u32(red_total(12u)));
    }
    if (flags != 0u) {
        sp = acc1_empty();
        sq = acc1_empty();
        var fl = 0u;
        if (keep) {
            fl = p1_masked_loop(&sp, &sq, c, at, it2, true);
        } else {
            fl = p1_masked_loop(&sp, &sq, c, at, it2, false);
        }
        acc1_store(0u, t, sp);
        acc1_store(6u, t, sq);
        red_set(12u, t, f32(fl | flags));
        red_merge_tree(t);
    }
}

// The row constants pass 1's merged states give: both directions, λ0 = lse_b − lse_a + c
// (scaled, c of p's direction), pass 2's constants and whether it takes the lean loop.
struct RowC {
    dp: Dir,
    dq: Dir,
    lam0: f32,
    lean: bool,
    c: P2Row,
}

fn row_consts(gp: Acc1, gq: Acc1, it: f32) -> RowC {
    let dp = make_dir(gp);
    var dq = make_dir(gq);
    // the cross factor of p's direction (see `lean` below); λ0 is it plus the log-normalisers
    let kx = ((dq.m - dp.m) + dp.c) * it;
    let lam0 = kx + dq.log_s - dp.log_s;
    // δ = (c_p + c_q)·it: how far q's own centre lies from −c_p (≈ KL(p‖q) + KL(q‖p))
    let delta = (dp.c + dq.c) * it;
    // The lean loop (row-uniform choice): when λ0 is small and the cross factor
    // k = log(w_x·e^{−u} / w_y) is moderate, p·e^{−u} = w_y·e^{k} needs no exponential of
    // its own and nothing can overflow, so the elements with u < −T_EXT need no separate sums
    // (they are folded into U and W exactly as `finish_dir` adds them back) and TV's
    // expm1(v) comes from the same terms. On lean rows q's direction takes the centre −c_p
    // (when |δ| is small as well), so its centred log-ratio is exactly −u: one series gives
    // w(u) and w(−u) (`w_pair`), and q's cross factor is −k. KL(q‖p) = W + (log1p(x) − x)
    // holds for any centre; with |δ| ≤ ¼ (U_q = δ·(1 − out_q)) and |λ0| ≤ ¼, |x_q| stays
    // small enough that no term cancels. Two exponentials and one branch-free series per
    // element instead of seven and three; software rasterizers evaluate both sides of every
    // `if` inside a loop, so the lean and the general loop are two loops.
    let lean = abs(lam0) <= LEAN_LAMBDA && abs(kx) <= LEAN_K && abs(delta) <= LEAN_LAMBDA;
    if (lean) {
        dq.c = -dp.c;
    }
    let ky = ((dp.m - dq.m) + dq.c) * it;
    let tv_fast = abs(lam0) < T_EXT;
    let c = P2Row(dp, dq, it, it * LOG2E, lam0, tv_fast, exp(-min(abs(lam0), T_EXT) * sign(lam0)), expm1_acc(-lam0), exp(clamp(kx, -LEAN_K, LEAN_K)), exp(clamp(ky, -LEAN_K, LEAN_K)));
    return RowC(dp, dq, lam0, lean, c);
}

// Pass 2 over the thread's octets of `at` (from the on-chip copy when `chip`), the 13 sums
// reduced by the row's tree (`red_total`); the thread's own `near_w` back (split rows reduce
// it; whole rows drop it, so their compilers remove its sum).
fn pass2(t: u32, c: ptr<function, Chip>, at: RowAt, rc: RowC, chip: bool) -> f32 {
    var sums = P2Sums(Dir2(0.0, 0.0, 0.0, 0.0, 0.0), Dir2(0.0, 0.0, 0.0, 0.0, 0.0), 0.0, 0.0, 0.0, 0.0);
    if (chip) {
        if (rc.lean) {
            p2_loop(&sums, c, at, rc.c, true, true);
        } else {
            p2_loop(&sums, c, at, rc.c, false, true);
        }
    } else if (rc.lean) {
        p2_loop(&sums, c, at, rc.c, true, false);
    } else {
        p2_loop(&sums, c, at, rc.c, false, false);
    }
    dirs_set(t, sums.fp, sums.fq);
    red_set(10u, t, sums.tv0);
    red_set(11u, t, sums.g);
    red_set(12u, t, sums.near);
    red_sum_slots(t, 13u);
    return sums.near_w;
}

// Pass 3 over the thread's octets of `at` with the exact λ, its 3 sums reduced into thread 0's
// total (called after a barrier that follows every read of `after_p2`'s slots).
fn pass3(t: u32, c: ptr<function, Chip>, at: RowAt, rc: RowC, a: After2, chip: bool) {
    let r3 = P3Row(rc.dp, rc.dq, rc.c.it, rc.c.it2, a.lam, !a.nq.ok, !a.np.ok);
    var s3 = vec3<f32>(0.0);
    if (chip) {
        p3_loop(&s3, c, at, r3, true);
    } else {
        p3_loop(&s3, c, at, r3, false);
    }
    red_set(0u, t, s3.x);
    red_set(1u, t, s3.y);
    red_set(2u, t, s3.z);
    red_sum_slots(t, 3u);
}

// Whether the workgroup's row is valid (published to every thread); a masked row's results
// are zeroed by threads 0 .. 7 when `write`.
fn row_valid(t: u32, ob: u32, info: u32, write: bool) -> bool {
    let row_on = row_publish(t, select(1u, 0u, info == ROW_MASKED));
    if (row_on == 0u && write) {
        for (var k = t; k < 8u; k += WG) {
            results[ob + k] = 0.0;
        }
    }
    return row_on != 0u;
}

// One workgroup per row (params.slices = 1).
fn whole_row(row: u32, t: u32) {
    if (row >= params.rows) {
        return;
    }
    let ob = 8u * (params.info_first % 8u + row);
    let info = row_info[params.info_first + row];
    if (!row_valid(t, ob, info, true)) {
        return;
    }
    let v = params.vocab;
    let it = params.inv_temp;
    let abase = params.a_first + row * v;
    let bbase = params.b_first + row * v;
    // ---- pass 1 ----
    // Eight elements per thread and step (i .. i + 7, i a multiple of 8: one or two 16-byte
    // loads in the WIDE variant), each state rescaled once per four: software rasterizers run
    // the rescale's branch, exponential included, for every element. Each loop stands outside
    // any branch inside it (llvmpipe runs both sides of every `if` inside a loop, but a loop
    // none of whose invocations enters stops after one check).
    let at = RowAt(t, v, abase, bbase, abase + v - 1u, bbase + v - 1u);
    // rows of at most 8·WG·ONCHIP_OCTS elements: each thread keeps its octets on-chip, and
    // every later loop runs on that copy (one read of memory)
    let onchip = v <= 8u * WG * ONCHIP_OCTS;
    let mf = params.masked_first != 0u;
    var chip: Chip;
    // one call of each pass (their trees compiled once); only the loops inside branch on
    // `onchip`
    pass1(t, &chip, at, it, onchip, mf);
    let gp = acc1_total(0u);
    let gq = acc1_total(6u);
    var flags = publish_p1_flags(t, gp, gq);
    if ((flags & (F_A_BAD | F_B_BAD | F_A_EMPTY | F_B_EMPTY)) != 0u) {
        write_flags_only(ob, t, flags);
        return;
    }
    // ---- pass 2 ----
    let rc = row_consts(gp, gq, it);
    _ = pass2(t, &chip, at, rc, onchip);
    // every thread reads the reduced sums (the barrier ending the tree orders the reads)
    var a = after_p2(rc.dp, rc.dq, it, rc.lam0, rc.lean);
    let again = row_publish(t, select(0u, 1u, a.again));
    if (again != 0u) {
        // ---- pass 3 (only rows that need it) ----
        pass3(t, &chip, at, rc, a, onchip);
        after_p3(&a, rc.dp, rc.dq, it);
    }
    if (t != 0u) {
        return;
    }
    flags |= select(0u, F_LEAN, rc.lean) | select(0u, F_THIRD_PASS, again != 0u)
        | select(0u, F_ON_CHIP, onchip);
    write_results(ob, info, vec2<u32>(abase, bbase), flags, rc.dp, rc.dq, it, a);
}
