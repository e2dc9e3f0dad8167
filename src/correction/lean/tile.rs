//! The lean pass's arithmetic on one tile of a sequence, in columns: the log-ratios and their
//! exponentials for the whole tile first (one branch-free loop each, so they vectorise), then
//! each sum, count and extremum as its own loop over the columns, padding selected out. The
//! sums run in [`LaneSum`] lanes by slot, as the CPU engine's segment sums do, so a sequence's
//! statistic has the same bits on both paths.

use super::cppo::CppoTask;
use super::finish::SeqRec;
use super::inputs::check_slot;
use crate::bounds::lntrm_rank_weight;
use crate::correction::m2po::M2poTask;
use crate::correction::plan::{Plan, MAX_LEAN_CRITERIA};
use crate::engine::plan::{MaskAgg, MaskCriterion, MaskIs, MaskSource};
use crate::math::{exp_bounded, k3_from_log_ratio, k3_series, octet as oct, LaneSum, LANES};
use crate::partial::Sum;
use crate::stats::SAFETY_BOUND;

/// Slots a tile holds (inputs widened tile by tile on the stack, never as a whole); a
/// multiple of [`LANES`], at most what the diagnostics take at once.
pub(crate) const TILE: usize = 512;
const _: () = assert!(TILE.is_multiple_of(LANES) && TILE <= crate::metrics::diag::RUN);

/// A compensated sum in lanes (each lane Knuth's two-sum): verl's std and ESS cancel.
#[derive(Clone, Copy, Default)]
struct LaneTwoSum {
    hi: [f64; LANES],
    lo: [f64; LANES],
}

impl LaneTwoSum {
    /// Adds `xs` (finite: the lean pass's values are bounded through the clamped ratio).
    #[inline(always)]
    fn add8(&mut self, xs: &[f64; LANES]) {
        for ((hi, lo), &x) in self.hi.iter_mut().zip(&mut self.lo).zip(xs) {
            two_sum(hi, lo, x);
        }
        // without this barrier LLVM's SLP vectoriser cuts `hi` and `lo` (adjacent) into odd
        // 2/4/8-lane pieces; with it, each is one vector (the bits are the same either way)
        self.hi = std::hint::black_box(self.hi);
    }
    fn into_sum(self, s: &mut Sum) {
        for l in 0..LANES {
            s.merge(Sum {
                hi: self.hi[l],
                lo: self.lo[l],
            });
        }
    }
}

#[inline(always)]
fn two_sum(hi: &mut f64, lo: &mut f64, x: f64) {
    let s = *hi + x;
    let bb = s - *hi;
    *lo += (*hi - (s - bb)) + (x - bb);
    *hi = s;
}

/// [`oct`], mutable.
#[inline(always)]
fn oct_mut<T>(s: &mut [T], j0: usize) -> &mut [T; LANES] {
    (&mut s[j0..j0 + LANES]).try_into().expect("an octet")
}

/// `x` where `v` is all ones, `z` where it is 0 (a bitwise select).
#[inline(always)]
fn sel(v: u64, x: f64, z: f64) -> f64 {
    f64::from_bits((x.to_bits() & v) | (z.to_bits() & !v))
}

/// `xs` at the valid slots, 0 at padding, added to `lanes`.
#[inline(always)]
fn add_valid(lanes: &mut LaneSum, xs: &[f64], v: &[u64], y: &mut [f64]) {
    for ((y, &x), &v) in y.iter_mut().zip(xs).zip(v) {
        *y = f64::from_bits(x.to_bits() & v);
    }
    lanes.add(y);
}

