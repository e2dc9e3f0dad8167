//! trmask's per-token diagnostics — the estimators by response position, the breakdowns by
//! rollout probability, entropy, advantage sign and turn, and the effective sample sizes of the
//! weights the mask keeps — in one accumulator that both executors feed slot by slot, in slot
//! order: the fused CPU pass from a tile's columns, the engines' full path from the statistics
//! table. [`SeqDiag`] holds one sequence (plain f64 sums: a sequence is short), [`DiagAcc`] a
//! shard's sequences (compensated sums, merged in sequence order), and [`DiagAcc::put`] writes
//! every metric once, as mergeable partials.
//!
//! A sequence's sums run in [`LaneSum`] lanes by slot (lane = the slot's index from the
//! sequence's start mod [`LANES`]), so an octet of valid slots is added as one vector
//! ([`SeqDiag::tile`]) and a slot on its own ([`SeqDiag::slot`]) into its lane, with the same
//! bits: both executors feed the same values and get the same sums however they cut a
//! sequence.

use super::breakdown::{turn_label, ENTROPY_BUCKETS, PROB_BUCKETS, TURNS};
use super::diagnostics::{bucket_of, put_position_means, POSITION_BUCKETS};
use crate::math::{LaneSum, LANES};

mod acc;
pub(crate) use acc::{from_columns, Columns, DiagAcc};

const NPOS: usize = POSITION_BUCKETS.len();
const NPROB: usize = PROB_BUCKETS.len();
const NENT: usize = ENTROPY_BUCKETS.len();
const NTURN: usize = TURNS + 1;

/// The bucket of a rollout log-prob among [`PROB_BUCKETS`] (probability edges compared in log
/// space: `ln p < ln hi`).
#[inline(always)]
fn prob_bucket(log_p: f64) -> usize {
    // ln 0.01, ln 0.1, ln 0.5, ln 0.9
    const EDGES: [f64; 4] = [
        -2.0 * std::f64::consts::LN_10,
        -std::f64::consts::LN_10,
        -std::f64::consts::LN_2,
        -0.105_360_515_657_826_3,
    ];
    EDGES.iter().map(|&e| usize::from(log_p >= e)).sum()
}

/// The bucket of a training entropy among [`ENTROPY_BUCKETS`].
#[inline(always)]
fn entropy_bucket(h: f64) -> usize {
    ENTROPY_BUCKETS[..NENT - 1]
        .iter()
        .map(|&(hi, _)| usize::from(h >= hi))
        .sum()
}

/// What a batch feeds the diagnostics besides the log-ratios.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Feeds {
    /// The rollout log-prob of each slot (the probability breakdown).
    pub(crate) prob: bool,
    /// The training entropy (logits only).
    pub(crate) entropy: bool,
    /// Advantages (per token, or per sequence broadcast).
    pub(crate) adv: bool,
    /// IS weights.
    pub(crate) weights: bool,
}

/// One valid slot's values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    /// The log-ratio clamped to the safety bound (k1 = −c, |log ρ| = |c|).
    pub(crate) c: f64,
    /// The log-ratio as given (the breakdowns' `log_ratio_mean`).
    pub(crate) lr: f64,
    pub(crate) k3: f64,
    pub(crate) roll_lp: f64,
    pub(crate) entropy: f64,
    pub(crate) adv: f64,
    pub(crate) weight: f64,
    /// The token criteria keep it (a rejected sequence is folded in as a whole).
    pub(crate) keep: bool,
}

/// Sums by bucket, in lanes: k3, log-ratio; valid and (token-)rejected counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tally<const N: usize> {
    k3: [LaneSum; N],
    lr: [LaneSum; N],
    n: [u64; N],
    rej: [u64; N],
}

impl<const N: usize> Default for Tally<N> {
    fn default() -> Self {
        Tally {
            k3: [LaneSum::default(); N],
            lr: [LaneSum::default(); N],
            n: [0; N],
            rej: [0; N],
        }
    }
}

impl<const N: usize> Tally<N> {
    /// One slot in lane `l`.
    #[inline(always)]
    fn add(&mut self, b: usize, l: usize, s: &Slot) {
        self.k3[b].add_at(l, s.k3);
        self.lr[b].add_at(l, s.lr);
        self.n[b] += 1;
        self.rej[b] += u64::from(!s.keep);
    }

