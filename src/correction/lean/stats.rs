//! A tile's columns fed to the sequence's diagnostics ([`Cols::feed_diag`]), and what `trmask
//! analyze` adds to the fused pass (`LeanPlan::analyze`), fed each tile's columns
//! after the diagnostics: the statistics table's columns reduced as the full path reduces them
//! (per sequence in [`LaneSum`] lanes by slot, so the same bits; their maxima), the bound
//! certificate's inputs over all and over the accepted sequences, and what the summary screen
//! and the warnings read ([`Findings`]: each sequence's worst token, the log-ratio's spread,
//! positive log-probs, log-probs that are bf16 / f16 values).

use super::tile::{statistic, Cols, TILE};
use crate::analysis::sweep::{swept_token_criteria, token_lower, TokenValues};
use crate::bounds::certificate::{CERT_ACCEPTED, CERT_ALL};
use crate::config::Resolved;
use crate::engine::plan::MaskSource;
use crate::math::{binary_kl, binary_kl_given8, half_exact, ulp, LaneSum, LANES};
use crate::metrics::diag::DiagAcc;
use crate::metrics::diag::{Feeds, SeqDiag, TileIn};
use crate::partial::{Acc, CertAcc, Empty, Partial, Sum};
use crate::stats::Findings;
use std::sync::Mutex;

impl Cols {
    /// The first `used` slots of the tile (after [`Cols::tile`]) fed to the sequence's
    /// diagnostics: k3 by the criteria's own formula, the log-ratio as given, the token
    /// criteria's keep, the token IS weight (`token_is`), the advantage when `f.adv`.
    #[inline(always)]
    pub(crate) fn feed_diag(
        &mut self,
        used: usize,
        f: &Feeds,
        token_is: bool,
        d: &mut SeqDiag,
        acc: &mut DiagAcc,
    ) {
        let n8 = used.next_multiple_of(LANES);
        statistic(
            MaskSource::K3,
            &self.c[..n8],
            &self.rho[..n8],
            &mut self.k3[..n8],
        );
        let c = &self.c[..used];
        let t = TileIn {
            valid: &self.valid[..used],
            c,
            lr: if self.wide { &self.lr[..used] } else { c },
            k3: &self.k3[..used],
            roll_lp: &self.r[..used],
            entropy: &[],
            adv: &self.a[..used],
            weight: token_is.then(|| &self.w[..used]),
            keep: &self.keep[..used],
        };
        d.tile(f, &t, acc);
    }
}

/// The table's columns of a log-prob-only batch, as `trmask/<name>_mean` / `_max` name them
/// (and as a token criterion's statistic names its column).
pub(crate) const COLUMNS: [&str; 8] = [
    "abs",
    "binary_kl",
    "k1",
    "k2",
    "k3",
    "log_ratio",
    "rho",
    "ser",
];
const NC: usize = COLUMNS.len();

/// The column and lower bound of each of the config's swept token criteria
/// (`analysis::sweep::swept_token_criteria`: what `Plan::token_sweeps` holds), `None` when one
/// tests a statistic the table of a log-prob-only batch lacks.
pub(crate) fn sweep_columns(cfg: &Resolved) -> Option<Vec<(usize, Option<f64>)>> {
    swept_token_criteria(cfg)
        .map(|c| {
            let col = COLUMNS.iter().position(|&n| n == c.stat.name())?;
            Some((col, token_lower(c)))
        })
        .collect()
}
const K3: usize = 4;
const LOG_RATIO: usize = 5;

/// One log-prob tensor's checks over a shard.
#[derive(Clone, Copy, Debug)]
struct LpCheck {
    positive: u64,
    /// The largest positive value and its slot (the last of equal ones).
    largest: Option<(f64, usize)>,
    /// Every valid value so far is a bf16 / an f16 value.
    bf16: bool,
    f16: bool,
    /// Σ ulp(x, 0)² while either holds.
    ulp2: Sum,
}

impl Default for LpCheck {
    fn default() -> Self {
        LpCheck {
            positive: 0,
            largest: None,
            bf16: true,
            f16: true,
            ulp2: Sum::default(),
        }
    }
}

impl LpCheck {
    #[inline(always)]
    fn slot(&mut self, x: f64, slot: usize) {
        if x > 0.0 {
            self.positive += 1;
            if self.largest.is_none_or(|(m, _)| x.total_cmp(&m).is_ge()) {
                self.largest = Some((x, slot));
            }
        }
        if self.bf16 || self.f16 {
            let (b, f) = half_exact(x);
            self.bf16 &= b;
            self.f16 &= f;
            let u = ulp(x, 0);
            self.ulp2.add(u * u);
        }
    }