/// The larger of `a` and `b` (`b` when they compare equal; no NaN reaches the lean pass's
/// extrema, so a plain select, which vectorises, is `f64::max`).
#[inline(always)]
fn max(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn min(a: f64, b: f64) -> f64 {
    if a < b {
        a
    } else {
        b
    }
}

/// The largest (`sign` 1) or, through negation, smallest (`sign` −1) valid value, in lanes;
/// ∓∞ when none is valid.
#[inline(always)]
fn extremum_where(v: &[u64], x: &[f64], sign: f64) -> f64 {
    let mut m = [f64::NEG_INFINITY; LANES];
    let mut it = v.chunks_exact(LANES).zip(x.chunks_exact(LANES));
    for (vc, xc) in &mut it {
        for l in 0..LANES {
            m[l] = max(sel(vc[l], sign * xc[l], f64::NEG_INFINITY), m[l]);
        }
    }
    let done = v.len() / LANES * LANES;
    for (l, (&vv, &xx)) in v[done..].iter().zip(&x[done..]).enumerate() {
        m[l] = max(sel(vv, sign * xx, f64::NEG_INFINITY), m[l]);
    }
    sign * m.iter().fold(f64::NEG_INFINITY, |a, &b| max(b, a))
}

/// One criterion's lanes over a sequence.
#[derive(Clone, Copy, Default)]
struct CritLanes {
    agg: LaneSum,
    /// LN-TRM's Σ w_t.
    wsum: LaneSum,
    pts: LaneSum,
    sc1: LaneTwoSum,
    sc2: LaneTwoSum,
}

/// A sequence's lane sums, folded into its [`SeqRec`] when the sequence ends.
#[derive(Clone, Copy, Default)]
pub(crate) struct SeqLanes {
    s_train: LaneSum,
    s_roll: LaneSum,
    s_lr: LaneSum,
    s_adv: LaneSum,
    s_k3u: LaneSum,
    s_rho2: LaneSum,
    s_w: LaneSum,
    s_raw: LaneSum,
    s_wc: LaneTwoSum,
    s_wc2: LaneTwoSum,
    crit: [CritLanes; MAX_LEAN_CRITERIA],
    /// LN-TRM: the sequence's valid tokens, and those its tiles have passed so far.
    pub(crate) ln_len: u64,
    ln_seen: u64,
}

impl SeqLanes {
    /// A new sequence: the lanes cleared, `rec`'s running maxima at −∞.
    pub(crate) fn start(&mut self, plan: &Plan, rec: &mut SeqRec) {
        *self = SeqLanes::default();
        for (ci, cr) in plan.criteria.iter().enumerate() {
            if cr.agg == MaskAgg::Max {
                rec.crit[ci].agg = f64::NEG_INFINITY;
            }
        }
    }

    /// The lanes folded into `rec` (the sequence's last tile is done).
    pub(crate) fn finish(self, plan: &Plan, rec: &mut SeqRec) {
        rec.s_train = self.s_train.value();
        rec.s_roll = self.s_roll.value();
        rec.s_lr = self.s_lr.value();
        rec.s_adv = self.s_adv.value();
        rec.s_k3u = self.s_k3u.value();
        rec.s_rho2 = self.s_rho2.value();
        rec.s_w = self.s_w.value();
        rec.s_raw = self.s_raw.value();
        self.s_wc.into_sum(&mut rec.s_wc);
        self.s_wc2.into_sum(&mut rec.s_wc2);
        for (ci, cr) in plan.criteria.iter().enumerate() {
            let (l, r) = (&self.crit[ci], &mut rec.crit[ci]);
            match cr.agg {
                MaskAgg::Max => {}
                MaskAgg::WeightedMean(_) => (r.agg, r.wsum) = (l.agg.value(), l.wsum.value()),
                MaskAgg::Token => {
                    r.pts = l.pts.value();
                    l.sc1.into_sum(&mut r.sc1);
                    l.sc2.into_sum(&mut r.sc2);
                }
                MaskAgg::Sum | MaskAgg::Mean | MaskAgg::MeanVerl => r.agg = l.agg.value(),
            }
        }
    }
}

/// One tile's inputs (loaded by the caller) and its columns, on the stack and reused.
pub(crate) struct Cols {
    pub(crate) r: [f64; TILE],
    pub(crate) o: [f64; TILE],
    pub(crate) m: [u8; TILE],
    /// The next tile's mask, read ahead.
    pub(crate) m_next: [u8; TILE],
    pub(crate) w: [f64; TILE],
    pub(crate) keep: [bool; TILE],
    /// The advantages of the tile's slots (diagnostics with advantages only).
    pub(crate) a: [f64; TILE],
    /// All ones at a valid slot, 0 at padding.
    pub(super) valid: [u64; TILE],
    /// The tile took the column path (a log-ratio beyond the safety bound): `lr` holds the
    /// unclamped log-ratios.
    pub(super) wide: bool,
    /// k3 per slot (diagnostics only).
    pub(super) k3: [f64; TILE],
    pub(super) lr: [f64; TILE],
    pub(super) c: [f64; TILE],
    pub(super) rho: [f64; TILE],
    /// LN-TRM's token weights.
    lw: [f64; TILE],
    x: [f64; TILE],
    y: [f64; TILE],
}

thread_local! {
    /// Each thread's tile columns, kept between calls (warm in cache, no allocation).
    static SPARE: std::cell::Cell<Option<Box<Cols>>> = const { std::cell::Cell::new(None) };
}

impl Cols {
    /// This thread's columns (fresh ones the first time); hand them back with [`Cols::give`].
    pub(crate) fn take() -> Box<Cols> {
        SPARE
            .with(|c| c.take())
            .unwrap_or_else(|| Box::new(Cols::new()))
    }

    /// Keeps `cols` for this thread's next [`Cols::take`].
    pub(crate) fn give(cols: Box<Cols>) {
        SPARE.with(|c| c.set(Some(cols)));
    }

    pub(crate) fn new() -> Self {
        Cols {
            r: [0.0; TILE],
            o: [0.0; TILE],
            m: [1; TILE],
            m_next: [1; TILE],
            w: [0.0; TILE],
            keep: [false; TILE],
            a: [0.0; TILE],
            valid: [0; TILE],
            wide: false,
            k3: [0.0; TILE],
            lr: [0.0; TILE],
            c: [0.0; TILE],
            rho: [0.0; TILE],
            lw: [0.0; TILE],
            x: [0.0; TILE],
            y: [0.0; TILE],
        }
    }

    /// The first `len` loaded slots (the sequence's slots `k..k + len`, `k − a` a multiple
    /// of [`TILE`]) added to `rec` / `lanes`; `keep` (and `w` for token IS) written. `None`
    /// on a mask value other than 0/1 or a valid slot's non-finite log-prob.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tile(
        &mut self,
        len: usize,
        plan: &Plan,
        token_is: Option<&MaskIs>,
        (mut m2po, mut cppo): (Option<&mut M2poTask>, Option<&mut CppoTask>),
        rec: &mut SeqRec,
        lanes: &mut SeqLanes,
    ) -> Option<()> {
        self.wide = !self.base_fused(len, rec, lanes)?;
        if self.wide {
            self.base_columns(len, rec, lanes);
        }
        let v = &self.valid[..len];
        let (c, rho) = (&self.c[..len], &self.rho[..len]);
        let x = &mut self.x[..len];
        if plan.veto.is_some() {
            rec.rho_min = min(extremum_where(v, rho, -1.0), rec.rho_min);
        }
        if plan.opsm() {
            // the advantages (loaded by the caller), 0 at padding
            add_valid(&mut lanes.s_adv, &self.a[..len], v, &mut self.y[..len]);
        }
        if let Some(is) = token_is {
            token_weights(&mut self.w[..len], v, rho, is, rec, lanes);
        }
        let keep = &mut self.keep[..len];
        let lw = &mut self.lw[..len];
        if let Some((eps, delta)) = plan.lntrm() {
            // LN-TRM's w_t from the token's rank among its sequence's valid tokens
            for (w, &v) in lw.iter_mut().zip(v) {
                *w = match v {
                    0 => 0.0,
                    _ => {
                        lanes.ln_seen += 1;
                        lntrm_rank_weight(lanes.ln_len, lanes.ln_seen, eps, delta)
                    }
                };
            }
        }
        for (ci, cr) in plan.criteria.iter().enumerate() {
            // M2PO and CPPO: values and drops from the state decided before the tiles (`y` = 1
            // dropped); their bound only for the metrics
            let d = &mut self.y[..len];
            let decided = if let Some(mp) = m2po.as_deref_mut().filter(|mp| mp.ci == ci) {
                let lr = if self.wide { &self.lr[..len] } else { c };
                mp.tile(v, &self.a[..len], lr, x, d);
                Some(mp.tau)
            } else if let Some(cp) = cppo.as_deref_mut().filter(|cp| cp.ci == ci) {
                cp.tile(v, x, d);
                Some(cp.delta)
            } else {
                None
            };
            if let Some(upper) = decided {
                let metric = MaskCriterion {
                    lower: None,
                    upper,
                    ..*cr
                };
                let (cc, cl) = (&mut rec.crit[ci], &mut lanes.crit[ci]);
                token_criterion(&metric, v, x, cc, cl, keep, Some(d));
                continue;
            }
            let src = match cr.source {
                // OPSM: from the sequence's sums, at its end
                MaskSource::Column(_) => continue,
                MaskSource::SerWeighted(_) => MaskSource::Ser, // LN-TRM: |ρ_t − 1|, weighted below
                s => s,
            };
            statistic(src, c, rho, x);
            let (cc, cl) = (&mut rec.crit[ci], &mut lanes.crit[ci]);
            match cr.agg {
                MaskAgg::Token => token_criterion(cr, v, x, cc, cl, keep, None),
                MaskAgg::Max => cc.agg = max(extremum_where(v, x, 1.0), cc.agg),
                // 0 at padding (c = 0, rho = 1) for every statistic
                MaskAgg::Sum | MaskAgg::Mean | MaskAgg::MeanVerl => cl.agg.add(x),
                // LN-TRM (0 at padding: w_t = 0 there)
                MaskAgg::WeightedMean(_) => {
                    x.iter_mut().zip(lw.iter()).for_each(|(x, &w)| *x *= w);
                    cl.agg.add(x);
                    cl.wsum.add(lw);
                }
            }
        }
        rec.n_rej_any += v
            .iter()
            .zip(keep.iter())
            .map(|(&v, &k)| v & u64::from(!k))
            .sum::<u64>();
        Some(())
    }

    /// The columns and the statistics every plan needs, in one loop over the tile (`len` a
    /// multiple of `LANES`): `valid`, `c` (the log-ratio clamped to the safety bound, 0 at
    /// padding), `rho = e^c`, `keep` = valid, the valid count and the per-sequence sums of the
    /// log-probs, the log-ratio, k3 and ρ². Each sum gets the same terms in the same lanes as
    /// [`Cols::base_columns`], so the same bits. `None` on a bad mask value or a non-finite
    /// valid log-prob; `Some(false)` when a log-ratio exceeds the safety bound, with nothing
    /// added (the caller runs [`Cols::base_columns`]).
    #[inline(always)]
    fn base_fused(&mut self, len: usize, rec: &mut SeqRec, lanes: &mut SeqLanes) -> Option<bool> {
        let (mut st, mut sr, mut sl) = (lanes.s_train, lanes.s_roll, lanes.s_lr);
        let (mut sk, mut s2) = (lanes.s_k3u, lanes.s_rho2);
        let mut n = [0u64; LANES];
        let (mut bad, mut wide) = ([false; LANES], [false; LANES]);
        for j0 in (0..len).step_by(LANES) {
            let mut t = [[0f64; LANES]; 5];
            let (m, o, r) = (oct(&self.m, j0), oct(&self.o, j0), oct(&self.r, j0));
            let (mut valid, mut c, mut rho) = ([0u64; LANES], [0f64; LANES], [0f64; LANES]);
            let mut keep = [false; LANES];
            for l in 0..LANES {
                let (v, b) = check_slot(m[l], o[l], r[l]);
                bad[l] |= b;
                let lr = if v { o[l] - r[l] } else { 0.0 };
                c[l] = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND);
                wide[l] |= lr != c[l];
                let vm = u64::from(v).wrapping_neg();
                valid[l] = vm;
                rho[l] = exp_bounded(c[l]);
                t[0][l] = f64::from_bits(o[l].to_bits() & vm);
                t[1][l] = f64::from_bits(r[l].to_bits() & vm);
                t[2][l] = lr;
                t[3][l] = (rho[l] - lr) - 1.0;
                t[4][l] = f64::from_bits((rho[l] * rho[l]).to_bits() & vm);
                n[l] += vm & 1;
                keep[l] = v;
            }
            oct_mut(&mut self.valid, j0).copy_from_slice(&valid);
            oct_mut(&mut self.c, j0).copy_from_slice(&c);
            oct_mut(&mut self.rho, j0).copy_from_slice(&rho);
            oct_mut(&mut self.keep, j0).copy_from_slice(&keep);
            st.add8(&t[0]);
            sr.add8(&t[1]);
            sl.add8(&t[2]);
            sk.add8(&t[3]);
            s2.add8(&t[4]);
        }
        if bad.contains(&true) {
            return None;
        }
        if wide.contains(&true) {
            return Some(false);
        }
        (lanes.s_train, lanes.s_roll, lanes.s_lr) = (st, sr, sl);
        (lanes.s_k3u, lanes.s_rho2) = (sk, s2);
        rec.n += n.iter().sum::<u64>();
        Some(true)
    }

    /// [`Cols::base_fused`] a column at a time, for tiles holding a log-ratio beyond the
    /// safety bound (k3 from the unclamped ratio).
    fn base_columns(&mut self, len: usize, rec: &mut SeqRec, lanes: &mut SeqLanes) {
        for j in 0..len {
            self.lr[j] = if self.valid[j] != 0 {
                self.o[j] - self.r[j]
            } else {
                0.0
            };
            self.rho[j] = exp_bounded(self.c[j]);
        }
        let v = &self.valid[..len];
        let (lr, c, rho) = (&self.lr[..len], &self.c[..len], &self.rho[..len]);
        let (x, y) = (&mut self.x[..len], &mut self.y[..len]);
        rec.n += v.iter().map(|&v| v & 1).sum::<u64>();
        add_valid(&mut lanes.s_train, &self.o[..len], v, y);
        add_valid(&mut lanes.s_roll, &self.r[..len], v, y);
        lanes.s_lr.add(lr);
        for ((x, &r), &l) in x.iter_mut().zip(rho).zip(lr) {
            *x = (r - l) - 1.0;
        }
        for j in 0..len {
            if lr[j] != c[j] {
                x[j] = (lr[j].exp() - lr[j]) - 1.0;
            }
        }
        lanes.s_k3u.add(x);
        for (x, &r) in x.iter_mut().zip(rho) {
            *x = r * r;
        }
        add_valid(&mut lanes.s_rho2, x, v, y);
        for (k, &v) in self.keep[..len].iter_mut().zip(v) {
            *k = v != 0;
        }
    }
}