    /// The noted octets of a run (their columns gathered in `g`), lane `l` of octet `i` in
    /// bucket `b[i][l]`: added to each bucket's lanes masked (0 elsewhere: the same bits as
    /// adding each slot to its bucket), one bucket at a time, so that its accumulators stay
    /// in registers.
    #[inline(always)]
    fn add_masked(&mut self, g: &Gathered, b: &[[u64; LANES]]) {
        // every slot in one bucket (an advantage per sequence): one bucket's sums, the same
        // bits (the other buckets would only get zeros)
        let first = b.first().map_or(0, |o| o[0]);
        if (first as usize) < N && b.iter().all(|o| o.iter().all(|&x| x == first)) {
            self.add_bucket(first as usize, g, 0..b.len());
            return;
        }
        for k in 0..N {
            let (mut s3, mut sl) = (self.k3[k], self.lr[k]);
            // counts in f64 lanes (exact; integer lanes do not vectorise here)
            let (mut n, mut rej) = ([0f64; LANES], [0f64; LANES]);
            for (i, b) in b.iter().enumerate() {
                let m = each(b, |b| u64::from(b == k as u64).wrapping_neg());
                s3.add8_where(&g.k3[i], &m);
                sl.add8_where(&g.lr[i], &m);
                for l in 0..LANES {
                    n[l] += f64::from_bits(ONE & m[l]);
                    rej[l] += f64::from_bits(ONE & m[l] & g.dropped[i][l]);
                }
            }
            (self.k3[k], self.lr[k]) = (s3, sl);
            self.n[k] += n.iter().sum::<f64>() as u64;
            self.rej[k] += rej.iter().sum::<f64>() as u64;
        }
    }

    /// The noted octets of a run, octet `o` wholly in bucket `bucket(o)`: runs of octets in
    /// one bucket summed in registers.
    #[inline(always)]
    fn add_runs(&mut self, octs: &[Oct], g: &Gathered, bucket: impl Fn(&Oct) -> usize) {
        let mut i = 0;
        while i < octs.len() {
            let b = bucket(&octs[i]).min(N - 1);
            let end = octs[i..]
                .iter()
                .position(|o| bucket(o) != b)
                .map_or(octs.len(), |e| i + e);
            self.add_bucket(b, g, i..end);
            i = end;
        }
    }

    /// The gathered octets `octs` wholly in bucket `k`, summed in registers.
    #[inline(always)]
    fn add_bucket(&mut self, k: usize, g: &Gathered, octs: std::ops::Range<usize>) {
        let (mut s3, mut sl, mut rej) = (self.k3[k], self.lr[k], [0f64; LANES]);
        for i in octs.clone() {
            s3.add8(&g.k3[i]);
            sl.add8(&g.lr[i]);
            for (r, &d) in rej.iter_mut().zip(&g.dropped[i]) {
                *r += f64::from_bits(ONE & d);
            }
        }
        (self.k3[k], self.lr[k]) = (s3, sl);
        self.n[k] += (octs.len() * LANES) as u64;
        self.rej[k] += rej.iter().sum::<f64>() as u64;
    }
}

/// The bits of 1.0 (a count added in f64 lanes, masked).
const ONE: u64 = 0x3ff0_0000_0000_0000;

/// Most slots [`SeqDiag::tile`] takes at once.
pub(crate) const RUN: usize = 512;

/// An octet of valid slots inside one position bucket: its first slot in the run, its
/// position bucket and its turn.
#[derive(Clone, Copy, Default)]
struct Oct {
    j0: usize,
    pb: usize,
    turn: usize,
}

/// The noted octets' k3, log-ratio and dropped (all ones where the token criteria reject)
/// side by side (the [`DiagAcc`]'s scratch: allocated once per shard, refilled run by run).
#[derive(Clone, Debug, Default)]
struct Gathered {
    k3: Vec<[f64; LANES]>,
    lr: Vec<[f64; LANES]>,
    dropped: Vec<[u64; LANES]>,
}

