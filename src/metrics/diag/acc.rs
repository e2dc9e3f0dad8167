//! A shard's diagnostics ([`DiagAcc`]): its sequences' [`SeqDiag`]s folded in order into
//! compensated sums, merged across shards, written as mergeable partials; and the engines'
//! full-path feed ([`from_columns`]).

use super::*;
use crate::partial::hist::{bin, bins8, Hist, BINS};
use crate::partial::{Acc, Empty, FracMode, Partial, Sum};

/// A shard's counts of log ρ by [`Hist`] bin, one row per lane (an octet's eight increments
/// never wait on each other).
#[derive(Clone, Debug)]
pub(super) struct LaneHist(Box<[[u64; BINS]; LANES]>);

impl Default for LaneHist {
    fn default() -> Self {
        LaneHist(Box::new([[0; BINS]; LANES]))
    }
}

impl LaneHist {
    #[inline(always)]
    pub(super) fn add(&mut self, l: usize, x: f64) {
        if let Some(b) = bin(x) {
            self.0[l % LANES][b] += 1;
        }
    }

    #[inline(always)]
    pub(super) fn add8(&mut self, x: &[f64; LANES]) {
        for (row, b) in self.0.iter_mut().zip(bins8(x)) {
            if b < BINS {
                row[b] += 1;
            }
        }
    }

    fn counts(&self) -> Vec<u64> {
        (0..BINS)
            .map(|b| self.0.iter().map(|r| r[b]).sum())
            .collect()
    }
}

/// The same, compensated, over a shard's sequences.
#[derive(Clone, Copy, Debug)]
struct TallyAcc<const N: usize> {
    k3: [Sum; N],
    lr: [Sum; N],
    n: [u64; N],
    rej: [u64; N],
}

impl<const N: usize> Default for TallyAcc<N> {
    fn default() -> Self {
        TallyAcc {
            k3: [Sum::default(); N],
            lr: [Sum::default(); N],
            n: [0; N],
            rej: [0; N],
        }
    }
}

impl<const N: usize> TallyAcc<N> {
    fn fold(&mut self, t: &Tally<N>, rejected: bool) {
        for b in 0..N {
            if t.n[b] == 0 {
                continue;
            }
            self.k3[b].add(t.k3[b].value());
            self.lr[b].add(t.lr[b].value());
            self.n[b] += t.n[b];
            self.rej[b] += if rejected { t.n[b] } else { t.rej[b] };
        }
    }

    fn merge(&mut self, o: &TallyAcc<N>) {
        for b in 0..N {
            self.k3[b].merge(o.k3[b]);
            self.lr[b].merge(o.lr[b]);
            self.n[b] += o.n[b];
            self.rej[b] += o.rej[b];
        }
    }

    /// `<prefix>/k3_mean`, `/log_ratio_mean`, `/token_fraction` (of `valid`) and, with
    /// `rejected`, `/rejected_fraction` (of the bucket's tokens the final mask drops).
    fn put(&self, p: &mut Partial, labels: &[String], valid: u64, rejected: bool) {
        let mean = |sum: Sum, n: u64| Acc::Mean {
            sum,
            n,
            offset: 0.0,
            empty: Empty::Absent,
        };
        for (b, prefix) in labels.iter().enumerate() {
            p.put(format!("{prefix}/k3_mean"), mean(self.k3[b], self.n[b]));
            p.put(
                format!("{prefix}/log_ratio_mean"),
                mean(self.lr[b], self.n[b]),
            );
            p.put(
                format!("{prefix}/token_fraction"),
                Acc::frac(
                    self.n[b] as usize,
                    valid as usize,
                    FracMode::F64,
                    Empty::Absent,
                ),
            );
            if rejected {
                p.put(
                    format!("{prefix}/rejected_fraction"),
                    Acc::frac(
                        self.rej[b] as usize,
                        self.n[b] as usize,
                        FracMode::F64,
                        Empty::Absent,
                    ),
                );
            }
        }
    }
}

/// A shard's diagnostics: its sequences folded in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct DiagAcc {
    pos: [[Sum; 3]; NPOS],
    pos_n: [u64; NPOS],
    prob: TallyAcc<NPROB>,
    ent: TallyAcc<NENT>,
    adv: TallyAcc<3>,
    turn: TallyAcc<NTURN>,
    /// Non-empty sequences and the rejected ones, by the sign of their mean advantage.
    adv_seq: [(u64, u64); 3],
    turns: Sum,
    turns_n: u64,
    turns_max: f64,
    ess_tok: (Sum, Sum, u64),
    ess_seq: (Sum, Sum, u64),
    valid: u64,
    /// log ρ over valid tokens (`#hist/log_ratio`), counted as the slots are fed; `None`
    /// when no histogram is wanted ([`DiagAcc::new`]).
    pub(super) hist: Option<LaneHist>,
    pub(super) scratch: Gathered,
    /// The factor the folded weights take: 1/the batch normaliser when it was applied after
    /// them (the fused pass), none when they were final.
    pub(crate) ess_scale: Option<f64>,
}