/// The per-token statistic `src` of the clamped log-ratios `c` (`rho = e^c`) into `x`.
#[inline(always)]
pub(super) fn statistic(src: MaskSource, c: &[f64], rho: &[f64], x: &mut [f64]) {
    let cs = x.iter_mut().zip(c);
    match src {
        MaskSource::K1 => cs.for_each(|(x, &c)| *x = -c),
        MaskSource::K2 => cs.for_each(|(x, &c)| *x = 0.5 * c * c),
        MaskSource::K3 => {
            // the series for every value (vectorised), then expm1 where |c| ≥ 0.1: exactly
            // `k3_from_log_ratio`
            cs.for_each(|(x, &c)| *x = k3_series(c));
            for (x, &c) in x.iter_mut().zip(c) {
                if c.abs() >= 0.1 {
                    *x = k3_from_log_ratio(c);
                }
            }
        }
        MaskSource::K3Verl => cs.zip(rho).for_each(|((x, &c), &r)| *x = (r - 1.0) + -c),
        MaskSource::Abs => cs.for_each(|(x, &c)| *x = c.abs()),
        MaskSource::Ser => cs.for_each(|(x, &c)| *x = c.exp_m1().abs()),
        MaskSource::Column(_) | MaskSource::SerWeighted(_) | MaskSource::BinaryKl(_) => {
            unreachable!("not a lean plan")
        }
    }
}