/// A run of a sequence's slots in columns (its first slot at a multiple of [`LANES`] from the
/// sequence's start), every column as long as `valid`: what [`SeqDiag::tile`] reads. A column
/// the [`Feeds`] do not name is not read (it may be empty); `weight` `None` is 0.
#[derive(Clone, Copy)]
pub(crate) struct TileIn<'a> {
    /// Nonzero at a valid slot.
    pub(crate) valid: &'a [u64],
    pub(crate) c: &'a [f64],
    pub(crate) lr: &'a [f64],
    pub(crate) k3: &'a [f64],
    pub(crate) roll_lp: &'a [f64],
    pub(crate) entropy: &'a [f64],
    pub(crate) adv: &'a [f64],
    pub(crate) weight: Option<&'a [f64]>,
    pub(crate) keep: &'a [bool],
}

impl TileIn<'_> {
    fn slot(&self, j: usize) -> Slot {
        let at = |v: &[f64]| v.get(j).copied().unwrap_or(0.0);
        Slot {
            c: self.c[j],
            lr: self.lr[j],
            k3: self.k3[j],
            roll_lp: at(self.roll_lp),
            entropy: at(self.entropy),
            adv: at(self.adv),
            weight: self.weight.map_or(0.0, at),
            keep: self.keep[j],
        }
    }
}

/// The `LANES` elements of `s` from `j0`, copied (a column the feeds name: as long as the
/// run).
#[inline(always)]
fn oct<T: Copy>(s: &[T], j0: usize) -> [T; LANES] {
    *crate::math::octet(s, j0)
}

/// `f` of each lane (a loop that inlines and vectorises, unlike `array::map`).
#[inline(always)]
fn each<T: Copy, U: Copy + Default>(x: &[T; LANES], f: impl Fn(T) -> U) -> [U; LANES] {
    let mut out = [U::default(); LANES];
    for (o, &x) in out.iter_mut().zip(x) {
        *o = f(x);
    }
    out
}

/// One sequence's diagnostics, fed its slots in order ([`SeqDiag::tile`] for a run of
/// slots, [`SeqDiag::slot`] for one valid slot, [`SeqDiag::gap`] for padding inside the row:
/// it ends a turn).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SeqDiag {
    /// Σ k1, k3, |log ρ| by response position.
    pos: [[LaneSum; 3]; NPOS],
    pos_n: [u64; NPOS],
    prob: Tally<NPROB>,
    ent: Tally<NENT>,
    adv: Tally<3>,
    turn: Tally<NTURN>,
    /// Valid slots so far, their position bucket and where the next one starts, and turns
    /// (maximal runs of valid slots).
    t: u64,
    pb: usize,
    next_pb: u64,
    turns: u64,
    in_turn: bool,
    adv_sum: LaneSum,
    /// Σ w, Σ w² and the count over the slots the token criteria keep; with sequence IS the
    /// sequence's weight instead.
    w1: LaneSum,
    w2: LaneSum,
    n_kept: u64,
    seq_w: Option<f64>,
}

/// The sign class of an advantage: 0 positive, 1 negative, 2 zero.
#[inline(always)]
fn sign(a: f64) -> usize {
    usize::from(a <= 0.0) + usize::from(a == 0.0)
}

impl SeqDiag {
    /// Sequence-level IS: every kept token carries the sequence's weight `ws`.
    pub(crate) fn seq_weight(&mut self, ws: f64) {
        self.seq_w = Some(ws);
    }

    /// Σ w and Σ w² over the kept slots.
    fn weight_sums(&self) -> (f64, f64) {
        let n = self.n_kept as f64;
        match self.seq_w {
            Some(ws) => (ws * n, ws * ws * n),
            None => (self.w1.value(), self.w2.value()),
        }
    }

    /// A padding slot inside the sequence's range: the current turn ends.
    #[inline(always)]
    pub(crate) fn gap(&mut self) {
        self.in_turn = false;
    }