    fn merge(&mut self, o: &LpCheck) {
        self.positive += o.positive;
        if let Some((x, s)) = o.largest {
            if self.largest.is_none_or(|(m, _)| x.total_cmp(&m).is_ge()) {
                self.largest = Some((x, s));
            }
        }
        self.bf16 &= o.bf16;
        self.f16 &= o.f16;
        self.ulp2.merge(o.ulp2);
    }

    /// The narrowest format holding every value: (name, mantissa bits).
    fn format(&self) -> Option<(&'static str, i32)> {
        if self.bf16 {
            Some(("bf16", 7))
        } else if self.f16 {
            Some(("f16", 10))
        } else {
            None
        }
    }
}

/// Where a tile's columns go: each column's lanes and largest valid value, and the token
/// sweeps that read it, over the tile's first `used` slots.
struct Sink<'a> {
    lanes: &'a mut [LaneSum; NC],
    max: &'a mut [f64; NC],
    sweeps: &'a mut [(usize, TokenValues)],
    used: usize,
}

impl Sink<'_> {
    /// Column `i` of the tile: `f` at the valid slots (0 at padding) into `x`, added to the
    /// column's lanes, its largest valid value into its maximum, its valid values to the
    /// sweeps that read it.
    #[inline(always)]
    fn column(&mut self, i: usize, x: &mut [f64], v: &[u64], f: impl Fn(usize) -> f64) {
        let mut m = self.max[i];
        for j in 0..x.len() {
            x[j] = if v[j] != 0 { f(j) } else { 0.0 };
            if v[j] != 0 && x[j] > m {
                m = x[j];
            }
        }
        self.max[i] = m;
        self.lanes[i].add(x);
        for (_, t) in self.sweeps.iter_mut().filter(|(c, _)| *c == i) {
            (0..self.used)
                .filter(|&j| v[j] != 0)
                .for_each(|j| t.add(x[j]));
        }
    }
}

/// A lean task's accumulators: the diagnostics (`plan.diag`), `trmask analyze`'s table
/// reductions (`plan.analyze`).
pub(crate) type Accs<'a> = (Option<&'a mut DiagAcc>, Option<&'a mut TableAcc>);

/// `b`'s certificate inputs into `a` (maxima).
fn merge_cert(a: &mut CertAcc, b: &CertAcc) {
    a.delta = a.delta.max(b.delta);
    a.kl_seq = a.kl_seq.max(b.kl_seq);
    a.horizon = a.horizon.max(b.horizon);
    if a.dbar.len() < b.dbar.len() {
        a.dbar.resize(b.dbar.len(), 0.0);
    }
    for (x, &y) in a.dbar.iter_mut().zip(&b.dbar) {
        *x = x.max(y);
    }
}

/// A shard's reductions, its sequences folded in order.
pub(crate) struct TableAcc {
    // ---- the sequence being fed ----
    lanes: [LaneSum; NC],
    lr2: LaneSum,
    max: [f64; NC],
    /// Valid tokens so far, the plain running Σ k3 (the certificate's), the worst token.
    t: usize,
    k3_sum: f64,
    worst: Option<(usize, usize, f64)>,
    /// `min(½ ser, 1)` of each valid token, in order.
    dbar: Vec<f64>,
    /// Scratch columns of [`TILE`] slots each (allocated at the first tile, freed by
    /// [`TableAcc::shed`]).
    x: Vec<f64>,
    /// expm1(c) of the tile's valid slots (0 at padding), and the binary KL's.
    e: Vec<f64>,
    y: Vec<f64>,
    // ---- the shard ----
    sums: [Sum; NC],
    maxes: [f64; NC],
    lr2_sum: Sum,
    cert_all: CertAcc,
    cert_accepted: CertAcc,
    pub(crate) kept: u64,
    pub(crate) valid: u64,
    pub(crate) worst_by_seq: Vec<Option<(usize, usize, f64)>>,
    roll: LpCheck,
    train: LpCheck,
    /// A valid slot's advantage is not finite (the full path reports it).
    pub(crate) bad: bool,
    /// The token criteria's sweep values: each one's column and values (`Plan::token_sweeps`).
    sweeps: Vec<(usize, TokenValues)>,
}

impl Default for TableAcc {
    fn default() -> Self {
        TableAcc {
            lanes: [LaneSum::default(); NC],
            lr2: LaneSum::default(),
            max: [f64::NEG_INFINITY; NC],
            t: 0,
            k3_sum: 0.0,
            worst: None,
            dbar: Vec::new(),
            x: Vec::new(),
            e: Vec::new(),
            y: Vec::new(),
            sums: [Sum::default(); NC],
            maxes: [f64::NEG_INFINITY; NC],
            lr2_sum: Sum::default(),
            cert_all: CertAcc::default(),
            cert_accepted: CertAcc::default(),
            kept: 0,
            valid: 0,
            worst_by_seq: Vec::new(),
            roll: LpCheck::default(),
            train: LpCheck::default(),
            bad: false,
            sweeps: Vec::new(),
        }
    }
}