/// Token IS: the weights `w` (0 at padding) and their sums (`y` is scratch).
#[inline(always)]
fn token_weights(
    w: &mut [f64],
    v: &[u64],
    rho: &[f64],
    is: &MaskIs,
    rec: &mut SeqRec,
    lanes: &mut SeqLanes,
) {
    let u = is.upper;
    let (l, lo) = (
        is.lower.unwrap_or(f64::NEG_INFINITY),
        is.lower.unwrap_or(1.0 / u),
    );
    let (mut s_w, mut s_raw, mut s_wc, mut s_wc2) =
        (lanes.s_w, lanes.s_raw, lanes.s_wc, lanes.s_wc2);
    let (mut top, mut bot) = ([f64::NEG_INFINITY; LANES], [f64::NEG_INFINITY; LANES]);
    let (mut hi, mut low, mut oob) = ([0u64; LANES], [0u64; LANES], [0u64; LANES]);
    for j0 in (0..w.len()).step_by(LANES) {
        let (v8, r8) = (oct(v, j0), oct(rho, j0));
        let (mut w8, mut raw, mut y1, mut y2) =
            ([0f64; LANES], [0f64; LANES], [0f64; LANES], [0f64; LANES]);
        for k in 0..LANES {
            let (vv, r) = (v8[k], r8[k]);
            let wk = match is.lower {
                None => sel(vv, min(r, u), 0.0),
                Some(_) => sel(vv & u64::from((r >= l) & (r <= u)).wrapping_neg(), r, 0.0),
            };
            w8[k] = wk;
            top[k] = max(sel(vv, wk, f64::NEG_INFINITY), top[k]);
            bot[k] = max(sel(vv, -wk, f64::NEG_INFINITY), bot[k]);
            raw[k] = sel(vv, r, 0.0);
            hi[k] += vv & u64::from(r > u);
            low[k] += vv & u64::from(r < lo);
            oob[k] += vv & u64::from((r < l) | (r > u));
            // clipped weights (0 at padding already)
            let y = min(max(wk, 0.0), u);
            y1[k] = y;
            y2[k] = y * y;
        }
        oct_mut(w, j0).copy_from_slice(&w8);
        s_w.add8(&w8);
        s_raw.add8(&raw);
        s_wc.add8(&y1);
        s_wc2.add8(&y2);
    }
    (lanes.s_w, lanes.s_raw, lanes.s_wc, lanes.s_wc2) = (s_w, s_raw, s_wc, s_wc2);
    let fold = |m: [f64; LANES]| m.iter().fold(f64::NEG_INFINITY, |a, &b| max(b, a));
    rec.w_max = max(fold(top), rec.w_max);
    rec.w_min = min(-fold(bot), rec.w_min);
    rec.is_hi += hi.iter().sum::<u64>();
    rec.is_lo += low.iter().sum::<u64>();
    if is.lower.is_some() {
        rec.is_oob += oob.iter().sum::<u64>();
    }
}