    /// A run of at most [`RUN`] slots (see [`TileIn`]), `acc` counting their log ρ: first
    /// the octets of valid slots inside one position bucket are noted (with their bucket and
    /// turn) and every other slot is fed on its own, in order; then each sum runs over the
    /// noted octets as vectors, its accumulators held in registers.
    #[inline(always)]
    pub(crate) fn tile(&mut self, f: &Feeds, t: &TileIn<'_>, acc: &mut DiagAcc) {
        // both callers cut their runs at RUN (the fused pass's TILE, asserted where it is
        // defined; `from_columns`)
        debug_assert!(t.valid.len() <= RUN);
        let n = t.valid.len().min(RUN);
        let whole = n / LANES * LANES;
        let mut octs = [Oct::default(); RUN / LANES];
        let mut k = 0;
        for j0 in (0..whole).step_by(LANES) {
            let v = oct(t.valid, j0);
            let all = v.iter().all(|&v| v != 0);
            if all && self.t == self.next_pb {
                // the first token, or the first of the next position bucket (as `slot` does;
                // the buckets' edges are multiples of LANES, so the octet fits in one)
                self.pb = bucket_of(self.t as usize);
                self.next_pb = POSITION_BUCKETS[self.pb] as u64;
            }
            if all && self.t + LANES as u64 <= self.next_pb {
                if !self.in_turn {
                    self.turns += 1;
                    self.in_turn = true;
                }
                octs[k] = Oct {
                    j0,
                    pb: self.pb,
                    turn: (self.turns as usize - 1).min(TURNS),
                };
                k += 1;
                self.pos_n[self.pb] += LANES as u64;
                self.t += LANES as u64;
            } else {
                self.slots(f, t, j0..j0 + LANES, acc);
            }
        }
        self.slots(f, t, whole..n, acc);
        let octs = &octs[..k];
        if octs.is_empty() {
            return;
        }
        // by position: runs of one bucket
        let mut i = 0;
        while i < octs.len() {
            let pb = octs[i].pb;
            let end = octs[i..]
                .iter()
                .position(|o| o.pb != pb)
                .map_or(octs.len(), |e| i + e);
            let mut p = self.pos[pb];
            for o in &octs[i..end] {
                let c = oct(t.c, o.j0);
                p[0].add8(&each(&c, |c| -c));
                p[1].add8(&oct(t.k3, o.j0));
                p[2].add8(&each(&c, f64::abs));
            }
            self.pos[pb] = p;
            i = end;
        }
        // the noted octets' columns side by side
        let g = &mut acc.scratch;
        g.k3.clear();
        g.lr.clear();
        g.dropped.clear();
        g.k3.extend(octs.iter().map(|o| oct(t.k3, o.j0)));
        g.lr.extend(octs.iter().map(|o| oct(t.lr, o.j0)));
        g.dropped.extend(
            octs.iter()
                .map(|o| each(&oct(t.keep, o.j0), |k| u64::from(!k).wrapping_neg())),
        );
        let b = &mut [[0u64; LANES]; RUN / LANES];
        let b = &mut b[..octs.len()];
        if f.prob {
            for (b, o) in b.iter_mut().zip(octs) {
                *b = each(&oct(t.roll_lp, o.j0), |x| prob_bucket(x) as u64);
            }
            self.prob.add_masked(g, b);
        }
        if f.entropy {
            for (b, o) in b.iter_mut().zip(octs) {
                *b = each(&oct(t.entropy, o.j0), |x| entropy_bucket(x) as u64);
            }
            self.ent.add_masked(g, b);
        }
        if f.adv {
            let mut s = self.adv_sum;
            for (b, o) in b.iter_mut().zip(octs) {
                let a = oct(t.adv, o.j0);
                *b = each(&a, |a| sign(a) as u64);
                s.add8(&a);
            }
            self.adv_sum = s;
            self.adv.add_masked(g, b);
        }
        self.turn.add_runs(octs, g, |o| o.turn);
        if let Some(h) = acc.hist.as_mut() {
            for lr in &g.lr {
                h.add8(lr);
            }
        }
        let mut dropped = [0f64; LANES];
        for d in &g.dropped {
            for l in 0..LANES {
                dropped[l] += f64::from_bits(ONE & d[l]);
            }
        }
        self.n_kept += (octs.len() * LANES) as u64 - dropped.iter().sum::<f64>() as u64;
        if let Some(w) = t.weight {
            let (mut w1, mut w2) = (self.w1, self.w2);
            for (o, d) in octs.iter().zip(&g.dropped) {
                let (w, keep) = (oct(w, o.j0), each(d, |d| !d));
                w1.add8_where(&w, &keep);
                w2.add8_where(&each(&w, |w| w * w), &keep);
            }
            (self.w1, self.w2) = (w1, w2);
        }
    }