impl DiagAcc {
    /// An empty accumulator; `histograms`: it also counts log ρ into `#hist/log_ratio` (only
    /// the histogram readers want it: the Python details, the monitor, `trmask analyze`).
    pub(crate) fn new(histograms: bool) -> Self {
        DiagAcc {
            hist: histograms.then(LaneHist::default),
            ..DiagAcc::default()
        }
    }

    /// Whether it counts the histograms ([`DiagAcc::new`]).
    pub(crate) fn histograms(&self) -> bool {
        self.hist.is_some()
    }

    /// Folds one finished sequence: `dropped` when a sequence criterion dropped all its tokens
    /// (else the slots' `keep` is the final mask), `rejected` when any criterion rejected it
    /// (the sequence is not accepted).
    pub(crate) fn fold(&mut self, d: &SeqDiag, dropped: bool, rejected: bool) {
        if d.t == 0 {
            return;
        }
        for b in 0..NPOS {
            if d.pos_n[b] > 0 {
                for (s, x) in self.pos[b].iter_mut().zip(&d.pos[b]) {
                    s.add(x.value());
                }
                self.pos_n[b] += d.pos_n[b];
            }
        }
        self.prob.fold(&d.prob, dropped);
        self.ent.fold(&d.ent, dropped);
        self.adv.fold(&d.adv, dropped);
        self.turn.fold(&d.turn, dropped);
        let g = &mut self.adv_seq[sign(d.adv_sum.value() / d.t as f64)];
        g.0 += 1;
        g.1 += u64::from(rejected);
        self.turns.add(d.turns as f64);
        self.turns_n += 1;
        self.turns_max = self.turns_max.max(d.turns as f64);
        if !dropped && d.n_kept > 0 {
            let (w1, w2) = d.weight_sums();
            self.ess_tok.0.add(w1);
            self.ess_tok.1.add(w2);
            self.ess_tok.2 += d.n_kept;
            let m = w1 / d.n_kept as f64;
            self.ess_seq.0.add(m);
            self.ess_seq.1.add(m * m);
            self.ess_seq.2 += 1;
        }
        self.valid += d.t;
    }

    /// Merges the next shard's accumulator (sequence order kept).
    pub(crate) fn merge(&mut self, o: &DiagAcc) {
        for b in 0..NPOS {
            for (s, x) in self.pos[b].iter_mut().zip(o.pos[b]) {
                s.merge(x);
            }
            self.pos_n[b] += o.pos_n[b];
        }
        self.prob.merge(&o.prob);
        self.ent.merge(&o.ent);
        self.adv.merge(&o.adv);
        self.turn.merge(&o.turn);
        for (a, b) in self.adv_seq.iter_mut().zip(o.adv_seq) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.turns.merge(o.turns);
        self.turns_n += o.turns_n;
        self.turns_max = self.turns_max.max(o.turns_max);
        self.ess_tok.0.merge(o.ess_tok.0);
        self.ess_tok.1.merge(o.ess_tok.1);
        self.ess_tok.2 += o.ess_tok.2;
        self.ess_seq.0.merge(o.ess_seq.0);
        self.ess_seq.1.merge(o.ess_seq.1);
        self.ess_seq.2 += o.ess_seq.2;
        self.valid += o.valid;
        if let (Some(h), Some(oh)) = (self.hist.as_mut(), o.hist.as_ref()) {
            for (a, b) in h.0.iter_mut().zip(oh.0.iter()) {
                for (c, &n) in a.iter_mut().zip(b) {
                    *c += n;
                }
            }
        }
    }