/// A token criterion over the tile in one loop: its rejections (cleared from `keep`), and its
/// metric sums, extremes and counts over the valid slots. `drop` (1 dropped), where given,
/// decides instead of the bounds (M2PO: its bounds are then only its metrics').
#[inline(always)]
fn token_criterion(
    cr: &MaskCriterion,
    v: &[u64],
    x: &[f64],
    cc: &mut super::finish::CritRec,
    cl: &mut CritLanes,
    keep: &mut [bool],
    drop: Option<&[f64]>,
) {
    let (floor, up) = (cr.lower.unwrap_or(0.0), cr.upper);
    let lo = cr.lower.unwrap_or(f64::NEG_INFINITY);
    let (mut pts, mut sc1, mut sc2) = (cl.pts, cl.sc1, cl.sc2);
    let (mut top, mut bot) = ([f64::NEG_INFINITY; LANES], [f64::NEG_INFINITY; LANES]);
    let (mut hi, mut low, mut rej) = ([0u64; LANES], [0u64; LANES], [0u64; LANES]);
    for j0 in (0..x.len()).step_by(LANES) {
        let (mut xs, mut y1, mut y2) = ([0f64; LANES], [0f64; LANES], [0f64; LANES]);
        let (v8, x8) = (oct(v, j0), oct(x, j0));
        let d8 = drop.map(|d| oct(d, j0));
        let mut inside8 = [false; LANES];
        for l in 0..LANES {
            let (vv, xx) = (v8[l], x8[l]);
            xs[l] = xx;
            top[l] = max(sel(vv, xx, f64::NEG_INFINITY), top[l]);
            bot[l] = max(sel(vv, -xx, f64::NEG_INFINITY), bot[l]);
            hi[l] += vv & u64::from(xx > up);
            low[l] += vv & u64::from(xx < lo);
            let inside = match d8 {
                Some(d) => d[l] == 0.0,
                None => (xx >= lo) & (xx <= up),
            };
            rej[l] += vv & u64::from(!inside);
            inside8[l] = inside;
            let y = sel(vv, min(max(xx, floor), up), 0.0);
            y1[l] = y;
            y2[l] = y * y;
        }
        for (k, i) in oct_mut(keep, j0).iter_mut().zip(inside8) {
            *k &= i;
        }
        pts.add8(&xs); // 0 at padding
        sc1.add8(&y1);
        sc2.add8(&y2);
    }
    (cl.pts, cl.sc1, cl.sc2) = (pts, sc1, sc2);
    let fold = |m: [f64; LANES]| m.iter().fold(f64::NEG_INFINITY, |a, &b| max(b, a));
    cc.tmax = max(fold(top), cc.tmax);
    cc.tmin = min(-fold(bot), cc.tmin);
    cc.hi += hi.iter().sum::<u64>();
    cc.lo += low.iter().sum::<u64>();
    cc.rej += rej.iter().sum::<u64>();
}