impl TableAcc {
    /// A shard's reductions, feeding the token sweeps `sweeps` (each criterion's column and
    /// lower bound).
    pub(crate) fn new(sweeps: &[(usize, Option<f64>)]) -> Self {
        TableAcc {
            sweeps: sweeps
                .iter()
                .map(|&(c, lower)| (c, TokenValues::new(lower)))
                .collect(),
            ..TableAcc::default()
        }
    }

    /// The token sweeps' values, in `Plan::token_sweeps`' order.
    pub(crate) fn token_values(&mut self) -> Vec<TokenValues> {
        std::mem::take(&mut self.sweeps)
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// The first `used` slots of a tile starting at slot `k` (after [`Cols::feed_diag`], which
    /// fills `k3`), a multiple of [`LANES`] from its sequence's start; `adv` when the tile's
    /// advantages are loaded.
    pub(crate) fn tile(&mut self, cols: &Cols, used: usize, k: usize, adv: bool) {
        let n8 = used.next_multiple_of(LANES);
        let v = &cols.valid[..n8];
        let c = &cols.c[..n8];
        let lr = if cols.wide { &cols.lr[..n8] } else { c };
        if self.x.is_empty() {
            for v in [&mut self.x, &mut self.e, &mut self.y] {
                *v = vec![0.0; TILE];
            }
        }
        let TableAcc {
            x,
            e,
            y,
            lanes,
            max,
            lr2,
            sweeps,
            ..
        } = self;
        let x = &mut x[..n8];
        let e = &mut e[..n8];
        let o = &cols.o;
        let r = &cols.r;
        let (k3, rho) = (&cols.k3, &cols.rho);
        for j in 0..n8 {
            e[j] = if v[j] != 0 { c[j].exp_m1() } else { 0.0 };
        }
        let mut out = Sink {
            lanes,
            max,
            sweeps,
            used,
        };
        out.column(0, x, v, |j| c[j].abs());
        if cols.wide {
            out.column(1, x, v, |j| binary_kl(o[j], r[j], o[j] - r[j]));
        } else {
            // the log-ratio is `c`: its expm1 and k3 are this tile's; eight slots at a time
            let oct = |s: &[f64], j0: usize| -> [f64; LANES] {
                s[j0..j0 + LANES].try_into().expect("an octet")
            };
            for j0 in (0..n8).step_by(LANES) {
                let (o8, r8) = (oct(o, j0), oct(r, j0));
                let (c8, e8, k8) = (oct(c, j0), oct(e, j0), oct(&k3[..], j0));
                let b = binary_kl_given8(&o8, &r8, &c8, &e8, &k8);
                y[j0..j0 + LANES].copy_from_slice(&b);
            }
            out.column(1, x, v, |j| y[j]);
        }
        out.column(2, x, v, |j| -c[j]);
        out.column(3, x, v, |j| 0.5 * c[j] * c[j]);
        out.column(K3, x, v, |j| k3[j]);
        out.column(LOG_RATIO, x, v, |j| lr[j]);
        out.column(6, x, v, |j| rho[j]);
        out.column(7, x, v, |j| e[j].abs());
        // the certificate's D̄_t: min(½ ser, 1) of each valid token
        let dbar = &mut self.dbar;
        dbar.extend(
            (0..used)
                .filter(|&j| v[j] != 0)
                .map(|j| (0.5 * x[j]).min(1.0)),
        );
        for j in 0..n8 {
            x[j] = if v[j] != 0 { lr[j] * lr[j] } else { 0.0 };
        }
        lr2.add(x);
        for j in (0..used).filter(|&j| v[j] != 0) {
            self.k3_sum += cols.k3[j];
            let a = lr[j].abs();
            if self.worst.is_none_or(|(_, _, m)| a.total_cmp(&m).is_ge()) {
                self.worst = Some((self.t, k + j, a));
            }
            self.t += 1;
            self.roll.slot(cols.r[j], k + j);
            self.train.slot(cols.o[j], k + j);
            self.bad |= adv && !cols.a[j].is_finite();
        }
    }

    /// The sequence ends: `n` valid tokens, `rejected` of them dropped by the final mask,
    /// `accepted` when no criterion rejected it.
    pub(crate) fn end_seq(&mut self, n: u64, rejected: u64, accepted: bool) {
        self.valid += n;
        self.kept += n - rejected;
        for i in 0..NC {
            self.sums[i].add(self.lanes[i].value());
            self.maxes[i] = self.maxes[i].max(self.max[i]);
        }
        self.lr2_sum.add(self.lr2.value());
        let seq_max_k3 = if n > 0 { self.max[K3] } else { 0.0 };
        for (cert, on) in [
            (&mut self.cert_all, true),
            (&mut self.cert_accepted, accepted),
        ] {
            if !on {
                continue;
            }
            cert.delta = cert.delta.max(seq_max_k3);
            cert.kl_seq = cert.kl_seq.max(self.k3_sum);
            cert.horizon = cert.horizon.max(self.t as u64);
            if cert.dbar.len() < self.dbar.len() {
                cert.dbar.resize(self.dbar.len(), 0.0);
            }
            for (a, &b) in cert.dbar.iter_mut().zip(&self.dbar) {
                *a = a.max(b);
            }
        }
        self.worst_by_seq.push(self.worst);
        self.sweeps.iter_mut().for_each(|(_, t)| t.end_seq());
        self.lanes = [LaneSum::default(); NC];
        self.lr2 = LaneSum::default();
        self.max = [f64::NEG_INFINITY; NC];
        (self.t, self.k3_sum, self.worst) = (0, 0.0, None);
        self.dbar.clear();
    }

    /// A task's end: its certificate inputs merged into `shared` (maxima: any order gives the
    /// same), its scratch freed, so that the tasks waiting to be merged in order hold only
    /// their sums.
    pub(crate) fn shed(&mut self, shared: &Mutex<[CertAcc; 2]>) {
        if let Ok(mut c) = shared.lock() {
            merge_cert(&mut c[0], &std::mem::take(&mut self.cert_all));
            merge_cert(&mut c[1], &std::mem::take(&mut self.cert_accepted));
        }
        for v in [&mut self.x, &mut self.e, &mut self.y, &mut self.dbar] {
            *v = Vec::new();
        }
    }

    /// The certificate inputs every task shed.
    pub(crate) fn absorb(&mut self, shared: Mutex<[CertAcc; 2]>) {
        if let Ok([all, accepted]) = shared.into_inner() {
            merge_cert(&mut self.cert_all, &all);
            merge_cert(&mut self.cert_accepted, &accepted);
        }
    }

    /// Merges the next shard (sequence order kept).
    pub(crate) fn merge(&mut self, o: TableAcc) {
        for i in 0..NC {
            self.sums[i].merge(o.sums[i]);
            self.maxes[i] = self.maxes[i].max(o.maxes[i]);
        }
        self.lr2_sum.merge(o.lr2_sum);
        merge_cert(&mut self.cert_all, &o.cert_all);
        merge_cert(&mut self.cert_accepted, &o.cert_accepted);
        self.kept += o.kept;
        self.valid += o.valid;
        self.worst_by_seq.extend(o.worst_by_seq);
        self.roll.merge(&o.roll);
        self.train.merge(&o.train);
        self.bad |= o.bad;
        for ((_, a), (_, b)) in self.sweeps.iter_mut().zip(o.sweeps) {
            a.append(b);
        }
    }

    /// `trmask/<column>_mean` and `_max` of every column, and the certificate's inputs.
    pub(crate) fn put(&self, m: &mut Partial) {
        for (i, name) in COLUMNS.iter().enumerate() {
            m.put(
                format!("trmask/{name}_mean"),
                Acc::Mean {
                    sum: self.sums[i],
                    n: self.valid,
                    offset: 0.0,
                    empty: Empty::Zero,
                },
            );
            m.put(
                format!("trmask/{name}_max"),
                Acc::max((self.valid > 0).then_some(self.maxes[i]), Empty::Absent),
            );
        }
        m.put(CERT_ALL, Acc::Cert(Some(self.cert_all.clone())));
        m.put(CERT_ACCEPTED, Acc::Cert(Some(self.cert_accepted.clone())));
    }

    /// The summary's and the warnings' inputs; `names` are the rollout's and the training
    /// policy's tensor names.
    pub(crate) fn findings(self, names: [&str; 2]) -> Findings {
        let n = self.valid as f64;
        let log_ratio = (self.valid > 0).then(|| {
            let mean = self.sums[LOG_RATIO].value() / n;
            let var = (self.lr2_sum.value() / n - mean * mean).max(0.0);
            (mean, var.sqrt())
        });
        let mut positive = Vec::new();
        for (name, c) in names.iter().zip([&self.roll, &self.train]) {
            if let Some((x, slot)) = c.largest {
                positive.push((name.to_string(), c.positive, x, slot));
            }
        }
        let quantised = match (self.roll.format(), self.train.format()) {
            (Some((nr, mr)), Some((nt, mt))) if self.valid > 0 => {
                let q = |c: &LpCheck, m: i32| c.ulp2.value() * 4f64.powi(-m);
                let floor = (q(&self.roll, mr) + q(&self.train, mt)) / 24.0 / n;
                Some((nr, nt, mr.min(mt), floor))
            }
            _ => None,
        };
        Findings {
            valid: self.valid,
            kept: self.kept,
            worst: self.worst_by_seq,
            log_ratio,
            positive,
            quantised,
        }
    }
}