    /// Every diagnostic metric, as mergeable partials: `trmask/{k1,k3,abs_log_ratio}_pos_*`
    /// and `_mean`, `trmask/by_prob/*`, `trmask/by_entropy/*`, `trmask/adv_{pos,neg,zero}/*`,
    /// `trmask/turn/*`, `trmask/turns_{mean,max}`, and with weights `trmask/ess_{token,seq}`.
    pub(crate) fn put(&self, f: &Feeds, m: &mut Partial) {
        for (i, name) in ["k1", "k3", "abs_log_ratio"].iter().enumerate() {
            let sums: [Sum; NPOS] = std::array::from_fn(|b| self.pos[b][i]);
            put_position_means(name, &sums, &self.pos_n, true, m);
        }
        let labels = |name: &str, edges: &[(f64, &str)]| -> Vec<String> {
            edges
                .iter()
                .map(|(_, l)| format!("trmask/{name}/{l}"))
                .collect()
        };
        if f.prob {
            self.prob
                .put(m, &labels("by_prob", &PROB_BUCKETS), self.valid, false);
        }
        if f.entropy {
            self.ent.put(
                m,
                &labels("by_entropy", &ENTROPY_BUCKETS),
                self.valid,
                false,
            );
        }
        if f.adv {
            let names = ["pos", "neg", "zero"].map(|l| format!("trmask/adv_{l}"));
            self.adv.put(m, &names, self.valid, true);
            for (g, prefix) in names.iter().enumerate() {
                let (n, r) = self.adv_seq[g];
                m.put(
                    format!("{prefix}/seq_rejected_fraction"),
                    Acc::frac(r as usize, n as usize, FracMode::F64, Empty::Absent),
                );
            }
        }
        let turns: Vec<String> = (0..NTURN)
            .map(|k| format!("trmask/turn/{}", turn_label(k)))
            .collect();
        self.turn.put(m, &turns, self.valid, true);
        m.put(
            "trmask/turns_mean",
            Acc::Mean {
                sum: self.turns,
                n: self.turns_n,
                offset: 0.0,
                empty: Empty::Absent,
            },
        );
        m.put(
            "trmask/turns_max",
            Acc::Max {
                v: if self.turns_n > 0 {
                    self.turns_max
                } else {
                    f64::NEG_INFINITY
                },
                empty: Empty::Absent,
            },
        );
        if f.weights {
            self.put_ess(m);
        }
        if let Some(h) = &self.hist {
            let counts = h.counts();
            m.put("#hist/log_ratio", Acc::Hist(Hist { counts }));
        }
    }

    /// `trmask/ess_token` (the weights of the tokens the final mask keeps) and
    /// `trmask/ess_seq` (each kept sequence's mean kept weight). Weights folded before a batch
    /// normalisation are scaled here by `scale` (its inverse; the ESS does not depend on it).
    pub(crate) fn put_ess(&self, m: &mut Partial) {
        let k = self.ess_scale.unwrap_or(1.0);
        let scaled = |s: Sum, f: f64| Sum {
            hi: s.hi * f,
            lo: s.lo * f,
        };
        let ess = |(s1, s2, n): (Sum, Sum, u64)| Acc::Ess {
            s1: scaled(s1, k),
            s2: scaled(s2, k * k),
            n,
        };
        m.put("trmask/ess_token", ess(self.ess_tok));
        m.put("trmask/ess_seq", ess(self.ess_seq));
    }
}

/// Per-slot columns of a whole batch (the engines' full path), read by [`from_columns`].
pub(crate) struct Columns<'a> {
    /// k1 = −c per slot.
    pub(crate) k1: &'a [f64],
    pub(crate) k3: &'a [f64],
    pub(crate) log_ratio: &'a [f64],
    pub(crate) roll_lp: Option<&'a [f64]>,
    pub(crate) entropy: Option<&'a [f64]>,
    pub(crate) adv: Option<&'a [f64]>,
    pub(crate) weights: Option<&'a [f64]>,
}

/// The diagnostics of a batch from its columns, its final mask (`keep`, per slot) and
/// per-sequence decisions: the same [`SeqDiag`] feed as the fused pass's tiles.
pub(crate) fn from_columns<'a>(
    segments: &crate::input::batch::Segments,
    cols: &Columns<'a>,
    keep: &[f64],
    seq_accept: &[bool],
    histograms: bool,
) -> (Feeds, DiagAcc) {
    let f = Feeds {
        prob: cols.roll_lp.is_some(),
        entropy: cols.entropy.is_some(),
        adv: cols.adv.is_some(),
        weights: cols.weights.is_some(),
    };
    let mask = segments.mask();
    let mut acc = DiagAcc::new(histograms);
    const RUN: usize = 512;
    let (mut valid, mut c, mut kp) = ([0u64; RUN], [0f64; RUN], [false; RUN]);
    for (s, &(a, b)) in segments.ranges().iter().enumerate() {
        let mut d = SeqDiag::default();
        for k in (a..b).step_by(RUN) {
            let e = (k + RUN).min(b);
            let n = e - k;
            for j in 0..n {
                valid[j] = u64::from(mask[k + j]);
                c[j] = -cols.k1[k + j];
                kp[j] = keep[k + j] > 0.0;
            }
            let col = |v: Option<&'a [f64]>| v.map_or(&[][..], |v| &v[k..e]);
            let t = TileIn {
                valid: &valid[..n],
                c: &c[..n],
                lr: &cols.log_ratio[k..e],
                k3: &cols.k3[k..e],
                roll_lp: col(cols.roll_lp),
                entropy: col(cols.entropy),
                adv: col(cols.adv),
                weight: cols.weights.map(|w| &w[k..e]),
                keep: &kp[..n],
            };
            d.tile(&f, &t, &mut acc);
        }
        acc.fold(&d, false, !seq_accept[s]);
    }
    (f, acc)
}