    fn slots(&mut self, f: &Feeds, t: &TileIn<'_>, js: std::ops::Range<usize>, h: &mut DiagAcc) {
        for j in js {
            if t.valid[j] == 0 {
                self.gap();
            } else {
                self.slot(f, j, t.slot(j), h);
            }
        }
    }

    /// A valid slot, `j` its index from the sequence's start (mod [`LANES`]: its lane).
    #[inline(always)]
    pub(crate) fn slot(&mut self, f: &Feeds, j: usize, s: Slot, h: &mut DiagAcc) {
        let l = j % LANES;
        if !self.in_turn {
            self.turns += 1;
            self.in_turn = true;
        }
        if self.t == self.next_pb {
            // the first token, or the first of the next position bucket
            self.pb = bucket_of(self.t as usize);
            self.next_pb = POSITION_BUCKETS[self.pb] as u64;
        }
        let p = &mut self.pos[self.pb];
        p[0].add_at(l, -s.c);
        p[1].add_at(l, s.k3);
        p[2].add_at(l, s.c.abs());
        self.pos_n[self.pb] += 1;
        self.t += 1;
        if f.prob {
            self.prob.add(prob_bucket(s.roll_lp), l, &s);
        }
        if f.entropy {
            self.ent.add(entropy_bucket(s.entropy), l, &s);
        }
        if f.adv {
            self.adv.add(sign(s.adv), l, &s);
            self.adv_sum.add_at(l, s.adv);
        }
        self.turn.add((self.turns as usize - 1).min(TURNS), l, &s);
        if let Some(h) = h.hist.as_mut() {
            h.add(l, s.lr);
        }
        if s.keep {
            self.w1.add_at(l, s.weight);
            self.w2.add_at(l, s.weight * s.weight);
            self.n_kept += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partial::Partial;

    /// Turns, advantage signs and probability buckets by hand, through the engines' feed.
    #[test]
    fn turns_signs_and_buckets_by_hand() {
        use crate::input::batch::Segments;
        let mask = [1., 1., 0., 1., 0., 1., 1., 1., 1., 0., 0., 0., 0., 0.];
        let valid: Vec<bool> = mask.iter().map(|&m| m > 0.0).collect();
        let segs = Segments::new(vec![(0, 7), (7, 14)], valid).unwrap();
        let adv: Vec<f64> = [1.0; 7].into_iter().chain([-2.0; 7]).collect();
        let k3: Vec<f64> = (0..14).map(|i| i as f64).collect();
        let lr: Vec<f64> = (0..14).map(|i| -(i as f64)).collect();
        let k1: Vec<f64> = lr.iter().map(|x| -x).collect();
        let lp: Vec<f64> = (0..14)
            .map(|i| if i % 2 == 0 { -0.01 } else { -3.0 })
            .collect();
        // slot 5 dropped by a token criterion; sequence 1 rejected as a whole
        let keep: Vec<f64> = (0..14)
            .map(|i| if i == 5 || i >= 7 { 0.0 } else { mask[i] })
            .collect();
        let cols = Columns {
            k1: &k1,
            k3: &k3,
            log_ratio: &lr,
            roll_lp: Some(&lp),
            entropy: None,
            adv: Some(&adv),
            weights: None,
        };
        let (f, acc) = from_columns(&segs, &cols, &keep, &[true, false], true);
        let mut p = Partial::new();
        acc.put(&f, &mut p);
        let m = p.finish().unwrap();
        assert_eq!(m["trmask/turns_max"], 3.0);
        assert_eq!(m["trmask/turns_mean"], 2.0);
        assert_eq!(m["trmask/turn/1/k3_mean"], (0.0 + 1.0 + 7.0 + 8.0) / 4.0);
        assert_eq!(m["trmask/turn/2/k3_mean"], 3.0);
        assert_eq!(m["trmask/turn/3/k3_mean"], 5.5);
        assert_eq!(m["trmask/turn/3/rejected_fraction"], 0.5);
        assert_eq!(m["trmask/turn/1/rejected_fraction"], 0.5);
        assert_eq!(m["trmask/turn/1/token_fraction"], 4.0 / 7.0);
        assert!(!m.contains_key("trmask/turn/4/k3_mean"));
        assert_eq!(m["trmask/adv_pos/token_fraction"], 5.0 / 7.0);
        assert_eq!(m["trmask/adv_pos/rejected_fraction"], 0.2);
        assert_eq!(m["trmask/adv_neg/rejected_fraction"], 1.0);
        assert_eq!(m["trmask/adv_neg/seq_rejected_fraction"], 1.0);
        assert_eq!(m["trmask/adv_pos/seq_rejected_fraction"], 0.0);
        assert!(!m.contains_key("trmask/adv_zero/k3_mean"));
        // p = e^-0.01 → 0.9-1 (slots 0, 6, 8), p = e^-3 ≈ 0.05 → 0.01-0.1 (1, 3, 5, 7)
        assert_eq!(m["trmask/by_prob/0.9-1/k3_mean"], (0.0 + 6.0 + 8.0) / 3.0);
        assert_eq!(m["trmask/by_prob/0.01-0.1/token_fraction"], 4.0 / 7.0);
        assert_eq!(m["trmask/k3_mean"], 30.0 / 7.0);
        assert_eq!(m["trmask/k1_pos_0_16"], 30.0 / 7.0);
    }

    /// The masked octet sums, for one bucket throughout (the fast path) and for mixed
    /// buckets, give the bits of adding each slot to its bucket's lane.
    #[test]
    fn masked_octets_equal_slot_by_slot() {
        let mut rnd = crate::math::test_uniform();
        for uniform in [true, false] {
            let octs = 6;
            let mut g = Gathered::default();
            let mut b = vec![[0u64; LANES]; octs];
            for bo in b.iter_mut() {
                g.k3.push(std::array::from_fn(|_| rnd() * 1e-3));
                g.lr.push(std::array::from_fn(|_| rnd() - 0.5));
                g.dropped.push(std::array::from_fn(|_| {
                    u64::from(rnd() < 0.2).wrapping_neg()
                }));
                *bo = std::array::from_fn(|_| if uniform { 2 } else { (rnd() * 3.0) as u64 });
            }
            let mut fast = Tally::<3>::default();
            fast.add_masked(&g, &b);
            let mut slow = Tally::<3>::default();
            for (i, bo) in b.iter().enumerate() {
                for (l, &k) in bo.iter().enumerate() {
                    let s = Slot {
                        c: 0.0,
                        lr: g.lr[i][l],
                        k3: g.k3[i][l],
                        roll_lp: 0.0,
                        entropy: 0.0,
                        adv: 0.0,
                        weight: 0.0,
                        keep: g.dropped[i][l] == 0,
                    };
                    slow.add(k as usize, l, &s);
                }
            }
            for k in 0..3 {
                assert_eq!(fast.k3[k].value().to_bits(), slow.k3[k].value().to_bits());
                assert_eq!(fast.lr[k].value().to_bits(), slow.lr[k].value().to_bits());
                assert_eq!((fast.n[k], fast.rej[k]), (slow.n[k], slow.rej[k]));
            }
        }
    }

    #[test]
    fn probability_and_entropy_buckets_at_their_edges() {
        for (p, b) in [
            (0.005, 0),
            (0.01, 1),
            (0.05, 1),
            (0.1, 2),
            (0.7, 3),
            (0.9, 4),
            (1.0, 4),
        ] {
            assert_eq!(prob_bucket(f64::ln(p)), b, "p = {p}");
        }
        for (h, b) in [(0.0, 0), (0.5, 1), (1.5, 2), (2.0, 3), (4.0, 4), (9.0, 4)] {
            assert_eq!(entropy_bucket(h), b, "h = {h}");
        }
    }
}
